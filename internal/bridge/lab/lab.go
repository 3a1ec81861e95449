// Package lab measures failover the way the spec's "Measuring it" asks:
// an embedded broker, two bridge processes sharing a lease store, a steady
// QoS 1 publisher and a sink; then (a) the owner is SIGKILLed and (b) the
// owner's broker path alone is blackholed (a TCP proxy that swallows
// traffic without FIN while the lease store stays reachable). For each it
// reports the time from the fault to the successor's ServiceLevelFull as
// seen from outside (polling /status), and what was published, delivered,
// lost and duplicated.
package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
)

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
}

// Result is one scenario.
type Result struct {
	Scenario          string  `json:"scenario"`
	BudgetS           float64 `json:"budget_s"`
	FailureToFullS    float64 `json:"failure_to_full_s"`
	MessagesPublished int     `json:"messages_published"`
	MessagesDelivered int     `json:"messages_delivered"`
	Lost              int     `json:"lost"`
	Duplicates        int     `json:"duplicates"`
	OwnerExitCode     int     `json:"owner_exit_code"`
	WithinBudget      bool    `json:"within_budget"`
	// LostIDs lists up to 20 lost sequence numbers.
	LostIDs []int `json:"lost_ids,omitempty"`
	// FaultAtSeq is the publisher's sequence number when the fault hit.
	FaultAtSeq int `json:"fault_at_seq"`
}

// Report is the whole run.
type Report struct {
	Config    string   `json:"config"`
	Scenarios []Result `json:"scenarios"`
}

// Config is the tight configuration the lab runs (placeholders filled per
// instance): lease_ttl 6s and activation steps of 2s, so that a run takes
// well under a minute.
const Config = `bridge:
  id: lab
  instance_id: {{INSTANCE}}
  shutdown_timeout: 5s
  http: {listen: "{{HTTP}}"}
  dead_letter: {path: "{{DIR}}/dead-letter.jsonl"}
stores:
  lease: {type: sqlite, path: "{{DIR}}/lease.db"}
sessions:
  - id: plant
    session_mode: exclusive
    brokers: ["{{BROKER}}"]
    client_id: lab-plant
    session_expiry_interval: 1h
    keep_alive: 2s
    connect_timeout: 2s
    reconcile_timeout: 2s
    unmatched_grace: 2s
receivers:
  - {id: telemetry, session: plant, topics: [{filter: "in/#", qos: 1}]}
senders:
  - id: sink
    type: mqtt
    mqtt: {broker: "{{SINK}}", qos: 1, keep_alive: 5s, timeout: 5s}
routes:
  - id: telemetry-to-sink
    receiver: telemetry
    senders: [sink]
    rewrite: {strip_prefix: "in/", add_prefix: "out/"}
    lease_ttl: 6s
    step_down_grace: 1s
    broker_health_step_down: 3s
    failover_slo: 60s
`

func render(instance, httpAddr, dir, broker, sink string) string {
	return strings.NewReplacer("{{INSTANCE}}", instance, "{{HTTP}}", httpAddr, "{{DIR}}", dir, "{{BROKER}}", broker, "{{SINK}}", sink).Replace(Config)
}

