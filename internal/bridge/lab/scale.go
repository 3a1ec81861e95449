package lab

// The scale lab: one process pair carrying many exclusive sessions, each
// with its own lease and its own broker connection, a message stream on
// every session, and the owner killed (or stopped cleanly) so that every
// lease changes hands at once. It answers what one session's lab cannot:
// does every session still reach full service within its own budget when
// the standby takes them all, and how memory, renewal CPU and store load
// grow with the number of sessions.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/faultnet"
	"github.com/myriarch/myriarch/lease"
)

// ScaleScenarios are the faults the scale lab injects: the two that hand
// every lease over at once.
var ScaleScenarios = []string{OwnerSIGKILL, OwnerPlannedStop}

// MaxScaleSessions bounds --sessions: each session is one broker
// connection and one lease, and the lab's proxies hold two descriptors per
// connection.
const MaxScaleSessions = 5000

// ScaleOptions configure a scale run.
type ScaleOptions struct {
	// Command starts one bridge process (as Options.Command).
	Command func(args ...string) *exec.Cmd
	// Sessions is the number of exclusive sessions per process.
	Sessions int
	// Store is the lease store: sqlite (default), postgres or etcd.
	Store string
	// Broker is an external broker URL; "" starts the embedded one.
	Broker string
	// Scenarios: owner_sigkill and/or owner_planned_stop; nil means both.
	Scenarios []string
	// Rate is the publisher's messages per second over all sessions
	// (round robin); 0 means 2 per session, at least 20 and at most
	// 1,000.
	Rate int
	// LeaseTTL of every session's route; 0 means 6s (the lab's).
	LeaseTTL time.Duration
	// IdleWindow is the steady-state window (no messages) over which
	// renewal CPU and store operations are measured; 0 means two renew
	// intervals, at least 5s.
	IdleWindow time.Duration
	// SkipSingle leaves out the one-session run that the herd is compared
	// with.
	SkipSingle bool
	Dir        string
	Progress   io.Writer
}

// ScaleResult is one scenario at one number of sessions.
type ScaleResult struct {
	Scenario string `json:"scenario"`
	Sessions int    `json:"sessions"`
	// BudgetS is the owner-death budget of one session (they are all
	// configured alike).
	BudgetS float64 `json:"budget_s"`
	// SessionsWithinBudget counts sessions whose failure-to-full (the
	// fault → the successor's own record of reaching full service for
	// that session) is within BudgetS.
	SessionsWithinBudget int `json:"sessions_within_budget"`
	// AllFullS: the fault → the lab saw every session at full service
	// on the successor (polling /status every 100ms).
	AllFullS           float64 `json:"all_full_s"`
	MaxFailureToFullS  float64 `json:"max_failure_to_full_s"`
	P50FailureToFullS  float64 `json:"p50_failure_to_full_s"`
	MinFailureToFullS  float64 `json:"min_failure_to_full_s"`
	SingleSessionFullS float64 `json:"single_session_failure_to_full_s"`
	// HerdRatio is AllFullS / SingleSessionFullS (the target: at most 2).
	HerdRatio float64 `json:"herd_ratio,omitempty"`
	Published int     `json:"published"`
	Delivered int     `json:"delivered"`
	Lost      int     `json:"lost"`
	// Duplicates may reach DuplicateBound: min(receive_maximum,
	// max_in_flight) per session.
	Duplicates     int `json:"duplicates"`
	DuplicateBound int `json:"duplicate_bound"`
	// StaleDeliveries: a session's delivery stamped with a lower lease
	// version than one the sink already had from that session.
	StaleDeliveries int `json:"stale_deliveries"`
	Unstamped       int `json:"unstamped"`
	// LeasesMoved counts sessions whose lease the successor holds after
	// the round with a version above the faulted owner's.
	LeasesMoved int `json:"leases_moved"`
	// BrokerConnectAttempts: connections the successor opened to the
	// broker from the fault until every session was full (one per session
	// when nothing had to be retried).
	BrokerConnectAttempts int64 `json:"broker_connect_attempts"`
	// HerdStoreOpsPerS: the successor's lease calls (acquire attempts and
	// renewals) per second from the fault until every session was full.
	HerdStoreOpsPerS float64 `json:"herd_store_ops_per_s"`
	HerdStoreOps     int64   `json:"herd_store_ops"`
	// PeakRSSKB is the successor's peak resident memory (VmHWM) after the
	// herd.
	PeakRSSKB int64 `json:"peak_rss_kb"`
	// Steady state, measured once per number of sessions with no messages
	// flowing: the owner's resident memory per session (over the
	// one-session process when it ran, else over the process's own),
	// the owner's CPU (renewals of every lease plus MQTT keep-alives: an
	// upper bound of the renewals' cost) and the standby's, and the lease
	// calls per second of both.
	RSSPerSessionKB    float64  `json:"rss_per_session_kb"`
	OwnerRSSKB         int64    `json:"owner_rss_kb"`
	RenewCPUPct        float64  `json:"renew_cpu_pct"`
	StandbyCPUPct      float64  `json:"standby_cpu_pct"`
	SteadyStoreOpsPerS float64  `json:"steady_store_ops_per_s"`
	RenewIntervalS     float64  `json:"renew_interval_s"`
	Pass               bool     `json:"pass"`
	Problems           []string `json:"problems,omitempty"`

	fault             time.Time
	seqStart          int
	oldVersions       map[string]int64
	successorInstance string
}

