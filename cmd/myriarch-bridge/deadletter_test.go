package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/deadletter"
	"github.com/myriarch/myriarch/internal/bridge/deadletter/replay"
	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// dlConfig has an ephemeral session whose route rewrites in/ to out/ and
// posts to an HTTP sink, and an exclusive session whose route writes a
// file.
const dlConfig = `
bridge: {id: b1, dead_letter: {path: DIR/dl.jsonl}}
stores: {lease: {path: DIR/lease.db}}
sessions:
  - {id: plain, session_mode: ephemeral, brokers: ["tcp://127.0.0.1:1883"], client_id: plain}
  - {id: plant, session_mode: exclusive, brokers: ["tcp://127.0.0.1:1883"], client_id: plant,
     connect_timeout: 2s, reconcile_timeout: 2s, unmatched_grace: 1s}
receivers:
  - {id: r-plain, session: plain, topics: [{filter: "in/#"}]}
  - {id: r-plant, session: plant, topics: [{filter: "plant/#"}]}
senders:
  - {id: web, type: http, http: {url: "URL", headers: {Authorization: "Bearer s3cret"}}}
  - {id: archive, type: file, file: {path: DIR/archive.jsonl}}
routes:
  - {id: rt-web, receiver: r-plain, senders: [web], rewrite: {strip_prefix: "in/", add_prefix: "v2/"}}
  - {id: rt-plant, receiver: r-plant, senders: [archive], lease_ttl: 10s, step_down_grace: 3s}
`

type dlEnv struct {
	dir, cfg, dl string
	mu           sync.Mutex
	posts        []post
}

type post struct {
	topic, payload, version, auth string
}

func newDLEnv(t *testing.T) *dlEnv {
	t.Helper()
	e := &dlEnv{dir: t.TempDir()}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.posts = append(e.posts, post{r.Header.Get("X-Myriarch-Topic"), string(b), r.Header.Get(fence.HeaderLeaseVersion), r.Header.Get("Authorization")})
		e.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	e.cfg = filepath.Join(e.dir, "bridge.yaml")
	e.dl = filepath.Join(e.dir, "dl.jsonl")
	c := strings.ReplaceAll(strings.ReplaceAll(dlConfig, "DIR", e.dir), "URL", srv.URL)
	if err := os.WriteFile(e.cfg, []byte(c), 0o600); err != nil {
		t.Fatal(err)
	}
	// Dead letters as the bridge writes them.
	w := deadletter.Open(e.dl)
	defer w.Close()
	at := time.Now()
	for _, d := range []struct {
		route, sender, topic, src, payload, reason string
		stamp                                      fence.Stamp
	}{
		{"rt-web", "web", "out/a", "in/a", "one", "5 attempts failed; last error: POST: 503", fence.Stamp{}},
		{"rt-web", "web", "out/\x1b[31mred\x1b[0m", "in/\x1b[31mred\x1b[0m", "\x00\x01\x1b]0;pwned\x07", "permanent failure after 1 attempts: 400\r\nFAKE LINE", fence.Stamp{}},
		{"rt-plant", "archive", "plant/x", "plant/x", "three", "5 attempts failed; disk full", fence.New(7, "b1/plant")},
		{"rt-web", "web", "out/b", "in/b", "four", "5 attempts failed; last error: POST: 503", fence.Stamp{}},
	} {
		m := &sender.Message{Topic: d.topic, SourceTopic: d.src, Payload: []byte(d.payload), QoS: 1, Fence: d.stamp, Received: at}
		if err := w.Write(d.route, d.sender, m, d.reason, 5); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func (e *dlEnv) run(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := commands.Dispatch(append([]string{"deadletter"}, args...), &out, &errb)
	return out.String(), errb.String(), code
}

func (e *dlEnv) received() []post {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]post(nil), e.posts...)
}

