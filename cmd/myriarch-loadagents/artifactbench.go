package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/artifacts/blobstore/s3test"
	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/pgtest"
)

func init() {
	commands.Register(cli.Command{
		Name:    "artifact-bench",
		Summary: "measure artifact prefetch into PostgreSQL and serving one artifact to N agents at once from two replicas",
		Run:     runArtifactBench,
	})
}

const artifactBenchUsage = `Usage: myriarch-loadagents artifact-bench [--size 200] [--agents 1000] [--serve-size 0] [--store postgres|s3] [--dsn URL] [--myriarchd PATH]
Starts a private PostgreSQL (unless --dsn names an empty database) and two
replicas as child processes (myriarchd serve). A local HTTP source serves a
release asset of --size MiB of pseudo-random bytes; the leader prefetches it
into a large object (time, throughput, the leader's peak RSS and CPU).
--store s3 stores it in S3 instead: an in-memory gofakes3 endpoint that
this command starts on loopback (it is not a production S3; its own work
runs in this process, not in the replicas). Then
--agents clients download it at once, half from each replica, with the
agents' credential (time, throughput, each replica's CPU and peak RSS).
--serve-size (MiB, 0 = --size) serves a second artifact of that size
instead, to keep the serving run short. Prints JSON lines.`

func runArtifactBench(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("artifact-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, artifactBenchUsage) }
	size := fs.Int("size", 200, "artifact size in MiB")
	agents := fs.Int("agents", 1000, "concurrent downloads")
	serveSize := fs.Int("serve-size", 0, "size in MiB of the artifact served to the agents (0: --size)")
	dsn := fs.String("dsn", "", "PostgreSQL of an empty database; default: a private one")
	bin := fs.String("myriarchd", "", "the myriarchd binary; default: next to this program, else in PATH")
	storeKind := fs.String("store", "postgres", "blob store: postgres, or s3 (a gofakes3 endpoint started by this command)")
	if err := fs.Parse(args); err != nil {
		return cli.ExitUsage
	}
	if *size < 1 || *agents < 1 || *agents > 5000 || *serveSize < 0 || (*storeKind != "postgres" && *storeKind != "s3") {
		fmt.Fprintln(stderr, "artifact-bench: --size must be at least 1, --agents within [1, 5000], --serve-size at least 0, --store postgres or s3")
		return cli.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := artifactBench(ctx, *bin, int64(*size)<<20, int64(*serveSize)<<20, *agents, *dsn, *storeKind, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "artifact-bench:", err)
		return 1
	}
	return 0
}

// benchContent is n pseudo-random bytes of a seed, generated as it is read.
type benchContent struct {
	r    *rand.ChaCha8
	left int64
}

func newBenchContent(seed byte, n int64) *benchContent {
	var s [32]byte
	s[0] = seed
	return &benchContent{r: rand.NewChaCha8(s), left: n}
}

func (c *benchContent) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, _ := c.r.Read(p)
	c.left -= int64(n)
	return n, nil
}

func benchDigest(seed byte, n int64) string {
	h := sha256.New()
	_, _ = io.CopyBuffer(h, newBenchContent(seed, n), make([]byte, 1<<20))
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

type benchReplica struct {
	cmd       *exec.Cmd
	http      string
	peakRSS   atomic.Int64
	stopWatch chan struct{}
	watchDone chan struct{}
}

func startBenchReplica(ctx context.Context, exe, id, dsn string, extra map[string]string, stderr io.Writer) (*benchReplica, error) {
	port := func() string {
		p, _ := pgtest.FreePort("127.0.0.1")
		return "127.0.0.1:" + strconv.Itoa(p)
	}
	r := &benchReplica{http: port()}
	settings := map[string]string{"database.url": dsn, "server.enrollmentSecret": benchSecret, "ha.replicaId": id,
		"server.httpListen": r.http, "server.opampListen": port(), "jobs.artifactPrefetchInterval": "1s", "log.level": "warn",
		// Thousands of new agents enroll from one address at once.
		"server.enrollmentsPerMinute": "1000000"}
	maps.Copy(settings, extra)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MYRIARCH_") {
			env = append(env, kv)
		}
	}
	for k, v := range settings {
		env = append(env, config.EnvName(k)+"="+v)
	}
	r.cmd = exec.CommandContext(ctx, exe, "serve")
	r.cmd.Env = env
	r.cmd.Stdout = io.Discard
	r.cmd.Stderr = stderr
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	if !fleettest.Eventually(time.Minute, func() bool { return strings.Contains(scrapeMetrics("http://"+r.http+"/metrics"), "\nmyriarch_leader ") }) {
		r.stop()
		return nil, fmt.Errorf("replica %s did not start", id)
	}
	return r, nil
}

