package server

// Remote access beyond port forwarding (docs/remote-access.md): a
// terminal on the device (GET /api/v1/devices/{id}/terminal, a WebSocket;
// the dashboard's terminal too) and file transfer (PUT and GET
// /api/v1/devices/{id}/files?path=). Each rides a stream of the device's
// tunnel link (tunnel.go) and shares the tunnels' limits, audit rows and
// metrics; what the device allows is its agent's own configuration.
// The server's side gates which devices may be reached at all
// (-remote-access-labels) and may record terminals (-terminal-record).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/tunnel"
	"github.com/hashicorp/yamux"
)

// RemoteOptions are the server's side of remote access.
type RemoteOptions struct {
	// Labels: a device must carry one of them to be reached; empty: any.
	Labels []string
	// RecordDir keeps terminal recordings; "": none. RecordRetention: how
	// long.
	RecordDir       string
	RecordRetention time.Duration
}

// remoteOptions are c's.
func (c *Config) remoteOptions() RemoteOptions {
	o := RemoteOptions{RecordRetention: c.TerminalRecordRetention}
	for _, l := range strings.Split(c.RemoteAccessLabels, ",") {
		if l = strings.TrimSpace(l); l != "" {
			o.Labels = append(o.Labels, l)
		}
	}
	if c.TerminalRecord {
		o.RecordDir = filepath.Join(c.DataDir, "recordings")
	}
	return o
}

// Kinds of remote session, as the audit log names them.
const (
	kindTunnel = "tunnel"
	kindShell  = "shell"
	kindFile   = "file"
)

// remoteOp is one operator's request for a remote session.
type remoteOp struct {
	a      *api
	rt     *route
	r      *http.Request
	who    access.Actor
	dev    uint64
	object string
	kind   string
	// audit: refusals go to the audit log (a session was asked for, not
	// a check).
	audit bool
	rec   tunnelSession
	// via: the cluster node that relayed the operator's request (relay.go).
	via string
	// device as gate read it.
	device fleet.Device

	release func()
	l       *tunnelLink
	st      *yamux.Stream
}

// startRemote reads the device of r's path and checks that it may be
// reached; the error is answered as is (not audited: no such device, a
// malformed request).
func (a *api) startRemote(r *http.Request, rt *route, kind string, who access.Actor, audit bool) (*remoteOp, error) {
	dev, err := pathID(r)
	if err != nil {
		return nil, err
	}
	if _, err := a.fleet.Device(r.Context(), dev); err != nil {
		return nil, ifNotFound(err, "device "+strconv.FormatUint(dev, 10))
	}
	via, err := a.relayedFrom(r)
	if err != nil {
		return nil, err
	}
	return &remoteOp{a: a, rt: rt, r: r, who: who, dev: dev, kind: kind, audit: audit, via: via,
		object: "/api/v1/devices/" + strconv.FormatUint(dev, 10),
		rec:    tunnelSession{Kind: kind, StartedAt: time.Now().UTC(), Via: via}}, nil
}

// refuse answers err, counting and auditing it.
func (op *remoteOp) refuse(w http.ResponseWriter, err error) {
	op.end()
	a := op.a
	if op.audit && a.tunnels.m.refused != nil {
		a.tunnels.m.refused.WithLabelValues(answerError(err).code).Inc()
	}
	if op.audit {
		op.rec.EndedAt, op.rec.EndReason = time.Now().UTC(), "refused: "+answerError(err).code
		a.record(op.r.Context(), op.who, op.r, op.kind+" refused", op.object, nil, auditJSON(op.rec))
	}
	a.fail(w, op.rt, err)
}

