package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"time"

	"github.com/myriarch/myriarch/internal/faultnet"
)

func runProxy(ctx context.Context, args []string, out *emitter, stderr io.Writer) error {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:4400", "listen address")
	backends := fs.String("backends", "", "comma-separated backend addresses")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	bs := strings.Split(*backends, ",")
	if len(bs) == 0 || bs[0] == "" {
		return errors.New("--backends is required")
	}
	// Plain reads and writes with 8 KiB buffers: io.Copy between two
	// TCP connections splices through a pipe, two more file descriptors
	// per direction, which would triple the descriptors per agent.
	p, err := faultnet.ListenOn(*listen, faultnet.Options{BufferSize: 8 << 10, DialTimeout: 2 * time.Second}, bs...)
	if err != nil {
		return err
	}
	out.emit(map[string]any{"event": "proxy_listening", "listen": p.Addr(), "backends": bs})
	<-ctx.Done()
	return p.Close()
}

// runWait polls the database until n agents are online on replica and
// prints how long that took.
