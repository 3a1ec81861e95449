package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/bridge/procs"
	"github.com/myriarch/myriarch/internal/bridge/spool"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/sqlitestore"
)

// The bridge runs in a child process of the benchmark (this test binary
// re-executed with childEnv set) so that its CPU time is its own, not the
// publisher's and subscriber's.
const childEnv = "MYRIARCH_BENCH_BRIDGE"

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(bridgeChild(spec))
	}
	if os.Getenv(busyEnv) != "" {
		os.Exit(busyChild())
	}
	os.Exit(m.Run())
}

// bridgeChild runs startBridge for spec "a dst clientID exclusive routes
// [nostamps] [spool=FSYNC]" (nostamps: an exclusive session without the
// fencing stamps, to measure what they cost at the brokers and the
// subscriber; spool=: a durable file spool on the route), says
// "ready" on stdout once the session is at full service, and stops when
// stdin closes.
func bridgeChild(spec string) int {
	f := strings.Fields(spec)
	stamps, spoolFsync := true, ""
	for len(f) > 5 {
		switch opt := f[len(f)-1]; {
		case opt == "nostamps":
			stamps = false
		case strings.HasPrefix(opt, "spool="):
			spoolFsync = strings.TrimPrefix(opt, "spool=")
		default:
			fmt.Fprintln(os.Stderr, "bad spec", spec)
			return 2
		}
		f = f[:len(f)-1]
	}
	if len(f) != 5 {
		fmt.Fprintln(os.Stderr, "bad spec", spec)
		return 2
	}
	// GOMAXPROCS as the bridge command sizes it (cmd/myriarch-bridge).
	defer procs.Start()()
	var own *lease.Ownership
	if f[3] == "true" {
		dir, err := os.MkdirTemp("", "bench-lease")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		o, stop, err := ownershipIn(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer stop()
		own = o
	}
	routes, _ := strconv.Atoi(f[4])
	stop, err := startBridgeSpool(f[0], f[1], f[2], own, fencing{checks: own != nil, stamps: own != nil && stamps}, routes, spoolFsync)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if prof := os.Getenv("MYRIARCH_BENCH_CPUPROFILE"); prof != "" {
		// Profiling the bridge: MYRIARCH_BENCH_CPUPROFILE=file make bench
		// writes one profile per bridge process (file.<pid>).
		if pf, err := os.Create(fmt.Sprintf("%s.%d", prof, os.Getpid())); err == nil {
			if pprof.StartCPUProfile(pf) == nil {
				defer pf.Close()
				defer pprof.StopCPUProfile()
			}
		}
	}
	// MYRIARCH_BENCH_TRACE=file make bench writes an execution trace of
	// each bridge process's paced phase (file.<pid>): which goroutines
	// wake per message, and why (go tool trace -pprof=net|sync|sched).
	var traceFile *os.File
	if prof := os.Getenv("MYRIARCH_BENCH_TRACE"); prof != "" {
		if tf, err := os.Create(fmt.Sprintf("%s.%d", prof, os.Getpid())); err == nil {
			traceFile = tf
			defer tf.Close()
		}
	}
	if prof := os.Getenv("MYRIARCH_BENCH_MEMPROFILE"); prof != "" {
		// MYRIARCH_BENCH_MEMPROFILE=file make bench writes the allocation
		// profile of each bridge process (file.<pid>) when it stops.
		defer func() {
			if pf, err := os.Create(fmt.Sprintf("%s.%d", prof, os.Getpid())); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(pf, 0)
				_ = pf.Close()
			}
		}()
	}
	fmt.Println("ready")
	// Each line on stdin asks for the number of heap allocations so far
	// (the benchmark's allocations per message); EOF stops the bridge.
	in := bufio.NewScanner(os.Stdin)
	for asked := 0; in.Scan(); asked++ {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		// The first request comes before the paced phase, the second
		// after it.
		switch {
		case traceFile != nil && asked == 0:
			_ = trace.Start(traceFile)
		case traceFile != nil && asked == 1:
			trace.Stop()
		}
		fmt.Println(ms.Mallocs)
	}
	stop()
	if own != nil && !own.Valid() {
		fmt.Fprintln(os.Stderr, "the tenure ended during the benchmark")
		return 1
	}
	return 0
}

