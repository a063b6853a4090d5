package agent

// Machine identity (docs/agent.md#machine-identity): a new state directory
// takes its machine ID from stable facts of the hardware, so that an agent
// whose state was wiped (reinstalled, router reset, reflashed) registers
// with the same machine ID, and the Go and the shell agent on one box agree.
// agent/drover-agent.sh derives it the same way (derive_machine_id); a
// test runs both on the same fake trees.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Sources of a derived machine ID, in the order they are tried.
const (
	SourceScript    = "script"     // the operator's --identity-script: the first line it prints
	SourceDMI       = "dmi"        // /sys/class/dmi/id/product_uuid
	SourceMachineID = "machine-id" // /etc/machine-id
	SourceMAC       = "mac"        // the permanent MAC of the first physical interface
	SourceRandom    = "random"     // none of the above: 128 random bits
)

// DerivedIDPrefix starts every machine ID derived from the hardware.
const DerivedIDPrefix = "hw-"

// identityScriptTimeout bounds the operator's identity script.
const identityScriptTimeout = 30 * time.Second

var (
	uuidRE      = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	machineIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)
	macRE       = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
)

// placeholderUUIDs are product UUIDs that firmware vendors ship on many
// boards alike; all zeros and all Fs are refused as well.
var placeholderUUIDs = map[string]bool{
	"03000200-0400-0500-0006-000700080009": true,
}

// HashMachineID is the machine ID of a hardware fact: DerivedIDPrefix and
// the first 32 hex digits of SHA-256("SOURCE:VALUE"). The value itself
// never leaves the device.
func HashMachineID(source, value string) string {
	h := sha256.Sum256([]byte(source + ":" + value))
	return DerivedIDPrefix + hex.EncodeToString(h[:])[:32]
}

// DeriveMachineID works out the machine ID a new state directory gets on
// the machine whose /sys and /etc are under root ("/" on a device): from
// the identity script's output when script is set (a failing script is an
// error, not a fall-through: the operator asked for it), else the DMI
// product UUID, /etc/machine-id, the first permanent MAC, else random.
func DeriveMachineID(ctx context.Context, root, script string) (id, source string, err error) {
	source, value, err := hardwareFact(ctx, root, script)
	if err != nil {
		return "", "", err
	}
	if source == SourceRandom {
		return value, source, nil
	}
	return HashMachineID(source, value), source, nil
}

// hardwareFact is the first usable fact, before hashing.
func hardwareFact(ctx context.Context, root, script string) (source, value string, err error) {
	if script != "" {
		out, errOut, err := runShell(ctx, script, nil, nil, identityScriptTimeout)
		if err != nil {
			msg := err.Error()
			if l := lastLine(errOut); l != "" {
				msg += ": " + l
			}
			return "", "", fmt.Errorf("identity script %s", msg)
		}
		line, _, _ := strings.Cut(string(out), "\n")
		if line = strings.Trim(line, " \t\r"); line == "" {
			return "", "", errors.New("identity script printed nothing")
		}
		return SourceScript, line, nil
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p)))
		if err != nil {
			return ""
		}
		line, _, _ := strings.Cut(string(b), "\n")
		return strings.ToLower(strings.Trim(strings.ReplaceAll(line, "\x00", ""), " \t\r"))
	}
	if v := read("sys/class/dmi/id/product_uuid"); validProductUUID(v) {
		return SourceDMI, v, nil
	}
	if v := read("etc/machine-id"); machineIDRE.MatchString(v) && strings.Trim(v, "0") != "" {
		return SourceMachineID, v, nil
	}
	if entries, err := os.ReadDir(filepath.Join(root, "sys", "class", "net")); err == nil {
		for _, e := range entries { // sorted by name
			name := e.Name()
			if name == "lo" || exists(filepath.Join(root, "sys", "devices", "virtual", "net", name)) {
				continue
			}
			if read("sys/class/net/"+name+"/addr_assign_type") != "0" {
				continue // random, stolen or set by software
			}
			if v := read("sys/class/net/" + name + "/address"); macRE.MatchString(v) &&
				v != "00:00:00:00:00:00" && v != "ff:ff:ff:ff:ff:ff" {
				return SourceMAC, v, nil
			}
		}
	}
	var r [16]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", "", err
	}
	return SourceRandom, hex.EncodeToString(r[:]), nil
}

// validProductUUID refuses what is not a UUID ("Not Settable", "To be
// filled by O.E.M.") and the placeholders.
func validProductUUID(v string) bool {
	if !uuidRE.MatchString(v) || placeholderUUIDs[v] {
		return false
	}
	digits := strings.ReplaceAll(v, "-", "")
	return strings.Trim(digits, "0") != "" && strings.Trim(digits, "f") != ""
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// MachineID is the machine ID an agent with cfg registers with, without
// writing anything: --machine-id, else the one kept in the state
// directory, else the derived one. source is "flag", "state" or a Source.
func MachineID(ctx context.Context, cfg Config) (id, source string, err error) {
	if cfg.MachineID != "" {
		return cfg.MachineID, "flag", nil
	}
	b, err := os.ReadFile(filepath.Join(cfg.StateDir, machineIDFile))
	switch {
	case err == nil:
		if id := strings.TrimSpace(string(b)); id != "" {
			return id, "state", nil
		}
	case !errors.Is(err, os.ErrNotExist):
		return "", "", err
	}
	return DeriveMachineID(ctx, cfg.Root, cfg.IdentityScript)
}
