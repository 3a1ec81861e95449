package lab

// The destination-outage lab (issue 28): the route's destination broker
// goes down for Outage while the source keeps publishing at Rate; then it
// comes back. A source broker with mosquitto's default per-session queue
// (max_queued_messages 1000) drops what does not fit while the bridge
// cannot acknowledge, so without a spool the outage loses messages at the
// source; with a spool (the bridge acknowledges once the spool holds a
// message) it must lose none. Each scenario runs its passes — spool on,
// spool off — side by side, at the same time, against the same source
// broker, so that one report shows the loss the spool prevents.
//
// The destination is an embedded broker behind a TCP proxy. The outage
// first turns the proxy away from it (new connections closed at once, open
// ones cut), lets the sink drain what the broker had already accepted, and
// then stops the broker. The recovery starts a new broker, subscribes the
// sink on it, and only then points the proxy at it: what the bridge
// delivers from then on reaches the sink, and what the old broker accepted
// before it stopped had reached the sink too. A message the sink never
// receives is therefore one the bridge path lost.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
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

// Destination-outage scenarios.
const (
	// DestinationOutage: one bridge (a standalone instance holding its
	// exclusive session alone), the destination down for Outage.
	DestinationOutage = "destination_outage"
	// DestinationOutageOwnerKill: a clustered pair; the owner is killed
	// (SIGKILL) halfway through the outage and the standby takes over,
	// continuing from the spool.
	DestinationOutageOwnerKill = "destination_outage_owner_kill"
)

// OutageScenarios lists the destination-outage scenarios in run order.
var OutageScenarios = []string{DestinationOutage, DestinationOutageOwnerKill}

// IsOutageScenario reports whether sc is one of OutageScenarios.
func IsOutageScenario(sc string) bool { return slices.Contains(OutageScenarios, sc) }

// Spool passes of an outage run.
const (
	SpoolBoth = "both" // spool on and off, side by side
	SpoolOn   = "on"
	SpoolOff  = "off"
)

// OutageOptions configure a destination-outage run.
type OutageOptions struct {
	// Command starts one bridge process (see Options.Command).
	Command func(args ...string) *exec.Cmd
	// Scenarios, nil means OutageScenarios.
	Scenarios []string
	// Store is the lease store: sqlite (default; the spool is a file
	// spool) or postgres (the spool is `backend: postgres`).
	Store string
	// Rate is the source publisher's messages per second (default 200).
	Rate int
	// Outage is how long the destination stays down (default 10s).
	Outage time.Duration
	// Topics the messages are spread over, round robin (default 4);
	// order is judged per topic.
	Topics int
	// Spool: SpoolBoth (default), SpoolOn or SpoolOff.
	Spool string
	// Fsync is the file spool's fsync policy (default interval).
	Fsync string
	// PostgresFsync runs the lab's PostgreSQL (store postgres) with the
	// server's fsync on, as a production server runs: each commit waits
	// for the disk. Off by default (pgtest's throwaway clusters run with
	// fsync off).
	PostgresFsync bool
	// SpoolBlock, when set, replaces the rendered spool block (the YAML
	// flow mapping after `spool: `); {{DIR}} is the pass's directory.
	SpoolBlock string
	// Source is an external source broker (tcp://host:port); "" starts
	// mosquitto with SourceQueue.
	Source string
	// SourceQueue, when positive, is the started mosquitto's
	// max_queued_messages; 0 keeps mosquitto's default of 1000, the case
	// the lab exists for.
	SourceQueue int
	// Dir keeps configs and logs; "" uses a temporary directory.
	Dir string
	// Progress receives progress lines; nil discards.
	Progress io.Writer
	// ProgressEvery is the progress cadence (default 10s).
	ProgressEvery time.Duration
}

