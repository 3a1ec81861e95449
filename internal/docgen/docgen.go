// Package docgen renders the tables of numbers in docs/ from code. A doc
// marks each generated table with
//
//	<!-- generated:NAME -->
//	...
//	<!-- /generated:NAME -->
//
// and `go generate ./...` (make docs) rewrites what lies between. The test
// of this package fails when a doc and the code disagree.
package docgen

//go:generate go run ./gendocs -docs ../../docs

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/bridge/activation"
	bridgebudget "github.com/myriarch/myriarch/internal/bridge/budget"
	"github.com/myriarch/myriarch/internal/bridge/leasemode"
	"github.com/myriarch/myriarch/internal/bridge/queueroom"
	"github.com/myriarch/myriarch/internal/disclose"
	fleetbudget "github.com/myriarch/myriarch/internal/fleet/budget"
	fleetconfig "github.com/myriarch/myriarch/internal/fleet/config"
)

// Tables maps each table name to its renderer.
var Tables = map[string]func() (string, error){
	"bridge-profiles":   bridgeProfiles,
	"bridge-queue-room": bridgeQueueRoom,
	"bridge-terms":      bridgeTerms,
	"leader-budget":     leaderBudget,
	"leader-params":     leaderParams,
	"leader-timeouts":   leaderTimeouts,
	"termination-grace": terminationGrace,
}

var block = regexp.MustCompile(`(?s)(<!-- generated:([a-z-]+) -->\n)(.*?)(<!-- /generated:([a-z-]+) -->)`)

// Update returns doc with every generated block rendered afresh.
func Update(doc string) (string, error) {
	var firstErr error
	out := block.ReplaceAllStringFunc(doc, func(m string) string {
		p := block.FindStringSubmatch(m)
		if p[2] != p[5] {
			firstErr = fmt.Errorf("generated block %q closed as %q", p[2], p[5])
			return m
		}
		render, ok := Tables[p[2]]
		if !ok {
			firstErr = fmt.Errorf("unknown generated block %q", p[2])
			return m
		}
		body, err := render()
		if err != nil {
			firstErr = fmt.Errorf("%s: %w", p[2], err)
			return m
		}
		return p[1] + body + p[4]
	})
	return out, firstErr
}

// Blocks lists the generated block names in doc.
func Blocks(doc string) []string {
	var names []string
	for _, m := range block.FindAllStringSubmatch(doc, -1) {
		names = append(names, m[2])
	}
	return names
}

func secs(d time.Duration) string { return disclose.Seconds(d) }

func mqttDefaults() failover.Activation { return activation.DefaultMQTT() }

// probeStepDown is a whole-second threshold used to express the
// broker-path budget as "broker_health_step_down + X".
const probeStepDown = time.Hour

type profile struct {
	label string
	mode  leasemode.Mode
}

var profiles = []profile{
	{"Standalone default (`deployment_mode: standalone`)", leasemode.Standalone},
	{"Clustered HA (`deployment_mode: clustered`, no pinned lease timing)", leasemode.Clustered},
}

func assessProfile(mode leasemode.Mode) (bridgebudget.BridgeReport, error) {
	bh, _ := failover.BrokerHealthAfter(probeStepDown)
	r := bridgebudget.NewBridgeReport(mode, failover.Assess(failover.SessionPolicy{
		Lease: mode.Lease(failover.LeaseConfig{}), BrokerHealthStepDown: bh, Activation: mqttDefaults(),
	}))
	if !r.Admitted {
		return r, fmt.Errorf("profile %s refused: %v", mode, r.Errors)
	}
	return r, nil
}

func derived(v string, isDerived bool) string {
	if isDerived {
		return v + " derived"
	}
	return v
}

func bridgeProfiles() (string, error) {
	var b strings.Builder
	b.WriteString("| Profile | lease_ttl | renew_interval | renew_call_timeout | acquire_poll_interval | step_down_grace | Owner-death budget | Broker-path budget |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, p := range profiles {
		r, err := assessProfile(p.mode)
		if err != nil {
			return "", err
		}
		a := r.Assessment()
		c := a.Cadence
		// Shown to the hundredth like the spec; 680/9 s has no exact form.
		interval := strconv.FormatFloat(math.Round(c.RenewInterval.Seconds()*100)/100, 'f', -1, 64) + "s"
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | broker_health_step_down + %s |\n",
			p.label, secs(c.LeaseTTL), derived(interval, c.RenewIntervalDerived),
			derived(secs(c.RenewCallTimeout), c.RenewCallTimeoutDerived), derived(secs(c.AcquirePollInterval), c.AcquirePollIntervalDerived),
			secs(c.StepDownGrace), secs(a.OwnerDeath.Total), secs(a.BrokerPath.Total-probeStepDown))
	}
	return b.String(), nil
}

