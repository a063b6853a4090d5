package perf

// The rollout test (docs/perf.md#rollout-10k): the fleet
// registers (not measured) and pushes open loop; the suite uploads an
// artifact of random bytes and starts a rollout to every device; the
// emulated devices download the real bytes (docs/emulator.md, "Firmware
// rollouts") and report the new firmware. Measured: time per wave, bytes
// served per second, server CPU and RSS (the file is streamed: RSS must
// stay flat), failures.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/internal/emulator"
	"github.com/drover/drover/internal/emulator/results"
	"github.com/drover/drover/internal/render"
	"github.com/drover/drover/internal/render/doc"
)

// rolloutSpec is what a rollout preset rolls out.
type rolloutSpec struct {
	ArtifactMiB  int      `json:"artifact_mib"`
	Waves        []string `json:"waves"`
	MaxDownloads int      `json:"max_downloads"`
	LinkBps      int64    `json:"link_bytes_per_s"` // per device
	FailRate     float64  `json:"fail_rate"`        // share of download attempts cut
}

// rolloutFigures is what a rollout test measured.
type rolloutFigures struct {
	ID            uint64         `json:"id,string"`
	ArtifactBytes int64          `json:"artifact_bytes"`
	UploadSec     float64        `json:"upload_s"`
	StartSec      float64        `json:"start_s"` // since the part started
	EndSec        float64        `json:"end_s"`
	State         string         `json:"state"`
	Reason        string         `json:"reason,omitempty"`
	Total         int            `json:"total"`
	Counts        map[string]int `json:"counts,omitempty"`
	Waves         []waveFigures  `json:"waves,omitempty"`
	// Once a second: bytes received by the devices per second, devices
	// downloading and devices verified.
	Timeline  []rolloutPoint     `json:"timeline,omitempty"`
	Downloads *results.Downloads `json:"downloads,omitempty"`
	RSSMaxMiB float64            `json:"rss_max_mib"` // the server's, during the rollout
	CPUAvgPct float64            `json:"cpu_avg_pct"` // the server's, during the rollout, of one core
}

type waveFigures struct {
	Wave     int     `json:"wave"`
	StartSec float64 `json:"start_s"`
	EndSec   float64 `json:"end_s"`
	Verified int     `json:"verified"` // devices verified when the next wave started (cumulative)
	Failed   int     `json:"failed"`
}

type rolloutPoint struct {
	T           float64 `json:"t"`
	BytesPerSec float64 `json:"bytes_per_s"`
	Downloading int64   `json:"downloading"`
	Verified    int     `json:"verified"`
}

// Rollout test criteria.
const (
	// rolloutRSSBase is the server RSS growth allowed during a rollout
	// besides rolloutRSSPerDownload per concurrent download (TLS and
	// socket buffers): a server copying files through memory would need
	// the artifact's size per download.
	rolloutRSSBase        = 128.0 // MiB
	rolloutRSSPerDownload = 0.25  // MiB
)

// apiDo calls the operator API with the admin token.
func (t *target) apiDo(ctx context.Context, method, path, ctype string, body io.Reader, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, t.url+path, body)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+t.admin)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	c := t.client
	if body != nil && method == http.MethodPost && ctype == "application/octet-stream" {
		c = &http.Client{Transport: t.client.Transport} // an upload takes longer than the usual 10 s
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	if out != nil {
		return resp.StatusCode, json.Unmarshal(raw, out)
	}
	return resp.StatusCode, nil
}

type rolloutState struct {
	ID     uint64         `json:"id,string"`
	State  string         `json:"state"`
	Reason string         `json:"reason"`
	Wave   int            `json:"wave"`
	Total  int            `json:"total"`
	Counts map[string]int `json:"counts"`
}