// OutageRow is one pass of one scenario.
type OutageRow struct {
	Scenario string `json:"scenario"`
	Store    string `json:"store"`
	// Spool is file, postgres or off.
	Spool string `json:"spool"`
	Fsync string `json:"fsync,omitempty"`
	// PostgresFsync is the lab PostgreSQL's fsync setting (on or off)
	// for the postgres spool.
	PostgresFsync string `json:"postgres_fsync,omitempty"`
	Rate          int    `json:"rate"`
	// SourceQueue is the source broker's max_queued_messages (mosquitto's
	// default 1000 unless changed); 0 for an external broker.
	SourceQueue int     `json:"source_max_queued_messages"`
	OutageS     float64 `json:"outage_s"`
	Published   int     `json:"published"`
	// Delivered counts every delivery of a published message the sink
	// received, duplicates too (a message whose PUBACK the publisher did
	// not see as it stopped is not counted as published nor delivered).
	Delivered  int `json:"delivered"`
	Lost       int `json:"lost"`
	Duplicates int `json:"duplicates"`
	// OutOfOrder counts first deliveries that reached the sink after a
	// later message of the same topic; PerTopic splits it.
	OutOfOrder int           `json:"out_of_order"`
	PerTopic   []OutageTopic `json:"per_topic"`
	SpoolPeak  int64         `json:"spool_peak_messages"`
	// DuplicateWindow is the most duplicates the scenario's disruptions
	// allow (see DuplicateWindowRule).
	DuplicateWindow     int    `json:"duplicate_window"`
	DuplicateWindowRule string `json:"duplicate_window_rule"`
	// DrainS: the destination's return → the sink holds every message
	// published (or the settle gave up).
	DrainS float64 `json:"drain_s"`
	// Owner kill: the kill → the successor at full service, and what was
	// lost among the messages published in between (the source broker's
	// queue, not the spool, must hold those: see "Queue room").
	FailoverS          *float64 `json:"failover_s,omitempty"`
	LostDuringFailover *int     `json:"lost_during_failover,omitempty"`
	// Admission is the queue-room verdict for the source's queue limit at
	// Rate ("admitted" or the refusal), for the owner kill.
	Admission string `json:"admission,omitempty"`
	// LostIDs lists up to 20 lost sequence numbers.
	LostIDs  []int    `json:"lost_ids,omitempty"`
	Pass     bool     `json:"pass"`
	Problems []string `json:"problems,omitempty"`
}

// OutageTopic is one topic's figures.
type OutageTopic struct {
	Topic      string `json:"topic"`
	Published  int    `json:"published"`
	Lost       int    `json:"lost"`
	Duplicates int    `json:"duplicates"`
	OutOfOrder int    `json:"out_of_order"`
}

// OutageReport is a whole run.
type OutageReport struct {
	Store   string      `json:"store"`
	Source  string      `json:"source"`
	Load    string      `json:"load_average,omitempty"`
	Started time.Time   `json:"started"`
	Rows    []OutageRow `json:"rows"`
}

// OK reports whether every pass with a spool passed; the passes without
// one show the loss and are judged by the reader.
func (r *OutageReport) OK() bool {
	for _, row := range r.Rows {
		if row.Spool != "off" && !row.Pass {
			return false
		}
	}
	return len(r.Rows) > 0
}

// OutageConfig is the bridge configuration of the outage lab (placeholders
// filled per pass and instance). The sender retries without a practical
// limit and backs off to 1s at most: the spool, not the retry budget,
// carries an outage of hours, and the route resumes within a second of
// the destination's return.
const OutageConfig = `bridge:
  id: {{BRIDGE}}
  instance_id: {{INSTANCE}}
  shutdown_timeout: 5s
  state_dir: "{{DIR}}"
  http: {listen: "127.0.0.1:0"}
  dead_letter: {path: "{{DIR}}/dead-letter.jsonl"}
stores:
  lease: {{STORE}}
sessions:
  - id: plant
    session_mode: exclusive
    brokers: ["{{SOURCE}}"]
    client_id: {{BRIDGE}}-plant-{{NONCE}}
    session_expiry_interval: 1h
    keep_alive: 2s
    connect_timeout: 2s
    reconcile_timeout: 2s
    unmatched_grace: 2s
    receive_maximum: 100
receivers:
  - {id: telemetry, session: plant, topics: [{filter: "in/{{NONCE}}/#", qos: 1}]}
senders:
  - id: sink
    type: mqtt
    retry: {max_attempts: 1000000000, initial_backoff: 100ms, max_backoff: 1s}
    mqtt: {broker: "{{DEST}}", qos: 1, keep_alive: 5s, timeout: 5s}
routes:
  - id: telemetry-to-sink
    receiver: telemetry
    senders: [sink]
    max_in_flight: 100
    rewrite: {strip_prefix: "in/", add_prefix: "out/"}
    lease_ttl: 6s
    step_down_grace: 1s
    broker_health_step_down: 6s
    failover_slo: 60s{{SPOOL}}
`

