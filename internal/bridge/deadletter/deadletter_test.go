package deadletter_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/deadletter"
	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
)

func message() *sender.Message {
	pf, exp := byte(1), uint32(60)
	return &sender.Message{Topic: "out/a", SourceTopic: "in/a", Payload: []byte("\x00\x1b[2Jhello"), QoS: 1, Retain: true,
		Received: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), Fence: fence.New(7, "bridge-a/s1"),
		Properties: &sender.Properties{User: []sender.UserProperty{{Key: "k", Value: "v"}, {Key: "k", Value: "w"}}, ContentType: "text/plain",
			PayloadFormat: &pf, MessageExpiry: &exp, ResponseTopic: "out/reply", CorrelationData: []byte{1, 2}}}
}

func TestWriteReadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dl.jsonl")
	w := deadletter.Open(path)
	defer w.Close()
	m := message()
	if err := w.Write("r1", "s1", m, "5 attempts failed", 5); err != nil {
		t.Fatal(err)
	}
	if err := w.Write("r2", "s2", &sender.Message{Topic: "t", Payload: nil}, "x", 1); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != deadletter.FileMode {
		t.Fatalf("mode %v", st.Mode().Perm())
	}
	entries, problems, err := deadletter.ReadFile(path, 0)
	if err != nil || len(problems) != 0 || len(entries) != 2 {
		t.Fatalf("entries %d problems %v err %v", len(entries), problems, err)
	}
	e := entries[0]
	if !deadletter.ValidID(e.ID) || e.ID == entries[1].ID {
		t.Fatalf("ids %q %q", e.ID, entries[1].ID)
	}
	if e.Line != 1 || e.Offset != 0 || entries[1].Line != 2 || entries[1].Offset == 0 {
		t.Fatalf("positions %d/%d %d/%d", e.Line, e.Offset, entries[1].Line, entries[1].Offset)
	}
	if e.Route != "r1" || e.Sender != "s1" || e.Attempts != 5 || e.Reason != "5 attempts failed" || !e.Retain || e.QoS != 1 {
		t.Fatalf("record %+v", e.Record)
	}
	if st := e.Stamp(); st.LeaseVersion != 7 || st.SessionID != "bridge-a/s1" || st.Version() != "7" {
		t.Fatalf("stamp %+v", st)
	}
	back := e.Message()
	if back.Topic != m.Topic || back.SourceTopic != m.SourceTopic || !bytes.Equal(back.Payload, m.Payload) || !back.Received.Equal(m.Received) ||
		!back.Fence.IsZero() || back.Tenure != nil {
		t.Fatalf("message %+v", back)
	}
	p := back.Properties
	if p == nil || len(p.User) != 2 || p.User[1].Value != "w" || p.ContentType != "text/plain" || *p.PayloadFormat != 1 ||
		*p.MessageExpiry != 60 || p.ResponseTopic != "out/reply" || !bytes.Equal(p.CorrelationData, []byte{1, 2}) {
		t.Fatalf("properties %+v", p)
	}
	if entries[1].Properties != nil || !entries[1].Stamp().IsZero() {
		t.Fatalf("second record %+v", entries[1].Record)
	}
}

// A record written before ids existed (the format of earlier releases)
// gets a stable id derived from its line.
func TestLegacyRecordDerivedID(t *testing.T) {
	line := []byte(`{"time":"2026-01-02T03:04:05Z","route":"r","sender":"s","topic":"t","source_topic":"t","qos":1,"payload":"aGk=","attempts":5,"reason":"x"}`)
	r, err := deadletter.Decode(line)
	if err != nil {
		t.Fatal(err)
	}
	if r.ID != deadletter.DerivedID(line) || !deadletter.ValidID(r.ID) || string(r.Payload) != "hi" {
		t.Fatalf("%+v", r)
	}
	r2, _ := deadletter.Decode(line)
	if r2.ID != r.ID {
		t.Fatal("derived id not stable")
	}
}

