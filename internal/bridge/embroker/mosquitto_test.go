package embroker

import (
	"net"
	"sync/atomic"
	"testing"

	"github.com/myriarch/myriarch/internal/testnet"
)

// A port taken between the pick and mosquitto's bind costs a retry on
// another port, not the start. Here the first pick is a port that the test
// holds the way an outgoing connection's local port is held: bound, not
// listening (so a dial there is refused, as it would be).
func TestMosquittoRetriesATakenPort(t *testing.T) {
	held := testnet.DeadAddr(t)
	var picks atomic.Int32
	pickPort = func() (string, error) {
		if picks.Add(1) == 1 {
			return held, nil
		}
		return FreePort()
	}
	defer func() { pickPort = FreePort }()
	m := TestMosquitto(t, "")
	if m.Addr == held || picks.Load() != 2 {
		t.Fatalf("mosquitto on %s after %d picks; the first pick %s was in use", m.Addr, picks.Load(), held)
	}
	c, err := net.Dial("tcp", m.Addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