// ScaleReport is the whole scale run.
type ScaleReport struct {
	Store    string `json:"store"`
	Broker   string `json:"broker"`
	Sessions int    `json:"sessions"`
	// Config is one session's part of the configuration (every session
	// repeats it with its own index).
	Config string `json:"config"`
	// Single is the one-session run the herd is compared with.
	Single    []ScaleResult `json:"single,omitempty"`
	Scenarios []ScaleResult `json:"scenarios"`
	// LoadAvg is /proc/loadavg when the run ended: figures measured on a
	// busy host are inflated.
	LoadAvg string `json:"loadavg"`
}

// OK reports whether every scenario passed.
func (r *ScaleReport) OK() bool {
	if len(r.Scenarios) == 0 {
		return false
	}
	for _, s := range append(slices.Clone(r.Single), r.Scenarios...) {
		if !s.Pass {
			return false
		}
	}
	return true
}

// scaleSession is one session's part of the configuration; {{I}} is the
// session's index, the rest as in Config.
const scaleSession = `  - id: s{{I}}
    session_mode: exclusive
    brokers: ["{{BROKER}}"]
    client_id: scale-{{NONCE}}-{{I}}
    session_expiry_interval: 1h
    keep_alive: 5s
    connect_timeout: 2s
    reconcile_timeout: 2s
    unmatched_grace: 2s
    receive_maximum: 100
`

const scaleReceiver = `  - {id: r{{I}}, session: s{{I}}, topics: [{filter: "in/{{NONCE}}/{{I}}/#", qos: 1}]}
`

const scaleRoute = `  - id: route{{I}}
    receiver: r{{I}}
    senders: [sink]
    max_in_flight: 100
    rewrite: {strip_prefix: "in/", add_prefix: "out/"}
    lease_ttl: {{TTL}}
    step_down_grace: 1s
    broker_health_step_down: 20s
    failover_slo: 120s
`

type scaleRendering struct {
	bridgeID, instance, http, dir, store, broker, sink, nonce string
	sessions                                                  int
	ttl                                                       time.Duration
}