// gate checks the device's admission and the server's label gate.
func (op *remoteOp) gate() error {
	d, err := op.a.fleet.Device(op.r.Context(), op.dev)
	if err != nil {
		return ifNotFound(err, "device "+strconv.FormatUint(op.dev, 10))
	}
	op.device = d
	if d.Admission != "" && d.Admission != "active" {
		return &apiError{status: http.StatusConflict, code: "device_not_active",
			msg: fmt.Sprintf("device %d is %s: no remote session reaches it", op.dev, d.Admission)}
	}
	// The device's configuration decides first: its own values, its
	// labels' (groups'), its profile's.
	if on, src, set := remoteAccessConfig(op.a.fleet.EffectiveConfig(op.dev)); set {
		if on {
			return nil
		}
		return &apiError{status: http.StatusForbidden, code: "remote_access_disabled",
			msg: fmt.Sprintf("remote access is disabled for device %d by its configuration: %s is not true (set by %s)", op.dev, remoteAccessKey, src)}
	}
	if labels := op.a.tunnels.opt.Labels; len(labels) > 0 {
		has := op.a.fleet.DeviceLabels(op.dev)
		if !slices.ContainsFunc(labels, func(l string) bool { return slices.Contains(has, l) }) {
			return &apiError{status: http.StatusForbidden, code: "remote_access_disabled",
				msg: fmt.Sprintf("remote access is not enabled for device %d: it carries none of the labels the server's -remote-access-labels names (%s)",
					op.dev, strings.Join(labels, ", "))}
		}
	}
	return nil
}

// remoteAccessKey is the member of a device's effective configuration
// that enables (true) or disables (anything else) remote access to it.
const remoteAccessKey = "/drover/remote_access"

// remoteAccessConfig reads remoteAccessKey from a device's effective
// configuration: its value (true only for the boolean true), the layer it
// comes from, and whether it is set at all.
func remoteAccessConfig(e fleet.EffectiveConfig, err error) (on bool, source string, set bool) {
	if err != nil || len(e.Config) == 0 {
		return false, "", false
	}
	var c struct {
		Drover struct {
			RemoteAccess json.RawMessage `json:"remote_access"`
		} `json:"drover"`
	}
	if json.Unmarshal(e.Config, &c) != nil || len(c.Drover.RemoteAccess) == 0 {
		return false, "", false
	}
	switch source = e.Sources[remoteAccessKey]; source {
	case "device":
		source = "the device's own values"
	case "profile", "":
		source = "its profile"
	}
	return string(c.Drover.RemoteAccess) == "true", source, true
}

// open takes a session slot, the device's link and a stream, and sends
// req: the agent's answer, or the error to refuse with.
func (op *remoteOp) open(req tunnel.Request) (tunnel.Answer, error) {
	t := op.a.tunnels
	if err := op.gate(); err != nil {
		return tunnel.Answer{}, err
	}
	id, release, err := t.reserve(op.dev)
	if err != nil {
		return tunnel.Answer{}, err
	}
	op.release, op.rec.Session = release, id
	if !t.hasLink(op.dev) && !t.hub.holds(op.dev) {
		if err := op.awaitConnection(); err != nil {
			return tunnel.Answer{}, err
		}
	}
	l, err := t.link(op.r.Context(), op.dev)
	if err != nil {
		return tunnel.Answer{}, err
	}
	st, err := t.openStream(l)
	if err != nil {
		return tunnel.Answer{}, &apiError{status: http.StatusBadGateway, code: "device_no_tunnel", msg: "the device's tunnel link failed: " + err.Error()}
	}
	op.l, op.st = l, st
	var ans tunnel.Answer
	st.SetDeadline(time.Now().Add(t.lim.Open))
	err = tunnel.WriteLine(st, req)
	if err == nil {
		err = tunnel.ReadLine(st, &ans)
	}
	st.SetDeadline(time.Time{})
	if err != nil {
		return ans, &apiError{status: http.StatusGatewayTimeout, code: "device_no_tunnel", msg: "the device did not answer the request: " + err.Error()}
	}
	if ans.Error != "" {
		return ans, agentRefusal(req.Kind, ans)
	}
	return ans, nil
}

