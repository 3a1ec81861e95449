package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	out.emit(map[string]any{"event": "proxy_listening", "listen": l.Addr().String(), "backends": bs})
	go func() { <-ctx.Done(); l.Close() }()
	var next atomic.Uint64
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		wg.Go(func() {
			defer c.Close()
			i := next.Add(1)
			var b net.Conn
			for k := range len(bs) {
				b, err = net.DialTimeout("tcp", bs[(int(i)+k)%len(bs)], 2*time.Second)
				if err == nil {
					break
				}
			}
			if b == nil {
				return
			}
			defer b.Close()
			done := make(chan struct{}, 2)
			// Plain copies: io.Copy between two TCP connections splices
			// through a pipe, two more file descriptors per direction,
			// which would triple the descriptors per agent.
			go func() { pipe(b, c); done <- struct{}{} }()
			go func() { pipe(c, b); done <- struct{}{} }()
			select {
			case <-done:
			case <-ctx.Done():
			}
			c.Close()
			b.Close()
			<-done
		})
	}
}

func pipe(dst, src net.Conn) {
	buf := make([]byte, 8<<10)
	_, _ = io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf)
	_ = dst.(*net.TCPConn).CloseWrite()
}

// runWait polls the database until n agents are online on replica and
// prints how long that took.
