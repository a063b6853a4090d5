package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
)

func (h *Handler) notFound(w http.ResponseWriter, r *http.Request, s *session, msg string) {
	h.render(w, r, http.StatusNotFound, "error", s, page{Title: "Not found", Data: msg})
}

func (h *Handler) serverError(w http.ResponseWriter, r *http.Request, s *session, err error) {
	h.log.Error("dashboard request failed", "path", r.URL.Path, "err", err)
	h.render(w, r, http.StatusServiceUnavailable, "error", s, page{Title: "Unavailable", Data: "The request failed: " + err.Error()})
}

// ---- overview ----

type countLink struct {
	Name  string
	Class string
	Count int
	Pct   float64
	URL   string
}

type overviewData struct {
	SyncRows, LiveRows []countLink
	Active             []alert.Event
	ActiveTotal        int
	Profiles           int
	PendingProfiles    []profileRow
	Nodes              []nodeRow // cluster mode
	NodesErr           string
}

// nodeRow is one cluster node on the overview.
type nodeRow struct {
	fleet.ClusterNode
	Self, Alive bool
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request, s *session) {
	st := h.status()
	d := overviewData{Profiles: len(h.fleet.Profiles())}
	for _, v := range fleet.AllSyncStates() {
		d.SyncRows = append(d.SyncRows, countLink{v.String(), v.String(), st.Sync[v], percent(st.Sync[v], st.Devices),
			Prefix + "devices?sync_state=" + v.String()})
	}
	for _, v := range fleet.AllLiveness() {
		d.LiveRows = append(d.LiveRows, countLink{v.String(), v.String(), st.Live[v], percent(st.Live[v], st.Devices),
			Prefix + "devices?liveness=" + v.String()})
	}
	if h.eng != nil {
		d.Active, d.ActiveTotal = h.eng.Active(0, 10)
	}
	for _, p := range h.profileRows() {
		if p.Pending > 0 || p.Errors > 0 {
			d.PendingProfiles = append(d.PendingProfiles, p)
		}
	}
	if h.opts.Cluster != nil {
		nodes, self, err := h.opts.Cluster(r.Context())
		if err != nil {
			d.NodesErr = err.Error()
		}
		for _, n := range nodes {
			d.Nodes = append(d.Nodes, nodeRow{ClusterNode: n, Self: n.Name == self, Alive: h.now().Sub(n.Heartbeat) < 5*time.Second})
		}
	}
	h.render(w, r, http.StatusOK, "overview", s, page{Title: "Overview", Nav: "overview", Data: d})
}

// ---- devices ----

// devFilter is the devices table's state, kept in its URL.
type devFilter struct {
	SyncState, Liveness, DeviceType, Firmware, Label, Q, ProfileID string
	Admission                                                      string
	Quota                                                          string
	Where                                                          string // the filter language (docs/groups.md)
	Sort                                                           string
	Desc                                                           bool
	After                                                          string
	Limit                                                          int
}

var pageSizes = []int{25, 50, 100, 200}

func parseDevFilter(v url.Values) devFilter {
	f := devFilter{
		SyncState: v.Get("sync_state"), Liveness: v.Get("liveness"), DeviceType: v.Get("device_type"),
		Firmware: v.Get("firmware"), Label: v.Get("label"), Q: strings.TrimSpace(v.Get("q")), ProfileID: v.Get("profile_id"),
		Sort: v.Get("sort"), Desc: v.Get("dir") == "desc", After: v.Get("after"), Limit: 50,
		Admission: v.Get(fleet.FilterAdmission), Quota: v.Get(fleet.FilterQuota), Where: strings.TrimSpace(v.Get(fleet.FilterWhere)),
	}
	if n, err := strconv.Atoi(v.Get("limit")); err == nil && n >= 1 && n <= 1000 {
		f.Limit = n
	}
	if _, ok := fleet.ParseSortBy(f.Sort); !ok {
		f.Sort = "id"
	}
	return f
}

