package storetest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/drover/drover/internal/access"
)

func init() {
	storeTests = append(storeTests,
		storeTest{"UsersAndTokens", testUsersAndTokens},
		storeTest{"AuditLog", testAuditLog},
	)
}

// testUsersAndTokens: users and tokens round-trip across a restart; a
// token is found by its hash only; deleting a user deletes its tokens.
func testUsersAndTokens(t *testing.T, h *handle) {
	ctx := testCtx(t)
	at := time.UnixMilli(1_700_000_000_123).UTC()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	users := []access.User{
		{Name: "alice", Role: access.Admin, PasswordHash: "$2a$10$abcdefghijklmnopqrstuv", CreatedAt: at, UpdatedAt: at},
		{Name: "Zoë 😀 'x'", Role: access.Viewer, CreatedAt: at, UpdatedAt: at.Add(time.Second)},
		{Name: "bob", Role: access.Viewer, CreatedAt: at, UpdatedAt: at},
	}
	for _, u := range users {
		must("save user", h.store.SaveUser(ctx, u))
	}
	users[2].Role, users[2].UpdatedAt = access.Operator, at.Add(time.Hour)
	must("update user", h.store.SaveUser(ctx, users[2]))
	if _, err := h.store.User(ctx, "carol"); !errors.Is(err, access.ErrNotFound) {
		t.Fatalf("unknown user: %v", err)
	}
	tokens := []access.Token{
		{ID: "t1", User: "alice", Name: "ci", Hash: access.HashSecret("s1"), CreatedAt: at, ExpiresAt: at.Add(24 * time.Hour)},
		{ID: "t2", User: "bob", Name: "deploy", Hash: access.HashSecret("s2"), CreatedAt: at.Add(time.Second)},
		{ID: "t3", User: "Zoë 😀 'x'", Name: "mine", Hash: access.HashSecret("s3"), CreatedAt: at.Add(2 * time.Second)},
	}
	for _, tk := range tokens {
		must("save token", h.store.SaveToken(ctx, tk))
	}
	tokens[0].RevokedAt = at.Add(time.Minute)
	must("revoke token", h.store.SaveToken(ctx, tokens[0]))
	must("touch token", h.store.TouchToken(ctx, "t2", at.Add(time.Hour)))
	tokens[1].LastUsed = at.Add(time.Hour)

	s := h.reopen()
	got, err := s.Users(ctx)
	must("users", err)
	sort.Slice(got, func(i, j int) bool { return got[i].Name < got[j].Name })
	want := []access.User{users[1], users[0], users[2]} // by name, bytewise
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("users after restart:\n%+v\nwant\n%+v", got, want)
	}
	u, err := s.User(ctx, "Zoë 😀 'x'")
	if err != nil || fmt.Sprint(u) != fmt.Sprint(users[1]) {
		t.Fatalf("user: %+v %v", u, err)
	}
	ts, err := s.Tokens(ctx)
	must("tokens", err)
	if len(ts) != 3 {
		t.Fatalf("tokens %+v", ts)
	}
	for i := range ts {
		if fmt.Sprint(ts[i]) != fmt.Sprint(tokens[i]) {
			t.Errorf("token %d: %+v, want %+v", i, ts[i], tokens[i])
		}
	}
	tk, err := s.TokenByHash(ctx, access.HashSecret("s2"))
	if err != nil || tk.ID != "t2" || !bytes.Equal(tk.Hash, tokens[1].Hash) || !tk.LastUsed.Equal(tokens[1].LastUsed) {
		t.Fatalf("token by hash: %+v %v", tk, err)
	}
	if _, err := s.TokenByHash(ctx, access.HashSecret("s4")); !errors.Is(err, access.ErrNotFound) {
		t.Fatalf("unknown token: %v", err)
	}
	must("delete user", s.DeleteUser(ctx, "bob"))
	if err := s.DeleteUser(ctx, "bob"); !errors.Is(err, access.ErrNotFound) {
		t.Fatalf("delete again: %v", err)
	}
	if _, err := s.TokenByHash(ctx, access.HashSecret("s2")); !errors.Is(err, access.ErrNotFound) {
		t.Fatalf("a deleted user's token is still found: %v", err)
	}
	if ts, _ := s.Tokens(ctx); len(ts) != 2 {
		t.Fatalf("tokens after deleting bob: %+v", ts)
	}
}

