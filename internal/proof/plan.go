// Package proof runs a proof campaign: many randomized, seeded failover
// rounds of the bridge lab (internal/bridge/lab: real bridge processes on
// sqlite, PostgreSQL and etcd, behind the embedded broker or mosquitto)
// and of the leader lab (internal/leaderlab: myriarchd's pgleader), each
// judged on its whole history, written one JSON line per round to a
// report directory that a rerun continues, and drawn as an HTML page with
// SVG plots. It is lab machinery for `myriarch-lab proof`; no production
// binary links it.
package proof

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/lab"
	"github.com/myriarch/myriarch/internal/leaderlab"
)

// Kinds of rounds.
const (
	KindBridge = "bridge"
	KindLeader = "leader"
)

// StoreLeader is the store label of leader rounds: myriarchd's pgleader on
// PostgreSQL.
const StoreLeader = "pgleader"

// Brokers of bridge rounds.
const (
	BrokerEmbedded  = "embedded"
	BrokerMosquitto = "mosquitto"
)

// MosquittoQueue is the max_queued_messages of the campaign's mosquitto:
// room for a whole failover at the highest rate, so that admission
// predicts no loss.
const MosquittoQueue = 100000

// Rates are the publisher rates a bridge batch draws from (msg/s).
var Rates = []int{50, 100, 200}

// Size is how much a campaign runs.
type Size struct {
	Name string `json:"name"`
	// BridgePerStore rounds on each bridge store, in batches of Batch
	// rounds that share one running pair, broker and store.
	BridgePerStore int `json:"bridge_rounds_per_store"`
	Batch          int `json:"bridge_batch"`
	// Leader rounds in batches of LeaderBatch that share one PostgreSQL.
	Leader      int `json:"leader_rounds"`
	LeaderBatch int `json:"leader_batch"`
	// Parallel batches run at once (each with its own ports, store and
	// broker).
	Parallel int `json:"parallel"`
}

// Sizes are the named campaign sizes.
var Sizes = map[string]Size{
	"smoke":  {Name: "smoke", BridgePerStore: 8, Batch: 4, Leader: 8, LeaderBatch: 4, Parallel: 4},
	"medium": {Name: "medium", BridgePerStore: 100, Batch: 10, Leader: 100, LeaderBatch: 10, Parallel: 4},
	"full":   {Name: "full", BridgePerStore: 1000, Batch: 10, Leader: 1000, LeaderBatch: 20, Parallel: 6},
}

// Seeds: a round's seed is base<<roundBits | index. The base, shared by
// the rounds of a batch, carries the batch's set-up in its low bits
// (kind and store, broker, rate); the whole seed draws the round's fault
// and timing. So one seed names one round completely, and --replay
// reruns it.
const (
	roundBits = 12
	storeBits = 2 // 0 sqlite, 1 postgres, 2 etcd, 3 leader
)

var storeOfBits = []string{lab.StoreSQLite, lab.StorePostgres, lab.StoreEtcd, StoreLeader}

// Spec is one round, decoded from its seed.
type Spec struct {
	Seed     int64
	Kind     string
	Store    string
	Broker   string
	Rate     int
	Scenario string
	// Delay: stable pair → fault (bridge), or the follower's extra settle
	// time before the fault (leader), its place in the renew or retry
	// cycle.
	Delay time.Duration
	// Second and Blip time an overlapping second fault.
	Second, Blip time.Duration
}

// Base is a batch's seed base for a store and broker, with random bits
// from r.
func Base(r *rand.Rand, store, broker string, rate int) (int64, error) {
	si := slices.Index(storeOfBits, store)
	if si < 0 {
		return 0, fmt.Errorf("store %q: must be one of sqlite, postgres, etcd, %s", store, StoreLeader)
	}
	ri := slices.Index(Rates, rate)
	if ri < 0 {
		ri = 1
	}
	b := int64(si)
	if broker == BrokerMosquitto {
		b |= 1 << storeBits
	}
	b |= int64(ri) << (storeBits + 1)
	b |= r.Int64N(1<<30) << (storeBits + 3)
	return b, nil
}

// Seed is round i of the batch with base b.
func Seed(b int64, i int) int64 { return b<<roundBits | int64(i) }