// awaitConnection asks a device holding no persistent connection to open
// one in the answer to its next push; when that push is due within
// -tunnel-open-timeout the session waits for the connection, else it is
// refused with connect_requested and a Retry-After of when to try again.
func (op *remoteOp) awaitConnection() error {
	t, d := op.a.tunnels, op.device
	interval := time.Duration(max(d.PushInterval, 1)) * time.Second
	now := time.Now()
	due := interval // never pushed, or overdue: within an interval if at all
	if d.LastSeen != nil {
		if next := d.LastSeen.Add(interval).Sub(now); next >= 0 {
			due = next
		}
	}
	wait := t.connWait(op.dev)
	t.askConnect(op.dev, now.Add(min(2*interval+t.lim.Open, 24*time.Hour)), true)
	if due <= t.lim.Open {
		timer := time.NewTimer(t.lim.Open)
		defer timer.Stop()
		select {
		case <-wait:
			return nil
		case <-timer.C:
		case <-op.r.Context().Done():
			return op.r.Context().Err()
		}
		due = interval
	}
	secs := int((due + 5*time.Second + time.Second - 1) / time.Second)
	return &apiError{status: http.StatusConflict, code: "connect_requested", retryAfter: secs,
		msg: fmt.Sprintf("device %d holds no persistent connection: it is asked to open one in the answer to its next push, due within %d s; try again then (agents that cannot, such as the shell agent, never connect this way)", op.dev, secs)}
}

// end gives the stream, the link's use and the slot back (idempotent).
func (op *remoteOp) end() {
	if op.st != nil {
		op.st.Close()
		op.a.tunnels.streamDone(op.l)
		op.st = nil
	}
	if op.release != nil {
		op.release()
		op.release = nil
	}
}

// watch ends a session after the idle or total time limit: end is called
// with the reason; stop ends the watch.
func (t *tunnels) watch(last *atomic.Int64, end func(reason string)) (stop func()) {
	lim := t.lim
	done := make(chan struct{})
	go func() {
		tick := min(lim.Idle, lim.MaxDuration) / 10
		tk := time.NewTicker(max(tick, 10*time.Millisecond))
		defer tk.Stop()
		deadline := time.Now().Add(lim.MaxDuration)
		for {
			select {
			case <-done:
				return
			case now := <-tk.C:
				switch {
				case now.After(deadline):
					end(tunnelMaxDuration)
					return
				case now.Sub(time.Unix(0, last.Load())) >= lim.Idle:
					end(tunnelIdle)
					return
				}
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done) }) }
}

// running is a session between its start and its end.
type running struct {
	why      atomic.Value // the first reason it was ended for
	up, down *tunnel.Counter
	end      func(reason string) // ends it: closeAll, the reason kept
	stop     func()              // stops watching its time
	tracked  bool
}

// run records the session's start, tracks it for the server's stop and
// watches its idle and total time; closeAll ends it.
func (op *remoteOp) run(closeAll func()) *running {
	t := op.a.tunnels
	op.a.record(op.r.Context(), op.who, op.r, op.kind+" open", op.object, nil, auditJSON(op.rec))
	s := &running{}
	st := op.st
	s.end = func(reason string) {
		s.why.CompareAndSwap(nil, reason)
		closeAll()
		// Closing sends the device our end but still reads its bytes:
		// this read stops now.
		st.SetReadDeadline(time.Now())
	}
	if s.tracked = t.track(op.rec.Session, func() { s.end(tunnelStopping) }); !s.tracked {
		s.end(tunnelStopping)
	}
	var last *atomic.Int64
	s.up, s.down, last = tunnel.NewCounters()
	s.stop = t.watch(last, s.end)
	return s
}

