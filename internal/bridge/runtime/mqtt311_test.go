package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	paho3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
	"github.com/myriarch/myriarch/internal/faultnet"
	"github.com/myriarch/myriarch/internal/testwait"
	"github.com/myriarch/myriarch/lease"
)

// A broker pair for the cross-version routes: mosquitto 2.0 (skipped
// without it unless CI=true) or the embedded mochi-mqtt; both speak 3.1.1
// and 5.
type brokerPair struct {
	a, b string // host:port
	// ordered is false for mochi-mqtt v2.7.9, which resends a resumed
	// session's in-flight messages in an unstable order within a second
	// (whatever the client's protocol version).
	ordered bool
}

func eachBrokerPair(t *testing.T, f func(t *testing.T, p brokerPair)) {
	t.Run("mosquitto", func(t *testing.T) {
		a, b := embroker.TestMosquitto(t, ""), embroker.TestMosquitto(t, "")
		f(t, brokerPair{a.Addr, b.Addr, true})
	})
	t.Run("embedded", func(t *testing.T) {
		var addrs []string
		for range 2 {
			br, err := embroker.Start("", nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = br.Close() })
			addrs = append(addrs, br.Addr)
		}
		f(t, brokerPair{addrs[0], addrs[1], false})
	})
}

// client311 is a plain MQTT 3.1.1 client; onMessage, if set, receives
// what its subscriptions deliver.
func client311(t *testing.T, addr string, onMessage func(topic, payload string)) paho3.Client {
	t.Helper()
	o := paho3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(fmt.Sprintf("c-%d", time.Now().UnixNano())).
		SetProtocolVersion(4).SetAutoReconnect(false)
	if onMessage != nil {
		o.SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) { onMessage(m.Topic(), string(m.Payload())) })
	}
	c := paho3.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", addr, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(250) })
	return c
}

func wait311(t *testing.T, tok paho3.Token) {
	t.Helper()
	if !tok.WaitTimeout(20*time.Second) || tok.Error() != nil {
		t.Fatalf("token: %v", tok.Error())
	}
}

