package access

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"time"
)

// Mem is a Store in memory (memory persistence mode, tests).
type Mem struct {
	mu     sync.Mutex
	users  map[string]User
	tokens []Token
	audit  []Entry
	nextID uint64
}

var _ Store = (*Mem)(nil)

// NewMem returns an empty Mem.
func NewMem() *Mem { return &Mem{users: map[string]User{}} }

func (m *Mem) SaveUser(ctx context.Context, u User) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.users[u.Name] = u
	return nil
}

func (m *Mem) DeleteUser(ctx context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.users[name]; !ok {
		return ErrNotFound
	}
	delete(m.users, name)
	m.tokens = slices.DeleteFunc(m.tokens, func(t Token) bool { return t.User == name })
	return nil
}

func (m *Mem) User(ctx context.Context, name string) (User, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	u, ok := m.users[name]
	if !ok {
		return User{}, ErrNotFound
	}
	return u, nil
}

func (m *Mem) Users(ctx context.Context) ([]User, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var us []User
	for _, u := range m.users {
		us = append(us, u)
	}
	return us, nil
}

func (m *Mem) SaveToken(ctx context.Context, t Token) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	t.Hash = bytes.Clone(t.Hash)
	for i := range m.tokens {
		if m.tokens[i].ID == t.ID {
			m.tokens[i] = t
			return nil
		}
	}
	m.tokens = append(m.tokens, t)
	return nil
}

func (m *Mem) Tokens(ctx context.Context) ([]Token, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.tokens), nil
}

func (m *Mem) TokenByHash(ctx context.Context, hash []byte) (Token, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range m.tokens {
		if bytes.Equal(t.Hash, hash) {
			return t, nil
		}
	}
	return Token{}, ErrNotFound
}

func (m *Mem) TouchToken(ctx context.Context, id string, at time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.tokens {
		if m.tokens[i].ID == id {
			m.tokens[i].LastUsed = at.UTC().Truncate(time.Millisecond)
		}
	}
	return nil
}

func (m *Mem) AddAudit(ctx context.Context, e Entry) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextID++
	e.ID = m.nextID
	m.audit = append(m.audit, e)
	return nil
}

// Matches says whether e passes f (ignoring Limit); Mem's filter, and the
// reference the SQL adapters' queries follow.
func (f AuditFilter) Matches(e Entry) bool {
	switch {
	case f.Actor != "" && e.Actor != f.Actor,
		f.Action != "" && e.Action != f.Action,
		f.Object != "" && !(e.Object == f.Object || strings.HasSuffix(f.Object, "/") && strings.HasPrefix(e.Object, f.Object)),
		!f.Since.IsZero() && e.At.Before(f.Since),
		!f.Until.IsZero() && !e.At.Before(f.Until),
		f.Before != 0 && e.ID >= f.Before:
		return false
	}
	return true
}

func (m *Mem) Audit(ctx context.Context, f AuditFilter) ([]Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Entry
	for i := len(m.audit) - 1; i >= 0 && len(out) < f.Limit; i-- {
		if f.Matches(m.audit[i]) {
			out = append(out, m.audit[i])
		}
	}
	return out, nil
}

func (m *Mem) PruneAudit(ctx context.Context, before time.Time) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.audit)
	m.audit = slices.DeleteFunc(m.audit, func(e Entry) bool { return e.At.Before(before) })
	return int64(n - len(m.audit)), nil
}
