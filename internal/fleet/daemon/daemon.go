// Package daemon assembles one myriarchd replica: store, leader election,
// OpAMP server, event bus, leader jobs, REST API and UI, and stops them in
// the order of the planned-stop sequence of the high-availability spec:
//
//  1. the OpAMP server closes the agent connections (up to
//     server.shutdownTimeout), then, with its own 15 s deadline, flushes the
//     last-seen times and events and marks this replica's agents offline;
//  2. the HTTP server drains open requests for a fresh server.shutdownTimeout;
//  3. the leader unlocks and closes its lock session (up to 4 s);
//  4. the event bus listener session and the pool close.
package daemon

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore"
	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/eventbus"
	"github.com/myriarch/myriarch/internal/fleet/gitops"
	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/internal/fleet/lastseen"
	"github.com/myriarch/myriarch/internal/fleet/opampserver"
	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/telemetry"
	"github.com/myriarch/myriarch/internal/fleet/upgrades"
	"github.com/myriarch/myriarch/internal/version"
	"github.com/myriarch/myriarch/pgleader"
)

// Phases of the planned stop, in order (reported to Options.OnPhase).
const (
	PhaseOpAMPClose    = "opamp_close"
	PhaseFinalFlush    = "final_flush"
	PhaseHTTPDrain     = "http_drain"
	PhaseLeaderRelease = "leader_release"
	PhaseClose         = "pool_listener_close"
)

// gitopsCheck is how often the GitOps job looks for a poll requested by a
// webhook.
const gitopsCheck = 2 * time.Second

// Options configure a replica.
type Options struct {
	Config  *config.Config
	Log     *slog.Logger
	Version string
	// OnPhase is called at the start of every stop phase (tests, logs).
	OnPhase func(phase string)
	// Mount adds more handlers (the UI) to the HTTP mux.
	Mount func(mux *http.ServeMux, a *api.API)
}

// Daemon is one running replica.
type Daemon struct {
	o     Options
	cfg   *config.Config
	log   *slog.Logger
	nonce string

	Store   *store.Store
	Elector *pgleader.Elector
	OpAMP   *opampserver.Server
	API     *api.API
	Runner  *jobs.Runner
	Reg     *prometheus.Registry

	batcher *lastseen.Batcher
	// Telemetry reads the agents' own metrics; nil when telemetry.enabled
	// is false.
	Telemetry   *telemetry.Reader
	teleBatcher *telemetry.Batcher
	teleCancel  context.CancelFunc
	teleDone    chan struct{}
	httpSrv     *http.Server
	httpAddr    net.Addr

	// leadership is the latest term this replica was elected in (nil
	// before the first); its InTerm refuses writes once that term is over.
	leadership atomic.Pointer[pgleader.Leadership]

	stopping atomic.Bool
	stopOnce sync.Once
	stopErr  error

	electorCancel context.CancelFunc
	electorDone   chan struct{}
	bgCancel      context.CancelFunc // batcher
	bgDone        chan struct{}
	busCancel     context.CancelFunc
	busDone       chan struct{}
	httpDone      chan struct{}
	jobsWG        sync.WaitGroup
}

