package store

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/pgtest"
)

func TestTokenListAndRevoke(t *testing.T) {
	pg := pgtest.New(t)
	s := open(t, pg.DSN(""))
	other := open(t, pg.DSN("")) // a second replica's store
	ctx := context.Background()
	admin, adminTok, err := s.IssueToken(ctx, "admin")
	if err != nil {
		t.Fatal(err)
	}
	ci, ciTok, err := s.IssueToken(ctx, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if admin.ID == 0 || ci.ID <= admin.ID || admin.Name != "admin" || !admin.Active() || admin.LastUsedAt != nil {
		t.Fatalf("issued %+v %+v", admin, ci)
	}
	if got, ok, err := other.CheckToken(ctx, ciTok); !ok || err != nil || got.ID != ci.ID || got.Name != "ci" {
		t.Fatalf("check on the other replica: %+v %v %v", got, ok, err)
	}
	list, err := s.ListTokens(ctx, TokensAll)
	if err != nil || len(list) != 2 || list[0].ID != ci.ID || list[1].ID != admin.ID {
		t.Fatalf("list (newest first): %+v %v", list, err)
	}
	if list[0].LastUsedAt == nil {
		t.Fatalf("last use not recorded: %+v", list[0])
	}

	rev, revoked, err := s.RevokeToken(ctx, ci.ID, "token admin")
	if err != nil || !revoked || rev.RevokedAt == nil || rev.RevokedBy != "token admin" || rev.Active() {
		t.Fatalf("revoke: %+v %v %v", rev, revoked, err)
	}
	// Refused at once, on this replica and the other: nothing is cached.
	for i, st := range []*Store{s, other} {
		if name, ok, err := st.VerifyToken(ctx, ciTok); ok || err != nil || name != "" {
			t.Fatalf("store %d accepts the revoked token: %q %v %v", i, name, ok, err)
		}
		if _, ok, err := st.VerifyToken(ctx, adminTok); !ok || err != nil {
			t.Fatalf("store %d refuses the other token: %v %v", i, ok, err)
		}
	}
	// Revoking again changes nothing.
	again, revoked, err := s.RevokeToken(ctx, ci.ID, "someone else")
	if err != nil || revoked || !again.RevokedAt.Equal(*rev.RevokedAt) || again.RevokedBy != "token admin" {
		t.Fatalf("second revoke: %+v %v %v", again, revoked, err)
	}
	if _, _, err := s.RevokeToken(ctx, ci.ID+100, "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	for status, want := range map[string]int64{TokensActive: admin.ID, TokensRevoked: ci.ID} {
		l, err := s.ListTokens(ctx, status)
		if err != nil || len(l) != 1 || l[0].ID != want {
			t.Fatalf("list %s: %+v %v", status, l, err)
		}
	}
	if _, err := s.ListTokens(ctx, "expired"); err == nil || !strings.Contains(err.Error(), "status") {
		t.Fatalf("bad status: %v", err)
	}
}
