package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/drover/drover/internal/fleet"
)

// deviceQuota lifts or restores a device's quotas from the device page
// (docs/operations.md, "Quotas").
func (h *Handler) deviceQuota(w http.ResponseWriter, r *http.Request, s *session) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if err != nil {
		h.notFound(w, r, s, "No device "+r.PathValue("id"))
		return
	}
	back := Prefix + "devices/" + strconv.FormatUint(id, 10)
	switch r.PostFormValue("action") {
	case "lift":
		hours, err := strconv.Atoi(r.PostFormValue("hours"))
		if err != nil || hours < 0 || hours > 24*366 {
			h.flash(s, "Lift for how long: choose one of the durations offered.")
			break
		}
		var until time.Time
		if hours > 0 {
			until = h.now().Add(time.Duration(hours) * time.Hour)
		}
		_, err = h.fleet.LiftQuota(r.Context(), id, until, "dashboard@"+r.RemoteAddr)
		switch {
		case errors.Is(err, fleet.ErrNotFound):
			h.notFound(w, r, s, "No device "+strconv.FormatUint(id, 10))
			return
		case errors.Is(err, fleet.ErrTooManyLifts):
			h.flash(s, err.Error())
		case err != nil:
			h.serverError(w, r, s, err)
			return
		case hours == 0:
			h.flash(s, fmt.Sprintf("Device %d: quotas lifted until restored.", id))
		default:
			h.flash(s, fmt.Sprintf("Device %d: quotas lifted for %d h.", id, hours))
		}
	case "restore":
		err := h.fleet.RestoreQuota(r.Context(), id)
		switch {
		case errors.Is(err, fleet.ErrNotFound):
			h.flash(s, fmt.Sprintf("Device %d has no quota record.", id))
		case err != nil:
			h.serverError(w, r, s, err)
			return
		default:
			h.flash(s, fmt.Sprintf("Device %d: quotas restored, record cleared.", id))
		}
	default:
		h.notFound(w, r, s, "No such quota action")
		return
	}
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// profilesData is the profiles page: the table, the profile policy, the
// firmware waiting for approval and the unused profiles.
type profilesData struct {
	Rows           []profileRow
	Policy         fleet.ProfilePolicy
	Modes, Carries []string
	Pending        []fleet.PendingFirmware
	Unused         []fleet.Profile
}

func (h *Handler) profilesData() profilesData {
	d := profilesData{Rows: h.profileRows(), Policy: h.fleet.ProfilePolicy(), Pending: h.fleet.PendingFirmware(),
		Modes: []string{fleet.ModeCreate, fleet.ModeJoin}, Carries: []string{fleet.CarryInherit, fleet.CarryEmpty}}
	if res, err := h.fleet.CleanupProfiles(context.Background(), time.Hour, true); err == nil {
		d.Unused = res.Deleted
	}
	return d
}

func (h *Handler) saveProfilePolicy(w http.ResponseWriter, r *http.Request, s *session) {
	p := fleet.ProfilePolicy{Mode: r.PostFormValue("mode"), Carry: r.PostFormValue("carry")}
	var err1, err2 error
	p.CreateLimit, err1 = strconv.Atoi(r.PostFormValue("create_limit"))
	p.CreateWindow, err2 = strconv.Atoi(r.PostFormValue("create_window"))
	var err error
	if err1 != nil || err2 != nil {
		err = errors.New("limit and window must be whole numbers")
	} else {
		_, err = h.fleet.SetProfilePolicy(r.Context(), p)
	}
	switch {
	case errors.Is(err, fleet.ErrInvalid) || err1 != nil || err2 != nil:
		h.flash(s, "Not saved: "+err.Error())
	case err != nil:
		h.serverError(w, r, s, err)
		return
	default:
		h.flash(s, "New-firmware policy saved.")
	}
	http.Redirect(w, r, Prefix+"profiles", http.StatusSeeOther)
}

func (h *Handler) approveFirmware(w http.ResponseWriter, r *http.Request, s *session) {
	p, err := h.fleet.ApproveFirmware(r.Context(), r.PostFormValue("device_type"), r.PostFormValue("firmware"), "")
	switch {
	case errors.Is(err, fleet.ErrNotPending), errors.Is(err, fleet.ErrProfileExists):
		h.flash(s, "Not approved: "+err.Error())
	case err != nil:
		h.serverError(w, r, s, err)
		return
	default:
		h.flash(s, fmt.Sprintf("Firmware %s of %s approved: profile %d.", p.Firmware, p.DeviceType, p.ID))
	}
	http.Redirect(w, r, Prefix+"profiles", http.StatusSeeOther)
}

func (h *Handler) cleanupProfiles(w http.ResponseWriter, r *http.Request, s *session) {
	res, err := h.fleet.CleanupProfiles(r.Context(), time.Hour, false)
	if err != nil {
		h.serverError(w, r, s, err)
		return
	}
	h.flash(s, fmt.Sprintf("%d unused profile(s) deleted.", len(res.Deleted)))
	http.Redirect(w, r, Prefix+"profiles", http.StatusSeeOther)
}
