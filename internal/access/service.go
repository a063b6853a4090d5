package access

import (
	"context"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/bcrypt"
)

// Options configure a Service.
type Options struct {
	Store Store // nil: in memory (NewMem)
	// AdminToken is the bootstrap credential: it acts as an admin, with
	// or without users.
	AdminToken string
	Now        func() time.Time
	// CacheTTL is how long a user or token looked up in the store is
	// trusted before it is read again (default 2 s): a change made on
	// another server of a cluster takes effect within it, one made here
	// at once.
	CacheTTL time.Duration
	// OnChange, when set, runs after a change of users or tokens made
	// here is stored: in a cluster it tells the other servers, which then
	// call Forget, so that the change holds there at once too.
	OnChange func(ctx context.Context)
	// BcryptCost of new passwords (default bcrypt.DefaultCost).
	BcryptCost int
	Logger     *slog.Logger
}

// MinPassword is the shortest password accepted.
const MinPassword = 10

// Actor is who makes a request.
type Actor struct {
	Name       string `json:"name"` // user name; AdminActor for the admin token
	Role       Role   `json:"role"`
	Credential string `json:"credential"` // "password", "token:NAME", "admin-token"
}

// AdminActor names the bootstrap admin token in the audit log.
const AdminActor = "admin-token"

// Bootstrap is the actor of the admin token.
var Bootstrap = Actor{Name: AdminActor, Role: Admin, Credential: "admin-token"}

// ErrUnauthorized: no such credential, or a wrong, expired or revoked one.
var ErrUnauthorized = errors.New("credential missing, wrong, expired or revoked")

// Service is the users, tokens and audit log over a Store.
type Service struct {
	o   Options
	log *slog.Logger

	mu     sync.Mutex
	users  map[string]cachedUser
	tokens map[string]cachedToken // by string(hash)

	admin atomic.Pointer[string] // SetAdminToken's; nil: Options.AdminToken
	tagMu sync.Mutex
	tag   struct{ token, tag string } // AdminSessionTag's, for token
}

type cachedUser struct {
	u   User
	err error
	at  time.Time
}

type cachedToken struct {
	t    Token
	u    User
	err  error
	at   time.Time
	last time.Time // last use written to the store
}