// outageReceiveMaximum and outageMaxInFlight are OutageConfig's
// receive_maximum and max_in_flight.
const (
	outageReceiveMaximum = 100
	outageMaxInFlight    = 100
	outageFsyncInterval  = 200 * time.Millisecond
)

type outageRendering struct {
	bridge, instance, dir, store, source, dest, nonce, spool string
}

func (r outageRendering) String() string {
	sp := ""
	if r.spool != "" {
		sp = "\n    spool: " + strings.ReplaceAll(r.spool, "{{DIR}}", r.dir)
	}
	return strings.NewReplacer("{{BRIDGE}}", r.bridge, "{{INSTANCE}}", r.instance, "{{DIR}}", r.dir, "{{STORE}}", r.store,
		"{{SOURCE}}", r.source, "{{DEST}}", r.dest, "{{NONCE}}", r.nonce, "{{SPOOL}}", sp).Replace(OutageConfig)
}

// SpoolBlockFor is the spool block the lab renders for a store: a file
// spool in the pass's directory on sqlite (the pair shares the host), the
// PostgreSQL outbox on postgres.
func SpoolBlockFor(store, fsync string) string {
	if store == StorePostgres {
		return "{backend: postgres}"
	}
	return fmt.Sprintf("{dir: \"{{DIR}}/spool\", fsync: %s}", fsync)
}

