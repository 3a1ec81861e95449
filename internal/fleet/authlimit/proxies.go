package authlimit

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/pires/go-proxyproto"
)

// Proxies are the load balancers trusted to name the client they forward
// (server.trustedProxies): HAProxy or nginx in front of the replicas.
// Without them every client behind one balancer is one source, and its
// guessers slow down all of them.
//
// A trusted proxy names the client in X-Forwarded-For (nginx, HAProxy's
// option forwardfor) or in a PROXY protocol v1/v2 header (HAProxy's
// send-proxy, ListenerOf). From any other peer both are ignored: anyone
// can send them.
type Proxies struct {
	nets []netip.Prefix
}

// ParseProxies parses a comma-separated list of IP addresses and CIDR
// prefixes; empty trusts none.
func ParseProxies(list string) (*Proxies, error) {
	p := &Proxies{}
	for f := range strings.SplitSeq(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if pr, err := netip.ParsePrefix(f); err == nil {
			p.nets = append(p.nets, pr.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("%q is neither an IP address nor a CIDR prefix", f)
		}
		a = a.Unmap()
		p.nets = append(p.nets, netip.PrefixFrom(a, a.BitLen()))
	}
	return p, nil
}

// Trusted reports whether addr (an IP address, with or without a port)
// is a trusted proxy.
func (p *Proxies) Trusted(addr string) bool {
	if p == nil || len(p.nets) == 0 {
		return false
	}
	a, ok := parseAddr(addr)
	if !ok {
		return false
	}
	for _, n := range p.nets {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

func parseAddr(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	a, err := netip.ParseAddr(strings.Trim(s, "[]"))
	return a.Unmap(), err == nil
}

// Source is the key of r's source: its peer address, or, when the peer
// is a trusted proxy, the client that the proxies name in
// X-Forwarded-For: the right-most address not itself a trusted proxy
// (entries further left were written by the client and prove nothing).
// A PROXY protocol header was applied to r.RemoteAddr by ListenerOf.
func (p *Proxies) Source(r *http.Request) string {
	hop := Source(r)
	if !p.Trusted(hop) {
		return hop
	}
	var list []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		list = append(list, strings.Split(v, ",")...)
	}
	for i := len(list) - 1; i >= 0; i-- {
		a, ok := parseAddr(list[i])
		if !ok {
			break // garbage: the last good hop is the source
		}
		hop = a.String()
		if !p.Trusted(hop) {
			break
		}
	}
	return hop
}

// ListenerOf wraps l so that a connection from a trusted proxy that
// starts with a PROXY protocol header (v1 or v2) takes the client address
// it names as its remote address. Connections from other peers are not
// parsed: a header they send reaches the server as garbage (400). With no
// trusted proxies l is returned unchanged.
func (p *Proxies) ListenerOf(l net.Listener) net.Listener {
	if p == nil || len(p.nets) == 0 {
		return l
	}
	return &proxyproto.Listener{Listener: l, ReadHeaderTimeout: 10 * time.Second,
		ConnPolicy: func(o proxyproto.ConnPolicyOptions) (proxyproto.Policy, error) {
			if p.Trusted(o.Upstream.String()) {
				return proxyproto.USE, nil
			}
			return proxyproto.SKIP, nil
		}}
}