// filter converts to the fleet's filter; problems are reported, not fatal.
func (f devFilter) filter(fl *fleet.Service) (fleet.Filter, []string) {
	out, err := fl.ParseFilter(f.values())
	return out, fleet.Problems(err)
}

func (f devFilter) values() url.Values {
	v := url.Values{}
	set := func(k, val string) {
		if val != "" {
			v.Set(k, val)
		}
	}
	set("sync_state", f.SyncState)
	set("liveness", f.Liveness)
	set("device_type", f.DeviceType)
	set("firmware", f.Firmware)
	set("label", f.Label)
	set("q", f.Q)
	set("profile_id", f.ProfileID)
	set(fleet.FilterAdmission, f.Admission)
	set(fleet.FilterQuota, f.Quota)
	set(fleet.FilterWhere, f.Where)
	if f.Sort != "id" {
		set("sort", f.Sort)
	}
	if f.Desc {
		v.Set("dir", "desc")
	}
	set("after", f.After)
	if f.Limit != 50 {
		v.Set("limit", strconv.Itoa(f.Limit))
	}
	return v
}

func (f devFilter) URL() string {
	q := f.values().Encode()
	if q == "" {
		return Prefix + "devices"
	}
	return Prefix + "devices?" + q
}

// SortURL toggles the order by column (first page).
func (f devFilter) SortURL(col string) string {
	g := f
	g.After = ""
	if g.Sort == col {
		g.Desc = !g.Desc
	} else {
		g.Sort, g.Desc = col, col == "last_seen"
	}
	return g.URL()
}

// SortMark shows the order on the column header.
func (f devFilter) SortMark(col string) string {
	if f.Sort != col {
		return ""
	}
	if f.Desc {
		return " ▼"
	}
	return " ▲"
}

func (f devFilter) Filtered() bool {
	return f.SyncState != "" || f.Liveness != "" || f.DeviceType != "" || f.Firmware != "" || f.Label != "" || f.Q != "" || f.ProfileID != "" || f.Admission != "" || f.Quota != "" || f.Where != ""
}

type deviceRow struct {
	fleet.Device
	Labels []string
}

type devicesData struct {
	F                  devFilter
	Rows               []deviceRow
	Total              int
	First, Last        int
	NextURL, FirstURL  string
	ClearURL           string
	Problems           []string
	Types, Firmware    []string
	Labels             []string
	SyncStates         []string
	Livenesses         []string
	Admissions         []string
	Quotas             []string
	Sizes              []int
	Took               time.Duration
	HiddenFilterFields map[string]string
}

func (h *Handler) devices(w http.ResponseWriter, r *http.Request, s *session) {
	f := parseDevFilter(r.URL.Query())
	d := h.devicesData(f)
	h.render(w, r, http.StatusOK, "devices", s, page{Title: "Devices", Nav: "devices", Data: d})
}

func (h *Handler) devicesData(f devFilter) devicesData {
	start := time.Now()
	ff, problems := f.filter(h.fleet)
	by, _ := fleet.ParseSortBy(f.Sort)
	res, err := h.fleet.Query(fleet.Query{Filter: ff, Sort: by, Desc: f.Desc, After: f.After, Limit: f.Limit})
	if errors.Is(err, fleet.ErrCursor) {
		problems = append(problems, "the page link is invalid; showing the first page")
		f.After = ""
		res, _ = h.fleet.Query(fleet.Query{Filter: ff, Sort: by, Desc: f.Desc, Limit: f.Limit})
	}
	d := devicesData{F: f, Total: res.Total, Problems: problems, Labels: h.fleet.LabelNamesSorted(), Sizes: pageSizes,
		HiddenFilterFields: map[string]string{}}
	d.Types, d.Firmware = h.fleet.DeviceTypes()
	for _, v := range fleet.AllSyncStates() {
		d.SyncStates = append(d.SyncStates, v.String())
	}
	for _, v := range fleet.AllLiveness() {
		d.Livenesses = append(d.Livenesses, v.String())
	}
	d.Admissions = fleet.AdmissionFilterNames()
	d.Quotas = fleet.QuotaFilters
	for _, dev := range res.Devices {
		d.Rows = append(d.Rows, deviceRow{Device: dev, Labels: h.fleet.DeviceLabels(dev.ID)})
	}
	if len(d.Rows) > 0 {
		d.First = 1
		d.Last = len(d.Rows)
	}
	if res.Next != "" {
		g := f
		g.After = res.Next
		d.NextURL = g.URL()
	}
	if f.After != "" {
		g := f
		g.After = ""
		d.FirstURL = g.URL()
	}
	d.ClearURL = Prefix + "devices"
	for k, v := range f.values() {
		if k != "after" && k != "sort" && k != "dir" && k != "limit" {
			d.HiddenFilterFields[k] = v[0]
		}
	}
	d.Took = time.Since(start).Round(time.Millisecond)
	return d
}

