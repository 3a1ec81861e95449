package spool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, dir string, o Options) *Spool {
	t.Helper()
	o.Dir = dir
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func msg(i int) *transport.Message {
	return &transport.Message{Topic: fmt.Sprintf("t/%d", i%3), Payload: []byte(fmt.Sprintf("m%d", i)), QoS: 1, Received: time.Unix(1000+int64(i), 0)}
}

func appendN(t *testing.T, s *Spool, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := s.Append(msg(i), nil); err != nil {
			t.Fatal(err)
		}
	}
}

// next reads one record, failing after a second.
func next(t *testing.T, s *Spool) Record {
	t.Helper()
	quit := make(chan struct{})
	tm := time.AfterFunc(time.Second, func() { close(quit) })
	defer tm.Stop()
	r, ok, err := s.NextRecord(quit)
	if err != nil || !ok {
		t.Fatalf("next: ok=%v err=%v", ok, err)
	}
	return r
}

func payloads(t *testing.T, s *Spool, n int, ack bool) []string {
	t.Helper()
	var out []string
	for range n {
		r := next(t, s)
		out = append(out, string(r.Msg.Payload))
		if ack {
			s.Ack(r.Seq)
		}
	}
	return out
}

// abandon is a crash: the files are dropped without the final sync and
// checkpoint, and the lock is released as the kernel does for a dead
// process.
func (s *Spool) abandon() {
	s.mu.Lock()
	s.unsynced = nil // a crash syncs and reports nothing more
	s.mu.Unlock()
	close(s.syncStop)
	<-s.syncDone
	close(s.stop)
	<-s.done
	s.mu.Lock()
	s.closed = true
	s.closeFiles()
	_ = s.lock.Close()
	s.lock = nil
	s.mu.Unlock()
}

func TestOrderAckAndRestart(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{FsyncInterval: 10 * time.Millisecond})
	appendN(t, s, 0, 10)
	if !s.Attach(nil) {
		t.Fatal("attach")
	}
	got := payloads(t, s, 4, true)
	if want := []string{"m0", "m1", "m2", "m3"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// Handed out but not settled: delivered again after a restart.
	payloads(t, s, 2, false)
	if st := s.Stats(); st.Messages != 6 || st.PeakMessages != 10 {
		t.Fatalf("stats %+v: want 6 messages, peak 10", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, Options{})
	defer s.Close()
	if st := s.Stats(); st.Recovered != 6 || st.Messages != 6 {
		t.Fatalf("after restart %+v: want 6 recovered", st)
	}
	s.Attach(nil)
	got = payloads(t, s, 6, true)
	if want := []string{"m4", "m5", "m6", "m7", "m8", "m9"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if st := s.Stats(); st.Messages != 0 || st.Bytes != 0 {
		t.Fatalf("stats %+v: want empty", st)
	}
}

func TestPropertiesRoundTrip(t *testing.T) {
	s := open(t, t.TempDir(), Options{})
	defer s.Close()
	pf := byte(1)
	exp := uint32(60)
	in := &transport.Message{Topic: "a/b", Payload: []byte{0, 1, 2}, QoS: 2, Retain: true, Received: time.Unix(5, 6),
		Properties: &sender.Properties{User: []sender.UserProperty{{Key: "k", Value: "v"}, {Key: "k", Value: "w"}}, ContentType: "x/y",
			PayloadFormat: &pf, MessageExpiry: &exp, ResponseTopic: "r", CorrelationData: []byte("c")}}
	if err := s.Append(in, nil); err != nil {
		t.Fatal(err)
	}
	s.Attach(nil)
	r := next(t, s)
	if !reflect.DeepEqual(&r.Msg, in) || !r.Msg.Received.Equal(in.Received) {
		t.Fatalf("got %+v\nwant %+v", r.Msg, *in)
	}
}

func TestCrashRedeliversUnsettledAndCutsTornTail(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{Fsync: FsyncAlways, FsyncInterval: 10 * time.Millisecond})
	appendN(t, s, 0, 5)
	s.Attach(nil)
	payloads(t, s, 2, true)
	// Let a checkpoint record the two settled ones.
	time.Sleep(50 * time.Millisecond)
	s.abandon()

	seg := lastSegment(t, dir)
	good, _ := os.Stat(seg)
	// A torn tail: the first half of a frame.
	frame, err := encodeRecord(nil, 6, msg(5))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write(frame[:len(frame)/2])
	_ = f.Close()

	s = open(t, dir, Options{})
	st := s.Stats()
	if st.Recovered != 3 || st.TruncatedBytes != int64(len(frame)/2) {
		t.Fatalf("recovered %+v: want 3 records and the half frame (%d bytes) cut", st, len(frame)/2)
	}
	if fi, _ := os.Stat(seg); fi.Size() != good.Size() {
		t.Fatalf("segment is %d bytes after recovery, want %d", fi.Size(), good.Size())
	}
	// New appends continue after the cut, in order.
	appendN(t, s, 5, 7)
	s.Attach(nil)
	got := payloads(t, s, 5, true)
	if want := []string{"m2", "m3", "m4", "m5", "m6"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	_ = s.Close()
}

func TestCorruptTailRecordIsCut(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{})
	appendN(t, s, 0, 3)
	_ = s.Close()
	seg := lastSegment(t, dir)
	b, _ := os.ReadFile(seg)
	b[len(b)-1] ^= 0xff // the last record's payload: CRC mismatch
	if err := os.WriteFile(seg, b, 0o640); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, Options{})
	defer s.Close()
	if st := s.Stats(); st.Recovered != 2 || st.TruncatedBytes == 0 {
		t.Fatalf("stats %+v: want 2 records, a cut tail", st)
	}
}