// New makes a Service.
func New(o Options) *Service {
	if o.Store == nil {
		o.Store = NewMem()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.CacheTTL <= 0 {
		o.CacheTTL = 2 * time.Second
	}
	if o.BcryptCost == 0 {
		o.BcryptCost = bcrypt.DefaultCost
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{o: o, log: o.Logger, users: map[string]cachedUser{}, tokens: map[string]cachedToken{}}
}

// changed drops every cached user and token after a change here, and
// tells the other servers (Options.OnChange).
func (s *Service) changed(ctx context.Context) {
	s.forget()
	if s.o.OnChange != nil {
		s.o.OnChange(ctx)
	}
}

// Forget drops every cached user and token: another server of a cluster
// changed them. It is the same as after a change made here.
func (s *Service) Forget() { s.forget() }

// forget drops every cached user and token.
func (s *Service) forget() {
	s.mu.Lock()
	clear(s.users)
	clear(s.tokens)
	s.mu.Unlock()
}

// SetAdminToken replaces the bootstrap token (a token rotated in its
// file, read again on SIGHUP): from now on the old one is refused.
func (s *Service) SetAdminToken(token string) { s.admin.Store(&token) }

// adminToken is the bootstrap token in force; "" for none.
func (s *Service) adminToken() string {
	if p := s.admin.Load(); p != nil {
		return *p
	}
	return s.o.AdminToken
}

// IsAdminToken checks the bootstrap token in constant time.
func (s *Service) IsAdminToken(secret string) bool {
	t := s.adminToken()
	return t != "" && subtle.ConstantTimeCompare([]byte(secret), []byte(t)) == 1
}

// Authenticate finds the actor of a bearer token: the admin token or a
// live user token.
func (s *Service) Authenticate(ctx context.Context, secret string) (Actor, error) {
	if secret == "" {
		return Actor{}, ErrUnauthorized
	}
	if s.IsAdminToken(secret) {
		return Bootstrap, nil
	}
	if len(secret) <= len(TokenPrefix) || secret[:len(TokenPrefix)] != TokenPrefix {
		return Actor{}, ErrUnauthorized
	}
	now := s.o.Now()
	key := string(HashSecret(secret))
	s.mu.Lock()
	c, ok := s.tokens[key]
	s.mu.Unlock()
	if !ok || now.Sub(c.at) > s.o.CacheTTL {
		c = cachedToken{at: now, last: c.last}
		c.t, c.err = s.o.Store.TokenByHash(ctx, []byte(key))
		if c.err == nil {
			c.u, c.err = s.o.Store.User(ctx, c.t.User)
		}
		if c.err != nil && !errors.Is(c.err, ErrNotFound) {
			return Actor{}, c.err // the store failed: not cached
		}
		if c.last.IsZero() {
			c.last = c.t.LastUsed
		}
		s.mu.Lock()
		if len(s.tokens) > 10000 {
			clear(s.tokens)
		}
		s.tokens[key] = c
		s.mu.Unlock()
	}
	if c.err != nil || !c.t.Live(now) {
		return Actor{}, ErrUnauthorized
	}
	if now.Sub(c.last) >= time.Minute {
		// Last use is kept to the minute: one write a minute per token.
		if err := s.o.Store.TouchToken(ctx, c.t.ID, now); err != nil {
			s.log.Warn("token last-use update failed", "token", c.t.ID, "err", err)
		} else {
			s.mu.Lock()
			if cur, ok := s.tokens[key]; ok {
				cur.last = now
				s.tokens[key] = cur
			}
			s.mu.Unlock()
		}
	}
	return Actor{Name: c.u.Name, Role: c.u.Role, Credential: "token:" + c.t.Name}, nil
}

// user reads a user through the cache.
func (s *Service) user(ctx context.Context, name string) (User, error) {
	now := s.o.Now()
	s.mu.Lock()
	c, ok := s.users[name]
	s.mu.Unlock()
	if ok && now.Sub(c.at) <= s.o.CacheTTL {
		return c.u, c.err
	}
	u, err := s.o.Store.User(ctx, name)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return User{}, err
	}
	s.mu.Lock()
	if len(s.users) > 10000 {
		clear(s.users)
	}
	s.users[name] = cachedUser{u: u, err: err, at: now}
	s.mu.Unlock()
	return u, err
}

// AdminSessionTag is what a dashboard session logged in with the admin
// token keeps as its credential, so that the session ends once the token
// is replaced (SetAdminToken, a restart with another token): an Argon2id
// digest of the token (OWASP's parameters: 19 MiB, 2 passes), made once
// per token, so that the sessions table does not make a weak token quick
// to guess. "" when there is no admin token.
func (s *Service) AdminSessionTag() string {
	t := s.adminToken()
	if t == "" {
		return ""
	}
	s.tagMu.Lock()
	defer s.tagMu.Unlock()
	if s.tag.token != t || s.tag.tag == "" {
		k := argon2.IDKey([]byte(t), []byte("drover admin-token session"), 2, 19*1024, 1, 16)
		s.tag.token, s.tag.tag = t, "admin-token:"+hex.EncodeToString(k)
	}
	return s.tag.tag
}

// Session finds the actor of a dashboard session by the name it was made
// for: "" is the admin token's, anything else a user, who must still exist
// (with the role the user has now). An admin token session made with
// another admin token than the one in force (its credential is not
// AdminSessionTag) has ended; one stored without a tag (an older
// version's) lasts until it expires.
func (s *Service) Session(ctx context.Context, name, credential string) (Actor, error) {
	if name == "" {
		tag := s.AdminSessionTag()
		if tag == "" || (credential != "" && subtle.ConstantTimeCompare([]byte(credential), []byte(tag)) != 1) {
			return Actor{}, ErrUnauthorized
		}
		return Bootstrap, nil
	}
	u, err := s.user(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return Actor{}, ErrUnauthorized
	}
	if err != nil {
		return Actor{}, err
	}
	if credential == "" {
		credential = "password"
	}
	return Actor{Name: u.Name, Role: u.Role, Credential: credential}, nil
}

// dummyHash makes a failed login for an unknown user cost what a wrong
// password costs.
var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("drover-no-such-user"), bcrypt.DefaultCost)

