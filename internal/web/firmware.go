package web

// Firmware and rollouts pages, and profile history on the profile page
// (docs/dashboard.md, docs/firmware.md). Uploads stream: the multipart body
// is read part by part (CSRF token first) straight into the server's
// firmware store, never parsed into memory.

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/fleet"
)

// FirmwareUpload stores an uploaded firmware file (the server's): meta
// checked first, body streamed, sha256 ("": any) compared.
type FirmwareUpload func(ctx context.Context, meta fleet.Firmware, sha256 string, body io.Reader, length int64) (fleet.Firmware, error)

// by is who acts from the dashboard, in profile history and rollouts.
// byOf names who makes a change in the records of profiles, firmware and
// rollouts: "dashboard", or "dashboard:<user>" for a user's session.
func byOf(r *http.Request) string {
	if who := actorOf(r); who.Name != "" && who.Name != access.AdminActor {
		return "dashboard:" + who.Name
	}
	return "dashboard"
}

func (h *Handler) badInput(w http.ResponseWriter, r *http.Request, s *session, err error) {
	status := http.StatusBadRequest
	if !errors.Is(err, fleet.ErrInvalid) && !errors.Is(err, fleet.ErrNotFound) && !errors.Is(err, fleet.ErrFirmwareExists) &&
		!errors.Is(err, fleet.ErrFirmwareInUse) && !errors.Is(err, fleet.ErrRolloutState) && !errors.Is(err, fleet.ErrNoDevices) {
		var he interface{ StatusCode() int }
		if !errors.As(err, &he) || he.StatusCode() >= 500 {
			h.serverError(w, r, s, err)
			return
		}
		status = he.StatusCode()
	}
	h.render(w, r, status, "error", s, page{Title: "Not done", Data: err.Error()})
}

type firmwarePage struct {
	Firmware []fleet.Firmware
	Rollouts []fleet.Rollout
	Defaults fleet.RolloutSpec
	MaxSize  int64
}

func (h *Handler) firmware(w http.ResponseWriter, r *http.Request, s *session) {
	h.render(w, r, http.StatusOK, "firmware", s, page{Title: "Firmware", Nav: "firmware", Data: firmwarePage{
		Firmware: h.fleet.Firmware(), Rollouts: h.fleet.Rollouts(), Defaults: fleet.DefaultRolloutSpec(),
	}})
}

// uploadFirmware reads the multipart form in order: csrf, device_type,
// version, signature, then the file, which streams into the store.
func (h *Handler) uploadFirmware(w http.ResponseWriter, r *http.Request) {
	s := h.session(r)
	if s == nil {
		http.Error(w, "not logged in", http.StatusUnauthorized)
		return
	}
	who, err := h.acc.Session(r.Context(), s.user, s.cred)
	if err != nil {
		http.Error(w, "not logged in", http.StatusUnauthorized)
		return
	}
	if who.Role < access.Operator {
		http.Error(w, "your role ("+who.Role.String()+") may not upload firmware", http.StatusForbidden)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), actorKey{}, who))
	if t := h.opts.TransferTimeout; t > 0 {
		http.NewResponseController(w).SetReadDeadline(time.Now().Add(t))
		http.NewResponseController(w).SetWriteDeadline(time.Now().Add(t))
	}
	mr, err := r.MultipartReader()
	if err != nil || !sameOrigin(r) {
		http.Error(w, "invalid or missing CSRF token: reload the page and try again", http.StatusForbidden)
		return
	}
	fields := map[string]string{}
	for {
		part, err := mr.NextPart()
		if err != nil {
			h.badInput(w, r, s, &fleet.FieldError{Field: "file", Message: "no firmware file in the form"})
			return
		}
		name := part.FormName()
		if name != "file" {
			v, _ := io.ReadAll(io.LimitReader(part, 4096))
			fields[name] = strings.TrimSpace(string(v))
			if name == "csrf" && subtle.ConstantTimeCompare(v, []byte(s.csrf)) != 1 {
				http.Error(w, "invalid or missing CSRF token: reload the page and try again", http.StatusForbidden)
				return
			}
			continue
		}
		if fields["csrf"] == "" {
			http.Error(w, "invalid or missing CSRF token: reload the page and try again", http.StatusForbidden)
			return
		}
		if h.opts.UploadFirmware == nil {
			h.badInput(w, r, s, errors.New("this server takes no firmware uploads"))
			return
		}
		meta := fleet.Firmware{DeviceType: fields["device_type"], Version: fields["version"], Signature: fields["signature"], By: byOf(r)}
		f, err := h.opts.UploadFirmware(r.Context(), meta, fields["sha256"], part, -1)
		if err != nil {
			h.badInput(w, r, s, err)
			return
		}
		h.log.Info("firmware uploaded from the dashboard", "firmware_id", f.ID, "version", f.Version, "size", f.Size)
		if h.opts.Audit != nil {
			h.opts.Audit(r, who, r.Pattern, "")(fmt.Sprintf("/api/v1/firmware/%d", f.ID), f)
		}
		h.flash(s, fmt.Sprintf("Firmware %s %s uploaded: %s bytes, SHA-256 %s.", f.DeviceType, f.Version, thousands(f.Size), f.SHA256))
		http.Redirect(w, r, Prefix+"firmware", http.StatusSeeOther)
		return
	}
}

