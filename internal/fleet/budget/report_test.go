package budget

import (
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/failover"
	fleetconfig "github.com/myriarch/myriarch/internal/fleet/config"
)

// The report is called with values and names myriarchd's keys in its
// refusals, not the library's field names.
func TestLeaderBudgetNamesMyriarchdKeys(t *testing.T) {
	r := LeaderBudget(5*time.Second, 0, -time.Second)
	got := strings.Join(r.Errors, "\n")
	for _, want := range []string{"ha.leaderSessionTimeout: 5s", "preStopSleepSeconds: -1s"} {
		if !strings.Contains(got, want) {
			t.Errorf("errors %q lack %q", got, want)
		}
	}
	if r.OK() || strings.Contains(got, "LeaderSessionTimeout:") || strings.Contains(got, "PreStopSleep:") {
		t.Fatalf("errors %q", got)
	}
	ok := LeaderBudget(failover.DefaultLeaderSessionTimeout, fleetconfig.DefaultShutdownTimeout, fleetconfig.DefaultPreStopSleep)
	if !ok.OK() || *ok.TerminationGracePeriod != 90 || *ok.Detection != 22 {
		t.Fatalf("default report %+v", ok)
	}
}
