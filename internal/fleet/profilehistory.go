package fleet

// Profile history (docs/firmware.md, "Profile history"): every version of
// a profile's configuration and push interval with who made it and when,
// diffs between two, and rollback, which makes an earlier revision's
// content the newest version.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sort"
	"strconv"
	"time"
)

// ProfileRevision is one stored version of a profile.
type ProfileRevision struct {
	ProfileID    uint64          `json:"profile_id,string"`
	Rev          int             `json:"rev"` // 1, 2, … per profile
	Version      int64           `json:"version"`
	Config       json.RawMessage `json:"config"`
	PushInterval int             `json:"push_interval"`
	By           string          `json:"by,omitempty"`
	At           time.Time       `json:"at"`
	// Note says what made it: "created", "inherited from profile 3
	// (6.3.5)", "updated", "rollback to revision 2".
	Note string `json:"note,omitempty"`
}

// recordRevision stores p's current content as a new revision; a failure
// is logged (the profile change itself is durable already).
func (fs *firmwareState) recordRevision(ctx context.Context, p *Profile, by, note string) {
	r := ProfileRevision{ProfileID: p.ID, Version: p.Version, Config: p.Config, PushInterval: p.PushInterval,
		By: by, At: p.UpdatedAt, Note: note}
	if st := fs.store; st != nil {
		if _, err := st.AddProfileRevision(context.WithoutCancel(ctx), r); err != nil {
			fs.log.Warn("storing a profile revision failed", "profile_id", p.ID, "err", err)
		}
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	r.Rev = len(fs.revisions[p.ID]) + 1
	fs.revisions[p.ID] = append(fs.revisions[p.ID], r)
}

// ProfileHistory returns a profile's revisions, oldest first.
func (fs *firmwareState) ProfileHistory(ctx context.Context, id uint64) ([]ProfileRevision, error) {
	if _, ok := fs.devs.Profile(id); !ok {
		return nil, ErrNotFound
	}
	if st := fs.store; st != nil {
		out, err := st.ProfileRevisions(ctx, id)
		if out == nil {
			out = []ProfileRevision{}
		}
		return out, err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return append([]ProfileRevision{}, fs.revisions[id]...), nil
}

func (fs *firmwareState) revision(ctx context.Context, id uint64, rev int) (ProfileRevision, error) {
	all, err := fs.ProfileHistory(ctx, id)
	if err != nil {
		return ProfileRevision{}, err
	}
	i := slices.IndexFunc(all, func(r ProfileRevision) bool { return r.Rev == rev })
	if i < 0 {
		return ProfileRevision{}, &FieldError{Field: "rev", Message: "profile " + strconv.FormatUint(id, 10) + " has no revision " + strconv.Itoa(rev)}
	}
	return all[i], nil
}

// DiffEntry is one difference between two revisions: a configuration
// member (a JSON pointer path) or push_interval.
type DiffEntry struct {
	Path string          `json:"path"`
	Op   string          `json:"op"` // added, removed or changed
	Old  json.RawMessage `json:"old,omitempty"`
	New  json.RawMessage `json:"new,omitempty"`
}

// ProfileDiff compares revisions from and to of a profile.
func (fs *firmwareState) ProfileDiff(ctx context.Context, id uint64, from, to int) ([]DiffEntry, error) {
	a, err := fs.revision(ctx, id, from)
	if err != nil {
		return nil, err
	}
	b, err := fs.revision(ctx, id, to)
	if err != nil {
		return nil, err
	}
	out := DiffJSON(a.Config, b.Config)
	if a.PushInterval != b.PushInterval {
		out = append(out, DiffEntry{Path: "push_interval", Op: "changed",
			Old: json.RawMessage(strconv.Itoa(a.PushInterval)), New: json.RawMessage(strconv.Itoa(b.PushInterval))})
	}
	return out, nil
}

// DiffJSON lists the differences from a to b, descending into objects;
// arrays and scalars compare whole. Paths are JSON pointers ("" the root).
func DiffJSON(a, b json.RawMessage) []DiffEntry {
	out := []DiffEntry{}
	diffValue("", a, b, &out)
	return out
}

func diffValue(path string, a, b json.RawMessage, out *[]DiffEntry) {
	var ma, mb map[string]json.RawMessage
	if json.Unmarshal(a, &ma) == nil && json.Unmarshal(b, &mb) == nil && ma != nil && mb != nil {
		keys := make([]string, 0, len(ma)+len(mb))
		for k := range ma {
			keys = append(keys, k)
		}
		for k := range mb {
			if _, ok := ma[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			p := path + "/" + pointerEscape(k)
			va, inA := ma[k]
			vb, inB := mb[k]
			switch {
			case !inA:
				*out = append(*out, DiffEntry{Path: p, Op: "added", New: compactJSON(vb)})
			case !inB:
				*out = append(*out, DiffEntry{Path: p, Op: "removed", Old: compactJSON(va)})
			default:
				diffValue(p, va, vb, out)
			}
		}
		return
	}
	ca, cb := compactJSON(a), compactJSON(b)
	if !bytes.Equal(ca, cb) {
		*out = append(*out, DiffEntry{Path: path, Op: "changed", Old: ca, New: cb})
	}
}

func pointerEscape(k string) string {
	var b bytes.Buffer
	for _, r := range k {
		switch r {
		case '~':
			b.WriteString("~0")
		case '/':
			b.WriteString("~1")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// compactJSON normalises a value for comparison (objects with sorted keys).
func compactJSON(v json.RawMessage) json.RawMessage {
	var x any
	if json.Unmarshal(v, &x) != nil {
		return v
	}
	b, err := json.Marshal(x)
	if err != nil {
		return v
	}
	return b
}

// RollbackProfile makes revision rev's configuration and push interval the
// profile's newest version (a new version number, so that devices apply it
// again: also when it is the configuration they have, which is how an
// operator sends a configuration again).
func (fs *firmwareState) RollbackProfile(ctx context.Context, id uint64, rev int, by string) (Profile, error) {
	r, err := fs.revision(ctx, id, rev)
	if err != nil {
		return Profile{}, err
	}
	pi := r.PushInterval
	if err := fs.SyncRollouts(ctx); err != nil { // a rollout another node started stages it
		return Profile{}, errors.Join(ErrUnavailable, err)
	}
	p, _, err := fs.devs.updateProfile(ctx, id, ProfileUpdate{Config: r.Config, PushInterval: &pi}, by, "rollback to revision "+strconv.Itoa(rev), true)
	return p, err
}
