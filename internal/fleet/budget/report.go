// Package budget is what myriarchd discloses about its failover
// arithmetic: the stable JSON object of `myriarchd budget`, its readable
// table, and the command's front end (flags, exit statuses). It is called
// with values (durations); the docs generator renders its tables from the
// same reports.
package budget

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/disclose"
	fleetconfig "github.com/myriarch/myriarch/internal/fleet/config"
)

// LeaderReport is the JSON object of `myriarchd budget --json`. Durations
// are seconds (milliseconds for tcp_user_timeout_ms); the TCP parameters
// are the whole numbers PostgreSQL receives.
type LeaderReport struct {
	LeaderSessionTimeout     *float64 `json:"leader_session_timeout_s"`
	FollowerRetry            *float64 `json:"follower_retry_s"`
	FollowerRetryMax         *float64 `json:"follower_retry_max_s"`
	AcquisitionMargin        *float64 `json:"acquisition_margin_s"`
	Detection                *float64 `json:"detection_s"`
	TCPKeepalivesIdle        *int64   `json:"tcp_keepalives_idle"`
	TCPKeepalivesInterval    *int64   `json:"tcp_keepalives_interval"`
	TCPKeepalivesCount       *int     `json:"tcp_keepalives_count"`
	TCPUserTimeoutMillis     *int64   `json:"tcp_user_timeout_ms"`
	EarliestDrop             *float64 `json:"earliest_drop_s"`
	LatestDrop               *float64 `json:"latest_drop_s"`
	ConfirmInterval          *float64 `json:"confirm_interval_s"`
	ConfirmTimeout           *float64 `json:"confirm_timeout_s"`
	ResignAfter              *float64 `json:"resign_after_s"`
	ShutdownTimeout          *float64 `json:"shutdown_timeout_s"`
	PreStopSleep             *float64 `json:"pre_stop_sleep_s"`
	TerminationGracePeriod   *float64 `json:"termination_grace_period_s"`
	Errors                   []string `json:"errors"`
	keepalive                failover.LeaderKeepalive
	shutdown, preStop, grace time.Duration
}

// myriarchdKeys maps failover's field names onto myriarchd's settings and
// the Helm chart's value.
var myriarchdKeys = map[string]string{
	"LeaderSessionTimeout": "ha.leaderSessionTimeout",
	"ShutdownTimeout":      "server.shutdownTimeout",
	"PreStopSleep":         "preStopSleepSeconds",
}

// LeaderBudget computes the report for T, server.shutdownTimeout and the
// pre-stop sleep.
func LeaderBudget(t, shutdownTimeout, preStopSleep time.Duration) LeaderReport {
	r := LeaderReport{Errors: []string{}}
	k, err := failover.DeriveLeaderKeepalive(t)
	if err != nil {
		r.Errors = append(r.Errors, failover.ErrorStrings(failover.RenameFields(err, myriarchdKeys))...)
	} else {
		r.keepalive = k
		r.LeaderSessionTimeout = secs(k.T)
		r.FollowerRetry = secs(k.FollowerRetry)
		r.FollowerRetryMax = secs(k.FollowerRetryMax)
		r.AcquisitionMargin = secs(k.AcquisitionMargin)
		r.Detection = secs(k.Detection)
		idle, intvl := int64(k.KeepalivesIdle/time.Second), int64(k.KeepalivesInterval/time.Second)
		count, ut := k.KeepalivesCount, k.UserTimeout.Milliseconds()
		r.TCPKeepalivesIdle, r.TCPKeepalivesInterval, r.TCPKeepalivesCount, r.TCPUserTimeoutMillis = &idle, &intvl, &count, &ut
		r.EarliestDrop = secs(k.EarliestDrop)
		r.LatestDrop = secs(k.LatestDrop)
		r.ConfirmInterval = secs(k.ConfirmInterval)
		r.ConfirmTimeout = secs(k.ConfirmTimeout)
		r.ResignAfter = secs(k.ResignAfter)
	}
	g, err := fleetconfig.TerminationGracePeriod(preStopSleep, shutdownTimeout)
	if err != nil {
		r.Errors = append(r.Errors, failover.ErrorStrings(failover.RenameFields(err, myriarchdKeys))...)
	} else {
		r.shutdown, r.preStop, r.grace = shutdownTimeout, preStopSleep, g
		r.ShutdownTimeout = secs(shutdownTimeout)
		r.PreStopSleep = secs(preStopSleep)
		r.TerminationGracePeriod = secs(g)
	}
	return r
}

var secs = disclose.Secs

// OK reports whether every input was accepted.
func (r LeaderReport) OK() bool { return len(r.Errors) == 0 }

// Keepalive returns the derivation behind the report.
func (r LeaderReport) Keepalive() failover.LeaderKeepalive { return r.keepalive }

// WriteLeaderTable prints the report for operators.
func WriteLeaderTable(w io.Writer, r LeaderReport) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	defer tw.Flush()
	for _, e := range r.Errors {
		fmt.Fprintf(tw, "error: %s\n", e)
	}
	if r.LeaderSessionTimeout != nil {
		k := r.keepalive
		fmt.Fprintf(tw, "Leader failover after a hard failure, ha.leaderSessionTimeout T = %v\n", k.T)
		fmt.Fprintf(tw, "  follower retry\t%v\tmin(5s, T/6), up to %v with 20%% jitter\n", k.FollowerRetry, k.FollowerRetryMax)
		fmt.Fprintf(tw, "  acquisition margin\t%v\tT/20\n", k.AcquisitionMargin)
		fmt.Fprintf(tw, "  detection D\t%v\tT − longest retry − margin, whole seconds\n", k.Detection)
		fmt.Fprintf(tw, "  tcp_keepalives_idle\t%d\tI = D/6, whole seconds, at least 1\n", *r.TCPKeepalivesIdle)
		fmt.Fprintf(tw, "  tcp_keepalives_interval\t%d\tI\n", *r.TCPKeepalivesInterval)
		fmt.Fprintf(tw, "  tcp_keepalives_count\t%d\tD/I − 1\n", *r.TCPKeepalivesCount)
		fmt.Fprintf(tw, "  tcp_user_timeout\t%d ms\tD − I\n", *r.TCPUserTimeoutMillis)
		fmt.Fprintf(tw, "  server drops a silent session\t%v to %v\tafter the last packet it received\n", k.EarliestDrop, k.LatestDrop)
		fmt.Fprintf(tw, "  leader confirms its session\tevery %v\ttimeout %v\n", k.ConfirmInterval, k.ConfirmTimeout)
		fmt.Fprintf(tw, "  leader resigns by itself\t%v\tafter its last answer (T/2), before the server can drop the session\n", k.ResignAfter)
	}
	if r.TerminationGracePeriod != nil {
		fmt.Fprintf(tw, "\nterminationGracePeriodSeconds >= preStopSleepSeconds %v + 2 × server.shutdownTimeout %v + 15s + 5s = %v\n",
			r.preStop, r.shutdown, r.grace)
	}
}
