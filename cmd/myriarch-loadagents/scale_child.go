package main

// The child processes of the scale command: a load process holding a share
// of the agents (scale-agents), and a bare opamp-go server (bare-server),
// the yardstick for myriarchd's memory and CPU per agent.

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/open-telemetry/opamp-go/protobufs"
	"github.com/open-telemetry/opamp-go/server"
	"github.com/open-telemetry/opamp-go/server/types"

	"github.com/myriarch/myriarch/internal/cli"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
)

func init() {
	commands.Register(cli.Command{Name: "scale-agents", Summary: "(started by scale) hold a share of the agents; answer \"status\" on stdin",
		Run: func(args []string, stdout, stderr io.Writer) int {
			return exitOf(stderr, "scale-agents", runScaleAgents(context.Background(), args, os.Stdin, stdout, stderr))
		}})
	commands.Register(cli.Command{Name: "bare-server", Summary: "(started by scale) a bare opamp-go server that accepts every agent; stops when stdin closes",
		Run: func(args []string, stdout, stderr io.Writer) int {
			return exitOf(stderr, "bare-server", runBareServer(args, os.Stdin, stdout, stderr))
		}})
}

func exitOf(stderr io.Writer, name string, err error) int {
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		return cli.ExitUsage
	default:
		fmt.Fprintf(stderr, "myriarch-loadagents %s: %v\n", name, err)
		return 1
	}
}

// revMarker starts the line of a revision body that names it; the load
// processes count the copies of each revision every agent received.
const revMarker = "# scale-rev "

// attrFlags is a repeatable --attr k=v.
type attrFlags map[string]string

func (a attrFlags) String() string { return fmt.Sprint(map[string]string(a)) }
func (a attrFlags) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("--attr %q: want key=value", s)
	}
	a[k] = v
	return nil
}

func runScaleAgents(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("scale-agents", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "ws:// or http:// host:port of the OpAMP endpoint (the path /v1/opamp is added)")
	secret := fs.String("secret", "", "enrollment secret")
	n := fs.Int("agents", 0, "agents to hold")
	httpEvery := fs.Int("http-every", 0, "every Nth agent polls over plain HTTP (0: none)")
	rate := fs.Int("rate", 500, "agents started per second")
	hb := fs.Duration("heartbeat", 30*time.Second, "WebSocket heartbeat interval")
	poll := fs.Duration("poll", 10*time.Second, "plain-HTTP poll interval")
	startIndex := fs.Int("start-index", 0, "load.index of the first agent")
	attrs := attrFlags{}
	fs.Var(attrs, "attr", "identifying attribute key=value (repeatable)")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *n < 1 || *n > 18000 {
		return usageError{fmt.Errorf("--agents %d: must be within [1, 18000] (one descriptor per agent, 20,000 per process)", *n)}
	}
	host := strings.TrimPrefix(strings.TrimPrefix(*url, "ws://"), "http://")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := &emitter{w: stdout}

	var mu sync.Mutex
	ags := make([]*fleettest.Agent, 0, *n)
	ws := 0
	startErr := 0
	started := make(chan struct{})
	go func() {
		defer close(started)
		tick := time.NewTicker(time.Second / time.Duration(max(1, *rate)))
		defer tick.Stop()
		for i := 0; i < *n && ctx.Err() == nil; i++ {
			<-tick.C
			at := map[string]string{"load.index": strconv.Itoa(*startIndex + i)}
			for k, v := range attrs {
				at[k] = v
			}
			// The agents present the enrollment secret at every connection:
			// with Credential (take the credential myriarchd offers) each
			// one reconnects once more, which at 1,000 agents on the loaded
			// machine kept a quarter of them from coming online in 2 min.
			o := fleettest.AgentOptions{URL: "ws://" + host + "/v1/opamp", Secret: *secret, Heartbeat: *hb, Attrs: at}
			if *httpEvery > 0 && i%*httpEvery == *httpEvery-1 {
				o.URL, o.HTTP, o.Heartbeat = "http://"+host+"/v1/opamp", true, *poll
			}
			a, err := fleettest.StartAgent(ctx, o)
			mu.Lock()
			if err != nil {
				startErr++
			} else {
				ags = append(ags, a)
				if !o.HTTP {
					ws++
				}
			}
			mu.Unlock()
		}
	}()
	defer func() {
		cancel()
		<-started
		sctx, c := context.WithTimeout(context.Background(), time.Minute)
		defer c()
		var wg sync.WaitGroup
		sem := make(chan struct{}, 256)
		for _, a := range ags {
			sem <- struct{}{}
			wg.Go(func() { defer func() { <-sem }(); _ = a.Stop(sctx) })
		}
		wg.Wait()
	}()

	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		switch strings.TrimSpace(sc.Text()) {
		case "status":
			mu.Lock()
			list := append([]*fleettest.Agent(nil), ags...)
			st := map[string]any{"event": "status", "agents": len(list), "ws": ws, "start_errors": startErr}
			mu.Unlock()
			conn, connects, failures := 0, int64(0), int64(0)
			revs := map[string][2]int{}
			for _, a := range list {
				c := a.Connects()
				if c > 0 {
					conn++
				}
				connects += c
				failures += a.ConnectFailures()
				per := map[string]int{}
				for _, body := range a.Configs() {
					if _, r, ok := strings.Cut(body, revMarker); ok {
						r, _, _ = strings.Cut(r, "\n")
						per[r]++
					}
				}
				for r, k := range per {
					v := revs[r]
					if k == 1 {
						v[0]++
					} else {
						v[1]++
					}
					revs[r] = v
				}
			}
			st["connected"], st["connects"], st["failures"], st["revs"] = conn, connects, failures, revs
			out.emit(st)
		case "stop":
			return nil
		}
	}
	return sc.Err()
}

// runBareServer serves OpAMP with opamp-go's server and nothing else: every
// connection is accepted, every message answered with an empty reply.
func runBareServer(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bare-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "listen address")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	addr := *listen
	if strings.HasSuffix(addr, ":0") {
		a, err := freeAddr()
		if err != nil {
			return err
		}
		addr = a
	}
	srv := server.New(nil)
	cb := types.ConnectionCallbacks{
		OnMessage: func(_ context.Context, _ types.Connection, m *protobufs.AgentToServer) *protobufs.ServerToAgent {
			return &protobufs.ServerToAgent{InstanceUid: m.InstanceUid}
		},
	}
	err := srv.Start(server.StartSettings{ListenEndpoint: addr, Settings: server.Settings{Callbacks: types.Callbacks{
		OnConnecting: func(*http.Request) types.ConnectionResponse {
			return types.ConnectionResponse{Accept: true, ConnectionCallbacks: cb}
		},
	}}})
	if err != nil {
		return err
	}
	(&emitter{w: stdout}).emit(map[string]any{"event": "listening", "addr": addr})
	_, _ = io.Copy(io.Discard, stdin)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return srv.Stop(ctx)
}
