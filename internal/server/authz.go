package server

// Who may call what (docs/security.md): the routes table gives each route
// the role it needs; wrap and guard check it here, for every route, and
// record every change in the audit log.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/drover/drover/internal/access"
)

// need is what a route asks of its caller.
type need uint8

const (
	public        need = iota // anyone (devices authenticate inside their handlers)
	viewer                    // any user: read
	operator                  // change the fleet
	admin                     // users, tokens, credentials, settings
	metricsReader             // any user, or the metrics token
	remoteAccess              // access.RemoteAccess: tunnels to devices
)

// role is the least role a need asks for (None: no user needed).
func (n need) role() access.Role {
	switch n {
	case viewer, metricsReader:
		return access.Viewer
	case operator:
		return access.Operator
	case admin:
		return access.Admin
	case remoteAccess:
		return access.RemoteAccess.Least()
	}
	return access.None
}

var (
	errUnauthenticated = errAdminToken
	errForbidden       = &apiError{status: http.StatusForbidden, code: "forbidden", msg: "your role may not do this", outcome: outForbidden}
)

type actorKey struct{}

// actorOf is the authenticated caller of r; ok false for none.
func actorOf(r *http.Request) (access.Actor, bool) {
	a, ok := r.Context().Value(actorKey{}).(access.Actor)
	return a, ok
}

// authorize checks r's credential against n: the request with its actor
// in the context, or the error to answer (401 without a credential, 403
// with a role too low).
func (a *api) authorize(n need, r *http.Request) (*http.Request, error) {
	if n == public {
		return r, nil
	}
	if n == metricsReader && a.isMetricsReader(r) {
		return r, nil
	}
	t, ok := bearer(r)
	if !ok {
		if n == metricsReader {
			return nil, errMetricsToken
		}
		return nil, errUnauthenticated
	}
	who, err := a.acc.Authenticate(r.Context(), t)
	if errors.Is(err, access.ErrUnauthorized) {
		if n == metricsReader {
			return nil, errMetricsToken
		}
		return nil, errUnauthenticated
	} else if err != nil {
		return nil, err
	}
	if who.Role < n.role() {
		return nil, errForbidden
	}
	return r.WithContext(context.WithValue(r.Context(), actorKey{}, who)), nil
}

// remoteAddr is the client's address as the audit log keeps it: the TCP
// peer (Drover trusts no forwarding header).
func remoteAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// mutating says whether a method changes something.
func mutating(method string) bool {
	return method != "" && method != http.MethodGet && method != http.MethodHead
}

// auditRedactor is an answer that holds a secret: the audit log keeps
// its auditView instead.
type auditRedactor interface{ auditView() any }

// snapshots answers GET requests of the table's routes in process, for the
// audit log's before and after.
type snapshots struct{ mux *http.ServeMux }

type snapSlot struct {
	v   any
	err error
	ok  bool
}

type snapKey struct{}

func (a *api) buildSnapshots(table []route) {
	mux := http.NewServeMux()
	for _, rt := range table {
		if rt.method != http.MethodGet || rt.fn == nil || rt.need == public {
			continue
		}
		fn := rt.fn
		mux.HandleFunc("GET "+rt.path, func(w http.ResponseWriter, r *http.Request) {
			if s, ok := r.Context().Value(snapKey{}).(*snapSlot); ok {
				s.v, s.err = fn(r)
				s.ok = true
			}
		})
	}
	a.snaps = &snapshots{mux: mux}
}

// Snapshot is what GET path answers now, as JSON; nil when nothing does
// (no such route, or the object does not exist).
func (a *api) Snapshot(ctx context.Context, path string) json.RawMessage {
	if path == "" || a.snaps == nil {
		return nil
	}
	slot := &snapSlot{}
	req, err := http.NewRequestWithContext(context.WithValue(ctx, snapKey{}, slot), http.MethodGet, path, nil)
	if err != nil {
		return nil
	}
	a.snaps.mux.ServeHTTP(discard{}, req)
	if !slot.ok || slot.err != nil {
		return nil
	}
	return auditJSON(slot.v)
}

// auditJSON is v as the audit log keeps it.
func auditJSON(v any) json.RawMessage {
	if v == nil {
		return nil
	}
	if c, ok := v.(createdBody); ok {
		v = c.v
	}
	if rd, ok := v.(auditRedactor); ok {
		v = rd.auditView()
	}
	b, err := json.Marshal(v)
	if err != nil || bytes.Equal(b, []byte("null")) {
		return nil
	}
	// Belt and braces: an answer's top-level secret fields never reach
	// the log, even from a route that forgot its auditView.
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) == nil {
		n := len(m)
		for _, k := range secretFields {
			delete(m, k)
		}
		if len(m) != n {
			b, _ = json.Marshal(m)
		}
	}
	return b
}

