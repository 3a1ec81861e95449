package pgtest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"

	"github.com/myriarch/myriarch/internal/faultnet"
)

// Proxy is the fault proxy of package faultnet in front of a PostgreSQL
// server, which also reads each startup packet: it can freeze its
// connections (stop forwarding in both directions without closing
// anything, so neither side sees a FIN) and refuse startup packets that
// carry a given parameter, the way a server that does not support
// tcp_user_timeout does.
type Proxy struct {
	*faultnet.Proxy
	// Addr is the host:port the proxy listens on.
	Addr string

	refused atomic.Int64
}

// NewProxy listens on a free loopback port and forwards to target
// (host:port). refuseParam may be empty: when set, a startup packet that
// contains this parameter is answered with a FATAL ErrorResponse
// (SQLSTATE 22023) instead of being forwarded.
func NewProxy(target, refuseParam string) (*Proxy, error) {
	p := &Proxy{}
	fp, err := faultnet.Listen(faultnet.Options{Handshake: func(client net.Conn) ([]byte, error) {
		startup, refuse, err := readStartup(client, refuseParam)
		if err != nil {
			return nil, err
		}
		if refuse != "" {
			p.refused.Add(1)
			_, _ = client.Write(errorResponse("22023", fmt.Sprintf("invalid value for parameter %q: %q", refuseParam, refuse)))
			return nil, errors.New("refused")
		}
		return startup, nil
	}}, target)
	if err != nil {
		return nil, err
	}
	p.Proxy, p.Addr = fp, fp.Addr()
	return p, nil
}

// Refused returns how many startup packets the proxy refused.
func (p *Proxy) Refused() int { return int(p.refused.Load()) }

// readStartup reads the startup packet (answering an SSLRequest or
// GSSENCRequest with 'N') and returns its bytes and, when refuseParam is
// among its parameters, that parameter's value.
func readStartup(c net.Conn, refuseParam string) ([]byte, string, error) {
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return nil, "", err
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		code := binary.BigEndian.Uint32(hdr[4:])
		if n < 8 || n > 1<<16 {
			return nil, "", fmt.Errorf("pgtest proxy: bad startup length %d", n)
		}
		body := make([]byte, n-8)
		if _, err := io.ReadFull(c, body); err != nil {
			return nil, "", err
		}
		if code == 80877103 || code == 80877104 { // SSLRequest, GSSENCRequest
			if _, err := c.Write([]byte{'N'}); err != nil {
				return nil, "", err
			}
			continue
		}
		msg := append(hdr[:], body...)
		if refuseParam == "" || code != 196608 {
			return msg, "", nil
		}
		parts := strings.Split(string(body), "\x00")
		for i := 0; i+1 < len(parts); i += 2 {
			if parts[i] == refuseParam {
				return msg, parts[i+1], nil
			}
		}
		return msg, "", nil
	}
}

func errorResponse(code, message string) []byte {
	var body []byte
	for _, f := range []struct {
		t byte
		v string
	}{{'S', "FATAL"}, {'V', "FATAL"}, {'C', code}, {'M', message}} {
		body = append(body, f.t)
		body = append(body, f.v...)
		body = append(body, 0)
	}
	body = append(body, 0)
	out := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(len(body)+4))
	return append(out, body...)
}
