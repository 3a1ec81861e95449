package opampserver

// The body guard
//
// opamp-go reads a plain-HTTP body whole, and gunzips it, before its
// OnConnecting authenticates; a WebSocket upgrade likewise reaches it
// unchecked. In front of it, bodyGuard:
//
//  1. authenticates from the headers (authenticate, through the failure
//     Guard of authlimit keyed by the source: server.trustedProxies),
//     and refuses without reading a byte of the body; the refusal closes
//     the connection. onConnecting takes the result from the request
//     context, so a request costs one credential check, not two;
//  2. reads an authenticated body under a deadline (BodyTimeout) and a
//     minimum rate (BodyMinRate, averaged from bodyGrace after the
//     headers): the connection's read deadline moves with the bytes that
//     arrived, so a trickle is cut (408) without a goroutine per request;
//  3. charges the bytes it holds (after decompression, at most
//     MaxMessageBytes each) to a budget per listener and per source, given
//     back when opamp-go has answered: a body that would pass either is
//     refused (503 / 429 with Retry-After), so bodies in flight cost at
//     most BodyBytesInFlight of memory (about twice that with opamp-go's
//     own copy while it decodes).
//
// WebSocket connections have no read timeout (they last hours); their
// messages are bounded by setReadLimit.

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/gorilla/websocket"
	"github.com/open-telemetry/opamp-go/server/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/internal/fleet/authlimit"
)

// ListenerLimits protect the OpAMP listener; zero values take the
// defaults of the server.* settings of the same names.
type ListenerLimits struct {
	// Proxies name the client address behind a load balancer.
	Proxies *authlimit.Proxies
	// AuthFailurePenalty: see authlimit.Guard; default 1s.
	AuthFailurePenalty time.Duration
	// BodyTimeout bounds the reading of one plain-HTTP body; default 30s.
	BodyTimeout time.Duration
	// BodyMinRate in bytes per second; default 4096, negative for none.
	BodyMinRate int64
	// BodyBytesInFlight bounds the body bytes held by the listener;
	// default 64 MiB.
	BodyBytesInFlight int64
	// BodyBytesPerSource bounds those of one source; default 8 MiB, at
	// least MaxMessageBytes.
	BodyBytesPerSource int64
}

// bodyGrace is the time a body may take to start before the minimum rate
// applies.
const bodyGrace = 2 * time.Second

// admitWait bounds the wait of a request for its turn in the slow lane
// of a source over its failure limit, and its check (429 after it): the
// OpAMP request has no deadline of its own, and a guesser's connections
// must not queue for minutes.
const admitWait = 5 * time.Second

// bodyChunk is the step in which the held bytes of a body are charged.
const bodyChunk = 32 << 10

type bodyGuard struct {
	s     *Server
	l     ListenerLimits
	guard *authlimit.Guard

	mu    sync.Mutex
	total int64
	bySrc map[string]int64

	mRefused  *prometheus.CounterVec
	mInFlight prometheus.GaugeFunc
}

func newBodyGuard(s *Server) *bodyGuard {
	l := s.o.Listener
	if l.AuthFailurePenalty == 0 {
		l.AuthFailurePenalty = time.Second
	}
	if l.BodyTimeout == 0 {
		l.BodyTimeout = 30 * time.Second
	}
	if l.BodyMinRate == 0 {
		l.BodyMinRate = 4096
	}
	if l.BodyBytesPerSource == 0 {
		l.BodyBytesPerSource = max(8<<20, s.o.MaxMessageBytes)
	}
	if l.BodyBytesInFlight == 0 {
		l.BodyBytesInFlight = max(64<<20, l.BodyBytesPerSource)
	}
	g := &bodyGuard{s: s, l: l, guard: authlimit.NewGuard(s.o.AuthFailuresPerMinute, l.AuthFailurePenalty), bySrc: map[string]int64{}}
	g.mRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_opamp_guard_refused_total",
		Help: "OpAMP requests refused before opamp-go saw them, by reason: unauthenticated, slowed (source over server.authFailuresPerMinute), unavailable (credential check failed), body_timeout, source_budget, listener_budget, too_large, bad_body."}, []string{"reason"})
	g.mInFlight = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "myriarch_opamp_body_bytes_in_flight",
		Help: "Bytes of plain-HTTP OpAMP bodies held by this replica (server.opampBodyBytesInFlight bounds it)."},
		func() float64 { g.mu.Lock(); defer g.mu.Unlock(); return float64(g.total) })
	if s.o.Registerer != nil {
		s.o.Registerer.MustRegister(g.mRefused, g.mInFlight)
	}
	return g
}