// proxyTo is a TCP proxy to target whose Cut drops the open connections.
func proxyTo(t *testing.T, target string) *faultnet.Proxy {
	t.Helper()
	px, err := faultnet.Listen(faultnet.Options{}, target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	return px
}

// versionsTemplate bridges broker A to broker B three ways: 3.1.1 → 3.1.1
// (route v311-v311, destination prefix a/), 3.1.1 → 5 (b/) and 5 → 3.1.1
// (c/), on persistent sessions so that a cut connection loses nothing.
const versionsTemplate = `
bridge: {id: v, instance_id: i, shutdown_timeout: 5s, http: {listen: "off"}, dead_letter: {path: DIR/dl.jsonl}, state_dir: DIR}
sessions:
  - {id: s311, session_mode: persistent, protocol_version: 3.1.1, brokers: ["SRC"], client_id: v-s311, keep_alive: 2s, connect_timeout: 2s, reconcile_timeout: 2s, unmatched_grace: 1s}
  - {id: s5, session_mode: persistent, brokers: ["SRC"], client_id: v-s5, keep_alive: 2s, connect_timeout: 2s, reconcile_timeout: 2s, unmatched_grace: 1s}
receivers:
  - {id: r311, session: s311, topics: [{filter: "v311/#", qos: 1}]}
  - {id: r5, session: s5, topics: [{filter: "v5/#", qos: 1}]}
senders:
  - {id: to311, type: mqtt, mqtt: {broker: "DST", protocol_version: 3.1.1, qos: 1, connect_timeout: 2s, timeout: 5s}, retry: {max_attempts: 100, initial_backoff: 10ms, max_backoff: 200ms}}
  - {id: to5, type: mqtt, mqtt: {broker: "DST", qos: 1, connect_timeout: 2s, timeout: 5s}, retry: {max_attempts: 100, initial_backoff: 10ms, max_backoff: 200ms}}
routes:
  - {id: v311-v311, receiver: r311, senders: [to311], rewrite: {add_prefix: "a/"}}
  - {id: v311-v5, receiver: r311, senders: [to5], rewrite: {add_prefix: "b/"}}
  - {id: v5-v311, receiver: r5, senders: [to311], rewrite: {add_prefix: "c/"}}
`

// Routes between MQTT 3.1.1 and MQTT 5 brokers in every combination carry
// every message, in publish order per topic, also when the connections on
// both sides are cut mid-stream (at-least-once: what was not acknowledged
// is delivered again).
func TestRoutesAcrossProtocolVersions(t *testing.T) {
	eachBrokerPair(t, func(t *testing.T, p brokerPair) {
		dir := t.TempDir()
		src, dst := proxyTo(t, p.a), proxyTo(t, p.b)
		y := strings.NewReplacer("DIR", dir, "SRC", "tcp://"+src.Addr(), "DST", "tcp://"+dst.Addr()).Replace(versionsTemplate)
		cfg, err := config.Parse(filepath.Join(dir, "v.yaml"), []byte(y))
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var got []string
		sub := client311(t, p.b, func(topic, payload string) {
			mu.Lock()
			got = append(got, topic+":"+payload)
			mu.Unlock()
		})
		wait311(t, sub.SubscribeMultiple(map[string]byte{"a/#": 1, "b/#": 1, "c/#": 1}, nil))
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		b, err := runtime.New(context.Background(), cfg, runtime.Options{Logger: log})
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
		testwait.Until(t, "both sessions full", waitLimit, func() bool {
			st := b.Status()
			return st.Sessions[0].ServiceLevel == "full" && st.Sessions[1].ServiceLevel == "full"
		})
		pubc := client311(t, p.a, nil)
		const n = 200
		for i := range n {
			for _, topic := range []string{"v311/x", "v311/y", "v5/x", "v5/y"} {
				wait311(t, pubc.Publish(topic, 1, false, strconv.Itoa(i)))
			}
			switch i {
			case n / 3:
				src.Cut()
			case 2 * n / 3:
				dst.Cut()
			}
		}
		want := map[string]string{"a/v311/": "3.1.1 → 3.1.1", "b/v311/": "3.1.1 → 5", "c/v5/": "5 → 3.1.1"}
		count := func() map[string]int {
			mu.Lock()
			defer mu.Unlock()
			seen := map[string]bool{}
			per := map[string]int{}
			for _, g := range got {
				if !seen[g] {
					seen[g] = true
					for prefix := range want {
						if strings.HasPrefix(g, prefix) {
							per[prefix]++
						}
					}
				}
			}
			return per
		}
		testwait.Until(t, "every message on every route", waitLimit, func() bool {
			per := count()
			return per["a/v311/"] == 2*n && per["b/v311/"] == 2*n && per["c/v5/"] == 2*n
		})
		if p.ordered {
			mu.Lock()
			checkFirstArrivals(t, got)
			mu.Unlock()
		}
		t.Logf("%v: %d messages per route, connections cut on both sides", count(), 2*n)
	})
}

// checkFirstArrivals fails unless, per topic, the first arrivals of the
// payloads (integers) increase.
func checkFirstArrivals(t *testing.T, got []string) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	for _, g := range got {
		if seen[g] {
			continue
		}
		seen[g] = true
		topic, v, _ := strings.Cut(g, ":")
		n, _ := strconv.Atoi(v)
		if l, ok := last[topic]; ok && n < l {
			t.Fatalf("topic %s: %d arrived first after %d", topic, n, l)
		}
		last[topic] = n
	}
}

// v311 makes a template's exclusive session speak MQTT 3.1.1.
func v311(y string) string {
	return strings.Replace(y, "    client_id: plant-bridge\n", "    client_id: plant-bridge\n    protocol_version: 3.1.1\n", 1)
}

