package cluster_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/store/dbtest"
)

// fwDevice is a device of the rollout test, pushing to whichever node the
// test names.
type fwDevice struct {
	r        registration
	firmware string
	seq      int
}

// offer is the firmware_update of a push answer.
type offer struct {
	Rollout uint64 `json:"rollout"`
	Version string `json:"version"`
	URL     string `json:"url"`
	SHA256  string `json:"sha256"`
	Size    int64  `json:"size"`
}

// push sends d's push to n with report (a firmware_update JSON object, or
// "") and returns the offer of the answer, if any.
func (d *fwDevice) push(t *testing.T, n *node, report string) *offer {
	t.Helper()
	d.seq++
	body := fmt.Sprintf(`{"seq":%d,"config_version":0,"state":{"uptime":%d,"firmware":%q}`, d.seq, 100+d.seq, d.firmware)
	if report != "" {
		body += `,"firmware_update":` + report
	}
	st, b := n.do("POST", "/api/v1/push", d.r.Token, body+"}")
	var pr struct {
		FirmwareUpdate *offer `json:"firmware_update"`
	}
	if st != 200 || json.Unmarshal(b, &pr) != nil {
		t.Fatalf("push of %s on %s: %d %s", d.r.DeviceID, n.name, st, b)
	}
	return pr.FirmwareUpdate
}

type rolloutView = fleet.Rollout

// getRollout reads rollout id on n; one n has not read back yet (404) is
// the zero view.
func getRollout(t *testing.T, n *node, id uint64) rolloutView {
	t.Helper()
	st, b := n.do("GET", fmt.Sprintf("/api/v1/rollouts/%d", id), adminToken, "")
	var v rolloutView
	if st == 404 {
		return v
	}
	if st != 200 || json.Unmarshal(b, &v) != nil {
		t.Fatalf("rollout %d on %s: %d %s", id, n.name, st, b)
	}
	return v
}

func control(t *testing.T, n *node, id uint64, action string) rolloutView {
	t.Helper()
	st, b := n.do("POST", fmt.Sprintf("/api/v1/rollouts/%d/%s", id, action), adminToken, "")
	var v rolloutView
	if st != 200 || json.Unmarshal(b, &v) != nil {
		t.Fatalf("%s rollout %d on %s: %d %s", action, id, n.name, st, b)
	}
	return v
}