// testAuditLog: rows keep their JSON byte for byte, come newest first,
// filter, page with Before and prune by time.
func testAuditLog(t *testing.T, h *handle) {
	ctx := testCtx(t)
	t0 := time.UnixMilli(1_700_000_000_000).UTC()
	entries := []access.Entry{
		{At: t0, Actor: "alice", Credential: "password", Remote: "192.0.2.1", Action: "PUT /api/v1/profiles/{id}", Object: "/api/v1/profiles/1",
			Before: json.RawMessage(`{"version":1,"note":"ü"}`), After: json.RawMessage(`{"version":2,"note":"ü"}`)},
		{At: t0.Add(time.Minute), Actor: access.AdminActor, Credential: "admin-token", Remote: "2001:db8::1", Action: "POST /api/v1/commands", Object: "/api/v1/commands/7",
			After: json.RawMessage(`{"id":7}`)},
		{At: t0.Add(2 * time.Minute), Actor: "bob", Credential: "token:ci", Remote: "192.0.2.2", Action: "DELETE /api/v1/profiles/{id}", Object: "/api/v1/profiles/12",
			Before: json.RawMessage(`{"id":12}`)},
		{At: t0.Add(3 * time.Minute), Actor: "alice", Credential: "password", Remote: "192.0.2.1", Action: "PUT /api/v1/profiles/{id}", Object: "/api/v1/profiles/1",
			Before: json.RawMessage(`{"version":2}`), After: json.RawMessage(`{"version":3}`)},
	}
	for _, e := range entries {
		if err := h.store.AddAudit(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	s := h.reopen()
	all, err := s.Audit(ctx, access.AuditFilter{Limit: 10})
	if err != nil || len(all) != 4 {
		t.Fatalf("audit: %d rows %v", len(all), err)
	}
	for i, e := range all {
		w := entries[len(entries)-1-i]
		if i > 0 && e.ID >= all[i-1].ID {
			t.Errorf("row %d: ID %d not below %d (newest first)", i, e.ID, all[i-1].ID)
		}
		e.ID = 0
		if fmt.Sprint(e) != fmt.Sprint(w) || string(e.Before) != string(w.Before) || string(e.After) != string(w.After) {
			t.Errorf("row %d: %+v\nwant %+v", i, e, w)
		}
	}
	ids := func(f access.AuditFilter) []uint64 {
		t.Helper()
		f.Limit = max(f.Limit, 10)
		es, err := s.Audit(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for _, e := range es {
			if !f.Matches(e) {
				t.Errorf("%+v: row %+v does not match", f, e)
			}
			out = append(out, e.ID)
		}
		return out
	}
	id := func(i int) uint64 { return all[len(all)-1-i].ID } // ID of entries[i]
	for _, tc := range []struct {
		f    access.AuditFilter
		want []uint64
	}{
		{access.AuditFilter{Actor: "alice"}, []uint64{id(3), id(0)}},
		{access.AuditFilter{Object: "/api/v1/profiles/"}, []uint64{id(3), id(2), id(0)}},
		{access.AuditFilter{Object: "/api/v1/profiles/1"}, []uint64{id(3), id(0)}},
		{access.AuditFilter{Action: "POST /api/v1/commands"}, []uint64{id(1)}},
		{access.AuditFilter{Since: t0.Add(time.Minute), Until: t0.Add(3 * time.Minute)}, []uint64{id(2), id(1)}},
		{access.AuditFilter{Before: id(2)}, []uint64{id(1), id(0)}},
		{access.AuditFilter{Actor: "nobody"}, nil},
	} {
		if got := ids(tc.f); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%+v: %v, want %v", tc.f, got, tc.want)
		}
	}
	if page, err := s.Audit(ctx, access.AuditFilter{Limit: 2}); err != nil || len(page) != 2 || page[0].ID != id(3) {
		t.Fatalf("limit 2: %+v %v", page, err)
	}
	if n, err := s.PruneAudit(ctx, t0.Add(2*time.Minute)); err != nil || n != 2 {
		t.Fatalf("prune: %d %v, want 2", n, err)
	}
	if got := ids(access.AuditFilter{}); fmt.Sprint(got) != fmt.Sprint([]uint64{id(3), id(2)}) {
		t.Fatalf("after prune: %v", got)
	}
	if err := s.AddAudit(ctx, entries[0]); err != nil {
		t.Fatal(err)
	}
	if es, _ := s.Audit(ctx, access.AuditFilter{Limit: 1}); len(es) != 1 || es[0].ID <= id(3) {
		t.Fatalf("new row after prune: %+v, want an ID above %d", es, id(3))
	}
}
