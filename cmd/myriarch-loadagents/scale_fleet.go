package main

// The processes of the scale command: myriarchd replicas, HAProxy
// instances, load processes (this program re-executed as scale-agents) and
// the bare opamp-go server, and what is read of them in /proc.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/pgtest"
)

// freeAddr is a free loopback host:port.
func freeAddr() (string, error) {
	p, err := pgtest.FreePort("127.0.0.1")
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p), nil
}

// proc is a child process whose end is watched.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProc(cmd *exec.Cmd) (*proc, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signalWait sends sig and waits up to grace for the end, then kills.
func (p *proc) signalWait(sig syscall.Signal, grace time.Duration) {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// replicaProc is a myriarchd serve process.
type replicaProc struct {
	*proc
	id, httpAddr, opampAddr string
}

// startReplicaProc starts `myriarchd serve` as replica id on free loopback
// ports, with database dsn, the enrollment secret and extra settings (they
// win over the defaults here). Its log goes to logw.
//
// A free port can be taken by another process before the replica binds
// it (the machine is shared): a replica that exits before it answers
// /readyz is started again on other ports, up to three times.
func startReplicaProc(ctx context.Context, exe, id, dsn, secret string, extra map[string]string, logw io.Writer) (*replicaProc, error) {
	var lastErr error
	for range 3 {
		httpAddr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		opampAddr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		r, err := startReplicaAt(ctx, exe, id, dsn, secret, httpAddr, opampAddr, extra, logw)
		if err != nil {
			return nil, err
		}
		deadline := time.Now().Add(2 * time.Minute)
		for !r.exited() && !r.ready() && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
		}
		if !r.exited() {
			return r, nil
		}
		lastErr = fmt.Errorf("replica %s exited at start: %v (see its log)", id, r.err)
	}
	return nil, lastErr
}

// startReplicaAt is startReplicaProc on given addresses (a replica started
// again after a kill keeps its place behind the load balancer).
func startReplicaAt(ctx context.Context, exe, id, dsn, secret, httpAddr, opampAddr string, extra map[string]string, logw io.Writer) (*replicaProc, error) {
	settings := map[string]string{"database.url": dsn, "server.enrollmentSecret": secret, "ha.replicaId": id,
		"server.httpListen": httpAddr, "server.opampListen": opampAddr, "log.level": "warn",
		// Thousands of new agents enroll from one address at once.
		"server.enrollmentsPerMinute": "1000000",
		// HAProxy (on loopback) names the agent's address.
		"server.trustedProxies": "127.0.0.1/32"}
	for k, v := range extra {
		settings[k] = v
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MYRIARCH_") {
			env = append(env, kv)
		}
	}
	for k, v := range settings {
		env = append(env, config.EnvName(k)+"="+v)
	}
	cmd := exec.Command(exe, "serve")
	cmd.Env = env
	// myriarchd logs to stdout.
	cmd.Stdout, cmd.Stderr = &prefixWriter{prefix: "[" + id + "] ", w: logw}, &prefixWriter{prefix: "[" + id + "] ", w: logw}
	p, err := startProc(cmd)
	if err != nil {
		return nil, err
	}
	go func() {
		select {
		case <-ctx.Done():
			p.signalWait(syscall.SIGTERM, 10*time.Second)
		case <-p.done:
		}
	}()
	return &replicaProc{proc: p, id: id, httpAddr: httpAddr, opampAddr: opampAddr}, nil
}

func (r *replicaProc) metrics() string { return scrapeMetrics("http://" + r.httpAddr + "/metrics") }

// leads reports whether the replica says it is the leader.
func (r *replicaProc) leads() bool { return strings.Contains(r.metrics(), "\nmyriarch_leader 1\n") }

