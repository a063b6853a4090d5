package protocol

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// Pushes arrive one after another at one server process, and a JSON
// decoder with caches (goccy/go-json keeps per-type decoders and buffers)
// could carry state from one body to the next. This target feeds a
// sequence of bodies through the one decoder of this process and checks
// that each is decoded as if it came alone: decoding the first body again
// after the others gives the same push or the same error; nothing panics;
// every error is a coded *Error; an accepted body is valid JSON to
// encoding/json too (the decoder accepts nothing the standard refuses).
// go test -fuzz FuzzDecodePushSequence ./internal/protocol/ [-tags drover_stdjson]
func FuzzDecodePushSequence(f *testing.F) {
	f.Add([]byte(goodPush), []byte(`{"seq":1,"state":{}}`), []byte(`{"state":{"signal":{"rssi":"x"}}}`))
	f.Add([]byte(`{"seq":1,"state":{"extra":{"k":"\uD800"}}}`), []byte(goodPush), []byte(`{"seq":`))
	f.Add([]byte(`{"seq":2,"state":{},"results":[{"id":7,"exit_code":1,"output":["a"]}]}`),
		[]byte(`{"seq":2,"state":{},"results":[{"id":"7"}]}`), []byte(`{"state":{"interfaces":[{"name":1}]}}`))
	f.Add([]byte(`{"state":{},"firmware_update":{"rollout":3,"state":"downloading","progress":1024}}`),
		[]byte(`{"state":{},"firmware_update":{"rollout":-1,"state":[]}}`), []byte("{\"state\":{\"x\":\"\xff\"}}"))
	f.Add([]byte(`{"state":{"signal":{"rssi":-67}}} trailing`), []byte(`[]`), []byte(`{"state":null}`))
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		type outcome struct {
			p   PushRequest
			err string
		}
		decode := func(body []byte) outcome {
			p, err := DecodePush(body)
			if err != nil {
				var pe *Error
				if !errors.As(err, &pe) || pe.Code == "" || pe.Message == "" {
					t.Fatalf("%q: error %v is not a coded *Error", body, err)
				}
				return outcome{err: pe.Code + ": " + pe.Message}
			}
			if !json.Valid(body) {
				t.Fatalf("accepted a body encoding/json refuses: %q", body)
			}
			return outcome{p: p}
		}
		first := decode(a)
		decode(b)
		decode(c)
		decode(a)
		if again := decode(a); !reflect.DeepEqual(first, again) {
			t.Fatalf("%q decoded differently after %q and %q:\nfirst %+v\nagain %+v", a, b, c, first, again)
		}
	})
}
