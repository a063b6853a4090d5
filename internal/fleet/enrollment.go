package fleet

// Enrollment tokens (single-use, expiring, optionally bound to a machine ID)
// and preauthorized machine IDs: the operator's provisioning credentials.

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/drover/drover/internal/protocol"
)

// Limits of enrollment tokens.
const (
	DefaultEnrollmentTTL = 24 * time.Hour
	MaxEnrollmentTTL     = 366 * 24 * time.Hour
	maxNoteLen           = 256
)

// ValidMachineID checks a machine ID as the protocol does.
func ValidMachineID(id string) error {
	r := protocol.RegisterRequest{MachineID: id, DeviceType: "t", Firmware: "f", EnrollmentSecret: "s"}
	if err := r.Validate(); err != nil {
		return fieldError("machine_id", "%s", err.Error())
	}
	return nil
}

func validNote(v string) bool {
	if len(v) > maxNoteLen || !utf8.ValidString(v) {
		return false
	}
	for _, r := range v {
		if r < 0x20 || (r >= 0x7f && r < 0xa0) {
			return false
		}
	}
	return true
}

// CreateEnrollmentToken makes a single-use enrollment token that expires
// after ttl (0: DefaultEnrollmentTTL), for machineID ("": any). The token
// is returned only here; the fleet keeps its SHA-256.
func (t *trust) CreateEnrollmentToken(ctx context.Context, machineID string, ttl time.Duration, note, actor string) (string, EnrollmentToken, error) {
	if machineID != "" {
		if err := ValidMachineID(machineID); err != nil {
			return "", EnrollmentToken{}, err
		}
	}
	if ttl == 0 {
		ttl = DefaultEnrollmentTTL
	}
	if ttl < time.Minute || ttl > MaxEnrollmentTTL {
		return "", EnrollmentToken{}, fieldError("ttl", "ttl must be between 1m and 8784h")
	}
	if !validNote(note) {
		return "", EnrollmentToken{}, fieldError("note", "note must be at most 256 bytes of printable UTF-8")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.init()
	id := t.nextToken
	if cs := t.cluster; cs != nil {
		var err error
		if id, err = cs.NextTokenID(ctx); err != nil {
			return "", EnrollmentToken{}, err
		}
	}
	secret, hash := newSecret("et-" + strconv.FormatUint(id, 10) + ".")
	now := t.now().UTC().Truncate(time.Millisecond)
	et := EnrollmentToken{ID: id, MachineID: machineID, Note: note, CreatedAt: now, ExpiresAt: now.Add(ttl), Hash: hash[:]}
	if t.store != nil {
		if err := t.store.SaveEnrollmentToken(ctx, et); err != nil {
			return "", EnrollmentToken{}, err
		}
	}
	t.nextToken = max(t.nextToken, id+1)
	t.tokens[id] = &et
	t.note(ctx, ChangeEnrollment, id)
	t.log.Info("enrollment token", "action", "create", "token_id", id, "machine_id", machineID, "expires", et.ExpiresAt, "by", actor)
	return secret, et, nil
}

// EnrollmentTokens lists the tokens, newest first.
func (t *trust) EnrollmentTokens() []EnrollmentToken {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]EnrollmentToken, 0, len(t.tokens))
	for _, et := range t.tokens {
		out = append(out, *et)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID > out[j].ID })
	return out
}

