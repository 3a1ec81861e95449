package routing_test

import (
	"context"
	"slices"
	"testing"

	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/sender"
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
			waitFor(t, "the last mapped message", func() bool { return len(got()) >= 3 })
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
