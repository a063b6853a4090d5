package emulator

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"
)

// device is one emulated device. Only one operation runs per device at a
// time, so its fields need no lock.
type device struct {
	idx        int
	machineID  string
	deviceID   string
	token      string
	key        string // device key: proves the device when it registers again
	seq        uint64
	cfgVer     int64
	cpu, temp  float32
	rx, tx     uint64
	bootUptime uint32
	firmware   string      // after an emulated update ("": Config.Firmware)
	tls        sessionSlot // --conn resume: the device's TLS session, as an agent keeps it
	fw         *dlJob      // the firmware update under way (download.go)

	// Config.Wipe (wipe.go): chosen to be wiped, wiped, the device ID it
	// had (until it is registered again), its request sent to approval.
	wipe, wiped, asked bool
	oldID              string

	// fleet mode: 0 idle, 1 busy, 2 busy with one push waiting
	state      atomic.Int32
	pendingDue atomic.Int64
}

func newDevice(id identity, idx int) *device {
	h := id.hash(idx, 2)
	return &device{
		idx:        idx,
		machineID:  id.machineID(idx),
		cpu:        float32(5 + h%30),
		temp:       float32(38 + (h>>8)%12),
		rx:         (h >> 16) % (1 << 30),
		tx:         (h >> 20) % (1 << 28),
		bootUptime: uint32((h >> 32) % (30 * 24 * 3600)),
	}
}

// advance moves the device's state to its next push: sequence number,
// random walks for CPU and temperature, growing traffic counters.
func (d *device) advance(id identity) rng {
	d.seq++
	r := rng{s: id.hash(d.idx, d.seq<<8|3)}
	d.cpu += float32(r.float()-0.5) * 10
	d.cpu = min(max(d.cpu, 1), 99)
	target := 40 + d.cpu/4
	d.temp += float32(r.float()-0.5)*1.5 + (target-d.temp)*0.1
	d.temp = min(max(d.temp, 35), 85)
	d.rx += 2000 + uint64(r.intn(400_000))
	d.tx += 1000 + uint64(r.intn(100_000))
	return r
}

// credential is one line of a credentials file.
type credential struct {
	Index         int    `json:"i"`
	MachineID     string `json:"machine_id"`
	DeviceID      string `json:"device_id"`
	Token         string `json:"token"`
	DeviceKey     string `json:"device_key,omitempty"`
	Seq           uint64 `json:"seq"`            // kept across runs, as an agent keeps it across restarts
	ConfigVersion int64  `json:"config_version"` // the configuration last applied
}

// credentialsPath is the file a shard writes: path itself for an unsharded
// run, path.K-of-N otherwise, so that processes never write the same file.
func credentialsPath(path string, s Shard) string {
	s = s.norm()
	if s.N == 1 {
		return path
	}
	return fmt.Sprintf("%s.%d-of-%d", path, s.K, s.N)
}

// loadCredentials fills in device IDs, tokens and sequence numbers from path and from every
// shard's file beside it (path.K-of-N), so a run with any shard layout can
// reuse what any earlier layout saved. Newer files win; entries whose
// machine ID is not this seed's for that index are ignored.
func loadCredentials(path string, devs map[int]*device) (int, error) {
	files, _ := filepath.Glob(path + ".*-of-*")
	files = append(files, path)
	type fileTime struct {
		name string
		mod  time.Time
	}
	var ft []fileTime
	for _, f := range files {
		st, err := os.Stat(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if strings.HasSuffix(f, ".tmp") {
			continue
		}
		ft = append(ft, fileTime{f, st.ModTime()})
	}
	sort.Slice(ft, func(i, j int) bool { return ft[i].mod.Before(ft[j].mod) })
	loaded := map[int]bool{}
	for _, f := range ft {
		if err := readCredentials(f.name, func(c credential) {
			d := devs[c.Index]
			if d == nil || d.machineID != c.MachineID || c.Token == "" {
				return
			}
			d.deviceID, d.token, d.key, d.seq, d.cfgVer = c.DeviceID, c.Token, c.DeviceKey, c.Seq, c.ConfigVersion
			loaded[c.Index] = true
		}); err != nil {
			return 0, err
		}
	}
	return len(loaded), nil
}

func readCredentials(path string, fn func(credential)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		if len(sc.Bytes()) == 0 {
			continue
		}
		var c credential
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return fmt.Errorf("%s:%d: %w", path, line, err)
		}
		fn(c)
	}
	return sc.Err()
}

// saveCredentials writes every registered device of the shard (atomically).
func saveCredentials(path string, devs []*device) (int, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return 0, err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	w := bufio.NewWriterSize(f, 256<<10)
	enc := json.NewEncoder(w)
	n := 0
	for _, d := range devs {
		if d.token == "" {
			continue
		}
		if err := enc.Encode(credential{Index: d.idx, MachineID: d.machineID, DeviceID: d.deviceID, Token: d.token, DeviceKey: d.key, Seq: d.seq, ConfigVersion: d.cfgVer}); err != nil {
			f.Close()
			return 0, err
		}
		n++
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, err
	}
	return n, nil
}