// RunOutage runs the destination-outage scenarios.
func RunOutage(ctx context.Context, opts OutageOptions) (*OutageReport, error) {
	if opts.Rate <= 0 {
		opts.Rate = 200
	}
	if opts.Outage <= 0 {
		opts.Outage = 10 * time.Second
	}
	if opts.Topics <= 0 {
		opts.Topics = 4
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	// The passes run at once and write progress lines each.
	opts.Progress = &lockedWriter{w: opts.Progress}
	if opts.ProgressEvery <= 0 {
		opts.ProgressEvery = 10 * time.Second
	}
	if opts.Store == "" {
		opts.Store = StoreSQLite
	}
	if opts.Fsync == "" {
		opts.Fsync = "interval"
	}
	if opts.Spool == "" {
		opts.Spool = SpoolBoth
	}
	if opts.Scenarios == nil {
		opts.Scenarios = OutageScenarios
	}
	switch {
	case opts.Store != StoreSQLite && opts.Store != StorePostgres:
		return nil, fmt.Errorf("store %q: must be sqlite or postgres (the spool is a file on sqlite, the PostgreSQL outbox on postgres)", opts.Store)
	case opts.Spool != SpoolBoth && opts.Spool != SpoolOn && opts.Spool != SpoolOff:
		return nil, fmt.Errorf("spool %q: must be both, on or off", opts.Spool)
	case opts.Fsync != "always" && opts.Fsync != "interval" && opts.Fsync != "never":
		return nil, fmt.Errorf("fsync %q: must be always, interval or never", opts.Fsync)
	}
	for _, sc := range opts.Scenarios {
		if !IsOutageScenario(sc) {
			return nil, fmt.Errorf("scenario %q: must be one of %s", sc, strings.Join(OutageScenarios, ", "))
		}
	}
	dir := opts.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "myriarch-outage-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	rep := &OutageReport{Store: opts.Store, Source: opts.Source, Load: loadAvg(), Started: time.Now().UTC()}
	sourceQueue := 0
	if opts.Source == "" {
		mdir := filepath.Join(dir, "mosquitto")
		if err := os.MkdirAll(mdir, 0o755); err != nil {
			return nil, err
		}
		q := -1
		if opts.SourceQueue > 0 {
			q = opts.SourceQueue
		}
		m, err := StartMosquitto(ctx, mdir, q)
		if err != nil {
			return nil, fmt.Errorf("source broker: %w", err)
		}
		defer m.Close()
		opts.Source = m.URL
		sourceQueue = MosquittoDefaultMaxQueued
		rep.Source = "mosquitto (max_queued_messages default 1000)"
		if opts.SourceQueue > 0 {
			sourceQueue = opts.SourceQueue
			rep.Source = fmt.Sprintf("mosquitto (max_queued_messages %d)", opts.SourceQueue)
		}
	}
	var pgSettings map[string]string
	if opts.PostgresFsync {
		pgSettings = map[string]string{"fsync": "on"}
	}
	st, err := startStoreWith(ctx, opts.Store, dir, pgSettings)
	if err != nil {
		return nil, err
	}
	defer st.Close()

	var passes []string
	if opts.Spool != SpoolOff {
		passes = append(passes, "spool")
	}
	if opts.Spool != SpoolOn {
		passes = append(passes, "nospool")
	}
	for _, sc := range opts.Scenarios {
		rows := make([]OutageRow, len(passes))
		errs := make([]error, len(passes))
		var wg sync.WaitGroup
		for i, p := range passes {
			wg.Go(func() {
				pass := &outagePass{opts: opts, scenario: sc, store: st, sourceQueue: sourceQueue,
					dir: filepath.Join(dir, sc+"-"+p), name: p, spoolOn: p == "spool"}
				r, err := pass.run(ctx)
				if r != nil {
					rows[i] = *r
				}
				if err != nil {
					errs[i] = fmt.Errorf("%s (%s): %w (logs in %s)", sc, p, err, pass.dir)
				}
			})
		}
		wg.Wait()
		for i := range rows {
			if rows[i].Scenario != "" {
				rep.Rows = append(rep.Rows, rows[i])
			}
		}
		if err := errors.Join(errs...); err != nil {
			return rep, err
		}
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	return rep, nil
}

// lockedWriter serializes writes of several goroutines to one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// outagePass is one pass (spool on or off) of one scenario.
type outagePass struct {
	opts        OutageOptions
	scenario    string
	store       *storeEnv
	sourceQueue int
	dir, name   string
	spoolOn     bool

	nonce  string
	render outageRendering
	slots  []*slot
	starts int
	acc    *outageSink

	pubMu     sync.Mutex
	published int

	peakMu sync.Mutex
	peak   int64
}

func (p *outagePass) publishedNow() int { p.pubMu.Lock(); defer p.pubMu.Unlock(); return p.published }

func (p *outagePass) logf(format string, args ...any) {
	fmt.Fprintf(p.opts.Progress, "%s %s [%s] %s\n", time.Now().UTC().Format("15:04:05"), p.scenario, p.label(), fmt.Sprintf(format, args...))
}

func (p *outagePass) label() string {
	if !p.spoolOn {
		return "no spool"
	}
	return "spool " + p.spoolKind()
}

func (p *outagePass) spoolKind() string {
	if !p.spoolOn {
		return "off"
	}
	if p.opts.Store == StorePostgres {
		return "postgres"
	}
	return "file"
}

func (p *outagePass) run(ctx context.Context) (*OutageRow, error) {
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return nil, err
	}
	p.nonce = strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + p.name[:1]
	p.acc = newOutageSink(p.nonce, p.opts.Topics)
	row := &OutageRow{Scenario: p.scenario, Store: p.opts.Store, Spool: p.spoolKind(), Rate: p.opts.Rate,
		SourceQueue: p.sourceQueue, OutageS: p.opts.Outage.Seconds()}
	if p.spoolOn && p.opts.Store == StoreSQLite {
		row.Fsync = p.opts.Fsync
	}
	if p.spoolOn && p.opts.Store == StorePostgres {
		row.PostgresFsync = "off"
		if p.opts.PostgresFsync {
			row.PostgresFsync = "on"
		}
	}

	// The destination: an embedded broker behind a proxy, and the sink.
	blog, err := os.OpenFile(filepath.Join(p.dir, "destination.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer blog.Close()
	dest := &destination{log: slog.New(slog.NewTextHandler(blog, nil)), acc: p.acc, nonce: p.nonce}
	if err := dest.start(ctx); err != nil {
		return nil, err
	}
	defer dest.close()
	px, err := faultnet.Listen(faultnet.Options{}, dest.broker.Addr)
	if err != nil {
		return nil, err
	}
	defer px.Close()

	spool := ""
	if p.spoolOn {
		spool = p.opts.SpoolBlock
		if spool == "" {
			spool = SpoolBlockFor(p.opts.Store, p.opts.Fsync)
		}
	}
	p.render = outageRendering{bridge: "outage-" + p.name, dir: p.dir, store: p.store.block(p.store.target),
		source: p.opts.Source, dest: "tcp://" + px.Addr(), nonce: p.nonce, spool: spool}
	r := p.render
	r.instance = "a"
	if _, err := config.Parse("outage.yaml", []byte(r.String())); err != nil {
		return nil, fmt.Errorf("outage configuration: %w", err)
	}
	pair := p.scenario == DestinationOutageOwnerKill
	if pair {
		// The queue-room verdict for the source's queue at this rate: a
		// failover (nothing reads the source session) is the broker
		// queue's to hold, spool or not.
		row.Admission = "admitted"
		if p.sourceQueue > 0 {
			adm := strings.Replace(r.String(), "    receive_maximum: 100", fmt.Sprintf("    receive_maximum: 100\n    broker_max_queued_messages: %d", p.sourceQueue), 1)
			adm = strings.Replace(adm, "    failover_slo: 60s", fmt.Sprintf("    failover_slo: 60s\n    peak_message_rate: %d", p.opts.Rate), 1)
			if _, err := config.Parse("outage.yaml", []byte(adm)); err != nil {
				row.Admission = "refused: " + err.Error()
			}
		}
	}
	defer func() {
		for _, s := range p.slots {
			s.close()
		}
	}()
	names := []string{"a"}
	if pair {
		names = append(names, "b")
	}
	for i, n := range names {
		s := &slot{name: n}
		p.slots = append(p.slots, s)
		if err := p.start(s); err != nil {
			return nil, err
		}
		want := "owner/full"
		if i == 1 {
			want = "standby/none"
		}
		if err := waitState(ctx, s.p, want, 60*time.Second); err != nil {
			return nil, err
		}
	}

	pub, err := embroker.Connect(ctx, p.opts.Source, "outage-publisher-"+p.nonce, true, nil)
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	defer pub.Close()
	pctx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan error, 1)
	go func() { pubDone <- p.publish(pctx, pub) }()
	stopped := false
	stopPublisher := func() error {
		if stopped {
			return nil
		}
		stopped = true
		stopPub()
		return <-pubDone
	}
	defer func() { _ = stopPublisher() }()
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-pubDone:
			stopped = true
			return fmt.Errorf("publisher: %w", err)
		case <-time.After(d):
			return nil
		}
	}
	p.logf("publishing %d msg/s over %d topics; destination up", p.opts.Rate, p.opts.Topics)
	if err := sleep(2 * time.Second); err != nil {
		return nil, err
	}

	// The outage.
	px.SetTargets()
	px.Cut()
	outageAt := time.Now()
	p.logf("destination down for %v (at seq %d)", p.opts.Outage, p.publishedNow())
	if err := dest.stop(ctx); err != nil {
		return nil, err
	}
	var killAt, fullAt time.Time
	var seqAtKill, seqAtFull int
	nextProgress := time.Now().Add(p.opts.ProgressEvery)
	for since := time.Since(outageAt); since < p.opts.Outage; since = time.Since(outageAt) {
		if pair && killAt.IsZero() && since >= p.opts.Outage/2 {
			owner := p.owner()
			if owner == nil {
				return nil, errors.New("no owner at full service to kill")
			}
			seqAtKill = p.publishedNow()
			killAt = time.Now()
			_ = owner.p.cmd.Process.Signal(syscall.SIGKILL)
			p.logf("killed the owner %s (SIGKILL) at seq %d", owner.name, seqAtKill)
		}
		if !killAt.IsZero() && fullAt.IsZero() {
			for _, s := range p.slots {
				if s.p.alive() && s.p.state() == "owner/full" {
					fullAt, seqAtFull = time.Now(), p.publishedNow()
					p.logf("%s at full service %.3fs after the kill", s.name, fullAt.Sub(killAt).Seconds())
				}
			}
		}
		if time.Now().After(nextProgress) {
			p.progress(fmt.Sprintf("outage %.0f/%.0fs", since.Seconds(), p.opts.Outage.Seconds()))
			nextProgress = time.Now().Add(p.opts.ProgressEvery)
		}
		if err := sleep(min(100*time.Millisecond, p.opts.Outage-since)); err != nil {
			return nil, err
		}
	}
	if pair && !killAt.IsZero() && fullAt.IsZero() {
		// The successor is still activating: wait for it (bounded) so
		// that the failover is measured.
		deadline := time.Now().Add(90 * time.Second)
		for fullAt.IsZero() && time.Now().Before(deadline) {
			for _, s := range p.slots {
				if s.p.alive() && s.p.state() == "owner/full" {
					fullAt, seqAtFull = time.Now(), p.publishedNow()
				}
			}
			if err := sleep(50 * time.Millisecond); err != nil {
				return nil, err
			}
		}
		if fullAt.IsZero() {
			row.Problems = append(row.Problems, "no successor at full service within 90s of the outage's end")
		}
	}
	p.pollPeak()

	// The destination comes back.
	if err := dest.restart(ctx); err != nil {
		return nil, err
	}
	px.SetTargets(dest.broker.Addr)
	backAt := time.Now()
	p.logf("destination back after %.1fs; spool peak %d messages", backAt.Sub(outageAt).Seconds(), p.peakNow())
	// The source keeps publishing a while after the return: the backlog
	// drains while new messages arrive.
	tail := min(10*time.Second, p.opts.Outage)
	for t0 := time.Now(); time.Since(t0) < tail; {
		p.pollPeak()
		if err := sleep(min(time.Second, tail-time.Since(t0))); err != nil {
			return nil, err
		}
	}
	if err := stopPublisher(); err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	published := p.publishedNow()
	p.logf("publisher stopped at %d messages; draining", published)
	p.drain(ctx, published, backAt)
	row.DrainS = time.Since(backAt).Seconds()
	p.pollPeak()
	row.SpoolPeak = p.peakNow()

	// The verdict.
	p.acc.judge(row, published)
	row.Published = published
	if pair && !killAt.IsZero() {
		if !fullAt.IsZero() {
			f := fullAt.Sub(killAt).Seconds()
			row.FailoverS = &f
		} else {
			seqAtFull = published
		}
		n := p.acc.lostIn(seqAtKill, seqAtFull+outageReceiveMaximum)
		row.LostDuringFailover = &n
	}
	row.DuplicateWindow, row.DuplicateWindowRule = duplicateWindow(pair, p.spoolOn, p.opts.Rate)
	if row.Lost > 0 {
		msg := fmt.Sprintf("%d lost", row.Lost)
		if row.LostDuringFailover != nil && *row.LostDuringFailover > 0 {
			msg += fmt.Sprintf(" (%d of them published between the kill and the successor's full service: the source broker's queue, %d, holds a failover, not the spool)", *row.LostDuringFailover, p.sourceQueue)
		}
		row.Problems = append(row.Problems, msg)
	}
	if row.OutOfOrder > 0 {
		row.Problems = append(row.Problems, fmt.Sprintf("%d out of order", row.OutOfOrder))
	}
	if row.Duplicates > row.DuplicateWindow {
		row.Problems = append(row.Problems, fmt.Sprintf("%d duplicates, more than the window %d (%s)", row.Duplicates, row.DuplicateWindow, row.DuplicateWindowRule))
	}
	row.Pass = len(row.Problems) == 0
	p.logf("published %d delivered %d lost %d duplicates %d out_of_order %d spool_peak %d drain %.1fs pass=%t",
		row.Published, row.Delivered, row.Lost, row.Duplicates, row.OutOfOrder, row.SpoolPeak, row.DrainS, row.Pass)
	return row, nil
}