// Start opens the database, migrates it, and starts every part of the
// replica. On error everything started so far is stopped again.
func Start(ctx context.Context, o Options) (d *Daemon, err error) {
	cfg := o.Config
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.OnPhase == nil {
		o.OnPhase = func(string) {}
	}
	var nb [6]byte
	_, _ = rand.Read(nb[:])
	d = &Daemon{o: o, cfg: cfg, log: o.Log, nonce: cfg.HA.ReplicaID + "/" + hex.EncodeToString(nb[:])}
	d.Reg = prometheus.NewRegistry()
	d.Reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d.Reg.MustRegister(version.Collector("myriarchd", o.Version))

	d.Store, err = store.Open(ctx, cfg.Database.URL, int32(cfg.Database.MaxConns), d.log)
	if err != nil {
		return nil, err
	}
	// The error returns below return a nil *Daemon, so the deferred abort
	// needs its own reference to what was started.
	started := d
	defer func() {
		if err != nil {
			started.abort()
		}
	}()
	// The election's tables exist before the API can be asked about them.
	if err := pgleader.EnsureSchema(ctx, d.Store.Pool); err != nil {
		return nil, fmt.Errorf("creating the leader tables: %w", err)
	}
	d.batcher = lastseen.New(d.Store, cfg.Server.LastSeenFlushInterval, d.log, d.Reg)
	// One issuer of download tokens for the offers and the artifact
	// endpoint (AgentAuth), so they share the cached keys.
	tokens := artifacts.NewTokens(d.Store.Pool)
	proxies, limits := listenerLimits(cfg.Server)
	var ownMetrics opampserver.OwnMetricsSink
	teleAgg := telemetry.NewAggregates()
	if t := cfg.Telemetry; t.Enabled {
		tiers := telemetry.Tiers{FineResolution: t.FineResolution, FineRetention: t.FineRetention,
			CoarseResolution: t.CoarseResolution, CoarseRetention: t.CoarseRetention}
		d.teleBatcher = telemetry.NewBatcher(telemetry.BatcherOptions{Pool: d.Store.Pool, Tiers: tiers, FlushInterval: t.FlushInterval,
			MaxSeriesPerAgent: int(t.MaxSeriesPerAgent), Log: d.log, Registerer: d.Reg})
		d.Telemetry = &telemetry.Reader{Pool: d.Store.Pool, Tiers: tiers}
		ownMetrics = &telemetry.Receiver{Batcher: d.teleBatcher}
		d.Reg.MustRegister(teleAgg)
	}
	d.OpAMP = opampserver.New(opampserver.Options{OwnMetrics: ownMetrics, OwnMetricsURL: cfg.Telemetry.PublicURL, Store: d.Store, Batcher: d.batcher, ReplicaID: cfg.HA.ReplicaID, Listener: limits,
		Nonce: d.nonce, Secret: cfg.Server.EnrollmentSecret, Log: d.log, Registerer: d.Reg,
		MaxMessageBytes: cfg.Server.OpAMPMaxMessageBytes, AuthFailuresPerMinute: cfg.Server.AuthFailuresPerMinute,
		ReconnectsPerMinute: cfg.Agents.ReconnectsPerMinute, OfflineAfter: cfg.Agents.OfflineAfter,
		EnrollmentsPerMinute: cfg.Server.EnrollmentsPerMinute, HeartbeatInterval: cfg.Server.OpAMPHeartbeatInterval,
		Limits: opampserver.ReportLimits{MaxAttributes: int(cfg.Server.AgentMaxAttributes), MaxKeyBytes: int(cfg.Server.AgentMaxAttributeKeyBytes),
			MaxValueBytes: int(cfg.Server.AgentMaxAttributeValueBytes), MaxEffectiveConfigBytes: int(cfg.Server.AgentMaxEffectiveConfigBytes),
			MaxHealthComponents: int(cfg.Server.AgentMaxHealthComponents)},
		Packages: artifacts.OfferSource{Pool: d.Store.Pool, BaseURL: d.ArtifactBaseURL, Tokens: tokens}})

	d.Elector, err = pgleader.New(pgleader.Config{
		Pool: d.Store.Pool, LeaderSessionTimeout: cfg.HA.LeaderSessionTimeout, HeartbeatInterval: cfg.HA.HeartbeatInterval,
		LockKey: cfg.HA.LeaderLockKey, ID: cfg.HA.ReplicaID, Version: o.Version, Logger: d.log, Registerer: d.Reg,
		OnElected: func(l *pgleader.Leadership) {
			d.log.Info("this replica leads; starting the leader jobs", "term", l.Term())
			d.leadership.Store(l)
			d.jobsWG.Go(func() { d.Runner.Lead(l.Context(), l.Term(), l.InTerm) })
		},
		OnDemoted: func(term int64, reason string) {
			d.log.Info("this replica no longer leads", "term", term, "reason", reason)
		},
	})
	if err != nil {
		return nil, err
	}
	gh, err := releases.NewGitHubLister(cfg.Artifacts.GitHubAPIURL, cfg.Artifacts.GitHubToken, nil)
	if err != nil {
		return nil, fmt.Errorf("artifacts.githubApiUrl: %w", err)
	}
	// The release tracker and the prefetch write through the fence of the
	// term the runner started them in, and record that term.
	tracker := releases.NewTracker(d.Store.Pool, map[string]releases.Lister{releases.TypeOCI: releases.OCILister{}, releases.TypeGitHub: gh},
		cfg.HA.LeaderLockKey, d.log, d.Reg)
	s3, err := artifactS3(cfg)
	if err != nil {
		return nil, err
	}
	prefetch := artifacts.New(artifacts.Options{Pool: d.Store.Pool, LockKey: cfg.HA.LeaderLockKey, Replica: cfg.HA.ReplicaID,
		Keep: int(cfg.Artifacts.KeepVersions), S3: s3, StoreS3: cfg.Artifacts.Store == "s3", SegmentSize: cfg.Artifacts.SegmentBytes, Log: d.log, Registerer: d.Reg})
	leaderJobs := []jobs.Job{
		jobs.OfflineSweeper(cfg.Jobs.OfflineSweepInterval, cfg.Agents.OfflineAfter, nil),
		jobs.Housekeeping(cfg.Jobs.HousekeepingInterval, cfg.Agents.EventRetention, cfg.Jobs.ReplicaRetention, d.Elector.LockKey()),
		(&rollout.Engine{Store: d.Store, LockKey: cfg.HA.LeaderLockKey, Log: d.log}).Job(cfg.Jobs.RolloutInterval),
		tracker.Job(cfg.Jobs.ReleaseTrackerInterval),
		prefetch.Job(cfg.Jobs.ArtifactPrefetchInterval),
		(&upgrades.Engine{Pool: d.Store.Pool, LockKey: cfg.HA.LeaderLockKey, Log: d.log}).Job(cfg.Jobs.RolloutInterval),
	}
	if d.Telemetry != nil {
		leaderJobs = append(leaderJobs, d.Telemetry.Job(agentCounts{d.Store}, teleAgg))
	}
	var poller *gitops.Poller
	if g := cfg.GitOps; g.RepoURL != "" {
		poller = gitops.New(gitops.Options{Store: d.Store, LockKey: cfg.HA.LeaderLockKey, RepoURL: g.RepoURL, Ref: g.Ref, Path: g.Path,
			PollInterval: g.PollInterval, Username: g.Username, Token: g.Token, TokenFile: g.TokenFile, SSHKeyFile: g.SSHKeyFile,
			SSHKnownHostsFile: g.SSHKnownHostsFile, WebhookSecret: g.WebhookSecret, Log: d.log})
		// The job checks often whether a webhook asked for a poll; it
		// polls the repository every gitops.pollInterval.
		leaderJobs = append(leaderJobs, poller.Job(min(gitopsCheck, g.PollInterval)))
		d.Reg.MustRegister(gitops.Collector{Store: d.Store})
	}
	// Elected only once Run starts, below: d.Runner is set by then.
	d.Runner = jobs.NewRunner(leaderJobs, cfg.HA.ReplicaID, d.log, d.Reg)
	d.Reg.MustRegister(rollout.Collector{Store: d.Store})
	d.Reg.MustRegister(upgrades.Collector{Pool: d.Store.Pool})

	tlsCfg, err := tlsConfig("server.tlsCertFile", cfg.Server.TLSCertFile, cfg.Server.TLSKeyFile, d.log)
	if err != nil {
		return nil, err
	}
	if tlsCfg, err = withClientCAs(tlsCfg, cfg.Server.OpAMPClientCAFile); err != nil {
		return nil, err
	}
	httpTLS, err := tlsConfig("server.httpTlsCertFile", cfg.Server.HTTPTLSCertFile, cfg.Server.HTTPTLSKeyFile, d.log)
	if err != nil {
		return nil, err
	}
	if err := d.OpAMP.Start(cfg.Server.OpAMPListen, cfg.Server.OpAMPPath, tlsCfg); err != nil {
		return nil, err
	}

	d.API = api.New(api.Options{Store: d.Store, Telemetry: d.Telemetry, Cluster: d.Elector, Jobs: d.Runner.Statuses, Ready: d.ready, Gatherer: d.Reg, Log: d.log,
		AuthFailuresPerMinute: cfg.Server.AuthFailuresPerMinute, SessionTTL: cfg.Server.UISessionTTL,
		Proxies: proxies, AuthFailurePenalty: cfg.Server.AuthFailurePenalty, RequestTimeout: cfg.Server.RequestTimeout})
	mux := http.NewServeMux()
	d.API.Register(mux)
	// server.httpWriteTimeout bounds an API response; for a download it is
	// the longest time without progress.
	mux.Handle("GET "+artifacts.PathPrefix, artifacts.WriteProgressDeadline(
		artifacts.Handler(d.Store.Pool, AgentAuth(cfg, d.Store, tokens), d.log, s3Store(s3)...), cfg.Server.HTTPWriteTimeout))
	if poller != nil {
		// Verified by its HMAC signature, not by an API token.
		mux.Handle("POST /api/v1/gitops/webhook", poller.Webhook())
	}
	if o.Mount != nil {
		o.Mount(mux, d.API)
	}
	l, err := net.Listen("tcp", cfg.Server.HTTPListen)
	if err != nil {
		return nil, fmt.Errorf("server.httpListen %s: %w", cfg.Server.HTTPListen, err)
	}
	d.httpAddr = l.Addr()
	d.httpSrv = newHTTPServer(cfg.Server, mux, httpTLS)
	l = proxies.ListenerOf(l)
	if httpTLS != nil {
		l = tls.NewListener(l, httpTLS)
	}
	d.httpDone = make(chan struct{})
	go func() {
		defer close(d.httpDone)
		if err := d.httpSrv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("HTTP server failed", "error", err)
		}
	}()

	var ectx, bgctx, busctx context.Context
	ectx, d.electorCancel = context.WithCancel(context.Background())
	d.electorDone = make(chan struct{})
	go func() { defer close(d.electorDone); _ = d.Elector.Run(ectx) }()
	bgctx, d.bgCancel = context.WithCancel(context.Background())
	d.bgDone = make(chan struct{})
	go func() { defer close(d.bgDone); d.batcher.Run(bgctx) }()
	if d.teleBatcher != nil {
		var tctx context.Context
		tctx, d.teleCancel = context.WithCancel(context.Background())
		d.teleDone = make(chan struct{})
		go func() { defer close(d.teleDone); d.teleBatcher.Run(tctx) }()
	}
	bus := eventbus.New(d.Elector.Listen, store.NotifyChannel, d.OpAMP, cfg.Agents.ReconcileInterval, d.log, d.Reg)
	busctx, d.busCancel = context.WithCancel(context.Background())
	d.busDone = make(chan struct{})
	go func() { defer close(d.busDone); bus.Run(busctx) }()
	d.log.Info("myriarchd replica started", "replica", cfg.HA.ReplicaID, "opamp", d.OpAMP.Addr().String()+cfg.Server.OpAMPPath,
		"http", d.httpAddr.String(), "leaderSessionTimeout", cfg.HA.LeaderSessionTimeout)
	return d, nil
}