// secretFields are the answers' fields that hold secrets.
var secretFields = []string{"token", "secret", "password", "enrollment_secret", "client_secret", "key"}

// discard is a ResponseWriter that keeps nothing.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

// createdPath is the object path of a new object, the collection's path
// and the "id" (or "name") of the answer; "" when it has none.
func createdPath(collection string, after json.RawMessage) string {
	var v struct {
		ID   any    `json:"id"`
		Name string `json:"name"`
	}
	if json.Unmarshal(after, &v) != nil {
		return ""
	}
	switch id := v.ID.(type) {
	case float64:
		b, _ := json.Marshal(id)
		return collection + "/" + string(b)
	case string:
		return collection + "/" + id
	}
	if v.Name != "" {
		return collection + "/" + v.Name
	}
	return ""
}

// record appends one change to the audit log; a failure is logged (the
// change is made already).
func (a *api) record(ctx context.Context, who access.Actor, r *http.Request, action, object string, before, after json.RawMessage) {
	e := access.Entry{Actor: who.Name, Credential: who.Credential, Remote: remoteAddr(r), Action: action, Object: object, Before: before, After: after}
	if len(e.Object) > 300 {
		e.Object = strings.ToValidUTF8(e.Object[:300], "")
	}
	if err := a.acc.Record(context.WithoutCancel(ctx), e); err != nil {
		a.m.auditFailures.Inc()
		a.log.Error("audit log write failed", "action", action, "object", object, "actor", who.Name, "err", err)
	}
}

// Audited is how the dashboard records a change (web.Options.Audit):
// Begin takes the object's state before, the returned func after, and
// records the change if there was one.
func (a *api) Audited(r *http.Request, who access.Actor, action, object string) func(created string, after any) {
	before := a.Snapshot(r.Context(), object)
	return func(created string, v any) {
		obj, after := object, json.RawMessage(nil)
		switch {
		case created != "":
			obj, after = created, a.Snapshot(r.Context(), created)
			if after == nil {
				after = auditJSON(v)
			}
		case object != "":
			after = a.Snapshot(r.Context(), object)
			if bytes.Equal(before, after) {
				return // nothing changed (refused input)
			}
		case v != nil:
			after = auditJSON(v)
		default:
			return
		}
		a.record(r.Context(), who, r, action, obj, before, after)
	}
}

// objectOf is the path of the GET route showing what a change acts on:
// the route's own path (PUT /api/v1/profiles/{id}), else its path up to
// the last wildcard (POST /api/v1/commands/{id}/pause); "" for a create
// or an action on a collection (POST /api/v1/commands).
func objectOf(rt route, gets map[string]bool) string {
	if gets[rt.path] && (rt.method != http.MethodPost || strings.Contains(rt.path, "{")) {
		return rt.path
	}
	if i := strings.LastIndex(rt.path, "}"); i >= 0 && gets[rt.path[:i+1]] {
		return rt.path[:i+1]
	}
	return ""
}

// audited runs a change and records it: before and after are what the
// object's GET route answers around it; for a create, after is the
// answer (auditView of one with a secret).
func (a *api) audited(rt *route, r *http.Request) (any, error) {
	who, _ := actorOf(r)
	var obj string
	var before json.RawMessage
	if rt.object != "" {
		obj = access.ObjectPath(rt.object, r.PathValue)
		before = a.Snapshot(r.Context(), obj)
	}
	v, err := rt.fn(r)
	if err != nil {
		return v, err
	}
	if _, same := v.(unchangedBody); same {
		return v, nil
	}
	var after json.RawMessage
	if obj != "" {
		after = a.Snapshot(r.Context(), obj)
	} else {
		after = auditJSON(v)
		obj = access.ObjectPath(rt.path, r.PathValue)
		if rt.method == http.MethodPost && a.gets[rt.path] {
			if p := createdPath(obj, after); p != "" {
				obj = p
			}
		}
	}
	a.record(r.Context(), who, r, rt.method+" "+rt.path, obj, before, after)
	return v, nil
}

// changedBy names who makes a change: a user's name, or for the admin
// token "api", or "api:<name>" with the X-Drover-Operator header (a label
// the admin token's holder chooses).
func changedBy(r *http.Request) (string, error) {
	if who, ok := actorOf(r); ok && who.Name != access.AdminActor {
		return who.Name, nil
	}
	n := r.Header.Get("X-Drover-Operator")
	if n == "" {
		return "api", nil
	}
	if len(n) > 64 || strings.ContainsFunc(n, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
		return "", badField("X-Drover-Operator must be at most 64 printable bytes")
	}
	return "api:" + n, nil
}