func bridgeTerms() (string, error) {
	type row struct {
		name string
		vals [2]string
	}
	var rows []row
	for i, p := range profiles {
		r, err := assessProfile(p.mode)
		if err != nil {
			return "", err
		}
		a := r.Assessment()
		n := 0
		put := func(name, val string) {
			if n == len(rows) {
				rows = append(rows, row{})
			}
			rows[n].name, rows[n].vals[i] = name, val
			n++
		}
		for _, t := range a.OwnerDeath.Terms {
			if calls, ok := strings.CutSuffix(t.Name, " × renew_call_timeout"); ok {
				put("owner death: (1 + ⌈lease_ttl / min_jittered_poll⌉) × renew_call_timeout", fmt.Sprintf("%s (%s calls)", secs(t.Value), calls))
				continue
			}
			put("owner death: "+t.Name, secs(t.Value))
		}
		put("**owner-death budget**", "**"+secs(a.OwnerDeath.Total)+"**")
		for _, t := range a.BrokerPath.Terms[1:] { // [0] is broker_health_step_down itself
			put("broker path: "+t.Name, secs(t.Value))
		}
		put("**broker-path budget − broker_health_step_down**", "**"+secs(a.BrokerPath.Total-probeStepDown)+"**")
	}
	var b strings.Builder
	b.WriteString("| Term | Standalone | Clustered |\n|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", r.name, r.vals[0], r.vals[1])
	}
	return b.String(), nil
}

func leaderDefault() (failover.LeaderKeepalive, error) {
	r := fleetbudget.LeaderBudget(failover.DefaultLeaderSessionTimeout, fleetconfig.DefaultShutdownTimeout, fleetconfig.DefaultPreStopSleep)
	if !r.OK() {
		return failover.LeaderKeepalive{}, fmt.Errorf("%v", r.Errors)
	}
	return r.Keepalive(), nil
}

// leaderTable writes a table of the default derivation: its header, then
// the rows that rows writes.
func leaderTable(header func(k failover.LeaderKeepalive) string, rows func(b *strings.Builder, k failover.LeaderKeepalive)) (string, error) {
	k, err := leaderDefault()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(header(k))
	rows(&b, k)
	return b.String(), nil
}

func leaderBudget() (string, error) {
	return leaderTable(func(k failover.LeaderKeepalive) string {
		return "| Part of T | Value | With the default of " + secs(k.T) + " |\n|---|---|---|\n"
	}, leaderBudgetRows)
}

func leaderBudgetRows(b *strings.Builder, k failover.LeaderKeepalive) {
	fmt.Fprintf(b, "| Retry of a follower | every min(5 s, T/6), up to 20 percent more by jitter | at most %s |\n", secs(k.FollowerRetryMax))
	fmt.Fprintf(b, "| Margin for the acquisition | T/20 | %s |\n", secs(k.AcquisitionMargin))
	fmt.Fprintf(b, "| Detection D: the server drops the silent session within | T minus the two parts above, rounded down to whole seconds | %s |\n", secs(k.Detection))
}

func leaderParams() (string, error) {
	return leaderTable(func(failover.LeaderKeepalive) string {
		return "| Server parameter | Value | With the default |\n|---|---|---|\n"
	}, leaderParamRows)
}

func leaderParamRows(b *strings.Builder, k failover.LeaderKeepalive) {
	fmt.Fprintf(b, "| tcp_keepalives_idle | I seconds | %d |\n", int64(k.KeepalivesIdle/time.Second))
	fmt.Fprintf(b, "| tcp_keepalives_interval | I seconds | %d |\n", int64(k.KeepalivesInterval/time.Second))
	fmt.Fprintf(b, "| tcp_keepalives_count | D/I − 1 | %d |\n", k.KeepalivesCount)
	fmt.Fprintf(b, "| tcp_user_timeout | (D − I) seconds, in milliseconds | %d |\n", k.UserTimeout.Milliseconds())
}

// LeaderTimeoutSamples are the values of T the docs tabulate.
var LeaderTimeoutSamples = []time.Duration{10 * time.Second, 15 * time.Second, 20 * time.Second, 30 * time.Second, 45 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute}

