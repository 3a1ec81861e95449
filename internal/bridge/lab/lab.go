// Package lab measures failover the way the spec's "Measuring it" asks,
// and looks for the failure it exists to rule out: two owners acting at
// once. A broker (embedded, or an external one such as mosquitto), a lease
// store (sqlite, PostgreSQL or etcd, each real), two bridge processes that
// reach the broker and the store through TCP proxies of their own, a
// steady QoS 1 publisher and a sink. Each round injects one fault into the
// owner (or, for owner_broker_unreachable, into the standby that will win)
// and reports, from outside the processes:
//
//   - fault → first delivery by the successor (the first message stamped
//     with a higher lease version) and fault → full service (polling
//     /status);
//   - published, delivered, lost (must be 0) and duplicates (must be at most
//     the in-flight window the config allows: min(receive_maximum,
//     max_in_flight) per fault);
//   - deliveries from a stale owner after the successor's first (must be 0),
//     judged by the lease version stamped in each message;
//   - whether two owners were ever observed: a stale delivery, or a lease
//     store history (polled by the lab) in which a version goes back or
//     names two holders;
//   - for owner_sigstop, whether the resumed owner reconnected to the source
//     broker (its broker proxy counts connections);
//   - for owner_planned_stop (SIGTERM: the owner settles what it holds,
//     then releases its lease), the gap between the old owner's last
//     delivery and the successor's first, split into the handover (old
//     owner's last delivery → the successor's grant) and the successor's
//     activation (grant → its first delivery). The handover must stay
//     within PlannedStopHandover: the standby learns of the release at
//     once instead of at its next poll.
//
// With Runs set, rounds pick their scenario and timing from a seeded
// random source, and the report ends with one summary.
package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
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
)

// Scenarios.
const (
	OwnerSIGKILL             = "owner_sigkill"
	OwnerBrokerPathBlackhole = "owner_broker_path_blackhole"
	OwnerSIGSTOP             = "owner_sigstop"
	OwnerStorePartition      = "owner_store_partition"
	OwnerBrokerUnreachable   = "owner_broker_unreachable"
	OwnerPlannedStop         = "owner_planned_stop"
)

// AllScenarios in the order a full run injects them.
var AllScenarios = []string{OwnerSIGKILL, OwnerBrokerPathBlackhole, OwnerSIGSTOP, OwnerStorePartition, OwnerBrokerUnreachable, OwnerPlannedStop}

// PlannedStopHandover is the most owner_planned_stop allows between the
// old owner's last delivery and the successor's lease grant: settling
// what was in flight, the release, the store's wake-up of the standby and
// its acquire. The successor's activation (grant → first delivery: connect,
// resume the broker session, reconcile subscriptions) comes on top; it is
// the same on every path to ownership and is reported, not bounded here.
const PlannedStopHandover = 500 * time.Millisecond

// DemoScenarios are what `make demo` runs: the two original ones.
var DemoScenarios = []string{OwnerSIGKILL, OwnerBrokerPathBlackhole}

// StepDownExit is the exit status of `myriarch-bridge run` after a
// broker-path step-down: restart me, I rejoin as a standby.
const StepDownExit = 3

// historyEvery is how often the lab polls the lease row.
const historyEvery = 25 * time.Millisecond

// transitAllowance is what the lab allows between a stale owner's last
// send before its local deadline and the sink's receipt of it.
const transitAllowance = 250 * time.Millisecond

// Options configure a lab run.
type Options struct {
	// Command starts one bridge process with the given arguments
	// (e.g. "run", "-c", file).
	Command func(args ...string) *exec.Cmd
	// Rate is the publisher's messages per second.
	Rate int
	// Dir keeps the configs and logs; "" uses a temporary directory that
	// is removed afterwards.
	Dir string
	// Progress receives one line per step; nil discards.
	Progress io.Writer
	// Store is the lease store: sqlite (default), postgres or etcd.
	Store string
	// Broker is an external broker URL (tcp://host:port); "" starts the
	// embedded one.
	Broker string
	// Scenarios to run, in order; nil means DemoScenarios. A scenario the
	// store cannot produce (owner_store_partition on sqlite) is skipped
	// and listed in Report.Skipped.
	Scenarios []string
	// Runs > 0 runs that many rounds, each a scenario drawn from
	// Scenarios with a random pre-fault delay, from Seed.
	Runs int
	Seed int64
	// QueueLimit, when positive, is declared as the session's
	// broker_max_queued_messages together with Rate as the route's
	// peak_message_rate, and the configuration is admitted with them.
	// A refusal is reported; the bridges then run without the declaration
	// so that the loss it predicts can be seen.
	QueueLimit int
	// Plan, when set, is the exact list of rounds (scenario, timing), and
	// may name ExtraScenarios; Scenarios and Runs are then ignored.
	Plan []Planned
}