// stopTelemetry stops the own-metrics batcher (it flushes once more).
func (d *Daemon) stopTelemetry() {
	if d.teleCancel != nil {
		d.teleCancel()
		<-d.teleDone
		d.teleCancel = nil
	}
}

// agentCounts counts agents for the telemetry job.
type agentCounts struct{ st *store.Store }

func (a agentCounts) Counts(ctx context.Context) (online, offline, unhealthy int64, err error) {
	c, err := a.st.Counts(ctx)
	return c.Online, c.Offline, c.Unhealthy, err
}

// artifactS3 is the S3 store of artifacts.store s3, else of the S3
// settings when they are complete (so that blobs stored there before a
// switch back to postgres are still served), else nil.
func artifactS3(cfg *config.Config) (*blobstore.S3, error) {
	a := cfg.Artifacts
	if a.Store != "s3" && (a.S3Endpoint == "" || a.S3Bucket == "") {
		return nil, nil
	}
	secret, err := a.ResolveS3SecretKey()
	if err != nil {
		return nil, err
	}
	s3, err := blobstore.NewS3(blobstore.S3Config{Endpoint: a.S3Endpoint, Bucket: a.S3Bucket, Prefix: a.S3Prefix, Region: a.S3Region,
		AccessKey: a.S3AccessKey, SecretKey: secret, TLS: a.S3TLS, CAFile: a.S3CAFile})
	if err != nil {
		return nil, fmt.Errorf("artifacts S3 store (artifacts.s3Endpoint %q, artifacts.s3CaFile %q): %w", a.S3Endpoint, a.S3CAFile, err)
	}
	return s3, nil
}

