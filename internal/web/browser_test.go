package web_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/server"
	"github.com/drover/drover/internal/server/servertest"
	"github.com/drover/drover/internal/store/sqlite"
	"github.com/drover/drover/internal/testwait"
)

// findChromium returns the browser to drive. Without one the test fails
// under CI (CI=true) and is skipped elsewhere.
func findChromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH: the browser tests need it (Debian: apt-get install chromium)")
	}
	t.Skip("skipping the browser test: no chromium on PATH (Debian: apt-get install chromium)")
	return ""
}

// fleetSeed describes the emulated fleet written into the database before
// the server starts.
type fleetSeed struct {
	devices  int
	target   int // index of the device the test looks for
	history  []int
	tokens   map[int]string
	machines map[int]string
}

var seedTypes = []struct{ typ, fw string }{{"ICR-3241", "6.3.5"}, {"ICR-3241", "6.4.0"}, {"ICR-4461", "6.3.5"}, {"ICR-2031", "6.2.1"}}

func machineID(i int) string { return fmt.Sprintf("icr-%06d", i) }

// seedDatabase writes profiles, devices with states and 24 h of history for
// a few devices straight into the SQLite store: 10,000 devices in one
// transaction, in about a second.
func seedDatabase(t *testing.T, path string, sd *fleetSeed, now time.Time) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b := &fleet.Batch{}
	for i, p := range seedTypes {
		b.Profiles = append(b.Profiles, fleet.Profile{ID: uint64(i + 1), DeviceType: p.typ, Firmware: p.fw, Config: json.RawMessage(`{}`),
			PushInterval: 200, CreatedAt: now.Add(-48 * time.Hour), UpdatedAt: now.Add(-48 * time.Hour)})
	}
	rng := rand.New(rand.NewPCG(7, 7))
	sd.tokens, sd.machines = map[int]string{}, map[int]string{}
	hist := map[int]bool{}
	for _, h := range sd.history {
		hist[h] = true
	}
	for i := 0; i < sd.devices; i++ {
		id := uint64(i + 1)
		p := seedTypes[i%len(seedTypes)]
		if i == sd.target {
			p = seedTypes[2]
		}
		tok := fmt.Sprintf("%d.seed-token-%d", id, i)
		sum := sha256.Sum256([]byte(tok))
		sd.tokens[i], sd.machines[i] = tok, machineID(i)
		b.Devices = append(b.Devices, fleet.DeviceRecord{ID: id, MachineID: machineID(i), DeviceType: p.typ, Firmware: p.fw,
			Serial: fmt.Sprintf("R%07d", 1000000+i*7), TokenHash: sum[:], RegisteredAt: now.Add(-40 * time.Hour)})
		ago := time.Duration(rng.IntN(150)) * time.Second
		switch {
		case i%97 == 5:
			ago = 2 * time.Hour // offline
		case i%61 == 3:
			ago = 7 * time.Minute // late
		}
		state := fmt.Sprintf(`{"uptime":%d,"cpu":%.1f,"temperature":%.1f,"mem_total":268435456,"mem_used":%d,"disk_total":134217728,"disk_used":%d,`+
			`"interfaces":[{"name":"wwan0","rx_bytes":%d,"tx_bytes":%d}],"signal":{"rssi":%d,"rsrp":%d,"sinr":%d,"operator":"Op","technology":"LTE"}}`,
			86400+i, 5+rng.Float64()*30, 38+rng.Float64()*12, 90000000+rng.IntN(50000000), 40000000+rng.IntN(20000000),
			rng.IntN(1<<30), rng.IntN(1<<28), -60-rng.IntN(30), -85-rng.IntN(30), rng.IntN(20))
		if !hist[i] {
			b.States = append(b.States, fleet.StateRecord{DeviceID: id, Firmware: p.fw, LastSeen: now.Add(-ago), Seq: 400, State: json.RawMessage(state)})
			continue
		}
		// 24 h of pushes every 5 minutes, the last one just now.
		var rx, tx uint64 = 1 << 20, 1 << 18
		cpu := 12.0
		steps := 24 * 12
		for k := steps; k >= 0; k-- {
			at := now.Add(-time.Duration(k) * 5 * time.Minute)
			hour := float64(at.Hour()) + float64(at.Minute())/60
			cpu = math.Max(1, math.Min(95, cpu+rng.NormFloat64()*4))
			temp := 42 + 8*math.Sin((hour-9)/24*2*math.Pi) + rng.NormFloat64()
			rx += uint64(2e6 + 1.5e6*math.Sin(hour/24*2*math.Pi) + rng.Float64()*5e5)
			tx += uint64(4e5 + rng.Float64()*2e5)
			rssi := -72 + 4*math.Sin(hour/3) + rng.NormFloat64()
			rsrp := rssi - 25 + rng.NormFloat64()
			sinr := 12 + 3*math.Sin(hour/2) + rng.NormFloat64()
			up := int64(86400 + (steps-k)*300)
			r, t := rx, tx
			b.Samples = append(b.Samples, fleet.Sample{DeviceID: id, At: at, Seq: uint64(steps - k), Uptime: &up, CPU: ptr(cpu), Temperature: ptr(temp),
				RxBytes: &r, TxBytes: &t, RSSI: ptr(rssi), RSRP: ptr(rsrp), SINR: ptr(sinr)})
		}
		b.States = append(b.States, fleet.StateRecord{DeviceID: id, Firmware: p.fw, LastSeen: now, Seq: uint64(steps), State: json.RawMessage(state)})
	}
	if err := st.Commit(ctx, b); err != nil {
		t.Fatal(err)
	}
}