// Result is one round.
type Result struct {
	Round    int     `json:"round"`
	Scenario string  `json:"scenario"`
	BudgetS  float64 `json:"budget_s"`
	// FaultToFirstDeliveryS: fault → the sink's first message stamped
	// with a lease version above the faulted owner's.
	FaultToFirstDeliveryS float64 `json:"fault_to_first_delivery_s"`
	// FailureToFullS: fault → the successor reports full service.
	FailureToFullS float64 `json:"failure_to_full_s"`
	// AcquireToFullS (owner_broker_unreachable): the unreachable
	// instance's grant → the other instance's full service, the span the
	// broker-path budget bounds.
	AcquireToFullS    float64 `json:"acquire_to_full_s,omitempty"`
	MessagesPublished int     `json:"messages_published"`
	MessagesDelivered int     `json:"messages_delivered"`
	Lost              int     `json:"lost"`
	Duplicates        int     `json:"duplicates"`
	// DuplicateBound is min(receive_maximum, max_in_flight): the most
	// messages an owner can hold unacknowledged at the source when it
	// fails, each of which may be delivered again by the successor.
	DuplicateBound int `json:"duplicate_bound"`
	// StaleDeliveries are deliveries stamped with a lower lease version
	// than one the sink had already received.
	StaleDeliveries int `json:"stale_deliveries"`
	// Unstamped deliveries carry no lease version.
	Unstamped int `json:"unstamped"`
	// OldOwnerLastDeliveryS: fault → the last delivery stamped with the
	// faulted owner's version; at most lease_ttl (its local deadline)
	// plus a transit allowance once a newer version was granted. Absent
	// when it delivered nothing after the fault.
	OldOwnerLastDeliveryS *float64 `json:"old_owner_last_delivery_s,omitempty"`
	// HandoverGapS (owner_planned_stop): the old owner's last delivery →
	// the successor's first delivery, as the sink received them (by
	// stamped lease version). It is HandoverS + ActivationS.
	HandoverGapS *float64 `json:"handover_gap_s,omitempty"`
	// HandoverS: the old owner's last delivery → the successor's grant
	// (the grant's time from the lease row's renew record, written by the
	// successor on the same host). Bounded by PlannedStopHandover.
	HandoverS *float64 `json:"handover_s,omitempty"`
	// ActivationS: the successor's grant → its first delivery.
	ActivationS *float64 `json:"activation_s,omitempty"`
	// ReleasedS: the fault → the lab's store poller (every 25ms) saw the
	// old owner's lease released (no owner, same version); absent when it
	// saw the successor's grant first.
	ReleasedS *float64 `json:"released_s,omitempty"`
	// OldOwnerReconnects counts connections the faulted owner opened to
	// the source broker after it was resumed (owner_sigstop).
	OldOwnerReconnects int64 `json:"old_owner_reconnects"`
	// Restarts counts instances the lab restarted during the round after
	// they exited with the step-down status, as an orchestrator would.
	Restarts      int   `json:"restarts"`
	TwoOwners     bool  `json:"two_owners"`
	OldVersion    int64 `json:"old_version"`
	NewVersion    int64 `json:"new_version"`
	OwnerExitCode *int  `json:"owner_exit_code,omitempty"`
	WithinBudget  bool  `json:"within_budget"`
	Pass          bool  `json:"pass"`
	// Problems says why a round did not pass.
	Problems []string `json:"problems,omitempty"`
	// LostIDs lists up to 20 lost sequence numbers.
	LostIDs []int `json:"lost_ids,omitempty"`
	// FaultAtSeq is the publisher's sequence number when the fault hit.
	FaultAtSeq int `json:"fault_at_seq"`

	start, fault time.Time
	seqStart     int
	ttl          time.Duration
}

// Report is the whole run.
type Report struct {
	Config string `json:"config"`
	Store  string `json:"store"`
	Broker string `json:"broker"`
	Seed   int64  `json:"seed,omitempty"`
	// Admission is "admitted", or the refusal of the configuration with
	// the declared peak rate and broker queue limit.
	Admission string   `json:"admission"`
	Skipped   []string `json:"skipped,omitempty"`
	Scenarios []Result `json:"scenarios"`
	// StoreAnomalies are lease-store transitions that would mean two
	// owners; StoreHistory counts the transitions the lab saw.
	StoreAnomalies []string `json:"store_anomalies,omitempty"`
	StoreHistory   int      `json:"store_history_transitions"`
	Summary        Summary  `json:"summary"`
}

// Summary folds all rounds.
type Summary struct {
	Rounds          int            `json:"rounds"`
	Passed          int            `json:"passed"`
	Published       int            `json:"published"`
	Delivered       int            `json:"delivered"`
	Lost            int            `json:"lost"`
	Duplicates      int            `json:"duplicates"`
	MaxDuplicates   int            `json:"max_duplicates_per_round"`
	DuplicateBound  int            `json:"duplicate_bound"`
	StaleDeliveries int            `json:"stale_deliveries"`
	Unstamped       int            `json:"unstamped"`
	Reconnects      int64          `json:"old_owner_reconnects"`
	TwoOwners       bool           `json:"two_owners"`
	PerScenario     map[string]Agg `json:"per_scenario"`
}

// Agg is one scenario's timings over its rounds, in seconds.
type Agg struct {
	Rounds       int     `json:"rounds"`
	BudgetS      float64 `json:"budget_s"`
	FirstMaxS    float64 `json:"fault_to_first_delivery_max_s"`
	FullP50S     float64 `json:"failure_to_full_p50_s"`
	FullMaxS     float64 `json:"failure_to_full_max_s"`
	WithinBudget int     `json:"within_budget"`
	// HandoverMaxS and GapMaxS (owner_planned_stop) are the worst
	// HandoverS and HandoverGapS.
	HandoverMaxS float64 `json:"handover_max_s,omitempty"`
	GapMaxS      float64 `json:"handover_gap_max_s,omitempty"`
	full         []float64
}