// driveRollout runs a rollout test's measured part: the fleet pushes open
// loop while the suite rolls out an artifact to it; it ends when the
// rollout is done, paused or aborted, or after p.Duration.
func driveRollout(ctx context.Context, p Preset, t *target, o Options, start time.Time, smp *sampler) (*results.Summary, []point, *rolloutFigures, error) {
	if t.admin == "" {
		return nil, nil, nil, errors.New(p.Name + " uploads firmware and starts a rollout: give --admin-token")
	}
	spec := p.Rollout
	cfg, prog := emuConfig(p, t, o)
	cfg.Mode, cfg.Interval, cfg.Duration, cfg.MaxInflight = emulator.ModeFleet, time.Duration(p.LoopTime)*time.Second, p.Duration, p.Threads
	cfg.CredentialsFile = t.credentials
	cfg.DownloadRate, cfg.DownloadFailRate, cfg.InstallTime = spec.LinkBps, spec.FailRate, 5*time.Second
	var mu sync.Mutex
	var latest emulator.Progress
	show := cfg.Progress
	cfg.Progress = func(pg emulator.Progress) {
		mu.Lock()
		latest = pg
		mu.Unlock()
		show(pg)
	}
	prog.name = p.Name
	width := max(time.Second, (p.Duration / 600).Round(time.Second))
	sink := newSeriesSink(start, width)
	ectx, ecancel := context.WithCancel(ctx)
	defer ecancel()
	type emuOut struct {
		sum *results.Summary
		err error
	}
	done := make(chan emuOut, 1)
	go func() {
		sum, err := emulator.Run(ectx, cfg, sink)
		done <- emuOut{sum, err}
	}()
	fig := &rolloutFigures{}
	finish := func(err error) (*results.Summary, []point, *rolloutFigures, error) {
		ecancel()
		out := <-done
		if out.sum != nil {
			fig.Downloads = out.sum.Downloads
			if out.sum.Err != "" && errors.Is(ectx.Err(), context.Canceled) && ctx.Err() == nil {
				out.sum.Err = "" // the test's own end
			}
		}
		if err == nil && out.err != nil && !errors.Is(out.err, context.Canceled) {
			err = out.err
		}
		return out.sum, sink.points(), fig, err
	}

	// Every device pushes once (it is online) before the rollout starts.
	if !sleepCtx(ctx, time.Duration(p.LoopTime)*time.Second+2*time.Second) {
		return finish(ctx.Err())
	}
	size := int64(spec.ArtifactMiB) << 20
	fig.ArtifactBytes = size
	up := time.Now()
	q := url.Values{"device_type": {cfg.DeviceType}, "version": {"perf-" + t.seed}}
	var fw struct {
		ID uint64 `json:"id,string"`
	}
	// Random bytes streamed into the request: no copy of the artifact here.
	if _, err := t.apiDo(ctx, http.MethodPost, "/api/v1/firmware?"+q.Encode(), "application/octet-stream", io.LimitReader(rand.Reader, size), &fw); err != nil {
		return finish(fmt.Errorf("uploading the artifact: %w", err))
	}
	fig.UploadSec = time.Since(up).Seconds()
	rs, _ := json.Marshal(map[string]any{"firmware_id": fw.ID, "waves": spec.Waves, "max_downloads": spec.MaxDownloads, "max_failure_pct": 10})
	var ro rolloutState
	if _, err := t.apiDo(ctx, http.MethodPost, "/api/v1/rollouts", "application/json", strings.NewReader(string(rs)), &ro); err != nil {
		return finish(fmt.Errorf("starting the rollout: %w", err))
	}
	fig.ID, fig.Total, fig.StartSec = ro.ID, ro.Total, time.Since(start).Seconds()
	beforeSamples := len(smp.snapshotSamples())

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	// Bytes per second over the last rateWindow of the emulator's progress
	// (once a second, on its own clock): single seconds jitter on a busy
	// machine.
	const rateWindow = 5 * time.Second
	var hist []emulator.Progress
	wave := 0
	for {
		select {
		case <-ctx.Done():
			return finish(ctx.Err())
		case out := <-done:
			done <- out // finish reads it
			fig.Reason = "the emulator ended (--duration) before the rollout did"
			return finish(nil)
		case <-tick.C:
		}
		var cur rolloutState
		if _, err := t.apiDo(ctx, http.MethodGet, fmt.Sprintf("/api/v1/rollouts/%d", ro.ID), "", nil, &cur); err != nil {
			continue
		}
		now := time.Now()
		ts := now.Sub(start).Seconds()
		mu.Lock()
		pg := latest
		mu.Unlock()
		pt := rolloutPoint{T: ts, Downloading: pg.DownloadActive, Verified: cur.Counts["verified"]}
		if len(hist) == 0 || pg.Elapsed > hist[len(hist)-1].Elapsed {
			hist = append(hist, pg)
		}
		for len(hist) > 2 && pg.Elapsed-hist[1].Elapsed >= rateWindow {
			hist = hist[1:]
		}
		if old := hist[0]; pg.Elapsed > old.Elapsed {
			pt.BytesPerSec = float64(pg.DownloadBytes-old.DownloadBytes) / (pg.Elapsed - old.Elapsed).Seconds()
		}
		fig.Timeline = append(fig.Timeline, pt)
		for wave < cur.Wave {
			if wave > 0 {
				fig.Waves[wave-1].EndSec = ts
				fig.Waves[wave-1].Verified, fig.Waves[wave-1].Failed = cur.Counts["verified"], cur.Counts["failed"]
			}
			wave++
			fig.Waves = append(fig.Waves, waveFigures{Wave: wave, StartSec: ts})
		}
		fig.State, fig.Reason, fig.Counts = cur.State, cur.Reason, cur.Counts
		if cur.State == "done" || cur.State == "paused" || cur.State == "aborted" {
			if wave > 0 {
				fig.Waves[wave-1].EndSec = ts
				fig.Waves[wave-1].Verified, fig.Waves[wave-1].Failed = cur.Counts["verified"], cur.Counts["failed"]
			}
			fig.EndSec = ts
			ss := smp.snapshotSamples()
			var cpu float64
			n := 0
			for _, s := range ss[min(beforeSamples, len(ss)):] {
				fig.RSSMaxMiB = max(fig.RSSMaxMiB, s.RSSMiB)
				cpu += s.CPUPct
				n++
			}
			if n > 0 {
				fig.CPUAvgPct = cpu / float64(n)
			}
			sleepCtx(ctx, 2*time.Second) // the last reports land
			return finish(nil)
		}
	}
}

