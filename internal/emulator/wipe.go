package emulator

// Wiped agents (Config.Wipe, fleet mode): at Config.WipeAt a share of the
// devices forget everything an agent keeps in its state directory (device
// ID, token, device key, sequence number, applied configuration) but keep
// their machine ID, as agents that derive it from the hardware do
// (docs/agent.md#machine-identity). Their next push registers with the
// enrollment secret alone: the server holds it as a re-enrollment request
// (202), which the emulator approves with Config.AdminToken (or an operator
// does), and the push after that brings the device back under its old
// device ID. A wiped device answered with another device ID is a
// duplicate and raises a warning.

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/protocol"
)

type wiper struct {
	at  time.Time    // when devices are wiped (set as the run starts)
	api *http.Client // approves requests; nil: no admin token

	wiped, requested, approved, same, moved atomic.Int64
}

func newWiper(cfg Config, tlsConf *tls.Config) *wiper {
	w := &wiper{}
	if cfg.AdminToken != "" {
		w.api = &http.Client{Timeout: cfg.Timeout, Transport: &http.Transport{TLSClientConfig: tlsConf, MaxIdleConnsPerHost: 4}}
	}
	return w
}

// chosen tells whether the device with index idx is among the wiped share:
// the same devices for the same seed, in every shard layout.
func (e *engine) wipeChosen(idx int) bool {
	return float64(e.id.hash(idx, 7)%1_000_000) < e.cfg.Wipe*1_000_000
}

// wipeDue wipes d's agent state when its time has come; before a push.
func (e *engine) wipeDue(d *device) {
	w := e.wipe
	if w == nil || !d.wipe || d.wiped || d.deviceID == "" || time.Now().Before(w.at) {
		return
	}
	d.wiped, d.oldID = true, d.deviceID
	d.deviceID, d.token, d.key, d.seq, d.cfgVer = "", "", "", 0, 0
	d.tls = sessionSlot{} // the agent restarts: its TLS session was in memory
	w.wiped.Add(1)
}

// wipeRegistered notes a wiped device's registration answer (200).
func (e *engine) wipeRegistered(d *device, deviceID string) {
	if e.wipe == nil || d.oldID == "" {
		return
	}
	if deviceID == d.oldID {
		e.wipe.same.Add(1)
	} else {
		e.wipe.moved.Add(1)
		e.warnOnce("wipe-duplicate", fmt.Sprintf("a device whose agent state was wiped came back as device %s, not as its old device %s: the server made a duplicate", deviceID, d.oldID))
	}
	d.oldID = ""
}

// wipePending handles a wiped device's 202: its re-enrollment request,
// approved once through the operator API when there is an admin token.
func (e *engine) wipePending(ctx context.Context, d *device, rr protocol.RegisterResponse) {
	w := e.wipe
	if w == nil || d.oldID == "" || d.asked {
		return
	}
	d.asked = true
	w.requested.Add(1)
	if rr.DeviceID != d.oldID {
		e.warnOnce("wipe-pending-other", fmt.Sprintf("a wiped device's re-enrollment request names device %q, not its old device %s", rr.DeviceID, d.oldID))
		return
	}
	if w.api == nil {
		return
	}
	url := strings.TrimSuffix(e.cfg.Target, "/") + "/api/v1/devices/" + d.oldID + "/approve"
	req, _ := http.NewRequestWithContext(ctx, "POST", url, nil)
	req.Header.Set("Authorization", "Bearer "+e.cfg.AdminToken)
	resp, err := w.api.Do(req)
	if err != nil {
		e.warnOnce("wipe-approve", "approving a re-enrollment request failed: "+err.Error())
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e.warnOnce("wipe-approve", fmt.Sprintf("approving a re-enrollment request answered %d", resp.StatusCode))
		return
	}
	w.approved.Add(1)
}

// wipeReport logs what became of the wiped devices.
func (e *engine) wipeReport() {
	if w := e.wipe; w != nil {
		e.cfg.Logf("wipe: %d devices' agent state wiped; %d re-enrollment requests, %d approved; %d back as the same device, %d as a new one",
			w.wiped.Load(), w.requested.Load(), w.approved.Load(), w.same.Load(), w.moved.Load())
	}
}