func (r scaleRendering) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "bridge:\n  id: %s\n  instance_id: %s\n  shutdown_timeout: 10s\n  http: {listen: %q}\n  dead_letter: {path: %q}\nstores:\n  lease: %s\n",
		r.bridgeID, r.instance, r.http, r.dir+"/dead-letter-"+r.bridgeID+".jsonl", r.store)
	rep := func(tmpl string, i int) string {
		return strings.NewReplacer("{{I}}", fmt.Sprintf("%04d", i), "{{BROKER}}", r.broker, "{{NONCE}}", r.nonce, "{{TTL}}", r.ttl.String()).Replace(tmpl)
	}
	b.WriteString("sessions:\n")
	for i := range r.sessions {
		b.WriteString(rep(scaleSession, i))
	}
	b.WriteString("receivers:\n")
	for i := range r.sessions {
		b.WriteString(rep(scaleReceiver, i))
	}
	fmt.Fprintf(&b, "senders:\n  - id: sink\n    type: mqtt\n    mqtt: {broker: %q, qos: 1, keep_alive: 5s, timeout: 5s}\nroutes:\n", r.sink)
	for i := range r.sessions {
		b.WriteString(rep(scaleRoute, i))
	}
	return b.String()
}

// RunScale runs the scale lab: unless SkipSingle, first with one session
// (the reference), then with Sessions.
func RunScale(ctx context.Context, opts ScaleOptions) (*ScaleReport, error) {
	if opts.Sessions < 1 || opts.Sessions > MaxScaleSessions {
		return nil, fmt.Errorf("sessions %d: must be between 1 and %d", opts.Sessions, MaxScaleSessions)
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if opts.Store == "" {
		opts.Store = StoreSQLite
	}
	if opts.Scenarios == nil {
		opts.Scenarios = ScaleScenarios
	}
	for _, sc := range opts.Scenarios {
		if !slices.Contains(ScaleScenarios, sc) {
			return nil, fmt.Errorf("scenario %q: the scale lab runs %s", sc, strings.Join(ScaleScenarios, ", "))
		}
	}
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = 6 * time.Second
	}
	dir := opts.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "myriarch-scale-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	rep := &ScaleReport{Store: opts.Store, Broker: "embedded", Sessions: opts.Sessions}
	defer func() { rep.LoadAvg = loadAvg() }()
	broker := ""
	if opts.Broker == "" {
		blog, err := os.OpenFile(filepath.Join(dir, "broker.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		defer blog.Close()
		br, err := embroker.Start("", slog.New(slog.NewTextHandler(blog, nil)))
		if err != nil {
			return nil, err
		}
		defer br.Close()
		broker = br.Addr
	} else {
		u, err := url.Parse(opts.Broker)
		if err != nil || u.Host == "" || (u.Scheme != "tcp" && u.Scheme != "mqtt") {
			return nil, fmt.Errorf("broker %q: must be tcp://host:port", opts.Broker)
		}
		broker = u.Host
		rep.Broker = opts.Broker
	}
	st, err := startStore(ctx, opts.Store, dir)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	rep.Config = scaleRendering{bridgeID: "scale<N>", instance: "<a|b>", http: "<free port>", dir: "<dir>", store: st.block("<proxy>"),
		broker: "tcp://<proxy to the broker>", sink: "tcp://<broker>", nonce: "<nonce>", sessions: 1, ttl: opts.LeaseTTL}.String()

	var single map[string]ScaleResult
	var singleRSS int64
	if !opts.SkipSingle && opts.Sessions > 1 {
		fmt.Fprintf(opts.Progress, "reference: 1 session\n")
		rs, err := runScaleOnce(ctx, opts, dir, broker, st, 1, nil, 0)
		rep.Single = rs
		if err != nil {
			return rep, fmt.Errorf("one-session reference: %w", err)
		}
		single = map[string]ScaleResult{}
		for _, r := range rs {
			single[r.Scenario] = r
			singleRSS = r.OwnerRSSKB
		}
	}
	fmt.Fprintf(opts.Progress, "%d sessions\n", opts.Sessions)
	rs, err := runScaleOnce(ctx, opts, dir, broker, st, opts.Sessions, single, singleRSS)
	rep.Scenarios = rs
	return rep, err
}

// scaleEnv is one process pair with n sessions.
type scaleEnv struct {
	opts     ScaleOptions
	dir      string
	broker   string
	store    *storeEnv
	render   scaleRendering
	cfg      *config.Config
	n        int
	slots    [2]*slot
	starts   int
	sink     *sink
	ids      []string // lease ids, "<bridge id>/<session id>"
	budget   time.Duration
	renewInt time.Duration

	pubMu     sync.Mutex
	published int
}

func (e *scaleEnv) publishedNow() int { e.pubMu.Lock(); defer e.pubMu.Unlock(); return e.published }

func runScaleOnce(ctx context.Context, opts ScaleOptions, dir, broker string, st *storeEnv, n int, single map[string]ScaleResult, singleRSS int64) ([]ScaleResult, error) {
	nonce := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	e := &scaleEnv{opts: opts, dir: dir, broker: broker, store: st, n: n, sink: newSink(nonce)}
	brokerURL := "tcp://" + broker
	e.render = scaleRendering{bridgeID: fmt.Sprintf("scale%d", n), instance: "a", http: "127.0.0.1:1", dir: dir, store: st.block("127.0.0.1:1"),
		broker: brokerURL, sink: brokerURL, nonce: nonce, sessions: n, ttl: opts.LeaseTTL}
	var err error
	e.cfg, err = config.Parse("scale.yaml", []byte(e.render.String()))
	if err != nil {
		return nil, fmt.Errorf("scale configuration: %w", err)
	}
	if len(e.cfg.Exclusive) != n {
		return nil, fmt.Errorf("scale configuration: %d exclusive sessions admitted, want %d", len(e.cfg.Exclusive), n)
	}
	a := e.cfg.Exclusive[0].Assessment
	e.budget, e.renewInt = a.OwnerDeath.Total, a.Cadence.RenewInterval
	for _, s := range e.cfg.Sessions {
		e.ids = append(e.ids, e.render.bridgeID+"/"+s.ID)
	}

	sk, err := embroker.Connect(ctx, brokerURL, "scale-sink-"+nonce, true, e.sink.receive)
	if err != nil {
		return nil, fmt.Errorf("sink: %w", err)
	}
	defer sk.Close()
	if err := sk.Subscribe(ctx, "out/"+nonce+"/#", 1); err != nil {
		return nil, fmt.Errorf("sink: %w", err)
	}
	defer func() {
		for _, s := range e.slots {
			if s != nil {
				s.close()
			}
		}
	}()
	startLimit := 60*time.Second + time.Duration(n)*100*time.Millisecond
	for i, name := range []string{"a", "b"} {
		e.slots[i] = &slot{name: name}
		if err := e.start(e.slots[i]); err != nil {
			return nil, err
		}
		want := "owner/full"
		if i == 1 {
			want = "standby/none"
		}
		if err := e.waitAll(ctx, e.slots[i].p, want, startLimit); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(opts.Progress, "  a owns %d sessions, b stands by\n", n)

	// Steady state, no messages.
	idle := opts.IdleWindow
	if idle == 0 {
		idle = max(5*time.Second, 2*e.renewInt)
	}
	steady, err := e.measureSteady(ctx, idle, singleRSS)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(opts.Progress, "  steady: owner rss %d kB (%.1f kB/session), owner cpu %.2f%%, standby cpu %.2f%%, %.1f lease calls/s\n",
		steady.OwnerRSSKB, steady.RSSPerSessionKB, steady.RenewCPUPct, steady.StandbyCPUPct, steady.SteadyStoreOpsPerS)

	rate := opts.Rate
	if rate <= 0 {
		// At least 20 msg/s, so that even a one-session round's few
		// seconds carry messages to judge.
		rate = max(20, min(2*n, 1000))
	}
	pub, err := embroker.Connect(ctx, brokerURL, "scale-publisher-"+nonce, true, nil)
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	defer pub.Close()
	pctx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan error, 1)
	go func() { pubDone <- e.publish(pctx, pub, nonce, rate) }()
	stopPublisher := sync.OnceValue(func() error { stopPub(); return <-pubDone })
	defer stopPublisher() //nolint:errcheck // the first call's error is reported below
	select {
	case <-time.After(time.Second):
	case err := <-pubDone:
		stopPub()
		return nil, fmt.Errorf("publisher: %w", err)
	}
	fmt.Fprintf(opts.Progress, "  publishing %d msg/s over %d sessions\n", rate, n)

	var out []ScaleResult
	var roundErr error
	for _, sc := range opts.Scenarios {
		r, err := e.round(ctx, sc)
		if err != nil {
			roundErr = fmt.Errorf("%d sessions, %s: %w (logs in %s)", n, sc, err, dir)
			break
		}
		r.RSSPerSessionKB, r.OwnerRSSKB, r.RenewCPUPct, r.StandbyCPUPct, r.SteadyStoreOpsPerS, r.RenewIntervalS =
			steady.RSSPerSessionKB, steady.OwnerRSSKB, steady.RenewCPUPct, steady.StandbyCPUPct, steady.SteadyStoreOpsPerS, e.renewInt.Seconds()
		if s, ok := single[sc]; ok {
			r.SingleSessionFullS = s.AllFullS
			if s.AllFullS > 0 {
				r.HerdRatio = r.AllFullS / s.AllFullS
			}
		} else if n == 1 {
			r.SingleSessionFullS = r.AllFullS
			r.HerdRatio = 1
		}
		out = append(out, *r)
	}
	if err := stopPublisher(); err != nil && roundErr == nil {
		roundErr = fmt.Errorf("publisher: %w", err)
	}
	e.sink.settle(ctx, e.publishedNow())
	e.judge(out)
	return out, roundErr
}

// start (re)starts a slot's process behind a fresh broker proxy (and a
// store proxy for a server store), as the failover lab does.
func (e *scaleEnv) start(s *slot) error {
	s.close()
	var err error
	if s.brokerPx, err = faultnet.Listen(faultnet.Options{}, e.broker); err != nil {
		return err
	}
	storeAddr := ""
	if e.store.Partitionable() {
		if s.storePx, err = faultnet.Listen(faultnet.Options{}, e.store.target); err != nil {
			return err
		}
		storeAddr = s.storePx.Addr()
	}
	e.starts++
	r := e.render
	r.instance, r.http, r.store, r.broker = s.name, "127.0.0.1:0", e.store.block(storeAddr), "tcp://"+s.brokerPx.Addr()
	cfgPath := filepath.Join(e.dir, fmt.Sprintf("%s-%s.yaml", r.bridgeID, s.name))
	if err := os.WriteFile(cfgPath, []byte(r.String()), 0o644); err != nil {
		return err
	}
	p, err := startProc(s.name, filepath.Join(e.dir, fmt.Sprintf("%s-%s.log", r.bridgeID, s.name)), e.starts, e.opts.Command("run", "-c", cfgPath))
	if err != nil {
		return err
	}
	s.p = p
	return nil
}

// sessionState is one session in /status.
type sessionState struct {
	ID           string    `json:"id"`
	Role         string    `json:"role"`
	ServiceLevel string    `json:"service_level"`
	LeaseVersion int64     `json:"lease_version"`
	Since        time.Time `json:"service_level_since"`
}

// sessions is every session of the process's /status; nil when
// unreachable.
func (p *proc) sessions() []sessionState {
	addr := p.httpAddr()
	if addr == "" {
		return nil
	}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/status")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var st struct {
		Sessions []sessionState `json:"sessions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil
	}
	return st.Sessions
}

// count is how many of ss are in state want (role/service_level).
func count(ss []sessionState, want string) int {
	c := 0
	for _, s := range ss {
		if s.Role+"/"+s.ServiceLevel == want {
			c++
		}
	}
	return c
}

func (e *scaleEnv) waitAll(ctx context.Context, p *proc, want string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	got := 0
	for {
		got = count(p.sessions(), want)
		if got == e.n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d of %d sessions at %s after %v", p.name, got, e.n, want, limit)
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited (code %d) with %d of %d sessions at %s", p.name, p.code, got, e.n, want)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// leaseCalls is the process's lease calls so far (acquire attempts and
// renewals, every outcome) from its /metrics; -1 when unreachable.
func (p *proc) leaseCalls() int64 {
	addr := p.httpAddr()
	if addr == "" {
		return -1
	}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	return sumMetric(string(b), lease.MetricAcquireAttempts) + sumMetric(string(b), lease.MetricRenewSeconds+"_count")
}

// sumMetric adds every sample of the metric name in a Prometheus text
// exposition.
func sumMetric(text, name string) int64 {
	var sum float64
	for line := range strings.Lines(text) {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			sum += v
		}
	}
	return int64(math.Round(sum))
}

// procStat is a process's CPU time so far and its resident memory, from
// /proc.
type procStat struct {
	cpu      time.Duration
	rss, hwm int64 // kB
}

func readProcStat(pid int) (procStat, error) {
	var ps procStat
	// The sum of the threads' run time (nanoseconds), finer than the
	// 10ms ticks of /proc/<pid>/stat.
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return ps, fmt.Errorf("process %d: no /proc/%d/task/*/schedstat", pid, pid)
	}
	for _, t := range tasks {
		raw, err := os.ReadFile(t)
		if err != nil {
			continue // a thread that ended
		}
		if f := strings.Fields(string(raw)); len(f) > 0 {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			ps.cpu += time.Duration(n)
		}
	}
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ps, err
	}
	for line := range strings.Lines(string(s)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			ps.rss = n
		case "VmHWM":
			ps.hwm = n
		}
	}
	return ps, nil
}

// measureSteady measures the pair with no messages flowing for window.
func (e *scaleEnv) measureSteady(ctx context.Context, window time.Duration, singleRSS int64) (ScaleResult, error) {
	var r ScaleResult
	owner, standby := e.slots[0].p, e.slots[1].p
	oc0, sc0 := owner.leaseCalls(), standby.leaseCalls()
	o0, err := readProcStat(owner.cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	s0, err := readProcStat(standby.cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return r, ctx.Err()
	case <-time.After(window):
	}
	o1, err := readProcStat(owner.cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	s1, err := readProcStat(standby.cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	el := time.Since(t0)
	oc1, sc1 := owner.leaseCalls(), standby.leaseCalls()
	r.RenewCPUPct = 100 * (o1.cpu - o0.cpu).Seconds() / el.Seconds()
	r.StandbyCPUPct = 100 * (s1.cpu - s0.cpu).Seconds() / el.Seconds()
	if oc0 >= 0 && oc1 >= 0 && sc0 >= 0 && sc1 >= 0 {
		r.SteadyStoreOpsPerS = float64(oc1-oc0+sc1-sc0) / el.Seconds()
	}
	r.OwnerRSSKB = o1.rss
	switch {
	case singleRSS > 0 && e.n > 1:
		r.RSSPerSessionKB = float64(o1.rss-singleRSS) / float64(e.n-1)
	default:
		r.RSSPerSessionKB = float64(o1.rss) / float64(e.n)
	}
	return r, nil
}

// roles finds the process that owns every session at full service and
// the one that stands by for every session.
func (e *scaleEnv) roles() (owner, standby *slot, ok bool) {
	a, b := e.slots[0], e.slots[1]
	sa, sb := a.p.sessions(), b.p.sessions()
	switch {
	case count(sa, "owner/full") == e.n && count(sb, "standby/none") == e.n:
		return a, b, true
	case count(sb, "owner/full") == e.n && count(sa, "standby/none") == e.n:
		return b, a, true
	}
	return nil, nil, false
}

func (e *scaleEnv) stabilize(ctx context.Context) (owner, standby *slot, err error) {
	limit := 90*time.Second + time.Duration(e.n)*100*time.Millisecond
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if o, s, ok := e.roles(); ok {
			return o, s, nil
		}
		for _, s := range e.slots {
			if !s.p.alive() {
				if err := e.start(s); err != nil {
					return nil, nil, err
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	a, b := e.slots[0].p.sessions(), e.slots[1].p.sessions()
	return nil, nil, fmt.Errorf("no instance owning all %d sessions with the other standing by within %v (a: %d owner/full, %d standby; b: %d owner/full, %d standby)",
		e.n, limit, count(a, "owner/full"), count(a, "standby/none"), count(b, "owner/full"), count(b, "standby/none"))
}

func (e *scaleEnv) round(ctx context.Context, sc string) (*ScaleResult, error) {
	owner, standby, err := e.stabilize(ctx)
	if err != nil {
		return nil, err
	}
	res := &ScaleResult{Scenario: sc, Sessions: e.n, BudgetS: e.budget.Seconds(), oldVersions: map[string]int64{}, successorInstance: standby.name,
		DuplicateBound: e.n * min(e.cfg.Sessions[0].ReceiveMaximum, e.cfg.Routes[0].MaxInFlight)}
	for _, s := range owner.p.sessions() {
		res.oldVersions[s.ID] = s.LeaseVersion
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Second):
	}
	res.seqStart = e.publishedNow()
	calls0 := standby.p.leaseCalls()
	conns0 := standby.brokerPx.Accepted()
	res.fault = time.Now()
	switch sc {
	case OwnerSIGKILL:
		_ = owner.p.cmd.Process.Signal(syscall.SIGKILL)
	case OwnerPlannedStop:
		_ = owner.p.cmd.Process.Signal(syscall.SIGTERM)
	}
	fmt.Fprintf(e.opts.Progress, "  %s on %s (%d sessions)\n", sc, owner.name, e.n)
	limit := e.budget + 30*time.Second
	var allFull time.Time
	var last []sessionState
	for allFull.IsZero() {
		last = standby.p.sessions()
		if count(last, "owner/full") == e.n {
			allFull = time.Now()
			break
		}
		if !standby.p.alive() {
			res.Problems = append(res.Problems, fmt.Sprintf("the successor %s exited (code %d)", standby.name, standby.p.code))
			break
		}
		if time.Since(res.fault) > limit {
			res.Problems = append(res.Problems, fmt.Sprintf("%d of %d sessions at full service %v after the fault", count(last, "owner/full"), e.n, limit))
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	herd := time.Since(res.fault)
	if !allFull.IsZero() {
		res.AllFullS = allFull.Sub(res.fault).Seconds()
		herd = allFull.Sub(res.fault)
	}
	res.BrokerConnectAttempts = standby.brokerPx.Accepted() - conns0
	if c1 := standby.p.leaseCalls(); c1 >= 0 && calls0 >= 0 {
		res.HerdStoreOps = c1 - calls0
		res.HerdStoreOpsPerS = float64(res.HerdStoreOps) / herd.Seconds()
	}
	if ps, err := readProcStat(standby.p.cmd.Process.Pid); err == nil {
		res.PeakRSSKB = ps.hwm
	}
	var full []float64
	for _, s := range last {
		if s.Role != "owner" || s.ServiceLevel != "full" {
			continue
		}
		d := s.Since.Sub(res.fault).Seconds()
		full = append(full, d)
		if d <= res.BudgetS {
			res.SessionsWithinBudget++
		}
		if s.LeaseVersion > res.oldVersions[s.ID] {
			res.LeasesMoved++
		}
	}
	if len(full) > 0 {
		slices.Sort(full)
		res.MinFailureToFullS, res.P50FailureToFullS, res.MaxFailureToFullS = full[0], full[len(full)/2], full[len(full)-1]
	}
	fmt.Fprintf(e.opts.Progress, "  %d/%d within budget %.1fs; all full %.3fs (per session %.3f–%.3fs, p50 %.3fs); %d broker connections, %d lease calls (%.0f/s); peak rss %d kB\n",
		res.SessionsWithinBudget, e.n, res.BudgetS, res.AllFullS, res.MinFailureToFullS, res.MaxFailureToFullS, res.P50FailureToFullS,
		res.BrokerConnectAttempts, res.HerdStoreOps, res.HerdStoreOpsPerS, res.PeakRSSKB)

	// Let the successor's deliveries and the old owner's exit show, then
	// bring it back as the standby.
	time.Sleep(1500 * time.Millisecond)
	select {
	case <-owner.p.exited:
	case <-time.After(15 * time.Second):
		res.Problems = append(res.Problems, fmt.Sprintf("the owner did not exit within 15s of %s", sc))
	}
	if sc == OwnerPlannedStop && owner.p.code != 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("planned stop: the owner exited %d, want 0", owner.p.code))
	}
	if err := e.start(owner); err != nil {
		return nil, err
	}
	return res, nil
}

func (e *scaleEnv) publish(ctx context.Context, pub *embroker.Client, nonce string, rate int) error {
	t := time.NewTicker(time.Second / time.Duration(rate))
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		seq := e.publishedNow()
		topic := fmt.Sprintf("in/%s/%04d/m", nonce, i%e.n)
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := pub.Publish(pctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(nonce + "/" + strconv.Itoa(seq))})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		e.pubMu.Lock()
		e.published++
		e.pubMu.Unlock()
	}
}

// judge attributes messages to rounds (by publish sequence; the first
// round also owns what came before it, the last what came after) and
// checks loss, duplicates, stale and unstamped deliveries per session.
func (e *scaleEnv) judge(rs []ScaleResult) {
	if len(rs) == 0 {
		return
	}
	published := e.publishedNow()
	ds := e.sink.deliveries()
	seen := map[int]int{}
	for _, d := range ds {
		seen[d.Seq]++
	}
	for i := range rs {
		from, to := rs[i].seqStart, published
		if i == 0 {
			from = 0
		}
		if i+1 < len(rs) {
			to = rs[i+1].seqStart
		}
		r := &rs[i]
		for q := from; q < to; q++ {
			r.Published++
			r.Delivered += seen[q]
			if seen[q] == 0 {
				r.Lost++
			} else {
				r.Duplicates += seen[q] - 1
			}
		}
	}
	maxV := map[string]int64{}
	for _, d := range ds {
		i := len(rs) - 1
		for i > 0 && d.At.Before(rs[i].fault) {
			i--
		}
		r := &rs[i]
		switch {
		case d.Version == 0:
			r.Unstamped++
		case d.Version < maxV[d.Session]:
			r.StaleDeliveries++
		}
		maxV[d.Session] = max(maxV[d.Session], d.Version)
	}
	for i := range rs {
		r := &rs[i]
		if r.Lost > 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("%d lost", r.Lost))
		}
		if r.Published == 0 {
			r.Problems = append(r.Problems, "nothing published")
		}
		if r.Duplicates > r.DuplicateBound {
			r.Problems = append(r.Problems, fmt.Sprintf("%d duplicates, more than the in-flight windows %d", r.Duplicates, r.DuplicateBound))
		}
		if r.StaleDeliveries > 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("%d deliveries from a stale owner", r.StaleDeliveries))
		}
		if r.Unstamped > 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("%d deliveries without the %s stamp", r.Unstamped, PropLeaseVersion))
		}
		if r.SessionsWithinBudget != r.Sessions {
			r.Problems = append(r.Problems, fmt.Sprintf("%d of %d sessions at full service within the budget %.1fs", r.SessionsWithinBudget, r.Sessions, r.BudgetS))
		}
		if r.LeasesMoved != r.Sessions {
			r.Problems = append(r.Problems, fmt.Sprintf("%d of %d leases moved to the successor with a higher version", r.LeasesMoved, r.Sessions))
		}
		r.Pass = len(r.Problems) == 0
	}
}

// loadAvg is the first three fields of /proc/loadavg, "" elsewhere.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
