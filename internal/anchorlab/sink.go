package anchorlab

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Record kinds.
const (
	KindHello   = "hello"   // a candidate is connected and campaigning
	KindWrite   = "write"   // a write to the fenced resource
	KindMsg     = "msg"     // a message of the stream (never fenced)
	KindRefused = "refused" // the system's own fence stopped a write before it left the candidate
)

// Record is one request the sink received, stamped with the sink's clock.
type Record struct {
	Run    string
	Kind   string
	Writer string
	Token  int64 // 0: no token presented
	Seq    int64
	At     time.Time
	// Accepted: the resource took the write. A write with a token lower
	// than the highest token it has seen in the run is rejected; a write
	// without a token is always accepted (nothing to check).
	Accepted bool
}

// Sink is the fenced resource and the message stream of every run: an
// HTTP server that records every request with the writer's identity and
// the token it presents. It is one process-wide server; runs are told
// apart by their run id.
type Sink struct {
	mu      sync.Mutex
	records []Record
	maxTok  map[string]int64
	change  chan struct{}

	servers []*http.Server
	wg      sync.WaitGroup
}

// NewSink returns a sink that serves nothing yet; see Listen.
func NewSink() *Sink {
	return &Sink{maxTok: map[string]int64{}, change: make(chan struct{})}
}

// Listen serves the sink on l until stop (or Close) and returns its URL.
func (s *Sink) Listen(l net.Listener) (url string, stop func()) {
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	s.mu.Lock()
	s.servers = append(s.servers, srv)
	s.mu.Unlock()
	s.wg.Go(func() {
		defer close(done)
		_ = srv.Serve(l)
	})
	stop = func() {
		shutdown(srv)
		<-done
	}
	return "http://" + l.Addr().String(), stop
}

func shutdown(srv *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		_ = srv.Close()
	}
}

// listenInNetns opens a listener on addr inside the network namespace ns
// (a name under /var/run/netns): candidates in other namespaces of the
// same bridge reach it while their path to the store is dropped.
func listenInNetns(ns, addr string) (net.Listener, error) {
	runtime.LockOSThread()
	orig, err := os.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer orig.Close()
	target, err := os.Open("/var/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("anchorlab: setns %s: %w", ns, err)
	}
	l, lerr := net.Listen("tcp", addr)
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays in the other namespace: leave it locked so
		// that it ends with this goroutine instead of serving others.
		if lerr == nil {
			l.Close()
		}
		return nil, fmt.Errorf("anchorlab: setns back: %w", err)
	}
	runtime.UnlockOSThread()
	return l, lerr
}

// Close stops the servers.
func (s *Sink) Close() error {
	s.mu.Lock()
	srvs := s.servers
	s.servers = nil
	s.mu.Unlock()
	for _, srv := range srvs {
		shutdown(srv) // a no-op for one already stopped
	}
	s.wg.Wait()
	return nil
}

// ServeHTTP takes POST /<kind>?run=&writer=&token=&seq=. A rejected write
// answers 409 Conflict (the writer sees a fencing refusal).
func (s *Sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	kind := r.URL.Path[1:]
	switch kind {
	case KindHello, KindWrite, KindMsg, KindRefused:
	default:
		http.Error(w, "unknown kind", http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	tok, _ := strconv.ParseInt(q.Get("token"), 10, 64)
	seq, _ := strconv.ParseInt(q.Get("seq"), 10, 64)
	rec := Record{Run: q.Get("run"), Kind: kind, Writer: q.Get("writer"), Token: tok, Seq: seq, Accepted: true}
	s.mu.Lock()
	rec.At = time.Now()
	if kind == KindWrite && tok > 0 {
		if tok < s.maxTok[rec.Run] {
			rec.Accepted = false
		} else {
			s.maxTok[rec.Run] = tok
		}
	}
	s.records = append(s.records, rec)
	close(s.change)
	s.change = make(chan struct{})
	s.mu.Unlock()
	if !rec.Accepted {
		http.Error(w, "stale fencing token", http.StatusConflict)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Records returns the records of run.
func (s *Sink) Records(run string) []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Record
	for _, r := range s.records {
		if r.Run == run {
			out = append(out, r)
		}
	}
	return out
}

// Forget drops the records of run.
func (s *Sink) Forget(run string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.records[:0]
	for _, r := range s.records {
		if r.Run != run {
			kept = append(kept, r)
		}
	}
	s.records = kept
	delete(s.maxTok, run)
}

// Wait returns the first record of run that matches ok, waiting up to
// limit; false when none came.
func (s *Sink) Wait(ctx context.Context, run string, limit time.Duration, ok func(Record) bool) (Record, bool) {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		for _, r := range s.records {
			if r.Run == run && ok(r) {
				s.mu.Unlock()
				return r, true
			}
		}
		ch := s.change
		s.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			return Record{}, false
		case <-ctx.Done():
			return Record{}, false
		}
	}
}