// ownershipIn runs a lease manager on a sqlite store in dir and returns
// its tenure, valid for an hour.
func ownershipIn(dir string) (*lease.Ownership, func(), error) {
	st, err := sqlitestore.Open(context.Background(), filepath.Join(dir, "lease.db"), sqlitestore.Options{})
	if err != nil {
		return nil, nil, err
	}
	c, _, err := failover.ResolveCadence(failover.LeaseConfig{LeaseTTL: time.Hour})
	if err != nil {
		return nil, nil, err
	}
	owned := make(chan *lease.Ownership, 1)
	m, err := lease.New(lease.Config{Store: st, Session: "bench/s", InstanceID: "bench", Cadence: c,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnOwner: func(o *lease.Ownership) {
			owned <- o
			<-o.Stopping()
		}})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	stop := func() { cancel(); <-done; _ = st.Close() }
	select {
	case o := <-owned:
		return o, stop, nil
	case <-time.After(30 * time.Second):
		stop()
		return nil, nil, fmt.Errorf("no lease within 30s")
	}
}

// child is a bridge child process.
type child struct {
	pid int
	in  io.Writer
	out *bufio.Reader
}

// mallocs asks the child for its heap allocations so far.
func (c *child) mallocs() int64 {
	if c == nil {
		return 0
	}
	if _, err := fmt.Fprintln(c.in, "stats"); err != nil {
		return 0
	}
	line, err := c.out.ReadString('\n')
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	return n
}

// kind is the session a bridge child runs.
type kind int

const (
	ephemeral kind = iota
	exclusive
	// exclusiveNoStamps: an exclusive session (tenure, point-of-action
	// checks) whose messages carry no fencing stamp: only to measure what
	// the ~60 bytes of stamp properties per PUBLISH cost.
	exclusiveNoStamps
	// ephemeralSpoolInterval and ephemeralSpoolAlways: an ephemeral
	// session whose route has a durable file spool (fsync interval,
	// always).
	ephemeralSpoolInterval
	ephemeralSpoolAlways
)

// bridgeProcess starts the bridge as a child process with routes routes
// (see startBridgeErr) and, unless gomaxprocs is empty, that GOMAXPROCS.
func bridgeProcess(b *testing.B, a, dst, clientID string, k kind, routes int, gomaxprocs string) *child {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	spec := fmt.Sprintf("%s %s %s %v %d", a, dst, clientID, k == exclusive || k == exclusiveNoStamps, routes)
	switch k {
	case exclusiveNoStamps:
		spec += " nostamps"
	case ephemeralSpoolInterval:
		spec += " spool=" + spool.FsyncInterval
	case ephemeralSpoolAlways:
		spec += " spool=" + spool.FsyncAlways
	}
	cmd.Env = append(os.Environ(), childEnv+"="+spec)
	if gomaxprocs == "" {
		// Runtime experiments on the bridge alone, not the publisher
		// and subscriber: MYRIARCH_BENCH_BRIDGE_GOMAXPROCS=1 make bench.
		gomaxprocs = os.Getenv("MYRIARCH_BENCH_BRIDGE_GOMAXPROCS")
	}
	if gomaxprocs != "" {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+gomaxprocs)
	}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = in.Close()
		if err := cmd.Wait(); err != nil {
			b.Errorf("bridge process: %v", err)
		}
	})
	rd := bufio.NewReader(out)
	line, err := rd.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		b.Fatalf("bridge process did not start: %q %v", line, err)
	}
	return &child{pid: cmd.Process.Pid, in: in, out: rd}
}

// cpuTime is the CPU time that process pid has used so far: the sum of
// its threads' run time from /proc/<pid>/task/*/schedstat (nanoseconds,
// finer than the 10 ms ticks of /proc/<pid>/stat).
func cpuTime(pid int) time.Duration {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum int64
	for _, t := range tasks {
		raw, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		if f := strings.Fields(string(raw)); len(f) > 0 {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			sum += n
		}
	}
	return time.Duration(sum)
}

// procCounts are process pid's read and write system calls
// (/proc/<pid>/io syscr + syscw) and its threads' context switches
// (voluntary and not, /proc/<pid>/task/*/status): counts that the load of a
// shared machine does not distort the way it distorts times.
func procCounts(pid int) (syscalls, switches int64) {
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	for _, l := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && (k == "syscr" || k == "syscw") {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			syscalls += n
		}
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		raw, _ := os.ReadFile(t)
		for _, l := range strings.Split(string(raw), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				switches += n
			}
		}
	}
	return syscalls, switches
}