// finish records a session's end and its metrics, and forgets it.
func (op *remoteOp) finish(s *running) {
	op.rec.EndedAt = time.Now().UTC()
	op.rec.ToDevice, op.rec.FromDevice = s.up.N(), s.down.N()
	if m := op.a.tunnels.m; m.ended != nil {
		m.ended.WithLabelValues(strings.SplitN(op.rec.EndReason, ":", 2)[0]).Inc()
		m.bytes.WithLabelValues("to_device").Add(float64(op.rec.ToDevice))
		m.bytes.WithLabelValues("from_device").Add(float64(op.rec.FromDevice))
	}
	op.a.record(op.r.Context(), op.who, op.r, op.kind+" end", op.object, nil, auditJSON(op.rec))
	if s.tracked {
		op.a.tunnels.untrack(op.rec.Session)
	}
}

// endReason is why a session ended: the watch's or the server's reason,
// else link_lost or closed.
func (op *remoteOp) endReason(why *atomic.Value, err error) string {
	if r, ok := why.Load().(string); ok {
		return r
	}
	if op.l.sess.IsClosed() {
		return tunnelLinkLost
	}
	if err != nil {
		return tunnelClosed + ": " + err.Error()
	}
	return tunnelClosed
}

// Terminals.

// maxCommand bounds a terminal's command line.
const maxCommand = 4096

// terminalHandler is the operator's GET /api/v1/devices/{id}/terminal.
func (a *api) terminalHandler() http.Handler {
	if a.tunnels == nil {
		return nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, _ := actorOf(r)
		a.serveTerminal(w, r, who)
	})
}

// DashboardTerminal is the dashboard's terminal (web.Options.Terminal):
// the same session as the API's, for a logged-in operator.
func (a *api) DashboardTerminal(w http.ResponseWriter, r *http.Request, who access.Actor) {
	if !who.Role.May(access.RemoteAccess) {
		a.fail(w, &route{endpoint: "terminal"}, errForbidden)
		return
	}
	a.serveTerminal(w, r, who)
}

// DashboardDownload is the dashboard's file download
// (web.Options.Download): the API's, for a logged-in operator.
func (a *api) DashboardDownload(w http.ResponseWriter, r *http.Request, who access.Actor) {
	if !who.Role.May(access.RemoteAccess) {
		a.fail(w, &route{endpoint: "files"}, errForbidden)
		return
	}
	a.getFile(w, r, who)
}

// DashboardUpload is the dashboard's file upload (web.Options.Upload):
// the API's, for a logged-in operator, within --remote-file-max-size.
func (a *api) DashboardUpload(w http.ResponseWriter, r *http.Request, who access.Actor) {
	rt := &route{endpoint: "files"}
	if r.ContentLength > a.fileMax {
		defer closeAfter(w, r)()
		a.fail(w, rt, bodyTooLarge(a.fileMax, false))
		return
	}
	if !who.Role.May(access.RemoteAccess) {
		a.fail(w, rt, errForbidden)
		return
	}
	a.putFile(w, r, who)
}

// terminalMessage is a text message of the operator's WebSocket.
type terminalMessage struct {
	Type   string `json:"type"`             // resize (to the server), exit (from it)
	Cols   uint16 `json:"cols,omitempty"`   // resize
	Rows   uint16 `json:"rows,omitempty"`   // resize
	Status *int   `json:"status,omitempty"` // exit: the shell's exit status
}

