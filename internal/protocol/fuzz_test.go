package protocol

import (
	"encoding/json"
	"errors"
	"testing"
)

// The decoders must never panic, must answer every bad input with *Error,
// and everything they accept must pass validation and re-encode.
func FuzzDecodePush(f *testing.F) {
	f.Add([]byte(goodPush))
	f.Add([]byte(`{"seq":1,"state":{}}`))
	f.Add([]byte(`{"state":{"signal":{"rssi":-1e308}}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := DecodePush(body)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Code == "" || pe.Message == "" {
				t.Fatalf("error %v is not a coded *Error", err)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("accepted push fails validation: %v", err)
		}
		if !json.Valid(p.RawState) {
			t.Fatalf("raw state is not valid JSON: %q", p.RawState)
		}
	})
}

func FuzzDecodeRegister(f *testing.F) {
	f.Add([]byte(`{"machine_id":"m","device_type":"t","firmware":"f","enrollment_secret":"s"}`))
	f.Add([]byte(`{"machine_id":"` + "\xff" + `"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := DecodeRegister(body)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Code == "" {
				t.Fatalf("error %v is not a coded *Error", err)
			}
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("accepted registration fails validation: %v", err)
		}
		if _, err := json.Marshal(r); err != nil {
			t.Fatal(err)
		}
	})
}
