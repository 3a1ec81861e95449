package lab

import (
	"fmt"
	"sync"
	"syscall"
	"time"
)

// Fault scenarios beyond AllScenarios, for campaigns (package proof) that
// give each round its own timing through Options.Plan. The ones that cut
// a path to the lease store need a store with a network path (not sqlite;
// see NeedsStorePath).
const (
	// OwnerStoreFreeze: the owner's store connections stop being read
	// (no FIN, no RST; the kernel's buffers fill), a TCP freeze rather
	// than a blackhole that reads and discards.
	OwnerStoreFreeze = "owner_store_freeze"
	// OwnerBothPathsDown: the owner's store and broker paths are
	// blackholed at once, two faults that overlap on one instance.
	OwnerBothPathsDown = "owner_store_partition+broker_path_blackhole"
	// OwnerSIGKILLStandbyStoreBlip: the owner is killed and, Planned.Second
	// later, the standby's store connections are cut and new ones refused
	// for Planned.Blip: the successor loses its store while taking over.
	OwnerSIGKILLStandbyStoreBlip = "owner_sigkill+standby_store_blip"
	// OwnerSIGKILLStandbyBrokerRefused: the owner is killed and,
	// Planned.Second later, the standby's broker path refuses connections
	// for Planned.Blip: the successor's first connects fail.
	OwnerSIGKILLStandbyBrokerRefused = "owner_sigkill+standby_broker_refused"
	// OwnerSIGKILLBrokerPathSlow: the owner is killed and every instance's
	// broker path turns slow for a while (what the broker sends arrives
	// slowBrokerLag late, restarted instances included), so that
	// successors outlast broker_health_step_down in their activation, step
	// down, are restarted and resume the session again and again: what a
	// starved host did in the rounds that lost messages (docs/proof.md).
	// Its budget is the owner-death budget plus the slow period, in which
	// no instance can be served by the broker in time.
	OwnerSIGKILLBrokerPathSlow = "owner_sigkill+broker_path_slow"
	// OwnerSIGKILLStandbyStarved: the owner is killed and the standby
	// (each of its restarts too) is starved of CPU for a while: stopped
	// and continued in a cycle of a second, running starvedDuty of it:
	// long stalls, the way a host at a load average many times its cores
	// runs a process (a quota of 5% in short cycles did not stall the
	// bridge enough to matter).
	// Its timers, reads, lease calls and activation all run late. Budget:
	// the owner-death budget plus the starved period.
	OwnerSIGKILLStandbyStarved = "owner_sigkill+standby_starved"
)

// starvedDuty and starvedPeriod time OwnerSIGKILLStandbyStarved from
// Planned.Second and Planned.Blip: 20 to 120ms of every second for 10 to
// 20s.
func starvedDuty(p Planned) time.Duration   { return 20*time.Millisecond + p.Second/30 }
func starvedPeriod(p Planned) time.Duration { return 8*time.Second + 4*p.Blip }

// slowBrokerLag and slowBrokerPeriod time OwnerSIGKILLBrokerPathSlow from
// a round's Planned.Second and Planned.Blip: a lag of 1 to 2.5s (the
// lab's connect_timeout and reconcile_timeout are 2s, so some
// activations finish and some do not) for 10 to 20s.
func slowBrokerLag(p Planned) time.Duration    { return time.Second + p.Second/2 }
func slowBrokerPeriod(p Planned) time.Duration { return 8*time.Second + 4*p.Blip }

// ExtraScenarios lists the campaign-only scenarios.
var ExtraScenarios = []string{OwnerStoreFreeze, OwnerBothPathsDown, OwnerSIGKILLStandbyStoreBlip, OwnerSIGKILLStandbyBrokerRefused,
	OwnerSIGKILLBrokerPathSlow, OwnerSIGKILLStandbyStarved}

// NeedsStorePath reports whether a scenario cuts a path to the lease
// store, which a sqlite store (a file) does not have.
func NeedsStorePath(sc string) bool {
	switch sc {
	case OwnerStorePartition, OwnerStoreFreeze, OwnerBothPathsDown, OwnerSIGKILLStandbyStoreBlip:
		return true
	}
	return false
}

// Planned is one round of Options.Plan.
type Planned struct {
	Scenario string
	// Delay is the wait after both instances are stable (owner at full
	// service, standby standing by) before the fault: its place in the
	// lease's renew cycle.
	Delay time.Duration
	// Second and Blip time the second fault of an overlapping scenario:
	// it starts Second after the first and lasts Blip.
	Second, Blip time.Duration
}

func planScenarios(p []Planned) []string {
	out := make([]string, 0, len(p))
	for _, r := range p {
		out = append(out, r.Scenario)
	}
	return out
}

// extraFaults owns the timers that start and end second faults; stop
// waits for none of them to be running.
type extraFaults struct {
	mu      sync.Mutex
	timers  []*time.Timer
	stopped bool
	wg      sync.WaitGroup
}

// after runs f once d has passed, unless stop came first (or comes
// before d has passed: a chain of timers ends there).
func (x *extraFaults) after(d time.Duration, f func()) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.stopped {
		return
	}
	x.wg.Add(1)
	t := time.AfterFunc(d, func() { defer x.wg.Done(); f() })
	x.timers = append(x.timers, t)
}