// Line is the one-line summary of a run.
func (r *Report) Line() string {
	s := r.Summary
	var b strings.Builder
	fmt.Fprintf(&b, "store=%s broker=%s rounds=%d passed=%d published=%d delivered=%d lost=%d duplicates=%d (max %d/round, bound %d) stale=%d unstamped=%d reconnects=%d two_owners=%t",
		r.Store, r.Broker, s.Rounds, s.Passed, s.Published, s.Delivered, s.Lost, s.Duplicates, s.MaxDuplicates, s.DuplicateBound, s.StaleDeliveries, s.Unstamped, s.Reconnects, s.TwoOwners)
	for _, sc := range AllScenarios {
		if a, ok := s.PerScenario[sc]; ok {
			fmt.Fprintf(&b, " | %s n=%d first_max=%.2fs full_p50=%.2fs full_max=%.2fs budget=%.1fs", sc, a.Rounds, a.FirstMaxS, a.FullP50S, a.FullMaxS, a.BudgetS)
			if sc == OwnerPlannedStop {
				fmt.Fprintf(&b, " handover_max=%.3fs gap_max=%.3fs", a.HandoverMaxS, a.GapMaxS)
			}
		}
	}
	return b.String()
}

// OK reports whether every round passed and nothing was skipped silently.
func (r *Report) OK() bool {
	return r.Summary.Rounds > 0 && r.Summary.Passed == r.Summary.Rounds && !r.Summary.TwoOwners
}

// Config is the tight configuration the lab runs (placeholders filled per
// instance): lease_ttl 6s and activation steps of 2s, so that a round takes
// seconds. broker_health_step_down is 6s, not less: its clock also runs
// from the lease win until full service, and on a loaded host (CI, the race
// detector) one activation with a retried SUBSCRIBE takes more than 3s.
const Config = `bridge:
  id: lab
  instance_id: {{INSTANCE}}
  shutdown_timeout: 5s
  http: {listen: "{{HTTP}}"}
  dead_letter: {path: "{{DIR}}/dead-letter.jsonl"}
stores:
  lease: {{STORE}}
sessions:
  - id: plant
    session_mode: exclusive
    brokers: ["{{BROKER}}"]
    client_id: lab-plant-{{NONCE}}
    session_expiry_interval: 1h
    keep_alive: 2s
    connect_timeout: 2s
    reconcile_timeout: 2s
    unmatched_grace: 2s
    receive_maximum: 100{{SESSION_QUEUE}}
receivers:
  - {id: telemetry, session: plant, topics: [{filter: "in/{{NONCE}}/#", qos: 1}]}
senders:
  - id: sink
    type: mqtt
    mqtt: {broker: "{{SINK}}", qos: 1, keep_alive: 5s, timeout: 5s}
routes:
  - id: telemetry-to-sink
    receiver: telemetry
    senders: [sink]
    max_in_flight: 100
    rewrite: {strip_prefix: "in/", add_prefix: "out/"}
    lease_ttl: 6s
    step_down_grace: 1s
    broker_health_step_down: 6s
    failover_slo: 60s{{ROUTE_RATE}}
`

// RenderConfig is the lab's configuration for instance a with a sqlite
// store in dir and placeholder broker addresses: what the budgets quoted
// in the docs are computed from.
func RenderConfig(dir string) string {
	return rendering{instance: "a", http: "127.0.0.1:1", dir: dir, store: fmt.Sprintf("{type: sqlite, path: %q}", dir+"/lease.db"),
		broker: "tcp://127.0.0.1:1", sink: "tcp://127.0.0.1:1", nonce: "n"}.String()
}

type rendering struct {
	instance, http, dir, store, broker, sink, nonce string
	rate, queueLimit                                int
}

func (r rendering) String() string {
	sq, rr := "", ""
	if r.queueLimit > 0 {
		sq = fmt.Sprintf("\n    broker_max_queued_messages: %d", r.queueLimit)
		rr = fmt.Sprintf("\n    peak_message_rate: %d", r.rate)
	}
	return strings.NewReplacer("{{INSTANCE}}", r.instance, "{{HTTP}}", r.http, "{{DIR}}", r.dir, "{{STORE}}", r.store,
		"{{BROKER}}", r.broker, "{{SINK}}", r.sink, "{{NONCE}}", r.nonce, "{{SESSION_QUEUE}}", sq, "{{ROUTE_RATE}}", rr).Replace(Config)
}

type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	code   int

	// The process listens on port 0 and logs the address it bound; it is
	// read from its log (this start's part, from logFrom) on first use.
	logPath string
	logFrom int64
	mu      sync.Mutex
	http    string
}

// httpAddr is the address of the process's HTTP listener, "" while it has
// not logged it yet.
func (p *proc) httpAddr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.http != "" {
		return p.http
	}
	f, err := os.Open(p.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, p.logFrom, 1<<30))
	if err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	p.http = listenAddrFromLog(string(b))
	return p.http
}