// authKey carries the admission of a request from the guard to
// onConnecting.
type authKey struct{}

type admission struct {
	a   connAuth
	src string
}

// admit authenticates r from its headers through the failure guard: code
// 0 with the connection's auth, or the status and Retry-After of a
// refusal, and the source address of r.
func (g *bodyGuard) admit(r *http.Request) (a connAuth, code int, retry, reason, src string) {
	src = g.l.Proxies.Source(r)
	code = 0
	errUnavailable := errors.New("unavailable")
	cred := ""
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
		cred = r.Header.Get("Authorization")
	}
	ctx, cancel := context.WithTimeout(r.Context(), admitWait)
	defer cancel()
	ok, err := g.guard.Check(ctx, src, cred, func(ctx context.Context) (bool, error) {
		var c int
		a, c = g.s.authenticate(r.WithContext(ctx))
		switch c {
		case 0:
			return true, nil
		case http.StatusUnauthorized:
			return false, nil
		}
		return false, errUnavailable
	})
	switch {
	case ok:
		return a, 0, "", "", src
	case errors.Is(err, authlimit.ErrSlowedDown):
		return a, http.StatusTooManyRequests, g.guard.RetryAfter(), "slowed", src
	case err != nil:
		return a, http.StatusServiceUnavailable, "5", "unavailable", src
	}
	return a, http.StatusUnauthorized, "", "unauthenticated", src
}

// authOf is the admission of r made by the guard (the fallback checks it
// here, for a handler mounted without the guard).
func (s *Server) authOf(r *http.Request) (a connAuth, code int, retry, src string) {
	if ad, ok := r.Context().Value(authKey{}).(admission); ok {
		return ad.a, 0, "", ad.src
	}
	a, code, retry, _, src = s.guard.admit(r)
	return a, code, retry, src
}