// Rollouts in a cluster (docs/firmware.md#rollouts-in-a-cluster): created
// on a node that does not drive, visible everywhere, waves started once by
// the driver, offers and reports on any node counted once, pause, resume
// and abort from any node, and the driver's kill -9 taken over by another
// node without a wave started twice.
func TestClusterRollout(t *testing.T) {
	t.Parallel()
	srv := dbtest.Need(t, dbtest.Postgres, pg)
	dsn := srv.NewDB(t)
	nats := startNATS(t)
	// Each node has its own firmware directory: files travel through
	// the database.
	extra := []string{"--rollout-interval", "200ms"}
	nodes := []*node{startNode(t, "a", dsn, nats.url(), extra...)}
	var leader *node
	within(t, 10*time.Second, "a leads", func() bool { return leads(t, nodes[0]) })
	leader = nodes[0]
	nodes = append(nodes, startNode(t, "b", dsn, nats.url(), extra...), startNode(t, "c", dsn, nats.url(), extra...))
	a, b, c := nodes[0], nodes[1], nodes[2]

	ctx := context.Background()
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	waveRows := func(rollout uint64) map[int]int {
		rows, err := db.Query(ctx, `SELECT wave, count(*) FROM rollout_devices WHERE rollout_id = $1 GROUP BY wave`, int64(rollout))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[int]int{}
		for rows.Next() {
			var w, n int
			if err := rows.Scan(&w, &n); err != nil {
				t.Fatal(err)
			}
			out[w] = n
		}
		return out
	}

	// Six devices, each pushed once to every node (online everywhere).
	var devs []*fwDevice
	for i := range 6 {
		d := &fwDevice{r: nodes[i%3].mustRegister(fmt.Sprintf("m-roll-%d", i)), firmware: "6.3.5"}
		devs = append(devs, d)
	}
	for _, d := range devs {
		for _, n := range nodes {
			if o := d.push(t, n, ""); o != nil {
				t.Fatalf("offer before any rollout: %+v", o)
			}
		}
	}

	// A firmware file uploaded to A is served by C (which fetches it
	// from the database once, and checks it).
	img := []byte(strings.Repeat("cluster-firmware-", 4000))
	sum := sha256.Sum256(img)
	req, _ := http.NewRequest("POST", a.base+"/api/v1/firmware?device_type=ICR-3241&version=7.0.0", strings.NewReader(string(img)))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := a.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var fw struct {
		ID uint64 `json:"id,string"`
	}
	if resp.StatusCode != 201 || json.Unmarshal(body, &fw) != nil {
		t.Fatalf("upload on a: %d %s", resp.StatusCode, body)
	}

	// A file whose database copy is damaged is not served.
	bad := []byte(strings.Repeat("damaged-firmware-", 1000))
	badSum := sha256.Sum256(bad)
	req, _ = http.NewRequest("POST", a.base+"/api/v1/firmware?device_type=ICR-3241&version=6.9.9", strings.NewReader(string(bad)))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	if resp, err = a.client.Do(req); err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var badFW struct {
		ID uint64 `json:"id,string"`
	}
	if resp.StatusCode != 201 || json.Unmarshal(body, &badFW) != nil {
		t.Fatalf("upload on a: %d %s", resp.StatusCode, body)
	}
	if _, err := db.Exec(ctx, `UPDATE firmware_blobs SET data = overlay(data placing 'X'::bytea from 10) WHERE sha256 = $1`, hex.EncodeToString(badSum[:])); err != nil {
		t.Fatal(err)
	}
	within(t, 5*time.Second, "b knows the damaged artifact", func() bool {
		st, _ := b.do("GET", fmt.Sprintf("/api/v1/firmware/%d", badFW.ID), adminToken, "")
		return st == 200
	})
	if st, body := b.do("GET", fmt.Sprintf("/api/v1/firmware/%d/file", badFW.ID), adminToken, ""); st != 503 {
		t.Fatalf("damaged file from b: %d %s, want 503", st, body)
	}
	if st, body := a.do("GET", fmt.Sprintf("/api/v1/firmware/%d/file", badFW.ID), adminToken, ""); st != 200 || body[9] == 'X' {
		t.Fatalf("the uploading node's own copy: %d", st)
	}

	// Created on B, which does not drive: every node shows it.
	var ro rolloutView
	within(t, 10*time.Second, "the rollout is created on b", func() bool {
		st, body := b.do("POST", "/api/v1/rollouts", adminToken, fmt.Sprintf(`{"firmware_id":%d,"waves":["2","100%%"],"max_failure_pct":40,"max_downloads":10}`, fw.ID))
		if st == 400 && strings.Contains(string(body), "firmware_id") {
			return false // b has not read the new artifact back yet
		}
		if st != 201 || json.Unmarshal(body, &ro) != nil {
			t.Fatalf("create rollout on b: %d %s", st, body)
		}
		return true
	})
	if ro.Total != 6 || ro.State != "running" {
		t.Fatalf("rollout: %+v", ro)
	}
	for _, n := range nodes {
		within(t, 5*time.Second, "rollout wave 1 on "+n.name, func() bool { return getRollout(t, n, ro.ID).Wave == 1 })
	}

	// Devices pushing to B and C get the offer: exactly the wave's two.
	offered := map[*fwDevice]*offer{}
	within(t, 10*time.Second, "wave 1's offers through b and c", func() bool {
		for i, d := range devs {
			if o := d.push(t, nodes[1+i%2], ""); o != nil {
				if o.Version != "7.0.0" || o.SHA256 != hex.EncodeToString(sum[:]) || o.Rollout != ro.ID {
					t.Fatalf("offer: %+v", o)
				}
				offered[d] = o
			}
		}
		return len(offered) == 2
	})
	// The file from C, with Range, by a device's token.
	var first *fwDevice
	for d := range offered {
		first = d
	}
	req, _ = http.NewRequest("GET", c.base+offered[first].URL, nil)
	req.Header.Set("Authorization", "Bearer "+first.r.Token)
	req.Header.Set("Range", "bytes=100-")
	resp, err = c.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	part, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 206 || string(part) != string(img[100:]) {
		t.Fatalf("ranged download from c: %d, %d bytes", resp.StatusCode, len(part))
	}
	// Reports on B and C, each sent to both: downloading, installing,
	// then the new firmware: verified once each.
	for d := range offered {
		rep := fmt.Sprintf(`{"rollout":%d,"state":"downloading","progress":100}`, ro.ID)
		d.push(t, b, rep)
		d.push(t, c, rep)
		rep = fmt.Sprintf(`{"rollout":%d,"state":"installing"}`, ro.ID)
		d.push(t, c, rep)
		d.push(t, b, rep)
		d.firmware = "7.0.0"
		d.push(t, b, "")
		d.push(t, c, "")
	}
	// Wave 2 (the other four) starts once, driven by A.
	for _, n := range nodes {
		within(t, 10*time.Second, "wave 2 on "+n.name, func() bool {
			v := getRollout(t, n, ro.ID)
			return v.Wave == 2 && v.Counts["verified"] == 2
		})
	}
	wave2 := map[*fwDevice]bool{}
	within(t, 10*time.Second, "wave 2's offers through c and b", func() bool {
		for i, d := range devs {
			if offered[d] != nil {
				continue
			}
			if o := d.push(t, nodes[2-i%2], ""); o != nil {
				wave2[d] = true
			}
		}
		return len(wave2) == 4
	})
	// Two of four fail (50 % > 40 %), each failure reported to B and to
	// C: counted once each, and the rollout pauses.
	var failing, rest []*fwDevice
	for d := range wave2 {
		if len(failing) < 2 {
			failing = append(failing, d)
		} else {
			rest = append(rest, d)
		}
	}
	for _, d := range failing {
		rep := fmt.Sprintf(`{"rollout":%d,"state":"failed","reason":"flash error"}`, ro.ID)
		d.push(t, b, rep)
		d.push(t, c, rep)
	}
	for _, n := range nodes {
		within(t, 10*time.Second, "paused on "+n.name, func() bool {
			v := getRollout(t, n, ro.ID)
			return v.State == "paused" && v.Counts["failed"] == 2
		})
	}
	if v := getRollout(t, c, ro.ID); !strings.Contains(v.Reason, "wave 2: 2 of 4 devices failed") {
		t.Errorf("pause reason: %q", v.Reason)
	}
	// Resumed on C; the other two verify through C; done.
	if v := control(t, c, ro.ID, "resume"); v.State != "running" {
		t.Fatalf("resume on c: %+v", v)
	}
	for _, d := range rest {
		d.firmware = "7.0.0"
		d.push(t, c, "")
	}
	for _, n := range nodes {
		within(t, 10*time.Second, "done on "+n.name, func() bool {
			v := getRollout(t, n, ro.ID)
			return v.State == "done" && v.Counts["verified"] == 4 && v.Counts["failed"] == 2
		})
	}
	if got := waveRows(ro.ID); len(got) != 2 || got[1] != 2 || got[2] != 4 {
		t.Fatalf("rows by wave: %v, want wave 1: 2, wave 2: 4", got)
	}

	// A second rollout, to the four on 7.0.0, one device a wave: paused
	// on C, resumed on B, and the driver killed.
	req, _ = http.NewRequest("POST", c.base+"/api/v1/firmware", strings.NewReader(fmt.Sprintf(
		`{"device_type":"ICR-3241","version":"7.1.0","sha256":%q,"size":%d,"url":"https://files.example/fw-7.1.0.bin"}`, hex.EncodeToString(sum[:]), len(img))))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	if resp, err = c.client.Do(req); err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || json.Unmarshal(body, &fw) != nil {
		t.Fatalf("firmware by URL on c: %d %s", resp.StatusCode, body)
	}
	var ro2 rolloutView
	within(t, 10*time.Second, "the second rollout is created on c", func() bool {
		st, body := c.do("POST", "/api/v1/rollouts", adminToken, fmt.Sprintf(`{"firmware_id":%d,"filter":"firmware=7.0.0","waves":["1"]}`, fw.ID))
		if st == 400 && strings.Contains(string(body), "firmware_id") {
			return false
		}
		if st != 201 || json.Unmarshal(body, &ro2) != nil {
			t.Fatalf("create rollout on c: %d %s", st, body)
		}
		return true
	})
	if ro2.Total != 4 {
		t.Fatalf("second rollout: %+v", ro2)
	}
	within(t, 10*time.Second, "second rollout's wave 1 on b", func() bool { return getRollout(t, b, ro2.ID).Wave == 1 })
	if v := control(t, c, ro2.ID, "pause"); v.State != "paused" {
		t.Fatalf("pause on c: %+v", v)
	}
	for _, n := range nodes {
		within(t, 5*time.Second, "second rollout paused on "+n.name, func() bool { return getRollout(t, n, ro2.ID).State == "paused" })
	}
	var v7 []*fwDevice
	for _, d := range devs {
		if d.firmware == "7.0.0" {
			v7 = append(v7, d)
		}
	}
	for _, d := range v7 {
		if o := d.push(t, b, ""); o != nil {
			t.Fatalf("offer while paused: %+v", o)
		}
	}
	// Resume on B; one device gets the offer through B.
	control(t, b, ro2.ID, "resume")
	var cur *fwDevice
	within(t, 10*time.Second, "second rollout's offer through b", func() bool {
		for _, d := range v7 {
			if o := d.push(t, b, ""); o != nil && o.Rollout == ro2.ID {
				cur = d
				return true
			}
		}
		return false
	})

	// kill -9 of the driver: B or C takes over and drives on.
	leader.cmd.Process.Kill()
	var next *node
	within(t, 15*time.Second, "another node leads", func() bool {
		for _, n := range []*node{b, c} {
			if leads(t, n) {
				next = n
				return true
			}
		}
		return false
	})
	rep := fmt.Sprintf(`{"rollout":%d,"state":"installing"}`, ro2.ID)
	cur.push(t, c, rep)
	cur.firmware = "7.1.0"
	cur.push(t, b, "")
	for _, n := range []*node{b, c} {
		within(t, 15*time.Second, "wave 2 driven by "+next.name+", seen on "+n.name, func() bool {
			v := getRollout(t, n, ro2.ID)
			return v.Wave == 2 && v.Counts["verified"] == 1
		})
	}
	// Abort on the node that does not drive: the pending device is
	// canceled everywhere, and no device is offered the firmware.
	other := b
	if next == b {
		other = c
	}
	if v := control(t, other, ro2.ID, "abort"); v.State != "aborted" {
		t.Fatalf("abort on %s: %+v", other.name, v)
	}
	for _, n := range []*node{b, c} {
		within(t, 5*time.Second, "aborted on "+n.name, func() bool {
			v := getRollout(t, n, ro2.ID)
			return v.State == "aborted" && v.Counts["canceled"] == 1 && v.Counts["pending"]+v.Counts["downloading"] == 0
		})
	}
	for _, d := range v7 {
		for _, n := range []*node{b, c} {
			if o := d.push(t, n, ""); o != nil {
				t.Fatalf("offer after the abort on %s: %+v", n.name, o)
			}
		}
	}
	if got := waveRows(ro2.ID); len(got) != 2 || got[1] != 1 || got[2] != 1 {
		t.Fatalf("second rollout's rows by wave: %v, want one device in each of waves 1 and 2", got)
	}
}
