package store

import (
	"context"
	"errors"
	"testing"

	"github.com/myriarch/myriarch/internal/pgtest"
)

// The enrollment secret's credential issue never replaces a credential
// unless an admin allowed it, once (issue 21, item 1).
func TestEnrollAgentCredentialAndReenrollAllowance(t *testing.T) {
	pg := pgtest.New(t)
	s := open(t, pg.DSN(""))
	ctx := context.Background()
	uid := "0f0f0f0f-0000-4000-8000-0000000000e1"
	if _, err := s.AllowReenroll(ctx, uid, "admin"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("allowance for a UID without a credential: %v, want ErrNotFound", err)
	}
	c1, re, err := s.EnrollAgentCredential(ctx, uid)
	if err != nil || re {
		t.Fatalf("first enrollment: %v %v", re, err)
	}
	if _, _, err := s.EnrollAgentCredential(ctx, uid); !errors.Is(err, ErrCredentialHeld) {
		t.Fatalf("second enrollment: %v, want ErrCredentialHeld", err)
	}
	if _, ok, _ := s.CheckAgentCredential(ctx, c1); !ok {
		t.Fatal("the refused enrollment replaced the credential")
	}
	c, err := s.AllowReenroll(ctx, uid, "token admin (id 1)")
	if err != nil || c.ReenrollAllowedAt == nil || c.ReenrollAllowedBy != "token admin (id 1)" {
		t.Fatalf("allowance: %+v %v", c, err)
	}
	c2, re, err := s.EnrollAgentCredential(ctx, uid)
	if err != nil || !re || c2 == c1 {
		t.Fatalf("allowed re-enrollment: %v %v", re, err)
	}
	if _, ok, _ := s.CheckAgentCredential(ctx, c1); ok {
		t.Fatal("the old credential works after re-enrollment")
	}
	if _, _, err := s.EnrollAgentCredential(ctx, uid); !errors.Is(err, ErrCredentialHeld) {
		t.Fatalf("the allowance was not used up: %v", err)
	}
	if _, err := s.RevokeAgent(ctx, uid, "admin"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.EnrollAgentCredential(ctx, uid); !errors.Is(err, ErrRevoked) {
		t.Fatalf("revoked: %v, want ErrRevoked", err)
	}
	// An admin brings a revoked agent back: one enrollment with the
	// secret, with a new credential; the one revoked stays void.
	if _, err := s.AllowReenroll(ctx, uid, "admin"); err != nil {
		t.Fatalf("allowance for a revoked agent: %v", err)
	}
	cred3, again, err := s.EnrollAgentCredential(ctx, uid)
	if err != nil || !again {
		t.Fatalf("re-enrollment after revocation: %v (reenrolled %v)", err, again)
	}
	if got, ok, err := s.CheckAgentCredential(ctx, cred3); err != nil || !ok || got != uid {
		t.Fatalf("the new credential: %q %v %v", got, ok, err)
	}
	if _, _, err := s.EnrollAgentCredential(ctx, uid); !errors.Is(err, ErrCredentialHeld) {
		t.Fatalf("the allowance after revocation was not used up: %v", err)
	}
}