// RevokeEnrollmentToken makes a token unusable (it stays listed).
func (t *trust) RevokeEnrollmentToken(ctx context.Context, id uint64, actor string) (EnrollmentToken, error) {
	if t.cluster != nil {
		// Another node may have made or used it: start from the stored one.
		if err := t.reloadEnrollment(ctx); err != nil {
			return EnrollmentToken{}, errors.Join(ErrUnavailable, err)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	et, ok := t.tokens[id]
	if !ok {
		return EnrollmentToken{}, ErrNotFound
	}
	nt := *et
	nt.Revoked = true
	if t.store != nil {
		if err := t.store.SaveEnrollmentToken(ctx, nt); err != nil {
			return EnrollmentToken{}, err
		}
	}
	*et = nt
	t.note(ctx, ChangeEnrollment, id)
	t.log.Info("enrollment token", "action", "revoke", "token_id", id, "by", actor)
	return nt, nil
}

// checkEnrollmentToken finds a usable token for machineID; in cluster
// mode a token memory does not know is looked for in the database too.
func (t *trust) checkEnrollmentToken(ctx context.Context, token, machineID string) (EnrollmentToken, error) {
	rest, ok := strings.CutPrefix(token, "et-")
	if !ok {
		return EnrollmentToken{}, ErrEnrollmentToken
	}
	idPart, _, ok := strings.Cut(rest, ".")
	id, err := strconv.ParseUint(idPart, 10, 64)
	if !ok || err != nil {
		return EnrollmentToken{}, ErrEnrollmentToken
	}
	hash := sha(token)
	for again := true; ; again = false {
		t.mu.Lock()
		et, found := t.tokens[id]
		var tok EnrollmentToken
		if found {
			tok = *et
		}
		t.mu.Unlock()
		if !found && again {
			if read, err := t.lookAgain(ctx); err != nil {
				return EnrollmentToken{}, err
			} else if read {
				continue
			}
		}
		if !found || len(tok.Hash) != 32 || !hashEq(hash, [32]byte(tok.Hash)) {
			return EnrollmentToken{}, ErrEnrollmentToken
		}
		if tok.UsedAt != nil || tok.Revoked || !t.now().Before(tok.ExpiresAt) || (tok.MachineID != "" && tok.MachineID != machineID) {
			return EnrollmentToken{}, ErrEnrollmentToken
		}
		return tok, nil
	}
}

// useEnrollmentToken marks a token used by deviceID, once.
func (t *trust) useEnrollmentToken(ctx context.Context, id, deviceID uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	et, ok := t.tokens[id]
	if !ok || et.UsedAt != nil || et.Revoked {
		return ErrEnrollmentToken
	}
	nt := *et
	now := t.now().UTC().Truncate(time.Millisecond)
	nt.UsedAt, nt.DeviceID = &now, deviceID
	if cs := t.cluster; cs != nil {
		won, err := cs.UseEnrollmentToken(ctx, id, deviceID, now)
		if err != nil {
			return err
		}
		if !won { // used or revoked on another node
			return ErrEnrollmentToken
		}
		t.note(ctx, ChangeEnrollment, id)
	} else if t.store != nil {
		if err := t.store.SaveEnrollmentToken(ctx, nt); err != nil {
			return err
		}
	}
	*et = nt
	t.log.Info("enrollment token", "action", "use", "token_id", id, "device_id", deviceID)
	return nil
}

// AddPreauthorized lists machine IDs as allowed to register under the
// preauthorized policy. It returns how many were new.
func (t *trust) AddPreauthorized(ctx context.Context, machineIDs []string, actor string) (int, error) {
	for _, id := range machineIDs {
		if err := ValidMachineID(id); err != nil {
			return 0, err
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.init()
	var fresh []string
	seen := map[string]bool{}
	for _, id := range machineIDs {
		if _, ok := t.preauth[id]; !ok && !seen[id] {
			seen[id] = true
			fresh = append(fresh, id)
		}
	}
	now := t.now().UTC().Truncate(time.Millisecond)
	if t.store != nil && len(fresh) > 0 {
		if err := t.store.AddPreauthorized(ctx, fresh, now); err != nil {
			return 0, err
		}
	}
	for _, id := range fresh {
		t.preauth[id] = now
	}
	if len(fresh) > 0 {
		t.note(ctx, ChangeEnrollment, 0)
	}
	t.log.Info("preauthorized machine IDs", "action", "add", "count", len(fresh), "by", actor)
	return len(fresh), nil
}

// RemovePreauthorized takes a machine ID off the list.
func (t *trust) RemovePreauthorized(ctx context.Context, machineID, actor string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.preauth[machineID]; !ok {
		return ErrNotFound
	}
	if t.store != nil {
		if err := t.store.DeletePreauthorized(ctx, machineID); err != nil {
			return err
		}
	}
	delete(t.preauth, machineID)
	t.note(ctx, ChangeEnrollment, 0)
	t.log.Info("preauthorized machine IDs", "action", "remove", "machine_id", machineID, "by", actor)
	return nil
}

// PreauthorizedIDs lists the preauthorized machine IDs in order, with the
// device that registered each (if any).
func (t *trust) PreauthorizedIDs() []Preauthorized {
	t.mu.Lock()
	out := make([]Preauthorized, 0, len(t.preauth))
	for id, at := range t.preauth {
		out = append(out, Preauthorized{MachineID: id, AddedAt: at})
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].MachineID < out[j].MachineID })
	for i := range out {
		out[i].DeviceID, _ = t.devs.deviceOf(out[i].MachineID)
	}
	return out
}

// isPreauthorized says whether machineID may register under the
// preauthorized policy; in cluster mode one memory does not know is
// looked for in the database too.
func (t *trust) isPreauthorized(ctx context.Context, machineID string) (bool, error) {
	for again := true; ; again = false {
		t.mu.Lock()
		_, ok := t.preauth[machineID]
		t.mu.Unlock()
		if ok || !again {
			return ok, nil
		}
		if read, err := t.lookAgain(ctx); err != nil || !read {
			return false, err
		}
	}
}

// reloadEnrollment replaces the enrollment tokens and preauthorized
// machine IDs with the stored ones.
func (t *trust) reloadEnrollment(ctx context.Context) error {
	// Read under the lock: a token this node makes meanwhile is then
	// either in what is read or made after.
	t.mu.Lock()
	defer t.mu.Unlock()
	st, err := t.cluster.LoadEnrollment(ctx)
	if err != nil {
		return err
	}
	t.tokens = make(map[uint64]*EnrollmentToken, len(st.Tokens))
	for i := range st.Tokens {
		et := st.Tokens[i]
		t.tokens[et.ID] = &et
	}
	t.preauth = make(map[string]time.Time, len(st.Preauthorized))
	for _, p := range st.Preauthorized {
		t.preauth[p.MachineID] = p.AddedAt
	}
	return nil
}

// lookAgain, in cluster mode, reads the enrollment tokens and
// preauthorized machine IDs back when memory does not know one a
// registration names: another node may have made it a moment ago. It
// says whether it read; past storedChecksPerSecond it answers
// ErrOverloaded (503), not a wrong refusal.
func (t *trust) lookAgain(ctx context.Context) (bool, error) {
	if t.cluster == nil {
		return false, nil
	}
	if !t.mayRead() {
		return false, ErrOverloaded
	}
	if err := t.reloadEnrollment(ctx); err != nil {
		return false, errors.Join(ErrUnavailable, err)
	}
	return true, nil
}