// Run runs both scenarios.
func Run(ctx context.Context, opts Options) (*Report, error) {
	if opts.Rate <= 0 {
		opts.Rate = 200
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	dir := opts.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "myriarch-lab-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	rep := &Report{Config: render("<a|b>", "<free port>", "<dir>", "tcp://<broker or blackhole proxy>", "tcp://<broker>")}
	for _, sc := range []string{"owner_sigkill", "owner_broker_path_blackhole"} {
		sdir := filepath.Join(dir, sc)
		if err := os.MkdirAll(sdir, 0o755); err != nil {
			return nil, err
		}
		fmt.Fprintf(opts.Progress, "scenario %s\n", sc)
		r, err := scenario(ctx, opts, sc, sdir)
		if err != nil {
			return rep, fmt.Errorf("scenario %s: %w (logs in %s)", sc, err, sdir)
		}
		rep.Scenarios = append(rep.Scenarios, *r)
	}
	return rep, nil
}

type proc struct {
	name   string
	cmd    *exec.Cmd
	http   string
	exited chan struct{}
	code   int
}

func startProc(opts Options, name, dir, broker, sink string) (*proc, error) {
	httpAddr, err := embroker.FreePort()
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(render(name, httpAddr, dir, broker, sink)), 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := opts.Command("run", "-c", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, http: httpAddr, exited: make(chan struct{})}
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

func (p *proc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// state is role/service_level from /status, "" when unreachable.
func (p *proc) state() string {
	c := http.Client{Timeout: 500 * time.Millisecond}
	resp, err := c.Get("http://" + p.http + "/status")
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

func scenario(ctx context.Context, opts Options, name, dir string) (*Result, error) {
	br, err := embroker.Start("", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, err
	}
	defer br.Close()
	pxA, err := NewProxy(br.Addr)
	if err != nil {
		return nil, err
	}
	defer pxA.Close()

	// The sink counts every payload it receives.
	var mu sync.Mutex
	seen := map[int]int{}
	total := 0
	sink, err := embroker.Connect(ctx, br.URL, "lab-sink", true, func(p *paho.Publish) {
		n, err := strconv.Atoi(string(p.Payload))
		if err != nil {
			return
		}
		mu.Lock()
		seen[n]++
		total++
		mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	defer sink.Close()
	if err := sink.Subscribe(ctx, "out/#", 1); err != nil {
		return nil, err
	}

	a, err := startProc(opts, "a", dir, "tcp://"+pxA.Addr(), br.URL)
	if err != nil {
		return nil, err
	}
	defer a.stop()
	if err := waitState(ctx, a, "owner/full", 30*time.Second); err != nil {
		return nil, err
	}
	b, err := startProc(opts, "b", dir, br.URL, br.URL)
	if err != nil {
		return nil, err
	}
	defer b.stop()
	if err := waitState(ctx, b, "standby/none", 30*time.Second); err != nil {
		return nil, err
	}
	fmt.Fprintf(opts.Progress, "  a owns the session, b stands by; publishing %d msg/s\n", opts.Rate)

	pub, err := embroker.Connect(ctx, br.URL, "lab-publisher", true, nil)
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	pctx, stopPub := context.WithCancel(ctx)
	var pubMu sync.Mutex
	published := 0
	publishedNow := func() int { pubMu.Lock(); defer pubMu.Unlock(); return published }
	pubDone := make(chan error, 1)
	go func() {
		t := time.NewTicker(time.Second / time.Duration(opts.Rate))
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				pubDone <- nil
				return
			case <-t.C:
			}
			seq := publishedNow()
			if _, err := pub.Publish(ctx, &paho.Publish{Topic: "in/plant/1", QoS: 1, Payload: []byte(strconv.Itoa(seq))}); err != nil {
				pubDone <- err
				return
			}
			pubMu.Lock()
			published++
			pubMu.Unlock()
		}
	}()
	select {
	case <-time.After(2 * time.Second):
	case err := <-pubDone:
		stopPub()
		return nil, fmt.Errorf("publisher: %w", err)
	}

	cfg, err := config.Parse("lab.yaml", []byte(render("a", "127.0.0.1:1", dir, br.URL, br.URL)))
	if err != nil {
		stopPub()
		return nil, err
	}
	assess := cfg.Exclusive[0].Assessment
	res := &Result{Scenario: name}
	fault := time.Now()
	res.FaultAtSeq = publishedNow()
	switch name {
	case "owner_sigkill":
		res.BudgetS = assess.OwnerDeath.Total.Seconds()
		_ = a.cmd.Process.Signal(syscall.SIGKILL)
	default:
		res.BudgetS = assess.BrokerPath.Total.Seconds()
		pxA.Blackhole(true)
	}
	fmt.Fprintf(opts.Progress, "  fault injected; waiting for b to serve\n")
	if err := waitState(ctx, b, "owner/full", time.Duration(res.BudgetS*float64(time.Second))+30*time.Second); err != nil {
		stopPub()
		return nil, err
	}
	res.FailureToFullS = time.Since(fault).Seconds()
	res.WithinBudget = res.FailureToFullS <= res.BudgetS
	fmt.Fprintf(opts.Progress, "  b at full service after %.3fs (budget %.3fs)\n", res.FailureToFullS, res.BudgetS)
	time.Sleep(2 * time.Second)
	stopPub()
	if err := <-pubDone; err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	res.MessagesPublished = published
	// Let deliveries settle: until every message arrived, or nothing new
	// arrived for 3s.
	last, lastChange := -1, time.Now()
	for time.Since(lastChange) < 3*time.Second {
		mu.Lock()
		n, uniq := total, len(seen)
		mu.Unlock()
		if uniq >= published {
			break
		}
		if n != last {
			last, lastChange = n, time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	for i := range published {
		if seen[i] == 0 {
			res.Lost++
			if len(res.LostIDs) < 20 {
				res.LostIDs = append(res.LostIDs, i)
			}
		}
	}
	for _, c := range seen {
		res.MessagesDelivered += c
		if c > 1 {
			res.Duplicates += c - 1
		}
	}
	mu.Unlock()
	if name != "owner_sigkill" {
		select {
		case <-a.exited:
		case <-time.After(20 * time.Second):
			return nil, errors.New("the owner did not exit after its broker-path step-down")
		}
	} else {
		<-a.exited
	}
	res.OwnerExitCode = a.code
	return res, nil
}