// loadavg is the one-minute load average, reported next to the figures
// because the machine is shared.
func loadavg() float64 {
	raw, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// row is one path of the comparison.
type row struct {
	name string
	r    result
	// bridgeCPU is the CPU of the bridging process per message at the
	// paced rate (µs); destCPU is broker B's (µs), which for mosquitto's
	// bridge includes the bridge.
	bridgeCPU, destCPU float64
	// syscalls and switches are the bridging process's read/write system
	// calls and context switches per message at the paced rate; allocs
	// its heap allocations per message (myriarch-bridge only).
	syscalls, switches, allocs float64
}

// BenchmarkCompare measures, in one run, the four paths that the
// throughput table in docs/bridge.md shows: direct (one mosquitto, the
// ceiling); mosquitto's own bridge (broker B bridging in/# from broker A);
// myriarch-bridge with an ephemeral session; myriarch-bridge on an
// exclusive session (lease tenure on sqlite, point-of-action checks,
// fencing stamps). It prints the table with the ratio against mosquitto's
// bridge and the load average.
//
//	make bench
func BenchmarkCompare(b *testing.B) {
	mosquittoExe(b)
	for range b.N {
		compare(b, "")
	}
}

// BenchmarkCompareBusy is BenchmarkCompare with one core kept busy by
// another process (a busy loop at nice 0, pinned to CPU 0 where taskset
// is installed) for the whole run: how each path's p99 at 5,000 msg/s
// holds up on a busy host, against mosquitto's bridge in the same run.
//
//	make bench BENCH=CompareBusy
func BenchmarkCompareBusy(b *testing.B) {
	mosquittoExe(b)
	stop := busyProcess(b)
	defer stop()
	for range b.N {
		compare(b, "one core kept busy by another process (a busy loop at nice 0"+pinned+")")
	}
}

// compare measures and prints the rows of BenchmarkCompare; note says
// what else ran on the machine.
func compare(b *testing.B, note string) {
	load0 := loadavg()
	var rows []row

	a, apid := mosquitto(b, "")
	r, _, destCPU, _, _, _ := measureCPU(b, a, a, "in/#", routeTopics(1), 0, apid, nil)
	rows = append(rows, row{name: "direct (one broker, the ceiling)", r: r, destCPU: destCPU})

	a, _ = mosquitto(b, "")
	dst, dpid := mosquitto(b, mosquittoBridge(a))
	r, destCPU, _, sc, sw, _ := measureCPU(b, a, dst, "out/#", routeTopics(1), dpid, dpid, nil)
	rows = append(rows, row{name: "mosquitto's own bridge (inside broker B)", r: r, bridgeCPU: destCPU, destCPU: destCPU, syscalls: sc, switches: sw})

	for _, k := range []kind{ephemeral, exclusive, exclusiveNoStamps} {
		a, _ = mosquitto(b, "")
		dst, dpid = mosquitto(b, "")
		ch := bridgeProcess(b, a, dst, fmt.Sprintf("cmp-%d", k), k, 1, "")
		r, bridgeCPU, destCPU, sc, sw, al := measureCPU(b, a, dst, "out/#", routeTopics(1), ch.pid, dpid, ch)
		name := map[kind]string{
			ephemeral:         "myriarch-bridge (ephemeral session, one mqtt sender)",
			exclusive:         "myriarch-bridge (exclusive session: tenure checks, fencing stamps)",
			exclusiveNoStamps: "myriarch-bridge (exclusive session without the stamps: what they cost, not a mode)",
		}[k]
		rows = append(rows, row{name: name, r: r, bridgeCPU: bridgeCPU, destCPU: destCPU, syscalls: sc, switches: sw, allocs: al})
	}
	if note != "" {
		fmt.Printf("\n%s\n", note)
	}
	printTable(rows, load0, loadavg())
	mosq := rows[1]
	for _, rw := range rows[2:] {
		if rw.r.outOfOrder+rw.r.pacedOutOfOrd > 0 {
			b.Errorf("%s: %d messages out of order", rw.name, rw.r.outOfOrder+rw.r.pacedOutOfOrd)
		}
	}
	fmt.Printf("p99 at %d msg/s against mosquitto's bridge: ephemeral %.2f×, exclusive %.2f×; exclusive rate %.2f× the ephemeral's\n",
		pacedRate, rows[2].r.p99/mosq.r.p99, rows[3].r.p99/mosq.r.p99, rows[3].r.rate/rows[2].r.rate)
	b.ReportMetric(rows[2].r.rate/mosq.r.rate, "throughput-vs-mosquitto-bridge")
	b.ReportMetric(rows[2].r.p50, "p50-ms@5k/s")
	b.ReportMetric(rows[2].r.p99, "p99-ms@5k/s")
	b.ReportMetric(rows[2].r.p99/mosq.r.p99, "p99-vs-mosquitto-bridge")
	b.ReportMetric(rows[3].r.p99/mosq.r.p99, "exclusive-p99-vs-mosquitto-bridge")
	b.ReportMetric(rows[2].bridgeCPU, "bridge-cpu-us/msg")
	b.ReportMetric(rows[3].bridgeCPU, "exclusive-bridge-cpu-us/msg")
	b.ReportMetric(rows[4].bridgeCPU, "exclusive-nostamps-bridge-cpu-us/msg")
	b.ReportMetric(mosq.bridgeCPU, "mosquitto-bridge-cpu-us/msg")
	b.ReportMetric(rows[2].syscalls, "bridge-syscalls/msg")
	b.ReportMetric(rows[2].allocs, "bridge-allocs/msg")
}

// busyEnv makes this test binary a busy loop (busyChild).
const busyEnv = "MYRIARCH_BENCH_BUSY"

// pinned says where busyProcess pinned the loop.
var pinned = ""

var busySink uint64

// busyChild spins on one goroutine until its stdin closes.
func busyChild() int {
	runtime.GOMAXPROCS(1)
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	for x := uint64(1); ; x = x*6364136223846793005 + 1 {
		select {
		case <-done:
			busySink = x // keeps the loop's work from being optimized out
			return 0
		default:
		}
	}
}

// busyProcess starts the busy loop (pinned to CPU 0 with taskset when it
// is installed) and returns its stop.
func busyProcess(b *testing.B) (stop func()) {
	b.Helper()
	name, args := os.Args[0], []string{"-test.run=^$"}
	if ts, err := exec.LookPath("taskset"); err == nil {
		name, args = ts, append([]string{"-c", "0", os.Args[0]}, args...)
		pinned = ", pinned to CPU 0"
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), busyEnv+"=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return func() {
		_ = in.Close()
		_ = cmd.Wait()
	}
}

