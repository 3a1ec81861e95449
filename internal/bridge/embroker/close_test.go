package embroker

import (
	"net"
	"testing"
	"time"
)

// Closing the broker right after it accepted connections, before their
// handlers have run (a refused client's last attempt, a client that sent
// no CONNECT yet), returns, leaves no goroutine behind, and is no data
// race under go test -race: mochi-mqtt's own accept loop let a late
// handler register itself while Close was already waiting for them.
func TestCloseRightAfterAccept(t *testing.T) {
	for range 30 {
		b, err := Start("", nil)
		if err != nil {
			t.Fatal(err)
		}
		var conns []net.Conn
		for range 3 {
			c, err := net.DialTimeout("tcp", b.Addr, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		// One that left already, two that never send CONNECT.
		_ = conns[0].Close()
		closed := make(chan struct{})
		go func() { defer close(closed); _ = b.Close() }()
		select {
		case <-closed:
		case <-time.After(30 * time.Second):
			t.Fatal("Close did not return with connections that sent no CONNECT")
		}
		for _, c := range conns[1:] {
			_ = c.Close()
		}
	}
}
