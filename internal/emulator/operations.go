package emulator

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/drover/drover/internal/protocol"
)

// The two operations of a device: register and push, with their retries
// and outcome counting.

// registerDevice registers d. It returns false when d has no token after it.
func (e *engine) registerDevice(ctx context.Context, d *device, s *scratch) bool {
	st := e.reg
	started := time.Now()
	st.begin(started.UnixNano())
	s.body = append(s.body[:0], `{"machine_id":"`...)
	s.body = appendJSONText(s.body, d.machineID)
	s.body = append(s.body, `","device_type":"`...)
	s.body = appendJSONText(s.body, e.cfg.DeviceType)
	s.body = append(s.body, `","model":"`...)
	s.body = appendJSONText(s.body, e.cfg.Model)
	s.body = append(s.body, `","firmware":"`...)
	s.body = appendJSONText(s.body, e.firmwareOf(d))
	s.body = append(s.body, `","serial":"`...)
	s.body = appendSerial(s.body, d.idx)
	s.body = append(s.body, `","enrollment_secret":"`...)
	s.body = appendJSONText(s.body, e.cfg.EnrollmentSecret)
	if d.key != "" {
		s.body = append(s.body, `","device_key":"`...)
		s.body = appendJSONText(s.body, d.key)
	}
	s.body = append(s.body, `"}`...)
	s.req = append(s.req[:0], e.regPrefix...)
	s.req = strconv.AppendInt(s.req, int64(len(s.body)), 10)
	s.req = append(s.req, "\r\n\r\n"...)
	s.req = append(s.req, s.body...)

	for attempt := 0; ; attempt++ {
		e.inflight.Add(1)
		resent, err := e.tr.do(ctx, &d.tls, s.req, s.resp, &s.res)
		e.inflight.Add(-1)
		if resent {
			st.resent.Add(1)
		}
		now := time.Now()
		if err != nil {
			e.dropped(ctx, st, err, now)
			return false
		}
		s.resp = s.res.body[:0]
		switch status := s.res.status; {
		case status == 200:
			var rr protocol.RegisterResponse
			if err := json.Unmarshal(s.res.body, &rr); err != nil || !validToken(rr.Token) {
				st.drop(DropProtocol)
				st.end(now.UnixNano())
				e.warnOnce("bad-register-answer", "the server answered a registration with 200 but no usable token")
				return false
			}
			e.wipeRegistered(d, rr.DeviceID)
			d.deviceID, d.token = rr.DeviceID, rr.Token
			if rr.DeviceKey != "" {
				d.key = rr.DeviceKey
			}
			if rr.New {
				st.newReg.Add(1)
			}
			st.lat.record(s.hint, now.Sub(started))
			st.accept(s.res.node)
			st.end(now.UnixNano())
			return true
		case status == 503 || status == 429:
			st.sawRetryAfter(s.res.retryAfter)
			if attempt >= e.cfg.MaxRetries {
				e.rejected(st, status, s.hint, now.Sub(started), now)
				return false
			}
			wait, ok := e.retryWait(s.res.retryAfter, attempt+1, &s.jit)
			if !ok {
				e.rejected(st, status, s.hint, now.Sub(started), now)
				return false
			}
			st.retried.Add(1)
			if !sleepCtx(ctx, wait) {
				st.aborted.Add(1)
				st.end(time.Now().UnixNano())
				return false
			}
		case status == 202:
			// Waiting for an operator (docs/protocol.md#admission): keep the
			// key it was given; the device stays unregistered for now.
			var rr protocol.RegisterResponse
			if json.Unmarshal(s.res.body, &rr) == nil && rr.DeviceKey != "" {
				d.key = rr.DeviceKey
			}
			e.wipePending(ctx, d, rr)
			e.warnOnce("202", "registration answered 202: it waits for an operator's approval (admission policy, or a known machine ID without its device key)")
			e.rejected(st, status, s.hint, now.Sub(started), now)
			return false
		default:
			if status == 403 {
				e.warnOnce("403", "registration answered 403: the enrollment secret is wrong, or the device is blocked or not admitted")
			}
			e.rejected(st, status, s.hint, now.Sub(started), now)
			return false
		}
	}
}

func validToken(t string) bool {
	if t == "" || len(t) > 1024 {
		return false
	}
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] >= 0x7f {
			return false
		}
	}
	return true
}

func (e *engine) rejected(st *opStats, status, hint int, lat time.Duration, now time.Time) {
	st.lat.record(hint, lat)
	st.reject(status)
	st.end(now.UnixNano())
}

// ended tells whether ctx is done or past its deadline (a deadline can
// fail I/O a moment before ctx itself reports it).
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

func (e *engine) dropped(ctx context.Context, st *opStats, err error, now time.Time) {
	if ended(ctx) {
		st.aborted.Add(1)
	} else {
		reason := classify(err)
		st.drop(reason)
		switch reason {
		case DropNoPort:
			e.warnOnce("no_port", "out of ephemeral ports for new connections: add source addresses (--source-addrs 127.0.0.1-127.0.0.8)")
		case DropFDLimit:
			e.warnOnce("fd_limit", "out of file descriptors: split the fleet over processes (--procs)")
		case DropTLS:
			e.warnOnce("tls", "TLS handshakes fail: "+err.Error())
		}
	}
	st.end(now.UnixNano())
}

