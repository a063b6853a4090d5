package server

// Profiles in the operator API (docs/operations.md, "Profile policy";
// docs/firmware.md): list, read, change and delete them,
// the profile policy and the firmware changes waiting for approval, a
// profile's history, diff and rollback.

import (
	"net/http"
	"strconv"
	"time"

	"github.com/drover/drover/internal/fleet"
)

func (a *api) listProfiles(r *http.Request) (any, error) {
	return profileList{a.fleet.Profiles()}, nil
}

func (a *api) getProfile(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	p, ok := a.fleet.Profile(id)
	if !ok {
		return nil, notFound("profile " + strconv.FormatUint(id, 10))
	}
	return p, nil
}

func (a *api) updateProfile(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	var u fleet.ProfileUpdate
	if err := decodeStrict(r, "profile update: ", &u); err != nil {
		return nil, err
	}
	if u.By, err = changedBy(r); err != nil {
		return nil, err
	}
	if u.DryRun, err = dryRun(r); err != nil {
		return nil, err
	}
	p, changed, err := a.fleet.ApplyProfileUpdate(r.Context(), id, u)
	if err != nil {
		return nil, ifNotFound(err, "profile "+strconv.FormatUint(id, 10))
	}
	if !changed || u.DryRun {
		return unchangedBody{p}, nil
	}
	return p, nil
}

func (a *api) getProfilePolicy(r *http.Request) (any, error) {
	return a.fleet.ProfilePolicy(), nil
}

func (a *api) putProfilePolicy(r *http.Request) (any, error) {
	p := a.fleet.ProfilePolicy()
	if err := decodeStrict(r, "profile policy: ", &p); err != nil {
		return nil, err
	}
	dry, err := dryRun(r)
	if err != nil {
		return nil, err
	}
	if dry {
		if err := p.Check(); err != nil {
			return nil, err
		}
		return unchangedBody{p}, nil
	}
	return a.fleet.SetProfilePolicy(r.Context(), p)
}

func (a *api) pendingFirmware(r *http.Request) (any, error) {
	return pendingList{a.fleet.PendingFirmware()}, nil
}

func (a *api) approveFirmware(r *http.Request) (any, error) {
	var in approvalBody
	if err := decodeStrict(r, "approval: ", &in); err != nil {
		return nil, err
	}
	p, err := a.fleet.ApproveFirmware(r.Context(), in.DeviceType, in.Firmware, in.Carry)
	if err != nil {
		return nil, err
	}
	return created(p), nil
}

func (a *api) deleteProfile(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	if err := a.fleet.DeleteProfile(r.Context(), id); err != nil {
		return nil, ifNotFound(err, "profile "+strconv.FormatUint(id, 10))
	}
	return deleted{strconv.FormatUint(id, 10)}, nil
}

// cleanupProfiles deletes unused profiles: {"min_age": seconds (default
// 3600), "dry_run": bool}.
func (a *api) cleanupProfiles(r *http.Request) (any, error) {
	in := cleanupBody{MinAge: 3600}
	if err := decodeStrict(r, "cleanup: ", &in); err != nil {
		return nil, err
	}
	if in.MinAge < 0 {
		return nil, badField("min_age must be seconds, 0 or more")
	}
	return a.fleet.CleanupProfiles(r.Context(), time.Duration(in.MinAge)*time.Second, in.DryRun)
}

func (a *api) profileHistory(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	h, err := a.fleet.ProfileHistory(r.Context(), id)
	if err != nil {
		return nil, err
	}
	return revisionList{h}, nil
}

func (a *api) profileDiff(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	from, err1 := strconv.Atoi(q.Get("from"))
	to, err2 := strconv.Atoi(q.Get("to"))
	if err1 != nil || err2 != nil {
		return nil, badField("from and to must be revision numbers")
	}
	d, err := a.fleet.ProfileDiff(r.Context(), id, from, to)
	if err != nil {
		return nil, err
	}
	return profileDiff{from, to, d}, nil
}

func (a *api) rollbackProfile(r *http.Request) (any, error) {
	id, err := pathID(r)
	if err != nil {
		return nil, err
	}
	by, err := changedBy(r)
	if err != nil {
		return nil, err
	}
	var body rollbackBody
	if err := decodeStrict(r, "rollback: ", &body); err != nil {
		return nil, err
	}
	return a.fleet.RollbackProfile(r.Context(), id, body.Rev, by)
}