// Login checks a dashboard login: a user's password, or the admin token
// as the password of "admin" (or of no name) when no user "admin" exists.
// The session is to be made for the returned actor's SessionName.
func (s *Service) Login(ctx context.Context, name, password string) (Actor, error) {
	if password == "" {
		return Actor{}, ErrUnauthorized
	}
	if name == "" || name == "admin" {
		if s.IsAdminToken(password) {
			return Bootstrap, nil
		}
		if name == "" {
			return Actor{}, ErrUnauthorized
		}
	}
	u, err := s.o.Store.User(ctx, name)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Actor{}, err
	}
	hash := []byte(u.PasswordHash)
	if err != nil || len(hash) == 0 {
		hash = dummyHash
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil || err != nil || u.PasswordHash == "" {
		return Actor{}, ErrUnauthorized
	}
	return Actor{Name: u.Name, Role: u.Role, Credential: "password"}, nil
}

// SessionName is the name a session of this actor is stored under.
func (a Actor) SessionName() string {
	if a == Bootstrap {
		return ""
	}
	return a.Name
}

func (s *Service) hashPassword(p string) (string, error) {
	if len(p) < MinPassword {
		return "", fmt.Errorf("%w: the password must have at least %d characters", ErrInvalid, MinPassword)
	}
	if len(p) > 72 {
		return "", fmt.Errorf("%w: the password must have at most 72 bytes", ErrInvalid) // bcrypt's limit
	}
	h, err := bcrypt.GenerateFromPassword([]byte(p), s.o.BcryptCost)
	return string(h), err
}

// AddUser creates a user; password may be "" (no dashboard login until
// one is set).
func (s *Service) AddUser(ctx context.Context, name string, role Role, password string) (User, error) {
	if err := s.CheckNewUser(ctx, name, role); err != nil {
		return User{}, err
	}
	now := s.o.Now().UTC().Truncate(time.Millisecond)
	u := User{Name: name, Role: role, CreatedAt: now, UpdatedAt: now}
	if password != "" {
		h, err := s.hashPassword(password)
		if err != nil {
			return User{}, err
		}
		u.PasswordHash = h
	}
	if err := s.o.Store.SaveUser(ctx, u); err != nil {
		return User{}, err
	}
	s.changed(ctx)
	return u, nil
}

