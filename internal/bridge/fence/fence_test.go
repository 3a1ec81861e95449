package fence

import (
	"net/http"
	"testing"
)

func TestStampRoundTrip(t *testing.T) {
	s := New(18446744073709551615, "b/s")
	h := http.Header{}
	s.SetHeaders(h)
	if got := h.Get(HeaderLeaseVersion); got != "18446744073709551615" {
		t.Fatalf("version header %q", got)
	}
	p, ok := Parse(h.Get(HeaderLeaseVersion), h.Get(HeaderSessionID))
	if !ok || p.LeaseVersion != s.LeaseVersion || p.SessionID != "b/s" {
		t.Fatalf("parsed %+v %v", p, ok)
	}
	if _, ok := Parse("", "b/s"); ok {
		t.Fatal("an empty version parsed")
	}
	if _, ok := Parse("-1", "b/s"); ok {
		t.Fatal("a negative version parsed")
	}
}

func TestZeroStampsNothing(t *testing.T) {
	h := http.Header{}
	Stamp{}.SetHeaders(h)
	if len(h) != 0 {
		t.Fatalf("zero stamp set %v", h)
	}
	if (Stamp{LeaseVersion: 7}).Version() != "7" {
		t.Fatal("a literal Stamp formats its version")
	}
}
