package budget

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzBridgeBudgetFlags feeds arbitrary values to every duration flag: the
// command never panics, always prints one JSON object, and an admitted
// configuration always has a budget no smaller than its lease TTL.
func FuzzBridgeBudgetFlags(f *testing.F) {
	f.Add("clustered", "45s", "", "", "", "", "3", "5s", "0s", "30s", "90s", "10m")
	f.Add("standalone", "", "", "", "", "", "", "", "", "", "off", "")
	f.Add("x", "2562047h", "1ns", "-1s", "1e3s", "0", "-3", "5h", "11m", "9223372036s", "0s", "1ms")
	f.Fuzz(func(t *testing.T, mode, ttl, interval, jitter, call, poll, mrf, grace, startup, connect, bh, slo string) {
		args := []string{"--deployment-mode", mode, "--lease-ttl", ttl, "--renew-interval", interval, "--lease-renew-jitter", jitter,
			"--renew-call-timeout", call, "--acquire-poll-interval", poll, "--max-renew-fails", mrf, "--step-down-grace", grace,
			"--startup-allowance", startup, "--connect-timeout", connect, "--broker-health-step-down", bh, "--failover-slo", slo, "--json"}
		var out, errOut bytes.Buffer
		code := RunBridgeBudget(args, &out, &errOut)
		var r struct {
			Admitted   bool     `json:"admitted"`
			TTL        *float64 `json:"lease_ttl_s"`
			OwnerDeath *float64 `json:"owner_death_budget_s"`
			SLO        *float64 `json:"failover_slo_s"`
			Errors     []string `json:"errors"`
		}
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("not JSON (%v): %q", err, out.String())
		}
		if r.Admitted != (code == 0) || r.Admitted != (len(r.Errors) == 0) {
			t.Fatalf("admitted %v, exit %d, errors %v", r.Admitted, code, r.Errors)
		}
		if r.Admitted && (r.OwnerDeath == nil || r.TTL == nil || *r.OwnerDeath < *r.TTL) {
			t.Fatalf("admitted with budget %v and TTL %v", r.OwnerDeath, r.TTL)
		}
		if r.Admitted && r.SLO != nil && *r.OwnerDeath > *r.SLO {
			t.Fatalf("admitted with budget %v above SLO %v", *r.OwnerDeath, *r.SLO)
		}
	})
}