func (a *api) serveTerminal(w http.ResponseWriter, r *http.Request, who access.Actor) {
	rt := &route{endpoint: "terminal"}
	q := r.URL.Query()
	req := tunnel.Request{Kind: tunnel.KindShell, Command: q.Get("command"), Cols: 80, Rows: 24}
	for _, f := range []struct {
		name string
		v    *uint16
	}{{"cols", &req.Cols}, {"rows", &req.Rows}} {
		if s := q.Get(f.name); s != "" {
			n, err := strconv.ParseUint(s, 10, 16)
			if err != nil || n == 0 || n > 1000 {
				a.fail(w, rt, badField(f.name+": a number from 1 to 1000"))
				return
			}
			*f.v = uint16(n)
		}
	}
	if len(req.Command) > maxCommand {
		a.fail(w, rt, badField(fmt.Sprintf("command: at most %d bytes", maxCommand)))
		return
	}
	upgrade := headerHas(r.Header, "Connection", "upgrade")
	if upgrade && !headerHas(r.Header, "Upgrade", "websocket") {
		a.fail(w, rt, &apiError{status: http.StatusBadRequest, code: "invalid_upgrade",
			msg: "a terminal is a WebSocket (Upgrade: websocket); without the upgrade the request only checks"})
		return
	}
	req.Check = !upgrade
	op, err := a.startRemote(r, rt, kindShell, who, upgrade)
	if err != nil {
		a.fail(w, rt, err)
		return
	}
	if a.relay(w, r, op) {
		return
	}
	op.rec.Command = req.Command
	if _, err := op.open(req); err != nil {
		op.refuse(w, err)
		return
	}
	defer op.end()
	if !upgrade {
		writeJSON(w, http.StatusOK, map[string]any{"device_id": strconv.FormatUint(op.dev, 10), "kind": kindShell, "allowed": true})
		return
	}
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Time{})
	rc.SetWriteDeadline(time.Time{})
	w.Header().Set("X-Drover-Session", strconv.FormatUint(op.rec.Session, 10))
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		op.rec.EndedAt, op.rec.EndReason = time.Now().UTC(), "refused: "+err.Error()
		a.record(r.Context(), who, r, kindShell+" refused", op.object, nil, auditJSON(op.rec))
		return // answered by Accept (a bad handshake, another origin)
	}
	ws.SetReadLimit(tunnel.MaxFrame + 64)
	rec := a.tunnels.recorder(op, req)
	if rec != nil {
		op.rec.Recording = filepath.Base(rec.name)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := op.st
	s := op.run(func() { st.Close() })
	up, down, end := s.up, s.down, s.end
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // operator → device
		defer wg.Done()
		for {
			typ, msg, err := ws.Read(ctx)
			if err != nil {
				end(tunnelClosed)
				return
			}
			now := time.Now().UnixNano()
			if typ == websocket.MessageBinary {
				up.Add(len(msg), now)
				if tunnel.WriteFrame(st, tunnel.FrameData, msg) != nil {
					end(tunnelClosed)
					return
				}
				continue
			}
			var m terminalMessage
			if json.Unmarshal(msg, &m) == nil && m.Type == "resize" && m.Cols > 0 && m.Rows > 0 {
				tunnel.WriteFrame(st, tunnel.FrameWindow, tunnel.Window(min(m.Cols, 1000), min(m.Rows, 1000)))
				rec.resize(m.Cols, m.Rows)
			}
		}
	}()
	// device → operator
	var status *int
	var rerr error
	buf := make([]byte, tunnel.MaxFrame)
	for {
		typ, p, err := tunnel.ReadFrame(st, buf)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, yamux.ErrStreamClosed) {
				rerr = err
			}
			break
		}
		switch typ {
		case tunnel.FrameData:
			down.Add(len(p), time.Now().UnixNano())
			rec.output(p)
			if ws.Write(ctx, websocket.MessageBinary, p) != nil {
				end(tunnelClosed)
			}
		case tunnel.FrameExit:
			if code, ok := tunnel.ParseExit(p); ok {
				status = &code
			}
		}
	}
	s.stop()
	op.rec.ExitStatus = status
	reason := op.endReason(&s.why, rerr)
	op.end() // the slot is free before the operator hears of the end
	if status != nil {
		reason = tunnelClosed
		b, _ := json.Marshal(terminalMessage{Type: "exit", Status: status})
		ws.Write(ctx, websocket.MessageText, b)
		ws.Close(websocket.StatusNormalClosure, "exit")
	} else {
		ws.Close(websocket.StatusGoingAway, reason)
	}
	cancel()
	ws.CloseNow()
	wg.Wait()
	rec.close()
	op.rec.EndReason = reason
	op.finish(s)
}

