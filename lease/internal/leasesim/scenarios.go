package leasesim

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/lease"
)

// Opener opens a new store handle on the shared backend (as a new process
// would); the handle is closed at the end of the test.
type Opener func(t testing.TB) lease.Store

// Outage stops and restarts the real store.
type Outage struct {
	Stop  func(t testing.TB)
	Start func(t testing.TB)
}

func ownerDeathBudget(t testing.TB, c failover.Cadence) failover.Budget {
	b, err := failover.OwnerDeathBudget(c, TestActivation, 0)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// KillOwner kills the owner in-process (no release) and checks that the
// standby owns within the owner-death budget of the cadence.
func KillOwner(t *testing.T, open Opener) {
	c := TestCadence(t)
	budget := ownerDeathBudget(t, c)
	id := fmt.Sprintf("kill-%d", time.Now().UnixNano())
	h := &History{}
	a := StartMember(t, MemberConfig{Name: "a", Session: id, Store: open(t), Cadence: c, History: h})
	first := WaitOwner(t, 30*time.Second, a)
	b := StartMember(t, MemberConfig{Name: "b", Session: id, Store: open(t), Cadence: c, History: h})
	defer b.Stop()
	time.Sleep(c.AcquirePollInterval * 2) // the standby is observing
	killed := time.Now()
	first.Kill()
	second := WaitOwner(t, budget.Total+10*time.Second, b)
	took := time.Since(killed)
	if took > budget.Total {
		t.Fatalf("standby owned %v after the owner was killed; owner-death budget %v", took, budget)
	}
	if err := h.Check(); err != nil {
		t.Fatal(err)
	}
	t.Logf("in-process kill: %s owned %v after the kill (budget %v); %d actions checked", second.Name, took.Round(time.Millisecond), budget.Total, h.Len())
}

// ChildEnv marks the re-executed test binary as a lease-holding child.
const ChildEnv = "LEASESIM_CHILD_SESSION"

// MaybeRunChild runs the child side of KillSubprocess when the environment
// says so, and never returns in that case. Call it first in TestMain.
func MaybeRunChild(open func() (lease.Store, error)) {
	id := os.Getenv(ChildEnv)
	if id == "" {
		return
	}
	s, err := open()
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	c, _, err := failover.ResolveCadence(failover.LeaseConfig{LeaseTTL: 5 * time.Second, RenewInterval: time.Second,
		RenewCallTimeout: 500 * time.Millisecond, AcquirePollInterval: 250 * time.Millisecond, StepDownGrace: time.Second})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	m, err := lease.New(lease.Config{Store: s, Session: id, InstanceID: "child", Cadence: c,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnOwner: func(own *lease.Ownership) {
			fmt.Printf("OWNER %d\n", own.Token().Version)
			<-own.Context().Done()
		}})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	_ = m.Run(context.Background())
	os.Exit(3)
}

// KillSubprocess re-executes the test binary as a child that owns the
// lease, SIGKILLs it, and checks that an in-process standby owns within the
// owner-death budget. env is passed to the child (how to reach the store).
func KillSubprocess(t *testing.T, open Opener, env ...string) {
	c := TestCadence(t)
	budget := ownerDeathBudget(t, c)
	id := fmt.Sprintf("sigkill-%d", time.Now().UnixNano())
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), ChildEnv+"="+id), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	select {
	case l := <-lines:
		if !strings.HasPrefix(l, "OWNER ") {
			t.Fatalf("child: %q", l)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("child did not own the lease within 60s")
	}
	b := StartMember(t, MemberConfig{Name: "standby", Session: id, Store: open(t), Cadence: c})
	defer b.Stop()
	time.Sleep(c.AcquirePollInterval * 2)
	if len(Owners(b)) != 0 {
		t.Fatal("standby owns while the child holds the lease")
	}
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	WaitOwner(t, budget.Total+10*time.Second, b)
	took := time.Since(killed)
	if took > budget.Total {
		t.Fatalf("standby owned %v after SIGKILL; owner-death budget %v", took, budget)
	}
	t.Logf("SIGKILL: standby owned %v after the kill (owner-death budget %v)", took.Round(time.Millisecond), budget.Total)
}