// duplicateWindow is the duplicates a pass may show. Each cut of the
// destination connection may deliver again what the MQTT sender had
// written and not seen acknowledged (at most max_in_flight). An owner
// kill adds, without a spool, what the killed owner held unacknowledged
// at the source (receive_maximum); with one, what the spool had appended
// and not yet acknowledged to the source (receive_maximum), what it had
// settled since its last checkpoint (rate × fsync_interval, the
// checkpoint cadence) and what was settled out of order above it
// (max_in_flight).
func duplicateWindow(pair, spool bool, rate int) (int, string) {
	n, rule := outageMaxInFlight, "max_in_flight (the destination's cut)"
	if pair {
		n += outageReceiveMaximum
		rule += " + receive_maximum (the kill: unacknowledged at the source)"
		if spool {
			n += int(math.Ceil(float64(rate)*outageFsyncInterval.Seconds())) + outageMaxInFlight
			rule += " + rate × fsync_interval + max_in_flight (the spool's checkpoint)"
		}
	}
	return n, rule
}

func (p *outagePass) owner() *slot {
	for _, s := range p.slots {
		if s.p.alive() && s.p.state() == "owner/full" {
			return s
		}
	}
	return nil
}

func (p *outagePass) progress(phase string) {
	p.pollPeak()
	total, uniq := p.acc.counts()
	sp := "spool off"
	if p.spoolOn {
		// No instance has the spool open while the session fails over.
		sp = fmt.Sprintf("no spool open (peak %d)", p.peakNow())
		for _, s := range p.slots {
			if s.p.alive() {
				if ss, ok := spoolStats(s.p); ok {
					sp = fmt.Sprintf("spool %d messages, %d bytes, oldest %.0fs (peak %d)", ss.Messages, ss.Bytes, ss.OldestAgeS, p.peakNow())
				}
			}
		}
	}
	p.logf("%s: published %d, delivered %d (%d distinct), %s", phase, p.publishedNow(), total, uniq, sp)
}