// measureCPU measures one path and the CPU per message of the bridging
// process (pid, 0 for none) and of the destination broker (dpid) while
// the paced phase runs, and the heap allocations per message of ch (a
// myriarch-bridge child; nil for none), the publisher sending to topics in
// turn.
func measureCPU(b *testing.B, pubURL, subURL, filter string, topics []string, pid, dpid int, ch *child) (r result, bridgeUS, destUS, syscalls, switches, allocs float64) {
	var p0, d0 time.Duration
	var sc0, sw0, m0 int64
	var perf *perfStat
	r = measureWith(b, pubURL, subURL, filter, topics, func() {
		m0 = ch.mallocs()
		p0, d0 = cpuTime(pid), cpuTime(dpid)
		sc0, sw0 = procCounts(pid)
		perf = startPerf(b, pid)
	}, func() {
		perf.stop(b, pid)
		if pid != 0 {
			bridgeUS = float64((cpuTime(pid) - p0).Microseconds()) / pacedN
			sc, sw := procCounts(pid)
			syscalls, switches = float64(sc-sc0)/pacedN, float64(sw-sw0)/pacedN
		}
		destUS = float64((cpuTime(dpid) - d0).Microseconds()) / pacedN
		if ch != nil {
			allocs = float64(ch.mallocs()-m0) / pacedN
		}
	})
	return r, bridgeUS, destUS, syscalls, switches, allocs
}

func printTable(rows []row, load0, load1 float64) {
	fmt.Printf("\nQoS 1, %d-byte payloads, up to %d in flight, loopback, mosquitto brokers; load average %.1f → %.1f on %d-core machine\n\n",
		payloadSize, window, load0, load1, numCPU())
	fmt.Println("| path | max msg/s | vs mosquitto's bridge | p50 at 5k msg/s | p99 at 5k msg/s | bridge CPU per message at 5k msg/s | broker B CPU per message | bridge read+write syscalls per message | bridge context switches per message | bridge heap allocations per message | out of order |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|")
	mosq := rows[1]
	for i, rw := range rows {
		ratio, cpu := "–", "–"
		if i > 0 {
			ratio = fmt.Sprintf("%.2f×", rw.r.rate/mosq.r.rate)
		}
		if rw.bridgeCPU > 0 {
			cpu = fmt.Sprintf("%.1f µs (%.0f %% of a core)", rw.bridgeCPU, rw.bridgeCPU*pacedRate/1e4)
		}
		sc, sw, al := "–", "–", "–"
		if rw.syscalls > 0 {
			sc, sw = fmt.Sprintf("%.2f", rw.syscalls), fmt.Sprintf("%.2f", rw.switches)
		}
		if rw.allocs > 0 {
			al = fmt.Sprintf("%.1f", rw.allocs)
		}
		fmt.Printf("| %s | %.0f | %s | %.2f ms | %.2f ms | %s | %.1f µs | %s | %s | %s | %d |\n", rw.name, rw.r.rate, ratio, rw.r.p50, rw.r.p99,
			cpu, rw.destCPU, sc, sw, al, rw.r.outOfOrder+rw.r.pacedOutOfOrd)
	}
	fmt.Println()
}