// BridgeScenarios are the scenarios a bridge round on store draws from.
func BridgeScenarios(store string) []string {
	var out []string
	for _, sc := range append(slices.Clone(lab.AllScenarios), lab.ExtraScenarios...) {
		if store == lab.StoreSQLite && lab.NeedsStorePath(sc) {
			continue
		}
		out = append(out, sc)
	}
	return out
}

// Decode is the round a seed names.
func Decode(seed int64) (Spec, error) {
	if seed < 0 {
		return Spec{}, fmt.Errorf("seed %d: must not be negative", seed)
	}
	base := seed >> roundBits
	s := Spec{Seed: seed, Store: storeOfBits[base&(1<<storeBits-1)]}
	h := splitmix(uint64(seed))
	r := rand.New(rand.NewPCG(h, splitmix(h^0x70726f6f66)))
	if s.Store == StoreLeader {
		s.Kind = KindLeader
		s.Scenario = leaderlab.Scenarios[r.IntN(len(leaderlab.Scenarios))]
		s.Delay = time.Duration(r.Int64N(int64(2 * time.Second)))
		return s, nil
	}
	s.Kind = KindBridge
	s.Broker = BrokerEmbedded
	if base>>storeBits&1 == 1 {
		s.Broker = BrokerMosquitto
	}
	ri := int(base >> (storeBits + 1) & 3)
	if ri >= len(Rates) {
		return Spec{}, fmt.Errorf("seed %d: rate bits %d name no rate", seed, ri)
	}
	s.Rate = Rates[ri]
	scs := BridgeScenarios(s.Store)
	s.Scenario = scs[r.IntN(len(scs))]
	// The lab's lease renews every 2s (lease_ttl 6s): a delay across one
	// renew interval puts the fault anywhere in the cycle.
	s.Delay = 50*time.Millisecond + time.Duration(r.Int64N(int64(2*time.Second)))
	s.Second = time.Duration(r.Int64N(int64(3 * time.Second)))
	s.Blip = 500*time.Millisecond + time.Duration(r.Int64N(int64(2500*time.Millisecond)))
	return s, nil
}

// Planned is the lab's form of a bridge round.
func (s Spec) Planned() lab.Planned {
	return lab.Planned{Scenario: s.Scenario, Delay: s.Delay, Second: s.Second, Blip: s.Blip}
}

// Batch is a unit of work: rounds that share one set-up.
type Batch struct {
	Index int
	Base  int64
	// First is the index (in the seed) of the batch's first round: 0 but
	// for a replay.
	First int
	N     int
}

// Plan lays out a campaign's batches: the bridge stores in turn, the
// broker alternating, and the leader batches spread among them, all from
// seed.
func Plan(seed int64, size Size, stores []string, leader bool) ([]Batch, error) {
	h := splitmix(uint64(seed))
	r := rand.New(rand.NewPCG(h, splitmix(h^0x63616d706169676e)))
	type want struct {
		store string
		left  int
		per   int
	}
	var ws []*want
	for _, st := range stores {
		if st == StoreLeader || !slices.Contains(lab.Stores, st) {
			return nil, fmt.Errorf("store %q: must be one of %v", st, lab.Stores)
		}
		if size.BridgePerStore > 0 {
			ws = append(ws, &want{st, size.BridgePerStore, max(1, size.Batch)})
		}
	}
	if leader && size.Leader > 0 {
		ws = append(ws, &want{StoreLeader, size.Leader, max(1, size.LeaderBatch)})
	}
	var out []Batch
	for turn := 0; ; turn++ {
		progressed := false
		for _, w := range ws {
			if w.left <= 0 {
				continue
			}
			n := min(w.left, w.per, 1<<roundBits)
			w.left -= n
			broker := BrokerEmbedded
			if w.store != StoreLeader && (len(out)+turn)%2 == 1 {
				broker = BrokerMosquitto
			}
			rate := Rates[r.IntN(len(Rates))]
			b, err := Base(r, w.store, broker, rate)
			if err != nil {
				return nil, err
			}
			out = append(out, Batch{Index: len(out), Base: b, N: n})
			progressed = true
		}
		if !progressed {
			return out, nil
		}
	}
}

// splitmix is SplitMix64's finalizer: neighbouring seeds (the rounds of a
// batch) give unrelated random sources.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