func s3Store(s *blobstore.S3) []blobstore.Store {
	if s == nil {
		return nil
	}
	return []blobstore.Store{s}
}

// AgentAuth is the one credential check of the artifact endpoint
// (artifacts.AgentAuth): the download token of a package offer, bound to
// the agent and the artifact, or an agent's own credential; never the
// enrollment secret; a revoked agent is refused either way. Failed
// attempts count against server.authFailuresPerMinute per source.
func AgentAuth(cfg *config.Config, st *store.Store, tokens *artifacts.Tokens) artifacts.AgentAuthorizer {
	return artifacts.AgentAuth(st, tokens, cfg.Server.AuthFailuresPerMinute)
}

// ArtifactBaseURL is the base of the download URLs offered to agents:
// artifacts.publicUrl, or http:// and the address of the HTTP listener (the
// host name for a listener on all addresses).
func (d *Daemon) ArtifactBaseURL() string {
	if d.cfg.Artifacts.PublicURL != "" {
		return d.cfg.Artifacts.PublicURL
	}
	if d.httpAddr == nil {
		return ""
	}
	host, port, _ := net.SplitHostPort(d.httpAddr.String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return "http://" + net.JoinHostPort(host, port)
}

// OpAMPAddr and HTTPAddr are the bound listen addresses.
func (d *Daemon) OpAMPAddr() net.Addr { return d.OpAMP.Addr() }

// HTTPAddr is the bound address of the API/UI listener.
func (d *Daemon) HTTPAddr() net.Addr { return d.httpAddr }

// Nonce is the process nonce that prefixes this replica's connection ids.
func (d *Daemon) Nonce() string { return d.nonce }

func (d *Daemon) ready(ctx context.Context) error {
	if d.stopping.Load() {
		return errors.New("stopping")
	}
	return d.Store.Pool.Ping(ctx)
}

// Shutdown runs the planned-stop sequence once; later calls return the
// first result.
func (d *Daemon) Shutdown() error {
	d.stopOnce.Do(func() { d.stopErr = d.shutdown() })
	return d.stopErr
}

func (d *Daemon) shutdown() error {
	d.stopping.Store(true)
	timeout := d.cfg.Server.ShutdownTimeout
	var errs []error
	phase := func(name string) time.Time {
		d.log.Info("planned stop", "phase", name)
		d.o.OnPhase(name)
		return time.Now()
	}

	// 1. OpAMP: close the agent connections, then the final flush.
	t := phase(PhaseOpAMPClose)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	if err := d.OpAMP.Stop(ctx); err != nil {
		errs = append(errs, fmt.Errorf("OpAMP close: %w", err))
	}
	cancel()
	d.bgCancel()
	<-d.bgDone
	d.stopTelemetry() // its last flush, within 5 s
	d.log.Info("agent connections closed", "took", time.Since(t))
	t = phase(PhaseFinalFlush)
	ctx, cancel = context.WithTimeout(context.Background(), config.FinalFlushDeadline)
	if err := d.OpAMP.FinalFlush(ctx); err != nil {
		errs = append(errs, fmt.Errorf("final flush: %w", err))
	}
	cancel()
	d.log.Info("final flush done", "took", time.Since(t))

	// 2. HTTP: drain for a fresh shutdownTimeout.
	t = phase(PhaseHTTPDrain)
	ctx, cancel = context.WithTimeout(context.Background(), timeout)
	if err := d.httpSrv.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("HTTP drain: %w", err))
		_ = d.httpSrv.Close()
	}
	cancel()
	<-d.httpDone
	d.log.Info("HTTP drained", "took", time.Since(t))

	// 3. Leader: unlock and close the lock session (pgleader bounds it by 4s).
	t = phase(PhaseLeaderRelease)
	d.electorCancel()
	select {
	case <-d.electorDone:
	case <-time.After(failover.LeaderReleaseBound):
		errs = append(errs, errors.New("leader release took longer than its bound"))
	}
	d.jobsWG.Wait()
	d.log.Info("leadership released", "took", time.Since(t))

	// 4. Listener session and pool.
	phase(PhaseClose)
	d.busCancel()
	<-d.busDone
	d.Store.Close()
	return errors.Join(errs...)
}

