// Package opampserver serves agents over OpAMP (WebSocket and plain HTTP)
// with github.com/open-telemetry/opamp-go and keeps their state in the
// store: description, health, effective config, remote-config status,
// package statuses, capabilities, first/last seen, the replica they are
// connected to, and an event log.
//
// Heartbeats cost no write of their own: last-seen times and events go to
// a lastseen.Batcher. Every WebSocket connection has an id that starts with
// the process nonce, so a write of an old connection never overwrites the
// state of a newer one on another replica, and the final flush of a
// planned stop marks exactly this process's agents offline.
//
// A desired config goes out only once the agent has reported which config
// it runs on its current connection (see reported.known): after a
// reconnect, re-sending it blindly made the OpenTelemetry supervisor
// report a FAILED config as APPLIED. Restart requests come through the
// store like configs (NOTIFY, reconcile) and are claimed once.
package opampserver

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"
	"github.com/open-telemetry/opamp-go/server"
	"github.com/open-telemetry/opamp-go/server/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/internal/fleet/authlimit"
	"github.com/myriarch/myriarch/internal/fleet/lastseen"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// HTTPConnID is the connection id of agents that poll over plain HTTP:
// they have no lasting connection, and behind a load balancer every poll
// may reach another replica, so all replicas share it.
const HTTPConnID = "http"

// httpAgentIdle is how long a plain-HTTP agent that stopped polling here is
// remembered (its desired-config bookkeeping) before Reconcile forgets it.
const httpAgentIdle = 10 * time.Minute

// Options configure a Server.
type Options struct {
	Store   *store.Store
	Batcher *lastseen.Batcher
	// ReplicaID is written to the agents this replica serves.
	ReplicaID string
	// Nonce identifies this process; connection ids are Nonce#n.
	Nonce string
	// Secret is the enrollment secret agents present as a bearer token.
	Secret string
	// Packages, when set, is the source of package offers (packages.go).
	Packages   Packages
	Log        *slog.Logger
	Registerer prometheus.Registerer
	// MaxMessageBytes bounds one AgentToServer message after
	// decompression; default 4 MiB.
	MaxMessageBytes int64
	// AuthFailuresPerMinute per source address; default 30.
	AuthFailuresPerMinute int64
	// ReconnectsPerMinute per instance UID on this replica; default 30.
	ReconnectsPerMinute int64
	// OfflineAfter: an agent whose connection was silent for longer may be
	// replaced by a new connection of the same UID; default 90s.
	OfflineAfter time.Duration
	// EnrollmentsPerMinute bounds the enrollments of new instance UIDs
	// with the secret on this replica; default 600.
	EnrollmentsPerMinute int64
	// Limits bound what an agent reports in one message.
	Limits ReportLimits
	// HeartbeatInterval, when set, is offered to every agent with its
	// credential; 0 offers the agent's own (see security.go).
	HeartbeatInterval time.Duration
	// SecretBackoff is how long the source of a refused secret connection
	// is refused before the upgrade (identity.go); default 30s.
	SecretBackoff time.Duration
	// StormLogInterval: a refusal that repeats is logged once per
	// interval with a count; default 1m.
	StormLogInterval time.Duration
	// LearnHeartbeatWithin bounds the wait for an agent's first heartbeat
	// before its credential offer: an agent that talks more often than
	// its heartbeat interval never sends one, and is offered its
	// credential after this with the longest gap seen between its
	// messages (onWSMessage); default 5m.
	LearnHeartbeatWithin time.Duration
	// Listener protects the listener (bodyguard.go).
	Listener ListenerLimits
}

// Server is the OpAMP side of one replica.
type Server struct {
	o       Options
	log     *slog.Logger
	opamp   server.OpAMPServer
	handler server.HTTPHandlerFunc
	connCtx server.ConnContext
	httpSrv *http.Server
	served  chan struct{}
	addr    net.Addr

	stopping atomic.Bool
	seq      atomic.Int64

	mu    sync.Mutex
	conns map[types.Connection]*agentConn
	byUID map[string]*agentConn // WebSocket agents by uid
	http  map[string]*httpAgent // plain-HTTP agents known to this process

	guard       *bodyGuard
	reconnects  *authlimit.Limiter
	enrollments *authlimit.Limiter
	backoff     sourceBackoff
	storm       *stormLog

	mConns    prometheus.GaugeFunc
	mAuth     *prometheus.CounterVec
	mMessages prometheus.Counter
	mRejected prometheus.Counter
	mConnects prometheus.Counter
	mEnroll   *prometheus.CounterVec
	mReports  prometheus.Counter
}

type agentConn struct {
	conn   types.Connection
	connID string
	ws     bool
	// auth is how the connection authenticated.
	auth connAuth
	// lastMsg is when the last message arrived (unix nanoseconds).
	lastMsg atomic.Int64

	mu       sync.Mutex
	uid      string
	seen     reported
	sentHash string
	// hb is the agent's heartbeat interval in seconds as its heartbeats
	// show it (0: none seen yet); pending is a credential offer that waits
	// for it (security.go).
	hb      uint64
	pending int
	// pendingSince is when the offer started waiting, and maxGap the
	// longest silence between two messages since: an agent that always
	// talks more often than its heartbeat interval sends no heartbeat, so
	// after Options.LearnHeartbeatWithin its offer goes out with maxGap
	// (at most its interval) instead of never.
	pendingSince time.Time
	maxGap       time.Duration
}

