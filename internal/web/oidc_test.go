package web_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"golang.org/x/crypto/bcrypt"

	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/alert"
	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/web"
)

// provider is a small OpenID Connect provider: discovery, keys, and a
// token endpoint that checks the code and its PKCE verifier and answers an
// ID token with the claims the test set.
type provider struct {
	t      *testing.T
	srv    *httptest.Server
	key    *rsa.PrivateKey
	signer *rsa.PrivateKey // signs ID tokens (another key: forged)

	mu        sync.Mutex
	claims    map[string]any
	code      string
	challenge string
}

func newProvider(t *testing.T) *provider {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p := &provider{t: t, key: key, signer: key}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"issuer": p.srv.URL, "authorization_endpoint": p.srv.URL + "/authorize",
			"token_endpoint": p.srv.URL + "/token", "jwks_uri": p.srv.URL + "/keys", "id_token_signing_alg_values_supported": []string{"RS256"}})
	})
	mux.HandleFunc("GET /keys", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &p.key.PublicKey, KeyID: "k1", Algorithm: "RS256", Use: "sig"}}})
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		sum := sha256.Sum256([]byte(r.PostFormValue("code_verifier")))
		if r.PostFormValue("code") != p.code || base64.RawURLEncoding.EncodeToString(sum[:]) != p.challenge {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]string{"error": "invalid_grant"})
			return
		}
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: p.signer}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", "k1"))
		if err != nil {
			t.Error(err)
			return
		}
		payload, _ := json.Marshal(p.claims)
		jws, err := signer.Sign(payload)
		if err != nil {
			t.Error(err)
			return
		}
		raw, _ := jws.CompactSerialize()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"access_token": "at", "token_type": "Bearer", "expires_in": 3600, "id_token": raw})
	})
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

