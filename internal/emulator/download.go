package emulator

// Firmware downloads (docs/emulator.md, "Firmware rollouts"): in fleet mode
// a device whose push answer offers a firmware downloads the real bytes
// over HTTP — at most Config.DownloadRate bytes/s, with a share
// Config.DownloadFailRate of attempts cut midway and resumed with Range —,
// then reports installing, "reboots" after Config.InstallTime and reports
// the new firmware: the server verifies the update by it.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/protocol"
)

// Download states of a job.
const (
	dlDownloading int32 = iota
	dlDone              // the file is complete: report installing
	dlInstalling        // installing reported: rebooting
	dlInstalled         // rebooted into the new firmware
	dlFailed
)

// dlJob is a device's firmware update. The offer fields are fixed; the
// push goroutine and the download goroutine share the atomics.
type dlJob struct {
	offer    protocol.FirmwareOffer
	state    atomic.Int32
	have     atomic.Int64
	token    atomic.Pointer[string] // the device's token, renewed by pushes
	reason   atomic.Pointer[string]
	cancel   context.CancelFunc
	reported bool // installing or failed was accepted by the server (push goroutine only)
}

// downloader is the engine's firmware download side.
type downloader struct {
	e      *engine
	client *http.Client
	base   string // the target's URL, for relative offers

	started, completed, interrupted, resumed, failed, installed atomic.Int64
	bytes                                                       atomic.Int64
	active, maxActive                                           atomic.Int64
	lat                                                         *recorder // offer to complete file

	ctx    context.Context // ends when the run does
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newDownloader(e *engine, tlsConf *tls.Config) *downloader {
	tr := &http.Transport{
		TLSClientConfig: tlsConf.Clone(), ForceAttemptHTTP2: false, MaxIdleConnsPerHost: 64,
		TLSHandshakeTimeout: e.cfg.Timeout, ResponseHeaderTimeout: e.cfg.Timeout, DisableCompression: true,
	}
	dl := &downloader{e: e, client: &http.Client{Transport: tr}, base: strings.TrimSuffix(e.cfg.Target, "/"), lat: newRecorder()}
	dl.ctx, dl.cancel = context.WithCancel(context.Background())
	return dl
}

// settle ends d's job when its reboot is over: from now on d reports the
// new firmware (push goroutine, before the body is rendered).
func (dl *downloader) settle(d *device) {
	if j := d.fw; j != nil && j.state.Load() == dlInstalled {
		d.firmware = j.offer.Version
		d.fw = nil
		dl.installed.Add(1)
	}
}

// report appends the push's firmware_update member for d to dst, the body
// without its closing brace, and returns the state reported (-1: none).
func (dl *downloader) report(d *device, dst []byte) ([]byte, int32) {
	j := d.fw
	if j == nil {
		return dst, -1
	}
	st := j.state.Load()
	switch st {
	case dlDone, dlInstalling, dlInstalled: // installed is settled before the next push
		return appendReport(dst, j.offer.Rollout, protocol.FirmwareInstalling, 0, ""), st
	case dlFailed:
		r := ""
		if p := j.reason.Load(); p != nil {
			r = *p
		}
		return appendReport(dst, j.offer.Rollout, protocol.FirmwareFailed, 0, r), st
	}
	return appendReport(dst, j.offer.Rollout, protocol.FirmwareDownloading, j.have.Load(), ""), st
}

func appendReport(dst []byte, rollout uint64, state string, progress int64, reason string) []byte {
	dst = append(dst, `,"firmware_update":{"rollout":`...)
	dst = strconv.AppendUint(dst, rollout, 10)
	dst = append(dst, `,"state":"`...)
	dst = append(dst, state...)
	dst = append(dst, `","progress":`...)
	dst = strconv.AppendInt(dst, progress, 10)
	if reason != "" {
		dst = append(dst, `,"reason":"`...)
		dst = appendJSONText(dst, reason)
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

// answered acts on an accepted push of d: sent is the state the push
// reported (-1: none), offer the answer's (push goroutine).
func (dl *downloader) answered(d *device, sent int32, offer *protocol.FirmwareOffer) {
	j := d.fw
	switch {
	case j != nil && sent == dlFailed:
		d.fw = nil // the server has it; it offers this rollout no more
		return
	case j != nil && sent == dlDone:
		j.state.Store(dlInstalling)
		dl.wg.Add(1)
		go func() {
			defer dl.wg.Done()
			if sleepCtx(dl.ctx, dl.e.cfg.InstallTime) {
				j.state.Store(dlInstalled)
				dl.e.pushSoon(dl.ctx, d)
			}
		}()
		return
	case j != nil && j.state.Load() >= dlDone:
		return
	case offer == nil && j != nil:
		j.cancel() // withdrawn: paused before it started, or aborted
		d.fw = nil
		return
	case offer == nil:
		return
	case j != nil && j.offer.Rollout == offer.Rollout && j.offer.SHA256 == offer.SHA256:
		if tok := d.token; tok != *j.token.Load() {
			j.token.Store(&tok)
		}
		return
	case j != nil:
		j.cancel()
	}
	if offer.Version == dl.e.firmwareOf(d) {
		return
	}
	nj := &dlJob{offer: *offer}
	tok := d.token
	nj.token.Store(&tok)
	dctx, cancel := context.WithCancel(dl.ctx)
	nj.cancel = cancel
	d.fw = nj
	dl.started.Add(1)
	dl.wg.Add(1)
	go func() {
		defer dl.wg.Done()
		dl.fetch(dctx, d, nj, time.Now())
	}()
}

// stop ends every download and install and waits for them.
func (dl *downloader) stop() {
	dl.cancel()
	dl.wg.Wait()
}

// fetch downloads j's file, resuming after interruptions, until it is
// complete or ctx ends.
func (dl *downloader) fetch(ctx context.Context, d *device, j *dlJob, offered time.Time) {
	n := dl.active.Add(1)
	for m := dl.maxActive.Load(); n > m && !dl.maxActive.CompareAndSwap(m, n); m = dl.maxActive.Load() {
	}
	// Called before the state that ends the download is stored: a push may
	// report it at once, and the server give the slot to another device.
	inactive := sync.OnceFunc(func() { dl.active.Add(-1) })
	defer inactive()
	r := rng{s: dl.e.id.hash(d.idx, uint64(offered.UnixNano()))}
	wait := time.Second
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			dl.resumed.Add(1)
		}
		err := dl.attempt(ctx, j, &r)
		if err == nil {
			inactive()
			if j.have.Load() != j.offer.Size {
				dl.fail(j, fmt.Sprintf("size %d, offered %d", j.have.Load(), j.offer.Size))
				return
			}
			dl.completed.Add(1)
			dl.lat.record(0, time.Since(offered))
			j.state.Store(dlDone)
			dl.e.pushSoon(dl.ctx, d)
			return
		}
		if ctx.Err() != nil {
			return
		}
		var fatal *fatalErr
		if errors.As(err, &fatal) {
			inactive()
			dl.fail(j, fatal.msg)
			return
		}
		if !errors.Is(err, errCut) {
			wait = min(wait*2, 30*time.Second)
		}
		if !sleepCtx(ctx, wait/2+time.Duration(r.intn(int64(wait/2)))) {
			return
		}
	}
}

func (dl *downloader) fail(j *dlJob, reason string) {
	j.reason.Store(&reason)
	j.state.Store(dlFailed)
	dl.failed.Add(1)
}

type fatalErr struct{ msg string }

func (f *fatalErr) Error() string { return f.msg }

// errCut marks an attempt the emulator cut on purpose (DownloadFailRate).
var errCut = errors.New("download cut (emulated link failure)")

// attempt fetches the rest of the file once, at most DownloadRate bytes/s;
// with probability DownloadFailRate it stops after a random share of the
// rest, as a link that drops.
func (dl *downloader) attempt(ctx context.Context, j *dlJob, r *rng) error {
	have := j.have.Load()
	u, auth := j.offer.URL, true
	if !strings.HasPrefix(u, "/") {
		auth = false
		if p, err := url.Parse(u); err != nil || (p.Scheme != "https" && p.Scheme != "http") {
			return &fatalErr{"firmware url " + u + " is not http(s)"}
		}
	} else {
		u = dl.base + u
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return &fatalErr{err.Error()}
	}
	req.Header.Set("User-Agent", "drover-emulator")
	if auth {
		req.Header.Set("Authorization", "Bearer "+*j.token.Load())
	}
	if have > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(have, 10)+"-")
		req.Header.Set("If-Range", `"`+j.offer.SHA256+`"`)
	}
	resp, err := dl.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusPartialContent:
	case http.StatusOK:
		have = 0
		j.have.Store(0)
	case http.StatusRequestedRangeNotSatisfiable:
		return nil
	default:
		return fmt.Errorf("firmware download: server answered %d", resp.StatusCode)
	}
	limit := int64(-1) // bytes until the emulated cut
	if f := dl.e.cfg.DownloadFailRate; f > 0 && r.float() < f {
		limit = r.intn(max(j.offer.Size-have, 1))
		dl.interrupted.Add(1)
	}
	rate := dl.e.cfg.DownloadRate
	buf := make([]byte, 32<<10)
	if rate > 0 && rate < int64(len(buf)) {
		buf = buf[:max(rate/4, 512)]
	}
	start, got := time.Now(), int64(0)
	for {
		chunk := buf
		if limit >= 0 && int64(len(chunk)) > limit-got {
			chunk = chunk[:limit-got]
		}
		if len(chunk) == 0 {
			return errCut
		}
		n, err := resp.Body.Read(chunk)
		if n > 0 {
			if have+got+int64(n) > j.offer.Size {
				return &fatalErr{fmt.Sprintf("the file is larger than the offered %d bytes", j.offer.Size)}
			}
			got += int64(n)
			j.have.Add(int64(n))
			dl.bytes.Add(int64(n))
			if rate > 0 {
				if ahead := time.Duration(got*int64(time.Second)/rate) - time.Since(start); ahead > 0 && !sleepCtx(ctx, ahead) {
					return ctx.Err()
				}
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// summary is the downloads' part of the run's summary; nil when none ran.
func (dl *downloader) summary() *results.Downloads {
	if dl == nil || dl.started.Load() == 0 {
		return nil
	}
	h := results.NewHist()
	dl.lat.drainInto(h.H)
	return &results.Downloads{
		Started: dl.started.Load(), Completed: dl.completed.Load(), Interrupted: dl.interrupted.Load(),
		Resumed: dl.resumed.Load(), Failed: dl.failed.Load(), Installed: dl.installed.Load(),
		Bytes: dl.bytes.Load(), MaxActive: dl.maxActive.Load(), Time: h,
	}
}

// pushSoon pushes d now (fleet mode), or right after the push under way.
func (e *engine) pushSoon(ctx context.Context, d *device) {
	if ctx.Err() != nil || !time.Now().Before(e.end) {
		return
	}
	for {
		if d.state.CompareAndSwap(0, 1) {
			s := e.getScratch()
			e.fleetDevice(ctx, d, time.Now(), s)
			e.putScratch(s)
			return
		}
		if d.state.Load() == 2 {
			return // a push follows anyway
		}
		d.pendingDue.Store(time.Now().UnixNano())
		if d.state.CompareAndSwap(1, 2) {
			return
		}
	}
}
