// Command startupbench measures how long a server takes to be ready after
// its start with a large fleet in SQLite (scripts/bench-startup.sh).
//
//	startupbench seed -dir DIR -n 1000000
//
// writes DIR/drover.db: n registered devices, each with a pushed state
// written to the devices table (as after the state log's merge) and a newer
// one, with a history sample, in the open state-log generation (as after
// the devices' next round of pushes; -logged=false: not), through the
// store's own Commit.
//
//	startupbench measure -seed DIR -runs 3 BINARY...
//
// copies DIR afresh for every start, starts `BINARY serve` on the copy and
// polls, every 10 ms, GET /readyz until it answers 200 and POST
// /api/v1/push with a seeded device's token until it is accepted; it
// prints each start's times since the process started, its CPU time and RSS then,
// and the medians per binary. The binaries' starts alternate.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/sqlite"
)

func main() {
	log.SetFlags(0)
	if len(os.Args) < 2 {
		log.Fatal("usage: startupbench seed|measure [flags]")
	}
	var err error
	switch os.Args[1] {
	case "seed":
		err = seed(os.Args[2:])
	case "measure":
		err = measure(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: seed or measure", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

// The seeded fleet: three device types on two firmware versions each.
var (
	types     = []string{"ICR-3241", "ICR-2031", "SPECTRE-3G"}
	firmwares = []string{"6.3.5", "6.3.6"}
)

// token is the seeded device id's bearer token; its SHA-256 is stored.
func token(id uint64) string {
	return strconv.FormatUint(id, 10) + ".startupbench-" + strconv.FormatUint(id*7919, 36)
}

// state is a cellular router's pushed state (about 600 bytes).
func state(i int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"uptime":%d,"cpu":12.5,"load1":0.31,"mem_total":268435456,"mem_used":98304000,"disk_total":134217728,"disk_used":41943040,"temperature":47.5,"firmware":"6.3.5","interfaces":[{"name":"eth0","rx_bytes":1234567,"tx_bytes":7654321,"rx_packets":9876,"tx_packets":8765},{"name":"eth1","rx_bytes":0,"tx_bytes":0},{"name":"wwan0","rx_bytes":987654321,"tx_bytes":123456789,"rx_packets":765432,"tx_packets":654321}],"signal":{"rssi":-67,"rsrp":-95,"rsrq":-10,"sinr":12.4,"operator":"Vodafone CZ","technology":"LTE"},"extra":{"iccid":"89420310191%08d","imei":"3569380356%05d","apn":"internet"}}`, 3600+i%86400, i, i%100000))
}

func seed(args []string) error {
	fs := flag.NewFlagSet("seed", flag.ExitOnError)
	dir := fs.String("dir", "", "data directory to create")
	n := fs.Int("n", 1_000_000, "devices")
	logged := fs.Bool("logged", true, "give every device a newer state in the state log (false: the merged states only)")
	fs.Parse(args)
	if *dir == "" {
		return fmt.Errorf("seed: -dir is required")
	}
	if _, err := os.Stat(*dir); err == nil {
		return fmt.Errorf("seed: %s exists", *dir)
	}
	ctx := context.Background()
	path := filepath.Join(*dir, "drover.db")
	start := time.Now()
	now := time.Now().UTC()
	var b fleet.Batch
	pid := uint64(0)
	for _, t := range types {
		for _, f := range firmwares {
			pid++
			b.Profiles = append(b.Profiles, fleet.Profile{ID: pid, DeviceType: t, Firmware: f, Config: json.RawMessage(`{}`),
				PushInterval: 200, CreatedAt: now, UpdatedAt: now})
		}
	}
	// Round one: registrations and a push each, merged into `devices`.
	err := rounds(ctx, path, *n, func(b *fleet.Batch, i int) {
		id := uint64(i)
		th := sha256.Sum256([]byte(token(id)))
		b.Devices = append(b.Devices, fleet.DeviceRecord{ID: id, MachineID: fmt.Sprintf("%032x", uint64(i)*0x9e3779b97f4a7c15),
			DeviceType: types[i%len(types)], Model: types[i%len(types)] + "W", Firmware: firmwares[i%len(firmwares)],
			Serial: fmt.Sprintf("ACZ%08d", i), TokenHash: th[:], RegisteredAt: now.Add(-30 * 24 * time.Hour)})
		b.States = append(b.States, fleet.StateRecord{DeviceID: id, Firmware: firmwares[i%len(firmwares)],
			LastSeen: now.Add(-time.Duration(200+i%200) * time.Second), Seq: 1, State: state(i)})
	}, &b)
	if err != nil {
		return err
	}
	if err := mergeLog(ctx, path); err != nil {
		return err
	}
	// Round two: the next push of every device, in the state log, with
	// its history sample.
	cpu, temp, up := 12.5, 47.5, int64(7200)
	err = rounds(ctx, path, *n*btoi(*logged), func(b *fleet.Batch, i int) {
		id := uint64(i)
		at := now.Add(-time.Duration(i%200) * time.Second)
		b.States = append(b.States, fleet.StateRecord{DeviceID: id, Firmware: firmwares[i%len(firmwares)],
			LastSeen: at, Seq: 2, State: state(i + 200)})
		b.Samples = append(b.Samples, fleet.Sample{DeviceID: id, At: at, Seq: 2, CPU: &cpu, Temperature: &temp, Uptime: &up})
	}, nil)
	if err != nil {
		return err
	}
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*dir, "tokens.txt"), []byte(token(1)+"\n"+token(uint64(*n))+"\n"), 0o600); err != nil {
		return err
	}
	log.Printf("seeded %d devices in %s in %s", *n, *dir, time.Since(start).Round(time.Millisecond))
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// rounds opens the store at path and commits add's records for devices 1
// to n in batches of 20,000, after first (if not nil).
func rounds(ctx context.Context, path string, n int, add func(*fleet.Batch, int), first *fleet.Batch) error {
	s, err := sqlite.Open(ctx, path, false)
	if err != nil {
		return err
	}
	var b fleet.Batch
	if first != nil {
		b = *first
	}
	for lo := 1; lo <= n; lo += 20_000 {
		for i := lo; i < lo+20_000 && i <= n; i++ {
			add(&b, i)
		}
		if err := s.Commit(ctx, &b); err != nil {
			s.Close()
			return err
		}
		b.Reset()
	}
	return s.Close()
}

// mergeLog does at once what the state log's merger does at its pace:
// every logged state into `devices`, and the generations dropped.
func mergeLog(ctx context.Context, path string) error {
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		return err
	}
	defer db.Close()
	var gens []int64
	rows, err := db.QueryContext(ctx, `SELECT gen FROM state_logs ORDER BY gen`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var g int64
		rows.Scan(&g)
		gens = append(gens, g)
	}
	rows.Close()
	for _, g := range gens {
		t := "state_log_" + strconv.FormatInt(g, 10)
		for _, q := range []string{
			`UPDATE devices SET firmware = l.firmware, last_seen = l.last_seen, seq = l.seq, applied_version = l.applied_version,
				config_error = l.config_error, state = l.state FROM ` + t + ` AS l WHERE l.device_id = devices.id`,
			`DELETE FROM state_logs WHERE gen = ` + strconv.FormatInt(g, 10),
			`DROP TABLE ` + t,
		} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("merge %s: %w", t, err)
			}
		}
	}
	return nil
}

type result struct {
	bin              string
	ready, push, cpu time.Duration
	rss, loadLogLine string
}

func measure(args []string) error {
	fs := flag.NewFlagSet("measure", flag.ExitOnError)
	seedDir := fs.String("seed", "", "seeded data directory (startupbench seed)")
	work := fs.String("work", "", "directory for the copies (empty: next to -seed)")
	runs := fs.Int("runs", 3, "starts per binary")
	timeout := fs.Duration("timeout", 3*time.Minute, "longest wait for one start")
	fs.Parse(args)
	bins := fs.Args()
	if *seedDir == "" || len(bins) == 0 {
		return fmt.Errorf("measure: -seed and at least one binary are required")
	}
	tok, err := os.ReadFile(filepath.Join(*seedDir, "tokens.txt"))
	if err != nil {
		return err
	}
	toks := strings.Fields(string(tok))
	if *work == "" {
		*work = filepath.Dir(filepath.Clean(*seedDir))
	}
	var all []result
	for r := 0; r < *runs; r++ {
		for bi, bin := range bins {
			copyDir := filepath.Join(*work, fmt.Sprintf("startupbench-run-%d", os.Getpid()))
			os.RemoveAll(copyDir)
			if out, err := exec.Command("cp", "-r", *seedDir, copyDir).CombinedOutput(); err != nil {
				return fmt.Errorf("copy: %v: %s", err, out)
			}
			res, err := startOnce(bin, copyDir, toks[r%len(toks)], 3+r, *timeout)
			os.RemoveAll(copyDir)
			if err != nil {
				return fmt.Errorf("%s: %w", bin, err)
			}
			res.bin = fmt.Sprintf("%d:%s", bi, bin)
			fmt.Printf("run %d %s: ready %.2fs, push accepted %.2fs, CPU %.2fs, RSS %s; %s\n", r+1, res.bin,
				res.ready.Seconds(), res.push.Seconds(), res.cpu.Seconds(), res.rss, res.loadLogLine)
			all = append(all, res)
		}
	}
	for bi, bin := range bins {
		var ready, push, cpu, rss []float64
		for _, r := range all {
			if r.bin == fmt.Sprintf("%d:%s", bi, bin) {
				ready, push = append(ready, r.ready.Seconds()), append(push, r.push.Seconds())
				cpu = append(cpu, r.cpu.Seconds())
				kb, _ := strconv.ParseFloat(strings.Fields(r.rss)[0], 64)
				rss = append(rss, kb/1024)
			}
		}
		fmt.Printf("median of %d, %s: ready %.2fs, push accepted %.2fs, CPU %.2fs, RSS %.0f MB\n", len(ready), bin,
			median(ready), median(push), median(cpu), median(rss))
	}
	return nil
}

func median(v []float64) float64 {
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

var loadLine = regexp.MustCompile(`msg="fleet loaded".*took=(\S+)`)

func startOnce(bin, dir, tok string, seq int, timeout time.Duration) (res result, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	addr := ln.Addr().String()
	ln.Close()
	var logBuf bytes.Buffer
	cmd := exec.Command(bin, "serve", "--data-dir", dir, "--listen", "", "--http-listen", addr, "--log-level", "info")
	cmd.Stdout, cmd.Stderr = io.Discard, &logBuf
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, err
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			<-done
		}
		if m := loadLine.FindStringSubmatch(logBuf.String()); m != nil {
			res.loadLogLine = "fleet loaded took=" + m[1]
		}
		if err != nil {
			err = fmt.Errorf("%w; log:\n%s", err, logBuf.String())
		}
	}()
	c := &http.Client{Timeout: 5 * time.Second}
	body := fmt.Sprintf(`{"seq":%d,"config_version":0,"state":%s}`, seq, state(seq))
	for time.Since(start) < timeout {
		if res.ready == 0 {
			if resp, err := c.Get("http://" + addr + "/readyz"); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					res.ready = time.Since(start)
				}
			}
		}
		if res.push == 0 {
			req, _ := http.NewRequest("POST", "http://"+addr+"/api/v1/push", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/json")
			if resp, err := c.Do(req); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode == 200:
					res.push = time.Since(start)
				case resp.StatusCode != 503:
					return res, fmt.Errorf("push: %d %s", resp.StatusCode, b)
				}
			}
		}
		if res.ready != 0 && res.push != 0 {
			st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
			if err != nil {
				return res, err
			}
			for _, l := range strings.Split(string(st), "\n") {
				if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
					res.rss = strings.TrimSpace(v)
				}
			}
			res.cpu, err = processCPU(cmd.Process.Pid)
			return res, err
		}
		time.Sleep(10 * time.Millisecond)
	}
	return res, fmt.Errorf("not ready within %s", timeout)
}

// processCPU is the user and system CPU time pid used so far.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command's closing parenthesis; utime and
	// stime are the 14th and 15th of the line, in clock ticks (100 Hz).
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond, nil
}
