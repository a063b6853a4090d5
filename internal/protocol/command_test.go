package protocol

import (
	"slices"
	"strings"
	"testing"
)

func TestCommandValidate(t *testing.T) {
	ok := []Command{
		{ID: 1, Kind: KindReboot, Timeout: 60},
		{ID: 1, Kind: KindPing, Args: []string{"192.0.2.1"}, Timeout: 10},
		{ID: 1, Kind: KindPing, Args: []string{"fe80::1"}, Timeout: 10},
		{ID: 1, Kind: KindReadLog, Args: []string{"messages"}, Timeout: 10},
		{ID: 1, Kind: KindSetConfig, Args: []string{"wan.mtu", "1400; rm -rf /"}, Timeout: 10},
		{ID: 1, Kind: KindHook, Args: []string{"a b", "$(x)"}, Timeout: 3600},
	}
	for _, c := range ok {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	bad := map[string]Command{
		"id":          {Kind: KindReboot, Timeout: 60},
		"kind":        {ID: 1, Kind: "shell", Args: []string{"ls"}, Timeout: 60},
		"timeout 0":   {ID: 1, Kind: KindReboot},
		"timeout":     {ID: 1, Kind: KindReboot, Timeout: MaxCommandTimeout + 1},
		"reboot args": {ID: 1, Kind: KindReboot, Args: []string{"now"}, Timeout: 1},
		"ping option": {ID: 1, Kind: KindPing, Args: []string{"-f"}, Timeout: 1},
		"ping shell":  {ID: 1, Kind: KindPing, Args: []string{"a;b"}, Timeout: 1},
		"ping none":   {ID: 1, Kind: KindPing, Timeout: 1},
		"log path":    {ID: 1, Kind: KindReadLog, Args: []string{"../etc/shadow"}, Timeout: 1},
		"log dot":     {ID: 1, Kind: KindReadLog, Args: []string{".."}, Timeout: 1},
		"set key":     {ID: 1, Kind: KindSetConfig, Args: []string{"a b", "c"}, Timeout: 1},
		"control":     {ID: 1, Kind: KindHook, Args: []string{"a\nb"}, Timeout: 1},
		"long arg":    {ID: 1, Kind: KindHook, Args: []string{strings.Repeat("a", MaxCommandArgLen+1)}, Timeout: 1},
		"too many":    {ID: 1, Kind: KindHook, Args: make([]string, MaxCommandArgs+1), Timeout: 1},
	}
	for name, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: %+v accepted", name, c)
		}
	}
}

func TestDecodePushResults(t *testing.T) {
	p, err := DecodePush([]byte(`{"seq":1,"state":{},"results":[{"id":3,"exit_code":0,"output":["x"],"started_at":5,"finished_at":6}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Results) != 1 || p.Results[0].ID != 3 || !p.Results[0].Succeeded() || p.Results[0].Output[0] != "x" {
		t.Fatalf("results %+v", p.Results)
	}
	for _, body := range []string{
		`{"state":{},"results":[{"id":0}]}`,
		`{"state":{},"results":[{"id":1,"output":["a\nb"]}]}`,
		`{"state":{},"results":[{"id":1,"output":["` + strings.Repeat("a", MaxResultOutputBytes+1) + `"]}]}`,
		`{"state":{},"results":[{"id":1},{"id":2},{"id":3},{"id":4},{"id":5}]}`,
		`{"state":{},"results":[{"id":1,"started_at":-1}]}`,
	} {
		if _, err := DecodePush([]byte(body)); err == nil {
			t.Errorf("accepted %.80s", body)
		}
	}
}

// FuzzCommandValidate: Validate never panics, and what it accepts keeps
// the promises agents rely on: a known kind, bounded text arguments, and
// no argument of ping or read-log an option or a path.
func FuzzCommandValidate(f *testing.F) {
	f.Add("ping", "192.0.2.1", "", 60)
	f.Add("read-log", "../etc/shadow", "", 1)
	f.Add("set-config", "wan.mtu", "1400; reboot", 10)
	f.Add("hook", "-rf", "$(id)", 3600)
	f.Fuzz(func(t *testing.T, kind, a0, a1 string, timeout int) {
		var args []string
		for _, a := range []string{a0, a1} {
			if a != "" {
				args = append(args, a)
			}
		}
		c := Command{ID: 1, Kind: kind, Args: args, Timeout: timeout}
		if c.Validate() != nil {
			return
		}
		if !slices.Contains(CommandKinds, kind) || timeout < 1 || timeout > MaxCommandTimeout {
			t.Fatalf("accepted %+v", c)
		}
		for _, a := range args {
			if textProblem(a, MaxCommandArgLen, false) != "" {
				t.Fatalf("accepted argument %q", a)
			}
		}
		if (kind == KindPing || kind == KindReadLog) && (strings.HasPrefix(args[0], "-") || strings.Contains(args[0], "/")) {
			t.Fatalf("accepted %s %q", kind, args[0])
		}
	})
}
