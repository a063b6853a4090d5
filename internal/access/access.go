// Package access is who may do what on the operator side of Drover: users
// with a role (admin, operator, viewer), their passwords for the dashboard,
// their API tokens (stored hashed, revocable, with an optional expiry), the
// bootstrap admin token, and the audit log of every change. It is a leaf
// package: the store adapters implement its Store, the server and the
// dashboard call its Service (docs/security.md).
package access

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Role is what a user may do; a higher role may do all a lower one may.
type Role uint8

const (
	None     Role = iota // no access
	Viewer               // read everything
	Operator             // also change the fleet: profiles, labels, commands, firmware, rollouts, admission, alerts
	Admin                // also users, tokens, credentials and settings
)

var roleNames = [...]string{None: "none", Viewer: "viewer", Operator: "operator", Admin: "admin"}

// Permission is something a role may do that its level alone does not
// name; the permissions table below gives the least role of each.
type Permission uint8

const (
	// RemoteAccess: open tunnels to the devices and the hosts behind them
	// (port forwarding, docs/remote-access.md).
	RemoteAccess Permission = iota + 1
)

// permissions is the least role of each permission.
var permissions = map[Permission]Role{
	RemoteAccess: Operator,
}

// Least is the least role that has p (Admin for an unknown permission).
func (p Permission) Least() Role {
	if r, ok := permissions[p]; ok {
		return r
	}
	return Admin
}

// May says whether role r has permission p.
func (r Role) May(p Permission) bool { return r >= p.Least() }

func (r Role) String() string {
	if int(r) < len(roleNames) {
		return roleNames[r]
	}
	return fmt.Sprintf("role(%d)", r)
}

// ParseRole reads a role's name.
func ParseRole(s string) (Role, error) {
	for r, n := range roleNames {
		if r > 0 && strings.EqualFold(s, n) {
			return Role(r), nil
		}
	}
	return None, fmt.Errorf("%w: role must be admin, operator or viewer, not %q", ErrInvalid, s)
}

func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

func (r *Role) UnmarshalText(b []byte) error {
	v, err := ParseRole(string(b))
	*r = v
	return err
}

var (
	ErrNotFound = errors.New("not found")
	ErrInvalid  = errors.New("invalid")
	ErrExists   = errors.New("already exists")
)

// User is one operator account. Name is its key.
type User struct {
	Name         string    `json:"name"`
	Role         Role      `json:"role"`
	PasswordHash string    `json:"-"` // bcrypt; "" for no dashboard password (tokens or single sign-on only)
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// Token is one API token of a user, as stored: only the SHA-256 of its
// secret is kept.
type Token struct {
	ID        string    `json:"id"`
	User      string    `json:"user"`
	Name      string    `json:"name"`
	Hash      []byte    `json:"-"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at,omitzero"` // zero: never
	LastUsed  time.Time `json:"last_used,omitzero"`
	RevokedAt time.Time `json:"revoked_at,omitzero"` // zero: live
}

// Live says whether the token may be used at now.
func (t Token) Live(now time.Time) bool {
	return t.RevokedAt.IsZero() && (t.ExpiresAt.IsZero() || now.Before(t.ExpiresAt))
}

// Entry is one row of the audit log.
type Entry struct {
	ID         uint64          `json:"id,string"`
	At         time.Time       `json:"at"`
	Actor      string          `json:"actor"`      // user name, or "admin-token"
	Credential string          `json:"credential"` // "password", "token:NAME", "admin-token", "local" (drover user)
	Remote     string          `json:"remote"`     // client address
	Action     string          `json:"action"`     // e.g. "PUT /api/v1/profiles/{id}"
	Object     string          `json:"object"`     // the object's API path, e.g. "/api/v1/profiles/3"
	Before     json.RawMessage `json:"before,omitempty"`
	After      json.RawMessage `json:"after,omitempty"`
}

// AuditFilter selects audit rows, newest first.
type AuditFilter struct {
	Actor  string    // exact
	Action string    // exact
	Object string    // exact, or a prefix ending in '/' ("/api/v1/profiles/")
	Since  time.Time // inclusive; zero: no bound
	Until  time.Time // exclusive; zero: no bound
	Before uint64    // only IDs below (the cursor); 0: from the newest
	Limit  int       // at most this many (1…1000)
}

// Store keeps users, tokens and the audit log. Every store backend
// implements it (internal/store/storetest checks them); Mem keeps them in
// memory.
type Store interface {
	// SaveUser inserts or replaces the user of that name.
	SaveUser(ctx context.Context, u User) error
	// DeleteUser deletes a user and its tokens; ErrNotFound if none.
	DeleteUser(ctx context.Context, name string) error
	// User returns one user or ErrNotFound.
	User(ctx context.Context, name string) (User, error)
	Users(ctx context.Context) ([]User, error) // in any order
	// SaveToken inserts or replaces the token of that ID.
	SaveToken(ctx context.Context, t Token) error
	// Tokens lists every token (revoked ones too), oldest first.
	Tokens(ctx context.Context) ([]Token, error)
	// TokenByHash returns the token whose secret hashes to hash, or
	// ErrNotFound.
	TokenByHash(ctx context.Context, hash []byte) (Token, error)
	// TouchToken sets a token's last use.
	TouchToken(ctx context.Context, id string, at time.Time) error
	// AddAudit appends a row (its ID is given by the store, increasing).
	AddAudit(ctx context.Context, e Entry) error
	// Audit reads rows by f, newest first.
	Audit(ctx context.Context, f AuditFilter) ([]Entry, error)
	// PruneAudit deletes rows older than before.
	PruneAudit(ctx context.Context, before time.Time) (int64, error)
}

// HashSecret is the stored form of a token's secret.
func HashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// TokenPrefix starts every user API token, so that they are recognisable
// (in logs, secret scanners) and never mistaken for the admin token.
const TokenPrefix = "drv_"

// CheckName checks a user or token name: 1…64 bytes of printable UTF-8
// without spaces at either end and without ':'.
func CheckName(what, s string) error {
	if s == "" || len(s) > 64 || !utf8.ValidString(s) || strings.TrimSpace(s) != s || strings.ContainsAny(s, ":\x00") {
		return fmt.Errorf("%w: %s must be 1 to 64 bytes of UTF-8, no ':' and no spaces at either end", ErrInvalid, what)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: %s must not contain control characters", ErrInvalid, what)
		}
	}
	return nil
}

// ObjectPath fills a route pattern's {wildcards} with value(name): the
// object path the audit log names ("/api/v1/profiles/{id}" →
// "/api/v1/profiles/3").
func ObjectPath(pattern string, value func(name string) string) string {
	if pattern == "" {
		return ""
	}
	var b strings.Builder
	for seg := range strings.SplitSeq(strings.TrimPrefix(pattern, "/"), "/") {
		b.WriteByte('/')
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
			b.WriteString(value(strings.Trim(seg, "{}")))
		} else {
			b.WriteString(seg)
		}
	}
	return b.String()
}