// Single sign-on: a user of the provider logs in with the role its groups
// map to and is made a user without a password; a token with another
// nonce, signed by another key, without a Drover role, or a callback whose
// state did not start here logs nobody in; a local user's name cannot be
// taken over.
func TestOIDCLogin(t *testing.T) {
	p := newProvider(t)
	ctx := context.Background()
	fl, err := fleet.New(ctx, fleet.Stores{}, nil, fleet.Options{EnrollmentSecret: "s", DefaultPushInterval: 60})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := alert.New(ctx, alert.Options{Fleet: fl})
	if err != nil {
		t.Fatal(err)
	}
	acc := access.New(access.Options{AdminToken: token, BcryptCost: bcrypt.MinCost})
	if _, err := acc.AddUser(ctx, "local", access.Admin, "local-password"); err != nil {
		t.Fatal(err)
	}
	var h *web.Handler
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	h, err = web.New(web.Options{Fleet: fl, Alerts: eng, Access: acc, OIDC: &web.OIDC{
		Issuer: p.srv.URL, ClientID: "drover", ClientSecret: "sesame", RedirectURL: srv.URL + "/ui/oidc/callback",
		Roles: map[string]access.Role{"drover-ops": access.Operator, "drover-view": access.Viewer, "drover-admins": access.Admin},
	}})
	if err != nil {
		t.Fatal(err)
	}
	type attempt struct {
		name      string
		claims    map[string]any // nonce filled in unless set
		forge     bool           // sign with another key
		badState  bool
		wantLogin bool
		wantWho   string
		status    int // of a refused callback
	}
	now := time.Now()
	base := func(user string, groups ...string) map[string]any {
		return map[string]any{"iss": p.srv.URL, "sub": "id-" + user, "aud": "drover", "exp": now.Add(time.Hour).Unix(), "iat": now.Unix(),
			"preferred_username": user, "groups": groups}
	}
	withNonce := base("carol", "drover-ops")
	withNonce["nonce"] = "not-this-login"
	otherAud := base("carol", "drover-ops")
	otherAud["aud"] = "someone-else"
	for _, a := range []attempt{
		{name: "operator", claims: base("carol", "staff", "drover-ops", "drover-view"), wantLogin: true, wantWho: "carol (operator)"},
		{name: "role follows the groups", claims: base("carol", "drover-view"), wantLogin: true, wantWho: "carol (viewer)"},
		{name: "wrong nonce", claims: withNonce, status: 401},
		{name: "other audience", claims: otherAud, status: 401},
		{name: "forged", claims: base("mallory", "drover-admins"), forge: true, status: 401},
		{name: "no role", claims: base("dave", "staff"), status: 403},
		{name: "state from elsewhere", claims: base("carol", "drover-ops"), badState: true, status: 403},
		{name: "local user", claims: base("local", "drover-view"), status: 403},
	} {
		t.Run(a.name, func(t *testing.T) {
			jar, _ := cookiejar.New(nil)
			c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			resp, err := c.Get(srv.URL + "/ui/oidc/start?next=/ui/devices")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			loc, err := url.Parse(resp.Header.Get("Location"))
			if err != nil || resp.StatusCode != http.StatusFound || !strings.HasPrefix(loc.String(), p.srv.URL+"/authorize") {
				t.Fatalf("start: %d %q", resp.StatusCode, resp.Header.Get("Location"))
			}
			q := loc.Query()
			if q.Get("client_id") != "drover" || q.Get("redirect_uri") != srv.URL+"/ui/oidc/callback" || q.Get("code_challenge_method") != "S256" {
				t.Fatalf("authorize request: %v", q)
			}
			// The provider authenticates the user and sends the browser back.
			claims := map[string]any{}
			for k, v := range a.claims {
				claims[k] = v
			}
			if _, ok := claims["nonce"]; !ok {
				claims["nonce"] = q.Get("nonce")
			}
			p.mu.Lock()
			p.claims, p.code, p.challenge = claims, "code-"+a.name, q.Get("code_challenge")
			p.signer = p.key
			if a.forge {
				p.signer, _ = rsa.GenerateKey(rand.Reader, 2048)
			}
			p.mu.Unlock()
			state := q.Get("state")
			if a.badState {
				state = "forged-state"
			}
			resp, err = c.Get(srv.URL + "/ui/oidc/callback?" + url.Values{"code": {"code-" + a.name}, "state": {state}}.Encode())
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !a.wantLogin {
				if resp.StatusCode != a.status || !strings.Contains(string(body), "Single sign-on failed") {
					t.Fatalf("callback: %d, want %d refused\n%s", resp.StatusCode, a.status, body)
				}
				if resp, err := c.Get(srv.URL + "/ui/"); err != nil || resp.StatusCode != http.StatusSeeOther {
					t.Fatalf("a refused login left a session: %v %v", resp.StatusCode, err)
				}
				return
			}
			if resp.StatusCode != 200 || !strings.Contains(string(body), `url=/ui/devices`) {
				t.Fatalf("callback: %d %s", resp.StatusCode, body)
			}
			resp, err = c.Get(srv.URL + "/ui/")
			if err != nil {
				t.Fatal(err)
			}
			page, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(page), a.wantWho) {
				t.Fatalf("after login: %d, want %q on the page", resp.StatusCode, a.wantWho)
			}
			if resp, _ := c.Get(srv.URL + "/ui/users"); resp.StatusCode != http.StatusForbidden {
				t.Fatalf("an SSO operator on the users page: %d", resp.StatusCode)
			}
		})
	}
	u, err := acc.User(ctx, "carol")
	if err != nil || u.PasswordHash != "" || u.Role != access.Viewer {
		t.Fatalf("carol after SSO: %+v %v", u, err)
	}
	for _, n := range []string{"mallory", "dave"} {
		if _, err := acc.User(ctx, n); err == nil {
			t.Errorf("refused login made user %s", n)
		}
	}
	if u, _ := acc.User(ctx, "local"); u.Role != access.Admin || u.PasswordHash == "" {
		t.Fatalf("SSO changed a local user: %+v", u)
	}
}
