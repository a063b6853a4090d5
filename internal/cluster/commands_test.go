package cluster_test

// Remote commands over three `drover serve --cluster` nodes
// (docs/commands.md#cluster-mode): delivered once and recorded once
// whichever nodes the device pushes to, job state the same from every
// node, and a command queued on one node reaching a device connected to
// another within 1 s, with NATS and without.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

type jobView struct {
	ID     string         `json:"id"`
	State  string         `json:"state"`
	Total  int            `json:"total"`
	Counts map[string]int `json:"counts"`
}

type pushAnswer struct {
	Commands []struct {
		ID   uint64 `json:"id"`
		Kind string `json:"kind"`
	} `json:"commands"`
}

// send makes a job on n.
func (n *node) send(body string) jobView {
	n.t.Helper()
	st, b := n.do("POST", "/api/v1/commands", adminToken, body)
	var j jobView
	if st != 201 || json.Unmarshal(b, &j) != nil || j.ID == "" {
		n.t.Fatalf("send %s on %s: %d %s", body, n.name, st, b)
	}
	return j
}

// job reads a job on n.
func (n *node) job(id string) jobView {
	n.t.Helper()
	st, b := n.do("GET", "/api/v1/commands/"+id, adminToken, "")
	var j jobView
	if st != 200 || json.Unmarshal(b, &j) != nil {
		n.t.Fatalf("job %s on %s: %d %s", id, n.name, st, b)
	}
	return j
}

// pushWith pushes with results (a JSON array, "" for none) and returns the
// job IDs of the commands in the answer.
func (n *node) pushWith(token, results string) []string {
	n.t.Helper()
	seqMu.Lock()
	seq[token]++
	s := seq[token]
	seqMu.Unlock()
	body := fmt.Sprintf(`{"seq":%d,"config_version":0,"state":{"uptime":%d}`, s, 100+s)
	if results != "" {
		body += `,"results":` + results
	}
	st, b := n.do("POST", "/api/v1/push", token, body+"}")
	var a pushAnswer
	if st != 200 || json.Unmarshal(b, &a) != nil {
		n.t.Fatalf("push on %s: %d %s", n.name, st, b)
	}
	var ids []string
	for _, c := range a.Commands {
		ids = append(ids, fmt.Sprint(c.ID))
	}
	return ids
}

func count(ids []string, id string) int {
	n := 0
	for _, v := range ids {
		if v == id {
			n++
		}
	}
	return n
}