func TestDeadLetterList(t *testing.T) {
	e := newDLEnv(t)
	out, stderr, code := e.run("list", "-c", e.cfg)
	if code != 0 || !strings.Contains(out, "4 of 4 record(s)") {
		t.Fatalf("code %d\n%s\n%s", code, out, stderr)
	}
	// Nothing a terminal acts on reaches it: escapes, carriage returns.
	if strings.ContainsAny(out, "\x1b\r\x07") || !strings.Contains(out, `out/\x1b[31mred`) || !strings.Contains(out, `400\x0d\x0aFAKE`) {
		t.Fatalf("table not escaped:\n%q", out)
	}
	if got := strings.Count(out, "\n"); got != 6 { // header, 4 rows, count
		t.Fatalf("%d lines:\n%s", got, out)
	}
	out, _, code = e.run("list", "--file", e.dl, "--route", "rt-web", "--topic", "out/+", "--reason", "503", "-o", "json")
	var ids []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct {
			ID    string `json:"id"`
			Topic string `json:"topic"`
			Line  int    `json:"line"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		ids = append(ids, fmt.Sprint(r.Topic, "@", r.Line))
	}
	if code != 0 || strings.Join(ids, " ") != "out/a@1 out/b@4" {
		t.Fatalf("code %d: %v", code, ids)
	}
	if out, _, _ := e.run("list", "--file", e.dl, "--since", "1h", "--until", time.Now().Add(-30*time.Minute).Format(time.RFC3339), "-o", "json"); out != "" {
		t.Fatalf("time window: %q", out)
	}
	for _, bad := range [][]string{{"--since", "yesterday"}, {"--topic", "a/#/b"}, {"-o", "yaml"}, {"--id", "XYZ"}, {"extra"}} {
		_, stderr, code := e.run(append([]string{"list", "--file", e.dl}, bad...)...)
		if code != 2 || !strings.Contains(stderr, bad[0]) {
			t.Errorf("%v: code %d, stderr %q", bad, code, stderr)
		}
	}
	if _, stderr, code := e.run("list"); code != 2 || !strings.Contains(stderr, "-c FILE or --file") {
		t.Fatalf("no source: %d %q", code, stderr)
	}
	// No file: nothing was dead-lettered.
	if out, stderr, code := e.run("list", "--file", filepath.Join(e.dir, "none.jsonl")); code != 0 || !strings.Contains(stderr, "no dead-letter file") || !strings.Contains(out, "0 of 0") {
		t.Fatalf("missing file: %d %q %q", code, out, stderr)
	}
}

func TestDeadLetterTornAndCorrupt(t *testing.T) {
	e := newDLEnv(t)
	f, _ := os.OpenFile(e.dl, os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString(`{"id":"0123456789abcdef","time":"2026-`)
	_ = f.Close()
	out, stderr, code := e.run("list", "--file", e.dl)
	if code != 0 || !strings.Contains(out, "4 of 4") || !strings.Contains(stderr, "line 5 (offset") || !strings.Contains(stderr, "torn last line") {
		t.Fatalf("code %d\n%s\n%s", code, out, stderr)
	}
}

func TestDeadLetterInspect(t *testing.T) {
	e := newDLEnv(t)
	entries, _, _ := deadletter.ReadFile(e.dl, 0)
	out, stderr, code := e.run("inspect", "--file", e.dl, entries[2].ID)
	if code != 0 || !strings.Contains(out, "lease version 7, session b1/plant") || !strings.Contains(out, "payload (5 bytes, text):\nthree") ||
		!strings.Contains(out, "disk full") || !strings.Contains(out, "line:") {
		t.Fatalf("code %d\n%s\n%s", code, out, stderr)
	}
	out, _, code = e.run("inspect", "--file", e.dl, "--line", "2")
	if code != 0 || strings.ContainsAny(out, "\x1b\r\x07\x00") || !strings.Contains(out, "bytes, hex)") || !strings.Contains(out, "fencing stamp: none") ||
		!strings.Contains(out, "00 01 1b 5d") {
		t.Fatalf("code %d\n%q", code, out)
	}
	out, _, code = e.run("inspect", "--file", e.dl, "--offset", fmt.Sprint(entries[3].Offset), "-o", "json")
	var r deadletter.Record
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil || r.ID != entries[3].ID || string(r.Payload) != "four" {
		t.Fatalf("code %d\n%s", code, out)
	}
	if _, stderr, code := e.run("inspect", "--file", e.dl, "--line", "99"); code != 1 || !strings.Contains(stderr, "no record with line 99") {
		t.Fatalf("not found: %d %q", code, stderr)
	}
	if _, stderr, code := e.run("inspect", "--file", e.dl); code != 2 || !strings.Contains(stderr, "name one record") {
		t.Fatalf("nothing named: %d %q", code, stderr)
	}
}

// The dry run prints one JSON object per record and sends nothing; the
// replay sends through the route's current rewrite, journals, and a
// second replay sends nothing again.
func TestDeadLetterReplayRoute(t *testing.T) {
	e := newDLEnv(t)
	out, stderr, code := e.run("replay", "-c", e.cfg, "--route", "rt-web", "--dry-run")
	if code != 0 {
		t.Fatalf("dry run: %d\n%s", code, stderr)
	}
	var dry []replay.Line
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var ln replay.Line
		if err := json.Unmarshal([]byte(l), &ln); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		dry = append(dry, ln)
	}
	if len(dry) != 3 || dry[0].Topic != "v2/a" || dry[0].Sender != "web" || dry[0].SenderType != "http" || dry[0].Via != "route" ||
		dry[0].Route != "rt-web" || dry[0].Bytes != 3 || dry[0].QoS != 1 || dry[0].Action != "send" || dry[2].Topic != "v2/b" {
		t.Fatalf("dry run lines %+v", dry)
	}
	if strings.Contains(out, "s3cret") || strings.Contains(stderr, "s3cret") {
		t.Fatal("a sender's secret header was printed")
	}
	if len(e.received()) != 0 {
		t.Fatal("the dry run sent")
	}
	if _, err := os.Stat(deadletter.JournalPath(e.dl)); !os.IsNotExist(err) {
		t.Fatalf("the dry run created the journal: %v", err)
	}

	// The record whose topic holds control characters fails at the HTTP
	// client (no such header value): the run sends the rest and exits 1.
	out, stderr, code = e.run("replay", "-c", e.cfg, "--route", "rt-web", "--topic", "in/+", "--rate", "0")
	if code != 1 || !strings.Contains(stderr, "2 sent, 1 failed") || !strings.Contains(out, "invalid header field value") {
		t.Fatalf("replay: %d\n%s\n%s", code, out, stderr)
	}
	got := e.received()
	if len(got) != 2 || got[0] != (post{"v2/a", "one", "", "Bearer s3cret"}) || got[1].topic != "v2/b" {
		t.Fatalf("received %+v", got)
	}
	st, err := os.Stat(deadletter.JournalPath(e.dl))
	if err != nil || st.Mode().Perm() != deadletter.FileMode {
		t.Fatalf("journal: %v", err)
	}
	// Again: what was sent is skipped, the failed record is tried again.
	out, stderr, code = e.run("replay", "-c", e.cfg, "--route", "rt-web")
	if code != 1 || len(e.received()) != 2 || !strings.Contains(stderr, "0 sent, 1 failed, 0 unknown, 2 skipped") || strings.Count(out, `"skip"`) != 2 {
		t.Fatalf("second replay: %d\n%s\n%s", code, out, stderr)
	}
	// Only the failed record, through the route: picked by id.
	if _, _, code := e.run("replay", "-c", e.cfg, "--route", "rt-web", "--id", dry[0].ID); code != 0 || len(e.received()) != 2 {
		t.Fatalf("replay of a replayed record by id: %d", code)
	}
}

// An exclusive session's sender: refused without --force (nothing sent),
// sent with it, without the stamp the record carried.
func TestDeadLetterReplayExclusive(t *testing.T) {
	e := newDLEnv(t)
	_, stderr, code := e.run("replay", "-c", e.cfg, "--sender", "archive", "--from-route", "rt-plant")
	if code != 2 || !strings.Contains(stderr, `exclusive session "plant"`) || !strings.Contains(stderr, "--force") {
		t.Fatalf("code %d: %s", code, stderr)
	}
	archive := filepath.Join(e.dir, "archive.jsonl")
	if _, err := os.Stat(archive); !os.IsNotExist(err) {
		t.Fatal("refused replay wrote")
	}
	_, stderr, code = e.run("replay", "-c", e.cfg, "--sender", "archive", "--from-route", "rt-plant", "--force")
	if code != 0 {
		t.Fatalf("forced: %d %s", code, stderr)
	}
	b, _ := os.ReadFile(archive)
	var line map[string]any
	if err := json.Unmarshal(b, &line); err != nil || line["topic"] != "plant/x" {
		t.Fatalf("archive %q: %v", b, err)
	}
	if _, ok := line[fence.FieldLeaseVersion]; ok {
		t.Fatalf("replayed message carries the stamp: %q", b)
	}
}

func TestDeadLetterReplayRefusals(t *testing.T) {
	e := newDLEnv(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--route", "rt-web", "--sender", "web"}, "give one destination"},
		{[]string{}, "give one destination"},
		{[]string{"--route", "nope"}, `--route "nope": no such route`},
		{[]string{"--sender", "nope"}, `--sender "nope": no such sender`},
		{[]string{"--route", "rt-web", "--rate", "-1"}, "--rate -1"},
		{[]string{"--route", "rt-web", "--since", "soon"}, `--since "soon"`},
	} {
		_, stderr, code := e.run(append([]string{"replay", "-c", e.cfg}, c.args...)...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: code %d, stderr %q", c.args, code, stderr)
		}
	}
	if _, stderr, code := e.run("replay", "--file", e.dl, "--sender", "web"); code != 2 || !strings.Contains(stderr, "-c") {
		t.Errorf("replay without -c: %d %q", code, stderr)
	}
	bad := filepath.Join(e.dir, "bad.yaml")
	_ = os.WriteFile(bad, []byte("bridge: {id: b1, nope: 1}\n"), 0o600)
	if _, stderr, code := e.run("replay", "-c", bad, "--sender", "web"); code != 2 || !strings.Contains(stderr, "configuration refused") {
		t.Errorf("refused config: %d %q", code, stderr)
	}
	if _, _, code := e.run("bogus"); code != 2 {
		t.Errorf("unknown subcommand: %d", code)
	}
	if len(e.received()) != 0 {
		t.Fatal("a refused replay sent")
	}
}

func TestDeadLetterClean(t *testing.T) {
	for in, want := range map[string]string{
		"plain/topic é":        "plain/topic é",
		"a\x1b[2Jb":            `a\x1b[2Jb`,
		"evil\u202egnp.exe":    `evil\u202egnp.exe`,
		"bad\xffutf8":          `bad\xffutf8`,
		"cr\rlf\n":             `cr\x0dlf\x0a`,
		"tab\tzero\x00del\x7f": `tab\x09zero\x00del\x7f`,
	} {
		if got := clean(in); got != want {
			t.Errorf("clean(%q) = %q, want %q", in, got, want)
		}
	}
	if got := cleanText("line1\nline2\t\x1b"); got != "line1\nline2\t\\x1b" {
		t.Errorf("cleanText: %q", got)
	}
}