// terminalRecorder writes a terminal's output as an asciinema v2 file.
type terminalRecorder struct {
	mu    sync.Mutex
	name  string
	f     *os.File
	start time.Time
}

// recorder starts op's recording, or returns nil when recordings are off
// or the file cannot be made (logged).
func (t *tunnels) recorder(op *remoteOp, req tunnel.Request) *terminalRecorder {
	dir := t.opt.RecordDir
	if dir == "" {
		return nil
	}
	log := op.a.log
	if err := os.MkdirAll(dir, 0o700); err != nil {
		log.Error("terminal recording not made", "err", err)
		return nil
	}
	t.pruneRecordings(dir, op.rec.StartedAt)
	name := filepath.Join(dir, fmt.Sprintf("%s-device-%d-session-%d.cast", op.rec.StartedAt.Format("20060102T150405Z"), op.dev, op.rec.Session))
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		log.Error("terminal recording not made", "err", err)
		return nil
	}
	title := fmt.Sprintf("device %d, %s", op.dev, op.who.Name)
	if req.Command != "" {
		title += ": " + req.Command
	}
	h, _ := json.Marshal(map[string]any{"version": 2, "width": req.Cols, "height": req.Rows,
		"timestamp": op.rec.StartedAt.Unix(), "title": title, "env": map[string]string{"TERM": "xterm-256color"}})
	f.Write(append(h, '\n'))
	return &terminalRecorder{name: name, f: f, start: time.Now()}
}

// pruneRecordings deletes recordings older than the retention.
func (t *tunnels) pruneRecordings(dir string, now time.Time) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && strings.HasSuffix(e.Name(), ".cast") && now.Sub(fi.ModTime()) > t.opt.RecordRetention {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

func (r *terminalRecorder) event(kind, data string) {
	if r == nil {
		return
	}
	b, _ := json.Marshal([]any{float64(time.Since(r.start).Microseconds()) / 1e6, kind, data})
	r.mu.Lock()
	r.f.Write(append(b, '\n'))
	r.mu.Unlock()
}

func (r *terminalRecorder) output(p []byte) { r.event("o", strings.ToValidUTF8(string(p), "\uFFFD")) }

func (r *terminalRecorder) resize(cols, rows uint16) { r.event("r", fmt.Sprintf("%dx%d", cols, rows)) }

func (r *terminalRecorder) close() {
	if r != nil {
		r.f.Close()
	}
}

// Files.

// filesHandler is the operator's PUT and GET /api/v1/devices/{id}/files.
func (a *api) filesHandler(put bool) http.Handler {
	if a.tunnels == nil {
		return nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, _ := actorOf(r)
		if put {
			a.putFile(w, r, who)
		} else {
			a.getFile(w, r, who)
		}
	})
}

// fileAnswer is the answer to an upload.
type fileAnswer struct {
	DeviceID string `json:"device_id"`
	Path     string `json:"path"`
	Size     int64  `json:"size"`
	SHA256   string `json:"sha256"`
}

// fileOp checks the path parameter and starts the session; answered:
// the request was refused or relayed.
func (a *api) fileOp(w http.ResponseWriter, r *http.Request, who access.Actor, rt *route, direction string) (op *remoteOp, answered bool) {
	path := r.URL.Query().Get("path")
	if path == "" || !strings.HasPrefix(path, "/") || len(path) > 4096 || strings.ContainsRune(path, 0) {
		a.fail(w, rt, badField("path: an absolute path on the device"))
		return nil, true
	}
	op, err := a.startRemote(r, rt, kindFile, who, true)
	if err != nil {
		a.fail(w, rt, err)
		return nil, true
	}
	if a.relay(w, r, op) {
		return nil, true
	}
	op.rec.Path, op.rec.Direction = path, direction
	// A transfer may take up to the session's total time.
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(a.tunnels.lim.MaxDuration)
	rc.SetReadDeadline(deadline)
	rc.SetWriteDeadline(deadline)
	return op, false
}