// listenAddrFromLog finds the address in the bridge's log line
// "serving /live /ready /status /metrics" (text or JSON format).
func listenAddrFromLog(log string) string {
	for line := range strings.Lines(log) {
		// A line still being written has no newline yet.
		if !strings.Contains(line, "serving /live") || !strings.HasSuffix(line, "\n") {
			continue
		}
		var rec struct{ Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Addr != "" {
			return rec.Addr
		}
		for f := range strings.FieldsSeq(line) {
			if a, ok := strings.CutPrefix(f, "addr="); ok {
				return a
			}
		}
	}
	return ""
}

// slot is one of the two instances, restarted in place after a fault.
type slot struct {
	name     string
	p        *proc
	brokerPx *faultnet.Proxy
	storePx  *faultnet.Proxy
}

type env struct {
	opts   Options
	dir    string
	broker string // host:port
	store  *storeEnv
	sink   *sink
	hist   *history
	nonce  string
	render rendering
	cfg    *config.Config
	slots  [2]*slot
	starts int
	extra  extraFaults

	// faultMu guards brokerLag and the slots' processes and broker
	// proxies, which start replaces, against the timers of the
	// slow-path and starvation faults.
	faultMu   sync.Mutex
	brokerLag time.Duration

	pubMu     sync.Mutex
	published int
}

func (e *env) publishedNow() int { e.pubMu.Lock(); defer e.pubMu.Unlock(); return e.published }

// Run runs the lab.
func Run(ctx context.Context, opts Options) (*Report, error) {
	if opts.Rate <= 0 {
		opts.Rate = 200
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if opts.Store == "" {
		opts.Store = StoreSQLite
	}
	if opts.Scenarios == nil {
		opts.Scenarios = DemoScenarios
	}
	for _, sc := range append(slices.Clone(opts.Scenarios), planScenarios(opts.Plan)...) {
		if !slices.Contains(AllScenarios, sc) && !slices.Contains(ExtraScenarios, sc) {
			return nil, fmt.Errorf("scenario %q: must be one of %s", sc, strings.Join(AllScenarios, ", "))
		}
	}
	dir := opts.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "myriarch-lab-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	e := &env{opts: opts, dir: dir, nonce: strconv.FormatInt(time.Now().UnixNano()%1e9, 36), sink: nil, hist: &history{}}
	e.sink = newSink(e.nonce)
	defer e.extra.stop()
	rep := &Report{Store: opts.Store, Broker: "embedded", Seed: opts.Seed}

	// The broker.
	if opts.Broker == "" {
		// The broker's log goes next to the bridges' logs: takeovers and
		// dropped client connections are half of what explains a round.
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
		e.broker = br.Addr
	} else {
		u, err := url.Parse(opts.Broker)
		if err != nil || u.Host == "" || (u.Scheme != "tcp" && u.Scheme != "mqtt") {
			return nil, fmt.Errorf("broker %q: must be tcp://host:port", opts.Broker)
		}
		e.broker = u.Host
		rep.Broker = opts.Broker
	}
	brokerURL := "tcp://" + e.broker

	// The lease store and its history.
	st, err := startStore(ctx, opts.Store, dir)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	e.store = st
	hctx, stopHist := context.WithCancel(ctx)
	var hwg sync.WaitGroup
	hwg.Go(func() { e.hist.run(hctx, st.reader, historyEvery) })
	defer func() { stopHist(); hwg.Wait() }()

	var scen []string
	for _, sc := range opts.Scenarios {
		if sc == OwnerStorePartition && !st.Partitionable() {
			rep.Skipped = append(rep.Skipped, sc+": a sqlite lease store is a file every process opens directly; there is no path to cut (run it with --store postgres or etcd)")
			continue
		}
		scen = append(scen, sc)
	}
	if len(scen) == 0 && len(opts.Plan) == 0 {
		return rep, errors.New("no scenario this store can run")
	}

	// Admission, with the queue-room declaration when asked for.
	e.render = rendering{instance: "a", http: "127.0.0.1:1", dir: dir, store: st.block("127.0.0.1:1"), broker: brokerURL, sink: brokerURL, nonce: e.nonce, rate: opts.Rate, queueLimit: opts.QueueLimit}
	rep.Admission = "admitted"
	if _, err := config.Parse("lab.yaml", []byte(e.render.String())); err != nil {
		if opts.QueueLimit <= 0 {
			return nil, fmt.Errorf("lab configuration: %w", err)
		}
		rep.Admission = "refused: " + err.Error()
		fmt.Fprintf(opts.Progress, "admission with peak_message_rate %d and broker_max_queued_messages %d: %s\n  running without the declaration to show what it predicts\n", opts.Rate, opts.QueueLimit, rep.Admission)
		e.render.queueLimit = 0
	}
	e.cfg, err = config.Parse("lab.yaml", []byte(e.render.String()))
	if err != nil {
		return nil, fmt.Errorf("lab configuration: %w", err)
	}
	rep.Config = rendering{instance: "<a|b>", http: "<free port>", dir: "<dir>", store: st.block("<proxy>"), broker: "tcp://<proxy to the broker>", sink: "tcp://<broker>", nonce: "<nonce>", rate: e.render.rate, queueLimit: e.render.queueLimit}.String()

	// The sink and the publisher.
	sk, err := embroker.Connect(ctx, brokerURL, "lab-sink-"+e.nonce, true, e.sink.receive)
	if err != nil {
		return nil, fmt.Errorf("sink: %w", err)
	}
	defer sk.Close()
	if err := sk.Subscribe(ctx, "out/"+e.nonce+"/#", 1); err != nil {
		return nil, fmt.Errorf("sink: %w", err)
	}

	defer func() {
		for _, s := range e.slots {
			if s != nil {
				s.close()
			}
		}
	}()
	for i, n := range []string{"a", "b"} {
		e.slots[i] = &slot{name: n}
		if err := e.start(e.slots[i]); err != nil {
			return nil, err
		}
		want := "owner/full"
		if i == 1 {
			want = "standby/none"
		}
		if err := waitState(ctx, e.slots[i].p, want, 60*time.Second); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(opts.Progress, "store %s, broker %s: a owns the session, b stands by; publishing %d msg/s\n", opts.Store, rep.Broker, opts.Rate)

	pub, err := embroker.Connect(ctx, brokerURL, "lab-publisher-"+e.nonce, true, nil)
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	defer pub.Close()
	pctx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan error, 1)
	go func() { pubDone <- e.publish(pctx, pub) }()
	stopPublisher := func() error {
		stopPub()
		return <-pubDone
	}
	select {
	case <-time.After(time.Second):
	case err := <-pubDone:
		stopPub()
		return nil, fmt.Errorf("publisher: %w", err)
	}

	rng := rand.New(rand.NewPCG(uint64(opts.Seed), 0x6d79726961726368))
	n := len(scen)
	if opts.Runs > 0 {
		n = opts.Runs
	}
	if len(opts.Plan) > 0 {
		n = len(opts.Plan)
	}
	var roundErr error
	for i := range n {
		var sc string
		delay := time.Second
		switch {
		case len(opts.Plan) > 0:
			sc, delay = opts.Plan[i].Scenario, opts.Plan[i].Delay
		case opts.Runs > 0:
			sc = scen[rng.IntN(len(scen))]
			delay = 300*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second)))
		default:
			sc = scen[i%len(scen)]
		}
		r, err := e.round(ctx, i, sc, delay)
		if err != nil {
			roundErr = fmt.Errorf("round %d (%s): %w (logs in %s)", i, sc, err, dir)
			break
		}
		rep.Scenarios = append(rep.Scenarios, *r)
	}
	if err := stopPublisher(); err != nil && roundErr == nil {
		roundErr = fmt.Errorf("publisher: %w", err)
	}
	e.sink.settle(ctx, e.publishedNow())
	stopHist()
	hwg.Wait()
	e.judge(rep)
	return rep, roundErr
}