// CheckNewUser checks what AddUser would of a new user, and changes
// nothing.
func (s *Service) CheckNewUser(ctx context.Context, name string, role Role) error {
	if err := CheckName("the user name", name); err != nil {
		return err
	}
	if role < Viewer || role > Admin {
		return fmt.Errorf("%w: role must be admin, operator or viewer", ErrInvalid)
	}
	if _, err := s.o.Store.User(ctx, name); err == nil {
		return fmt.Errorf("%w: user %q", ErrExists, name)
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// CheckUserChange checks what UpdateUser would, and changes nothing: the
// user as it would be.
func (s *Service) CheckUserChange(ctx context.Context, name string, c UserChange) (User, error) {
	u, err := s.o.Store.User(ctx, name)
	if err != nil {
		return User{}, err
	}
	if c.Role != nil {
		if *c.Role < Viewer || *c.Role > Admin {
			return User{}, fmt.Errorf("%w: role must be admin, operator or viewer", ErrInvalid)
		}
		u.Role = *c.Role
	}
	return u, nil
}

// UserChange is a change to a user; nil fields stay.
type UserChange struct {
	Role     *Role   `json:"role"`
	Password *string `json:"password"`
}

// UpdateUser changes a user's role or password.
func (s *Service) UpdateUser(ctx context.Context, name string, c UserChange) (User, error) {
	u, err := s.CheckUserChange(ctx, name, c)
	if err != nil {
		return User{}, err
	}
	if c.Password != nil {
		if *c.Password == "" {
			u.PasswordHash = ""
		} else if u.PasswordHash, err = s.hashPassword(*c.Password); err != nil {
			return User{}, err
		}
	}
	u.UpdatedAt = s.o.Now().UTC().Truncate(time.Millisecond)
	if err := s.o.Store.SaveUser(ctx, u); err != nil {
		return User{}, err
	}
	s.changed(ctx)
	return u, nil
}

// DeleteUser deletes a user and its tokens; its sessions end on their
// next request.
func (s *Service) DeleteUser(ctx context.Context, name string) error {
	if err := s.o.Store.DeleteUser(ctx, name); err != nil {
		return err
	}
	s.changed(ctx)
	return nil
}

// User returns one user.
func (s *Service) User(ctx context.Context, name string) (User, error) {
	return s.o.Store.User(ctx, name)
}

// Users lists the users by name.
func (s *Service) Users(ctx context.Context) ([]User, error) {
	us, err := s.o.Store.Users(ctx)
	sort.Slice(us, func(i, j int) bool { return us[i].Name < us[j].Name })
	return us, err
}

// CreateToken makes a token for a user; the secret is returned once and
// only its hash is stored. expires zero: never.
func (s *Service) CreateToken(ctx context.Context, user, name string, expires time.Time) (Token, string, error) {
	if err := CheckName("the token name", name); err != nil {
		return Token{}, "", err
	}
	if _, err := s.o.Store.User(ctx, user); err != nil {
		return Token{}, "", err
	}
	now := s.o.Now().UTC().Truncate(time.Millisecond)
	if !expires.IsZero() && !expires.After(now) {
		return Token{}, "", fmt.Errorf("%w: the expiry must be in the future", ErrInvalid)
	}
	secret := TokenPrefix + randomHex(24)
	t := Token{ID: randomHex(8), User: user, Name: name, Hash: HashSecret(secret), CreatedAt: now, ExpiresAt: expires.UTC().Truncate(time.Millisecond)}
	if err := s.o.Store.SaveToken(ctx, t); err != nil {
		return Token{}, "", err
	}
	return t, secret, nil
}

// Token returns one token by ID.
func (s *Service) Token(ctx context.Context, id string) (Token, error) {
	ts, err := s.o.Store.Tokens(ctx)
	if err != nil {
		return Token{}, err
	}
	for _, t := range ts {
		if t.ID == id {
			return t, nil
		}
	}
	return Token{}, ErrNotFound
}

// Tokens lists the tokens, of one user or ("") all.
func (s *Service) Tokens(ctx context.Context, user string) ([]Token, error) {
	ts, err := s.o.Store.Tokens(ctx)
	if err != nil || user == "" {
		return ts, err
	}
	out := ts[:0]
	for _, t := range ts {
		if t.User == user {
			out = append(out, t)
		}
	}
	return out, nil
}

// RevokeToken revokes a token: from now on (within CacheTTL on other
// servers of a cluster) it is refused. The row stays, for the audit.
func (s *Service) RevokeToken(ctx context.Context, id string) (Token, error) {
	t, err := s.Token(ctx, id)
	if err != nil {
		return Token{}, err
	}
	if t.RevokedAt.IsZero() {
		t.RevokedAt = s.o.Now().UTC().Truncate(time.Millisecond)
		if err := s.o.Store.SaveToken(ctx, t); err != nil {
			return Token{}, err
		}
	}
	s.changed(ctx)
	return t, nil
}

// Record appends a row to the audit log.
func (s *Service) Record(ctx context.Context, e Entry) error {
	if e.At.IsZero() {
		e.At = s.o.Now()
	}
	e.At = e.At.UTC().Truncate(time.Millisecond)
	return s.o.Store.AddAudit(ctx, e)
}

// Audit reads the audit log, newest first.
func (s *Service) Audit(ctx context.Context, f AuditFilter) ([]Entry, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 100
	}
	return s.o.Store.Audit(ctx, f)
}

// PruneAudit deletes audit rows older than retention.
func (s *Service) PruneAudit(ctx context.Context, retention time.Duration) (int64, error) {
	return s.o.Store.PruneAudit(ctx, s.o.Now().Add(-retention))
}

// ExternalLogin logs in a user a single sign-on provider vouched for
// (via: "oidc"), with the role its claims map to: the user is made, or its
// role updated, without a password. A local user of that name with a
// password is refused (ErrExists): one name, one way to log in.
func (s *Service) ExternalLogin(ctx context.Context, name string, role Role, via string) (Actor, error) {
	if err := CheckName("the user name", name); err != nil {
		return Actor{}, err
	}
	if role < Viewer || role > Admin {
		return Actor{}, fmt.Errorf("%w: no role", ErrInvalid)
	}
	now := s.o.Now().UTC().Truncate(time.Millisecond)
	u, err := s.o.Store.User(ctx, name)
	switch {
	case errors.Is(err, ErrNotFound):
		u = User{Name: name, Role: role, CreatedAt: now, UpdatedAt: now}
	case err != nil:
		return Actor{}, err
	case u.PasswordHash != "":
		return Actor{}, fmt.Errorf("%w: %q is a local user with a password", ErrExists, name)
	}
	if u.Role != role || u.UpdatedAt.Equal(now) {
		u.Role, u.UpdatedAt = role, now
		if err := s.o.Store.SaveUser(ctx, u); err != nil {
			return Actor{}, err
		}
		s.changed(ctx)
	}
	return Actor{Name: u.Name, Role: u.Role, Credential: via}, nil
}
