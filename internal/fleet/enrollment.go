package fleet

// Enrollment tokens (single-use, expiring, optionally bound to a machine ID)
// and preauthorized machine IDs: the operator's provisioning credentials.

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/drover/drover/internal/protocol"
)

// trustRegistry holds enrollment tokens and preauthorized machine IDs.
type trustRegistry struct {
	mu        sync.Mutex
	store     TrustStore // nil: memory only
	tokens    map[uint64]*EnrollmentToken
	nextToken uint64
	preauth   map[string]time.Time
}

func (r *trustRegistry) init() {
	if r.tokens == nil {
		r.tokens, r.preauth, r.nextToken = map[uint64]*EnrollmentToken{}, map[string]time.Time{}, 1
	}
	if r.nextToken == 0 {
		r.nextToken = 1
	}
}

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
func (s *Service) CreateEnrollmentToken(ctx context.Context, machineID string, ttl time.Duration, note, actor string) (string, EnrollmentToken, error) {
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
	r := &s.trust
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	id := r.nextToken
	if cs := s.opts.Cluster; cs != nil {
		var err error
		if id, err = cs.NextTokenID(ctx); err != nil {
			return "", EnrollmentToken{}, err
		}
	}
	secret, hash := newSecret("et-" + strconv.FormatUint(id, 10) + ".")
	now := s.now().UTC().Truncate(time.Millisecond)
	t := EnrollmentToken{ID: id, MachineID: machineID, Note: note, CreatedAt: now, ExpiresAt: now.Add(ttl), Hash: hash[:]}
	if r.store != nil {
		if err := r.store.SaveEnrollmentToken(ctx, t); err != nil {
			return "", EnrollmentToken{}, err
		}
	}
	r.nextToken = max(r.nextToken, id+1)
	r.tokens[id] = &t
	s.noteChange(ctx, ChangeEnrollment, id)
	s.log.Info("enrollment token", "action", "create", "token_id", id, "machine_id", machineID, "expires", t.ExpiresAt, "by", actor)
	return secret, t, nil
}

// EnrollmentTokens lists the tokens, newest first.
func (s *Service) EnrollmentTokens() []EnrollmentToken {
	r := &s.trust
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]EnrollmentToken, 0, len(r.tokens))
	for _, t := range r.tokens {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID > out[j].ID })
	return out
}

// RevokeEnrollmentToken makes a token unusable (it stays listed).
func (s *Service) RevokeEnrollmentToken(ctx context.Context, id uint64, actor string) (EnrollmentToken, error) {
	if s.opts.Cluster != nil {
		// Another node may have made or used it: start from the stored one.
		if err := s.reloadEnrollment(ctx); err != nil {
			return EnrollmentToken{}, errors.Join(ErrUnavailable, err)
		}
	}
	r := &s.trust
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tokens[id]
	if !ok {
		return EnrollmentToken{}, ErrNotFound
	}
	nt := *t
	nt.Revoked = true
	if r.store != nil {
		if err := r.store.SaveEnrollmentToken(ctx, nt); err != nil {
			return EnrollmentToken{}, err
		}
	}
	*t = nt
	s.noteChange(ctx, ChangeEnrollment, id)
	s.log.Info("enrollment token", "action", "revoke", "token_id", id, "by", actor)
	return nt, nil
}

// checkEnrollmentToken finds a usable token for machineID; in cluster
// mode a token memory does not know is looked for in the database too.
func (s *Service) checkEnrollmentToken(ctx context.Context, token, machineID string) (EnrollmentToken, error) {
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
	r := &s.trust
	for again := true; ; again = false {
		r.mu.Lock()
		t, found := r.tokens[id]
		var tok EnrollmentToken
		if found {
			tok = *t
		}
		r.mu.Unlock()
		if !found && again {
			if read, err := s.lookAgain(ctx); err != nil {
				return EnrollmentToken{}, err
			} else if read {
				continue
			}
		}
		if !found || len(tok.Hash) != 32 || !hashEq(hash, [32]byte(tok.Hash)) {
			return EnrollmentToken{}, ErrEnrollmentToken
		}
		if tok.UsedAt != nil || tok.Revoked || !s.now().Before(tok.ExpiresAt) || (tok.MachineID != "" && tok.MachineID != machineID) {
			return EnrollmentToken{}, ErrEnrollmentToken
		}
		return tok, nil
	}
}