// abort stops what Start started, without the planned-stop sequence.
func (d *Daemon) abort() {
	if d.electorCancel != nil {
		d.electorCancel()
		<-d.electorDone
	}
	if d.bgCancel != nil {
		d.bgCancel()
		<-d.bgDone
	}
	if d.busCancel != nil {
		d.busCancel()
		<-d.busDone
	}
	d.stopTelemetry()
	d.jobsWG.Wait()
	if d.httpSrv != nil {
		_ = d.httpSrv.Close()
		<-d.httpDone
	}
	if d.OpAMP != nil && d.OpAMP.Addr() != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = d.OpAMP.Stop(ctx)
		cancel()
	}
	if d.Store != nil {
		d.Store.Close()
	}
}

// Kill simulates a replica killed while it runs (kill -9 during a drain):
// connections drop, nothing is flushed, no agent is marked offline. What a
// kill loses is exactly what Kill skips; the offline sweeper of the leader
// marks the agents later.
func (d *Daemon) Kill() {
	d.stopping.Store(true)
	d.stopOnce.Do(func() {
		d.stopErr = errors.New("killed")
		d.abort()
	})
}

// Leadership returns the latest term this replica was elected in, or nil if
// it never led. Its writes (InTerm) commit only while that term is current,
// so a caller holding an old one is refused, not misdirected.
func (d *Daemon) Leadership() *pgleader.Leadership { return d.leadership.Load() }
