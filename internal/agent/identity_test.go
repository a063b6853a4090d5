package agent

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeHW is a machine's /sys and /etc as the identity sources read them.
type fakeHW struct {
	productUUID string // "": no file
	machineID   string // "": no file
	// nics: name -> {address, addr_assign_type, virtual}
	nics map[string]fakeNIC
}

type fakeNIC struct {
	mac, assign string
	virtual     bool
}

// tree writes h as a root directory laid out as sysfs is: /sys/class/net
// entries are links into /sys/devices, virtual ones under
// /sys/devices/virtual/net.
func (h fakeHW) tree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write := func(p, v string) {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if h.productUUID != "" {
		write("sys/class/dmi/id/product_uuid", h.productUUID+"\n")
	}
	if h.machineID != "" {
		write("etc/machine-id", h.machineID+"\n")
	}
	if err := os.MkdirAll(filepath.Join(root, "sys/class/net"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, n := range h.nics {
		dev := "devices/pci0000:00/0000:00:1f.6/net/" + name
		if n.virtual {
			dev = "devices/virtual/net/" + name
		}
		write("sys/"+dev+"/address", n.mac+"\n")
		write("sys/"+dev+"/addr_assign_type", n.assign+"\n")
		if err := os.Symlink("../../"+dev, filepath.Join(root, "sys/class/net", name)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// The cases of identityCases name what each machine must derive.
var randomID = regexp.MustCompile(`^[0-9a-f]{32}$`)

type identityCase struct {
	name   string
	hw     fakeHW
	script string
	want   string // "": random; "error": no machine ID
}

func identityCases() []identityCase {
	nics := map[string]fakeNIC{
		"lo":      {"00:00:00:00:00:00", "0", true},
		"docker0": {"02:42:ac:11:00:01", "0", true},  // virtual, though "permanent"
		"eth0":    {"5a:11:22:33:44:55", "1", false}, // random
		"eth1":    {"00:00:00:00:00:00", "0", false}, // no address
		"enp3s0":  {"3C:52:82:AA:BB:CC", "0", false}, // the first permanent one (upper case on purpose)
		"wlan0":   {"f0:9f:c2:00:00:01", "0", false},
	}
	full := fakeHW{productUUID: "4C4C4544-0042-3510-8052-B4C04F4E3232", machineID: "0f1e2d3c4b5a69788796a5b4c3d2e1f0", nics: nics}
	with := func(f func(*fakeHW)) fakeHW {
		h := full
		f(&h)
		return h
	}
	noDMI := func(v string) fakeHW { return with(func(h *fakeHW) { h.productUUID = v }) }
	return []identityCase{
		{"script", full, "echo '  SN-0042 \t'; echo second line", HashMachineID(SourceScript, "SN-0042")},
		{"script-fails", full, "echo SN-1; echo modem not up >&2; exit 3", "error"},
		{"script-prints-nothing", full, "echo; echo SN-1", "error"},
		{"dmi", full, "", HashMachineID(SourceDMI, "4c4c4544-0042-3510-8052-b4c04f4e3232")},
		{"dmi-zero", noDMI("00000000-0000-0000-0000-000000000000"), "", HashMachineID(SourceMachineID, full.machineID)},
		{"dmi-ffff", noDMI("FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"), "", HashMachineID(SourceMachineID, full.machineID)},
		{"dmi-not-settable", noDMI("Not Settable"), "", HashMachineID(SourceMachineID, full.machineID)},
		{"dmi-to-be-filled", noDMI("To be filled by O.E.M."), "", HashMachineID(SourceMachineID, full.machineID)},
		{"dmi-vendor-placeholder", noDMI("03000200-0400-0500-0006-000700080009"), "", HashMachineID(SourceMachineID, full.machineID)},
		{"machine-id", noDMI(""), "", HashMachineID(SourceMachineID, full.machineID)},
		{"machine-id-uninitialized", with(func(h *fakeHW) { h.productUUID, h.machineID = "", "uninitialized" }), "", HashMachineID(SourceMAC, "3c:52:82:aa:bb:cc")},
		{"machine-id-zero", with(func(h *fakeHW) { h.productUUID, h.machineID = "", strings.Repeat("0", 32) }), "", HashMachineID(SourceMAC, "3c:52:82:aa:bb:cc")},
		{"mac", with(func(h *fakeHW) { h.productUUID, h.machineID = "", "" }), "", HashMachineID(SourceMAC, "3c:52:82:aa:bb:cc")},
		{"mac-none-permanent", fakeHW{nics: map[string]fakeNIC{"lo": nics["lo"], "docker0": nics["docker0"], "eth0": nics["eth0"], "eth1": nics["eth1"]}}, "", ""},
		{"nothing", fakeHW{}, "", ""},
	}
}

// Each source in order, the placeholders skipped, the value hashed.
func TestDeriveMachineIDSources(t *testing.T) {
	t.Parallel()
	for _, c := range identityCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			root := c.hw.tree(t)
			id, source, err := DeriveMachineID(context.Background(), root, c.script)
			switch {
			case c.want == "error":
				if err == nil {
					t.Fatalf("derived %q (%s), want an error", id, source)
				}
			case err != nil:
				t.Fatal(err)
			case c.want == "":
				if source != SourceRandom || !randomID.MatchString(id) {
					t.Fatalf("derived %q (%s), want random", id, source)
				}
			case id != c.want:
				t.Fatalf("derived %q (%s), want %q", id, source, c.want)
			}
			if strings.Contains(id, "4c4c4544") || strings.Contains(id, "0f1e2d3c") || strings.Contains(id, "SN-") {
				t.Fatalf("the raw value shows in %q", id)
			}
		})
	}
	// printf 'dmi:x' | sha256sum | cut -c1-32, as docs/agent.md shows.
	if got := HashMachineID("dmi", "x"); got != "hw-c4fb0f506ec7e78e437bf1f476e2d7d7" {
		t.Fatalf("HashMachineID: %q", got)
	}
}

// The Go agent and the shell agent, under dash and under busybox, derive
// the same machine ID from the same machine.
func TestMachineIDSameInBothAgents(t *testing.T) {
	t.Parallel()
	for shName, mk := range shells(t) {
		t.Run(shName, func(t *testing.T) {
			t.Parallel()
			sh := mk(t)
			for _, c := range identityCases() {
				root := c.hw.tree(t)
				goID, _, goErr := DeriveMachineID(context.Background(), root, c.script)
				args := append(slices.Clip(sh.argv), shellScript(t), "--print-machine-id", "--root", root,
					"--state-dir", filepath.Join(t.TempDir(), "none"))
				if c.script != "" {
					args = append(args, "--identity-script", c.script)
				}
				cmd := exec.Command(args[0], args[1:]...)
				cmd.Env = append(slices.Clip(sh.env), "TMPDIR="+t.TempDir())
				var stderr strings.Builder
				cmd.Stderr = &stderr
				out, shErr := cmd.Output()
				shID := strings.TrimSpace(string(out))
				switch {
				case c.want == "error":
					if goErr == nil || shErr == nil {
						t.Errorf("%s: Go %q %v, shell %q %v: want both to fail", c.name, goID, goErr, shID, shErr)
					}
				case goErr != nil || shErr != nil:
					t.Errorf("%s: Go %v, shell %v: %s", c.name, goErr, shErr, stderr.String())
				case c.want == "":
					if !randomID.MatchString(shID) || shID == goID {
						t.Errorf("%s: shell %q, Go %q: want two random IDs", c.name, shID, goID)
					}
				case shID != goID || goID != c.want:
					t.Errorf("%s: shell %q, Go %q, want %q (stderr %s)", c.name, shID, goID, c.want, stderr.String())
				}
			}
			// A state directory's machine ID wins over the hardware (an
			// upgraded agent keeps its own), --machine-id over both.
			root := identityCases()[3].hw.tree(t)
			kept := t.TempDir()
			if err := os.WriteFile(filepath.Join(kept, machineIDFile), []byte("a1b2c3d4a1b2c3d4a1b2c3d4a1b2c3d4\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				args []string
				want string
			}{
				{[]string{"--state-dir", kept}, "a1b2c3d4a1b2c3d4a1b2c3d4a1b2c3d4"},
				{[]string{"--state-dir", kept, "--machine-id", "serial-7"}, "serial-7"},
			} {
				args := append(append(slices.Clip(sh.argv), shellScript(t), "--print-machine-id", "--root", root), c.args...)
				cmd := exec.Command(args[0], args[1:]...)
				cmd.Env = append(slices.Clip(sh.env), "TMPDIR="+t.TempDir())
				out, err := cmd.Output()
				if got := strings.TrimSpace(string(out)); err != nil || got != c.want {
					t.Errorf("%q: %q %v, want %q", c.args, got, err, c.want)
				}
			}
		})
	}
}

// A wiped state directory derives the same machine ID again; an existing
// one keeps its own (an agent upgraded from random machine IDs), and
// --machine-id still wins.
func TestAgentMachineIDSurvivesWipedState(t *testing.T) {
	t.Parallel()
	root := identityCases()[3].hw.tree(t) // DMI
	want := identityCases()[3].want
	newAgent := func(stateDir, explicit string) string {
		t.Helper()
		cfg := DefaultConfig()
		cfg.Server, cfg.EnrollSecret, cfg.StateDir, cfg.Root = "https://127.0.0.1:1", "s", stateDir, root
		cfg.MachineID, cfg.CPUWindow = explicit, time.Millisecond
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		return a.MachineID()
	}
	state := filepath.Join(t.TempDir(), "state")
	if id := newAgent(state, ""); id != want {
		t.Fatalf("new state: %q, want %q", id, want)
	}
	if err := os.RemoveAll(state); err != nil {
		t.Fatal(err)
	}
	if id := newAgent(state, ""); id != want {
		t.Fatalf("wiped state: %q, want %q", id, want)
	}
	old := filepath.Join(t.TempDir(), "old")
	if err := os.MkdirAll(old, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(old, machineIDFile), []byte("a1b2c3d4a1b2c3d4a1b2c3d4a1b2c3d4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if id := newAgent(old, ""); id != "a1b2c3d4a1b2c3d4a1b2c3d4a1b2c3d4" {
		t.Fatalf("upgraded state: %q, want the kept machine ID", id)
	}
	if id := newAgent(filepath.Join(t.TempDir(), "x"), "serial-7"); id != "serial-7" {
		t.Fatalf("--machine-id: %q", id)
	}
}
