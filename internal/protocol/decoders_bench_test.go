//go:build !drover_stdjson

package protocol

import (
	"encoding/json"
	"testing"

	gojson "github.com/goccy/go-json"
)

// BenchmarkPushDecoders decodes the same push into the same types with
// goccy/go-json (the server's decoder) and encoding/json: the speed that
// keeps goccy in the server (docs/operations.md, Device input). The whole
// codec path per decoder: BenchmarkDecodePushCodec with and without
// -tags drover_stdjson; DecodePush itself: BenchmarkDecodePush.
func BenchmarkPushDecoders(b *testing.B) {
	body := []byte(goodPush)
	for _, d := range []struct {
		name      string
		unmarshal func([]byte, any) error
	}{{"goccy", gojson.Unmarshal}, {"encoding_json", json.Unmarshal}} {
		b.Run(d.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var p PushRequest
				if err := d.unmarshal(body, &p); err != nil {
					b.Fatal(err)
				}
				if err := d.unmarshal(p.RawState, &p.State); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
