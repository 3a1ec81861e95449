package sender_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/sender/sendertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var result = sendertest.Result

// Batch hands messages to deliver in order, reports one result per
// message or one for the whole batch, fails withdrawn messages without
// delivering them, and fails what is sent after Close.
func TestBatch(t *testing.T) {
	var mu sync.Mutex
	var delivered []string
	gate := make(chan struct{})
	entered := make(chan struct{}, 1)
	b := sender.NewBatch(100, func(_ context.Context, ms []*sender.Message) []error {
		if p := string(ms[0].Payload); p == "0" || p == "hold" {
			entered <- struct{}{} // held at the gate: what is sent meanwhile is one batch
			<-gate
		}
		mu.Lock()
		defer mu.Unlock()
		if string(ms[0].Payload) == "6" {
			return []error{errors.New("batch refused")}
		}
		for _, m := range ms {
			delivered = append(delivered, string(m.Payload))
		}
		return nil
	})
	send := func(p string, withdrawn bool) chan error {
		ch := make(chan error, 1)
		m := &sender.Message{Topic: "t", Payload: []byte(p)}
		m.SetWithdrawn(withdrawn)
		b.Send(m, func(err error) { ch <- err })
		return ch
	}
	first := send("0", false)
	<-entered
	var rest []chan error
	for i := 1; i <= 5; i++ {
		rest = append(rest, send(fmt.Sprint(i), i == 3))
	}
	gate <- struct{}{}
	if err := result(t, first); err != nil {
		t.Fatal(err)
	}
	for i, ch := range rest {
		err := result(t, ch)
		if i+1 == 3 {
			if !errors.Is(err, sender.ErrWithdrawn) {
				t.Fatalf("withdrawn message: %v", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("message %d: %v", i+1, err)
		}
	}
	mu.Lock()
	if got := fmt.Sprint(delivered); got != "[0 1 2 4 5]" {
		t.Fatalf("delivered %s", got)
	}
	mu.Unlock()
	hold := send("hold", false)
	<-entered
	a, c := send("6", false), send("7", false)
	gate <- struct{}{}
	if err := result(t, hold); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan error{a, c} {
		if err := result(t, ch); err == nil || err.Error() != "batch refused" {
			t.Fatalf("whole-batch failure: %v", err)
		}
	}
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := result(t, send("8", false)); !errors.Is(err, sender.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// Permanent errors are recognised through wrapping; others are not.
func TestPermanent(t *testing.T) {
	base := errors.New("refused")
	p := sender.Permanent(base)
	if !sender.IsPermanent(p) || !sender.IsPermanent(fmt.Errorf("post: %w", p)) || !errors.Is(p, base) {
		t.Fatal("a Permanent error is not recognised or does not wrap its cause")
	}
	if sender.IsPermanent(base) || sender.Permanent(nil) != nil {
		t.Fatal("a plain error counts as permanent, or Permanent(nil) is not nil")
	}
	if p.Error() != "refused" {
		t.Fatalf("message %q", p.Error())
	}
}