func (a *api) putFile(w http.ResponseWriter, r *http.Request, who access.Actor) {
	rt := &route{endpoint: "files"}
	if r.ContentLength < 0 {
		defer closeAfter(w, r)()
		a.fail(w, rt, &apiError{status: http.StatusLengthRequired, code: "length_required", msg: "an upload needs its Content-Length"})
		return
	}
	op, answered := a.fileOp(w, r, who, rt, "put")
	if answered {
		defer closeAfter(w, r)()
		return
	}
	if _, err := op.open(tunnel.Request{Kind: tunnel.KindPut, Path: op.rec.Path, Size: r.ContentLength}); err != nil {
		defer closeAfter(w, r)() // the body stays unread
		op.refuse(w, err)
		return
	}
	defer op.end()
	st := op.st
	s := op.run(func() { st.Close() })
	_, err := io.Copy(countWriter{st, s.up}, io.LimitReader(r.Body, r.ContentLength))
	var ans tunnel.Answer
	if err == nil {
		st.Close() // the file's end; the answer still comes
		st.SetReadDeadline(time.Now().Add(a.tunnels.lim.Open + time.Minute))
		err = tunnel.ReadLine(st, &ans)
	}
	s.stop()
	op.end() // the slot is free before the operator hears of the end
	var answer error
	switch {
	case err == nil && ans.Error != "":
		answer = agentRefusal(tunnel.KindPut, ans)
		op.rec.EndReason = "failed: " + ans.Message
	case err != nil:
		op.rec.EndReason = op.endReason(&s.why, err)
		answer = &apiError{status: http.StatusBadGateway, code: "transfer_failed", msg: "the upload ended early: " + op.rec.EndReason}
	default:
		op.rec.EndReason, op.rec.SHA256 = tunnelClosed, ans.SHA256
	}
	op.finish(s)
	if answer != nil {
		defer closeAfter(w, r)()
		a.fail(w, rt, answer)
		return
	}
	writeJSON(w, http.StatusCreated, fileAnswer{DeviceID: strconv.FormatUint(op.dev, 10), Path: op.rec.Path, Size: s.up.N(), SHA256: ans.SHA256})
}

func (a *api) getFile(w http.ResponseWriter, r *http.Request, who access.Actor) {
	rt := &route{endpoint: "files"}
	op, answered := a.fileOp(w, r, who, rt, "get")
	if answered {
		return
	}
	ans, err := op.open(tunnel.Request{Kind: tunnel.KindGet, Path: op.rec.Path})
	if err != nil {
		op.refuse(w, err)
		return
	}
	defer op.end()
	st := op.st
	s := op.run(func() { st.Close() })
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(ans.Size, 10))
	h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", filepath.Base(op.rec.Path)))
	h.Set("X-Drover-Session", strconv.FormatUint(op.rec.Session, 10))
	w.WriteHeader(http.StatusOK)
	n, err := io.Copy(countWriter{w, s.down}, st)
	if err == nil && n != ans.Size {
		err = fmt.Errorf("the device sent %d bytes of %d", n, ans.Size)
	}
	s.stop()
	linkLost := op.l.sess.IsClosed()
	op.end()
	op.rec.EndReason = op.endReason(&s.why, err)
	if err != nil && s.why.Load() == nil && !linkLost {
		op.rec.EndReason = "failed: " + err.Error()
	}
	op.finish(s)
}

// countWriter counts what it writes.
type countWriter struct {
	w io.Writer
	c *tunnel.Counter
}

func (cw countWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.c.Add(n, time.Now().UnixNano())
	return n, err
}
