package server

// The push route, POST /api/v1/push, top to bottom: admitPush
// authenticates and admits the push before its body is read (one quota
// check, fleet.CheckPush) and hands the result on the request's context;
// push decodes the body and calls fleet.Push, which resolves the profile,
// enqueues the push and answers after its commit; the answer is appended
// without the JSON encoder when it carries only the interval.
//
// Over-quota pushes cost the server next to nothing (docs/operations.md,
// "Quotas"). A push over its device's quota is refused
// before a request slot is taken and before its body is read, with a 429
// whose body was encoded once, counted and never logged. After such a 429,
// the next over-quota push on the same keep-alive connection is held (a
// timer: no CPU) for up to its Retry-After, at most Config.QuotaHold, before its 429:
// a client that ignores Retry-After gets one answer per Retry-After per
// connection, however fast it sends. At most transport.HeldPerDevice connections
// of one device, and transport.HeldTotal in all, are held at once; beyond that the 429
// closes the connection. A device that waits as told is never held.

import (
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
	"github.com/drover/drover/internal/server/transport"
	fastjson "github.com/goccy/go-json"
)

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
	cs := transport.ConnOf(r.Context())
	qe, over := err.(*fleet.QuotaError)
	if !over {
		if cs != nil {
			cs.Refused.Store(false)
		}
		return r.WithContext(fleet.WithPushAuth(r.Context(), auth)), false
	}
	t := &a.tarpit
	wait := qe.RetryAfter
	h := w.Header()
	switch {
	case cs == nil || !cs.Refused.Swap(true) || t.MaxHold <= 0:
		a.quotaAnswers.atOnce.Inc()
	case t.Enter(qe.DeviceID):
		transport.NotBusy(r) // a held answer takes no CPU
		wait -= t.Hold(r.Context(), min(wait, t.MaxHold))
		t.Leave(qe.DeviceID)
		a.quotaAnswers.held.Inc()
	default:
		h["Connection"] = []string{"close"}
		a.quotaAnswers.closed.Inc()
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

func (a *api) push(r *http.Request) (any, error) {
	token, ok := bearer(r)
	if !ok {
		return nil, errNoBearer
	}
	req, err := decodePush(r)
	if err != nil {
		return nil, err
	}
	// admitPush authenticated and admitted it: r's context carries that.
	resp, err := a.fleet.Push(r.Context(), token, req)
	if err == nil && a.tunnels != nil && a.tunnels.asking.Load() > 0 {
		if id, aerr := a.fleet.Authenticate(r.Context(), token); aerr == nil && a.tunnels.connectWanted(id) {
			resp.Connect = connectHold
		}
	}
	return resp, err
}

// decodePush reads and decodes a push's body.
func decodePush(r *http.Request) (protocol.PushRequest, error) {
	buf, err := readBody(r)
	if err != nil {
		return protocol.PushRequest{}, err
	}
	defer putBuf(buf)
	return protocol.DecodePush(buf.Bytes())
}

// plainPushAnswer says whether p carries the push interval alone, the
// answer to nearly every push.
func plainPushAnswer(p *protocol.PushResponse) bool {
	return p.Config == nil && p.FirmwareUpdate == nil && len(p.Commands) == 0 && p.Connect == 0
}

// appendPushAnswer appends the JSON of a push answer that carries only
// the push interval, byte for byte what the encoder writes for it.
func appendPushAnswer(b []byte, interval int) []byte {
	b = append(b, `{"push_interval":`...)
	b = strconv.AppendInt(b, int64(interval), 10)
	return append(b, "}\n"...)
}