type httpAgent struct {
	seen     atomic.Int64 // unix nanoseconds of the last poll
	mu       sync.Mutex
	dirty    bool // desired config may have changed
	cmdCheck bool // a restart may be pending
	pkgCheck bool // a package offer may be pending (packages.go)
	// pkgWait is the offer sent to the agent that it has not acknowledged
	// yet, and its polls here since (packages.go).
	pkgWait  pkgWait
	sentHash string
	rep      reported
	// byCred: the agent has polled here with its credential (or
	// certificate), so a poll with the secret for its UID is not its own.
	byCred bool
}

// reported is what one connection (or one plain-HTTP agent in this
// process) last reported, so that repeats cost no write and no event.
type reported struct {
	caps      uint64
	healthy   *bool
	lastError string
	// hash is the remote config hash the agent reported, valid once known
	// is set: after a reconnect the agent's first message may carry none
	// of its state, and a config sent before the agent has told which one
	// it runs would be taken as "unchanged" and reported APPLIED, even
	// when that very config had FAILED (the OpenTelemetry supervisor does
	// this). So nothing is sent until a full state or a remote-config
	// status has arrived on this connection.
	hash  string
	known bool
}

// New returns a server; Start listens.
func New(o Options) *Server {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.MaxMessageBytes == 0 {
		o.MaxMessageBytes = 4 << 20
	}
	if o.AuthFailuresPerMinute == 0 {
		o.AuthFailuresPerMinute = 30
	}
	if o.ReconnectsPerMinute == 0 {
		o.ReconnectsPerMinute = 30
	}
	if o.OfflineAfter == 0 {
		o.OfflineAfter = 90 * time.Second
	}
	if o.EnrollmentsPerMinute == 0 {
		o.EnrollmentsPerMinute = 600
	}
	if o.SecretBackoff == 0 {
		o.SecretBackoff = 30 * time.Second
	}
	if o.LearnHeartbeatWithin == 0 {
		o.LearnHeartbeatWithin = 5 * time.Minute
	}
	if o.StormLogInterval == 0 {
		o.StormLogInterval = time.Minute
	}
	o.Limits.defaults()
	s := &Server{o: o, log: o.Log.With("component", "opamp"), conns: map[types.Connection]*agentConn{},
		byUID: map[string]*agentConn{}, http: map[string]*httpAgent{},
		reconnects:  authlimit.New(o.ReconnectsPerMinute),
		enrollments: authlimit.New(o.EnrollmentsPerMinute), storm: &stormLog{interval: o.StormLogInterval}}
	s.guard = newBodyGuard(s)
	s.mConns = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "myriarch_opamp_connections", Help: "Open OpAMP WebSocket connections on this replica."},
		func() float64 { return float64(s.Connections()) })
	s.mMessages = prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_opamp_messages_total", Help: "OpAMP messages received."})
	s.mRejected = prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_opamp_rejected_total", Help: "OpAMP connections refused (bad secret or credential, revoked, duplicate, rate limit, too large, or stopping)."})
	s.mConnects = prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_opamp_connects_total", Help: "OpAMP WebSocket connections accepted."})
	s.mAuth = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_opamp_authenticated_total",
		Help: "OpAMP connections and plain-HTTP polls accepted, by how they authenticated: secret (enrollment), credential or certificate."}, []string{"method"})
	s.mEnroll = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "myriarch_opamp_enrollments_total",
		Help: "Enrollments of new instance UIDs with the enrollment secret on this replica, by result: accepted, or rate_limited (server.enrollmentsPerMinute)."}, []string{"result"})
	s.mEnroll.WithLabelValues("accepted")
	s.mEnroll.WithLabelValues("rate_limited")
	s.mReports = prometheus.NewCounter(prometheus.CounterOpts{Name: "myriarch_opamp_reports_refused_total",
		Help: "Agent messages refused for a report over a limit (server.agentMax* settings)."})
	if o.Registerer != nil {
		o.Registerer.MustRegister(s.mConns, s.mMessages, s.mRejected, s.mConnects, s.mAuth, s.mEnroll, s.mReports)
	}
	s.opamp = server.New(nil)
	s.handler, s.connCtx, _ = s.opamp.Attach(server.Settings{Callbacks: types.Callbacks{OnConnecting: s.onConnecting}})
	return s
}

// Start listens on addr and serves OpAMP on path (TLS when tlsCfg is set).
func (s *Server) Start(addr, path string, tlsCfg *tls.Config) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("server.opampListen %s: %w", addr, err)
	}
	l = s.o.Listener.Proxies.ListenerOf(l)
	if tlsCfg != nil {
		l = tls.NewListener(l, tlsCfg)
	}
	mux := http.NewServeMux()
	mux.Handle(path, s.guard.wrap(http.HandlerFunc(s.handler)))
	// No read or write timeout: WebSocket connections last for hours. A
	// plain-HTTP body is read under its own deadline, after
	// authentication (bodyguard.go).
	s.httpSrv = &http.Server{Handler: mux, ConnContext: s.connCtx, ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	s.addr = l.Addr()
	s.served = make(chan struct{})
	go func() {
		defer close(s.served)
		if err := s.httpSrv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("OpAMP listener failed", "error", err)
		}
	}()
	return nil
}

