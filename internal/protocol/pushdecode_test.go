package protocol

import (
	"reflect"
	"strings"
	"testing"
)

// fastSeeds are bodies near the edges of what the fast path reads.
var fastSeeds = []string{
	goodPush,
	`{"seq":1,"state":{}}`,
	`{"seq":18446744073709551615,"config_version":9223372036854775807,"state":{"uptime":0}}`,
	`{"seq":18446744073709551616,"state":{}}`,
	`{"config_version":-9223372036854775808,"state":{}}`,
	`{"config_version":-0,"state":{"uptime":-0,"cpu":-0}}`,
	`{"seq":1.0,"state":{}}`, `{"seq":1e2,"state":{}}`, `{"seq":-1,"state":{}}`, `{"seq":01,"state":{}}`,
	`{"state":{"cpu":1e400}}`, `{"state":{"cpu":1e-400,"load1":0.1e1,"temperature":-1.5E+1}}`,
	`{"state":{"cpu":12.5,"cpu":13}}`, `{"SEQ":1,"state":{}}`, `{"seq":1,"State":{}}`,
	"{\"\u017feq\":1,\"state\":{}}", "{\"state\":{\"\u212aeep\":1,\"ma\u212a\":2}}",
	`{"s\u0065q":1,"state":{}}`, `{"-":{"cpu":5},"state":{}}`, `{"":1,"state":{"":2}}`,
	`{"seq":null,"state":{}}`, `{"state":null}`, `{"state":{"uptime":null}}`, `{"state":{"signal":null}}`,
	`{"state":{"interfaces":null,"extra":null}}`, `{"state":{"interfaces":[null]}}`, `{"state":{"extra":{"a":null}}}`,
	`{"state":{"interfaces":[],"extra":{}}}`, `{"state":{"signal":{}}}`,
	`{"state":{"interfaces":[{"name":"a","NAME":"b"}]}}`, `{"state":{"interfaces":[{"name":"a","x":[1,{"y":null}]}]}}`,
	`{"state":{"signal":{"operator":"AT\u0026T","technology":"5G \u00e9\ud83d\ude00"}}}`,
	`{"state":{"extra":{"k\"ey":"v\\al\/ue\n","k":"\ud800"}}}`, `{"state":{"extra":{"k":"a","k":"b"}}}`,
	`{"state":{"firmware":"\u0041\t"}}`, "{\"state\":{\"firmware\":\"caf\xc3\xa9\",\"x\":\"\xff\"}}",
	"{\"state\":{\"firmware\":\"a\x7fb\"}}", "{\"state\":{\"firmware\":\"a\x01b\"}}",
	"\v{\"seq\":1,\"state\":{}}\u0085", " \t{\"seq\" : 1 ,\r\n\"state\" : { \"cpu\" : 1 , \"x\" : [ ] } } ",
	"{\"state\":{ \"a\" : \"x \\\" y\\\\\" ,\n\"b\":[ 1 , {\"c\" :\"\"} ] }}",
	`{"seq":1,"state":{}} {}`, `{"seq":1,"state":{},}`, `{"seq":1,"state":{"a":[1,]}}`, `{"seq":1,"state":{"a":tru}}`,
	`{"state":{"deep":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}}`,
	`{"state":{"interfaces":[` + strings.Repeat(`{"name":"a"},`, MaxInterfaces) + `{"name":"b"}]}}`,
	`{"state":{},"started":true,"config_error":"x"}`, `{"state":{},"started":1}`,
	`{"state":{},"firmware_update":{"rollout":1,"state":"failed"}}`, `{"state":{},"results":[]}`,
	`{"state":{"cpu":150}}`, `{"state":{"mem_used":-1}}`, `{"state":{"extra":{"a":1}}}`,
}

// FuzzDecodePushFastDifferential holds the fast path to the codec path:
// every body the fast path accepts, the codec path accepts with the same
// push, and DecodePush answers every body, push and error alike, as the
// codec path does. Bodies come in a sequence, decoded in turn by both
// paths, so that neither carries anything from one body to the next.
// go test -fuzz FuzzDecodePushFastDifferential ./internal/protocol/ [-tags drover_stdjson]
func FuzzDecodePushFastDifferential(f *testing.F) {
	for i, s := range fastSeeds {
		f.Add([]byte(s), []byte(fastSeeds[(i+1)%len(fastSeeds)]), []byte(goodPush))
	}
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		for _, body := range [][]byte{a, b, c, a} {
			compareDecoders(t, body)
		}
	})
}

func TestDecodePushFastSeeds(t *testing.T) {
	for _, s := range fastSeeds {
		compareDecoders(t, []byte(s))
	}
}

func compareDecoders(t *testing.T, body []byte) {
	t.Helper()
	want, wantErr := decodePushCodec(body)
	if fast, ok := decodePushFast(body); ok {
		if wantErr != nil {
			t.Fatalf("%q: the fast path accepts it, the codec path refuses it: %v", body, wantErr)
		}
		if !reflect.DeepEqual(fast, want) {
			t.Fatalf("%q:\nfast  %#v\ncodec %#v", body, fast, want)
		}
	}
	got, err := DecodePush(body)
	if !reflect.DeepEqual(err, wantErr) || !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\nDecodePush   %#v %v\ncodec path %#v %v", body, got, err, want, wantErr)
	}
}

// The pushes agents send take the fast path; what it leaves to the codec
// path stays there.
func TestDecodePushFastTakes(t *testing.T) {
	for _, s := range []string{
		goodPush, `{"seq":1,"state":{}}`,
		`{"seq":3,"config_version":2,"config_error":"bad apn","started":true,"state":{"uptime":1,"signal":{"operator":"AT\u0026T"},"extra":{"note":"caf` + "\u00e9" + `"}}}`,
	} {
		if _, ok := decodePushFast([]byte(s)); !ok {
			t.Errorf("fast path refuses %s", s)
		}
	}
	for _, s := range []string{
		`{"SEQ":1,"state":{}}`, `{"state":{"cpu":1,"cpu":2}}`, `{"state":{"uptime":null}}`,
		`{"state":{},"results":[]}`, `{"state":{"cpu":150}}`, `{"seq":1,"state":{}} {}`,
	} {
		if _, ok := decodePushFast([]byte(s)); ok {
			t.Errorf("fast path takes %s", s)
		}
	}
}

// A push's state takes a handful of allocations, however many fields it
// reports: the raw state, one block for the numbers, one for the signal,
// one string for all text, the interfaces, the extra map.
func TestDecodePushFastAllocations(t *testing.T) {
	body := []byte(goodPush)
	allocs := testing.AllocsPerRun(200, func() {
		if _, ok := decodePushFast(body); !ok {
			t.Fatal("fast path refuses goodPush")
		}
	})
	const budget = 8
	if allocs > budget && !raceEnabled {
		t.Errorf("%.0f allocations per push, want at most %d", allocs, budget)
	}
}

// BenchmarkDecodePushCodec is BenchmarkDecodePush on the codec path alone.
func BenchmarkDecodePushCodec(b *testing.B) {
	body := []byte(goodPush)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodePushCodec(body); err != nil {
			b.Fatal(err)
		}
	}
}