func TestDecodeRefuses(t *testing.T) {
	ok := `{"id":"0123456789abcdef","time":"2026-01-02T03:04:05Z","route":"r","sender":"s","topic":"t","qos":1,"payload":null,"attempts":1,"reason":"x"}`
	if _, err := deadletter.Decode([]byte(ok)); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct{ line, want string }{
		"not json":    {`hello`, "not a dead-letter record"},
		"array":       {`[1]`, "not a dead-letter record"},
		"two objects": {ok + ok, "data after"},
		"no time":     {strings.Replace(ok, `"time":"2026-01-02T03:04:05Z",`, "", 1), "time: missing"},
		"no route":    {strings.Replace(ok, `"route":"r",`, "", 1), "route: missing"},
		"no sender":   {strings.Replace(ok, `"sender":"s",`, "", 1), "sender: missing"},
		"no topic":    {strings.Replace(ok, `"topic":"t",`, "", 1), "topic: missing"},
		"qos 3":       {strings.Replace(ok, `"qos":1`, `"qos":3`, 1), "qos: 3"},
		"attempts":    {strings.Replace(ok, `"attempts":1`, `"attempts":-1`, 1), "attempts: -1"},
		"bad id":      {strings.Replace(ok, `0123456789abcdef`, `../../etc/passwd`, 1), `id: "../../etc/passwd"`},
		"bad payload": {strings.Replace(ok, `"payload":null`, `"payload":"!!"`, 1), "not a dead-letter record"},
	} {
		_, err := deadletter.Decode([]byte(c.line))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", name, err, c.want)
		}
	}
}

func record(t *testing.T, id string) string {
	t.Helper()
	b, err := deadletter.Encode(&deadletter.Record{ID: id, Time: time.Now().UTC(), Route: "r", Sender: "s", Topic: "t", Payload: []byte(id), Attempts: 1, Reason: "x"})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A crash mid-write leaves a torn last line: the reader reports it as
// torn and reads the rest; the writer's next record starts on a line of
// its own, so the torn fragment stays one corrupt line in the middle.
func TestTornLastLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dl.jsonl")
	a, b := record(t, "aaaaaaaaaaaaaaaa"), record(t, "bbbbbbbbbbbbbbbb")
	torn := b[:len(b)/2]
	if err := os.WriteFile(path, []byte(a+"\n"+torn), 0o640); err != nil {
		t.Fatal(err)
	}
	entries, problems, err := deadletter.ReadFile(path, 0)
	if err != nil || len(entries) != 1 || entries[0].ID != "aaaaaaaaaaaaaaaa" {
		t.Fatalf("entries %+v err %v", entries, err)
	}
	if len(problems) != 1 || !problems[0].Torn || problems[0].Line != 2 || problems[0].Offset != int64(len(a)+1) ||
		!strings.Contains(problems[0].Error(), "line 2 (offset") || !strings.Contains(problems[0].Error(), "torn") {
		t.Fatalf("problems %v", problems)
	}

	w := deadletter.Open(path)
	if err := w.Write("r", "s", &sender.Message{Topic: "t"}, "x", 1); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	entries, problems, err = deadletter.ReadFile(path, 0)
	if err != nil || len(entries) != 2 || entries[1].Line != 3 {
		t.Fatalf("after append: entries %+v err %v", entries, err)
	}
	if len(problems) != 1 || problems[0].Torn || problems[0].Line != 2 || !strings.Contains(problems[0].Error(), "corrupt") {
		t.Fatalf("after append: problems %v", problems)
	}
}

// A complete last record without its newline is a record, not a tear.
func TestLastLineWithoutNewline(t *testing.T) {
	entries, problems, err := scan(t, record(t, "aaaaaaaaaaaaaaaa")+"\n\n   \n"+record(t, "cccccccccccccccc"), 0)
	if err != nil || len(problems) != 0 || len(entries) != 2 || entries[1].Line != 4 {
		t.Fatalf("entries %+v problems %v err %v", entries, problems, err)
	}
}

func scan(t *testing.T, s string, maxLine int) ([]deadletter.Entry, []deadletter.Problem, error) {
	t.Helper()
	var out []deadletter.Entry
	problems, err := deadletter.Scan(strings.NewReader(s), maxLine, func(e deadletter.Entry) error {
		out = append(out, e)
		return nil
	})
	return out, problems, err
}

