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
//
// The package by job:
//   - serving: the listener and the stop (server.go), connections and
//     messages (messages.go), who is connected here (registry.go), what
//     agents report and the events (report.go);
//   - identity: the enrollment secret, credentials, certificates,
//     duplicates and revocation (security.go), refusals before the
//     upgrade (identity.go), the listener's guard (bodyguard.go);
//   - remote configs (configs.go, configSender);
//   - package offers (packages.go, offerer);
//   - restart commands (commands.go, commander);
//   - push: the event bus's notifications and the reconcile (push.go).
package opampserver

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

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
	// OwnMetrics, when set, serves the agents' own metrics on
	// OwnMetricsPath (default /v1/metrics) and offers it to agents that
	// report them; OwnMetricsURL overrides the offered URL
	// (telemetry_offer.go).
	OwnMetrics     OwnMetricsSink
	OwnMetricsPath string
	OwnMetricsURL  string
}

// Server is the OpAMP side of one replica: it serves the listener and the
// connections (server.go, messages.go) and wires the parts that act on
// agents.
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

	// The agents served here (registry.go).
	registry

	// The parts that act on agents, each with the state it needs (the
	// store or the offers' source, the events, the registry): remote
	// configs, restart commands and package offers (offerer is embedded:
	// its methods answer plain-HTTP polls and act on pushes). ev records
	// agent events. Identity and push work on the Server: they use its
	// limits, metrics and every part.
	configs configSender
	cmds    commander
	offerer
	ev events

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

// New returns a server; Start listens.
func New(o Options) *Server {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	o.MaxMessageBytes = cmp.Or(o.MaxMessageBytes, 4<<20)
	o.AuthFailuresPerMinute = cmp.Or(o.AuthFailuresPerMinute, 30)
	o.ReconnectsPerMinute = cmp.Or(o.ReconnectsPerMinute, 30)
	o.OfflineAfter = cmp.Or(o.OfflineAfter, 90*time.Second)
	o.EnrollmentsPerMinute = cmp.Or(o.EnrollmentsPerMinute, 600)
	o.SecretBackoff = cmp.Or(o.SecretBackoff, 30*time.Second)
	o.LearnHeartbeatWithin = cmp.Or(o.LearnHeartbeatWithin, 5*time.Minute)
	o.StormLogInterval = cmp.Or(o.StormLogInterval, time.Minute)
	o.Limits.defaults()
	s := &Server{o: o, log: o.Log.With("component", "opamp"), registry: newRegistry(),
		ev:          events{batcher: o.Batcher, replica: o.ReplicaID},
		reconnects:  authlimit.New(o.ReconnectsPerMinute),
		enrollments: authlimit.New(o.EnrollmentsPerMinute), storm: &stormLog{interval: o.StormLogInterval}}
	s.configs = configSender{store: o.Store, ev: s.ev, log: s.log}
	s.cmds = commander{store: o.Store, ev: s.ev, log: s.log, reg: &s.registry}
	s.offerer = offerer{pkgs: o.Packages, ev: s.ev, log: s.log, reg: &s.registry}
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
	if s.o.OwnMetrics != nil {
		mux.Handle(s.ownMetricsPath(), s.ownMetricsHandler())
	}
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
func (s *Server) Connections() int { return s.wsCount() }

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
	open := s.wsOpen()
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
