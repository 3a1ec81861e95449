package replay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/deadletter"
	"github.com/myriarch/myriarch/internal/bridge/deadletter/replay"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	httpsender "github.com/myriarch/myriarch/internal/bridge/sender/http"
	mqttsender "github.com/myriarch/myriarch/internal/bridge/sender/mqtt"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sink is a real HTTP destination that records what arrives.
type sink struct {
	mu   sync.Mutex
	got  []arrival
	fail func(topic string, n int) bool // n: arrivals of the topic so far
	srv  *httptest.Server
}

type arrival struct {
	at      time.Time
	topic   string
	payload string
	header  http.Header
}

func newSink(t *testing.T) *sink {
	s := &sink{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		topic := r.Header.Get("X-Myriarch-Topic")
		s.mu.Lock()
		n := 0
		for _, a := range s.got {
			if a.topic == topic {
				n++
			}
		}
		fail := s.fail != nil && s.fail(topic, n)
		if !fail {
			s.got = append(s.got, arrival{at: time.Now(), topic: topic, payload: string(b), header: r.Header.Clone()})
		}
		s.mu.Unlock()
		if fail {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *sink) arrivals() []arrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]arrival(nil), s.got...)
}

// deadLetters writes records through the bridge's writer and reads them
// back as the command does.
func deadLetters(t *testing.T, msgs ...*sender.Message) (string, []deadletter.Entry) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dl.jsonl")
	w := deadletter.Open(path)
	for _, m := range msgs {
		if err := w.Write("r1", "s1", m, "5 attempts failed", 5); err != nil {
			t.Fatal(err)
		}
	}
	_ = w.Close()
	entries, problems, err := deadletter.ReadFile(path, 0)
	if err != nil || len(problems) > 0 {
		t.Fatal(err, problems)
	}
	return path, entries
}

func msg(topic, payload string) *sender.Message {
	return &sender.Message{Topic: topic, SourceTopic: "in/" + topic, Payload: []byte(payload), QoS: 1, Retain: true,
		Fence: fence.New(9, "b/s"), Received: time.Now()}
}

func lines(t *testing.T, b *bytes.Buffer) []replay.Line {
	t.Helper()
	var out []replay.Line
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if l == "" {
			continue
		}
		var ln replay.Line
		if err := json.Unmarshal([]byte(l), &ln); err != nil {
			t.Fatalf("not a JSON line: %q: %v", l, err)
		}
		out = append(out, ln)
	}
	return out
}