func TestCorruptSealedSegmentRefusesOpen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{SegmentBytes: 64})
	appendN(t, s, 0, 6)
	_ = s.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(segs) < 2 {
		t.Fatalf("want several segments, got %v", segs)
	}
	b, _ := os.ReadFile(segs[0])
	b[10] ^= 0xff
	_ = os.WriteFile(segs[0], b, 0o640)
	_, err := Open(context.Background(), Options{Dir: dir})
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open: %v, want ErrCorrupt naming the segment", err)
	}
}

func TestFullPolicies(t *testing.T) {
	t.Run("dead_letter", func(t *testing.T) {
		s := open(t, t.TempDir(), Options{MaxMessages: 2, Full: FullDeadLetter})
		defer s.Close()
		appendN(t, s, 0, 2)
		if err := s.Append(msg(2), nil); !errors.Is(err, ErrFull) {
			t.Fatalf("append to a full spool: %v, want ErrFull", err)
		}
	})
	t.Run("block", func(t *testing.T) {
		s := open(t, t.TempDir(), Options{MaxBytes: 1, Full: FullBlock})
		defer s.Close()
		appendN(t, s, 0, 1) // one record always fits
		done := make(chan error, 1)
		go func() { done <- s.Append(msg(1), nil) }()
		select {
		case err := <-done:
			t.Fatalf("append to a full spool returned %v; want it to wait", err)
		case <-time.After(100 * time.Millisecond):
		}
		s.Attach(nil)
		r := next(t, s)
		s.Ack(r.Seq)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		quit := make(chan struct{})
		close(quit)
		if err := s.Append(msg(2), quit); !errors.Is(err, ErrClosed) {
			t.Fatalf("append with quit closed: %v, want ErrClosed", err)
		}
	})
}

func TestDetachRewindsAndLateAcksAreSkipped(t *testing.T) {
	s := open(t, t.TempDir(), Options{})
	defer s.Close()
	appendN(t, s, 0, 6)
	s.Attach(nil)
	var seqs []uint64
	for range 5 {
		seqs = append(seqs, next(t, s).Seq)
	}
	s.Ack(seqs[1])
	s.Ack(seqs[3])
	// A second reader waits for the first.
	attached := make(chan bool, 1)
	go func() { attached <- s.Attach(nil) }()
	select {
	case <-attached:
		t.Fatal("a second reader attached while the first is")
	case <-time.After(50 * time.Millisecond):
	}
	s.Detach()
	if !<-attached {
		t.Fatal("attach")
	}
	// A late settlement of a record handed out before the rewind.
	s.Ack(seqs[2])
	got := payloads(t, s, 3, true)
	if want := []string{"m0", "m4", "m5"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after rewind got %v, want %v", got, want)
	}
	if st := s.Stats(); st.Messages != 0 {
		t.Fatalf("stats %+v, want empty", st)
	}
}

func TestSettledSegmentsAreDeleted(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{SegmentBytes: 128, FsyncInterval: 5 * time.Millisecond})
	defer s.Close()
	appendN(t, s, 0, 40)
	before, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	s.Attach(nil)
	payloads(t, s, 38, true)
	deadline := time.Now().Add(2 * time.Second)
	for {
		after, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
		if len(after) <= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d segments before, %d after settling 38 of 40", len(before), len(after))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := s.Stats(); st.Messages != 2 {
		t.Fatalf("stats %+v", st)
	}
	got := payloads(t, s, 2, true)
	if want := []string{"m38", "m39"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v", got)
	}
}