func ptr(v float64) *float64 { return &v }

// startBrowser starts a headless chromium for the test, for at most
// timeout; problems returns the script errors and console errors (CSP
// violations among them) it reported so far.
func startBrowser(t *testing.T, chrome string, timeout time.Duration) (ctx context.Context, problems func() []string) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("headless", true), chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("ignore-certificate-errors", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1360, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(cancelCtx)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	t.Cleanup(cancel)

	var consoleMu sync.Mutex
	var seen []string
	listen := func(ev any) {
		consoleMu.Lock()
		defer consoleMu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventExceptionThrown:
			seen = append(seen, "exception: "+e.ExceptionDetails.Text)
		case *log.EventEntryAdded:
			if e.Entry.Level == log.EntryLevelError && !strings.Contains(e.Entry.Text, "status of 400") {
				seen = append(seen, "console: "+e.Entry.Text)
			}
		}
	}
	if err := chromedp.Listen(ctx, listen); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx, func() []string {
		consoleMu.Lock()
		defer consoleMu.Unlock()
		return slices.Clone(seen)
	}
}

// hookReceiver records webhook POSTs.
type hookReceiver struct {
	mu     sync.Mutex
	bodies []alert.WebhookBody
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var b alert.WebhookBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	h.mu.Lock()
	h.bodies = append(h.bodies, b)
	h.mu.Unlock()
}

func (h *hookReceiver) events() []alert.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []alert.Event
	for _, b := range h.bodies {
		out = append(out, b.Events...)
	}
	return out
}

