package file_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	filesender "github.com/myriarch/myriarch/internal/bridge/sender/file"
	"github.com/myriarch/myriarch/internal/bridge/sender/sendertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func send(s sender.Sender, m *sender.Message) chan error {
	return sendertest.Send(s, m)
}

var result = sendertest.Result

func lines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// Messages become JSON lines in order, with every field; reopening the
// file appends to what it holds.
func TestLinesInOrderAndAppend(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.jsonl")
	at := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for round := range 2 {
		s, err := filesender.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var chans []chan error
		for i := range 100 {
			chans = append(chans, send(s, &sender.Message{Topic: "out/a", SourceTopic: "in/a", Payload: fmt.Appendf(nil, "%d-%d", round, i),
				QoS: 1, Retain: i == 0, Received: at, Route: "r"}))
		}
		for _, ch := range chans {
			if err := result(t, ch); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	ls := lines(t, path)
	if len(ls) != 200 {
		t.Fatalf("%d lines", len(ls))
	}
	for i, l := range ls {
		var got filesender.Line
		if err := json.Unmarshal([]byte(l), &got); err != nil {
			t.Fatalf("line %d %q: %v", i, l, err)
		}
		want := filesender.Line{Time: at, Route: "r", Topic: "out/a", SourceTopic: "in/a", QoS: 1, Retain: i%100 == 0,
			Payload: fmt.Appendf(nil, "%d-%d", i/100, i%100)}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("line %d: %+v, want %+v", i, got, want)
		}
	}
}

// A file that ends in a torn line (a crash mid-write) gets its next line
// on a line of its own: the torn one cannot swallow it.
func TestTornTailIsTerminated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.jsonl")
	if err := os.WriteFile(path, []byte(`{"topic":"x"}`+"\n"+`{"topic":"to`), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := filesender.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := result(t, send(s, &sender.Message{Topic: "after", Payload: []byte("p")})); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	ls := lines(t, path)
	if len(ls) != 3 || ls[1] != `{"topic":"to` {
		t.Fatalf("lines %q", ls)
	}
	var l filesender.Line
	if err := json.Unmarshal([]byte(ls[2]), &l); err != nil || l.Topic != "after" {
		t.Fatalf("last line %q: %v", ls[2], err)
	}
}

// A write that fails (a full device) fails the message, retryably, and
// the sender goes on; a withdrawn message is not written; after Close,
// sends fail.
func TestWriteFailureAndClose(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	s, err := filesender.Open("/dev/full")
	if err != nil {
		t.Fatal(err)
	}
	err = result(t, send(s, &sender.Message{Topic: "t", Payload: make([]byte, 100<<10)}))
	if err == nil || sender.IsPermanent(err) {
		t.Fatalf("write to a full device: %v, want a retryable error", err)
	}
	w := &sender.Message{Topic: "t", Payload: []byte("w")}
	w.SetWithdrawn(true)
	if err := result(t, send(s, w)); !errors.Is(err, sender.ErrWithdrawn) {
		t.Fatalf("withdrawn: %v", err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := result(t, send(s, &sender.Message{Topic: "t"})); !errors.Is(err, sender.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// An exclusive session's line carries lease_version and session_id; a
// non-exclusive one's carries neither field.
func TestFenceFields(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.jsonl")
	s, err := filesender.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := result(t, send(s, &sender.Message{Topic: "a", Payload: []byte("1"), Fence: fence.New(9, "br/s")})); err != nil {
		t.Fatal(err)
	}
	if err := result(t, send(s, &sender.Message{Topic: "a", Payload: []byte("2")})); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	ls := lines(t, path)
	if len(ls) != 2 {
		t.Fatalf("%d lines", len(ls))
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(ls[0]), &first); err != nil {
		t.Fatal(err)
	}
	if first[fence.FieldLeaseVersion] != 9.0 || first[fence.FieldSessionID] != "br/s" {
		t.Fatalf("stamped line %s", ls[0])
	}
	if strings.Contains(ls[1], fence.FieldLeaseVersion) || strings.Contains(ls[1], fence.FieldSessionID) {
		t.Fatalf("non-exclusive line carries a stamp: %s", ls[1])
	}
}