// StoreOutage stops the real store under an owner: the owner must stop
// acting by its local deadline, no other owner may be granted meanwhile,
// and after recovery exactly one member owns.
func StoreOutage(t *testing.T, open Opener, outage Outage) {
	c := TestCadence(t)
	id := fmt.Sprintf("outage-%d", time.Now().UnixNano())
	h := &History{}
	a := StartMember(t, MemberConfig{Name: "a", Session: id, Store: open(t), Cadence: c, History: h})
	defer a.Stop()
	WaitOwner(t, 30*time.Second, a)
	b := StartMember(t, MemberConfig{Name: "b", Session: id, Store: open(t), Cadence: c, History: h})
	defer b.Stop()
	time.Sleep(2 * c.AcquirePollInterval)
	stopped := time.Now()
	outage.Stop(t)
	// The owner's last successful renew was sent before the stop, so its
	// local deadline is at most TTL·(1 − margin) after it.
	limit := stopped.Add(c.LeaseTTL)
	for len(Owners(a, b)) > 0 {
		if time.Now().After(limit.Add(5 * time.Second)) {
			t.Fatalf("an owner still acts %v after the store stopped (TTL %v)", time.Since(stopped), c.LeaseTTL)
		}
		if o := Owners(b); len(o) > 0 {
			t.Fatal("the standby was granted the lease while the store was down")
		}
		time.Sleep(5 * time.Millisecond)
	}
	stoppedActing := time.Since(stopped)
	for _, act := range snapshot(h) {
		if act.At.After(limit) {
			t.Fatalf("%s acted at %v after the store stopped, past any local deadline", act.Member, act.At.Sub(stopped))
		}
	}
	time.Sleep(time.Second) // the outage goes on past the deadline
	if len(Owners(a, b)) != 0 {
		t.Fatal("an owner appeared during the outage")
	}
	outage.Start(t)
	WaitOwner(t, 2*c.LeaseTTL+30*time.Second, a, b)
	// Exactly one owner, and it stays one.
	for range 50 {
		if n := len(Owners(a, b)); n > 1 {
			t.Fatalf("%d owners after recovery", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := h.Check(); err != nil {
		t.Fatal(err)
	}
	t.Logf("store outage: owner stopped acting %v after the store stopped (TTL %v); one owner after recovery; %d actions checked",
		stoppedActing.Round(time.Millisecond), c.LeaseTTL, h.Len())
}

func snapshot(h *History) []Action {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Action(nil), h.actions...)
}

// Randomized runs `runs` randomized histories of length dur with three
// members on the fast cadence: kills (and restarts as new processes),
// pauses, and store outages when outage is non-nil. Every owner action is
// logged with its fencing version and wall time; no two owners' action
// intervals may overlap.
func Randomized(t *testing.T, open Opener, outage *Outage, runs int, dur time.Duration, seed uint64) {
	c := FastCadence()
	total, tenures := 0, 0
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var kills, pauses, outages int
	for run := range runs {
		id := fmt.Sprintf("history-%d-%d", run, time.Now().UnixNano())
		h := &History{}
		members := make([]*Member, 3)
		gen := 0
		start := func(i int) {
			gen++
			members[i] = StartMember(t, MemberConfig{Name: fmt.Sprintf("m%d.%d", i, gen), Session: id, Store: open(t), Cadence: c, History: h, ActEvery: 2 * time.Millisecond})
		}
		for i := range members {
			start(i)
		}
		end := time.Now().Add(dur)
		for time.Now().Before(end) {
			time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
			i := rng.IntN(len(members))
			switch k := rng.IntN(10); {
			case k < 4:
				kills++
				members[i].Kill()
				start(i)
			case k < 7:
				pauses++
				members[i].Pause()
				time.Sleep(time.Duration(rng.IntN(int(3*c.LeaseTTL/time.Millisecond))) * time.Millisecond)
				members[i].Resume()
			default:
				if outage == nil {
					members[i].Store.SetMode(Fail)
					time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
					members[i].Store.SetMode(OK)
					continue
				}
				outages++
				outage.Stop(t)
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Millisecond)
				outage.Start(t)
			}
		}
		for _, m := range members {
			_ = m.Stop()
		}
		if err := h.Check(); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		total += h.Len()
		tenures += h.Tenures()
	}
	if tenures < runs {
		t.Fatalf("only %d tenures acted in %d runs: the runs did not exercise ownership", tenures, runs)
	}
	t.Logf("history checker: %d runs, %d actions in %d tenures checked, no overlap (%d kills, %d pauses, %d store outages)",
		runs, total, tenures, kills, pauses, outages)
	fmt.Printf("history checker: %d runs, %d actions in %d tenures checked, no overlap (%d kills, %d pauses, %d store outages)\n",
		runs, total, tenures, kills, pauses, outages)
}
