package embroker

import (
	"log/slog"
	"net"
	"sync"

	"github.com/mochi-mqtt/server/v2/listeners"
)

// listener is mochi-mqtt's listeners.Net with an orderly Close. mochi's
// own accept loop hands each connection to a goroutine that registers
// itself (ClientsWg.Add) only once it runs, so a Server.Close right after
// an accept can Wait while that goroutine Adds: a data race under go test
// -race when the goroutine runs late on a loaded machine (and the loop's
// goroutines share one err variable). Here Close stops accepting, closes
// the clients and every accepted connection, and waits for all handlers
// to return before mochi waits on its group.
type listener struct {
	id string
	ln net.Listener

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup // the accept loop and the handlers
}

func newListener(id string, ln net.Listener) *listener {
	return &listener{id: id, ln: ln, conns: map[net.Conn]struct{}{}}
}

func (l *listener) Init(*slog.Logger) error { return nil }
func (l *listener) ID() string              { return l.id }
func (l *listener) Address() string         { return l.ln.Addr().String() }
func (l *listener) Protocol() string        { return "tcp" }

func (l *listener) Serve(establish listeners.EstablishFn) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.wg.Add(1)
	l.mu.Unlock()
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = c.Close()
			return
		}
		l.conns[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go func() {
			defer l.wg.Done()
			_ = establish(l.id, c)
			l.mu.Lock()
			delete(l.conns, c)
			l.mu.Unlock()
			_ = c.Close()
		}()
	}
}

func (l *listener) Close(closeClients listeners.CloseFn) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.mu.Unlock()
	_ = l.ln.Close()
	closeClients(l.id)
	// Connections whose CONNECT has not arrived are no clients yet.
	l.mu.Lock()
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}