// refuse answers a request whose body is not (or no longer) read, and
// closes the connection without reading what is left of the body.
func (g *bodyGuard) refuse(w http.ResponseWriter, code int, retry, reason, msg string) {
	g.s.mRejected.Inc()
	g.mRefused.WithLabelValues(reason).Inc()
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	w.Header().Set("Connection", "close")
	if retry != "" {
		w.Header().Set("Retry-After", retry)
	}
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="myriarchd"`)
	}
	http.Error(w, msg, code)
}

func (g *bodyGuard) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.s.stopping.Load() {
			g.refuse(w, http.StatusServiceUnavailable, "1", "stopping", "replica stopping")
			return
		}
		a, code, retry, reason, src := g.admit(r)
		if code != 0 {
			g.refuse(w, code, retry, reason, http.StatusText(code))
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), authKey{}, admission{a: a, src: src}))
		if r.Header.Get("Upgrade") != "" {
			next.ServeHTTP(w, r) // WebSocket: the read limit is set on the connection
			return
		}
		body, held, code, reason, msg := g.read(w, r, src)
		defer g.give(src, held)
		if code != 0 {
			retry := ""
			if code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests {
				retry = "5"
			}
			g.refuse(w, code, retry, reason, msg)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Del("Content-Encoding")
		next.ServeHTTP(w, r)
	})
}

// read reads the body of r under the deadline, the minimum rate and the
// budgets; held is what it charged (give it back after use).
func (g *bodyGuard) read(w http.ResponseWriter, r *http.Request, src string) (body []byte, held int64, code int, reason, msg string) {
	max := g.s.o.MaxMessageBytes
	tooLarge := fmt.Sprintf("OpAMP message larger than %d bytes (after decompression)", max)
	if r.ContentLength > max {
		return nil, 0, http.StatusRequestEntityTooLarge, "too_large", tooLarge
	}
	rc := http.NewResponseController(w)
	start := time.Now()
	wire := &deadlineReader{r: http.MaxBytesReader(w, r.Body, max), rc: rc, start: start,
		end: start.Add(g.l.BodyTimeout), rate: g.l.BodyMinRate}
	defer rc.SetReadDeadline(time.Time{})
	var src2 io.Reader = wire
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(wire)
		if err != nil {
			code, reason, msg = readErr(err, tooLarge)
			return nil, 0, code, reason, msg
		}
		src2 = zr
	}
	// A declared length without gzip is what arrives (net/http ends the
	// body there): charge exactly that. Otherwise grow in steps.
	exact := r.ContentLength >= 0 && r.Header.Get("Content-Encoding") != "gzip"
	first := int64(bodyChunk)
	if exact {
		first = r.ContentLength
	}
	first = min(first, max+1)
	for {
		if exact && int64(len(body)) == r.ContentLength {
			break
		}
		if int64(len(body)) == int64(cap(body)) {
			if int64(cap(body)) > max {
				return body, held, http.StatusRequestEntityTooLarge, "too_large", tooLarge
			}
			step := first
			if cap(body) > 0 {
				step = min(int64(cap(body)), max+1-int64(cap(body)))
			}
			if why := g.take(src, step); why != "" {
				if why == "source_budget" {
					return body, held, http.StatusTooManyRequests, why, "too many OpAMP bytes in flight from this address; retry later"
				}
				return body, held, http.StatusServiceUnavailable, why, "too many OpAMP bytes in flight on this replica; retry later"
			}
			held += step
			nb := make([]byte, len(body), int64(cap(body))+step)
			copy(nb, body)
			body = nb
		}
		n, err := src2.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			code, reason, msg = readErr(err, tooLarge)
			return body, held, code, reason, msg
		}
	}
	if int64(len(body)) > max {
		return body, held, http.StatusRequestEntityTooLarge, "too_large", tooLarge
	}
	return body, held, 0, "", ""
}

func readErr(err error, tooLarge string) (int, string, string) {
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, "too_large", tooLarge
	case errors.As(err, &ne) && ne.Timeout():
		return http.StatusRequestTimeout, "body_timeout", "the body did not arrive in time (server.opampBodyTimeout, server.opampBodyMinRate)"
	}
	if errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum) || strings.Contains(err.Error(), "flate") {
		return http.StatusBadRequest, "bad_body", "body: not gzip"
	}
	return http.StatusBadRequest, "bad_body", "body: unreadable"
}

// take charges n bytes of src to the budgets; it returns "" or the
// budget that is used up.
func (g *bodyGuard) take(src string, n int64) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.bySrc[src]+n > g.l.BodyBytesPerSource:
		return "source_budget"
	case g.total+n > g.l.BodyBytesInFlight:
		return "listener_budget"
	}
	g.bySrc[src] += n
	g.total += n
	return ""
}

func (g *bodyGuard) give(src string, n int64) {
	if n == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.total -= n
	if g.bySrc[src] -= n; g.bySrc[src] <= 0 {
		delete(g.bySrc, src)
	}
}

// inFlight is the charged bytes of the listener and of src.
func (g *bodyGuard) inFlight(src string) (int64, int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.total, g.bySrc[src]
}

// deadlineReader moves the connection's read deadline before each read:
// the body must have sent got+1 bytes by start + bodyGrace + got/rate,
// and all of it by end.
type deadlineReader struct {
	r     io.Reader
	rc    *http.ResponseController
	start time.Time
	end   time.Time
	rate  int64
	got   int64
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	dl := d.end
	if d.rate > 0 {
		if t := d.start.Add(bodyGrace + time.Duration(float64(d.got)/float64(d.rate)*float64(time.Second))); t.Before(dl) {
			dl = t
		}
	}
	if err := d.rc.SetReadDeadline(dl); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return 0, err
	}
	n, err := d.r.Read(p)
	d.got += int64(n)
	return n, err
}

// setReadLimit bounds the WebSocket messages of c: gorilla/websocket
// closes a connection whose message is larger (close code 1009).
// opamp-go sets no limit and does not expose the *websocket.Conn, so it is
// taken from the connection's field; without compression on the socket
// (opamp-go does not enable it) a message is as large on the wire as
// decompressed.
func setReadLimit(c types.Connection, limit int64) {
	v := reflect.ValueOf(c)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return
	}
	f := v.Elem().FieldByName("wsConn")
	if !f.IsValid() || f.Type() != reflect.TypeFor[*websocket.Conn]() {
		return
	}
	if ws := reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().(*websocket.Conn); ws != nil {
		ws.SetReadLimit(limit)
	}
}
