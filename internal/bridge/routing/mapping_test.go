package routing_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport"
	"github.com/myriarch/myriarch/internal/testwait"
)

var plantMappings = []routing.Mapping{
	{Pattern: "sensors/#", SourcePrefix: "in/plant1/", DestinationPrefix: "out/site-a/"},
	{Pattern: "alarms/+", SourcePrefix: "in/plant1/", DestinationPrefix: "out/ops/"},
	{Pattern: "#", SourcePrefix: "in/plant2/", DestinationPrefix: "out/site-b/"},
}

// Several mappings per route, each with its own prefixes; the first that
// matches maps the topic; a topic no mapping matches is not the route's.
func TestMappings(t *testing.T) {
	r := routing.NewRoute(routing.RouteConfig{ID: "r", Filters: []string{"in/#"}, Mappings: plantMappings,
		Targets: []routing.Target{{ID: "h", Sender: nopSender{}}}})
	defer r.Close()
	for topic, want := range map[string]string{
		"in/plant1/sensors/t1":  "out/site-a/sensors/t1",
		"in/plant1/alarms/fire": "out/ops/alarms/fire",
		"in/plant2/anything/x":  "out/site-b/anything/x",
		"in/plant1/alarms/a/b":  "",
		"in/plant1/other":       "",
	} {
		if got := r.Matches(topic); got != (want != "") {
			t.Errorf("Matches(%q) = %v", topic, got)
		}
		if want != "" && r.Rewrite(topic) != want {
			t.Errorf("Rewrite(%q) = %q, want %q", topic, r.Rewrite(topic), want)
		}
	}
}

type nopSender struct{}

func (nopSender) Send(_ *sender.Message, done func(error)) { done(nil) }
func (nopSender) Close(context.Context) error              { return nil }

// TestMappingsEndToEnd: the mapped topics arrive at broker B, an unmapped
// one does not.
func TestMappingsEndToEnd(t *testing.T) {
	for _, kind := range []string{"embedded", "mosquitto"} {
		t.Run(kind, func(t *testing.T) {
			a, b := brokerPair(t, kind)
			got := collect(t, b, "#")
			runBridge(t, a, b, routing.RouteConfig{Mappings: plantMappings})
			for _, topic := range []string{"in/plant1/other", "in/plant1/sensors/t1", "in/plant1/alarms/fire", "in/plant2/x"} {
				publishNow(t, a, &sender.Message{Topic: topic, Payload: []byte(topic), QoS: 1})
			}
			testwait.Until(t, "the last mapped message", waitLimit, func() bool { return len(got()) >= 3 })
			var topics []string
			for _, p := range got() {
				topics = append(topics, p.Topic)
			}
			// Different topics: brokers keep no order among them.
			slices.Sort(topics)
			want := []string{"out/ops/alarms/fire", "out/site-a/sensors/t1", "out/site-b/x"}
			if !slices.Equal(topics, want) {
				t.Fatalf("broker B got %v, want %v", topics, want)
			}
		})
	}
}

// topics records the topic of every message it accepts.
type topics struct {
	mu  sync.Mutex
	got []string
}

func (s *topics) Send(m *sender.Message, done func(error)) {
	s.mu.Lock()
	s.got = append(s.got, m.Topic)
	s.mu.Unlock()
	done(nil)
}
func (s *topics) Close(context.Context) error { return nil }

// The route caches rewritten topics (a table of 64): with more topics
// than entries, each seen twice, every message still gets its own
// topic's rewrite, for prefixes and for mappings.
func TestRewriteCacheKeepsEachTopicsRewrite(t *testing.T) {
	for name, cfg := range map[string]routing.RouteConfig{
		"prefixes": {StripPrefix: "in/plant1/", AddPrefix: "out/"},
		"mappings": {Mappings: plantMappings},
	} {
		rec := &topics{}
		cfg.ID, cfg.Filters, cfg.Targets = "r", []string{"in/#"}, []routing.Target{{ID: "h", Sender: rec}}
		r := routing.NewRoute(cfg)
		var want []string
		for round := range 2 {
			for i := range 200 {
				topic := fmt.Sprintf("in/plant1/sensors/%d", (i*7+round)%200)
				want = append(want, r.Rewrite(topic))
				if err := r.Deliver(&transport.Message{Topic: topic, QoS: 1}, func() {}); err != nil {
					t.Fatal(err)
				}
			}
		}
		r.Close()
		rec.mu.Lock()
		if !slices.Equal(rec.got, want) {
			t.Errorf("%s: delivered topics differ from Rewrite's", name)
		}
		if want[0] == "in/plant1/sensors/0" {
			t.Errorf("%s: nothing was rewritten", name)
		}
		rec.mu.Unlock()
	}
}
