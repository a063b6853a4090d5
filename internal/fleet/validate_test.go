package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestPushIntervalRule(t *testing.T) {
	for _, v := range []int{MinPushInterval, 60, MaxPushInterval} {
		if err := CheckPushInterval(v); err != nil {
			t.Errorf("%d: %v", v, err)
		}
	}
	for _, v := range []int{-1, 0, MaxPushInterval + 1} {
		var fe *FieldError
		if err := CheckPushInterval(v); !errors.As(err, &fe) || fe.Field != "push_interval" || !errors.Is(err, ErrInvalid) {
			t.Errorf("%d: %v", v, err)
		}
	}
	if n, err := ParsePushInterval(" 90 "); n != 90 || err != nil {
		t.Errorf("parse 90: %d %v", n, err)
	}
	for _, v := range []string{"", "1.5", "x", "604801"} {
		if _, err := ParsePushInterval(v); !errors.Is(err, ErrInvalid) {
			t.Errorf("parse %q: %v", v, err)
		}
	}
}

func TestNormalizeConfig(t *testing.T) {
	c, err := NormalizeConfig([]byte(" {\n \"apn\": \"iot\",\n \"ü\": [1, 2]\n} "))
	if err != nil || string(c) != `{"apn":"iot","ü":[1,2]}` {
		t.Fatalf("%s %v", c, err)
	}
	for in, want := range map[string]string{
		`["x"]`:           "must be a JSON object",
		``:                "must be a JSON object",
		`{"apn": "iot",}`: "not valid JSON",
		`{} {}`:           "not valid JSON",
	} {
		if _, err := NormalizeConfig([]byte(in)); err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
	// The limit is on the compact form: spaces do not count.
	pad := strings.Repeat("x", MaxConfigBytes-len(`{"a":""}`))
	if c, err := NormalizeConfig([]byte(`{ "a" : "` + pad + `" }`)); err != nil || len(c) != MaxConfigBytes {
		t.Fatalf("at the limit: %d %v", len(c), err)
	}
	if _, err := NormalizeConfig([]byte(`{"a":"` + pad + `x"}`)); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("over the limit: %v", err)
	}
}

// UpdateProfile checks its input itself: a wrong update changes nothing.
func TestUpdateProfileValidates(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, newRecStore())
	s.Register(ctx, reg("m-1"))
	before, _ := s.Profile(1)
	bad := 0
	for _, u := range []ProfileUpdate{
		{PushInterval: &bad},
		{Config: json.RawMessage(`[1]`)},
		{Config: json.RawMessage(`{"a":"` + strings.Repeat("x", MaxConfigBytes) + `"}`)},
	} {
		if _, err := s.UpdateProfile(ctx, 1, u); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v", u, err)
		}
	}
	if after, _ := s.Profile(1); after.Version != before.Version || after.PushInterval != before.PushInterval {
		t.Fatalf("a refused update changed the profile: %+v", after)
	}
	p, err := s.UpdateProfile(ctx, 1, ProfileUpdate{Config: json.RawMessage("{ \"apn\" : \"iot\" }")})
	if err != nil || string(p.Config) != `{"apn":"iot"}` {
		t.Fatalf("stored %s, %v; want compact JSON", p.Config, err)
	}
}

func TestParseFilter(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, newRecStore())
	if _, err := s.CreateLabel(ctx, "north"); err != nil {
		t.Fatal(err)
	}
	f, err := s.ParseFilter(url.Values{"sync_state": {"sync_pending"}, "liveness": {"late"}, "device_type": {"ICR"},
		"firmware": {"6.3"}, "profile_id": {"7"}, "q": {" m-1 "}, "label": {"north", "nope"}, "limit": {"x"}})
	if err != nil || *f.SyncState != SyncPending || *f.Liveness != Late || f.DeviceType != "ICR" || f.Firmware != "6.3" ||
		f.ProfileID != 7 || f.Text != "m-1" || len(f.Labels) != 2 || f.Labels[0] == 0 || f.Labels[1] != 0 {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = s.ParseFilter(url.Values{"sync_state": {"bogus"}, "liveness": {"sideways"}, "profile_id": {"p"}, "firmware": {"6.3"}})
	got := Problems(err)
	if len(got) != 3 || !strings.Contains(got[0], "unknown sync state") || !strings.Contains(got[1], "liveness must be online, late, offline or unknown") ||
		!strings.Contains(got[2], "profile_id") || !errors.Is(err, ErrInvalid) {
		t.Fatalf("problems %q", got)
	}
	if f.SyncState != nil || f.Liveness != nil || f.Firmware != "6.3" {
		t.Fatalf("the right parameters are kept: %+v", f)
	}
}

func TestNewRefusesDefaultPushIntervalOutOfRange(t *testing.T) {
	if _, err := New(context.Background(), Stores{}, nil, Options{DefaultPushInterval: MaxPushInterval + 1}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("got %v", err)
	}
}