func TestClusterCommands(t *testing.T) {
	t.Parallel()
	_, nats, nodes := startCluster(t, "a", "b", "c")
	a, b, c := nodes[0], nodes[1], nodes[2]

	t.Run("queued on A, delivered on B, result on C recorded once", func(t *testing.T) {
		d := a.mustRegister("m-cmd-1")
		j := a.send(fmt.Sprintf(`{"kind":"ping","args":["127.0.0.1"],"device_id":%q}`, d.DeviceID))
		var got []string
		took := within(t, converge, "B delivers the command queued on A", func() bool {
			got = append(got, b.pushWith(d.Token, "")...)
			return count(got, j.ID) > 0
		})
		t.Logf("delivered on B %v after queueing on A", took)
		if count(got, j.ID) != 1 {
			t.Fatalf("delivered %d times on B: %v", count(got, j.ID), got)
		}
		for _, n := range nodes { // delivered: never again, on any node
			if ids := n.pushWith(d.Token, ""); count(ids, j.ID) != 0 {
				t.Fatalf("delivered again on %s", n.name)
			}
		}
		// Nothing queued any more: pushes ask the database nothing about
		// commands, on any node.
		var before []float64
		for _, n := range nodes {
			before = append(before, n.metric("drover_cluster_command_queries_total"))
		}
		for range 3 {
			for _, n := range nodes {
				n.pushWith(d.Token, "")
			}
		}
		for i, n := range nodes {
			if got := n.metric("drover_cluster_command_queries_total") - before[i]; got != 0 {
				t.Errorf("3 pushes without a command on %s asked the database %v times, want 0", n.name, got)
			}
		}
		if v := c.job(j.ID); v.Counts["delivered"] != 1 || v.Counts["queued"] != 0 || v.State != "active" {
			t.Fatalf("job on C after delivery on B: %+v", v)
		}
		res := fmt.Sprintf(`[{"id":%s,"exit_code":0,"output":["ok from c"],"started_at":1,"finished_at":2}]`, j.ID)
		c.pushWith(d.Token, res)
		// The same result again (an agent whose answer was lost) and a
		// different one on A change nothing.
		a.pushWith(d.Token, res)
		a.pushWith(d.Token, fmt.Sprintf(`[{"id":%s,"exit_code":3,"output":["late"],"started_at":1,"finished_at":2}]`, j.ID))
		for _, n := range nodes {
			v := n.job(j.ID)
			if v.Counts["succeeded"] != 1 || v.Counts["failed"] != 0 || v.Counts["delivered"] != 0 || v.Total != 1 {
				t.Fatalf("job on %s after the result on C: %+v", n.name, v)
			}
		}
		st, body := b.do("GET", "/api/v1/commands/"+j.ID+"/devices", adminToken, "")
		if st != 200 || !strings.Contains(string(body), `"ok from c"`) || strings.Contains(string(body), "late") {
			t.Fatalf("per-device results on B: %d %s", st, body)
		}
	})

	t.Run("concurrent pushes on two nodes deliver once", func(t *testing.T) {
		var devs []registration
		for i := range 6 {
			devs = append(devs, b.mustRegister(fmt.Sprintf("m-cmd-race-%d", i)))
		}
		within(t, converge, "C, where the bulk jobs are made, knows the devices", func() bool {
			st, body := c.do("GET", "/api/v1/devices?q=m-cmd-race", adminToken, "")
			var v struct {
				Devices []json.RawMessage `json:"devices"`
			}
			return st == 200 && json.Unmarshal(body, &v) == nil && len(v.Devices) == len(devs)
		})
		for round := range 5 {
			// One device's command, then a bulk one for every device.
			single := a.send(fmt.Sprintf(`{"kind":"hook","args":["r%d"],"device_id":%q}`, round, devs[0].DeviceID))
			bulk := c.send(fmt.Sprintf(`{"kind":"hook","args":["bulk%d"],"filter":{"q":"m-cmd-race"}}`, round))
			if bulk.Total != len(devs) {
				t.Fatalf("bulk job targets %d devices, want %d", bulk.Total, len(devs))
			}
			within(t, converge, "A and B know the jobs", func() bool {
				for _, n := range []*node{a, b} {
					for _, id := range []string{single.ID, bulk.ID} {
						if st, _ := n.do("GET", "/api/v1/commands/"+id, adminToken, ""); st != 200 {
							return false
						}
					}
				}
				return true
			})
			var mu sync.Mutex
			delivered := map[string]int{} // device/job -> deliveries
			deadline := time.Now().Add(5 * time.Second)
			for {
				var wg sync.WaitGroup
				start := make(chan struct{})
				for _, d := range devs {
					for _, n := range []*node{a, b} {
						wg.Add(1)
						go func() {
							defer wg.Done()
							<-start
							ids := n.pushWith(d.Token, "")
							mu.Lock()
							for _, id := range ids {
								delivered[d.DeviceID+"/"+id]++
							}
							mu.Unlock()
						}()
					}
				}
				close(start)
				wg.Wait()
				if delivered[devs[0].DeviceID+"/"+single.ID] > 0 && len(delivered) >= len(devs)+1 || time.Now().After(deadline) {
					break
				}
			}
			for k, n := range delivered {
				if n != 1 {
					t.Fatalf("round %d: %s delivered %d times", round, k, n)
				}
			}
			if len(delivered) != len(devs)+1 {
				t.Fatalf("round %d: delivered %v, want each device's bulk command and the single one", round, delivered)
			}
			if v := b.job(bulk.ID); v.Counts["delivered"] != len(devs) || v.Counts["queued"] != 0 {
				t.Fatalf("round %d: bulk job on B: %+v", round, v)
			}
		}
	})

	t.Run("pause, resume and cancel from other nodes", func(t *testing.T) {
		d := c.mustRegister("m-cmd-cancel")
		j := a.send(fmt.Sprintf(`{"kind":"read-log","args":["messages"],"device_id":%q}`, d.DeviceID))
		if st, body := b.do("POST", "/api/v1/commands/"+j.ID+"/pause", adminToken, ""); st != 200 || !strings.Contains(string(body), `"paused"`) {
			t.Fatalf("pause on B: %d %s", st, body)
		}
		within(t, converge, "every node knows the job paused", func() bool {
			for _, n := range nodes {
				if n.job(j.ID).State != "paused" {
					return false
				}
			}
			return true
		})
		for _, n := range nodes {
			if ids := n.pushWith(d.Token, ""); count(ids, j.ID) != 0 {
				t.Fatalf("a paused job's command delivered on %s", n.name)
			}
			if v := n.job(j.ID); v.State != "paused" || v.Counts["queued"] != 1 {
				t.Fatalf("job on %s: %+v", n.name, v)
			}
		}
		if st, body := c.do("POST", "/api/v1/commands/"+j.ID+"/cancel", adminToken, ""); st != 200 || !strings.Contains(string(body), `"cancelled"`) {
			t.Fatalf("cancel on C: %d %s", st, body)
		}
		if st, body := a.do("POST", "/api/v1/commands/"+j.ID+"/resume", adminToken, ""); st != 409 {
			t.Fatalf("resume of a cancelled job on A: %d %s", st, body)
		}
		for _, n := range nodes {
			if ids := n.pushWith(d.Token, ""); count(ids, j.ID) != 0 {
				t.Fatalf("a cancelled job's command delivered on %s", n.name)
			}
			if v := n.job(j.ID); v.State != "cancelled" || v.Counts["cancelled"] != 1 || v.Counts["queued"] != 0 {
				t.Fatalf("job on %s: %+v", n.name, v)
			}
		}
		// Paused on A, resumed on C: delivered on B.
		j2 := b.send(fmt.Sprintf(`{"kind":"read-log","args":["app"],"device_id":%q}`, d.DeviceID))
		if st, _ := a.do("POST", "/api/v1/commands/"+j2.ID+"/pause", adminToken, ""); st != 200 {
			t.Fatalf("pause on A: %d", st)
		}
		if st, _ := c.do("POST", "/api/v1/commands/"+j2.ID+"/resume", adminToken, ""); st != 200 {
			t.Fatalf("resume on C: %d", st)
		}
		var got []string
		within(t, converge, "B delivers the resumed command", func() bool {
			got = append(got, b.pushWith(d.Token, "")...)
			return count(got, j2.ID) > 0
		})
		if count(got, j2.ID) != 1 || count(got, j.ID) != 0 {
			t.Fatalf("delivered %v", got)
		}
	})

	// connectTo opens d's persistent connection on n and returns its
	// messages.
	connectTo := func(t *testing.T, n *node, token string) <-chan string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, "ws://"+strings.TrimPrefix(n.base, "http://")+"/api/v1/connect",
			&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
		if err != nil {
			t.Fatalf("connect on %s: %v", n.name, err)
		}
		t.Cleanup(func() { ws.CloseNow() })
		msgs := make(chan string, 8)
		go func() {
			for {
				_, m, err := ws.Read(context.Background())
				if err != nil {
					close(msgs)
					return
				}
				msgs <- string(m)
			}
		}()
		within(t, 5*time.Second, "connection held on "+n.name, func() bool { return n.metric("drover_device_connections") >= 1 })
		return msgs
	}
	// nudgedWithin sends a command for d on from and wants d's connection
	// on the other node told to push within the bound; the push there
	// gets it.
	nudgedWithin := func(t *testing.T, from, to *node, d registration, msgs <-chan string) {
		start := time.Now()
		j := from.send(fmt.Sprintf(`{"kind":"ping","args":["10.0.0.1"],"device_id":%q}`, d.DeviceID))
		select {
		case m, ok := <-msgs:
			if !ok || m != `{"type":"push"}` {
				t.Fatalf("connection on %s: %q %v", to.name, m, ok)
			}
		case <-time.After(converge):
			t.Fatalf("command queued on %s: the connection on %s was not told to push within %v", from.name, to.name, converge)
		}
		t.Logf("connection on %s told to push %v after the command was sent on %s", to.name, time.Since(start), from.name)
		if ids := to.pushWith(d.Token, ""); count(ids, j.ID) != 1 {
			t.Fatalf("push on %s after the nudge: %v, want job %s", to.name, ids, j.ID)
		}
	}

	t.Run("a connection on B is told to push within 1 s of a command queued on A", func(t *testing.T) {
		d := a.mustRegister("m-cmd-ws")
		msgs := connectTo(t, b, d.Token)
		nudgedWithin(t, a, b, d, msgs)
	})

	t.Run("without NATS, through the change log poll", func(t *testing.T) {
		d := a.mustRegister("m-cmd-ws-nonats")
		msgs := connectTo(t, c, d.Token)
		nats.stop()
		within(t, 10*time.Second, "A and C see NATS down", func() bool {
			return a.metric("drover_cluster_nats_up") == 0 && c.metric("drover_cluster_nats_up") == 0
		})
		nudgedWithin(t, a, c, d, msgs)
	})
}