func (p *outagePass) pollPeak() {
	for _, s := range p.slots {
		if !s.p.alive() {
			continue
		}
		if ss, ok := spoolStats(s.p); ok {
			p.peakMu.Lock()
			p.peak = max(p.peak, ss.Messages, ss.PeakMessages)
			p.peakMu.Unlock()
		}
	}
}

func (p *outagePass) peakNow() int64 { p.peakMu.Lock(); defer p.peakMu.Unlock(); return p.peak }

// drain waits until the sink holds every published message, or nothing
// new arrived for 15s (the sender's backoff is at most 1s), reporting
// progress meanwhile.
func (p *outagePass) drain(ctx context.Context, published int, backAt time.Time) {
	last, lastChange := -1, time.Now()
	next := time.Now().Add(p.opts.ProgressEvery)
	for time.Since(lastChange) < 15*time.Second && ctx.Err() == nil {
		n, uniq := p.acc.counts()
		if uniq >= published {
			p.logf("sink holds all %d messages %.1fs after the destination's return", published, time.Since(backAt).Seconds())
			// Give late duplicates a moment to show.
			time.Sleep(time.Second)
			return
		}
		if n != last {
			last, lastChange = n, time.Now()
		}
		if time.Now().After(next) {
			p.progress("draining")
			next = time.Now().Add(p.opts.ProgressEvery)
		}
		p.pollPeak()
		time.Sleep(100 * time.Millisecond)
	}
	p.logf("drain gave up: nothing new for 15s")
}