func (h *Handler) labelDevices(w http.ResponseWriter, r *http.Request, s *session) {
	f := parseDevFilter(r.PostForm)
	f.After = ""
	ff, problems := f.filter(h.fleet)
	back := f.URL()
	name := strings.TrimSpace(r.PostFormValue("label_name"))
	remove := r.PostFormValue("action") == "remove"
	if len(problems) > 0 {
		h.flash(s, "Nothing labelled: "+strings.Join(problems, "; "))
		http.Redirect(w, r, back, http.StatusSeeOther)
		return
	}
	n, err := h.fleet.AssignLabel(r.Context(), name, ff, remove)
	switch {
	case errors.Is(err, fleet.ErrLabelName), errors.Is(err, fleet.ErrLabelLive):
		h.flash(s, "Nothing labelled: "+err.Error())
	case errors.Is(err, fleet.ErrNotFound):
		h.flash(s, fmt.Sprintf("There is no label %q", name))
	case err != nil:
		h.serverError(w, r, s, err)
		return
	case remove:
		h.flash(s, fmt.Sprintf("Label %q removed from %s devices.", name, thousands(n)))
	default:
		h.flash(s, fmt.Sprintf("Label %q added to %s devices.", name, thousands(n)))
	}
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// ---- one device ----

type kv struct{ K, V string }

type devicePage struct {
	D        fleet.Device
	Labels   []string
	State    []kv
	Ifaces   []protocol.Interface
	Extra    []kv
	Charts   []template.HTML
	Range    string
	Ranges   []string
	Samples  int
	Active   []alert.Event
	Events   []alert.Event
	Sync     []alert.SyncEvent
	Problems []string
	Actions  []admitButton   // admission.go
	Quota    *fleet.QuotaHit // quota.go; nil: never hit a quota, not lifted
	// Config is the effective configuration, member by member with its
	// source (profile, label NAME, device); nil: unavailable.
	Config  *fleet.EffectiveConfig
	Members []fleet.ConfigMember
	// Terminal, Download, Upload: the page offers a remote terminal, a
	// file download, a file upload (the server serves them and the user
	// may open one).
	Terminal, Download, Upload bool
}

var ranges = map[string]time.Duration{"1h": time.Hour, "6h": 6 * time.Hour, "24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour}

func (h *Handler) device(w http.ResponseWriter, r *http.Request, s *session) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if err != nil {
		h.notFound(w, r, s, "No device "+r.PathValue("id"))
		return
	}
	dev, err := h.fleet.Device(r.Context(), id)
	if errors.Is(err, fleet.ErrNotFound) {
		h.notFound(w, r, s, "No device "+strconv.FormatUint(id, 10))
		return
	}
	if err != nil {
		h.serverError(w, r, s, err)
		return
	}
	d := devicePage{D: dev, Labels: h.fleet.DeviceLabels(id), Range: r.URL.Query().Get("range"), Ranges: []string{"1h", "6h", "24h", "7d"},
		Actions: admitButtons(dev), Terminal: h.opts.Terminal != nil && actorOf(r).Role.May(access.RemoteAccess),
		Download: h.opts.Download != nil && actorOf(r).Role.May(access.RemoteAccess),
		Upload:   h.opts.Upload != nil && actorOf(r).Role.May(access.RemoteAccess)}
	if q, ok := h.fleet.QuotaOf(id); ok {
		d.Quota = &q
	}
	if e, err := h.fleet.EffectiveConfig(id); err == nil {
		d.Config, d.Members = &e, e.Members()
	}
	span, ok := ranges[d.Range]
	if !ok {
		d.Range, span = "24h", 24*time.Hour
	}
	if len(dev.State) > 0 {
		var st protocol.State
		if err := json.Unmarshal(dev.State, &st); err == nil {
			d.State, d.Ifaces, d.Extra = stateRows(&st)
		}
	}
	to := h.now()
	from := to.Add(-span)
	samples, err := h.fleet.History(r.Context(), id, fleet.HistoryQuery{From: from, To: to.Add(time.Second), Limit: 10000})
	if err != nil {
		d.Problems = append(d.Problems, "history unavailable: "+err.Error())
	}
	d.Samples = len(samples)
	d.Charts = deviceCharts(samples, from, to)
	if h.eng != nil {
		d.Active, _ = h.eng.Active(id, 100)
		if d.Events, err = h.eng.Events(r.Context(), alert.EventQuery{DeviceID: id, Limit: 50}); err != nil {
			d.Problems = append(d.Problems, "alert history unavailable: "+err.Error())
		}
		if d.Sync, err = h.eng.SyncHistory(r.Context(), id, 50); err != nil {
			d.Problems = append(d.Problems, "sync history unavailable: "+err.Error())
		}
	}
	h.render(w, r, http.StatusOK, "device", s, page{Title: "Device " + strconv.FormatUint(id, 10), Nav: "devices", Data: d})
}

func stateRows(st *protocol.State) (rows []kv, ifaces []protocol.Interface, extra []kv) {
	f := func(v *float64, unit string) string {
		if v == nil {
			return ""
		}
		return strconv.FormatFloat(*v, 'f', -1, 64) + unit
	}
	add := func(k, v string) {
		if v != "" {
			rows = append(rows, kv{k, v})
		}
	}
	if st.Uptime != nil {
		add("Uptime", humanDuration(time.Duration(*st.Uptime)*time.Second))
	}
	add("CPU", f(st.CPU, " %"))
	add("Load (1 min)", f(st.Load1, ""))
	if st.MemTotal != nil && st.MemUsed != nil {
		add("Memory", humanBytes(*st.MemUsed)+" of "+humanBytes(*st.MemTotal))
	}
	if st.DiskTotal != nil && st.DiskUsed != nil {
		free := 0.0
		if *st.DiskTotal > 0 {
			free = float64(*st.DiskTotal-*st.DiskUsed) * 100 / float64(*st.DiskTotal)
		}
		add("Disk", fmt.Sprintf("%s of %s used (%.1f %% free)", humanBytes(*st.DiskUsed), humanBytes(*st.DiskTotal), free))
	}
	add("Temperature", f(st.Temperature, " °C"))
	add("Reported firmware", st.Firmware)
	if g := st.Signal; g != nil {
		var parts []string
		for _, p := range []struct {
			n string
			v *float64
			u string
		}{{"RSSI", g.RSSI, " dBm"}, {"RSRP", g.RSRP, " dBm"}, {"RSRQ", g.RSRQ, " dB"}, {"SINR", g.SINR, " dB"}} {
			if p.v != nil {
				parts = append(parts, p.n+" "+f(p.v, p.u))
			}
		}
		add("Signal", strings.Join(parts, ", "))
		add("Operator", strings.TrimSpace(g.Operator+" "+g.Technology))
	}
	for k, v := range st.Extra {
		extra = append(extra, kv{k, v})
	}
	sort.Slice(extra, func(i, j int) bool { return extra[i].K < extra[j].K })
	return rows, st.Interfaces, extra
}

// ---- profiles ----

type profileRow struct {
	fleet.Profile
	Devices, Synced, Pending, Errors, Arriving int
	PendingURL, ErrorURL, DevicesURL           string
}

func (h *Handler) profileRows() []profileRow {
	counts := h.fleet.ProfileSync()
	var rows []profileRow
	for _, p := range h.fleet.Profiles() {
		c := counts[p.ID]
		id := strconv.FormatUint(p.ID, 10)
		rows = append(rows, profileRow{
			Profile: p, Devices: c[0] + c[1] + c[2] + c[3], Arriving: c[fleet.Arriving], Synced: c[fleet.Synchronized],
			Pending: c[fleet.SyncPending], Errors: c[fleet.SyncError],
			PendingURL: Prefix + "devices?profile_id=" + id + "&sync_state=sync_pending",
			ErrorURL:   Prefix + "devices?profile_id=" + id + "&sync_state=sync_error",
			DevicesURL: Prefix + "devices?profile_id=" + id,
		})
	}
	return rows
}

func (h *Handler) profiles(w http.ResponseWriter, r *http.Request, s *session) {
	h.render(w, r, http.StatusOK, "profiles", s, page{Title: "Profiles", Nav: "profiles", Data: h.profilesData()})
}

type profilePage struct {
	P        profileRow
	Config   string
	Interval string
	Error    string
	Pending  []fleet.Device
	// Revisions is the profile's history, newest first, each with its
	// changes from the one before.
	Revisions []revisionView
}

func (h *Handler) findProfile(id string) (profileRow, bool) {
	for _, p := range h.profileRows() {
		if strconv.FormatUint(p.ID, 10) == id {
			return p, true
		}
	}
	return profileRow{}, false
}

func (h *Handler) profile(w http.ResponseWriter, r *http.Request, s *session) {
	p, ok := h.findProfile(r.PathValue("id"))
	if !ok {
		h.notFound(w, r, s, "No profile "+r.PathValue("id"))
		return
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, p.Config, "", "  "); err != nil {
		pretty.Write(p.Config)
	}
	h.showProfile(w, r, s, http.StatusOK, profilePage{P: p, Config: pretty.String(), Interval: strconv.Itoa(p.PushInterval)})
}

func (h *Handler) showProfile(w http.ResponseWriter, r *http.Request, s *session, status int, d profilePage) {
	pending := fleet.SyncPending
	res, _ := h.fleet.Query(fleet.Query{Filter: fleet.Filter{ProfileID: d.P.ID, SyncState: &pending}, Limit: 20})
	d.Pending = res.Devices
	d.Revisions = h.profileRevisions(r.Context(), d.P.ID)
	h.render(w, r, status, "profile", s, page{Title: "Profile " + d.P.DeviceType + " " + d.P.Firmware, Nav: "profiles", Data: d})
}

func (h *Handler) saveProfile(w http.ResponseWriter, r *http.Request, s *session) {
	p, ok := h.findProfile(r.PathValue("id"))
	if !ok {
		h.notFound(w, r, s, "No profile "+r.PathValue("id"))
		return
	}
	d := profilePage{P: p, Config: r.PostFormValue("config"), Interval: strings.TrimSpace(r.PostFormValue("push_interval"))}
	var u fleet.ProfileUpdate
	cfg, err := fleet.NormalizeConfig([]byte(d.Config))
	var iv int
	if err == nil {
		iv, err = fleet.ParsePushInterval(d.Interval)
	}
	if err != nil {
		d.Error = err.Error()
		h.showProfile(w, r, s, http.StatusBadRequest, d)
		return
	}
	// The domain decides what is a change (fleet.SameConfig), as for the API.
	u.Config, u.PushInterval, u.By = cfg, &iv, byOf(r)
	np, changed, err := h.fleet.ApplyProfileUpdate(r.Context(), p.ID, u)
	if err != nil {
		h.serverError(w, r, s, err)
		return
	}
	if !changed {
		h.flash(s, "No changes to save.")
		http.Redirect(w, r, Prefix+"profiles/"+r.PathValue("id"), http.StatusSeeOther)
		return
	}
	msg := "Saved."
	if np.Version != p.Version {
		msg = fmt.Sprintf("Saved configuration version %d: the profile's %s devices are Sync pending until they report it applied.",
			np.Version, thousands(p.Devices))
	}
	if np.PushInterval != p.PushInterval {
		msg += fmt.Sprintf(" Push interval now %d s (devices learn it at their next push).", iv)
	}
	h.log.Info("profile changed from the dashboard", "profile_id", p.ID, "version", np.Version)
	h.flash(s, msg)
	http.Redirect(w, r, Prefix+"profiles/"+r.PathValue("id"), http.StatusSeeOther)
}

// ---- labels ----

// labelsPage lists the labels, with what the form staging a label's new
// values offers.
type labelsPage struct {
	Labels   []fleet.Label
	Policies []fleet.RolloutPolicy
	Defaults fleet.RolloutSpec
}

func (h *Handler) labels(w http.ResponseWriter, r *http.Request, s *session) {
	h.render(w, r, http.StatusOK, "labels", s, page{Title: "Labels", Nav: "labels", Data: labelsPage{
		Labels: h.fleet.Labels(), Policies: h.fleet.RolloutPolicies(), Defaults: fleet.DefaultRolloutSpec(),
	}})
}

func (h *Handler) createLabel(w http.ResponseWriter, r *http.Request, s *session) {
	name := strings.TrimSpace(r.PostFormValue("name"))
	if expr := strings.TrimSpace(r.PostFormValue("filter")); expr != "" {
		h.defineLabel(w, r, s, name, expr)
		return
	}
	if _, err := h.fleet.CreateLabel(r.Context(), name); err != nil {
		if !errors.Is(err, fleet.ErrLabelName) && !errors.Is(err, fleet.ErrTooManyIDs) {
			h.serverError(w, r, s, err)
			return
		}
		h.flash(s, "Label not created: "+err.Error())
	} else {
		h.flash(s, fmt.Sprintf("Label %q created. Assign it from the devices table: filter, then \"Add label\".", name))
	}
	http.Redirect(w, r, Prefix+"labels", http.StatusSeeOther)
}

// defineLabel makes a live label, or changes its filter (docs/groups.md).
func (h *Handler) defineLabel(w http.ResponseWriter, r *http.Request, s *session, name, expr string) {
	l, err := h.fleet.DefineLabel(r.Context(), name, expr)
	switch {
	case errors.Is(err, fleet.ErrLabelName), errors.Is(err, fleet.ErrTooManyIDs), errors.Is(err, fleet.ErrInvalid), errors.Is(err, fleet.ErrLabelLive):
		h.flash(s, "Live label not saved: "+err.Error())
	case err != nil:
		h.serverError(w, r, s, err)
		return
	default:
		h.flash(s, fmt.Sprintf("Live label %q: %s devices match %s.", l.Name, thousands(l.Devices), l.Filter))
	}
	http.Redirect(w, r, Prefix+"labels", http.StatusSeeOther)
}

func (h *Handler) deleteLabel(w http.ResponseWriter, r *http.Request, s *session) {
	name := r.PostFormValue("name")
	if err := h.fleet.DeleteLabel(r.Context(), name); errors.Is(err, fleet.ErrLabelInUse) {
		h.flash(s, "Label not deleted: "+err.Error())
		http.Redirect(w, r, Prefix+"labels", http.StatusSeeOther)
		return
	} else if err != nil && !errors.Is(err, fleet.ErrNotFound) {
		h.serverError(w, r, s, err)
		return
	}
	h.flash(s, fmt.Sprintf("Label %q deleted.", name))
	http.Redirect(w, r, Prefix+"labels", http.StatusSeeOther)
}

// ---- alerts ----

type alertsData struct {
	Active      []alert.Event
	ActiveTotal int
	Events      []alert.Event
	NextURL     string
	Rules       int
	Failed      int
}

func (h *Handler) alerts(w http.ResponseWriter, r *http.Request, s *session) {
	var d alertsData
	d.Active, d.ActiveTotal = h.eng.Active(0, 200)
	before, _ := strconv.ParseUint(r.URL.Query().Get("before"), 10, 64)
	evs, err := h.eng.Events(r.Context(), alert.EventQuery{Before: before, Limit: 50})
	if err != nil {
		h.serverError(w, r, s, err)
		return
	}
	d.Events = evs
	if len(evs) == 50 {
		d.NextURL = Prefix + "alerts?before=" + strconv.FormatUint(evs[len(evs)-1].ID, 10)
	}
	d.Rules = len(h.eng.Rules())
	for _, dl := range h.eng.Deliveries() {
		if dl.State == alert.Failed {
			d.Failed++
		}
	}
	h.render(w, r, http.StatusOK, "alerts", s, page{Title: "Alerts", Nav: "alerts", Data: d})
}

type ruleRow struct {
	alert.Rule
	Active int
}

func (h *Handler) rules(w http.ResponseWriter, r *http.Request, s *session) {
	active := h.eng.ActiveByRule()
	var rows []ruleRow
	for _, rl := range h.eng.Rules() {
		rows = append(rows, ruleRow{rl, active[rl.ID]})
	}
	h.render(w, r, http.StatusOK, "rules", s, page{Title: "Alert rules", Nav: "rules", Data: rows})
}

type ruleFormData struct {
	R        alert.Rule
	New      bool
	Email    string
	Error    string
	Kinds    []alert.Kind
	Labels   []string
	Types    []string
	ValueStr string
}

func (h *Handler) ruleForm(w http.ResponseWriter, r *http.Request, s *session) {
	d := ruleFormData{New: true, R: alert.Rule{Kind: alert.TemperatureAbove, Threshold: 80, Severity: alert.Warning}}
	if id := r.PathValue("id"); id != "" {
		n, _ := strconv.ParseUint(id, 10, 64)
		rl, ok := h.eng.Rule(n)
		if !ok {
			h.notFound(w, r, s, "No rule "+id)
			return
		}
		d.R, d.New = rl, false
		d.Email = strings.Join(rl.Email, ", ")
	}
	h.showRuleForm(w, r, s, http.StatusOK, d)
}

func (h *Handler) showRuleForm(w http.ResponseWriter, r *http.Request, s *session, status int, d ruleFormData) {
	d.Kinds, d.Labels = alert.Kinds(), h.fleet.LabelNamesSorted()
	d.Types, _ = h.fleet.DeviceTypes()
	title := "New alert rule"
	if !d.New {
		title = "Alert rule " + d.R.Name
	}
	h.render(w, r, status, "rule", s, page{Title: title, Nav: "rules", Data: d})
}

func (h *Handler) saveRule(w http.ResponseWriter, r *http.Request, s *session) {
	f := r.PostForm
	d := ruleFormData{New: r.PathValue("id") == "", Email: f.Get("email")}
	rl := alert.Rule{
		Name: f.Get("name"), Kind: alert.Kind(f.Get("kind")), Label: f.Get("label"), DeviceType: f.Get("device_type"),
		Severity: f.Get("severity"), Webhook: strings.TrimSpace(f.Get("webhook")), Disabled: f.Get("disabled") == "on",
	}
	var problems []string
	num := func(name string, dst any) {
		v := strings.TrimSpace(f.Get(name))
		if v == "" {
			return
		}
		var err error
		switch p := dst.(type) {
		case *float64:
			*p, err = strconv.ParseFloat(v, 64)
		case *int:
			*p, err = strconv.Atoi(v)
		case *int64:
			*p, err = strconv.ParseInt(v, 10, 64)
		}
		if err != nil {
			problems = append(problems, name+" must be a number")
		}
	}
	num("threshold", &rl.Threshold)
	num("pushes", &rl.Pushes)
	num("seconds", &rl.Seconds)
	for _, a := range strings.Split(d.Email, ",") {
		if a = strings.TrimSpace(a); a != "" {
			rl.Email = append(rl.Email, a)
		}
	}
	d.R = rl
	if len(problems) > 0 {
		d.Error = strings.Join(problems, "; ")
		h.showRuleForm(w, r, s, http.StatusBadRequest, d)
		return
	}
	var err error
	if d.New {
		rl, err = h.eng.CreateRule(r.Context(), rl)
	} else {
		id, _ := strconv.ParseUint(r.PathValue("id"), 10, 64)
		d.R.ID = id
		rl, err = h.eng.UpdateRule(r.Context(), id, rl)
	}
	if errors.Is(err, alert.ErrNotFound) {
		h.notFound(w, r, s, "No rule "+r.PathValue("id"))
		return
	}
	if err != nil {
		d.Error = err.Error()
		h.showRuleForm(w, r, s, http.StatusBadRequest, d)
		return
	}
	h.flash(s, fmt.Sprintf("Rule %q saved: %s, %s.", rl.Name, rl.Summary(), rl.Target()))
	http.Redirect(w, r, Prefix+"alerts/rules", http.StatusSeeOther)
}

func (h *Handler) deleteRule(w http.ResponseWriter, r *http.Request, s *session) {
	id, _ := strconv.ParseUint(r.PathValue("id"), 10, 64)
	rl, _ := h.eng.Rule(id)
	if err := h.eng.DeleteRule(r.Context(), id); err != nil && !errors.Is(err, alert.ErrNotFound) {
		h.serverError(w, r, s, err)
		return
	}
	h.flash(s, fmt.Sprintf("Rule %q deleted; its active alerts were cleared.", rl.Name))
	http.Redirect(w, r, Prefix+"alerts/rules", http.StatusSeeOther)
}

type deliveriesData struct {
	Deliveries []alert.Delivery
	Queued     map[string]int
	Dropped    map[string]int
}

func (h *Handler) deliveries(w http.ResponseWriter, r *http.Request, s *session) {
	d := deliveriesData{Deliveries: h.eng.Deliveries()}
	d.Queued, d.Dropped = h.eng.Queued()
	h.render(w, r, http.StatusOK, "deliveries", s, page{Title: "Notifications", Nav: "deliveries", Data: d})
}

// ---- settings ----

type settingsData struct {
	S     alert.SMTPSettings
	Error string
}

func (h *Handler) settings(w http.ResponseWriter, r *http.Request, s *session) {
	h.render(w, r, http.StatusOK, "settings", s, page{Title: "Settings", Nav: "settings", Data: settingsData{S: h.eng.SMTP()}})
}

func (h *Handler) saveSettings(w http.ResponseWriter, r *http.Request, s *session) {
	f := r.PostForm
	in := alert.SMTPSettings{
		Addr: strings.TrimSpace(f.Get("addr")), From: strings.TrimSpace(f.Get("from")), Username: strings.TrimSpace(f.Get("username")),
		Password: f.Get("password"), TLS: f.Get("tls"),
	}
	if _, err := h.eng.SetSMTP(r.Context(), in); err != nil {
		in.Password = ""
		h.render(w, r, http.StatusBadRequest, "settings", s, page{Title: "Settings", Nav: "settings", Data: settingsData{S: in, Error: err.Error()}})
		return
	}
	h.flash(s, "E-mail settings saved.")
	http.Redirect(w, r, Prefix+"settings", http.StatusSeeOther)
}
