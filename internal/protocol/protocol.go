// Package protocol defines Drover's device protocol: the JSON messages that
// device agents exchange with the server, their limits and their validation.
// docs/protocol.md is the normative description; this package implements it.
package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"unicode/utf8"
)

// Endpoint paths of the device protocol.
const (
	PathRegister = "/api/v1/register"
	PathPush     = "/api/v1/push"
	// PathConnect is the optional persistent connection (WebSocket).
	PathConnect = "/api/v1/connect"
	// PathFirmware prefixes a firmware file's address on the server:
	// PathFirmware + "<id>/file" (docs/firmware.md).
	PathFirmware = "/api/v1/firmware/"
)

// Limits enforced on every request. They are part of the protocol.
const (
	MaxBodyBytes      = 64 << 10 // request bodies larger than this get 413
	MaxIDLen          = 128      // machine_id, serial
	MaxNameLen        = 64       // device_type, model, firmware, interface names, operator, technology
	MaxInterfaces     = 64
	MaxExtraKeys      = 64
	MaxExtraKeyLen    = 64
	MaxExtraValueLen  = 256
	MaxConfigErrorLen = 1024
	MaxSecretLen      = 256 // enrollment_secret
)

// RegisterRequest is sent once when the agent is installed, and again
// whenever the server answers a push with 401.
type RegisterRequest struct {
	MachineID        string `json:"machine_id"`
	DeviceType       string `json:"device_type"`
	Model            string `json:"model,omitempty"`
	Firmware         string `json:"firmware"`
	Serial           string `json:"serial,omitempty"`
	EnrollmentSecret string `json:"enrollment_secret,omitempty"`
	// DeviceKey proves a known device is the same device (credentials.go).
	DeviceKey string `json:"device_key,omitempty"`
	// EnrollmentToken is an operator-made single-use token instead of the
	// fleet's enrollment secret.
	EnrollmentToken string `json:"enrollment_token,omitempty"`
}

// RegisterResponse carries the device's stable ID and its new secret token.
type RegisterResponse struct {
	DeviceID     string `json:"device_id"`
	Token        string `json:"token"`
	PushInterval int    `json:"push_interval"`
	New          bool   `json:"new"`
	// DeviceKey is sent when the server made a new per-device key: keep it
	// next to the token and send it when registering again.
	DeviceKey string `json:"device_key,omitempty"`
	// Pending (HTTP 202): the registration waits for an operator; Token is
	// empty; ask again after RetryAfter seconds with the device key.
	Pending    bool   `json:"pending,omitempty"`
	RetryAfter int    `json:"retry_after,omitempty"`
	Message    string `json:"message,omitempty"`
}

// PushRequest is the periodic state report, authenticated by the token.
type PushRequest struct {
	Seq           uint64          `json:"seq"`
	ConfigVersion int64           `json:"config_version"`
	ConfigError   string          `json:"config_error,omitempty"`
	RawState      json.RawMessage `json:"state"`
	State         State           `json:"-"` // RawState decoded
	// FirmwareUpdate reports the progress of a firmware update the server
	// offered (docs/firmware.md); absent when none is under way.
	FirmwareUpdate *FirmwareReport `json:"firmware_update,omitempty"`
	// Results of commands the server sent (command.go).
	Results []CommandResult `json:"results,omitempty"`
	// Started: the agent has not had a push accepted since it started
	// (the first push after a start does not count against the quota).
	Started bool `json:"started,omitempty"`
}

// Firmware update states a device reports.
const (
	FirmwareDownloading = "downloading"
	FirmwareInstalling  = "installing"
	FirmwareFailed      = "failed"
)

// FirmwareReport is a device's view of the update it was offered.
type FirmwareReport struct {
	Rollout  uint64 `json:"rollout"`
	State    string `json:"state"`              // downloading, installing or failed
	Progress int64  `json:"progress,omitempty"` // bytes downloaded so far
	Reason   string `json:"reason,omitempty"`   // why it failed
}

// Validate checks a firmware report.
func (f *FirmwareReport) Validate() error {
	switch f.State {
	case FirmwareDownloading, FirmwareInstalling, FirmwareFailed:
	default:
		return invalid("firmware_update.state must be downloading, installing or failed")
	}
	if f.Rollout == 0 {
		return invalid("firmware_update.rollout must be > 0")
	}
	if f.Progress < 0 {
		return invalid("firmware_update.progress must be >= 0")
	}
	return checkText("firmware_update.reason", f.Reason, MaxConfigErrorLen, false)
}

