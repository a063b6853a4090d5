package agent

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/drover/drover/internal/protocol"

	"github.com/drover/drover/internal/fsutil"
)

// Files in the state directory.
const (
	machineIDFile = "machine-id"          // written once, never rewritten
	stateFile     = "state.json"          // rewritten atomically
	pendingFile   = "config-pending.json" // desired configuration handed to the hook
	appliedFile   = "config.json"         // last configuration the hook applied
	lockFile      = "lock"
)

// seqBlock is how many sequence numbers are reserved per state-file write,
// so that the flash of a router is not rewritten on every push.
const seqBlock = 64

// persisted is the content of state.json.
type persisted struct {
	DeviceID      string    `json:"device_id,omitempty"`
	Token         string    `json:"token,omitempty"`
	DeviceKey     string    `json:"device_key,omitempty"` // proves this device when it registers again
	Server        string    `json:"server,omitempty"`     // the server the token belongs to
	Seq           uint64    `json:"seq"`                  // no sequence number above this was sent
	ConfigVersion int64     `json:"config_version"`
	ConfigError   string    `json:"config_error,omitempty"`
	FailedVersion int64     `json:"failed_version,omitempty"` // version whose hook failed last
	FailedAt      time.Time `json:"failed_at,omitzero"`
	// Remote commands (commands.go): results not yet accepted by the
	// server, and the IDs run lately (never run one twice).
	Results      []protocol.CommandResult `json:"results,omitempty"`
	DoneCommands []uint64                 `json:"done_commands,omitempty"`
	Firmware     *fwJob                   `json:"firmware,omitempty"` // the firmware update under way
}

// loadMachineID returns the machine ID kept in dir, creating one when there
// is none with derive (nil: 128 random bits). An explicit id replaces the
// stored one. A kept machine ID is never derived again: an agent upgraded
// from random machine IDs keeps its own.
func loadMachineID(dir, explicit string, derive func() (string, error)) (id string, created bool, err error) {
	path := filepath.Join(dir, machineIDFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		id = strings.TrimSpace(string(b))
		if explicit == "" || explicit == id {
			if id == "" {
				return "", false, fmt.Errorf("%s is empty: delete it to get a new machine ID", path)
			}
			return id, false, nil
		}
	case !errors.Is(err, os.ErrNotExist):
		return "", false, err
	}
	id = explicit
	if id == "" && derive != nil {
		if id, err = derive(); err != nil {
			return "", false, err
		}
	}
	if id == "" {
		var r [16]byte
		if _, err := rand.Read(r[:]); err != nil {
			return "", false, err
		}
		id = hex.EncodeToString(r[:])
	}
	return id, true, fsutil.WriteFileAtomic(path, []byte(id+"\n"), 0o600)
}

// loadState reads state.json. A missing file is an empty state; an
// unreadable one is moved aside so that the agent can start over (the
// machine ID lives in its own file and survives).
func loadState(dir string) (persisted, error) {
	var p persisted
	path := filepath.Join(dir, stateFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return p, nil
	}
	if err != nil {
		return p, err
	}
	if err := json.Unmarshal(b, &p); err != nil {
		bad := path + ".corrupt"
		if rerr := os.Rename(path, bad); rerr != nil {
			return persisted{}, fmt.Errorf("%s is corrupt (%v) and cannot be moved aside: %w", path, err, rerr)
		}
		return persisted{}, fmt.Errorf("%s was corrupt and was moved to %s: %w", path, bad, err)
	}
	return p, nil
}

func saveState(dir string, p *persisted) error {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(filepath.Join(dir, stateFile), append(b, '\n'), 0o600)
}