func leaderTimeouts() (string, error) {
	var b strings.Builder
	b.WriteString("| T | Follower retry (max) | Margin | D | I | count | tcp_user_timeout | Server drops after | Leader resigns after | Confirm every / timeout |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, t := range LeaderTimeoutSamples {
		r := fleetbudget.LeaderBudget(t, fleetconfig.DefaultShutdownTimeout, fleetconfig.DefaultPreStopSleep)
		if !r.OK() {
			return "", fmt.Errorf("leader session timeout %v: %v", t, r.Errors)
		}
		k := r.Keepalive()
		fmt.Fprintf(&b, "| %s | %s (%s) | %s | %s | %s | %d | %d ms | %s – %s | %s | %s / %s |\n",
			secs(t), secs(k.FollowerRetry), secs(k.FollowerRetryMax), secs(k.AcquisitionMargin), secs(k.Detection),
			secs(k.KeepalivesIdle), k.KeepalivesCount, k.UserTimeout.Milliseconds(), secs(k.EarliestDrop), secs(k.LatestDrop),
			secs(k.ResignAfter), secs(k.ConfirmInterval), secs(k.ConfirmTimeout))
	}
	return b.String(), nil
}

func terminationGrace() (string, error) {
	var b strings.Builder
	b.WriteString("| preStopSleepSeconds | server.shutdownTimeout | terminationGracePeriodSeconds at least |\n|---|---|---|\n")
	for _, c := range []struct{ pre, sd time.Duration }{
		{fleetconfig.DefaultPreStopSleep, fleetconfig.DefaultShutdownTimeout},
		{fleetconfig.DefaultPreStopSleep, 15 * time.Second},
		{fleetconfig.DefaultPreStopSleep, time.Minute},
		{0, fleetconfig.DefaultShutdownTimeout},
	} {
		r := fleetbudget.LeaderBudget(failover.DefaultLeaderSessionTimeout, c.sd, c.pre)
		if !r.OK() {
			return "", fmt.Errorf("%v", r.Errors)
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", secs(c.pre), secs(c.sd), secs(time.Duration(*r.TerminationGracePeriod*float64(time.Second))))
	}
	return b.String(), nil
}

// queueRoomStepDown is the broker_health_step_down of the queue-room table:
// the value `make budgets` shows for the clustered profile.
const queueRoomStepDown = 60 * time.Second

// queueRoomRates are the peak rates of the queue-room table, in msg/s.
var queueRoomRates = []float64{10, 100, 200, 1000}

// bridgeQueueRoom: the messages at risk (rate × worst-case budget) at the
// default profiles, and the highest rate that a broker's default queue of
// queueroom.DefaultLimit messages holds through the worst-case failover.
func bridgeQueueRoom() (string, error) {
	var b strings.Builder
	b.WriteString("| Profile (broker_health_step_down 60s) | Worst-case budget |")
	for _, r := range queueRoomRates {
		fmt.Fprintf(&b, " at %v msg/s |", r)
	}
	fmt.Fprintf(&b, " Highest rate a %d-message queue holds |\n|---|---|", queueroom.DefaultLimit)
	b.WriteString(strings.Repeat("---|", len(queueRoomRates)+1) + "\n")
	for _, p := range profiles {
		bh, _ := failover.BrokerHealthAfter(queueRoomStepDown)
		r := bridgebudget.NewBridgeReport(p.mode, failover.Assess(failover.SessionPolicy{
			Lease: p.mode.Lease(failover.LeaseConfig{}), BrokerHealthStepDown: bh, Activation: mqttDefaults(),
		}))
		if !r.Admitted {
			return "", fmt.Errorf("profile %s refused: %v", p.mode, r.Errors)
		}
		worst := bridgebudget.WorstBudget(r.Assessment())
		fmt.Fprintf(&b, "| %s | %s |", p.label, secs(worst))
		for _, rate := range queueRoomRates {
			fmt.Fprintf(&b, " %d |", failover.MessagesAtRisk(rate, worst))
		}
		// The largest rate whose messages at risk fit the default queue, to
		// the hundredth of a message per second.
		h := int64(float64(queueroom.DefaultLimit) / worst.Seconds() * 100)
		for h > 0 && failover.MessagesAtRisk(float64(h)/100, worst) > queueroom.DefaultLimit {
			h--
		}
		fmt.Fprintf(&b, " %s msg/s |\n", strconv.FormatFloat(float64(h)/100, 'f', -1, 64))
	}
	return b.String(), nil
}
