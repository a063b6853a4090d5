package web

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/protocol"
)

// Remote commands (docs/dashboard.md#commands): the same fleet calls as
// POST /api/v1/commands and its pause, resume and cancel.

type commandsData struct {
	Kinds  []string
	Labels []string
	Jobs   []fleet.Job
}

func (h *Handler) commands(w http.ResponseWriter, r *http.Request, s *session) {
	h.render(w, r, http.StatusOK, "commands", s, page{Title: "Commands", Nav: "commands",
		Data: commandsData{Kinds: protocol.CommandKinds, Labels: h.fleet.LabelNamesSorted(), Jobs: h.fleet.Jobs(100)}})
}

func (h *Handler) sendCommand(w http.ResponseWriter, r *http.Request, s *session) {
	spec := fleet.CommandSpec{Kind: r.PostFormValue("kind")}
	for _, a := range strings.Split(strings.ReplaceAll(r.PostFormValue("args"), "\r\n", "\n"), "\n") {
		if a = strings.TrimSpace(a); a != "" {
			spec.Args = append(spec.Args, a)
		}
	}
	if t := r.PostFormValue("timeout"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil {
			h.flash(s, "Command not sent: the timeout must be a whole number of seconds.")
			http.Redirect(w, r, Prefix+"commands", http.StatusSeeOther)
			return
		}
		spec.Timeout = n
	}
	var t fleet.Target
	label, dev := r.PostFormValue("label"), strings.TrimSpace(r.PostFormValue("device_id"))
	switch {
	case (label == "") == (dev == ""):
		h.flash(s, "Command not sent: choose a label or give a device ID (one of them).")
		http.Redirect(w, r, Prefix+"commands", http.StatusSeeOther)
		return
	case label != "":
		t.Filter = url.Values{fleet.FilterLabel: {label}}
	default:
		id, err := strconv.ParseUint(dev, 10, 64)
		if err != nil {
			h.flash(s, "Command not sent: the device ID must be a number.")
			http.Redirect(w, r, Prefix+"commands", http.StatusSeeOther)
			return
		}
		t.DeviceID = id
	}
	j, err := h.fleet.SendCommand(r.Context(), spec, t)
	switch {
	case errors.Is(err, fleet.ErrInvalid), errors.Is(err, fleet.ErrNotFound):
		h.flash(s, "Command not sent: "+err.Error())
	case err != nil:
		h.serverError(w, r, s, err)
		return
	default:
		h.log.Info("command sent from the dashboard", "job", j.ID, "kind", j.Kind, "target", j.Target, "devices", j.Total)
		changed(r, fmt.Sprintf("/api/v1/commands/%d", j.ID), j)
		h.flash(s, fmt.Sprintf("Command %d (%s) queued for %s devices.", j.ID, j.Kind, thousands(j.Total)))
	}
	http.Redirect(w, r, Prefix+"commands", http.StatusSeeOther)
}

func (h *Handler) changeCommand(w http.ResponseWriter, r *http.Request, s *session) {
	id, _ := strconv.ParseUint(r.PathValue("id"), 10, 64)
	op := r.PathValue("op")
	var err error
	switch op {
	case "pause", "resume":
		_, err = h.fleet.PauseJob(r.Context(), id, op == "pause")
	case "cancel":
		_, err = h.fleet.CancelJob(r.Context(), id)
	default:
		err = fleet.ErrNotFound
	}
	switch {
	case errors.Is(err, fleet.ErrNotFound), errors.Is(err, fleet.ErrJobState):
		h.flash(s, fmt.Sprintf("Command %d: cannot %s it (%v).", id, op, err))
	case err != nil:
		h.serverError(w, r, s, err)
		return
	default:
		h.flash(s, fmt.Sprintf("Command %d: %s done.", id, op))
	}
	http.Redirect(w, r, Prefix+"commands", http.StatusSeeOther)
}