// A line above the limit is reported by number and skipped; the lines
// after it are read.
func TestHugeLineSkipped(t *testing.T) {
	a := record(t, "aaaaaaaaaaaaaaaa")
	huge := `{"x":"` + strings.Repeat("A", 300<<10) + `"}`
	entries, problems, err := scan(t, huge+"\n"+a+"\n", 1024)
	if err != nil || len(entries) != 1 || entries[0].Line != 2 || entries[0].Offset != int64(len(huge)+1) {
		t.Fatalf("entries %+v err %v", entries, err)
	}
	if len(problems) != 1 || problems[0].Line != 1 || !strings.Contains(problems[0].Error(), "above the limit of 1024") {
		t.Fatalf("problems %v", problems)
	}
}

func TestCorruptMiddleLine(t *testing.T) {
	a, c := record(t, "aaaaaaaaaaaaaaaa"), record(t, "cccccccccccccccc")
	entries, problems, err := scan(t, a+"\n{\"garbage\n"+c+"\n", 0)
	if err != nil || len(entries) != 2 || entries[1].Line != 3 {
		t.Fatalf("entries %+v err %v", entries, err)
	}
	if len(problems) != 1 || problems[0].Line != 2 || problems[0].Torn {
		t.Fatalf("problems %v", problems)
	}
}

func TestJournal(t *testing.T) {
	dir := t.TempDir()
	path := deadletter.JournalPath(filepath.Join(dir, "dl.jsonl"))
	j, problems, err := deadletter.OpenJournal(path)
	if err != nil || len(problems) != 0 {
		t.Fatal(err, problems)
	}
	// A second replay of the same file is refused while the first runs.
	if _, _, err := deadletter.OpenJournal(path); !errors.Is(err, deadletter.ErrJournalLocked) {
		t.Fatalf("second open: %v", err)
	}
	for _, e := range []deadletter.JournalEntry{
		{RecordID: "aaaaaaaaaaaaaaaa", Outcome: deadletter.OutcomeSent, Sender: "s", Via: "sender"},
		{RecordID: "bbbbbbbbbbbbbbbb", Outcome: deadletter.OutcomeFailed, Sender: "s", Via: "sender"},
		{RecordID: "cccccccccccccccc", Outcome: deadletter.OutcomeUnknown, Sender: "s", Via: "sender"},
	} {
		if err := j.Append(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != deadletter.FileMode {
		t.Fatalf("journal mode %v", st.Mode().Perm())
	}
	// Torn tail, then read back: only the accepted replay counts.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString(`{"record_id":"dddd`)
	_ = f.Close()
	// OpenJournal reads the torn line as torn and ends it; ReadJournal then
	// sees a corrupt line in the middle.
	for i, open := range []func(string) (*deadletter.Journal, []deadletter.Problem, error){deadletter.OpenJournal, deadletter.ReadJournal} {
		j, problems, err := open(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(problems) != 1 || problems[0].Torn != (i == 0) || problems[0].Line != 4 {
			t.Fatalf("problems %v", problems)
		}
		_, a := j.Replayed("aaaaaaaaaaaaaaaa")
		_, b := j.Replayed("bbbbbbbbbbbbbbbb")
		_, c := j.Replayed("cccccccccccccccc")
		if !a || b || c {
			t.Fatalf("replayed: a %v b %v c %v", a, b, c)
		}
		_ = j.Close()
	}
	// OpenJournal ended the torn line: the next entry is a line of its own.
	j, _, _ = deadletter.OpenJournal(path)
	if err := j.Append(deadletter.JournalEntry{RecordID: "eeeeeeeeeeeeeeee", Outcome: deadletter.OutcomeSent}); err != nil {
		t.Fatal(err)
	}
	_ = j.Close()
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	var last deadletter.JournalEntry
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.RecordID != "eeeeeeeeeeeeeeee" || len(lines) != 5 {
		t.Fatalf("journal lines %q", lines)
	}
}

// The journal is never a symbolic link: a replay (often run as root)
// must not append to a file someone pointed the journal's name at.
func TestJournalRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "victim")
	if err := os.WriteFile(target, []byte("keep\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "dl.jsonl"+deadletter.JournalSuffix)
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	if _, _, err := deadletter.OpenJournal(path); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("err %v", err)
	}
	if err := os.Mkdir(path+"2", 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := deadletter.OpenJournal(path + "2"); err == nil {
		t.Fatal("a directory was accepted as the journal")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep\n" {
		t.Fatalf("victim changed: %q", b)
	}
}
