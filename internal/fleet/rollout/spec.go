package rollout

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Failure policies.
const (
	PolicyPause    = "pause"
	PolicyRollback = "rollback"
)

// Spec is how a rollout proceeds. Durations are seconds (JSON _s keys).
type Spec struct {
	// Waves are cumulative targets: "1" (an absolute number of agents,
	// e.g. a canary of one) or "10%" (a share of the planned agents). The
	// last must be "100%". Waves that would add no agent are dropped when
	// the rollout is planned.
	Waves []string `json:"waves"`
	// MaxInProgress bounds the agents that were sent the new revision and
	// have not reported it yet.
	MaxInProgress int `json:"max_in_progress"`
	// BakeS: each agent of a wave must report APPLIED and stay healthy this
	// long before the next wave starts (absent: DefaultBake; 0: no bake).
	BakeS *float64 `json:"bake_s,omitempty"`
	// ApplyTimeoutS: an agent that does not report APPLIED or FAILED this
	// long after it was sent the revision counts as failed.
	ApplyTimeoutS float64 `json:"apply_timeout_s"`
	// FailurePolicy is pause or rollback: what happens when more than
	// MaxFailed agents (or more than MaxFailedPercent % of the planned
	// agents) failed or turned unhealthy.
	FailurePolicy    string  `json:"failure_policy"`
	MaxFailed        int     `json:"max_failed"`
	MaxFailedPercent float64 `json:"max_failed_percent"`
	// Selector narrows the configuration's selector (key=value pairs).
	Selector map[string]string `json:"selector,omitempty"`
	// Order is the wave order: OrderUID (by instance uid, the default) or
	// OrderStandbysFirst (bridges: every standby before the owner of its
	// bridge id, and an owner sent only once a standby of its bridge is
	// healthy on the new revision).
	Order string `json:"order,omitempty"`
}

// Wave orders (Spec.Order).
const (
	OrderUID           = "uid"
	OrderStandbysFirst = "standbys-first"
)

// Orders lists the wave orders.
var Orders = []string{OrderUID, OrderStandbysFirst}

// Defaults of a Spec.
var (
	DefaultWaves         = []string{"1", "10%", "50%", "100%"}
	DefaultMaxInProgress = 100
	DefaultBake          = time.Minute
	DefaultApplyTimeout  = 5 * time.Minute
)

// WithDefaults fills unset fields.
func (s Spec) WithDefaults() Spec {
	if len(s.Waves) == 0 {
		s.Waves = append([]string(nil), DefaultWaves...)
	}
	if s.MaxInProgress == 0 {
		s.MaxInProgress = DefaultMaxInProgress
	}
	if s.BakeS == nil {
		s.BakeS = Secs(DefaultBake.Seconds())
	}
	if s.ApplyTimeoutS == 0 {
		s.ApplyTimeoutS = DefaultApplyTimeout.Seconds()
	}
	if s.FailurePolicy == "" {
		s.FailurePolicy = PolicyPause
	}
	if s.Order == "" {
		s.Order = OrderUID
	}
	return s
}

// Secs returns a pointer to a number of seconds (for Spec.BakeS).
func Secs(s float64) *float64 { return &s }

// Bake is BakeS as a duration.
func (s Spec) Bake() time.Duration {
	if s.BakeS == nil {
		return DefaultBake
	}
	return time.Duration(*s.BakeS * float64(time.Second))
}

// ApplyTimeout is ApplyTimeoutS as a duration.
func (s Spec) ApplyTimeout() time.Duration {
	return time.Duration(s.ApplyTimeoutS * float64(time.Second))
}

// wave is one parsed wave target.
type wave struct {
	count   int     // absolute, when percent is 0
	percent float64 // (0, 100]
}

func parseWave(s string) (wave, error) {
	s = strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || !(f > 0 && f <= 100) {
			return wave{}, errors.New("a percentage must be within (0, 100]")
		}
		return wave{percent: f}, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return wave{}, errors.New(`must be a number of agents (at least 1) or a percentage such as "10%"`)
	}
	return wave{count: n}, nil
}

// Validate checks a spec (after WithDefaults).
func (s Spec) Validate() error {
	var errs []error
	lastPct := 0.0
	for i, w := range s.Waves {
		pw, err := parseWave(w)
		if err != nil {
			errs = append(errs, fmt.Errorf("waves[%d] %q: %w", i, w, err))
			continue
		}
		if pw.percent > 0 {
			if pw.percent <= lastPct {
				errs = append(errs, fmt.Errorf("waves[%d] %q: percentages must increase", i, w))
			}
			lastPct = pw.percent
		} else if lastPct > 0 {
			errs = append(errs, fmt.Errorf("waves[%d] %q: an absolute number of agents must come before the percentages", i, w))
		}
	}
	if n := len(s.Waves); n == 0 || strings.TrimSpace(s.Waves[n-1]) != "100%" {
		errs = append(errs, fmt.Errorf("waves %q: the last wave must be \"100%%\"", s.Waves))
	}
	if len(s.Waves) > 100 {
		errs = append(errs, fmt.Errorf("waves: %d waves, at most 100", len(s.Waves)))
	}
	if s.MaxInProgress < 1 || s.MaxInProgress > 100000 {
		errs = append(errs, fmt.Errorf("max_in_progress %d: must be within [1, 100000]", s.MaxInProgress))
	}
	if b := s.Bake().Seconds(); b < 0 || b > 86400 || math.IsNaN(b) {
		errs = append(errs, fmt.Errorf("bake_s %v: must be within [0, 86400] seconds", b))
	}
	if s.ApplyTimeoutS < 1 || s.ApplyTimeoutS > 86400 || math.IsNaN(s.ApplyTimeoutS) {
		errs = append(errs, fmt.Errorf("apply_timeout_s %v: must be within [1, 86400] seconds", s.ApplyTimeoutS))
	}
	if s.FailurePolicy != PolicyPause && s.FailurePolicy != PolicyRollback {
		errs = append(errs, fmt.Errorf("failure_policy %q: must be pause or rollback", s.FailurePolicy))
	}
	if s.MaxFailed < 0 {
		errs = append(errs, fmt.Errorf("max_failed %d: must not be negative", s.MaxFailed))
	}
	if s.MaxFailedPercent < 0 || s.MaxFailedPercent > 100 || math.IsNaN(s.MaxFailedPercent) {
		errs = append(errs, fmt.Errorf("max_failed_percent %v: must be within [0, 100] (0: not used)", s.MaxFailedPercent))
	}
	if !slices.Contains(Orders, s.Order) {
		errs = append(errs, fmt.Errorf("order %q: must be %s", s.Order, strings.Join(Orders, " or ")))
	}
	for k := range s.Selector {
		if strings.TrimSpace(k) == "" {
			errs = append(errs, errors.New("selector: keys must not be empty"))
		}
	}
	return errors.Join(errs...)
}

// WaveSizes splits n agents into the waves of the spec: the number of new
// agents of each wave, without the waves that add none. Wave i reaches the
// cumulative target min(n, count) or ceil(percent·n/100).
func (s Spec) WaveSizes(n int) []int {
	var sizes []int
	done := 0
	for _, w := range s.Waves {
		pw, err := parseWave(w)
		if err != nil {
			continue
		}
		target := pw.count
		if pw.percent > 0 {
			target = int(math.Ceil(pw.percent * float64(n) / 100))
		}
		target = min(target, n)
		if target > done {
			sizes = append(sizes, target-done)
			done = target
		}
	}
	if done < n {
		sizes = append(sizes, n-done)
	}
	return sizes
}