// computeRollout judges a rollout test.
func computeRollout(r *Result, c *Calc) {
	if len(r.Parts) == 0 || r.Parts[0].Rollout == nil {
		c.Checks = append(c.Checks, check{"rollout started", "no", "yes", false})
		return
	}
	part := r.Parts[0]
	f := part.Rollout
	add := func(name, measured, limit string, ok bool) {
		c.Checks = append(c.Checks, check{name, measured, limit, ok})
	}
	add("rollout state", orNA(f.State != "", f.State)+orNA(f.Reason != "", " ("+f.Reason+")"), "done", f.State == "done")
	add("devices verified / matched", fmt.Sprintf("%s / %s", gi(f.Counts["verified"]), gi(f.Total)), "all", f.Total > 0 && f.Counts["verified"] == f.Total)
	add("devices failed", gi(f.Counts["failed"]), "0", f.Counts["failed"] == 0)
	if dl := f.Downloads; dl != nil {
		add("download failures reported", group(dl.Failed), "0", dl.Failed == 0)
	}
	limit := rolloutRSSBase + rolloutRSSPerDownload*float64(r.Preset.Rollout.MaxDownloads)
	grow := f.RSSMaxMiB - part.Before.RSSMiB
	add("server RSS growth during the rollout (the file is streamed, not copied)",
		fmt.Sprintf("%s MiB (%s → peak %s MiB; artifact %s MiB × %d downloads at once would be %s MiB)",
			render.Fixed(grow, 1), render.Fixed(part.Before.RSSMiB, 1), render.Fixed(f.RSSMaxMiB, 1), gi(r.Preset.Rollout.ArtifactMiB), r.Preset.Rollout.MaxDownloads,
			gi(r.Preset.Rollout.ArtifactMiB*r.Preset.Rollout.MaxDownloads)),
		"≤ "+render.Fixed(limit, 0)+" MiB", f.RSSMaxMiB > 0 && grow <= limit)
}