// FirmwareOffer tells a device to install a firmware: fetch URL (relative:
// from this server with the device token; absolute: from there without
// it), check Size, SHA256 and, with a key installed, Signature, then install.
type FirmwareOffer struct {
	Rollout   uint64 `json:"rollout"`
	Version   string `json:"version"`
	URL       string `json:"url"`
	SHA256    string `json:"sha256"` // hex
	Size      int64  `json:"size"`
	Signature string `json:"signature,omitempty"` // base64 ed25519 over the 32-byte SHA-256 digest
}

// State is what a device reports about itself. Absent numbers are null
// (pointers) so that "not measured" differs from zero.
type State struct {
	Uptime      *int64            `json:"uptime,omitempty"` // seconds since boot
	CPU         *float64          `json:"cpu,omitempty"`    // percent, 0..100
	Load1       *float64          `json:"load1,omitempty"`
	MemTotal    *int64            `json:"mem_total,omitempty"` // bytes
	MemUsed     *int64            `json:"mem_used,omitempty"`
	DiskTotal   *int64            `json:"disk_total,omitempty"`
	DiskUsed    *int64            `json:"disk_used,omitempty"`
	Temperature *float64          `json:"temperature,omitempty"` // degrees Celsius
	Firmware    string            `json:"firmware,omitempty"`
	Interfaces  []Interface       `json:"interfaces,omitempty"`
	Signal      *Signal           `json:"signal,omitempty"`
	Extra       map[string]string `json:"extra,omitempty"`
}

// Interface holds one network interface's cumulative counters.
type Interface struct {
	Name      string `json:"name"`
	RxBytes   uint64 `json:"rx_bytes"`
	TxBytes   uint64 `json:"tx_bytes"`
	RxPackets uint64 `json:"rx_packets,omitempty"`
	TxPackets uint64 `json:"tx_packets,omitempty"`
}

// Signal is the cellular modem's view of the radio.
type Signal struct {
	RSSI       *float64 `json:"rssi,omitempty"` // dBm
	RSRP       *float64 `json:"rsrp,omitempty"` // dBm
	RSRQ       *float64 `json:"rsrq,omitempty"` // dB
	SINR       *float64 `json:"sinr,omitempty"` // dB
	Operator   string   `json:"operator,omitempty"`
	Technology string   `json:"technology,omitempty"`
}

// PushResponse tells the device its interval and, only when the device is
// behind, the configuration it must apply.
type PushResponse struct {
	PushInterval int     `json:"push_interval"`
	Config       *Config `json:"config,omitempty"`
	// FirmwareUpdate is the firmware the device must install, while a
	// rollout targets it (docs/firmware.md).
	FirmwareUpdate *FirmwareOffer `json:"firmware_update,omitempty"`
	// Commands to run (command.go); agents that do not know the field
	// ignore it.
	Commands []Command `json:"commands,omitempty"`
	// Connect asks a device that holds no persistent connection to hold
	// one for this many seconds: an operator wants a remote session
	// (docs/protocol.md#connect-on-demand). Agents that do not know the
	// field ignore it.
	Connect int `json:"connect,omitempty"`
}

// Config is a versioned desired configuration.
type Config struct {
	Version int64           `json:"version"`
	Data    json.RawMessage `json:"data"`
}

// ErrorBody is the JSON body of every 4xx and 5xx answer.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail names the error with a stable code and a human message.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error is a validation or decoding error; Code is stable and is used as a
// metrics label, so the set of codes is small and fixed.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Stable error codes.
const (
	CodeMalformedJSON = "malformed_json"
	CodeInvalidField  = "invalid_field"
	CodeTooLarge      = "body_too_large"
)

func invalid(format string, args ...any) *Error {
	return &Error{Code: CodeInvalidField, Message: fmt.Sprintf(format, args...)}
}

// DecodeRegister parses and validates a registration body.
func DecodeRegister(body []byte) (RegisterRequest, error) {
	var r RegisterRequest
	if err := decodeStrict(body, &r); err != nil {
		return r, err
	}
	return r, r.Validate()
}