func TestLockWaitsForTheHolder(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Open(ctx, Options{Dir: dir}); err == nil {
		t.Fatal("a second Open of a held spool succeeded")
	}
	_ = s.Close()
	s2 := open(t, dir, Options{})
	_ = s2.Close()
}

func TestOldestAge(t *testing.T) {
	now := time.Unix(2000, 0)
	s := open(t, t.TempDir(), Options{Now: func() time.Time { return now }})
	defer s.Close()
	appendN(t, s, 0, 3) // received at 1000, 1001, 1002
	if st := s.Stats(); st.OldestAgeS != 1000 {
		t.Fatalf("oldest age %v, want 1000 (nothing handed out)", st.OldestAgeS)
	}
	s.Attach(nil)
	r := next(t, s)
	if st := s.Stats(); st.OldestAgeS != 1000 {
		t.Fatalf("oldest age %v, want 1000 (handed out)", st.OldestAgeS)
	}
	s.Ack(r.Seq)
	if st := s.Stats(); st.OldestAgeS != 999 {
		t.Fatalf("oldest age %v, want 999", st.OldestAgeS)
	}
}

func lastSegment(t *testing.T, dir string) string {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(segs) == 0 {
		t.Fatal("no segment")
	}
	return segs[len(segs)-1]
}

func FuzzDecodeFrame(f *testing.F) {
	for i := range 3 {
		b, _ := encodeRecord(nil, uint64(i+1), msg(i))
		f.Add(b)
	}
	pf := byte(0)
	b, _ := encodeRecord(nil, 9, &transport.Message{Topic: "x", Properties: &sender.Properties{PayloadFormat: &pf}})
	f.Add(b)
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, n, err := DecodeFrame(b)
		if err != nil {
			return
		}
		if n > len(b) || n <= frameHeader {
			t.Fatalf("frame length %d of %d bytes", n, len(b))
		}
		// What decodes encodes back to a frame that decodes the same.
		again, err := encodeRecord(nil, r.Seq, &r.Msg)
		if err != nil {
			t.Fatal(err)
		}
		r2, _, err := DecodeFrame(again)
		if err != nil || !reflect.DeepEqual(r, r2) {
			t.Fatalf("round trip: %v\n%+v\n%+v", err, r, r2)
		}
	})
}

// A write that fails for want of room (here the file size limit, as a
// full disk would) refuses that message only: the spool stays open, hands
// out what it holds, takes the next message once there is room, and a
// restart finds no torn bytes. Before, the spool closed: the route took
// nothing more from it and refused every message until a restart.
func TestWriteFailureRefusesOnlyThatMessage(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	opts := Options{Dir: dir, MaxMessages: 1000, Fsync: FsyncNever, SegmentBytes: 1 << 20}
	sp, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	quit := make(chan struct{})
	big := &transport.Message{Topic: "a/b", Payload: make([]byte, 3000), QoS: 1}
	if err := sp.Append(big, quit); err != nil {
		t.Fatal(err)
	}
	small := lim
	small.Cur = 4096
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &small); err != nil {
		t.Fatal(err)
	}
	err = sp.Append(big, quit) // 3000 + 3000 bytes > 4096
	if rerr := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); rerr != nil {
		t.Fatal(rerr)
	}
	if err == nil {
		t.Fatal("an append beyond the file size limit succeeded")
	}
	if errors.Is(err, ErrClosed) {
		t.Fatalf("append: %v", err)
	}
	_, m, ok, err := sp.Next(quit)
	if err != nil || !ok || len(m.Payload) != 3000 {
		t.Fatalf("after a failed write the spool hands out nothing: ok %v err %v", ok, err)
	}
	if err := sp.Append(&transport.Message{Topic: "a/b", Payload: []byte("after"), QoS: 1}, quit); err != nil {
		t.Fatalf("an append after room came back: %v", err)
	}
	if st := sp.Stats(); st.Messages != 2 {
		t.Fatalf("messages %d, want 2", st.Messages)
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	sp2, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer sp2.Close()
	if st := sp2.Stats(); st.Recovered != 2 || st.TruncatedBytes != 0 {
		t.Fatalf("reopened: %+v, want 2 recovered and no torn bytes", st)
	}
	for _, want := range []string{string(make([]byte, 3000)), "after"} {
		_, m, ok, err := sp2.Next(quit)
		if err != nil || !ok || string(m.Payload) != want {
			t.Fatalf("reopened: %q %v %v", m.Payload, ok, err)
		}
	}
}
