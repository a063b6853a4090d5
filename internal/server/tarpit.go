package server

// Over-quota pushes cost the server next to nothing (docs/operations.md,
// "Quotas"). A push over its device's quota is refused
// before a request slot is taken and before its body is read, with a 429
// whose body was encoded once, counted and never logged. After such a 429,
// the next over-quota push on the same keep-alive connection is held (a
// timer: no CPU) for up to its Retry-After, at most Config.QuotaHold, before its 429:
// a client that ignores Retry-After gets one answer per Retry-After per
// connection, however fast it sends. At most heldPerDevice connections of
// one device, and heldTotal in all, are held at once; beyond that the 429
// closes the connection. A device that waits as told is never held.

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	fastjson "github.com/goccy/go-json"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	heldPerDevice = 4
	heldTotal     = 10_000
)

// connState is what the server remembers about one connection.
type connState struct {
	// refused: the last push on this connection was over quota.
	refused atomic.Bool
	// gated is the accept gate's record of the connection (gate.go);
	// nil when it did not come through a gate.
	gated *gatedConn
}

type connKey struct{}

// withConnState is the servers' ConnContext.
func withConnState(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, &connState{gated: gatedOf(c)})
}

// tarpit counts the held answers; routes sets its counters.
type tarpit struct {
	stop     <-chan struct{} // closed when the server drains: held answers go out at once; nil: never
	maxHold  time.Duration   // 0: none held
	mu       sync.Mutex
	byDevice map[uint64]int
	total    int

	// Over-quota pushes by their answer: at once, held, closing the
	// connection.
	atOnce, held, closed prometheus.Counter
}

// enter takes a held place for device id; false when none is free.
func (t *tarpit) enter(id uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.total >= heldTotal || t.byDevice[id] >= heldPerDevice {
		return false
	}
	if t.byDevice == nil {
		t.byDevice = map[uint64]int{}
	}
	t.byDevice[id]++
	t.total++
	return true
}

func (t *tarpit) leave(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byDevice[id]--; t.byDevice[id] <= 0 {
		delete(t.byDevice, id)
	}
	t.total--
}

// hold waits d, or less when ctx ends or the server drains; it returns how
// long it waited.
func (t *tarpit) hold(ctx context.Context, d time.Duration) time.Duration {
	start := time.Now()
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	case <-t.stop:
	}
	return time.Since(start)
}

// quotaBodies are the 429 bodies by Retry-After seconds, encoded on first use.
var quotaBodies [3601]atomic.Pointer[[]byte]

func quotaBody(secs int) []byte {
	if secs < len(quotaBodies) {
		if b := quotaBodies[secs].Load(); b != nil {
			return *b
		}
	}
	b, _ := fastjson.Marshal(protocol.ErrorBody{Error: protocol.ErrorDetail{Code: "quota_exceeded", Message: quotaMessage(secs)}})
	b = append(b, '\n')
	if secs < len(quotaBodies) {
		quotaBodies[secs].Store(&b)
	}
	return b
}

// admitPush authenticates and admits a push before its body is read
// (fleet.CheckPush) and answers it when it is over its device's quota
// (true). Otherwise the push goes on with the request it returns, whose
// context carries the authentication for the push handler (fleet.Push);
// other refusals are the handler's to give, after the body is decoded.
// A push without a bearer token goes on as it is: push says so.
func (a *api) admitPush(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	token, ok := bearer(r)
	if !ok {
		return r, false
	}
	auth, err := a.fleet.CheckPush(token)
	cs, _ := r.Context().Value(connKey{}).(*connState)
	qe, over := err.(*fleet.QuotaError)
	if !over {
		if cs != nil {
			cs.refused.Store(false)
		}
		return r.WithContext(fleet.WithPushAuth(r.Context(), auth)), false
	}
	t := &a.tarpit
	wait := qe.RetryAfter
	h := w.Header()
	switch {
	case cs == nil || !cs.refused.Swap(true) || t.maxHold <= 0:
		t.atOnce.Inc()
	case t.enter(qe.DeviceID):
		notBusy(r) // a held answer takes no CPU
		wait -= t.hold(r.Context(), min(wait, t.maxHold))
		t.leave(qe.DeviceID)
		t.held.Inc()
	default:
		h["Connection"] = []string{"close"}
		t.closed.Inc()
	}
	secs := quotaSeconds(wait)
	body := quotaBody(secs)
	h["Retry-After"] = []string{strconv.Itoa(secs)}
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(body)
	a.quota429.pushes.Inc()
	a.quota429.errors.Inc()
	return r, true
}
