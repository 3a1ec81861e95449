package runtime_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
	"github.com/myriarch/myriarch/internal/testwait"
)

// TestLoopPairFromConfig: a bridge configured with two routes in opposite
// directions between brokers A and B, named as each other's loop_peer,
// delivers what is published on each broker to the other exactly once and
// sends nothing back (the routing package tests the pair in depth, also
// against mosquitto; this checks that the configuration reaches the
// routes).
func TestLoopPairFromConfig(t *testing.T) {
	urls := make([]string, 2)
	for i := range urls {
		br, err := embroker.Start("", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = br.Close() })
		urls[i] = br.URL
	}
	dir := t.TempDir()
	y := strings.NewReplacer("DIR", dir, "BROKER_A", urls[0], "BROKER_B", urls[1]).Replace(`
bridge: {id: ab, instance_id: i, http: {listen: "off"}, dead_letter: {path: DIR/dl.jsonl}}
sessions:
  - {id: a, brokers: ["BROKER_A"], connect_timeout: 1s, reconcile_timeout: 1s, unmatched_grace: 1s}
  - {id: b, brokers: ["BROKER_B"], connect_timeout: 1s, reconcile_timeout: 1s, unmatched_grace: 1s}
receivers:
  - {id: from-a, session: a, topics: [{filter: "x/#"}]}
  - {id: from-b, session: b, topics: [{filter: "x/#"}]}
senders:
  - {id: to-a, type: mqtt, mqtt: {broker: "BROKER_A"}}
  - {id: to-b, type: mqtt, mqtt: {broker: "BROKER_B"}}
routes:
  - {id: a-to-b, receiver: from-a, senders: [to-b], loop_peer: b-to-a}
  - {id: b-to-a, receiver: from-b, senders: [to-a], loop_peer: a-to-b}
`)
	cfg, err := config.Parse(filepath.Join(dir, "ab.yaml"), []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	b, err := runtime.New(context.Background(), cfg, runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	testwait.Until(t, "both sessions active and full", waitLimit, func() bool {
		for _, s := range b.Status().Sessions {
			if s.Role+"/"+s.ServiceLevel != "active/full" {
				return false
			}
		}
		return true
	})
	var mu sync.Mutex
	seen := [2]map[string]int{{}, {}}
	total := [2]int{}
	for i, url := range urls {
		c, err := embroker.Connect(context.Background(), url, fmt.Sprintf("watch-%d-%d", i, time.Now().UnixNano()), true, func(p *paho.Publish) {
			mu.Lock()
			seen[i][p.Topic+" "+string(p.Payload)]++
			total[i]++
			mu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		if err := c.Subscribe(context.Background(), "x/#", 1); err != nil {
			t.Fatal(err)
		}
	}
	const n = 50
	for i, url := range urls {
		p := publisher(t, url)
		for j := range n {
			if _, err := p.Publish(context.Background(), &paho.Publish{Topic: fmt.Sprintf("x/from-%d", i), QoS: 1, Payload: fmt.Append(nil, j)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Wait for both sides to have everything, then for 2s without a new
	// message: an echo would keep them counting.
	last, since := "", time.Now()
	deadline := time.Now().Add(30 * time.Second)
	for {
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		cur, enough := fmt.Sprint(total), total[0] >= 2*n && total[1] >= 2*n
		mu.Unlock()
		if cur != last {
			last, since = cur, time.Now()
		}
		if enough && time.Since(since) >= 2*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("received %s after 30s, want %d on each broker and then quiet", cur, 2*n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range urls {
		if total[i] != 2*n || len(seen[i]) != 2*n {
			t.Errorf("broker %d: %d messages, %d distinct, want %d of each (each once)", i, total[i], len(seen[i]), 2*n)
		}
	}
}