// ready reports whether /readyz answers 200.
func (r *replicaProc) ready() bool {
	resp, err := http.Get("http://" + r.httpAddr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// stop is a planned stop (SIGTERM).
func (r *replicaProc) stop() { r.signalWait(syscall.SIGTERM, 30*time.Second) }

// kill is kill -9.
func (r *replicaProc) kill() {
	_ = r.cmd.Process.Kill()
	<-r.done
}

// metricValue is the value of the sample named exactly name ("" labels).
func metricValue(text, name string) float64 {
	for line := range strings.SplitSeq(text, "\n") {
		n, v, ok := strings.Cut(line, " ")
		if ok && n == name {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

// HAProxy settings (documented in docs/myriarchd.md, "Scale"): leastconn
// so that a replica started again takes the reconnecting agents first;
// WebSocket connections live under "timeout tunnel" once upgraded; plain
// HTTP polls under the client and server timeouts; a replica is taken out
// after three failed /readyz checks one second apart (3 s to answer each) (it answers 503 while
// it cannot serve or is stopping) and a connection refused by a dead one
// is redispatched to another. X-Forwarded-For carries the agent's address
// (myriarchd takes it from HAProxy with server.trustedProxies).
const haproxyConfig = `global
    maxconn {{MAXCONN}}
    hard-stop-after 30s

defaults
    mode http
    balance leastconn
    option forwardfor
    option redispatch
    retries 3
    timeout connect 2s
    timeout client 90s
    timeout server 90s
    timeout http-request 10s
    timeout http-keep-alive 60s
    timeout queue 10s
    timeout tunnel 1h
    timeout client-fin 5s
    maxconn {{MAXCONN}}

frontend opamp
    bind {{LISTEN}}
    default_backend replicas

backend replicas
    option httpchk
    http-check send meth GET uri /readyz
    http-check expect status 200
    timeout check 3s
    default-server check inter 1s fall 3 rise 2
{{SERVERS}}`

// haproxyText renders the configuration of one HAProxy instance.
func haproxyText(listen string, maxconn int, reps []*replicaProc) string {
	var servers strings.Builder
	for _, r := range reps {
		_, hport, _ := strings.Cut(r.httpAddr, ":")
		fmt.Fprintf(&servers, "    server %s %s check port %s\n", r.id, r.opampAddr, hport)
	}
	return strings.NewReplacer("{{MAXCONN}}", strconv.Itoa(maxconn), "{{LISTEN}}", listen, "{{SERVERS}}", servers.String()).Replace(haproxyConfig)
}

// haproxyBinary finds haproxy (Debian installs it in /usr/sbin).
func haproxyBinary() (string, error) {
	if p, err := exec.LookPath("haproxy"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/haproxy"); err == nil {
		return "/usr/sbin/haproxy", nil
	}
	return "", errors.New("haproxy is not installed (apt-get install haproxy)")
}

// startHAProxy writes the configuration to dir and starts haproxy in the
// foreground; it returns once the listener accepts. A port taken by
// another process meanwhile (a shared machine) is replaced, up to three
// times.
func startHAProxy(ctx context.Context, dir, name string, maxconn int, reps []*replicaProc, logw io.Writer) (*proc, string, error) {
	var err error
	for range 3 {
		var p *proc
		var listen string
		if p, listen, err = startHAProxyOnce(ctx, dir, name, maxconn, reps, logw); err == nil {
			return p, listen, nil
		}
	}
	return nil, "", err
}

func startHAProxyOnce(ctx context.Context, dir, name string, maxconn int, reps []*replicaProc, logw io.Writer) (*proc, string, error) {
	bin, err := haproxyBinary()
	if err != nil {
		return nil, "", err
	}
	listen, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	cfg := filepath.Join(dir, name+".cfg")
	if err := os.WriteFile(cfg, []byte(haproxyText(listen, maxconn, reps)), 0o644); err != nil {
		return nil, "", err
	}
	if out, err := exec.CommandContext(ctx, bin, "-c", "-q", "-f", cfg).CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("haproxy -c %s: %v: %s", cfg, err, out)
	}
	cmd := exec.Command(bin, "-db", "-f", cfg)
	cmd.Stdout, cmd.Stderr = &prefixWriter{prefix: "[" + name + "] ", w: logw}, &prefixWriter{prefix: "[" + name + "] ", w: logw}
	p, err := startProc(cmd)
	if err != nil {
		return nil, "", err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if resp, err := http.Get("http://" + listen + "/"); err == nil {
			resp.Body.Close()
			return p, listen, nil
		}
		if p.exited() || time.Now().After(deadline) {
			p.signalWait(syscall.SIGTERM, time.Second)
			return nil, "", fmt.Errorf("haproxy %s did not start listening on %s (see its log)", cfg, listen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// loadProc is this program re-executed as `scale-agents`: it holds its
// agents and answers status requests on its stdin with JSON lines.
type loadProc struct {
	*proc
	stdin io.WriteCloser
	mu    sync.Mutex
	lines *bufio.Scanner
}

// agentStatus is a load process's answer to "status".
type agentStatus struct {
	Event     string `json:"event"`
	Agents    int    `json:"agents"`
	WS        int    `json:"ws"`
	Connected int    `json:"connected"`
	Connects  int64  `json:"connects"`
	Failures  int64  `json:"failures"`
	// Revs counts, per revision marker, the agents that received it once
	// and those that received it more than once.
	Revs map[string][2]int `json:"revs"`
}

type loadOptions struct {
	url, secret       string
	agents, httpEvery int
	rate              int
	heartbeat, poll   time.Duration
	attrs             map[string]string
	startIndex        int
}

func startLoadProc(self string, o loadOptions, logw io.Writer) (*loadProc, error) {
	args := []string{"scale-agents", "--url", o.url, "--secret", o.secret, "--agents", strconv.Itoa(o.agents),
		"--http-every", strconv.Itoa(o.httpEvery), "--rate", strconv.Itoa(o.rate), "--heartbeat", o.heartbeat.String(),
		"--poll", o.poll.String(), "--start-index", strconv.Itoa(o.startIndex)}
	for k, v := range o.attrs {
		args = append(args, "--attr", k+"="+v)
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = logw
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p, err := startProc(cmd)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	return &loadProc{proc: p, stdin: in, lines: sc}, nil
}

// status asks the load process for its agents' state.
func (l *loadProc) status() (agentStatus, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var st agentStatus
	if _, err := io.WriteString(l.stdin, "status\n"); err != nil {
		return st, err
	}
	for l.lines.Scan() {
		if err := json.Unmarshal(l.lines.Bytes(), &st); err == nil && st.Event == "status" {
			return st, nil
		}
	}
	return st, fmt.Errorf("load process %d ended: %v", l.pid(), l.lines.Err())
}

// close stops the agents (stdin closed) and waits for the process.
func (l *loadProc) close() {
	_ = l.stdin.Close()
	select {
	case <-l.done:
	case <-time.After(2 * time.Minute):
		_ = l.cmd.Process.Kill()
		<-l.done
	}
}

// procSample is what /proc says of a set of processes.
type procSample struct {
	at       time.Time
	cpuTicks float64
	rss      float64 // bytes
}

// clockTicks is USER_HZ, 100 on Linux.
const clockTicks = 100

// readProc samples process pid.
func readProc(pid int) (procSample, error) {
	s := procSample{at: time.Now()}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// Fields after the command name in parentheses: state is 3rd,
	// utime the 14th and stime the 15th.
	rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 22 {
		return s, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	s.cpuTicks = ut + st
	st2, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for line := range strings.SplitSeq(string(st2), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			s.rss = kb * 1024
		}
	}
	return s, nil
}

// ppidOf is the parent of pid (0 if it is gone).
func ppidOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if len(f) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(f[1])
	return p
}

// readPostgres samples the postmaster of the cluster in dataDir and all
// its children (backends, checkpointer, walwriter…). A backend that ended
// between two samples takes its CPU with it: the figure is a floor.
func readPostgres(dataDir string) (procSample, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return procSample{}, err
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return procSample{}, fmt.Errorf("postmaster.pid: %w", err)
	}
	total, err := readProc(pm)
	if err != nil {
		return total, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return total, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == pm || ppidOf(pid) != pm {
			continue
		}
		if s, err := readProc(pid); err == nil {
			total.cpuTicks += s.cpuTicks
			total.rss += s.rss
		}
	}
	return total, nil
}

// cpuPct is the CPU of the interval between two samples, in percent of
// one core.
func cpuPct(a, b procSample) float64 {
	dt := b.at.Sub(a.at).Seconds()
	if dt <= 0 {
		return 0
	}
	return 100 * (b.cpuTicks - a.cpuTicks) / clockTicks / dt
}

// newSelfCmd runs this program again with args.
func newSelfCmd(self string, args ...string) *exec.Cmd { return exec.Command(self, args...) }

// prefixWriter prefixes each write (a log line) with the process's name.
type prefixWriter struct {
	prefix string
	w      io.Writer
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	if _, err := p.w.Write(append([]byte(p.prefix), b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}
