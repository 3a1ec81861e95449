// Command myriarch-loadagents is the load tool of myriarchd: it connects
// many simulated agents (real opamp-go WebSocket clients) and measures the
// server, and it has a small TCP load balancer for the failover scenario.
//
//	myriarch-loadagents agents --url ws://127.0.0.1:4320/v1/opamp --secret S --agents 10000 \
//	    --metrics http://127.0.0.1:8080/metrics --dsn postgres://... --hold 90s
//	myriarch-loadagents proxy --listen 127.0.0.1:4400 --backends 127.0.0.1:4321,127.0.0.1:4322
//	myriarch-loadagents wait --dsn postgres://... --agents 6000 --replica r2
//
// Every command prints JSON lines.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/myriarch/myriarch/internal/cli"
)

var commands = &cli.Registry{Program: "myriarch-loadagents"}

func init() {
	commands.Register(command("agents", "connect simulated OpAMP agents and sample the server (JSON lines)", runAgents))
	commands.Register(command("proxy", "round-robin TCP balancer in front of the replicas", runProxy))
	commands.Register(command("wait", "wait until the surviving replica holds every agent (and leads)", runWait))
}

func main() { commands.Main() }

// usageError marks bad flags: exit status cli.ExitUsage.
type usageError struct{ error }

// command adapts a load command to cli.Command: SIGINT and SIGTERM cancel
// its context, bad flags exit with cli.ExitUsage, a failure with 1.
func command(name, summary string, run func(ctx context.Context, args []string, out *emitter, stderr io.Writer) error) cli.Command {
	return cli.Command{Name: name, Summary: summary, Run: func(args []string, stdout, stderr io.Writer) int {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		err := run(ctx, args, &emitter{w: stdout}, stderr)
		var ue usageError
		switch {
		case err == nil:
			return 0
		case errors.As(err, &ue):
			if errors.Is(ue.error, flag.ErrHelp) {
				return 0
			}
			return cli.ExitUsage
		default:
			fmt.Fprintf(stderr, "myriarch-loadagents %s: %v\n", name, err)
			return 1
		}
	}}
}

// emitter prints JSON lines with the time of the event.
type emitter struct {
	mu sync.Mutex
	w  io.Writer
}

func (e *emitter) emit(v map[string]any) {
	v["at"] = time.Now().UTC().Format(time.RFC3339Nano)
	b, _ := json.Marshal(v)
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintln(e.w, string(b))
}