func openJournal(t *testing.T, dl string) *deadletter.Journal {
	t.Helper()
	j, _, err := deadletter.OpenJournal(deadletter.JournalPath(dl))
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func TestReplayHTTPJournalAndAgain(t *testing.T) {
	s := newSink(t)
	dl, entries := deadLetters(t, msg("a", "1"), msg("b", "2"), msg("a", "3"))
	hs := httpsender.New(httpsender.Config{URL: s.srv.URL})
	defer hs.Close(context.Background())
	opts := func(j *deadletter.Journal, out *bytes.Buffer) replay.Options {
		return replay.Options{Dest: replay.Destination{Sender: "web", Types: map[string]string{"web": "http"}},
			Senders: map[string]sender.Sender{"web": hs}, Journal: j, Run: deadletter.NewID(), Out: out}
	}

	// A dry run sends nothing and records nothing.
	var dry bytes.Buffer
	rj, _, _ := deadletter.ReadJournal(deadletter.JournalPath(dl))
	o := opts(rj, &dry)
	o.DryRun = true
	sum, err := replay.Run(context.Background(), entries, o)
	if err != nil || sum.WouldSend != 3 || len(s.arrivals()) != 0 {
		t.Fatalf("dry run: %+v %v, %d arrived", sum, err, len(s.arrivals()))
	}
	dl0 := lines(t, &dry)
	if len(dl0) != 3 || dl0[0].ID != entries[0].ID || dl0[0].Action != "send" || dl0[0].Sender != "web" || dl0[0].SenderType != "http" ||
		dl0[0].Via != "sender" || dl0[0].Topic != "a" || dl0[0].Bytes != 1 || dl0[0].QoS != 1 || dl0[0].Retain || dl0[0].Outcome != "" {
		t.Fatalf("dry-run lines %+v", dl0)
	}

	j := openJournal(t, dl)
	var out bytes.Buffer
	sum, err = replay.Run(context.Background(), entries, opts(j, &out))
	_ = j.Close()
	if err != nil || sum.Sent != 3 {
		t.Fatalf("replay: %+v %v", sum, err)
	}
	got := s.arrivals()
	if len(got) != 3 || got[0].payload != "1" || got[1].payload != "2" || got[2].payload != "3" {
		t.Fatalf("arrivals %+v", got)
	}
	// No fencing stamp: a replay is no act of the session's lease.
	if v := got[0].header.Get(fence.HeaderLeaseVersion); v != "" {
		t.Fatalf("replayed message carries lease version %q", v)
	}
	for _, ln := range lines(t, &out) {
		if ln.Outcome != deadletter.OutcomeSent {
			t.Fatalf("line %+v", ln)
		}
	}

	// The journal keeps a second replay from sending again...
	j = openJournal(t, dl)
	out.Reset()
	sum, err = replay.Run(context.Background(), entries, opts(j, &out))
	if err != nil || sum.Sent != 0 || sum.Skipped != 3 || len(s.arrivals()) != 3 {
		t.Fatalf("second replay: %+v %v, %d arrived", sum, err, len(s.arrivals()))
	}
	if ln := lines(t, &out)[0]; ln.Action != "skip" || !strings.Contains(ln.SkipReason, "replayed at") {
		t.Fatalf("skip line %+v", ln)
	}
	// ... unless asked to.
	o = opts(j, &out)
	o.Again = true
	sum, err = replay.Run(context.Background(), entries[:1], o)
	_ = j.Close()
	if err != nil || sum.Sent != 1 || len(s.arrivals()) != 4 {
		t.Fatalf("--again: %+v %v", sum, err)
	}
}

// A failed message holds back the later records of its topic (order);
// other topics go on; the next run sends what is left.
func TestReplayFailureKeepsTopicOrder(t *testing.T) {
	s := newSink(t)
	var failing sync.Mutex
	failA := true
	s.fail = func(topic string, n int) bool {
		failing.Lock()
		defer failing.Unlock()
		return topic == "a" && failA
	}
	dl, entries := deadLetters(t, msg("a", "1"), msg("b", "2"), msg("a", "3"))
	hs := httpsender.New(httpsender.Config{URL: s.srv.URL})
	defer hs.Close(context.Background())
	run := func() replay.Summary {
		j := openJournal(t, dl)
		defer j.Close()
		var out bytes.Buffer
		sum, err := replay.Run(context.Background(), entries, replay.Options{Dest: replay.Destination{Sender: "web"},
			Senders: map[string]sender.Sender{"web": hs}, Journal: j, Run: deadletter.NewID(), Out: &out})
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	if sum := run(); sum.Sent != 1 || sum.Failed != 1 || sum.Skipped != 1 {
		t.Fatalf("first run %+v", sum)
	}
	if got := s.arrivals(); len(got) != 1 || got[0].payload != "2" {
		t.Fatalf("arrivals %+v", got)
	}
	failing.Lock()
	failA = false
	failing.Unlock()
	if sum := run(); sum.Sent != 2 || sum.Skipped != 1 {
		t.Fatalf("second run %+v", sum)
	}
	got := s.arrivals()
	if len(got) != 3 || got[1].payload != "1" || got[2].payload != "3" {
		t.Fatalf("arrivals %+v", got)
	}
}

// The rate limit: the i-th message cannot start before i/rate after the
// run began. Lower bounds only, taken before the run: they cannot flake.
func TestReplayRate(t *testing.T) {
	s := newSink(t)
	var ms []*sender.Message
	for i := range 6 {
		ms = append(ms, msg("t", string(rune('0'+i))))
	}
	dl, entries := deadLetters(t, ms...)
	hs := httpsender.New(httpsender.Config{URL: s.srv.URL})
	defer hs.Close(context.Background())
	j := openJournal(t, dl)
	defer j.Close()
	const rate = 25.0
	start := time.Now()
	var out bytes.Buffer
	sum, err := replay.Run(context.Background(), entries, replay.Options{Dest: replay.Destination{Sender: "web"},
		Senders: map[string]sender.Sender{"web": hs}, Journal: j, Rate: rate, Run: deadletter.NewID(), Out: &out})
	if err != nil || sum.Sent != 6 {
		t.Fatal(sum, err)
	}
	for i, a := range s.arrivals() {
		if earliest := start.Add(time.Duration(float64(i) / rate * float64(time.Second))); a.at.Before(earliest) {
			t.Fatalf("message %d arrived %v after the start, before %v allows", i, a.at.Sub(start), earliest.Sub(start))
		}
	}
}

// Through a route, to a real MQTT broker: the route's current rewrite on
// the source topic, the record's sender, the replay marker, no stamp, the
// retain flag cleared; a record of a sender the route no longer has is
// skipped.
func TestReplayRouteMQTT(t *testing.T) {
	b, err := embroker.Start("", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := make(chan *paho.Publish, 10)
	sub, err := embroker.Connect(ctx, b.URL, "sub", true, func(p *paho.Publish) { got <- p })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(ctx, "#", 1); err != nil {
		t.Fatal(err)
	}
	snd := mqttsender.New(sender.MQTTConfig{Broker: b.URL, ClientID: "replay-test", QoS: 1, Timeout: 10 * time.Second, ConnectTimeout: 10 * time.Second})
	defer snd.Close(context.Background())

	path := filepath.Join(t.TempDir(), "dl.jsonl")
	w := deadletter.Open(path)
	m := msg("old/x", "hello")
	m.Properties = &sender.Properties{User: []sender.UserProperty{{Key: "k", Value: "v"}}}
	_ = w.Write("r1", "s1", m, "x", 5)
	_ = w.Write("r1", "gone", msg("old/y", "never"), "x", 5)
	_ = w.Close()
	entries, _, _ := deadletter.ReadFile(path, 0)
	j := openJournal(t, path)
	defer j.Close()
	var out bytes.Buffer
	sum, err := replay.Run(ctx, entries, replay.Options{
		Dest: replay.Destination{Route: "r1", RouteSenders: []string{"s1"},
			Rewrite: func(src string) (string, bool) {
				return "new/" + strings.TrimPrefix(src, "in/"), strings.HasPrefix(src, "in/")
			}},
		Senders: map[string]sender.Sender{"s1": snd}, Journal: j, Run: deadletter.NewID(), Out: &out})
	if err != nil || sum.Sent != 1 || sum.Skipped != 1 {
		t.Fatalf("%+v %v\n%s", sum, err, out.String())
	}
	ls := lines(t, &out)
	if ls[1].Action != "skip" || !strings.Contains(ls[1].SkipReason, `sender "gone"`) {
		t.Fatalf("lines %+v", ls)
	}
	select {
	case p := <-got:
		if p.Topic != "new/old/x" || string(p.Payload) != "hello" || p.Retain {
			t.Fatalf("publish %s %q retain %v", p.Topic, p.Payload, p.Retain)
		}
		props := map[string]string{}
		for _, u := range p.Properties.User {
			props[u.Key] = u.Value
		}
		if props["k"] != "v" || props[replay.ReplayProperty] != entries[0].ID || props[fence.MQTTLeaseVersion] != "" {
			t.Fatalf("user properties %v", props)
		}
	case <-ctx.Done():
		t.Fatal("nothing arrived")
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		`Post "https://user:pa55@host/x": 503`:       `Post "https://[redacted]@host/x": 503`,
		`dial amqp://guest:guest@127.0.0.1:5672/: x`: `dial amqp://[redacted]@127.0.0.1:5672/: x`,
		`Post "http://host/x?a=b@c": 503`:            `Post "http://host/x?a=b@c": 503`,
	} {
		if got := replay.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
