package docgen

import (
	"fmt"
	"strings"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/stopbound"
)

// The bridge's stop time (docs/operations.md), in a file of its own so
// that it registers without touching the table above.
func init() { Tables["bridge-stop"] = bridgeStop }

func bridgeStop() (string, error) {
	var b strings.Builder
	b.WriteString("| bridge.shutdown_timeout | terminationGracePeriodSeconds / TimeoutStopSec |\n|---|---|\n")
	for _, sd := range []time.Duration{10 * time.Second, config.DefaultShutdownTimeout, time.Minute, 2 * time.Minute} {
		d, err := stopbound.Stop(sd)
		if err != nil {
			return "", err
		}
		def := ""
		if sd == config.DefaultShutdownTimeout {
			def = " (default)"
		}
		fmt.Fprintf(&b, "| %s%s | %s |\n", secs(sd), def, secs(d))
	}
	return b.String(), nil
}