func TestBrowser(t *testing.T) {
	chrome := findChromium(t)
	now := time.Now().UTC()
	dir := t.TempDir()
	sd := &fleetSeed{devices: 10000, target: 4242, history: []int{4242, 17, 18}}
	start := time.Now()
	seedDatabase(t, filepath.Join(dir, "drover.db"), sd, now)
	srv := servertest.Start(t, servertest.Options{DataDir: dir, Configure: func(c *server.Config) { c.PushInterval = 200 }})
	t.Logf("10,000 devices seeded and loaded in %v", time.Since(start).Round(time.Millisecond))
	if n := srv.Srv.Fleet().Stats().Devices; n != sd.devices {
		t.Fatalf("server loaded %d devices", n)
	}
	hook := &hookReceiver{}
	hookSrv := httptest.NewServer(hook)
	defer hookSrv.Close()

	shots := os.Getenv("DROVER_SCREENSHOTS") // e.g. docs/screenshots (relative to the repository)
	if shots != "" && !filepath.IsAbs(shots) {
		shots = filepath.Join("..", "..", shots)
	}

	ctx, problems := startBrowser(t, chrome, 100*time.Second)
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(v)
	}
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
		if err != nil {
			t.Fatalf("count %s: %v", sel, err)
		}
		return n
	}
	evalBool := func(expr string) bool {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		return v
	}
	shot := func(name string) {
		t.Helper()
		if shots == "" {
			return
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base := srv.URL + "/ui/"
	id := func(v string) chromedp.ID { return chromedp.ID(v) }
	css := func(v string) chromedp.CSS { return chromedp.CSS(v) }

	// 1. Log in.
	do("login page", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(id("password")))
	shot("login")
	do("log in", chromedp.SendKeys(id("password"), srv.AdminToken), chromedp.Submit(id("login")), chromedp.WaitVisible(id("status")))
	if level, _ := chromedp.Run(ctx, chromedp.AttributeValue(id("status"), "class")); !strings.Contains(level.Value, "yellow") {
		t.Fatalf("status light %q: the seed has late and offline devices", level.Value)
	}

	// 2. Find one device among 10,000 by filter.
	target := sd.machines[sd.target]
	do("devices", chromedp.Navigate(base+"devices"), chromedp.WaitVisible(id("devices")))
	if sum := text("#summary"); !strings.Contains(sum, "10,000 devices") {
		t.Fatalf("devices summary %q", sum)
	}
	shot("devices")
	do("filter", chromedp.SetValue(css(`select[name="device_type"]`), "ICR-4461"), chromedp.SendKeys(id("q"), target),
		chromedp.Click(id("apply")), chromedp.WaitVisible(css(`a[href="/ui/devices/4243"]`)))
	if sum := text("#summary"); !strings.HasPrefix(sum, "1 matching devices") {
		loc, _ := chromedp.Run(ctx, chromedp.Location())
		t.Fatalf("filtered summary %q at %s:\n%s", sum, loc, text("#devices"))
	}
	if n := count("#devices tbody tr"); n != 1 {
		t.Fatalf("%d rows after filtering", n)
	}

	// 3. Its page shows the charts.
	do("device page", chromedp.Click(css(`a[href="/ui/devices/4243"]`)), chromedp.WaitVisible(id("charts")))
	if n := count("#charts svg.chart"); n != 4 {
		t.Fatalf("%d charts", n)
	}
	if n := count("#charts svg.chart polyline.line"); n < 7 { // CPU, temperature, 2 traffic, 3 signal
		t.Fatalf("%d chart lines", n)
	}

	// 4. Edit the profile: the device goes Sync pending, then Synchronized
	// after its next push.
	do("profile", chromedp.Navigate(base+"profiles/3"), chromedp.WaitVisible(id("config")))
	do("invalid JSON", chromedp.SetValue(id("config"), `{"apn": "iot.example",}`))
	if !evalBool(`document.getElementById("config").dispatchEvent(new Event("input")); document.getElementById("save").disabled`) {
		t.Fatal("the save button stays enabled with invalid JSON")
	}
	if msg := text("#jsonerror"); !strings.Contains(msg, "Not valid JSON") {
		t.Fatalf("JSON error shown: %q", msg)
	}
	do("valid JSON", chromedp.SetValue(id("config"), `{"apn": "iot.example", "wifi": {"ssid": "field"}}`))
	if evalBool(`document.getElementById("config").dispatchEvent(new Event("input")); document.getElementById("save").disabled`) {
		t.Fatal("the save button stays disabled with valid JSON")
	}
	do("save profile", chromedp.Click(id("save")), chromedp.WaitVisible(id("flash")))
	if flash := text("#flash"); !strings.Contains(flash, "version 1") {
		t.Fatalf("flash %q", flash)
	}
	shot("profile")
	do("device pending", chromedp.Navigate(base+"devices/4243"), chromedp.WaitVisible(id("syncstate")))
	if st := text("#syncstate"); st != "sync pending" {
		t.Fatalf("after the profile change the device is %q", st)
	}
	tok := sd.tokens[sd.target]
	resp := devicePush(t, srv, tok, 1000, 0, 45) // the device learns version 1 ...
	if resp.Config == nil || resp.Config.Version != 1 || !strings.Contains(string(resp.Config.Data), "iot.example") {
		t.Fatalf("push answer %+v", resp)
	}
	devicePush(t, srv, tok, 1001, 1, 45) // ... applies it and says so
	do("device synchronized", chromedp.Reload(), chromedp.WaitVisible(id("synchistory")))
	if st := text("#syncstate"); st != "synchronized" {
		t.Fatalf("after applying, the device is %q", st)
	}
	if h := text("#synchistory"); !strings.Contains(h, "sync pending") || !strings.Contains(h, "1 / 1") {
		t.Fatalf("sync history %q", h)
	}

	// 5. An alert rule with a webhook: raised, shown, received.
	do("new rule", chromedp.Navigate(base+"alerts/rules/new"), chromedp.WaitVisible(id("ruleform")),
		chromedp.SendKeys(id("rulename"), "Hot router"), chromedp.SetValue(id("kind"), "temperature_above"),
		chromedp.SetValue(id("threshold"), "75"), chromedp.SetValue(css(`select[name="severity"]`), "critical"),
		chromedp.SendKeys(id("webhook"), hookSrv.URL+"/drover"), chromedp.Click(id("saverule")), chromedp.WaitVisible(id("rules")))
	shot("rules")
	devicePush(t, srv, tok, 1002, 1, 82.5)
	if !testwait.Until(15*time.Second, func() bool { return len(hook.events()) > 0 }) {
		t.Fatal("the webhook received nothing")
	}
	ev := hook.events()[0]
	if ev.Rule != "Hot router" || ev.DeviceID != 4243 || ev.State != alert.Raised || ev.Value != 82.5 || ev.Severity != alert.Critical {
		t.Fatalf("webhook event %+v", ev)
	}
	do("alerts page", chromedp.Navigate(base+"alerts"), chromedp.WaitVisible(id("active")))
	if a := text("#active"); !strings.Contains(a, "Hot router") || !strings.Contains(a, "4243") || !strings.Contains(a, "82.5 °C") {
		t.Fatalf("active alerts %q", a)
	}
	shot("alerts")
	do("deliveries", chromedp.Navigate(base+"alerts/deliveries"), chromedp.WaitVisible(id("deliveries")))
	if d := text("#deliveries"); !strings.Contains(d, "delivered") || !strings.Contains(d, hookSrv.URL) {
		t.Fatalf("deliveries %q", d)
	}
	shot("notifications")
	do("overview", chromedp.Navigate(base), chromedp.WaitVisible(id("status")))
	if r := text("#statusreasons"); !strings.Contains(r, "1 alert raised") || !strings.Contains(r, "devices offline") {
		t.Fatalf("status reasons %q", r)
	}
	shot("overview")
	do("device again", chromedp.Navigate(base+"devices/4243"), chromedp.WaitVisible(id("alerthistory")))
	shot("device")
	if m := metrics(t, srv); !strings.Contains(m, `drover_alerts_active{rule="Hot router"} 1`+"\n") ||
		!strings.Contains(m, `drover_alert_notifications_total{channel="webhook",outcome="delivered"} 1`+"\n") {
		t.Fatalf("alert metrics missing from:\n%s", m)
	}

	// 6. Labels: assign to a filtered set from the devices page.
	do("label", chromedp.Navigate(base+"devices?device_type=ICR-2031"), chromedp.WaitVisible(id("bulk")),
		chromedp.SendKeys(id("labelname"), "north-field"), chromedp.Click(id("addlabel")), chromedp.WaitVisible(id("flash")))
	if flash := text("#flash"); !strings.Contains(flash, "added to 2,500 devices") {
		t.Fatalf("label flash %q", flash)
	}
	do("labels page", chromedp.Navigate(base+"labels"), chromedp.WaitVisible(id("labels")))
	shot("labels")
	// The labels page's form stages new values of the label as a
	// configuration rollout; aborted at once, the label keeps no values.
	do("stage label values", chromedp.SetValue(id("cr_label"), "north-field"), chromedp.SetValue(id("cr_values"), `{"apn": "north.iot"}`),
		chromedp.SetValue(id("cr_waves"), "1, 100%"), chromedp.Click(id("stageconfig")), chromedp.WaitVisible(id("rostate")))
	if st, f := text("#rostate"), text("#flash"); st != "running" || !strings.Contains(f, "label north-field") {
		t.Fatalf("configuration rollout %q, flash %q", st, f)
	}
	ros := srv.Srv.Fleet().Rollouts()
	if len(ros) != 1 || ros[0].Config == nil || ros[0].Config.Label != "north-field" || strings.Join(ros[0].Waves, ",") != "1,100%" {
		t.Fatalf("rollouts after the form: %+v", ros)
	}
	if _, err := srv.Srv.Fleet().ControlRollout(context.Background(), ros[0].ID, fleet.ActionAbort, "test"); err != nil {
		t.Fatal(err)
	}

	// 7. Commands: send one to the label, pause it, see a device not get
	// it, resume, see it delivered, cancel the rest.
	do("commands page", chromedp.Navigate(base+"commands"), chromedp.WaitVisible(id("sendform")),
		chromedp.SetValue(id("cmdkind"), "ping"), chromedp.SendKeys(id("cmdargs"), "-f"), chromedp.SetValue(id("cmdlabel"), "north-field"),
		chromedp.Click(id("sendcmd")), chromedp.WaitVisible(id("flash")))
	if flash := text("#flash"); !strings.Contains(flash, "not sent") || !strings.Contains(flash, "not starting with '-'") {
		t.Fatalf("unsafe ping argument: flash %q", flash)
	}
	// Each click below starts on a page without a flash: a flash seen is the answer's.
	do("send command", chromedp.Navigate(base+"commands"), chromedp.WaitVisible(id("sendform")), chromedp.SetValue(id("cmdkind"), "ping"), chromedp.SendKeys(id("cmdargs"), "192.0.2.1"),
		chromedp.SetValue(id("cmdlabel"), "north-field"), chromedp.Click(id("sendcmd")), chromedp.WaitVisible(id("flash")))
	if flash := text("#flash"); !strings.Contains(flash, "queued for 2,500 devices") {
		t.Fatalf("command flash %q", flash)
	}
	srv.Srv.Fleet().WaitCommands()
	do("pause command", chromedp.Navigate(base+"commands"), chromedp.Click(id("pause-1")), chromedp.WaitVisible(id("resume-1")))
	labelled := -1
	for i := range sd.devices {
		if i%len(seedTypes) == 3 && sd.tokens[i] != "" { // ICR-2031: the labelled ones
			labelled = i
			break
		}
	}
	if labelled < 0 {
		t.Fatal("no labelled device with a token in the seed")
	}
	if a := devicePush(t, srv, sd.tokens[labelled], 100, 0, 40); len(a.Commands) != 0 {
		t.Fatalf("paused command delivered: %+v", a.Commands)
	}
	do("resume command", chromedp.Click(id("resume-1")), chromedp.WaitVisible(id("pause-1")))
	if a := devicePush(t, srv, sd.tokens[labelled], 101, 0, 40); len(a.Commands) != 1 || a.Commands[0].Kind != "ping" {
		t.Fatalf("resumed command not delivered: %+v", a.Commands)
	}
	do("commands again", chromedp.Navigate(base+"commands"), chromedp.WaitVisible(id("cancel-1")))
	evalBool("(window.confirm = () => true, true)") // the cancel form asks first
	do("cancel command", chromedp.Click(id("cancel-1")), chromedp.WaitVisible(id("flash")))
	if st := text("#job-1 .state"); st != "cancelled" {
		t.Fatalf("job state after cancel %q", st)
	}
	shot("commands")

	// 8. Profile history: the change of step 4 by the dashboard, a second
	// one with its diff, and a rollback to the first.
	do("profile history", chromedp.Navigate(base+"profiles/3"), chromedp.WaitVisible(id("history")))
	if h := text("#history"); !strings.Contains(h, "dashboard") || !strings.Contains(h, "updated") {
		t.Fatalf("history %q", h)
	}
	do("second change", chromedp.SetValue(id("config"), `{"apn": "iot.other", "wifi": {"ssid": "field"}}`),
		chromedp.Click(id("save")), chromedp.WaitVisible(id("flash")))
	if d := text(`tr.rev[data-rev="2"] td.diff`); !strings.Contains(d, `changed /apn: "iot.example" → "iot.other"`) {
		t.Fatalf("diff of revision 2: %q", d)
	}
	do("rollback", chromedp.Evaluate[chromedp.Void](`document.querySelector('tr.rev[data-rev="1"] form').submit()`), chromedp.WaitVisible(css(`tr.rev[data-rev="3"]`)))
	if h := text(`tr.rev[data-rev="3"]`); !strings.Contains(h, "rollback to revision 1") {
		t.Fatalf("revision 3: %q", h)
	}
	if p, _ := srv.Srv.Fleet().Profile(3); !strings.Contains(string(p.Config), "iot.example") {
		t.Fatalf("profile after rollback: %s", p.Config)
	}
	shot("profile-history")

	// 9. Firmware: upload through the form (streamed), a rollout to the
	// target device, its state after the device's push, pause.
	img := filepath.Join(t.TempDir(), "icr-4461-7.0.0.bin")
	if err := os.WriteFile(img, []byte(strings.Repeat("firmware ", 100000)), 0o600); err != nil {
		t.Fatal(err)
	}
	do("firmware page", chromedp.Navigate(base+"firmware"), chromedp.WaitVisible(id("uploadform")),
		chromedp.SendKeys(id("fw_type"), "ICR-4461"), chromedp.SendKeys(id("fw_version"), "7.0.0"),
		chromedp.SetUploadFiles(id("fw_file"), []string{img}), chromedp.Click(id("upload")), chromedp.WaitVisible(id("flash")))
	if f := text("#flash"); !strings.Contains(f, "900,000 bytes") {
		t.Fatalf("upload flash %q", f)
	}
	if fws := srv.Srv.Fleet().Firmware(); len(fws) != 1 || fws[0].Size != 900000 || fws[0].By != "dashboard" {
		t.Fatalf("firmware after upload: %+v", fws)
	}
	do("start rollout", chromedp.SendKeys(id("ro_filter"), "q="+target), chromedp.SetValue(id("ro_waves"), "1"),
		chromedp.Click(id("startrollout")), chromedp.WaitVisible(id("rostate")))
	if st := text("#rostate"); st != "running" {
		t.Fatalf("rollout state %q", st)
	}
	if err := srv.Srv.Fleet().RolloutStep(context.Background()); err != nil {
		t.Fatal(err)
	}
	devicePush(t, srv, tok, 1003, 1, 45) // offered the firmware: downloading
	do("rollout page", chromedp.Reload(), chromedp.WaitVisible(id("rodevices")))
	if c := text(`span.count[data-state="downloading"]`); c != "1" {
		t.Fatalf("downloading count %q; devices %q", c, text("#rodevices"))
	}
	shot("rollout")
	do("pause", chromedp.Click(id("pause")), chromedp.WaitVisible(id("resume")))
	if st := text("#rostate"); st != "paused" {
		t.Fatalf("after pause: %q", st)
	}

	// 10. A viewer logs in with user name and password: the pages show no
	// control that changes anything.
	req, _ := http.NewRequest("POST", srv.URL+"/api/v1/users", strings.NewReader(`{"name":"vera","role":"viewer","password":"vera-password"}`))
	req.Header.Set("Authorization", "Bearer "+srv.AdminToken)
	if resp, err := srv.Client().Do(req); err != nil || resp.StatusCode != 201 {
		t.Fatalf("create viewer: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	do("firmware list", chromedp.Navigate(base+"firmware"), chromedp.WaitVisible(id("firmware")))
	if f := text("#firmware"); !strings.Contains(f, "ICR-4461") || !strings.Contains(f, "7.0.0") {
		t.Fatalf("firmware list %q", f)
	}
	shot("firmware")
	do("users page", chromedp.Navigate(base+"users"), chromedp.WaitVisible(id("users")))
	if u := text("#users"); !strings.Contains(u, "vera") || !strings.Contains(u, "viewer") {
		t.Fatalf("users %q", u)
	}
	shot("users")
	do("audit page", chromedp.Navigate(base+"audit"), chromedp.WaitVisible(id("audit")))
	if a := text("#audit"); !strings.Contains(a, "vera") || !strings.Contains(a, "rollouts") {
		t.Fatalf("audit log %q", a)
	}
	shot("audit")
	do("log out", chromedp.Submit(css("form.logout")), chromedp.WaitVisible(id("password")))
	do("log in as a viewer", chromedp.SetValue(id("username"), "vera"), chromedp.SendKeys(id("password"), "vera-password"),
		chromedp.Submit(id("login")), chromedp.WaitVisible(id("status")))
	if who := text("#who"); who != "vera (viewer)" {
		t.Fatalf("header names %q", who)
	}
	do("viewer's commands page", chromedp.Navigate(base+"commands"), chromedp.WaitVisible(id("jobs")))
	if n := count("#sendform") + count(`button[id^="pause-"]`) + count(`button[id^="resume-"]`) + count(`button[id^="cancel-"]`); n != 0 {
		t.Fatalf("a viewer sees %d command controls", n)
	}
	do("viewer's profile page", chromedp.Navigate(base+"profiles/3"), chromedp.WaitVisible(id("config")))
	if count("#save") != 0 || !evalBool(`document.getElementById("config").matches(":disabled")`) {
		t.Fatal("a viewer can edit a profile")
	}

	if p := problems(); len(p) > 0 {
		t.Fatalf("the browser reported problems (CSP violations or script errors):\n%s", strings.Join(p, "\n"))
	}
}

// metrics reads /metrics (servertest.Metric cannot read label values with
// spaces).
func metrics(t *testing.T, srv *servertest.Server) string {
	t.Helper()
	return srv.MetricsText()
}

type pushAnswer struct {
	PushInterval int `json:"push_interval"`
	Config       *struct {
		Version int64           `json:"version"`
		Data    json.RawMessage `json:"data"`
	} `json:"config"`
	Commands []struct {
		Kind string `json:"kind"`
	} `json:"commands"`
}

// devicePush pushes as a device does, over HTTPS.
func devicePush(t *testing.T, srv *servertest.Server, token string, seq, applied int64, temp float64) pushAnswer {
	t.Helper()
	body := fmt.Sprintf(`{"seq":%d,"config_version":%d,"state":{"uptime":200000,"cpu":20,"temperature":%g,"signal":{"rssi":-71}}}`, seq, applied, temp)
	req, _ := http.NewRequest("POST", srv.URL+"/api/v1/push", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("push: %d %s", resp.StatusCode, raw)
	}
	var a pushAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatal(err)
	}
	return a
}
