//go:build !drover_stdjson

package protocol

import (
	"bytes"
	"errors"
	"io"

	json "github.com/goccy/go-json"
)

// codec decodes with goccy/go-json: about 3x faster than encoding/json on a
// push (BenchmarkPushDecoders). Agent builds use -tags drover_stdjson instead
// (codec_std.go), which keeps them 2 MB smaller. Pushes as agents send them
// take the fast path of pushdecode.go before any codec.
var codec = fastCodec{}

type fastCodec struct{}

func (fastCodec) unmarshal(b []byte, v any) error           { return json.Unmarshal(b, v) }
func (fastCodec) compact(dst *bytes.Buffer, b []byte) error { return json.Compact(dst, b) }

func (fastCodec) decodeOne(body []byte, v any) (trailing bool, err error) {
	// One pass for a valid body: Unmarshal refuses trailing data too. A
	// body it refuses is decoded again as a stream, which tells trailing
	// data from a broken object, so that errors read as before.
	if json.Unmarshal(body, v) == nil {
		return false, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return false, err
	}
	_, err = dec.Token()
	return !errors.Is(err, io.EOF), nil
}

func (fastCodec) typeError(err error) (field, kind, value string, ok bool) {
	var e *json.UnmarshalTypeError
	if !errors.As(err, &e) {
		return "", "", "", false
	}
	return e.Field, e.Type.Kind().String(), e.Value, true
}

func (fastCodec) syntaxError(err error) (int64, bool) {
	var e *json.SyntaxError
	if !errors.As(err, &e) {
		return 0, false
	}
	return e.Offset, true
}
