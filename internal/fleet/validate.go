package fleet

// The rules on operator input, kept here once for every entry point: the
// operator API and the dashboard call these and show their messages as they
// are.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// FieldError is input that breaks a rule. Its message names the field as
// the API and the dashboard's forms call it.
type FieldError struct {
	Field   string
	Message string
}

func (e *FieldError) Error() string { return e.Message }
func (e *FieldError) Unwrap() error { return ErrInvalid }

func fieldError(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// Limits on a profile.
const (
	MinPushInterval = 1         // seconds
	MaxPushInterval = 7 * 86400 // seconds: a week
	MaxConfigBytes  = 48 << 10  // compact JSON; a push answer carrying it stays well under protocol.MaxBodyBytes
)

// CheckPushInterval checks a push interval in seconds.
func CheckPushInterval(seconds int) error {
	if seconds < MinPushInterval || seconds > MaxPushInterval {
		return pushIntervalError()
	}
	return nil
}

// ParsePushInterval reads a push interval in seconds from text.
func ParsePushInterval(v string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0, pushIntervalError()
	}
	return n, CheckPushInterval(n)
}

func pushIntervalError() error {
	return fieldError("push_interval", "push_interval must be a whole number of seconds, %d to %d", MinPushInterval, MaxPushInterval)
}

// NormalizeConfig checks a profile's configuration, a JSON object of at most
// MaxConfigBytes, and returns it compacted.
func NormalizeConfig(raw []byte) ([]byte, error) {
	c := bytes.TrimSpace(raw)
	if len(c) == 0 || c[0] != '{' {
		return nil, fieldError("config", `config must be a JSON object, e.g. {"apn": "iot.example"}`)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, c); err != nil {
		return nil, fieldError("config", "config is not valid JSON: %v", err)
	}
	if compact.Len() > MaxConfigBytes {
		return nil, fieldError("config", "config is larger than %d bytes (%d KiB) as compact JSON", MaxConfigBytes, MaxConfigBytes>>10)
	}
	return compact.Bytes(), nil
}

// Normalize checks u and compacts its configuration.
func (u *ProfileUpdate) Normalize() error {
	if u.Config != nil {
		c, err := NormalizeConfig(u.Config)
		if err != nil {
			return err
		}
		if err := CheckVariables("config", c); err != nil {
			return err // variables resolve per device (layermerge.go)
		}
		u.Config = c
	}
	if u.PushInterval != nil {
		return CheckPushInterval(*u.PushInterval)
	}
	return nil
}

// The parameters of the devices filter, in URLs, forms and the API.
const (
	FilterSyncState  = "sync_state"
	FilterLiveness   = "liveness"
	FilterDeviceType = "device_type"
	FilterFirmware   = "firmware"
	FilterProfileID  = "profile_id"
	FilterText       = "q"
	FilterLabel      = "label" // repeated: a device must have every label
	FilterAdmission  = "admission"
	FilterQuota      = "quota" // hit, lifted or a reason (QuotaReasons)
	// FilterWhere (where.go) is repeated: a device must match every one.
)

// FilterParams lists the parameters ParseFilter reads.
var FilterParams = []string{FilterSyncState, FilterLiveness, FilterDeviceType, FilterFirmware, FilterProfileID, FilterText, FilterLabel, FilterAdmission, FilterQuota, FilterWhere}

// ParseFilter reads the devices filter from query or form values; other
// keys are left alone. Every problem is reported (errors.Join of
// *FieldError), and the filter returned holds the parameters that are right.
func (s *Service) ParseFilter(v url.Values) (Filter, error) {
	var f Filter
	var errs []error
	if t := v.Get(FilterSyncState); t != "" {
		if st, ok := ParseSyncState(t); ok {
			f.SyncState = &st
		} else {
			errs = append(errs, fieldError(FilterSyncState, "unknown sync state %q: sync_state must be %s", t, oneOf(syncNames[:])))
		}
	}
	if t := v.Get(FilterLiveness); t != "" {
		if l, ok := ParseLiveness(t); ok {
			f.Liveness = &l
		} else {
			errs = append(errs, fieldError(FilterLiveness, "unknown liveness %q: liveness must be %s", t, oneOf(livenessNames[:])))
		}
	}
	if t := v.Get(FilterProfileID); t != "" {
		id, err := strconv.ParseUint(t, 10, 64)
		if err != nil {
			errs = append(errs, fieldError(FilterProfileID, "profile_id must be a profile's ID (a whole number), not %q", t))
		} else {
			f.ProfileID = id
		}
	}
	f.DeviceType, f.Firmware, f.Text = v.Get(FilterDeviceType), v.Get(FilterFirmware), strings.TrimSpace(v.Get(FilterText))
	if names := v[FilterLabel]; len(names) > 0 {
		f.Labels = s.LabelIDs(names)
	}
	if t := v.Get(FilterAdmission); t != "" {
		if a, ok := ParseAdmissionFilter(t); ok {
			f.Admission = a
		} else {
			errs = append(errs, fieldError(FilterAdmission, "unknown admission %q: admission must be %s", t, oneOf(admissionFilterNames)))
		}
	}
	if t := v.Get(FilterQuota); t != "" {
		if ids, ok := s.quotaSet(t); ok {
			f.Quota, f.quotaIDs = t, ids
		} else {
			errs = append(errs, fieldError(FilterQuota, "unknown quota filter %q: quota must be %s", t, oneOf(QuotaFilters)))
		}
	}
	if exprs := v[FilterWhere]; len(exprs) > 0 {
		if err := s.parseWhereFilter(&f, exprs); err != nil {
			errs = append(errs, err)
		}
	}
	return f, errors.Join(errs...)
}

// parseWhereFilter reads the where parameters into f: every expression
// must hold.
func (s *Service) parseWhereFilter(f *Filter, exprs []string) error {
	var all Where
	for _, e := range exprs {
		if strings.TrimSpace(e) == "" {
			continue
		}
		w, err := ParseWhere(e)
		if err != nil {
			return err
		}
		all.conds = append(all.conds, w.conds...)
	}
	if all.Empty() {
		return nil
	}
	if len(all.conds) > MaxWhereConds {
		return whereError("at most %d conditions", MaxWhereConds)
	}
	cw, err := s.compileWhere(context.Background(), all, false, func(n string) uint16 { return s.LabelIDs([]string{n})[0] })
	if err != nil {
		return err
	}
	f.Where, f.where = all.String(), cw
	return nil
}

// ParamValues lists the values a query parameter of the devices list or
// of the commands lists takes (the filter's, sort, command state), for the
// API's description; nil for a free one.
func ParamValues(name string) []string {
	switch name {
	case FilterSyncState:
		return syncNames[:]
	case FilterLiveness:
		return livenessNames[:]
	case FilterAdmission:
		return admissionFilterNames
	case "sort":
		return sortNames[:]
	case "command_state":
		return commandStateNames[:]
	}
	return nil
}

// oneOf is "a, b or c".
func oneOf(names []string) string {
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// Problems lists the messages of an error ParseFilter returned.
func Problems(err error) []string {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []string
		for _, e := range j.Unwrap() {
			out = append(out, e.Error())
		}
		return out
	}
	return []string{err.Error()}
}