func (p *outagePass) start(s *slot) error {
	s.close()
	p.starts++
	r := p.render
	r.instance = s.name
	cfgPath := filepath.Join(p.dir, s.name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(r.String()), 0o644); err != nil {
		return err
	}
	proc, err := startProc(s.name, filepath.Join(p.dir, s.name+".log"), p.starts, p.opts.Command("run", "-c", cfgPath))
	if err != nil {
		return err
	}
	s.p = proc
	return nil
}

// publish publishes QoS 1 messages at the rate, catching up after a slow
// publish so that the rate holds over time; message seq goes to topic
// in/<nonce>/<seq mod topics> with payload "<nonce>/<seq>".
func (p *outagePass) publish(ctx context.Context, pub *embroker.Client) error {
	t0 := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(min(p.opts.Rate, 1000)))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		due := int(time.Since(t0).Seconds() * float64(p.opts.Rate))
		for seq := p.publishedNow(); seq < due; seq++ {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := pub.Publish(pctx, &paho.Publish{Topic: "in/" + p.nonce + "/" + strconv.Itoa(seq%p.opts.Topics), QoS: 1,
				Payload: []byte(p.nonce + "/" + strconv.Itoa(seq))})
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			p.pubMu.Lock()
			p.published++
			p.pubMu.Unlock()
		}
	}
}

