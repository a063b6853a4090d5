package ctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Filter selects devices as the devices list does (its query parameters;
// the same filter as labels/assign and commands take as JSON).
type Filter struct {
	SyncState  string   `json:"sync_state,omitempty"`
	Liveness   string   `json:"liveness,omitempty"`
	DeviceType string   `json:"device_type,omitempty"`
	Firmware   string   `json:"firmware,omitempty"`
	ProfileID  string   `json:"profile_id,omitempty"`
	Q          string   `json:"q,omitempty"`
	Labels     []string `json:"labels,omitempty"`
	// Where is an expression of the filter language (docs/groups.md).
	Where string `json:"where,omitempty"`
}

// Empty tells whether f selects every device.
func (f Filter) Empty() bool {
	return f.SyncState == "" && f.Liveness == "" && f.DeviceType == "" && f.Firmware == "" && f.ProfileID == "" && f.Q == "" && len(f.Labels) == 0 && f.Where == ""
}

// Values is f as the devices list's query parameters.
func (f Filter) Values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"sync_state": f.SyncState, "liveness": f.Liveness, "device_type": f.DeviceType,
		"firmware": f.Firmware, "profile_id": f.ProfileID, "q": f.Q, "where": f.Where} {
		if s != "" {
			v.Set(k, s)
		}
	}
	for _, l := range f.Labels {
		v.Add("label", l)
	}
	return v
}

// DeviceQuery is GET /api/v1/devices: the filter, and the list's own
// parameters (empty: the API's default).
type DeviceQuery struct {
	Filter
	Admission, Quota string
	Sort, Dir        string
	Limit            int
	Cursor           string
}

var deviceCols = cols("ID=id", "MACHINE ID=machine_id", "TYPE=device_type", "FIRMWARE=firmware", "SYNC=sync_state",
	"LIVENESS=liveness", "ADMISSION=admission", "LAST SEEN=last_seen")

// Devices lists devices; with OutputCSV the API's CSV export of every
// matching device is copied to Stdout as it streams.
func (c *Client) Devices(ctx context.Context, q DeviceQuery) error {
	v := q.Filter.Values()
	for k, s := range map[string]string{"admission": q.Admission, "quota": q.Quota, "sort": q.Sort, "dir": q.Dir, "cursor": q.Cursor} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if c.cfg.Output == OutputCSV {
		v.Set("format", "csv")
		resp, err := c.send(ctx, "GET", "/api/v1/devices", v, nil, "text/csv")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(c.cfg.Stdout, resp.Body)
		return err
	}
	raw, err := c.do(ctx, "GET", "/api/v1/devices", v, nil)
	if err != nil {
		return err
	}
	return c.list(raw, "devices", deviceCols)
}

// Device shows one device.
func (c *Client) Device(ctx context.Context, id string) error {
	return c.show(ctx, "/api/v1/devices/"+url.PathEscape(id))
}

// HistoryQuery bounds a device's history: RFC 3339 times and a number of
// samples (empty, 0: the API's defaults).
type HistoryQuery struct {
	From, To string
	Limit    int
}