func (x *extraFaults) stop() {
	x.mu.Lock()
	x.stopped = true
	for _, t := range x.timers {
		if t.Stop() {
			x.wg.Done()
		}
	}
	x.timers = nil
	x.mu.Unlock()
	x.wg.Wait()
}

// injectExtra applies an ExtraScenarios fault of round i. Its budget is
// the owner-death budget the round starts with (in each of them the
// successor can only take over once the owner's lease has expired) plus
// what injectExtra returns: how long the fault keeps every instance from
// serving.
func (e *env) injectExtra(i int, sc string, owner, standby *slot) (time.Duration, error) {
	var p Planned
	if i < len(e.opts.Plan) {
		p = e.opts.Plan[i]
	}
	if p.Blip <= 0 {
		p.Blip = time.Second
	}
	if NeedsStorePath(sc) && (owner.storePx == nil || standby.storePx == nil) {
		return 0, fmt.Errorf("scenario %s: the %s store has no network path to cut", sc, e.store.kind)
	}
	switch sc {
	case OwnerStoreFreeze:
		owner.storePx.Freeze()
	case OwnerBothPathsDown:
		owner.storePx.Blackhole(true)
		owner.brokerPx.Blackhole(true)
	case OwnerSIGKILLStandbyStoreBlip:
		_ = owner.p.cmd.Process.Kill()
		px := standby.storePx
		e.extra.after(p.Second, func() {
			px.Refuse(true)
			px.Cut()
			e.extra.after(p.Blip, func() { px.Refuse(false) })
		})
	case OwnerSIGKILLStandbyBrokerRefused:
		_ = owner.p.cmd.Process.Kill()
		px := standby.brokerPx
		e.extra.after(p.Second, func() {
			px.Refuse(true)
			e.extra.after(p.Blip, func() { px.Refuse(false) })
		})
	case OwnerSIGKILLBrokerPathSlow:
		_ = owner.p.cmd.Process.Kill()
		period := slowBrokerPeriod(p)
		e.slowBroker(slowBrokerLag(p))
		e.extra.after(period, func() { e.slowBroker(0) })
		return period, nil
	case OwnerSIGKILLStandbyStarved:
		_ = owner.p.cmd.Process.Kill()
		period := starvedPeriod(p)
		e.starve(standby, starvedDuty(p), period)
		return period, nil
	default:
		return 0, fmt.Errorf("scenario %q: unknown", sc)
	}
	return 0, nil
}

// starve stops and continues the process of slot s (whichever process
// the slot runs: a restart is starved too) in a cycle of a second, letting
// it run duty of each, for period; it leaves the process running at the
// latest a cycle after period (starveTail).
func (e *env) starve(s *slot, duty, period time.Duration) {
	const cycle = starveTail
	end := time.Now().Add(period)
	var step func()
	step = func() {
		e.faultMu.Lock()
		p := s.p
		e.faultMu.Unlock()
		if p == nil || !p.alive() {
			if time.Now().Before(end) {
				e.extra.after(cycle, step)
			}
			return
		}
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		if time.Now().After(end) {
			return
		}
		e.extra.after(duty, func() {
			if time.Now().After(end) {
				return // running, for good
			}
			_ = p.cmd.Process.Signal(syscall.SIGSTOP)
			e.extra.after(cycle-duty, step)
		})
	}
	step()
}

// starveTail is how long after its period a starved process may still be
// stopped: one cycle.
const starveTail = time.Second

// slowBroker delays what the broker sends to every instance by lag (0:
// none), on the open proxies and on those a restart opens (env.start).
func (e *env) slowBroker(lag time.Duration) {
	e.faultMu.Lock()
	defer e.faultMu.Unlock()
	e.brokerLag = lag
	for _, s := range e.slots {
		if s != nil && s.brokerPx != nil {
			s.brokerPx.DelayReplies(lag)
		}
	}
}

// checkStamps compares the fencing stamps at the destination with the
// store's history: every stamped delivery must carry a lease version the
// store granted (a version the lab's poller never saw held is a stamp no
// lease backs), and within a round the versions may only grow (the stale
// count of judge covers the order across the run).
func checkStamps(rs []Result, ds []delivery, changes []change) {
	if len(rs) == 0 {
		return
	}
	granted := map[int64]bool{}
	for _, c := range changes {
		if c.Owner != "" {
			granted[c.Version] = true
		}
	}
	unknown := make([]map[int64]int, len(rs))
	for _, d := range ds {
		if d.Version == 0 || granted[d.Version] {
			continue
		}
		i := len(rs) - 1
		for i > 0 && d.At.Before(rs[i].start) {
			i--
		}
		if unknown[i] == nil {
			unknown[i] = map[int64]int{}
		}
		unknown[i][d.Version]++
	}
	for i, m := range unknown {
		for v, n := range m {
			rs[i].Problems = append(rs[i].Problems, fmt.Sprintf("%d deliveries stamped with lease version %d, which the store's history never showed granted", n, v))
		}
	}
}

// FaultAt is when the round's fault was injected.
func (r Result) FaultAt() time.Time { return r.fault }