// spoolStats reads the first spool of the first session from /status.
func spoolStats(p *proc) (SpoolFigures, bool) {
	addr := p.httpAddr()
	if addr == "" {
		return SpoolFigures{}, false
	}
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/status")
	if err != nil {
		return SpoolFigures{}, false
	}
	defer resp.Body.Close()
	var st struct {
		Sessions []struct {
			Spools []SpoolFigures `json:"spools"`
		} `json:"sessions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || len(st.Sessions) == 0 || len(st.Sessions[0].Spools) == 0 {
		return SpoolFigures{}, false
	}
	return st.Sessions[0].Spools[0], true
}

// SpoolFigures are the fields of a spool in /status that the lab reads.
type SpoolFigures struct {
	Messages     int64   `json:"messages"`
	Bytes        int64   `json:"bytes"`
	OldestAgeS   float64 `json:"oldest_age_s"`
	PeakMessages int64   `json:"peak_messages"`
}

// destination is the route's destination broker and the sink's client on
// it; the broker is stopped for the outage and a new one started after.
type destination struct {
	log    *slog.Logger
	acc    *outageSink
	nonce  string
	broker *embroker.Broker
	client *embroker.Client
}

func (d *destination) start(ctx context.Context) error {
	b, err := embroker.Start("", d.log)
	if err != nil {
		return err
	}
	c, err := embroker.Connect(ctx, b.URL, "outage-sink-"+d.nonce, true, d.acc.receive)
	if err != nil {
		_ = b.Close()
		return fmt.Errorf("sink: %w", err)
	}
	if err := c.Subscribe(ctx, "out/"+d.nonce+"/#", 1); err != nil {
		c.Close()
		_ = b.Close()
		return fmt.Errorf("sink: %w", err)
	}
	d.broker, d.client = b, c
	return nil
}

// stop lets the sink receive what the broker accepted (the bridge's path
// is already cut), then stops the broker.
func (d *destination) stop(ctx context.Context) error {
	last, lastChange := -1, time.Now()
	for time.Since(lastChange) < time.Second {
		n, _ := d.acc.counts()
		if n != last {
			last, lastChange = n, time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	d.close()
	return nil
}

func (d *destination) restart(ctx context.Context) error { return d.start(ctx) }

func (d *destination) close() {
	if d.client != nil {
		d.client.Close()
		d.client = nil
	}
	if d.broker != nil {
		_ = d.broker.Close()
		d.broker = nil
	}
}

// outageSink counts deliveries per sequence number and judges order per
// topic without keeping each delivery: an hour at 500 msg/s is 1.8
// million messages.
type outageSink struct {
	nonce  string
	topics int

	mu       sync.Mutex
	seen     []uint16 // deliveries per seq
	total    int
	distinct int
	maxSeq   []int // per topic, the highest seq delivered
	ooo      []int // per topic, first deliveries below maxSeq
}

func newOutageSink(nonce string, topics int) *outageSink {
	s := &outageSink{nonce: nonce, topics: topics, maxSeq: make([]int, topics), ooo: make([]int, topics)}
	for i := range s.maxSeq {
		s.maxSeq[i] = -1
	}
	return s
}

func (s *outageSink) receive(pb *paho.Publish) {
	n, ok := strings.CutPrefix(string(pb.Payload), s.nonce+"/")
	if !ok {
		return
	}
	seq, err := strconv.Atoi(n)
	if err != nil || seq < 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq >= len(s.seen) {
		s.seen = slices.Grow(s.seen, seq+1-len(s.seen))[:seq+1]
	}
	s.total++
	if s.seen[seq] < math.MaxUint16 {
		s.seen[seq]++
	}
	if s.seen[seq] > 1 {
		return // a duplicate: a redelivery goes back by design
	}
	s.distinct++
	t := seq % s.topics
	if seq < s.maxSeq[t] {
		s.ooo[t]++
	}
	s.maxSeq[t] = max(s.maxSeq[t], seq)
}

func (s *outageSink) counts() (total, distinct int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total, s.distinct
}

// lostIn counts the lost messages among seqs [from, to).
func (s *outageSink) lostIn(from, to int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for q := from; q < to; q++ {
		if q >= len(s.seen) || s.seen[q] == 0 {
			n++
		}
	}
	return n
}

// judge fills the row's counts for the messages 0..published-1.
func (s *outageSink) judge(row *OutageRow, published int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	row.PerTopic = make([]OutageTopic, s.topics)
	for t := range row.PerTopic {
		row.PerTopic[t] = OutageTopic{Topic: strconv.Itoa(t), OutOfOrder: s.ooo[t]}
		row.OutOfOrder += s.ooo[t]
	}
	for q := range published {
		pt := &row.PerTopic[q%s.topics]
		pt.Published++
		n := 0
		if q < len(s.seen) {
			n = int(s.seen[q])
		}
		switch {
		case n == 1:
			row.Delivered++
		case n == 0:
			row.Lost++
			pt.Lost++
			if len(row.LostIDs) < 20 {
				row.LostIDs = append(row.LostIDs, q)
			}
		case n > 1:
			row.Delivered += n
			row.Duplicates += n - 1
			pt.Duplicates += n - 1
		}
	}
}

// OutageLine is a one-line summary of a row.
func (r OutageRow) Line() string {
	return fmt.Sprintf("%s store=%s spool=%s rate=%d outage_s=%.0f published=%d delivered=%d lost=%d duplicates=%d (window %d) out_of_order=%d spool_peak_messages=%d pass=%t",
		r.Scenario, r.Store, r.Spool, r.Rate, r.OutageS, r.Published, r.Delivered, r.Lost, r.Duplicates, r.DuplicateWindow, r.OutOfOrder, r.SpoolPeak, r.Pass)
}
