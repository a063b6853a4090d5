package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/protocol"
)

func TestBackoffGrowsWithJitterAndCap(t *testing.T) {
	for _, r := range []float64{0, 0.5, 0.999} {
		b := backoff{min: time.Second, max: 10 * time.Second, rand: func() float64 { return r }}
		var got []time.Duration
		for i := 0; i < 7; i++ {
			got = append(got, b.next())
		}
		nominal := []time.Duration{1, 2, 4, 8, 10, 10, 10}
		for i, d := range got {
			n := nominal[i] * time.Second
			if d < n/2 || d > n {
				t.Fatalf("rand=%v: delay %d = %v, want within [%v, %v]", r, i, d, n/2, n)
			}
		}
		b.reset()
		if d := b.next(); d > time.Second {
			t.Fatalf("after reset: %v", d)
		}
	}
}

func TestBackoffJitterSpreads(t *testing.T) {
	b := backoff{min: 8 * time.Second, max: 8 * time.Second}
	seen := map[time.Duration]bool{}
	for i := 0; i < 50; i++ {
		seen[b.next().Round(100*time.Millisecond)] = true
	}
	if len(seen) < 10 {
		t.Fatalf("50 delays took only %d distinct values: no jitter", len(seen))
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0}, {"7", 7 * time.Second}, {" 2 ", 2 * time.Second}, {"-3", 0}, {"junk", 0},
		{"999999", time.Hour}, {now.Add(90 * time.Second).Format(time.RFC1123), 90 * time.Second},
	} {
		if got := parseRetryAfter(strings.Replace(c.in, "UTC", "GMT", 1), now); got != c.want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", c.in, got, c.want)
		}
	}
	b := backoff{rand: func() float64 { return 0.999 }}
	if d := b.retryAfterDelay(10 * time.Second); d < 10*time.Second || d > 15*time.Second {
		t.Fatalf("retry-after 10s: waited %v", d)
	}
	if d := b.retryAfterDelay(time.Second); d < time.Second || d > 2*time.Second {
		t.Fatalf("retry-after 1s: waited %v", d)
	}
}

func TestMachineIDCreatedOnceAndKept(t *testing.T) {
	dir := t.TempDir()
	id, created, err := loadMachineID(dir, "", nil)
	if err != nil || !created || len(id) != 32 {
		t.Fatalf("first: %q %v %v", id, created, err)
	}
	again, created, err := loadMachineID(dir, "", nil)
	if err != nil || created || again != id {
		t.Fatalf("second: %q %v %v, want %q", again, created, err, id)
	}
	explicit, created, err := loadMachineID(dir, "serial-42", nil)
	if err != nil || !created || explicit != "serial-42" {
		t.Fatalf("explicit: %q %v %v", explicit, created, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, machineIDFile)); strings.TrimSpace(string(b)) != "serial-42" {
		t.Fatalf("file holds %q", b)
	}
}

func TestStateSavedAtomicallyAndPrivately(t *testing.T) {
	dir := t.TempDir()
	p := persisted{DeviceID: "7", Token: "7.secret", Seq: 128, ConfigVersion: 3, ConfigError: "bad", FailedVersion: 4, FailedAt: time.Unix(100, 0).UTC(),
		Results: []protocol.CommandResult{{ID: 9, ExitCode: 1, Output: []string{"x"}, StartedAt: 1, FinishedAt: 2}}, DoneCommands: []uint64{9}}
	if err := saveState(dir, &p); err != nil {
		t.Fatal(err)
	}
	got, err := loadState(dir)
	if err != nil || !reflect.DeepEqual(got, p) {
		t.Fatalf("loaded %+v, %v; want %+v", got, err, p)
	}
	fi, _ := os.Stat(filepath.Join(dir, stateFile))
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v: the token must not be readable by others", fi.Mode())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
}

func TestCorruptStateIsMovedAside(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, stateFile), []byte(`{"device_id":`), 0o600)
	p, err := loadState(dir)
	if err == nil || p.Token != "" {
		t.Fatalf("corrupt state: %+v, %v", p, err)
	}
	if _, err := os.Stat(filepath.Join(dir, stateFile+".corrupt")); err != nil {
		t.Fatal("corrupt file not kept for inspection")
	}
	if p, err := loadState(dir); err != nil || !reflect.DeepEqual(p, persisted{}) {
		t.Fatalf("after moving aside: %+v, %v", p, err)
	}
}

func TestRunShellContract(t *testing.T) {
	ctx := context.Background()
	out, errOut, err := runShell(ctx, `read x; echo "got $x $FOO"; echo warn >&2`, []byte("in\n"), []string{"FOO=bar"}, 5*time.Second)
	if err != nil || string(out) != "got in bar\n" || string(errOut) != "warn\n" {
		t.Fatalf("out=%q err=%q %v", out, errOut, err)
	}
	_, _, err = runShell(ctx, "exit 3", nil, nil, 5*time.Second)
	if err == nil || err.Error() != "exited with status 3" {
		t.Fatalf("exit 3: %v", err)
	}
	start := time.Now()
	_, _, err = runShell(ctx, "sleep 30 & sleep 30; echo never", nil, nil, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "timed out after 200ms") {
		t.Fatalf("timeout: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("timeout took %v: the process group was not killed", took)
	}
	out, _, _ = runShell(ctx, "head -c 200000 /dev/zero", nil, nil, 5*time.Second)
	if len(out) != maxOutput {
		t.Fatalf("kept %d bytes of output, want %d", len(out), maxOutput)
	}
}

func TestLastLine(t *testing.T) {
	if got := lastLine([]byte("first\nsecond\n\n  \n")); got != "second" {
		t.Fatalf("lastLine = %q", got)
	}
	if got := lastLine(nil); got != "" {
		t.Fatalf("lastLine(nil) = %q", got)
	}
}

func TestPushBodyMatchesProtocol(t *testing.T) {
	st := testSystem("testdata/root").collect(context.Background())
	b, err := json.Marshal(&pushBody{Seq: 5, ConfigVersion: 2, ConfigError: "x", State: st})
	if err != nil {
		t.Fatal(err)
	}
	p, err := protocol.DecodePush(b)
	if err != nil {
		t.Fatal(err)
	}
	if p.Seq != 5 || p.ConfigVersion != 2 || p.ConfigError != "x" || *p.State.Uptime != 12345 {
		t.Fatalf("decoded %+v", p)
	}
}