// Validate checks required fields and limits.
func (r *RegisterRequest) Validate() error {
	if err := checkText("machine_id", r.MachineID, MaxIDLen, true); err != nil {
		return err
	}
	if err := checkText("device_type", r.DeviceType, MaxNameLen, true); err != nil {
		return err
	}
	if err := checkText("model", r.Model, MaxNameLen, false); err != nil {
		return err
	}
	if err := checkText("firmware", r.Firmware, MaxNameLen, true); err != nil {
		return err
	}
	if err := checkText("serial", r.Serial, MaxIDLen, false); err != nil {
		return err
	}
	return r.validateCredentials()
}

// DecodePush parses and validates a push body. RawState keeps the state
// object as sent (fields unknown to this server included), compacted.
func DecodePush(body []byte) (PushRequest, error) {
	if p, ok := decodePushFast(body); ok { // pushdecode.go
		return p, nil
	}
	return decodePushCodec(body)
}

// decodePushCodec is DecodePush with the JSON codec: the whole contract,
// errors included, for every body the fast path leaves to it.
func decodePushCodec(body []byte) (PushRequest, error) {
	var p PushRequest
	if err := decodeStrict(body, &p); err != nil {
		return p, err
	}
	raw := bytes.TrimSpace(p.RawState)
	if len(raw) == 0 || raw[0] != '{' {
		return p, invalid("state must be a JSON object")
	}
	if err := codec.unmarshal(raw, &p.State); err != nil {
		e := jsonError(err)
		if e.Code == CodeInvalidField && !strings.HasPrefix(e.Message, "state") {
			e.Message = "state." + e.Message
		}
		return p, e
	}
	if spaceOutsideStrings(raw) {
		var compact bytes.Buffer
		compact.Grow(len(raw))
		if err := codec.compact(&compact, raw); err != nil {
			return p, jsonError(err)
		}
		raw = compact.Bytes()
	}
	// Without whitespace it is compact already, and the decoder's own copy.
	p.RawState = raw
	return p, p.Validate()
}

// spaceOutsideStrings says whether the valid JSON text b holds whitespace
// that compacting would remove: whitespace inside strings (a model name,
// a note) stays, and needs no compacted copy.
func spaceOutsideStrings(b []byte) bool {
	inString := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString && c == '\\':
			i++ // the escaped character, a quote included
		case c == '"':
			inString = !inString
		case !inString && (c == ' ' || c == '\t' || c == '\r' || c == '\n'):
			return true
		}
	}
	return false
}

// Validate checks ranges and limits of a push.
func (p *PushRequest) Validate() error {
	if p.ConfigVersion < 0 {
		return invalid("config_version must be >= 0")
	}
	if err := checkText("config_error", p.ConfigError, MaxConfigErrorLen, false); err != nil {
		return err
	}
	if p.FirmwareUpdate != nil {
		if err := p.FirmwareUpdate.Validate(); err != nil {
			return err
		}
	}
	if err := validateResults(p.Results); err != nil {
		return err
	}
	return p.State.Validate()
}