func (h *Handler) deleteFirmware(w http.ResponseWriter, r *http.Request, s *session) {
	id, _ := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if h.opts.DeleteFirmware == nil {
		h.badInput(w, r, s, errors.New("this server cannot delete firmware"))
		return
	}
	if err := h.opts.DeleteFirmware(r.Context(), id); err != nil {
		h.badInput(w, r, s, err)
		return
	}
	h.flash(s, "Firmware deleted.")
	http.Redirect(w, r, Prefix+"firmware", http.StatusSeeOther)
}

func (h *Handler) createRollout(w http.ResponseWriter, r *http.Request, s *session) {
	spec := fleet.DefaultRolloutSpec()
	var errs []error
	fid, err := strconv.ParseUint(r.PostFormValue("firmware_id"), 10, 64)
	if err != nil {
		errs = append(errs, &fleet.FieldError{Field: "firmware_id", Message: "choose a firmware"})
	}
	spec.FirmwareID = fid
	if _, err := planForm(r, &spec); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		h.badInput(w, r, s, errors.Join(errs...))
		return
	}
	ro, err := h.fleet.CreateRollout(r.Context(), spec, byOf(r))
	if err != nil {
		h.badInput(w, r, s, err)
		return
	}
	h.rolloutStarted(w, r, s, ro, fmt.Sprintf("Rollout %d started for %s devices.", ro.ID, thousands(ro.Total)))
}

// rolloutStarted records the rollout a form started and opens its page
// with msg.
func (h *Handler) rolloutStarted(w http.ResponseWriter, r *http.Request, s *session, ro fleet.Rollout, msg string) {
	changed(r, fmt.Sprintf("/api/v1/rollouts/%d", ro.ID), ro)
	h.flash(s, msg)
	http.Redirect(w, r, Prefix+"rollouts/"+strconv.FormatUint(ro.ID, 10), http.StatusSeeOther)
}

// planForm reads a rollout form's filter and plan into spec (what it
// leaves empty keeps spec's value) and names the first plan field
// (fleet.PlanFields) it gave ("": none).
func planForm(r *http.Request, spec *fleet.RolloutSpec) (inline string, err error) {
	var errs []error
	given := func(name string) string {
		v := strings.TrimSpace(r.PostFormValue(name))
		if v != "" && inline == "" {
			inline = name
		}
		return v
	}
	num := func(name string, dst *int) {
		if v := given(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				errs = append(errs, &fleet.FieldError{Field: name, Message: name + " must be a whole number"})
			}
			*dst = n
		}
	}
	spec.Filter = strings.TrimSpace(r.PostFormValue("filter"))
	if v := given("waves"); v != "" {
		spec.Waves = strings.FieldsFunc(v, func(c rune) bool { return c == ',' || c == ' ' })
	}
	if v := given("max_failure_pct"); v != "" {
		var err error
		if spec.MaxFailurePct, err = strconv.ParseFloat(v, 64); err != nil {
			errs = append(errs, &fleet.FieldError{Field: "max_failure_pct", Message: "max_failure_pct must be a number"})
		}
	}
	num("max_downloads", &spec.MaxDownloads)
	num("stall_timeout", &spec.StallTimeout)
	if a, b := strings.TrimSpace(r.PostFormValue("window_start")), strings.TrimSpace(r.PostFormValue("window_end")); a != "" || b != "" {
		spec.Window = &fleet.Window{Start: a, End: b}
		if inline == "" {
			inline = "window"
		}
	}
	return inline, errors.Join(errs...)
}