// rolloutSection is a rollout test's criteria and figures.
func rolloutSection(d *doc.Doc, r *Result, c *Calc) {
	checksTable(d, "Rollout test criteria", c)
	if len(r.Parts) == 0 || r.Parts[0].Rollout == nil {
		return
	}
	part := r.Parts[0]
	f := part.Rollout
	s := r.Preset.Rollout
	d.Heading("Rollout")
	t := doc.NewTable("item", "value")
	t.Row("registration (not measured)", fmt.Sprintf("%s devices in %s s", group(part.Register.Accepted), render.Fixed(part.Register.ElapsedSec, 1)))
	t.Row("artifact", fmt.Sprintf("%s bytes of random data, uploaded in %s s", group(f.ArtifactBytes), render.Fixed(f.UploadSec, 1)))
	t.Row("rollout", fmt.Sprintf("waves %s, at most %d downloads at once; %s devices matched", strings.Join(s.Waves, ", "), s.MaxDownloads, gi(f.Total)))
	t.Row("emulated link", fmt.Sprintf("%s/s per device, %s %% of download attempts cut and resumed", bytesText(float64(s.LinkBps)), render.Fixed(s.FailRate*100, 1)))
	dur := f.EndSec - f.StartSec
	t.Row("rollout time", render.Fixed(dur, 1)+" s, from its start to "+orNA(f.State != "", f.State))
	if dl := f.Downloads; dl != nil {
		t.Row("downloads", fmt.Sprintf("%s started, %s complete, %s cut, %s resumed, %s failed, %s installed; at most %s at once",
			group(dl.Started), group(dl.Completed), group(dl.Interrupted), group(dl.Resumed), group(dl.Failed), group(dl.Installed), group(dl.MaxActive)))
		if dur > 0 {
			t.Row("bytes served", fmt.Sprintf("%s bytes, %s/s on average over the rollout", group(dl.Bytes), bytesText(float64(dl.Bytes)/dur)))
		}
		if dl.Time != nil && dl.Time.Count() > 0 {
			l := dl.Time.Stats()
			t.Row("download time, offer to complete file p50 / p99 / max (s)", fmt.Sprintf("%s / %s / %s",
				render.Fixed(l.P50.Seconds(), 1), render.Fixed(l.P99.Seconds(), 1), render.Fixed(l.Max.Seconds(), 1)))
		}
	}
	peak := 0.0
	for _, pt := range f.Timeline {
		peak = max(peak, pt.BytesPerSec)
	}
	t.Row("bytes served per second, peak (5 s average)", bytesText(peak)+"/s")
	t.Row("server CPU during the rollout, average", render.Fixed(f.CPUAvgPct, 1)+" % of one core")
	t.Row("server RSS before / peak during the rollout (MiB)", render.Fixed(part.Before.RSSMiB, 1)+" / "+render.Fixed(f.RSSMaxMiB, 1))
	t.Row("push errors during the test", fmt.Sprintf("%s rejected, %s dropped, %s retried", group(sumMap(part.Push.Rejected)),
		group(sumMap(part.Push.Dropped)), group(part.Push.Retried)))
	d.Table(t)
	wt := doc.NewTable("wave", "started / s", "ended / s", "time / s", "verified at its end (all waves)", "failed (all waves)")
	for _, w := range f.Waves {
		wt.Row(gi(w.Wave), render.Fixed(w.StartSec-f.StartSec, 1), render.Fixed(w.EndSec-f.StartSec, 1), render.Fixed(w.EndSec-w.StartSec, 1), gi(w.Verified), gi(w.Failed))
	}
	d.Paraf("Times from the rollout's start; a wave ends when the next starts (or the rollout ends).")
	d.Table(wt)
}

// rolloutCharts draws bytes served per second and devices over the rollout.
func rolloutCharts(d *doc.Doc, f *rolloutFigures) {
	if f == nil || len(f.Timeline) == 0 {
		return
	}
	xs := make([]float64, len(f.Timeline))
	bw, downloading, verified := make([]float64, len(xs)), make([]float64, len(xs)), make([]float64, len(xs))
	for i, pt := range f.Timeline {
		xs[i], bw[i], downloading[i], verified[i] = pt.T, pt.BytesPerSec/(1<<20), float64(pt.Downloading), float64(pt.Verified)
	}
	bc := &chart{title: "Firmware bytes served", unit: "MiB/s", xs: xs}
	bc.add("received by the devices", bw)
	d.Chart(bc.chart())
	dc := &chart{title: "Rollout devices", unit: "devices", xs: xs}
	dc.add("downloading", downloading)
	dc.add("verified", verified)
	d.Chart(dc.chart())
}

// bytesText is a byte count with SI prefixes.
func bytesText(v float64) string { return render.SI(v, []string{"B", "kB", "MB", "GB"}) }