// watch samples the replica's RSS (from /proc) until stopped.
func (r *benchReplica) watch() {
	r.peakRSS.Store(0)
	r.stopWatch, r.watchDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(r.watchDone)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if rss := procRSS(r.cmd.Process.Pid); rss > r.peakRSS.Load() {
				r.peakRSS.Store(rss)
			}
			select {
			case <-r.stopWatch:
				return
			case <-t.C:
			}
		}
	}()
}

func (r *benchReplica) unwatch() int64 { close(r.stopWatch); <-r.watchDone; return r.peakRSS.Load() }

func (r *benchReplica) cpu() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", r.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

func (r *benchReplica) stop() {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	_ = r.cmd.Wait()
}

func procRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

const benchSecret = "artifact-bench-secret-0123"

func artifactBench(ctx context.Context, exe string, size, serveSize int64, agents int, dsn, storeKind string, stdout, stderr io.Writer) error {
	if exe == "" {
		var err error
		if exe, err = findMyriarchd(); err != nil {
			return err
		}
	}
	if dsn == "" {
		pg, err := pgtest.Start(ctx, pgtest.Options{})
		if err != nil {
			return err
		}
		defer pg.Close()
		dsn = pg.DSN("")
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()

	// The source: a release asset generated as it is sent.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	src := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seed, n := byte(1), size
		if r.URL.Path == "/serve" {
			seed, n = 2, serveSize
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		_, _ = io.CopyBuffer(w, newBenchContent(seed, n), make([]byte, 1<<20))
	})}
	go func() { _ = src.Serve(l) }()
	defer src.Close()

	extra := map[string]string{}
	storeName := "postgres (large objects)"
	if storeKind == "s3" {
		s3 := s3test.New()
		defer s3.Close()
		const bucket = "artifact-bench"
		if err := s3.MakeBucket(ctx, bucket); err != nil {
			return err
		}
		extra = map[string]string{"artifacts.store": "s3", "artifacts.s3Endpoint": s3.Endpoint(), "artifacts.s3Bucket": bucket,
			"artifacts.s3Region": s3test.Region, "artifacts.s3AccessKey": s3test.AccessKey, "artifacts.s3SecretKey": s3test.SecretKey,
			"artifacts.s3Tls": "false"}
		storeName = "s3 (gofakes3 in memory, in this command's process, over loopback HTTP; not a production S3)"
	}
	fmt.Fprintln(stderr, "artifact-bench: blob store:", storeName)
	a, err := startBenchReplica(ctx, exe, "bench-a", dsn, extra, stderr)
	if err != nil {
		return err
	}
	defer a.stop()
	if !fleettest.Eventually(time.Minute, func() bool {
		return strings.Contains(scrapeMetrics("http://"+a.http+"/metrics"), "\nmyriarch_leader 1\n")
	}) {
		return errors.New("replica bench-a did not start leading")
	}
	b, err := startBenchReplica(ctx, exe, "bench-b", dsn, extra, stderr)
	if err != nil {
		return err
	}
	defer b.stop()

	record := func(path string, seed byte, n int64) (string, error) {
		d := benchDigest(seed, n)
		src := releases.Source{Name: "bench", Type: "github", Source: "bench/bench", PollInterval: 24 * time.Hour}
		if err := releases.AddPolledSource(ctx, pool, src); err != nil {
			return "", err
		}
		rel := releases.Release{Package: "bench", Version: "v" + path, PublishedAt: time.Now(),
			Assets: []releases.Asset{{Name: "agent", Digest: d, Size: n, URL: "http://" + l.Addr().String() + "/" + path}}}
		if err := releases.RecordRelease(ctx, pool, rel, 0); err != nil {
			return "", err
		}
		return d, nil
	}
	waitBlob := func(d string) error {
		if !fleettest.Eventually(30*time.Minute, func() bool {
			ok, _ := artifacts.BlobStored(ctx, pool, d)
			return ok
		}) {
			return fmt.Errorf("blob %s not stored", d)
		}
		return nil
	}

	// Prefetch.
	a.watch()
	cpu0 := a.cpu()

	digest, err := record("1.0.0", 1, size)
	if err != nil {
		return err
	}
	// From the moment the download's row appears (the job claimed it) to
	// the moment the verified blob's row is visible.
	if !fleettest.Eventually(time.Minute, func() bool {
		ok, _ := artifacts.DownloadRecorded(ctx, pool, digest)
		return ok
	}) {
		return errors.New("the download did not start")
	}
	started := time.Now()
	if err := waitBlob(digest); err != nil {
		return err
	}
	took := time.Since(started).Seconds()
	peak := a.unwatch()
	emitJSON(stdout, map[string]any{"event": "prefetch", "store": storeName, "bytes": size, "took_s": took, "mib_per_s": float64(size) / (1 << 20) / took,
		"leader_peak_rss_mb": float64(peak) / 1e6, "leader_cpu_s": a.cpu() - cpu0, "chunk_bytes": artifacts.ChunkSize})

	serveDigest := digest
	if serveSize > 0 {
		if serveDigest, err = record("serve", 2, serveSize); err != nil {
			return err
		}
		if err := waitBlob(serveDigest); err != nil {
			return err
		}
	} else {
		serveSize = size
	}

	// Serving: all agents at once, half from each replica, each with a
	// download token of its own as a package offer would carry it.
	tokens := make([]string, agents)
	issuer := artifacts.NewTokens(pool)
	for i := range tokens {
		if tokens[i], err = issuer.Issue(ctx, fmt.Sprintf("bench-agent-%d", i), serveDigest); err != nil {
			return err
		}
	}
	tr := &http.Transport{MaxIdleConnsPerHost: agents, MaxConnsPerHost: 0, DisableCompression: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	a.watch()
	b.watch()
	ca, cb := a.cpu(), b.cpu()
	var wg sync.WaitGroup
	var failures, total atomic.Int64
	var slowest atomic.Int64
	var firstErr atomic.Value
	fail := func(err string) {
		failures.Add(1)
		firstErr.CompareAndSwap(nil, err)
	}
	startGate := make(chan struct{})
	t1 := time.Now()
	for i := range agents {
		base := a.http
		if i%2 == 1 {
			base = b.http
		}
		wg.Go(func() {
			<-startGate
			s := time.Now()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+base+artifacts.PathPrefix+serveDigest, nil)
			req.Header.Set("Authorization", "Bearer "+tokens[i])
			resp, err := hc.Do(req)
			if err != nil {
				fail(err.Error())
				return
			}
			n, err := io.CopyBuffer(io.Discard, resp.Body, make([]byte, 256<<10))
			resp.Body.Close()
			total.Add(n)
			if err != nil || resp.StatusCode != 200 || n != serveSize {
				fail(fmt.Sprintf("%s: %d of %d bytes, error %v", resp.Status, n, serveSize, err))
				return
			}
			if d := time.Since(s).Nanoseconds(); d > slowest.Load() {
				slowest.Store(d)
			}
		})
	}
	close(startGate)
	wg.Wait()
	el := time.Since(t1).Seconds()
	pa, pb := a.unwatch(), b.unwatch()
	emitJSON(stdout, map[string]any{"event": "serve", "agents": agents, "replicas": 2, "artifact_bytes": serveSize, "failures": failures.Load(),
		"took_s": el, "slowest_agent_s": float64(slowest.Load()) / 1e9, "total_gib": float64(total.Load()) / (1 << 30),
		"mib_per_s":           float64(total.Load()) / (1 << 20) / el,
		"replica_a_cpu_cores": (a.cpu() - ca) / el, "replica_b_cpu_cores": (b.cpu() - cb) / el,
		"replica_a_peak_rss_mb": float64(pa) / 1e6, "replica_b_peak_rss_mb": float64(pb) / 1e6})
	if failures.Load() > 0 {
		return fmt.Errorf("%d of %d downloads failed; the first: %v", failures.Load(), agents, firstErr.Load())
	}
	return nil
}
