//go:build drover_stdjson

package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// codec decodes with encoding/json: the small build for agents
// (scripts/build-agents.sh builds with -tags drover_stdjson).
var codec = stdCodec{}

type stdCodec struct{}

func (stdCodec) unmarshal(b []byte, v any) error           { return json.Unmarshal(b, v) }
func (stdCodec) compact(dst *bytes.Buffer, b []byte) error { return json.Compact(dst, b) }

func (stdCodec) decodeOne(body []byte, v any) (trailing bool, err error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return false, err
	}
	_, err = dec.Token()
	return !errors.Is(err, io.EOF), nil
}

func (stdCodec) typeError(err error) (field, kind, value string, ok bool) {
	var e *json.UnmarshalTypeError
	if !errors.As(err, &e) {
		return "", "", "", false
	}
	return e.Field, e.Type.Kind().String(), e.Value, true
}

func (stdCodec) syntaxError(err error) (int64, bool) {
	var e *json.SyntaxError
	if !errors.As(err, &e) {
		return 0, false
	}
	return e.Offset, true
}