// stageConfig starts a configuration rollout of a label's new values from
// the labels page, checked as the API checks it: a policy, or the plan
// fields given (the others take the rollouts' defaults), not both.
func (h *Handler) stageConfig(w http.ResponseWriter, r *http.Request, s *session) {
	spec := fleet.DefaultRolloutSpec()
	inline, err := planForm(r, &spec)
	if err != nil {
		h.badInput(w, r, s, err)
		return
	}
	label := r.PostFormValue("label")
	values := strings.TrimSpace(r.PostFormValue("values"))
	if values == "" {
		h.badInput(w, r, s, &fleet.FieldError{Field: "values", Message: "values is required: the label's whole new values, a JSON object"})
		return
	}
	spec.Config = &fleet.ConfigChange{Label: label, Values: json.RawMessage(values)}
	spec.Policy = r.PostFormValue("policy")
	if err := h.fleet.UseRolloutPolicy(&spec, inline); err != nil {
		h.badInput(w, r, s, err)
		return
	}
	ro, err := h.fleet.CreateConfigRollout(r.Context(), spec, byOf(r))
	if err != nil {
		h.badInput(w, r, s, err)
		return
	}
	h.rolloutStarted(w, r, s, ro, fmt.Sprintf("Rollout %d stages the new values of label %s for %s devices.", ro.ID, label, thousands(ro.Total)))
}

type rolloutPage struct {
	R        fleet.Rollout
	Firmware fleet.Firmware
	States   []string
	State    string // the devices shown
	Devices  []fleet.RolloutDevice
}

func (h *Handler) rollout(w http.ResponseWriter, r *http.Request, s *session) {
	id, _ := strconv.ParseUint(r.PathValue("id"), 10, 64)
	ro, ok := h.fleet.RolloutByID(id)
	if !ok {
		h.notFound(w, r, s, "No rollout "+r.PathValue("id"))
		return
	}
	st := r.URL.Query().Get("state")
	ds, err := h.fleet.RolloutDevices(r.Context(), id, st, 0, 200)
	if err != nil {
		h.serverError(w, r, s, err)
		return
	}
	fw, _ := h.fleet.FirmwareByID(ro.FirmwareID)
	h.render(w, r, http.StatusOK, "rollout", s, page{Title: "Rollout " + r.PathValue("id"), Nav: "firmware",
		Data: rolloutPage{R: ro, Firmware: fw, States: fleet.RolloutDeviceStates, State: st, Devices: ds}})
}

func (h *Handler) controlRollout(w http.ResponseWriter, r *http.Request, s *session) {
	id, _ := strconv.ParseUint(r.PathValue("id"), 10, 64)
	action := r.PathValue("action")
	ro, err := h.fleet.ControlRollout(r.Context(), id, action, byOf(r))
	if err != nil {
		h.badInput(w, r, s, err)
		return
	}
	h.flash(s, fmt.Sprintf("Rollout %d is %s.", ro.ID, ro.State))
	http.Redirect(w, r, Prefix+"rollouts/"+r.PathValue("id"), http.StatusSeeOther)
}

// revisionView is one revision with its difference from the one before.
type revisionView struct {
	fleet.ProfileRevision
	Changes []fleet.DiffEntry
}

func (h *Handler) profileRevisions(ctx context.Context, id uint64) []revisionView {
	revs, err := h.fleet.ProfileHistory(ctx, id)
	if err != nil {
		h.log.Warn("profile history unavailable", "profile_id", id, "err", err)
		return nil
	}
	out := make([]revisionView, len(revs))
	for i, rv := range revs {
		out[len(revs)-1-i].ProfileRevision = rv // newest first
		if i > 0 {
			d := fleet.DiffJSON(revs[i-1].Config, rv.Config)
			if revs[i-1].PushInterval != rv.PushInterval {
				d = append(d, fleet.DiffEntry{Path: "push_interval", Op: "changed",
					Old: json.RawMessage(strconv.Itoa(revs[i-1].PushInterval)), New: json.RawMessage(strconv.Itoa(rv.PushInterval))})
			}
			out[len(revs)-1-i].Changes = d
		}
	}
	return out
}

func (h *Handler) rollbackProfile(w http.ResponseWriter, r *http.Request, s *session) {
	id, _ := strconv.ParseUint(r.PathValue("id"), 10, 64)
	rev, err := strconv.Atoi(r.PostFormValue("rev"))
	if err != nil {
		h.badInput(w, r, s, &fleet.FieldError{Field: "rev", Message: "rev must be a revision number"})
		return
	}
	p, err := h.fleet.RollbackProfile(r.Context(), id, rev, byOf(r))
	if err != nil {
		h.badInput(w, r, s, err)
		return
	}
	h.flash(s, fmt.Sprintf("Rolled back to revision %d: configuration version %d.", rev, p.Version))
	http.Redirect(w, r, Prefix+"profiles/"+r.PathValue("id"), http.StatusSeeOther)
}

// rawJSON shows a diff value compactly.
func rawJSON(v json.RawMessage) string {
	if len(v) == 0 {
		return "—"
	}
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return string(v)
	}
	return b.String()
}
