// Package sessions is how the dashboard keeps logins: a Store of sessions
// by the SHA-256 of their ID (the cookie value itself is never stored), so
// that every backend persists them and a restart keeps operators logged in.
package sessions

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"time"
)

// Session is one login as stored.
type Session struct {
	Hash    []byte // SHA-256 of the session ID (the cookie)
	CSRF    string // the session's CSRF token for form posts
	Expires time.Time
	// User is the user logged in (internal/access); "" the admin token.
	User string
	// Credential is how: "password", "oidc"…; for the admin token a
	// digest of it (access.Service.AdminSessionTag), "" when stored by an
	// earlier version.
	Credential string
}

// ErrNotFound is returned for an unknown (or deleted) session.
var ErrNotFound = errors.New("no such session")

// Store keeps sessions. Every store backend implements it
// (internal/store/storetest checks them); Mem keeps them in memory.
type Store interface {
	SaveSession(ctx context.Context, s Session) error
	// LoadSession returns the session with this hash, expired or not, or
	// ErrNotFound.
	LoadSession(ctx context.Context, hash []byte) (Session, error)
	DeleteSession(ctx context.Context, hash []byte) error
	// PruneSessions deletes the sessions expired before now.
	PruneSessions(ctx context.Context, now time.Time) (int64, error)
}

// Hash is the stored form of a session ID.
func Hash(id string) []byte {
	h := sha256.Sum256([]byte(id))
	return h[:]
}

// Mem is a Store in memory (memory persistence mode, tests).
type Mem struct {
	mu sync.Mutex
	m  map[string]Session
}

// NewMem returns an empty Mem.
func NewMem() *Mem { return &Mem{m: map[string]Session{}} }

func (m *Mem) SaveSession(ctx context.Context, s Session) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s.Hash = append([]byte(nil), s.Hash...)
	m.m[string(s.Hash)] = s
	return nil
}

func (m *Mem) LoadSession(ctx context.Context, hash []byte) (Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.m[string(hash)]
	if !ok {
		return Session{}, ErrNotFound
	}
	return s, nil
}

func (m *Mem) DeleteSession(ctx context.Context, hash []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, string(hash))
	return nil
}

func (m *Mem) PruneSessions(ctx context.Context, now time.Time) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for k, s := range m.m {
		if s.Expires.Before(now) {
			delete(m.m, k)
			n++
		}
	}
	return n, nil
}