// Validate checks the reported state.
func (s *State) Validate() error {
	if s.Uptime != nil && *s.Uptime < 0 {
		return invalid("state.uptime must be >= 0")
	}
	if s.CPU != nil && !(*s.CPU >= 0 && *s.CPU <= 100) {
		return invalid("state.cpu must be within 0..100")
	}
	if err := checkFinite("state.load1", s.Load1, 0, 1e6); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{"state.mem_total", s.MemTotal}, {"state.mem_used", s.MemUsed}, {"state.disk_total", s.DiskTotal}, {"state.disk_used", s.DiskUsed}} {
		if f.v != nil && *f.v < 0 {
			return invalid("%s must be >= 0", f.name)
		}
	}
	if err := checkFinite("state.temperature", s.Temperature, -273.15, 1000); err != nil {
		return err
	}
	if err := checkText("state.firmware", s.Firmware, MaxNameLen, false); err != nil {
		return err
	}
	if len(s.Interfaces) > MaxInterfaces {
		return invalid("state.interfaces has more than %d entries", MaxInterfaces)
	}
	for i := range s.Interfaces {
		if p := textProblem(s.Interfaces[i].Name, MaxNameLen, true); p != "" {
			return invalid("state.interfaces[%d].name %s", i, p)
		}
	}
	if g := s.Signal; g != nil {
		for _, f := range []struct {
			name     string
			v        *float64
			min, max float64
		}{{"state.signal.rssi", g.RSSI, -200, 0}, {"state.signal.rsrp", g.RSRP, -200, 0}, {"state.signal.rsrq", g.RSRQ, -100, 100}, {"state.signal.sinr", g.SINR, -100, 100}} {
			if err := checkFinite(f.name, f.v, f.min, f.max); err != nil {
				return err
			}
		}
		if err := checkText("state.signal.operator", g.Operator, MaxNameLen, false); err != nil {
			return err
		}
		if err := checkText("state.signal.technology", g.Technology, MaxNameLen, false); err != nil {
			return err
		}
	}
	if len(s.Extra) > MaxExtraKeys {
		return invalid("state.extra has more than %d keys", MaxExtraKeys)
	}
	for k, v := range s.Extra {
		if p := textProblem(k, MaxExtraKeyLen, true); p != "" {
			return invalid("a key of state.extra (%q) %s", k, p)
		}
		if p := textProblem(v, MaxExtraValueLen, false); p != "" {
			return invalid("state.extra[%q] %s", k, p)
		}
	}
	return nil
}

func checkFinite(name string, v *float64, min, max float64) error {
	if v == nil {
		return nil
	}
	if math.IsNaN(*v) || *v < min || *v > max {
		return invalid("%s must be within %g..%g", name, min, max)
	}
	return nil
}

func checkText(name, v string, max int, required bool) error {
	if p := textProblem(v, max, required); p != "" {
		return invalid("%s %s", name, p)
	}
	return nil
}

// textProblem says what is wrong with a device-supplied string, or "".
// Decoded strings can no longer show a lone surrogate escape (the decoder
// made it U+FFFD): checkStrings refuses those in the raw body.
func textProblem(v string, max int, required bool) string {
	if v == "" {
		if required {
			return "is required"
		}
		return ""
	}
	if len(v) > max {
		return fmt.Sprintf("is longer than %d bytes", max)
	}
	for i, r := range v {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(v[i:]); size == 1 {
				return "is not valid UTF-8"
			}
		}
		if IsControl(r) {
			return fmt.Sprintf("contains control characters (U+%04X)", r)
		}
	}
	return ""
}

// decodeStrict decodes exactly one JSON object. Unknown fields are ignored
// (newer agents may send more); wrong types and trailing data are refused.
func decodeStrict(body []byte, v any) error {
	if len(body) > MaxBodyBytes {
		return &Error{Code: CodeTooLarge, Message: fmt.Sprintf("body exceeds %d bytes", MaxBodyBytes)}
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return &Error{Code: CodeMalformedJSON, Message: "body must be a JSON object"}
	}
	trailing, err := codec.decodeOne(body, v)
	if err != nil {
		return jsonError(err)
	}
	if trailing {
		return &Error{Code: CodeMalformedJSON, Message: "unexpected data after the JSON object"}
	}
	if plainText(body) { // valid JSON now: nothing to refuse in it
		return nil
	}
	if e := checkStrings(body); e != nil {
		return e
	}
	return nil
}

func jsonError(err error) *Error {
	if field, kind, value, ok := codec.typeError(err); ok {
		if field == "" {
			field = "value"
		}
		return invalid("%s must be %s, not JSON %s", field, goTypeToJSON(kind), value)
	}
	if offset, ok := codec.syntaxError(err); ok {
		return &Error{Code: CodeMalformedJSON, Message: fmt.Sprintf("invalid JSON at byte %d: %s", offset, err.Error())}
	}
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &Error{Code: CodeMalformedJSON, Message: "truncated JSON"}
	default:
		return &Error{Code: CodeMalformedJSON, Message: err.Error()}
	}
}

func goTypeToJSON(kind string) string {
	switch {
	case strings.HasPrefix(kind, "int"), strings.HasPrefix(kind, "uint"):
		return "an integer"
	case strings.HasPrefix(kind, "float"):
		return "a number"
	case kind == "string":
		return "a string"
	case kind == "slice":
		return "an array"
	case kind == "map", kind == "struct":
		return "an object"
	case kind == "bool":
		return "a boolean"
	}
	return kind
}