// Addr is the listen address after Start.
func (s *Server) Addr() net.Addr { return s.addr }

// Connections is the number of open WebSocket connections.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.conns {
		if c.ws {
			n++
		}
	}
	return n
}

// Stop is phase 1 of a planned stop: it refuses new connections, closes
// the listener and every agent connection, and waits until all are closed
// or ctx ends (server.shutdownTimeout). WebSocket agents get a close frame
// (1001 going away) and reconnect to other replicas.
func (s *Server) Stop(ctx context.Context) error {
	s.stopping.Store(true)
	shut := make(chan error, 1)
	if s.httpSrv != nil {
		go func() { shut <- s.httpSrv.Shutdown(ctx) }()
	} else {
		shut <- nil
	}
	s.mu.Lock()
	open := make([]types.Connection, 0, len(s.conns))
	for c, ac := range s.conns {
		if ac.ws {
			open = append(open, c)
		}
	}
	s.mu.Unlock()
	// In parallel, bounded: a stuck peer costs closeFrameWait, not one
	// each, and 10,000 agents do not start 10,000 goroutines.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	for _, c := range open {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			closeGoingAway(c)
		})
	}
	wg.Wait()
	err := <-shut
	if err != nil && s.httpSrv != nil {
		// The drain ran into its timeout (a plain-HTTP poll whose body
		// never finished arriving, say). Cut what is left: otherwise that
		// connection and its handler outlive the phase, and a body that
		// completes later is served by a replica that already flushed.
		_ = s.httpSrv.Close()
	}
	if s.served != nil {
		<-s.served
	}
	for {
		if s.Connections() == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("closing OpAMP connections: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// FinalFlush is the second part of phase 1: it writes the pending
// last-seen times and events and marks the agents of this process offline,
// within ctx (its own 15 s deadline).
func (s *Server) FinalFlush(ctx context.Context) error {
	errFlush := s.o.Batcher.Flush(ctx)
	uids, err := s.o.Store.MarkProcessOffline(ctx, s.o.Nonce+"#")
	if err != nil {
		return errors.Join(errFlush, fmt.Errorf("marking agents offline: %w", err))
	}
	now := time.Now()
	evs := make([]store.Event, 0, len(uids))
	for _, uid := range uids {
		evs = append(evs, store.Event{InstanceUID: uid, At: now, Kind: store.EventDisconnected, ReplicaID: s.o.ReplicaID, Detail: "replica stopped"})
	}
	return errors.Join(errFlush, s.o.Store.InsertEvents(ctx, evs))
}

func (s *Server) onConnecting(r *http.Request) types.ConnectionResponse {
	refuse := func(code int, retry string) types.ConnectionResponse {
		s.mRejected.Inc()
		resp := types.ConnectionResponse{Accept: false, HTTPStatusCode: code}
		if retry != "" {
			resp.HTTPResponseHeader = map[string]string{"Retry-After": retry}
		}
		return resp
	}
	if s.stopping.Load() {
		return refuse(http.StatusServiceUnavailable, "1")
	}
	// Authenticated by the body guard before the body was read.
	a, code, retry, src := s.authOf(r)
	if code != 0 {
		return refuse(code, retry)
	}
	ws := r.Header.Get("Upgrade") != ""
	now := time.Now()
	if a.uid == "" {
		// The secret: a source whose secret connection was refused waits
		// (identity.go), before the upgrade, so that clients back off.
		if wait := s.backoff.wait(src, now); wait > 0 {
			if n, ok := s.storm.hit("backoff "+src, now); ok {
				s.log.Warn("refusing connections with the enrollment secret from a source whose enrollment was refused (a revoked or duplicate agent retrying)",
					"source", src, "refused", n, "retry_after_s", retryAfter(wait))
			}
			return refuse(http.StatusTooManyRequests, retryAfter(wait))
		}
	}
	if a.uid != "" {
		// A credential names its UID before the upgrade: a duplicate or a
		// reconnect storm is refused here, so the client backs off. A
		// plain-HTTP poll with the credential of an agent connected here
		// over WebSocket is a second transport for one UID: refused too.
		if ws && !s.reconnects.Allow(a.uid) {
			return refuse(http.StatusTooManyRequests, "30")
		}
		other := ""
		if s.liveConn(a.uid) != nil {
			other = "this replica"
		} else if !ws && !s.knownHTTP(a.uid) {
			// The first poll here: the agent may be connected over
			// WebSocket to another replica. Later polls are not checked
			// again (one query per new plain-HTTP agent, not per poll).
			ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
			rep, ok, err := s.o.Store.ConnectedElsewhere(ctx, a.uid, HTTPConnID, s.o.OfflineAfter)
			cancel()
			if err != nil {
				s.log.Warn("checking an agent's connection failed", "agent", a.uid, "error", err)
				return refuse(http.StatusServiceUnavailable, "5")
			}
			if ok {
				other = "replica " + rep
			}
		}
		if other != "" {
			tr := "plain HTTP"
			if ws {
				tr = "WebSocket"
			}
			if n, ok := s.storm.hit("second "+a.uid, now); ok {
				s.log.Warn("refused a second connection for an agent that is connected over WebSocket; is its credential copied?",
					"agent", a.uid, "source", src, "transport", tr, "connected_to", other, "count", n)
				s.o.Batcher.Event(store.Event{InstanceUID: a.uid, At: now, Kind: store.EventEnrollRefused, ReplicaID: s.o.ReplicaID,
					Detail: countDetail(fmt.Sprintf("a second connection with the agent's credential over %s from %s refused (409): the agent is connected over WebSocket to %s", tr, src, other), n)})
			}
			return refuse(http.StatusConflict, "30")
		}
	}
	method := "secret"
	switch {
	case a.cert:
		method = "certificate"
	case a.uid != "":
		method = "credential"
	}
	s.mAuth.WithLabelValues(method).Inc()
	return types.ConnectionResponse{Accept: true, ConnectionCallbacks: types.ConnectionCallbacks{
		OnConnected:       func(ctx context.Context, c types.Connection) { s.onConnected(ctx, c, a) },
		OnMessage:         s.onMessage,
		OnConnectionClose: s.onClose,
	}}
}

func isWS(c types.Connection) bool {
	// Plain HTTP connections cannot Send; the server's WebSocket type can.
	return !strings.Contains(fmt.Sprintf("%T", c), "httpConnection")
}

func (s *Server) onConnected(_ context.Context, c types.Connection, a connAuth) {
	ac := &agentConn{conn: c, ws: isWS(c), auth: a}
	ac.lastMsg.Store(time.Now().UnixNano())
	if ac.ws {
		setReadLimit(c, s.o.MaxMessageBytes)
		ac.connID = s.o.Nonce + "#" + strconv.FormatInt(s.seq.Add(1), 10)
		s.mConnects.Inc()
	} else {
		ac.connID = HTTPConnID
	}
	s.mu.Lock()
	s.conns[c] = ac
	s.mu.Unlock()
}

func (s *Server) onClose(c types.Connection) {
	s.mu.Lock()
	ac := s.conns[c]
	delete(s.conns, c)
	if ac != nil && ac.ws && ac.uid != "" && s.byUID[ac.uid] == ac {
		delete(s.byUID, ac.uid)
	}
	s.mu.Unlock()
	if ac == nil || !ac.ws || ac.uid == "" || s.stopping.Load() {
		// On a planned stop the final flush marks all of them at once.
		return
	}
	now := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ok, err := s.o.Store.Disconnected(ctx, ac.uid, ac.connID, now); err != nil {
		s.log.Warn("recording a disconnect failed; the offline sweeper will catch it", "agent", ac.uid, "error", err)
	} else if ok {
		s.o.Batcher.Event(store.Event{InstanceUID: ac.uid, At: now, Kind: store.EventDisconnected, ReplicaID: s.o.ReplicaID})
	}
}

// UID formats an instance uid: the canonical UUID form for 16 bytes.
func UID(b []byte) string {
	if len(b) == 16 {
		h := hex.EncodeToString(b)
		return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
	}
	return hex.EncodeToString(b)
}

// ParseUID is the inverse of UID.
func ParseUID(s string) ([]byte, error) {
	return hex.DecodeString(strings.ReplaceAll(s, "-", ""))
}

func (s *Server) onMessage(ctx context.Context, c types.Connection, msg *protobufs.AgentToServer) *protobufs.ServerToAgent {
	s.mMessages.Inc()
	now := time.Now()
	uid := UID(msg.InstanceUid)
	resp := &protobufs.ServerToAgent{InstanceUid: msg.InstanceUid,
		Capabilities: uint64(protobufs.ServerCapabilities_ServerCapabilities_AcceptsStatus |
			protobufs.ServerCapabilities_ServerCapabilities_OffersRemoteConfig |
			protobufs.ServerCapabilities_ServerCapabilities_AcceptsEffectiveConfig |
			protobufs.ServerCapabilities_ServerCapabilities_AcceptsPackagesStatus |
			protobufs.ServerCapabilities_ServerCapabilities_OffersPackages)}
	s.mu.Lock()
	ac := s.conns[c]
	s.mu.Unlock()
	if ac == nil || len(msg.InstanceUid) == 0 {
		return resp
	}
	prev := time.Unix(0, ac.lastMsg.Swap(now.UnixNano()))
	if ac.auth.uid != "" && uid != ac.auth.uid {
		// A credential speaks for its own UID only.
		s.mRejected.Inc()
		s.log.Warn("an agent credential was used for another instance UID; closing the connection", "credential_of", ac.auth.uid, "claimed", uid)
		return s.refuseMessage(ac, msg)
	}
	if why := s.o.Limits.check(msg); why != "" {
		// Nothing of the message is stored; the connection stays, so
		// that an agent that trims its report is served again.
		s.mReports.Inc()
		s.mRejected.Inc()
		if n, ok := s.storm.hit("report "+uid, now); ok {
			s.log.Warn("refused an agent report over a limit", "agent", uid, "limit", why, "transport", transport(ac), "source", ac.auth.source, "count", n)
			s.o.Batcher.Event(store.Event{InstanceUID: uid, At: now, Kind: store.EventReportRefused, ReplicaID: s.o.ReplicaID, Detail: countDetail(why, n)})
		}
		resp.ErrorResponse = &protobufs.ServerErrorResponse{Type: protobufs.ServerErrorResponseType_ServerErrorResponseType_BadRequest,
			ErrorMessage: "report refused: " + why}
		return resp
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if ac.ws {
		return s.onWSMessage(ctx, ac, uid, msg, resp, now, prev)
	}
	return s.onHTTPMessage(ctx, ac, uid, msg, resp, now)
}

func (s *Server) onWSMessage(ctx context.Context, ac *agentConn, uid string, msg *protobufs.AgentToServer, resp *protobufs.ServerToAgent, now, prev time.Time) *protobufs.ServerToAgent {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	first := ac.uid == ""
	if first {
		var ok bool
		if uid, ok = s.admit(ctx, ac, uid, msg, resp); !ok {
			return s.refuseMessage(ac, msg)
		}
		if _, err := s.o.Store.Connected(ctx, uid, s.o.ReplicaID, ac.connID, now); err != nil {
			s.log.Warn("recording a connect failed; closing the connection so that the agent retries", "agent", uid, "error", err)
			_ = ac.conn.Disconnect()
			return nil
		}
		ac.uid = uid
		s.mu.Lock()
		if old := s.byUID[uid]; old != nil && old != ac {
			// The same agent connected again before its old connection closed.
			go func() { _ = old.conn.Disconnect() }()
		}
		s.byUID[uid] = ac
		s.mu.Unlock()
		s.o.Batcher.Event(store.Event{InstanceUID: uid, At: now, Kind: store.EventConnected, ReplicaID: s.o.ReplicaID})
		if msg.AgentDescription == nil {
			resp.Flags |= uint64(protobufs.ServerToAgentFlags_ServerToAgentFlags_ReportFullState)
		}
		resp.PackagesAvailable = s.packagesFor(ctx, ac, uid)
	} else if uid != ac.uid {
		return resp
	} else if isHeartbeat(msg) {
		ac.hb = heartbeatSeconds(prev, now)
		s.pendingOffer(ctx, ac, uid, resp)
	} else if ac.pending != 0 {
		ac.maxGap = max(ac.maxGap, now.Sub(prev))
		if now.Sub(ac.pendingSince) >= s.o.LearnHeartbeatWithin {
			ac.hb = heartbeatSeconds(now.Add(-ac.maxGap), now)
			s.log.Info("an agent sent no heartbeat to learn its interval from; offering its credential with the longest gap between its messages",
				"agent", uid, "heartbeat_interval_s", ac.hb)
			s.pendingOffer(ctx, ac, uid, resp)
		}
	}
	s.o.Batcher.Touch(uid, ac.connID, now)
	wasKnown := ac.seen.known
	st := s.state(uid, msg, now, &ac.seen)
	if err := s.o.Store.UpdateState(ctx, uid, ac.connID, st); err != nil {
		s.log.Warn("storing agent state failed", "agent", uid, "error", err)
	}
	if ac.seen.known && !wasKnown {
		// Now that the agent told which config it runs, send the desired
		// one if it differs. Later changes arrive through Push (event bus)
		// and Reconcile.
		d, err := s.o.Store.DesiredConfigs(ctx, []string{uid})
		if err == nil {
			if want, ok := d[uid]; ok && want.Hash != ac.seen.hash && want.Hash != ac.sentHash {
				resp.RemoteConfig = remoteConfig(want)
				ac.sentHash = want.Hash
				s.o.Batcher.Event(store.Event{InstanceUID: uid, At: now, Kind: store.EventConfigSent, ReplicaID: s.o.ReplicaID, Detail: want.Hash})
			}
		} else {
			s.log.Warn("loading a desired config failed; the reconcile will retry", "agent", uid, "error", err)
		}
	}
	return resp
}

// httpReconnectGap is the pause between two polls of a plain-HTTP agent
// after which its next poll here counts as a (re)connect: it may have been
// marked offline or polled another replica meanwhile.
const httpReconnectGap = time.Minute

func (s *Server) onHTTPMessage(ctx context.Context, ac *agentConn, uid string, msg *protobufs.AgentToServer, resp *protobufs.ServerToAgent, now time.Time) *protobufs.ServerToAgent {
	s.mu.Lock()
	ha := s.http[uid]
	first := ha == nil
	if first {
		ha = &httpAgent{dirty: true, cmdCheck: true, pkgCheck: true}
		ha.seen.Store(now.UnixNano())
		s.http[uid] = ha
	}
	s.mu.Unlock()
	ha.mu.Lock()
	defer ha.mu.Unlock()
	secret := ac.auth.uid == ""
	if !secret {
		ha.byCred = true
	}
	// A poll with the secret is admitted on the first poll here, and
	// again whenever the agent known here polls with a credential: then
	// the secret is someone else claiming its UID (issue 21, item 1).
	if first || secret && ha.byCred {
		forget := func() {
			if first {
				s.mu.Lock()
				delete(s.http, uid)
				s.mu.Unlock()
			}
		}
		got, ok := s.admit(ctx, ac, uid, msg, resp)
		if !ok {
			forget()
			if resp.ErrorResponse != nil {
				return resp
			}
			return s.refuseMessage(ac, msg)
		}
		if got != uid {
			// A duplicate: told to take a new UID, and nothing it sent is
			// stored under the old one. Its next poll, with the new UID,
			// enrolls it.
			forget()
			return resp
		}
	}
	prev := time.Unix(0, ha.seen.Swap(now.UnixNano()))
	if first || now.Sub(prev) > httpReconnectGap {
		connect, err := s.o.Store.ConnectedHTTP(ctx, uid, s.o.ReplicaID, HTTPConnID, now)
		if err != nil {
			if first {
				s.mu.Lock()
				delete(s.http, uid)
				s.mu.Unlock()
			}
			return resp
		}
		if connect {
			s.o.Batcher.Event(store.Event{InstanceUID: uid, At: now, Kind: store.EventConnected, ReplicaID: s.o.ReplicaID, Detail: "plain HTTP"})
		}
		if first && msg.AgentDescription == nil {
			resp.Flags |= uint64(protobufs.ServerToAgentFlags_ServerToAgentFlags_ReportFullState)
		}
	}
	s.o.Batcher.Touch(uid, HTTPConnID, now)
	st := s.state(uid, msg, now, &ha.rep)
	if err := s.o.Store.UpdateState(ctx, uid, HTTPConnID, st); err != nil {
		s.log.Warn("storing agent state failed", "agent", uid, "error", err)
	}
	if !ha.rep.known {
		// Wait for the full state (see reported.known).
		return resp
	}
	if ha.cmdCheck {
		// A command travels alone: an agent ignores the other fields of a
		// message that carries one.
		if cmd := s.takeRestart(ctx, uid, ha.rep.caps); cmd != nil {
			resp.Command = cmd
			return resp
		}
		ha.cmdCheck = false
	}
	resp.PackagesAvailable = s.httpPackages(ctx, uid, ha, msg)
	if ha.dirty {
		d, err := s.o.Store.DesiredConfigs(ctx, []string{uid})
		if err == nil {
			ha.dirty = false
			if want, ok := d[uid]; ok && want.Hash != ha.rep.hash {
				resp.RemoteConfig = remoteConfig(want)
				if want.Hash != ha.sentHash {
					s.o.Batcher.Event(store.Event{InstanceUID: uid, At: now, Kind: store.EventConfigSent, ReplicaID: s.o.ReplicaID, Detail: want.Hash})
				}
				ha.sentHash = want.Hash
				ha.dirty = true // until the agent reports it
			}
		}
	}
	return resp
}

// takeRestart claims a pending restart request of uid and returns the
// command to send, or nil when there is none (or another replica took it).
func (s *Server) takeRestart(ctx context.Context, uid string, caps uint64) *protobufs.ServerToAgentCommand {
	p, err := s.o.Store.PendingRestarts(ctx, []string{uid})
	if err != nil {
		s.log.Warn("loading a restart request failed; the reconcile will retry", "agent", uid, "error", err)
		return nil
	}
	at, ok := p[uid]
	if !ok {
		return nil
	}
	return s.claimRestart(ctx, uid, at, caps)
}

func (s *Server) claimRestart(ctx context.Context, uid string, at time.Time, caps uint64) *protobufs.ServerToAgentCommand {
	if caps&uint64(protobufs.AgentCapabilities_AgentCapabilities_AcceptsRestartCommand) == 0 {
		// The API refuses such requests; one made before the agent
		// dropped the capability expires unsent.
		return nil
	}
	ok, err := s.o.Store.RestartDelivered(ctx, uid, at)
	if err != nil || !ok {
		return nil
	}
	s.o.Batcher.Event(store.Event{InstanceUID: uid, At: time.Now(), Kind: store.EventRestartSent, ReplicaID: s.o.ReplicaID})
	return &protobufs.ServerToAgentCommand{Type: protobufs.CommandType_CommandType_Restart}
}

// remoteConfig is the OpAMP form of a desired config. An empty body is an
// empty config map: OpAMP's "no remote config", which is how a cleared
// desired config reaches the agent (the OpenTelemetry supervisor then
// stops its collector until a new config arrives).
func remoteConfig(d store.Desired) *protobufs.AgentRemoteConfig {
	h, _ := hex.DecodeString(d.Hash)
	files := map[string]*protobufs.AgentConfigFile{}
	if d.Body != "" {
		files[""] = &protobufs.AgentConfigFile{Body: []byte(d.Body), ContentType: "text/yaml"}
	}
	return &protobufs.AgentRemoteConfig{ConfigHash: h, Config: &protobufs.AgentConfigMap{ConfigMap: files}}
}

// state turns the reported parts of msg into a store update and events,
// and updates rep. rep holds what was last stored for this connection, so
// that a message that repeats it (opamp-go repeats the capabilities) costs
// no write and no event.
func (s *Server) state(uid string, msg *protobufs.AgentToServer, now time.Time, rep *reported) store.State {
	var st store.State
	if d := msg.AgentDescription; d != nil {
		st.Identifying = attrs(d.IdentifyingAttributes)
		st.NonIdentifying = attrs(d.NonIdentifyingAttributes)
		// A full state: a remote-config status, if the agent has one, is
		// in the same message.
		rep.known = true
	}
	if msg.Capabilities != 0 && msg.Capabilities != rep.caps {
		c := msg.Capabilities
		st.Capabilities = &c
		rep.caps = c
	}
	if h := msg.Health; h != nil {
		v := h.Healthy
		st.Healthy = &v
		st.Health = healthJSON(h)
		// An event when healthy flips and when the error text changes
		// (a collector that fails in a new way); not for the first
		// report of a healthy agent.
		changed := rep.healthy == nil && (!v || h.LastError != "") ||
			rep.healthy != nil && (*rep.healthy != v || rep.lastError != h.LastError)
		if changed {
			s.o.Batcher.Event(store.Event{InstanceUID: uid, At: now, Kind: store.EventHealthChanged, ReplicaID: s.o.ReplicaID,
				Detail: strings.TrimSpace(fmt.Sprintf("healthy=%v %s", v, h.LastError))})
		}
		rep.healthy, rep.lastError = &v, h.LastError
	}
	if ec := msg.EffectiveConfig; ec != nil && ec.ConfigMap != nil {
		var b strings.Builder
		for name, f := range ec.ConfigMap.ConfigMap {
			if name != "" && len(ec.ConfigMap.ConfigMap) > 1 {
				fmt.Fprintf(&b, "# %s\n", name)
			}
			b.Write(f.Body)
		}
		v := b.String()
		st.EffectiveConfig = &v
	}
	if rcs := msg.RemoteConfigStatus; rcs != nil {
		status := strings.ToLower(strings.TrimPrefix(rcs.Status.String(), "RemoteConfigStatuses_"))
		hash := hex.EncodeToString(rcs.LastRemoteConfigHash)
		st.RemoteConfigStatus, st.RemoteConfigHash, st.RemoteConfigError = &status, &hash, &rcs.ErrorMessage
		rep.hash, rep.known = hash, true
		kind := ""
		switch rcs.Status {
		case protobufs.RemoteConfigStatuses_RemoteConfigStatuses_APPLIED:
			kind = store.EventConfigApplied
		case protobufs.RemoteConfigStatuses_RemoteConfigStatuses_FAILED:
			kind = store.EventConfigFailed
		case protobufs.RemoteConfigStatuses_RemoteConfigStatuses_APPLYING:
			kind = store.EventConfigApplying
		}
		if kind != "" {
			s.o.Batcher.Event(store.Event{InstanceUID: uid, At: now, Kind: kind, ReplicaID: s.o.ReplicaID, Detail: strings.TrimSpace(hash + " " + rcs.ErrorMessage)})
		}
	}
	if ps := msg.PackageStatuses; ps != nil {
		m := map[string]any{}
		for name, p := range ps.Packages {
			m[name] = map[string]any{"agent_has_version": p.AgentHasVersion, "server_offered_version": p.ServerOfferedVersion,
				"agent_has_hash": hex.EncodeToString(p.AgentHasHash), "server_offered_hash": hex.EncodeToString(p.ServerOfferedHash),
				"status": p.Status.String(), "error": p.ErrorMessage}
		}
		st.PackageStatuses = map[string]any{"packages": m, "error": ps.ErrorMessage,
			"server_provided_all_packages_hash": hex.EncodeToString(ps.ServerProvidedAllPackagesHash)}
	}
	return st
}

// healthJSON is the stored form of a ComponentHealth, components nested as
// the agent reports them (the OpenTelemetry Collector: pipelines, then
// their receivers, processors and exporters).
func healthJSON(h *protobufs.ComponentHealth) json.RawMessage {
	b, _ := json.Marshal(healthMap(h))
	return b
}

func healthMap(h *protobufs.ComponentHealth) map[string]any {
	m := map[string]any{"healthy": h.Healthy, "status": h.Status, "last_error": h.LastError,
		"start_time_unix_nano": h.StartTimeUnixNano, "status_time_unix_nano": h.StatusTimeUnixNano}
	comp := map[string]any{}
	for name, c := range h.ComponentHealthMap {
		if c != nil {
			comp[name] = healthMap(c)
		}
	}
	m["components"] = comp
	return m
}

func attrs(kvs []*protobufs.KeyValue) map[string]string {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		out[kv.Key] = anyString(kv.Value)
	}
	return out
}

func anyString(v *protobufs.AnyValue) string {
	if v == nil {
		return ""
	}
	switch x := v.Value.(type) {
	case *protobufs.AnyValue_StringValue:
		return x.StringValue
	case *protobufs.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *protobufs.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *protobufs.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	case *protobufs.AnyValue_BytesValue:
		return hex.EncodeToString(x.BytesValue)
	default:
		b, _ := json.Marshal(v)
		return string(b)
	}
}

// Push acts on a notification of the event bus (payload: an instance uid,
// or store.RestartNotifyPrefix and one): it delivers the desired config,
// or a restart command, to agent uid if it is connected here.
func (s *Server) Push(ctx context.Context, payload string) {
	if uid, ok := strings.CutPrefix(payload, store.RevokeNotifyPrefix); ok {
		s.revoke(uid)
		return
	}
	if uid, ok := strings.CutPrefix(payload, store.RotateNotifyPrefix); ok {
		s.rotate(ctx, uid)
		return
	}
	if uid, ok := strings.CutPrefix(payload, PackagesNotifyPrefix); ok {
		s.pushPackages(ctx, uid)
		return
	}
	uid, restart := strings.CutPrefix(payload, store.RestartNotifyPrefix)
	if !restart {
		s.PushBatch(ctx, []string{uid})
		return
	}
	s.mu.Lock()
	ac := s.byUID[uid]
	if ha := s.http[uid]; ha != nil {
		ha.mu.Lock()
		ha.cmdCheck = true
		ha.mu.Unlock()
	}
	s.mu.Unlock()
	if ac == nil {
		return
	}
	p, err := s.o.Store.PendingRestarts(ctx, []string{uid})
	if err != nil {
		s.log.Warn("loading a restart request failed; the reconcile will retry", "agent", uid, "error", err)
		return
	}
	if at, ok := p[uid]; ok {
		s.restart(ctx, ac, at)
	}
}

// restart sends the restart command requested at at to a WebSocket agent.
func (s *Server) restart(ctx context.Context, ac *agentConn, at time.Time) {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	cmd := s.claimRestart(ctx, ac.uid, at, ac.seen.caps)
	if cmd == nil {
		return
	}
	msg := &protobufs.ServerToAgent{Command: cmd}
	msg.InstanceUid, _ = ParseUID(ac.uid)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ac.conn.Send(sctx, msg); err != nil {
		s.log.Warn("sending a restart command failed", "agent", ac.uid, "error", err)
	}
}

// deliver sends want to the agent unless it has it or was sent it, or has
// not yet told which config it runs (then its full state does).
func (s *Server) deliver(ctx context.Context, ac *agentConn, want store.Desired) {
	if want.Hash == "" {
		return
	}
	ac.mu.Lock()
	defer ac.mu.Unlock()
	if !ac.seen.known || want.Hash == ac.seen.hash || want.Hash == ac.sentHash {
		return
	}
	msg := &protobufs.ServerToAgent{RemoteConfig: remoteConfig(want)}
	msg.InstanceUid, _ = ParseUID(ac.uid)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ac.conn.Send(sctx, msg); err != nil {
		s.log.Warn("sending a remote config failed", "agent", ac.uid, "error", err)
		return
	}
	ac.sentHash = want.Hash
	s.o.Batcher.Event(store.Event{InstanceUID: ac.uid, At: time.Now(), Kind: store.EventConfigSent, ReplicaID: s.o.ReplicaID, Detail: want.Hash})
}

// Reconcile is the event bus's safety net: it compares the desired config
// of every agent connected here with what the agent reported and was sent,
// and delivers what is missing (a notification that was lost while the
// listener session reconnected), restart requests, credential rotations
// and revocations included.
func (s *Server) Reconcile(ctx context.Context) error {
	s.mu.Lock()
	uids := make([]string, 0, len(s.byUID))
	acs := make(map[string]*agentConn, len(s.byUID))
	for uid, ac := range s.byUID {
		uids = append(uids, uid)
		acs[uid] = ac
	}
	for uid, ha := range s.http {
		if time.Since(time.Unix(0, ha.seen.Load())) > httpAgentIdle {
			// Polls elsewhere now, or stopped; a new poll starts afresh.
			delete(s.http, uid)
			continue
		}
		ha.mu.Lock()
		ha.dirty, ha.cmdCheck, ha.pkgCheck = true, true, true
		ha.mu.Unlock()
	}
	s.mu.Unlock()
	for len(uids) > 0 {
		n := min(len(uids), 1000)
		d, err := s.o.Store.DesiredConfigs(ctx, uids[:n])
		if err != nil {
			return err
		}
		for uid, want := range d {
			s.deliver(ctx, acs[uid], want)
		}
		p, err := s.o.Store.PendingRestarts(ctx, uids[:n])
		if err != nil {
			return err
		}
		for uid, at := range p {
			s.restart(ctx, acs[uid], at)
		}
		// Revocations and rotations whose notification was lost.
		rev, err := s.o.Store.RevokedAmong(ctx, uids[:n])
		if err != nil {
			return err
		}
		for uid := range rev {
			s.revoke(uid)
		}
		rot, err := s.o.Store.PendingRotations(ctx, uids[:n])
		if err != nil {
			return err
		}
		for uid := range rot {
			s.rotate(ctx, uid)
		}
		uids = uids[n:]
	}
	s.reconcilePackages(ctx, acs)
	return nil
}

// pendingOffer puts the credential offer that waited for the agent's
// heartbeat interval (security.go) into resp.
func (s *Server) pendingOffer(ctx context.Context, ac *agentConn, uid string, resp *protobufs.ServerToAgent) {
	switch ac.pending {
	case pendingEnroll:
		ac.pending = 0
		s.enrollOffer(ctx, ac, uid, ac.seen.caps, ac.hb, resp)
	case pendingRotate:
		ac.pending = 0
		offer, err := s.rotateOffer(ctx, ac, uid)
		if err != nil {
			s.log.Warn("rotating an agent credential failed", "agent", uid, "error", err)
			return
		}
		resp.ConnectionSettings = offer
		resp.Capabilities |= uint64(protobufs.ServerCapabilities_ServerCapabilities_OffersConnectionSettings)
	}
}

// knownHTTP reports whether uid polls this process over plain HTTP.
func (s *Server) knownHTTP(uid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.http[uid] != nil
}
