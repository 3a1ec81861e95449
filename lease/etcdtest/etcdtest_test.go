package etcdtest

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/testnet"
)

// A port taken between the pick and etcd's bind costs a start on other
// ports, not the test. Here the first pick is a port that the test holds
// the way an outgoing connection's local port is held: bound, not
// listening.
func TestStartRetriesATakenPort(t *testing.T) {
	held := url.URL{Scheme: "http", Host: testnet.DeadAddr(t)}
	picks := 0
	pickURL = func() (url.URL, error) {
		if picks++; picks == 1 {
			return held, nil
		}
		return freeURL()
	}
	defer func() { pickURL = freeURL }()
	s := Start(t)
	if s.Endpoint == held.String() || picks != 4 {
		t.Fatalf("etcd on %s after %d picks; the first pick %s was in use", s.Endpoint, picks, held.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Client(t).Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
}