func (e *env) publish(ctx context.Context, pub *embroker.Client) error {
	t := time.NewTicker(time.Second / time.Duration(e.opts.Rate))
	defer t.Stop()
	topic := "in/" + e.nonce + "/1"
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		seq := e.publishedNow()
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := pub.Publish(pctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(e.nonce + "/" + strconv.Itoa(seq))})
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

// settle waits until the sink holds every one of published messages, or
// nothing new arrived for 5s. Both the failover lab and the scale lab end
// their runs with it.
func (s *sink) settle(ctx context.Context, published int) {
	last, lastChange := -1, time.Now()
	for time.Since(lastChange) < 5*time.Second && ctx.Err() == nil {
		n, uniq := s.counts()
		if uniq >= published {
			// Give late duplicates and stale deliveries a moment to show.
			time.Sleep(500 * time.Millisecond)
			return
		}
		if n != last {
			last, lastChange = n, time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// start (re)starts a slot's process behind fresh proxies.
func (e *env) start(s *slot) error {
	e.faultMu.Lock()
	s.close()
	px, err := faultnet.Listen(faultnet.Options{}, e.broker)
	if err == nil {
		px.DelayReplies(e.brokerLag)
		s.brokerPx = px
	}
	e.faultMu.Unlock()
	if err != nil {
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
	// Port 0, not a port found free here: the process binds it only after
	// its start-up, and anything else on the machine could take a free
	// port in between. The process logs the one it bound.
	r.instance, r.http, r.store, r.broker = s.name, "127.0.0.1:0", e.store.block(storeAddr), "tcp://"+s.brokerPx.Addr()
	cfgPath := filepath.Join(e.dir, s.name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(r.String()), 0o644); err != nil {
		return err
	}
	p, err := startProc(s.name, filepath.Join(e.dir, s.name+".log"), e.starts, e.opts.Command("run", "-c", cfgPath))
	if err != nil {
		return err
	}
	e.faultMu.Lock()
	s.p = p
	e.faultMu.Unlock()
	return nil
}

// close kills the slot's process (resuming it first if it was stopped)
// and closes its proxies.
func (s *slot) close() {
	if s.p != nil {
		select {
		case <-s.p.exited:
		default:
			_ = s.p.cmd.Process.Kill()
			_ = s.p.cmd.Process.Signal(syscall.SIGCONT)
			<-s.p.exited
		}
	}
	if s.brokerPx != nil {
		_ = s.brokerPx.Close()
		s.brokerPx = nil
	}
	if s.storePx != nil {
		_ = s.storePx.Close()
		s.storePx = nil
	}
}

// startProc starts cmd (a bridge process) with its output appended to the
// log at logPath, in a process group of its own, and watches its exit.
func startProc(name, logPath string, starts int, cmd *exec.Cmd) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "--- start %d at %s\n", starts, time.Now().Format(time.RFC3339Nano))
	logFrom, err := logf.Seek(0, io.SeekCurrent)
	if err != nil {
		logf.Close()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// A process group of its own: a stopped process in a group that the
	// kernel finds orphaned (the lab run under nohup, say) is sent SIGCONT
	// whenever another member exits, which would end a SIGSTOP early.
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{}), logPath: logf.Name(), logFrom: logFrom}
	go func() {
		_ = cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.code = -int(ws.Signal())
		}
		logf.Close()
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// state is role/service_level from /status, "" when unreachable.
func (p *proc) state() string {
	addr := p.httpAddr()
	if addr == "" {
		return ""
	}
	c := http.Client{Timeout: 500 * time.Millisecond}
	resp, err := c.Get("http://" + addr + "/status")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var st struct {
		Sessions []struct {
			Role         string `json:"role"`
			ServiceLevel string `json:"service_level"`
		} `json:"sessions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || len(st.Sessions) == 0 {
		return ""
	}
	return st.Sessions[0].Role + "/" + st.Sessions[0].ServiceLevel
}

func waitState(ctx context.Context, p *proc, want string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		if p.state() == want {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited (code %d) before reaching %s", p.name, p.code, want)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not reach %s within %v (last %q)", p.name, want, limit, p.state())
		}
	}
}

// roles finds the owner at full service and the standby.
func (e *env) roles() (owner, standby *slot, ok bool) {
	a, b := e.slots[0], e.slots[1]
	sa, sb := a.p.state(), b.p.state()
	switch {
	case sa == "owner/full" && sb == "standby/none":
		return a, b, true
	case sb == "owner/full" && sa == "standby/none":
		return b, a, true
	}
	return nil, nil, false
}

// stabilize restarts what is not an owner or standby until one instance
// serves and the other stands by.
func (e *env) stabilize(ctx context.Context) (owner, standby *slot, err error) {
	deadline := time.Now().Add(90 * time.Second)
	restartAfter := time.Now().Add(20 * time.Second)
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
		if time.Now().After(restartAfter) {
			// Stuck (e.g. an owner that never reaches full service on a
			// runtime without the never-converged clock): start over.
			for _, s := range e.slots {
				if st := s.p.state(); st != "owner/full" && st != "standby/none" {
					fmt.Fprintf(e.opts.Progress, "  %s stuck at %q; restarting it\n", s.name, st)
					if err := e.start(s); err != nil {
						return nil, nil, err
					}
				}
			}
			restartAfter = time.Now().Add(20 * time.Second)
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil, nil, fmt.Errorf("no owner at full service with a standby within 90s (a %q, b %q)", e.slots[0].p.state(), e.slots[1].p.state())
}

func (e *env) round(ctx context.Context, i int, sc string, delay time.Duration) (*Result, error) {
	owner, standby, err := e.stabilize(ctx)
	if err != nil {
		return nil, err
	}
	assess := e.cfg.Exclusive[0].Assessment
	sess := e.cfg.Sessions[0]
	res := &Result{Round: i, Scenario: sc, start: time.Now(), seqStart: e.publishedNow(), ttl: e.cfg.Exclusive[0].Assessment.Cadence.LeaseTTL,
		DuplicateBound: min(sess.ReceiveMaximum, e.cfg.Routes[0].MaxInFlight)}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(delay):
	}
	cur, err := e.store.reader.Current(ctx, leaseID)
	if err != nil {
		return nil, fmt.Errorf("reading the lease: %w", err)
	}
	res.OldVersion = cur.Version
	successor := standby
	res.BudgetS = assess.OwnerDeath.Total.Seconds()
	res.fault = time.Now()
	res.FaultAtSeq = e.publishedNow()
	faulted := owner.p
	// faultEnds: a fault that lasts (a slow broker path, a starved
	// standby) ends before the next round begins, or it would act on the
	// next round's instances (a starved slot's SIGCONT undid the next
	// round's SIGSTOP of the same instance).
	var faultEnds time.Time
	switch sc {
	case OwnerSIGKILL:
		_ = owner.p.cmd.Process.Signal(syscall.SIGKILL)
	case OwnerSIGSTOP:
		_ = owner.p.cmd.Process.Signal(syscall.SIGSTOP)
	case OwnerStorePartition:
		owner.storePx.Blackhole(true)
	case OwnerBrokerPathBlackhole:
		res.BudgetS = assess.BrokerPath.Total.Seconds()
		owner.brokerPx.Blackhole(true)
	case OwnerBrokerUnreachable:
		// The standby will win the lease and cannot reach the broker; the
		// owner leaves cleanly and comes back as the standby that must
		// end up serving.
		res.BudgetS = assess.BrokerPath.Total.Seconds()
		standby.brokerPx.Refuse(true)
		_ = owner.p.cmd.Process.Signal(syscall.SIGTERM)
		successor = owner
	case OwnerPlannedStop:
		// A rolling upgrade: the orchestrator asks the owner to stop.
		_ = owner.p.cmd.Process.Signal(syscall.SIGTERM)
	default:
		extra, err := e.injectExtra(i, sc, owner, standby)
		if err != nil {
			return nil, err
		}
		res.BudgetS += extra.Seconds()
		faultEnds = res.fault.Add(extra)
	}
	fmt.Fprintf(e.opts.Progress, "round %d %s: fault on %s (lease version %d)\n", i, sc, owner.name, res.OldVersion)

	if sc == OwnerBrokerUnreachable {
		select {
		case <-owner.p.exited:
		case <-time.After(30 * time.Second):
			return nil, errors.New("the owner did not exit within 30s of SIGTERM")
		}
		res.OwnerExitCode = &owner.p.code
		// Only after the unreachable standby holds the lease does the old
		// owner come back, or it could win the lease straight back.
		deadline := time.Now().Add(30 * time.Second)
		for {
			if g, ok := e.hist.firstAfter(res.OldVersion); ok && strings.HasPrefix(g.Owner, standby.name+"#") {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%s did not take the lease within 30s of the owner's exit", standby.name)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := e.start(owner); err != nil {
			return nil, err
		}
	}

	limit := time.Duration(res.BudgetS*float64(time.Second)) + 30*time.Second
	var firstAt, fullAt time.Time
	for firstAt.IsZero() || fullAt.IsZero() {
		// Any instance but the faulted process may serve. One that exits
		// with the step-down status is restarted, as its orchestrator
		// would (a loaded host can make an activation outlast
		// broker_health_step_down).
		for _, sl := range e.slots {
			if sl.p == faulted {
				continue
			}
			if !sl.p.alive() {
				if sl.p.code == StepDownExit {
					fmt.Fprintf(e.opts.Progress, "  %s exited after a broker-path step-down; restarting it\n", sl.name)
					if err := e.start(sl); err != nil {
						return nil, err
					}
					res.Restarts++
				}
				continue
			}
			if fullAt.IsZero() && sl.p.state() == "owner/full" {
				fullAt, successor = time.Now(), sl
			}
		}
		if d, ok := e.sink.firstAbove(res.OldVersion); ok && firstAt.IsZero() {
			firstAt = d.At
		}
		if !fullAt.IsZero() && firstAt.IsZero() && e.sink.maxVersion() == 0 && time.Since(fullAt) > 2*time.Second {
			break // unstamped deliveries: no first delivery to tell
		}
		if time.Since(res.fault) > limit {
			res.Problems = append(res.Problems, fmt.Sprintf("the successor %s did not serve within %v (state %q)", successor.name, limit, successor.p.state()))
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	if !fullAt.IsZero() {
		res.FailureToFullS = fullAt.Sub(res.fault).Seconds()
	}
	if !firstAt.IsZero() {
		res.FaultToFirstDeliveryS = firstAt.Sub(res.fault).Seconds()
	}
	res.WithinBudget = !fullAt.IsZero() && res.FailureToFullS <= res.BudgetS
	if sc == OwnerBrokerUnreachable {
		if g, ok := e.hist.firstAfter(res.OldVersion); ok && !fullAt.IsZero() {
			res.AcquireToFullS = fullAt.Sub(g.At).Seconds()
			res.WithinBudget = res.AcquireToFullS <= res.BudgetS
		}
	}
	if cur, err := e.store.reader.Current(ctx, leaseID); err == nil {
		res.NewVersion = cur.Version
	}

	fmt.Fprintf(e.opts.Progress, "  %s at full service %.3fs after the fault (first delivery %.3fs, budget %.3fs)\n", successor.name, res.FailureToFullS, res.FaultToFirstDeliveryS, res.BudgetS)

	// Watch the faulted owner after the successor took over.
	switch sc {
	case OwnerSIGSTOP:
		if wait := time.Until(res.fault.Add(res.ttl + time.Second)); wait > 0 {
			time.Sleep(wait)
		}
		before := owner.brokerPx.Accepted()
		_ = owner.p.cmd.Process.Signal(syscall.SIGCONT)
		// A resumed owner that acts does so at once: its timers fire and
		// its connections report errors on the first read.
		time.Sleep(2 * time.Second)
		res.OldOwnerReconnects = owner.brokerPx.Accepted() - before
	default:
		time.Sleep(1500 * time.Millisecond)
	}
	if sc != OwnerBrokerUnreachable {
		select {
		case <-faulted.exited:
			res.OwnerExitCode = &faulted.code
		default:
		}
	}

	if wait := time.Until(faultEnds); wait > 0 {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait + starveTail + 100*time.Millisecond):
		}
	}

	// Recover: the faulted instance comes back as a standby.
	switch sc {
	case OwnerSIGSTOP:
		// A resumed owner must step down by itself; give it a moment.
		if err := waitState(ctx, owner.p, "standby/none", 10*time.Second); err != nil {
			res.Problems = append(res.Problems, "resumed owner: "+err.Error())
			if err := e.start(owner); err != nil {
				return nil, err
			}
		}
	case OwnerBrokerUnreachable:
		standby.brokerPx.Refuse(false)
	default:
		if err := e.start(owner); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// judge attributes messages and deliveries to rounds and checks them.
func (e *env) judge(rep *Report) {
	published := e.publishedNow()
	ds := e.sink.deliveries()
	seen := map[int]int{}
	for _, d := range ds {
		seen[d.Seq]++
	}
	changes := e.hist.snapshot()
	rep.StoreHistory = len(changes)
	rep.StoreAnomalies = anomalies(changes)
	rs := rep.Scenarios
	roundOfTime := func(t time.Time) int {
		i := len(rs) - 1
		for i > 0 && t.Before(rs[i].start) {
			i--
		}
		return i
	}
	for i := range rs {
		end := published
		if i+1 < len(rs) {
			end = rs[i+1].seqStart
		}
		r := &rs[i]
		r.MessagesPublished = end - r.seqStart
		for q := r.seqStart; q < end; q++ {
			r.MessagesDelivered += seen[q]
			if seen[q] == 0 {
				r.Lost++
				if len(r.LostIDs) < 20 {
					r.LostIDs = append(r.LostIDs, q)
				}
			} else {
				r.Duplicates += seen[q] - 1
			}
		}
	}
	// The first round also owns what was published before it.
	if len(rs) > 0 {
		for q := 0; q < rs[0].seqStart; q++ {
			rs[0].MessagesPublished++
			rs[0].MessagesDelivered += seen[q]
			if seen[q] == 0 {
				rs[0].Lost++
			} else {
				rs[0].Duplicates += seen[q] - 1
			}
		}
	}
	var maxV int64
	for _, d := range ds {
		if len(rs) == 0 {
			break
		}
		r := &rs[roundOfTime(d.At)]
		switch {
		case d.Version == 0:
			r.Unstamped++
		case d.Version < maxV:
			r.StaleDeliveries++
		}
		maxV = max(maxV, d.Version)
		if d.Version != 0 && d.Version == r.OldVersion && d.At.After(r.fault) {
			s := d.At.Sub(r.fault).Seconds()
			r.OldOwnerLastDeliveryS = &s
		}
	}
	checkStamps(rs, ds, changes)
	sum := Summary{Rounds: len(rs), PerScenario: map[string]Agg{}}
	for i := range rs {
		r := &rs[i]
		r.TwoOwners = r.StaleDeliveries > 0
		if r.Lost > 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("%d lost", r.Lost))
		}
		if r.Duplicates > r.DuplicateBound {
			r.Problems = append(r.Problems, fmt.Sprintf("%d duplicates, more than the in-flight window %d", r.Duplicates, r.DuplicateBound))
		}
		if r.StaleDeliveries > 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("%d deliveries from a stale owner", r.StaleDeliveries))
		}
		if r.Unstamped > 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("%d deliveries without the %s stamp: stale owners cannot be told apart", r.Unstamped, PropLeaseVersion))
		}
		if r.OldOwnerReconnects > 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("the resumed owner reconnected to the source broker %d times", r.OldOwnerReconnects))
		}
		if r.Scenario == OwnerPlannedStop {
			e.judgeHandover(r, ds)
		}
		// The deadline binds an owner that was replaced: one whose lease
		// nobody else was granted (a sqlite owner frozen with the write
		// lock) renews it when it resumes, and its deadline moves on.
		if r.OldOwnerLastDeliveryS != nil && r.NewVersion > r.OldVersion && *r.OldOwnerLastDeliveryS > (r.ttl+transitAllowance).Seconds() {
			r.Problems = append(r.Problems, fmt.Sprintf("the faulted owner delivered %.3fs after the fault, past its local deadline (lease_ttl %v + %v transit)", *r.OldOwnerLastDeliveryS, r.ttl, transitAllowance))
		}
		if !r.WithinBudget {
			r.Problems = append(r.Problems, "over budget")
		}
		r.Pass = len(r.Problems) == 0 && len(rep.StoreAnomalies) == 0
		if r.Pass {
			sum.Passed++
		}
		sum.Published += r.MessagesPublished
		sum.Delivered += r.MessagesDelivered
		sum.Lost += r.Lost
		sum.Duplicates += r.Duplicates
		sum.MaxDuplicates = max(sum.MaxDuplicates, r.Duplicates)
		sum.DuplicateBound = r.DuplicateBound
		sum.StaleDeliveries += r.StaleDeliveries
		sum.Unstamped += r.Unstamped
		sum.Reconnects += r.OldOwnerReconnects
		sum.TwoOwners = sum.TwoOwners || r.TwoOwners
		a := sum.PerScenario[r.Scenario]
		a.Rounds++
		a.BudgetS = r.BudgetS
		a.FirstMaxS = max(a.FirstMaxS, r.FaultToFirstDeliveryS)
		a.FullMaxS = max(a.FullMaxS, r.FailureToFullS)
		a.full = append(a.full, r.FailureToFullS)
		if r.WithinBudget {
			a.WithinBudget++
		}
		if r.HandoverS != nil {
			a.HandoverMaxS = max(a.HandoverMaxS, *r.HandoverS)
		}
		if r.HandoverGapS != nil {
			a.GapMaxS = max(a.GapMaxS, *r.HandoverGapS)
		}
		sum.PerScenario[r.Scenario] = a
	}
	for k, a := range sum.PerScenario {
		slices.Sort(a.full)
		a.FullP50S = a.full[len(a.full)/2]
		sum.PerScenario[k] = a
	}
	sum.TwoOwners = sum.TwoOwners || len(rep.StoreAnomalies) > 0
	rep.Summary = sum
}

// judgeHandover measures an owner_planned_stop round from the sink's
// deliveries: the old owner's last delivery (by stamped version), the
// successor's first, and the grant between them as the store poller saw
// it. A planned stop settles what it holds before it releases, so nothing
// may be lost, and the handover must fit PlannedStopHandover.
func (e *env) judgeHandover(r *Result, ds []delivery) {
	var last, first time.Time
	for _, d := range ds {
		if d.Version == r.OldVersion && d.At.After(last) {
			last = d.At
		}
		if d.Version > r.OldVersion && first.IsZero() {
			first = d.At
		}
	}
	switch {
	case last.IsZero():
		r.Problems = append(r.Problems, "no delivery stamped with the old owner's version")
		return
	case first.IsZero():
		r.Problems = append(r.Problems, "no delivery from the successor")
		return
	}
	g, ok := e.hist.firstAfter(r.OldVersion)
	if !ok {
		r.Problems = append(r.Problems, "the lab's store poller saw no grant to the successor")
		return
	}
	if at, ok := e.hist.releasedAt(r.OldVersion); ok {
		s := at.Sub(r.fault).Seconds()
		r.ReleasedS = &s
	}
	grant := g.grantedAt(historyEvery)
	gap, handover, act := first.Sub(last).Seconds(), grant.Sub(last).Seconds(), first.Sub(grant).Seconds()
	r.HandoverGapS, r.HandoverS, r.ActivationS = &gap, &handover, &act
	if handover > PlannedStopHandover.Seconds() {
		r.Problems = append(r.Problems, fmt.Sprintf("handover %.3fs (old owner's last delivery → successor's grant), more than %v", handover, PlannedStopHandover))
	}
}