// retryWait is how long to wait before retry number attempt: at least the
// server's Retry-After, at least an exponential backoff from 1 s, plus up
// to 50 % jitter. ok is false when the server asks for more than
// MaxRetryWait.
func (e *engine) retryWait(retryAfter time.Duration, attempt int, j *rng) (time.Duration, bool) {
	if retryAfter > e.cfg.MaxRetryWait {
		return 0, false
	}
	w := time.Second << min(attempt-1, 16)
	w = max(w, retryAfter)
	w += time.Duration(j.intn(int64(w/2) + 1))
	return min(w, e.cfg.MaxRetryWait), true
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

var (
	configKey   = []byte(`"config"`)
	firmwareKey = []byte(`"firmware_update"`)
)

// firmwareOf is the firmware d runs.
func (e *engine) firmwareOf(d *device) string {
	if d.firmware != "" {
		return d.firmware
	}
	return e.cfg.Firmware
}

// pushDevice makes one push of d, intended at time intended: registering
// first if d has no token, retrying after 503/429, registering again after
// 401 as an agent does.
func (e *engine) pushDevice(ctx context.Context, d *device, s *scratch, intended time.Time, fleet bool) {
	st := e.push
	e.wipeDue(d)
	if d.token == "" {
		if !e.registerDevice(ctx, d, s) {
			st.unregistered.Add(1)
			return
		}
		intended = time.Now() // the push proper starts now
		fleet = false         // its lag is the registration's time, not the schedule's
	}
	r := d.advance(e.id)
	if e.dl != nil {
		e.dl.settle(d)
	}
	reregistered := false
	for attempt := 0; ; attempt++ {
		now := time.Now()
		if attempt == 0 {
			st.begin(now.UnixNano())
			if fleet {
				lag := now.Sub(intended)
				e.lag.record(s.hint, lag)
				if lag > e.cfg.LateAfter {
					st.late.Add(1)
				}
			}
		}
		rr := r
		s.body = e.tpl.Render(s.body[:0], d, &e.rc, now, &rr)
		sent := int32(-1)
		if e.dl != nil && d.fw != nil && len(s.body) > 0 && s.body[len(s.body)-1] == '}' {
			s.body, sent = e.dl.report(d, s.body[:len(s.body)-1])
			s.body = append(s.body, '}')
		}
		s.req = append(s.req[:0], e.pushPrefix...)
		s.req = append(s.req, d.token...)
		s.req = append(s.req, "\r\nContent-Length: "...)
		s.req = strconv.AppendInt(s.req, int64(len(s.body)), 10)
		s.req = append(s.req, "\r\n\r\n"...)
		s.req = append(s.req, s.body...)

		e.inflight.Add(1)
		resent, err := e.tr.do(ctx, &d.tls, s.req, s.resp, &s.res)
		e.inflight.Add(-1)
		if resent {
			st.resent.Add(1)
		}
		done := time.Now()
		if err != nil {
			e.dropped(ctx, st, err, done)
			return
		}
		s.resp = s.res.body[:0]
		switch status := s.res.status; {
		case status == 200:
			hasFW := e.dl != nil && (d.fw != nil || bytes.Contains(s.res.body, firmwareKey))
			if hasFW || bytes.Contains(s.res.body, configKey) {
				var pr protocol.PushResponse
				ok := json.Unmarshal(s.res.body, &pr) == nil
				if ok && pr.Config != nil && pr.Config.Version != d.cfgVer {
					d.cfgVer = pr.Config.Version // applied at once
					st.configs.Add(1)
				}
				if ok && hasFW {
					e.dl.answered(d, sent, pr.FirmwareUpdate)
				}
			}
			st.lat.record(s.hint, done.Sub(intended))
			st.accept(s.res.node)
			if e.acks != nil {
				e.acks.add(d.deviceID, d.seq, s.res.node, done)
			}
			st.end(done.UnixNano())
			return
		case status == 401 && !reregistered:
			reregistered = true
			st.rereg.Add(1)
			d.token = ""
			if !e.registerDevice(ctx, d, s) {
				e.rejected(st, status, s.hint, time.Since(intended), time.Now())
				return
			}
		case status == 503 || status == 429:
			st.sawRetryAfter(s.res.retryAfter)
			if attempt >= e.cfg.MaxRetries {
				e.rejected(st, status, s.hint, done.Sub(intended), done)
				return
			}
			wait, ok := e.retryWait(s.res.retryAfter, attempt+1, &s.jit)
			if !ok {
				e.rejected(st, status, s.hint, done.Sub(intended), done)
				return
			}
			st.retried.Add(1)
			if !sleepCtx(ctx, wait) {
				st.aborted.Add(1)
				st.end(time.Now().UnixNano())
				return
			}
		default:
			e.rejected(st, status, s.hint, done.Sub(intended), done)
			return
		}
	}
}