// BenchmarkProcs measures myriarch-bridge with several routes in one
// process (MYRIARCH_BENCH_ROUTES, 4 unless set: each route its own session
// and its own mqtt sender, the publisher sending to their topics in turn)
// as the bridge command runs it (GOMAXPROCS sized by package procs), with
// GOMAXPROCS=1 and with GOMAXPROCS at the number of CPUs (the Go runtime's
// default), beside direct and mosquitto's own bridge in the same run: the
// measurement behind the bridge's GOMAXPROCS controller.
//
//	make bench BENCH=Procs
func BenchmarkProcs(b *testing.B) {
	mosquittoExe(b)
	routes := 4
	if v, err := strconv.Atoi(os.Getenv("MYRIARCH_BENCH_ROUTES")); err == nil && v > 0 {
		routes = v
	}
	topics := routeTopics(routes)
	for range b.N {
		load0 := loadavg()
		var rows []row

		a, apid := mosquitto(b, "")
		r, _, destCPU, _, _, _ := measureCPU(b, a, a, "in/#", topics, 0, apid, nil)
		rows = append(rows, row{name: "direct (one broker, the ceiling)", r: r, destCPU: destCPU})

		a, _ = mosquitto(b, "")
		dst, dpid := mosquitto(b, mosquittoBridge(a))
		r, destCPU, _, sc, sw, _ := measureCPU(b, a, dst, "out/#", topics, dpid, dpid, nil)
		rows = append(rows, row{name: "mosquitto's own bridge (inside broker B)", r: r, bridgeCPU: destCPU, destCPU: destCPU, syscalls: sc, switches: sw})

		for _, n := range []string{"", "1", strconv.Itoa(runtime.NumCPU())} {
			a, _ = mosquitto(b, "")
			dst, dpid = mosquitto(b, "")
			ch := bridgeProcess(b, a, dst, "procs-"+n, ephemeral, routes, n)
			r, bridgeCPU, destCPU, sc, sw, al := measureCPU(b, a, dst, "out/#", topics, ch.pid, dpid, ch)
			name := fmt.Sprintf("myriarch-bridge, %d routes, GOMAXPROCS=%s", routes, n)
			if n == "" {
				name = fmt.Sprintf("myriarch-bridge, %d routes, default (GOMAXPROCS by load)", routes)
			}
			rows = append(rows, row{name: name, r: r, bridgeCPU: bridgeCPU, destCPU: destCPU, syscalls: sc, switches: sw, allocs: al})
		}
		printTable(rows, load0, loadavg())
		for _, rw := range rows[2:] {
			if rw.r.outOfOrder+rw.r.pacedOutOfOrd > 0 {
				b.Errorf("%s: %d messages out of order", rw.name, rw.r.outOfOrder+rw.r.pacedOutOfOrd)
			}
		}
	}
}

// perfStat is `perf stat` attached to a bridging process for the paced
// phase: MYRIARCH_BENCH_PERF_EVENTS=raw_syscalls:sys_enter,syscalls:sys_enter_clock_gettime
// make bench prints each event's count per paced message for every
// bridging process (perf from linux-perf, with tracepoints readable),
// which counts, for instance, all of a process's system calls where the
// table's column counts only reads and writes.
type perfStat struct {
	cmd *exec.Cmd
	out *strings.Builder
}

func startPerf(b *testing.B, pid int) *perfStat {
	events := os.Getenv("MYRIARCH_BENCH_PERF_EVENTS")
	if events == "" || pid == 0 {
		return nil
	}
	out := &strings.Builder{}
	cmd := exec.Command("perf", "stat", "-x", ",", "-e", events, "-p", strconv.Itoa(pid))
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		b.Fatalf("MYRIARCH_BENCH_PERF_EVENTS: %v", err)
	}
	time.Sleep(200 * time.Millisecond) // perf attaches before the phase starts
	return &perfStat{cmd: cmd, out: out}
}

func (p *perfStat) stop(b *testing.B, pid int) {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	_ = p.cmd.Wait()
	for _, l := range strings.Split(p.out.String(), "\n") {
		// CSV: count,unit,event,...
		f := strings.Split(l, ",")
		if len(f) < 3 {
			continue
		}
		n, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			b.Logf("perf on %d: %s", pid, l)
			continue
		}
		fmt.Printf("perf, process %d: %s %.2f per paced message\n", pid, f[2], n/pacedN)
	}
}