// useEnrollmentToken marks a token used by deviceID, once.
func (s *Service) useEnrollmentToken(ctx context.Context, id, deviceID uint64) error {
	r := &s.trust
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tokens[id]
	if !ok || t.UsedAt != nil || t.Revoked {
		return ErrEnrollmentToken
	}
	nt := *t
	now := s.now().UTC().Truncate(time.Millisecond)
	nt.UsedAt, nt.DeviceID = &now, deviceID
	if cs := s.opts.Cluster; cs != nil {
		won, err := cs.UseEnrollmentToken(ctx, id, deviceID, now)
		if err != nil {
			return err
		}
		if !won { // used or revoked on another node
			return ErrEnrollmentToken
		}
		s.noteChange(ctx, ChangeEnrollment, id)
	} else if r.store != nil {
		if err := r.store.SaveEnrollmentToken(ctx, nt); err != nil {
			return err
		}
	}
	*t = nt
	s.log.Info("enrollment token", "action", "use", "token_id", id, "device_id", deviceID)
	return nil
}

// AddPreauthorized lists machine IDs as allowed to register under the
// preauthorized policy. It returns how many were new.
func (s *Service) AddPreauthorized(ctx context.Context, machineIDs []string, actor string) (int, error) {
	for _, id := range machineIDs {
		if err := ValidMachineID(id); err != nil {
			return 0, err
		}
	}
	r := &s.trust
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	var fresh []string
	seen := map[string]bool{}
	for _, id := range machineIDs {
		if _, ok := r.preauth[id]; !ok && !seen[id] {
			seen[id] = true
			fresh = append(fresh, id)
		}
	}
	now := s.now().UTC().Truncate(time.Millisecond)
	if r.store != nil && len(fresh) > 0 {
		if err := r.store.AddPreauthorized(ctx, fresh, now); err != nil {
			return 0, err
		}
	}
	for _, id := range fresh {
		r.preauth[id] = now
	}
	if len(fresh) > 0 {
		s.noteChange(ctx, ChangeEnrollment, 0)
	}
	s.log.Info("preauthorized machine IDs", "action", "add", "count", len(fresh), "by", actor)
	return len(fresh), nil
}

// RemovePreauthorized takes a machine ID off the list.
func (s *Service) RemovePreauthorized(ctx context.Context, machineID, actor string) error {
	r := &s.trust
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.preauth[machineID]; !ok {
		return ErrNotFound
	}
	if r.store != nil {
		if err := r.store.DeletePreauthorized(ctx, machineID); err != nil {
			return err
		}
	}
	delete(r.preauth, machineID)
	s.noteChange(ctx, ChangeEnrollment, 0)
	s.log.Info("preauthorized machine IDs", "action", "remove", "machine_id", machineID, "by", actor)
	return nil
}

// PreauthorizedIDs lists the preauthorized machine IDs in order, with the
// device that registered each (if any).
func (s *Service) PreauthorizedIDs() []Preauthorized {
	r := &s.trust
	r.mu.Lock()
	out := make([]Preauthorized, 0, len(r.preauth))
	for id, at := range r.preauth {
		out = append(out, Preauthorized{MachineID: id, AddedAt: at})
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].MachineID < out[j].MachineID })
	s.regMu.Lock()
	for i := range out {
		out[i].DeviceID, _ = s.machineIDs.get(out[i].MachineID)
	}
	s.regMu.Unlock()
	return out
}

// isPreauthorized says whether machineID may register under the
// preauthorized policy; in cluster mode one memory does not know is
// looked for in the database too.
func (s *Service) isPreauthorized(ctx context.Context, machineID string) (bool, error) {
	r := &s.trust
	for again := true; ; again = false {
		r.mu.Lock()
		_, ok := r.preauth[machineID]
		r.mu.Unlock()
		if ok || !again {
			return ok, nil
		}
		if read, err := s.lookAgain(ctx); err != nil || !read {
			return false, err
		}
	}
}
