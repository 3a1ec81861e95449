package leaderlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Addresses exist only inside the namespaces that Netns creates: the
// database namespace holds a bridge with DBAddr; the leader and follower
// namespaces each hold one end of a veth pair whose other end is a port of
// that bridge.
const (
	DBAddr       = "10.213.0.1"
	LeaderAddr   = "10.213.0.2"
	FollowerAddr = "10.213.0.3"
	netmask      = "/24"
)

// Netns is the three-namespace network of the network-drop scenario.
type Netns struct {
	DB, Leader, Follower string
	created              []string
}

// ErrNoNetns reports that network namespaces cannot be created here (not
// root, no ip, no permission).
var ErrNoNetns = errors.New("leaderlab: network namespaces cannot be created here")

func ipCmd(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// SetupNetns creates the namespaces (names prefixed with a per-process
// prefix) and the bridge. On error it removes what it created. Close it.
func SetupNetns(ctx context.Context) (*Netns, error) {
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoNetns, err)
	}
	removeLeftovers(ctx)
	p := fmt.Sprintf("mlab%d", os.Getpid())
	n := &Netns{DB: p + "db", Leader: p + "ld", Follower: p + "fw"}
	for _, ns := range []string{n.DB, n.Leader, n.Follower} {
		_ = ipCmd(ctx, "netns", "del", ns) // leftover of a killed run
		if err := ipCmd(ctx, "netns", "add", ns); err != nil {
			n.Close()
			return nil, fmt.Errorf("%w: %v", ErrNoNetns, err)
		}
		n.created = append(n.created, ns)
		if err := ipCmd(ctx, "-n", ns, "link", "set", "lo", "up"); err != nil {
			n.Close()
			return nil, err
		}
	}
	steps := [][]string{
		{"-n", n.DB, "link", "add", "br0", "type", "bridge"},
		{"-n", n.DB, "addr", "add", DBAddr + netmask, "dev", "br0"},
		{"-n", n.DB, "link", "set", "br0", "up"},
	}
	for i, peer := range []struct{ ns, addr string }{{n.Leader, LeaderAddr}, {n.Follower, FollowerAddr}} {
		port := fmt.Sprintf("p%d", i)
		steps = append(steps,
			[]string{"-n", n.DB, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", peer.ns},
			[]string{"-n", n.DB, "link", "set", port, "master", "br0"},
			[]string{"-n", n.DB, "link", "set", port, "up"},
			[]string{"-n", peer.ns, "addr", "add", peer.addr + netmask, "dev", "eth0"},
			[]string{"-n", peer.ns, "link", "set", "eth0", "up"},
		)
	}
	for _, s := range steps {
		if err := ipCmd(ctx, s...); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

// Wrap returns the command prefix that runs a program inside ns.
func Wrap(ns string) []string { return []string{"ip", "netns", "exec", ns} }

// Close deletes the namespaces (and with them the veth pairs and the
// bridge). Processes still inside keep their namespace alive until they end.
func (n *Netns) Close() error {
	var errs []error
	for _, ns := range n.created {
		if err := ipCmd(context.Background(), "netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	n.created = nil
	return errors.Join(errs...)
}

// DropBetween drops every packet between the namespace ns and addr, in
// both directions, with nftables inside ns (iptables when nft is missing).
func DropBetween(ctx context.Context, ns, addr string) error {
	if _, err := exec.LookPath("nft"); err == nil {
		rules := fmt.Sprintf(`table inet leaderlab {
	chain in { type filter hook input priority 0; policy accept; ip saddr %s drop; }
	chain out { type filter hook output priority 0; policy accept; ip daddr %s drop; }
}
`, addr, addr)
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft in %s: %v: %s", ns, err, bytes.TrimSpace(out))
		}
		return nil
	}
	for _, r := range [][]string{{"-I", "INPUT", "-s", addr, "-j", "DROP"}, {"-I", "OUTPUT", "-d", addr, "-j", "DROP"}} {
		args := append([]string{"netns", "exec", ns, "iptables"}, r...)
		if err := ipCmd(ctx, args...); err != nil {
			return err
		}
	}
	return nil
}

var ssTimes = regexp.MustCompile(`\b(lastrcv|lastack):(\d+)`)

// LastReceived asks the kernel in ns, with ss, how long ago the socket of
// local port lport and remote port rport last received a packet (data or
// ACK), and returns the time of that packet.
func LastReceived(ctx context.Context, ns string, lport, rport int) (time.Time, error) {
	now := time.Now()
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "ss", "-tniH", "state", "established",
		fmt.Sprintf("( sport = :%d and dport = :%d )", lport, rport)).CombinedOutput()
	if err != nil {
		return time.Time{}, fmt.Errorf("ss: %v: %s", err, bytes.TrimSpace(out))
	}
	ms := int64(-1)
	for _, m := range ssTimes.FindAllStringSubmatch(string(out), -1) {
		v, _ := strconv.ParseInt(m[2], 10, 64)
		if ms < 0 || v < ms {
			ms = v
		}
	}
	if ms < 0 {
		return time.Time{}, fmt.Errorf("ss: no socket %d→%d (or no lastrcv/lastack) in %q", lport, rport, out)
	}
	return now.Add(-time.Duration(ms) * time.Millisecond), nil
}

var leftover = regexp.MustCompile(`^mlab(\d+)(db|ld|fw)$`)

// removeLeftovers deletes namespaces of earlier runs whose process is gone
// (a run killed before its cleanup).
func removeLeftovers(ctx context.Context) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		m := leftover.FindStringSubmatch(f[0])
		if m == nil {
			continue
		}
		if pid, _ := strconv.Atoi(m[1]); pid == os.Getpid() {
			continue
		} else if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue
		}
		_ = ipCmd(ctx, "netns", "del", f[0])
	}
}