// An exclusive session on MQTT 3.1.1 keeps the exclusive semantics: every
// owner connects with the same client_id and CleanSession false, so the
// successor resumes the broker session and receives what was published
// while no instance was connected; the activation bound is declared.
func TestExclusiveSession311ResumesAcrossOwners(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	watch := &connectWatch{}
	if err := br.Server.AddHook(watch, nil); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sk := newStampSink(t)
	began := time.Now()
	a := startWith(t, v311(cfgTemplate), dir, "a", br.URL, sk.srv.URL, runtime.Options{})
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return role(a) == "owner/full" })
	cl, ok := br.Server.Clients.Get("plant-bridge")
	if !ok {
		t.Fatal("no client with the session's fixed client_id")
	}
	if v := cl.Properties.ProtocolVersion; v != 4 {
		t.Fatalf("the session connected with protocol version %d, want 4 (3.1.1)", v)
	}
	if cl.Properties.Clean {
		t.Fatal("the exclusive session connected with CleanSession true")
	}
	budget := a.b.Status().Sessions[0].Budget
	if budget == nil || budget.Activation == nil || *budget.Activation != 8 {
		t.Fatalf("activation bound not declared as 2·1s + 4·1s + 2·1s: %+v", budget)
	}
	p := publisher(t, br.URL)
	pub(t, p, 0, 5)
	testwait.Until(t, "5 delivered by a", waitLimit, func() bool { return len(sk.deliveries()) >= 5 })

	// A planned stop: a releases the lease, its broker session stays.
	a.cancel()
	if err := <-a.done; err != nil {
		t.Fatal(err)
	}
	a.done <- nil
	pub(t, p, 5, 15)
	b := startWith(t, v311(cfgTemplate), dir, "b", br.URL, sk.srv.URL, runtime.Options{})
	testwait.Until(t, "b owns and serves", waitLimit, func() bool { return role(b) == "owner/full" })
	testwait.Until(t, "the 10 queued messages delivered by b", waitLimit, func() bool {
		seen := map[string]bool{}
		for _, d := range sk.deliveries() {
			if d.version == "2" {
				seen[d.payload] = true
			}
		}
		return len(seen) == 10
	})
	for _, d := range sk.deliveries() {
		n, _ := strconv.Atoi(d.payload)
		if (n < 5) != (d.version == "1") {
			t.Fatalf("delivery %+v: messages 0-4 come from a (version 1), 5-14 from b (version 2)", d)
		}
	}
	if n := watch.since("plant-bridge", began); n != 2 {
		t.Fatalf("%d sessions established with the fixed client_id, want one per owner", n)
	}
}

// The frozen-owner check of the MQTT 5 session, on 3.1.1: past its lease
// deadline the owner hands nothing on and, when its connection drops, does
// not reconnect with the session's client_id.
func TestFrozenOwner311DoesNotActPastItsDeadline(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	watch := &connectWatch{}
	if err := br.Server.AddHook(watch, nil); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sk := newStampSink(t)
	clk := &lease.JumpClock{}
	a := startWith(t, v311(freezeTemplate), dir, "a", br.URL, sk.srv.URL, runtime.Options{Clock: clk})
	testwait.Until(t, "a owns and serves", waitLimit, func() bool { return role(a) == "owner/full" })
	p := publisher(t, br.URL)
	pub(t, p, 0, 5)
	testwait.Until(t, "first 5 delivered", waitLimit, func() bool { return len(sk.deliveries()) >= 5 })

	clk.Jump(2 * time.Minute)
	frozenAt := time.Now()
	before := len(sk.deliveries())
	pub(t, p, 5, 10)
	cl, ok := br.Server.Clients.Get("plant-bridge")
	if !ok {
		t.Fatal("the owner's client is not connected")
	}
	cl.Stop(errors.New("test: connection dropped"))
	time.Sleep(3 * time.Second) // well above the reconnect backoff and the sender's pipeline
	if got := sk.deliveries()[before:]; len(got) > 0 {
		t.Errorf("the owner delivered %d message(s) after its deadline, first %+v", len(got), got[0])
	}
	if n := watch.since("plant-bridge", frozenAt); n > 0 {
		t.Errorf("the owner reconnected %d time(s) with the session's client_id after its deadline", n)
	}
}
