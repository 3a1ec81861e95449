package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/pgtest"
)

func TestRoles(t *testing.T) {
	for _, c := range []struct {
		have, need Role
		ok         bool
	}{{RoleViewer, RoleViewer, true}, {RoleViewer, RoleOperator, false}, {RoleOperator, RoleViewer, true}, {RoleOperator, RoleAdmin, false},
		{RoleAdmin, RoleOperator, true}, {"", RoleViewer, false}, {"root", RoleViewer, false}} {
		if c.have.Allows(c.need) != c.ok {
			t.Errorf("%q allows %q: want %v", c.have, c.need, c.ok)
		}
	}
	if _, err := ParseRole("Admin"); err == nil || !strings.Contains(err.Error(), `role "Admin": must be one of viewer, operator, admin`) {
		t.Fatal(err)
	}
}

func TestAgentCredentialsAndSessions(t *testing.T) {
	pg := pgtest.New(t)
	s := open(t, pg.DSN(""))
	ctx := context.Background()
	const uid = "0f0f0f0f-0000-4000-8000-000000000001"
	if _, err := s.RevokeAgent(ctx, uid, "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoking an unknown agent: %v", err)
	}
	if err := s.RequestCredentialRotation(ctx, uid); !errors.Is(err, ErrNotFound) {
		t.Fatalf("rotating without a credential: %v", err)
	}
	c1, err := s.IssueAgentCredential(ctx, uid)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok, err := s.CheckAgentCredential(ctx, c1); !ok || err != nil || got != uid {
		t.Fatalf("check: %q %v %v", got, ok, err)
	}
	c2, _ := s.IssueAgentCredential(ctx, uid)
	if _, ok, _ := s.CheckAgentCredential(ctx, c1); ok {
		t.Fatal("the replaced credential still works")
	}
	c, err := s.RevokeAgent(ctx, uid, "token admin (id 1)")
	if err != nil || c.RevokedAt == nil || c.RevokedBy != "token admin (id 1)" || c.Issued {
		t.Fatalf("revoke: %+v %v", c, err)
	}
	if again, _ := s.RevokeAgent(ctx, uid, "someone else"); again.RevokedBy != "token admin (id 1)" || !again.RevokedAt.Equal(*c.RevokedAt) {
		t.Fatalf("a second revocation rewrote the first: %+v", again)
	}
	if _, ok, _ := s.CheckAgentCredential(ctx, c2); ok {
		t.Fatal("a revoked credential works")
	}
	if _, err := s.IssueAgentCredential(ctx, uid); !errors.Is(err, ErrRevoked) {
		t.Fatalf("a revoked agent got a credential: %v", err)
	}
	if err := s.RequestCredentialRotation(ctx, uid); !errors.Is(err, ErrRevoked) {
		t.Fatalf("rotating a revoked agent: %v", err)
	}

	tk, tok, _ := s.IssueTokenRole(ctx, "v", RoleViewer)
	if tk.Role != RoleViewer {
		t.Fatalf("role %q", tk.Role)
	}
	if _, _, err := s.IssueTokenRole(ctx, "bad", "root"); err == nil {
		t.Fatal("a token with an unknown role")
	}
	id, err := s.CreateSession(ctx, tk.ID, time.Hour)
	if err != nil || id == tok || !strings.HasPrefix(id, SessionPrefix) {
		t.Fatalf("session %q %v", id, err)
	}
	if got, ok, _ := s.CheckSession(ctx, id); !ok || got.ID != tk.ID || got.Role != RoleViewer {
		t.Fatalf("session check: %+v %v", got, ok)
	}
	if _, ok, _ := s.CheckSession(ctx, tok); ok {
		t.Fatal("a token is accepted as a session id")
	}
	s.RevokeToken(ctx, tk.ID, "x")
	if _, ok, _ := s.CheckSession(ctx, id); ok {
		t.Fatal("a session outlives the revocation of its token")
	}
}
