package pgtest

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

func startupPacket(params ...string) []byte {
	var body []byte
	for _, p := range params {
		body = append(body, p...)
		body = append(body, 0)
	}
	body = append(body, 0)
	out := make([]byte, 8, 8+len(body))
	binary.BigEndian.PutUint32(out, uint32(8+len(body)))
	binary.BigEndian.PutUint32(out[4:], 196608)
	return append(out, body...)
}

func TestProxyRefusesParamAndFreezes(t *testing.T) {
	// A plain TCP echo server stands in for PostgreSQL: the proxy only
	// looks at the startup packet.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	p, err := NewProxy(ln.Addr().String(), "tcp_user_timeout")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// Refused: an ErrorResponse with SQLSTATE 22023, then EOF.
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(startupPacket("user", "postgres", "tcp_user_timeout", "6000")); err != nil {
		t.Fatal(err)
	}
	resp, _ := io.ReadAll(c)
	c.Close()
	if len(resp) == 0 || resp[0] != 'E' || !bytes.Contains(resp, []byte("C22023")) || !bytes.Contains(resp, []byte("tcp_user_timeout")) {
		t.Fatalf("refusal: %q", resp)
	}
	if p.Refused() != 1 {
		t.Fatalf("Refused = %d", p.Refused())
	}

	// Accepted: forwarded (the echo server returns the startup packet).
	c, err = net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sp := startupPacket("user", "postgres")
	if _, err := c.Write(sp); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(sp))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, sp) {
		t.Fatalf("forwarded: %q %v", got, err)
	}

	// Frozen: writes are accepted, nothing comes back, no EOF.
	p.Freeze()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	n, err := c.Read(make([]byte, 4))
	if ne, ok := err.(net.Error); n != 0 || !ok || !ne.Timeout() {
		t.Fatalf("frozen read: n=%d err=%v", n, err)
	}
}