// DeviceHistory shows a device's state history; with OutputCSV the API's
// CSV of it.
func (c *Client) DeviceHistory(ctx context.Context, id string, q HistoryQuery) error {
	v := url.Values{}
	if q.From != "" {
		v.Set("from", q.From)
	}
	if q.To != "" {
		v.Set("to", q.To)
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	path := "/api/v1/devices/" + url.PathEscape(id) + "/history"
	if c.cfg.Output == OutputCSV {
		v.Set("format", "csv")
		resp, err := c.send(ctx, "GET", path, v, nil, "text/csv")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(c.cfg.Stdout, resp.Body)
		return err
	}
	raw, err := c.do(ctx, "GET", path, v, nil)
	if err != nil {
		return err
	}
	return c.list(raw, "samples", cols("AT=at", "SEQ=seq", "UPTIME=uptime", "CPU=cpu", "MEM USED=mem_used", "DISK USED=disk_used",
		"TEMP=temperature", "RX=rx_bytes", "TX=tx_bytes", "RSSI=rssi"))
}

// show writes GET path's object.
func (c *Client) show(ctx context.Context, path string) error {
	raw, err := c.do(ctx, "GET", path, nil, nil)
	if err != nil {
		return err
	}
	return c.object(raw)
}

// noCSV refuses OutputCSV where the API has no CSV.
func (c *Client) noCSV(what string) error {
	if c.cfg.Output == OutputCSV {
		return UsageError{fmt.Errorf("%s has no CSV form: use table or json", what)}
	}
	return nil
}

// Profiles lists the profiles.
func (c *Client) Profiles(ctx context.Context) error {
	if err := c.noCSV("profiles list"); err != nil {
		return err
	}
	raw, err := c.do(ctx, "GET", "/api/v1/profiles", nil, nil)
	if err != nil {
		return err
	}
	return c.list(raw, "profiles", cols("ID=id", "TYPE=device_type", "FIRMWARE=firmware", "VERSION=version", "INTERVAL=push_interval", "UPDATED=updated_at"))
}

// Profile shows a profile; configOnly writes only its configuration, as
// indented JSON that ProfileUpdate takes back.
func (c *Client) Profile(ctx context.Context, id string, configOnly bool) error {
	if err := c.noCSV("profiles get"); err != nil {
		return err
	}
	raw, err := c.do(ctx, "GET", "/api/v1/profiles/"+url.PathEscape(id), nil, nil)
	if err != nil {
		return err
	}
	if !configOnly {
		return c.object(raw)
	}
	var p struct {
		Config json.RawMessage `json:"config"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return err
	}
	out, err := json.MarshalIndent(p.Config, "", "  ")
	if err != nil {
		return err
	}
	return c.writeJSON(out)
}

// ProfileUpdate is a change of a profile: its configuration (a JSON
// object) and/or its push interval in seconds; nil leaves it.
type ProfileUpdate struct {
	Config       json.RawMessage `json:"config,omitempty"`
	PushInterval *int            `json:"push_interval,omitempty"`
}

// SetProfile changes a profile and shows it as it is then.
func (c *Client) SetProfile(ctx context.Context, id string, u ProfileUpdate) error {
	if u.Config == nil && u.PushInterval == nil {
		return UsageError{fmt.Errorf("nothing to change: give a configuration or a push interval")}
	}
	if u.Config != nil && !json.Valid(u.Config) {
		return UsageError{fmt.Errorf("the configuration is not valid JSON")}
	}
	raw, err := c.do(ctx, "PATCH", "/api/v1/profiles/"+url.PathEscape(id), nil, u)
	if err != nil {
		return err
	}
	return c.object(raw)
}

// ProfileHistory lists a profile's revisions.
func (c *Client) ProfileHistory(ctx context.Context, id string) error {
	raw, err := c.do(ctx, "GET", "/api/v1/profiles/"+url.PathEscape(id)+"/history", nil, nil)
	if err != nil {
		return err
	}
	return c.list(raw, "revisions", cols("REV=rev", "VERSION=version", "INTERVAL=push_interval", "BY=by", "AT=at", "NOTE=note"))
}

// ProfileDiff shows what changed from revision from to revision to.
func (c *Client) ProfileDiff(ctx context.Context, id string, from, to int) error {
	raw, err := c.do(ctx, "GET", "/api/v1/profiles/"+url.PathEscape(id)+"/diff",
		url.Values{"from": {strconv.Itoa(from)}, "to": {strconv.Itoa(to)}}, nil)
	if err != nil {
		return err
	}
	return c.list(raw, "changes", cols("PATH=path", "OP=op", "OLD=old!", "NEW=new!"))
}

// RollbackProfile makes revision rev's configuration and interval the
// profile's again (a new revision).
func (c *Client) RollbackProfile(ctx context.Context, id string, rev int) error {
	raw, err := c.do(ctx, "POST", "/api/v1/profiles/"+url.PathEscape(id)+"/rollback", nil, map[string]int{"rev": rev})
	if err != nil {
		return err
	}
	return c.object(raw)
}

// Labels lists the labels with their device counts.
func (c *Client) Labels(ctx context.Context) error {
	raw, err := c.do(ctx, "GET", "/api/v1/labels", nil, nil)
	if err != nil {
		return err
	}
	return c.list(raw, "labels", cols("NAME=name", "DEVICES=devices", "FILTER=filter"))
}

// DefineLabel makes name a live label of the devices the expression
// selects (docs/groups.md), or changes its expression.
func (c *Client) DefineLabel(ctx context.Context, name, expr string) error {
	raw, err := c.do(ctx, "PUT", "/api/v1/labels/"+url.PathEscape(name), nil, map[string]any{"filter": expr})
	if err != nil {
		return err
	}
	return c.object(raw)
}

// errLabelExists is CreateLabel's answer for a name already in use.
var errLabelExists = &Error{Status: http.StatusConflict, Code: "conflict"}

// CreateLabel makes a new label on the devices f selects; a label of that
// name is a conflict (the API makes a label when it is first assigned).
func (c *Client) CreateLabel(ctx context.Context, name string, f Filter) error {
	raw, err := c.do(ctx, "GET", "/api/v1/labels", nil, nil)
	if err != nil {
		return err
	}
	var ls struct {
		Labels []struct {
			Name string `json:"name"`
		} `json:"labels"`
	}
	if err := json.Unmarshal(raw, &ls); err != nil {
		return err
	}
	for _, l := range ls.Labels {
		if l.Name == name {
			e := *errLabelExists
			e.Message = "label " + strconv.Quote(name) + " exists: use labels assign"
			return &e
		}
	}
	return c.AssignLabel(ctx, name, f, false)
}

// AssignLabel adds the label to (or removes it from) the devices f
// selects.
func (c *Client) AssignLabel(ctx context.Context, name string, f Filter, remove bool) error {
	raw, err := c.do(ctx, "POST", "/api/v1/labels/assign", nil, map[string]any{"label": name, "remove": remove, "filter": f})
	if err != nil {
		return err
	}
	return c.object(raw)
}

// DeleteLabel deletes a label from every device.
func (c *Client) DeleteLabel(ctx context.Context, name string) error {
	raw, err := c.do(ctx, "DELETE", "/api/v1/labels/"+url.PathEscape(name), nil, nil)
	if err != nil {
		return err
	}
	return c.object(raw)
}

// CommandSpec is a remote command and its one target: a device, a label
// or a filter (All: every device).
type CommandSpec struct {
	Kind      string
	Args      []string
	Timeout   int // seconds the agent lets it run; 0: the server's default
	ExpiresIn int // seconds a copy waits for delivery; 0: the server's default
	DeviceID  string
	Label     string
	Filter    Filter
	All       bool
}

var jobCols = cols("ID=id", "KIND=kind", "ARGS=args", "TARGET=target", "STATE=state", "TOTAL=total", "COUNTS=counts", "CREATED=created_at")

var copyCols = cols("DEVICE=device_id", "STATE=state", "EXIT=exit_code", "ERROR=error", "FINISHED=finished_at", "OUTPUT=output")

// SendCommand queues a command and shows the job; with wait > 0 it then
// waits as WaitCommand does.
func (c *Client) SendCommand(ctx context.Context, s CommandSpec, wait time.Duration) error {
	body := map[string]any{"kind": s.Kind, "args": s.Args}
	if s.Args == nil {
		body["args"] = []string{}
	}
	if s.Timeout != 0 {
		body["timeout"] = s.Timeout
	}
	if s.ExpiresIn != 0 {
		body["expires_in"] = s.ExpiresIn
	}
	targets := 0
	if s.DeviceID != "" {
		targets++
		body["device_id"] = s.DeviceID
	}
	if s.Label != "" {
		targets++
		body["label"] = s.Label
	}
	if !s.Filter.Empty() || s.All {
		targets++
		body["filter"] = s.Filter
	}
	if targets != 1 {
		return UsageError{fmt.Errorf("name one target: a device, a label, a filter, or all devices")}
	}
	raw, err := c.do(ctx, "POST", "/api/v1/commands", nil, body)
	if err != nil {
		return err
	}
	if wait <= 0 {
		return c.object(raw)
	}
	var j struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return err
	}
	fmt.Fprintf(c.cfg.Stderr, "command %s queued; waiting up to %v for its results\n", j.ID, wait)
	return c.WaitCommand(ctx, j.ID, wait)
}

// job is the part of a job WaitCommand reads.
type job struct {
	State    string         `json:"state"`
	Total    int            `json:"total"`
	Creating bool           `json:"creating"`
	Counts   map[string]int `json:"counts"`
}

func (j job) pending() int { return j.Counts["queued"] + j.Counts["delivered"] }

func (j job) finished() bool {
	return j.State == "done" || j.State == "cancelled" || (!j.Creating && j.pending() == 0)
}

// WaitCommand waits until every device's copy of the job ended (or the
// job was cancelled), then shows each device's result. Past timeout it
// shows the results so far and returns a WaitTimeoutError; a copy that
// failed, expired or was cancelled makes it an error too.
func (c *Client) WaitCommand(ctx context.Context, id string, timeout time.Duration) error {
	path := "/api/v1/commands/" + url.PathEscape(id)
	deadline := time.Now().Add(timeout)
	pause := c.poll
	var j job
	for {
		raw, err := c.do(ctx, "GET", path, nil, nil)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(raw, &j); err != nil {
			return err
		}
		if j.finished() || !time.Now().Before(deadline) {
			break
		}
		t := time.NewTimer(min(pause, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
	if err := c.CommandCopies(ctx, id, ""); err != nil {
		return err
	}
	if !j.finished() {
		return WaitTimeoutError{fmt.Sprintf("command %s: %d of %d devices have no result after %v", id, j.pending(), j.Total, timeout)}
	}
	if bad := j.Counts["failed"] + j.Counts["expired"] + j.Counts["cancelled"]; bad > 0 {
		return fmt.Errorf("command %s: %d of %d devices failed, expired or were cancelled", id, bad, j.Total)
	}
	return nil
}

// CommandCopies shows each device's copy of a job (state: only those).
func (c *Client) CommandCopies(ctx context.Context, id, state string) error {
	var all []map[string]json.RawMessage
	v := url.Values{"limit": {"1000"}}
	if state != "" {
		v.Set("state", state)
	}
	var raws [][]byte
	for {
		raw, err := c.do(ctx, "GET", "/api/v1/commands/"+url.PathEscape(id)+"/devices", v, nil)
		if err != nil {
			return err
		}
		raws = append(raws, raw)
		var page struct {
			Commands []map[string]json.RawMessage `json:"commands"`
			Next     string                       `json:"next_cursor"`
		}
		if err := json.Unmarshal(raw, &page); err != nil {
			return err
		}
		all = append(all, page.Commands...)
		if page.Next == "" {
			break
		}
		v.Set("cursor", page.Next)
	}
	if c.cfg.Output == OutputJSON {
		if len(raws) == 1 {
			return c.writeJSON(raws[0])
		}
		b, err := json.Marshal(map[string]any{"commands": all})
		if err != nil {
			return err
		}
		return c.writeJSON(b)
	}
	return c.table(all, copyCols)
}

// Commands lists the newest jobs (limit 0: the API's default).
func (c *Client) Commands(ctx context.Context, limit int) error {
	v := url.Values{}
	if limit > 0 {
		v.Set("limit", strconv.Itoa(limit))
	}
	raw, err := c.do(ctx, "GET", "/api/v1/commands", v, nil)
	if err != nil {
		return err
	}
	return c.list(raw, "jobs", jobCols)
}

// Command shows a job.
func (c *Client) Command(ctx context.Context, id string) error {
	return c.show(ctx, "/api/v1/commands/"+url.PathEscape(id))
}

// ChangeCommand pauses, resumes or cancels a job (op: pause, resume,
// cancel) and shows it.
func (c *Client) ChangeCommand(ctx context.Context, id, op string) error {
	raw, err := c.do(ctx, "POST", "/api/v1/commands/"+url.PathEscape(id)+"/"+op, nil, nil)
	if err != nil {
		return err
	}
	return c.object(raw)
}

// RolloutSpec is a new firmware rollout (docs/firmware.md), or with
// Label (ProfileID) a configuration rollout of the label's new values
// (the profile's new configuration), Values (docs/configuration.md);
// zero values take the server's defaults.
type RolloutSpec struct {
	FirmwareID    string
	Label         string
	ProfileID     string
	Values        []byte // a JSON object
	Filter        Filter
	Waves         []string
	MaxFailurePct float64
	MaxDownloads  int
	Window        string // "HH:MM-HH:MM", UTC
	StallTimeout  int
	// Policy names a rollout policy whose plan the rollout takes; the
	// plan's own fields are then left unset.
	Policy string
	// DryRun has the server check a configuration rollout and show it,
	// starting nothing (?dry_run=1).
	DryRun bool
}

var rolloutCols = cols("ID=id", "KIND=kind", "FIRMWARE=firmware_id", "STATE=state", "WAVE=wave", "TOTAL=total", "COUNTS=counts", "REASON=reason", "UPDATED=updated_at")

// StartRollout creates a rollout and shows it (DryRun: the one it would
// create).
func (c *Client) StartRollout(ctx context.Context, s RolloutSpec) error {
	body := map[string]any{"firmware_id": s.FirmwareID}
	path := "/api/v1/rollouts"
	if s.Label != "" {
		if s.MaxDownloads != 0 {
			return UsageError{fmt.Errorf("a configuration rollout has no downloads to limit")}
		}
		body = map[string]any{"values": json.RawMessage(s.Values)}
		path = "/api/v1/labels/" + url.PathEscape(s.Label) + "/config/rollout"
	}
	if s.ProfileID != "" {
		if s.MaxDownloads != 0 {
			return UsageError{fmt.Errorf("a configuration rollout has no downloads to limit")}
		}
		body = map[string]any{"config": json.RawMessage(s.Values)}
		path = "/api/v1/profiles/" + url.PathEscape(s.ProfileID) + "/rollout"
	}
	if f := s.Filter.Values().Encode(); f != "" {
		body["filter"] = f
	}
	if s.Policy != "" {
		body["policy"] = s.Policy
	}
	if len(s.Waves) > 0 {
		body["waves"] = s.Waves
	}
	if s.MaxFailurePct != 0 {
		body["max_failure_pct"] = s.MaxFailurePct
	}
	if s.MaxDownloads != 0 {
		body["max_downloads"] = s.MaxDownloads
	}
	if s.StallTimeout != 0 {
		body["stall_timeout"] = s.StallTimeout
	}
	if s.Window != "" {
		start, end, ok := strings.Cut(s.Window, "-")
		if !ok {
			return UsageError{fmt.Errorf("window must be HH:MM-HH:MM (UTC), not %q", s.Window)}
		}
		body["window"] = map[string]string{"start": start, "end": end}
	}
	var q url.Values
	if s.DryRun {
		if s.Label == "" && s.ProfileID == "" {
			return UsageError{fmt.Errorf("only a configuration rollout can be checked without starting it")}
		}
		q = url.Values{"dry_run": {"1"}}
	}
	raw, err := c.do(ctx, "POST", path, q, body)
	if err != nil {
		return err
	}
	return c.object(raw)
}

// Rollouts lists the rollouts.
func (c *Client) Rollouts(ctx context.Context) error {
	raw, err := c.do(ctx, "GET", "/api/v1/rollouts", nil, nil)
	if err != nil {
		return err
	}
	return c.list(raw, "rollouts", rolloutCols)
}

// Rollout shows a rollout's status.
func (c *Client) Rollout(ctx context.Context, id string) error {
	return c.show(ctx, "/api/v1/rollouts/"+url.PathEscape(id))
}

// ControlRollout pauses, resumes or aborts a rollout (action: pause,
// resume, abort) and shows it.
func (c *Client) ControlRollout(ctx context.Context, id, action string) error {
	raw, err := c.do(ctx, "POST", "/api/v1/rollouts/"+url.PathEscape(id)+"/"+action, nil, nil)
	if err != nil {
		return err
	}
	return c.object(raw)
}

var rolloutPolicyCols = cols("NAME=name", "WAVES=waves", "MAX_FAILURE_PCT=max_failure_pct", "MAX_DOWNLOADS=max_downloads", "WINDOW=window", "STALL_TIMEOUT=stall_timeout", "UPDATED=updated_at")

// RolloutPolicies lists the rollout policies.
func (c *Client) RolloutPolicies(ctx context.Context) error {
	raw, err := c.do(ctx, "GET", "/api/v1/rollout-policies", nil, nil)
	if err != nil {
		return err
	}
	return c.list(raw, "policies", rolloutPolicyCols)
}

// RolloutPolicy shows a rollout policy.
func (c *Client) RolloutPolicy(ctx context.Context, name string) error {
	return c.show(ctx, "/api/v1/rollout-policies/"+url.PathEscape(name))
}

// SetRolloutPolicy creates or replaces the rollout policy name with the
// plan of body (a JSON object) and shows it.
func (c *Client) SetRolloutPolicy(ctx context.Context, name string, body []byte) error {
	raw, err := c.do(ctx, "PUT", "/api/v1/rollout-policies/"+url.PathEscape(name), nil, json.RawMessage(body))
	if err != nil {
		return err
	}
	return c.object(raw)
}

// DeleteRolloutPolicy deletes a rollout policy.
func (c *Client) DeleteRolloutPolicy(ctx context.Context, name string) error {
	raw, err := c.do(ctx, "DELETE", "/api/v1/rollout-policies/"+url.PathEscape(name), nil, nil)
	if err != nil {
		return err
	}
	return c.object(raw)
}

// Users lists the users.
func (c *Client) Users(ctx context.Context) error {
	raw, err := c.do(ctx, "GET", "/api/v1/users", nil, nil)
	if err != nil {
		return err
	}
	return c.list(raw, "users", cols("NAME=name", "ROLE=role", "CREATED=created_at", "UPDATED=updated_at"))
}

// CreateUser adds a user (password "": API tokens and single sign-on only).
func (c *Client) CreateUser(ctx context.Context, name, role, password string) error {
	body := map[string]string{"name": name, "role": role}
	if password != "" {
		body["password"] = password
	}
	raw, err := c.do(ctx, "POST", "/api/v1/users", nil, body)
	if err != nil {
		return err
	}
	return c.object(raw)
}

// DeleteUser deletes a user and its API tokens.
func (c *Client) DeleteUser(ctx context.Context, name string) error {
	raw, err := c.do(ctx, "DELETE", "/api/v1/users/"+url.PathEscape(name), nil, nil)
	if err != nil {
		return err
	}
	return c.object(raw)
}

// Tokens lists API tokens (user "": everyone's).
func (c *Client) Tokens(ctx context.Context, user string) error {
	v := url.Values{}
	if user != "" {
		v.Set("user", user)
	}
	raw, err := c.do(ctx, "GET", "/api/v1/tokens", v, nil)
	if err != nil {
		return err
	}
	return c.list(raw, "tokens", cols("ID=id", "USER=user", "NAME=name", "CREATED=created_at", "EXPIRES=expires_at", "LAST USED=last_used", "REVOKED=revoked_at"))
}

// CreateToken makes an API token of user and shows it with its secret,
// which the API gives this once (expiresIn 0: no expiry).
func (c *Client) CreateToken(ctx context.Context, user, name string, expiresIn time.Duration) error {
	body := map[string]string{"user": user, "name": name}
	if expiresIn > 0 {
		body["expires_in"] = expiresIn.String()
	}
	raw, err := c.do(ctx, "POST", "/api/v1/tokens", nil, body)
	if err != nil {
		return err
	}
	return c.object(raw)
}

// RevokeToken revokes an API token.
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	raw, err := c.do(ctx, "DELETE", "/api/v1/tokens/"+url.PathEscape(id), nil, nil)
	if err != nil {
		return err
	}
	return c.object(raw)
}

// Whoami shows who the token is.
func (c *Client) Whoami(ctx context.Context) error { return c.show(ctx, "/api/v1/whoami") }
