package http_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	httpsender "github.com/myriarch/myriarch/internal/bridge/sender/http"
	"github.com/myriarch/myriarch/internal/bridge/sender/sendertest"
	"github.com/myriarch/myriarch/internal/testnet"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func send(s sender.Sender, topic, payload string) chan error {
	return sendertest.Send(s, &sender.Message{Topic: topic, Payload: []byte(payload), Route: "r1"})
}

var result = sendertest.Result

func closeSender(t *testing.T, s sender.Sender) {
	t.Helper()
	if err := s.Close(context.Background()); err != nil {
		t.Error(err)
	}
}

// Each message is one POST of its payload with the configured headers;
// the topic and route headers are the bridge's and cannot be overridden.
func TestPostAndHeaders(t *testing.T) {
	type req struct {
		method, body, topic, route, ctype, auth string
	}
	got := make(chan req, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- req{r.Method, string(b), r.Header.Get("X-Myriarch-Topic"), r.Header.Get("X-Myriarch-Route"), r.Header.Get("Content-Type"), r.Header.Get("Authorization")}
	}))
	defer srv.Close()
	s := httpsender.New(httpsender.Config{URL: srv.URL, Timeout: 5 * time.Second,
		Headers: map[string]string{"Authorization": "Bearer k", "X-Myriarch-Topic": "forged"}})
	defer closeSender(t, s)
	if err := result(t, send(s, "plant/1", "hello")); err != nil {
		t.Fatal(err)
	}
	want := req{"POST", "hello", "plant/1", "r1", "application/octet-stream", "Bearer k"}
	if r := <-got; r != want {
		t.Fatalf("request %+v, want %+v", r, want)
	}
}

// A refusal of the message itself is permanent; a refusal that may pass
// later, a server error and a transport error are retried.
func TestErrorClassification(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var code int
		fmt.Sscan(r.URL.Query().Get("code"), &code)
		w.WriteHeader(code)
	}))
	defer srv.Close()
	for _, c := range []struct {
		code      int
		permanent bool
	}{
		{200, false}, {204, false},
		{400, true}, {413, true}, {415, true}, {422, true},
		{401, false}, {403, false}, {404, false}, {408, false}, {429, false},
		{500, false}, {502, false}, {503, false},
	} {
		s := httpsender.New(httpsender.Config{URL: fmt.Sprintf("%s/?code=%d", srv.URL, c.code), Timeout: 5 * time.Second})
		err := result(t, send(s, "t", "x"))
		closeSender(t, s)
		switch {
		case c.code < 300 && err != nil:
			t.Errorf("%d: %v", c.code, err)
		case c.code >= 300 && err == nil:
			t.Errorf("%d accepted", c.code)
		case c.code >= 300 && sender.IsPermanent(err) != c.permanent:
			t.Errorf("%d: permanent %v, want %v (%v)", c.code, sender.IsPermanent(err), c.permanent, err)
		}
		if httpsender.Permanent(c.code) != c.permanent {
			t.Errorf("Permanent(%d) = %v", c.code, !c.permanent)
		}
	}

	// Nobody listens: a transport error, retried.
	// An address that refuses for the whole test: a port released by a
	// listener could be taken by another test's server meanwhile (whose
	// answer, a 404, would be a permanent failure).
	addr := testnet.DeadAddr(t)
	s := httpsender.New(httpsender.Config{URL: "http://" + addr + "/", Timeout: 5 * time.Second})
	defer closeSender(t, s)
	if err := result(t, send(s, "t", "x")); err == nil || sender.IsPermanent(err) {
		t.Fatalf("connection refused: %v, want a retryable error", err)
	}
}

// A destination that does not answer fails the message after the timeout
// (retryable), and the sender goes on with the next message.
func TestTimeout(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	}))
	defer srv.Close()
	defer close(release)
	// The timeout also bounds the second, answered POST: generous enough
	// for a loaded machine under -race (200 ms was not), so that only the
	// unanswered one runs into it.
	s := httpsender.New(httpsender.Config{URL: srv.URL, Timeout: 2 * time.Second})
	defer closeSender(t, s)
	err := result(t, send(s, "t", "slow"))
	if err == nil || sender.IsPermanent(err) {
		t.Fatalf("unanswered POST: %v, want a retryable error", err)
	}
	if err := result(t, send(s, "t", "next")); err != nil {
		t.Fatalf("after a timeout: %v", err)
	}
}

// After a failed POST, the later messages of that topic queued with it
// are not posted (ErrWithdrawn: the route retries the failed one first);
// other topics are. A withdrawn message is not posted either, and Close
// fails what is sent afterwards.
func TestFailedTopicHoldsItsBatch(t *testing.T) {
	gate := make(chan struct{})
	entered := make(chan struct{}, 1)
	var mu sync.Mutex
	var posted []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p := r.Header.Get("X-Myriarch-Topic") + "=" + string(b)
		mu.Lock()
		posted = append(posted, p)
		mu.Unlock()
		switch p {
		case "a=0":
			entered <- struct{}{}
			<-gate
		case "a=1":
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	s := httpsender.New(httpsender.Config{URL: srv.URL, Timeout: 10 * time.Second})
	first := send(s, "a", "0")
	<-entered // a=0 is being posted: what follows queues as one batch
	a1, a2, b0 := send(s, "a", "1"), send(s, "a", "2"), send(s, "b", "0")
	w := &sender.Message{Topic: "c", Payload: []byte("0")}
	w.SetWithdrawn(true)
	wch := make(chan error, 1)
	s.Send(w, func(err error) { wch <- err })
	close(gate)
	if err := result(t, first); err != nil {
		t.Fatal(err)
	}
	if err := result(t, a1); err == nil {
		t.Fatal("a=1 accepted")
	}
	if err := result(t, a2); !errors.Is(err, sender.ErrWithdrawn) {
		t.Fatalf("a=2 after the failed a=1: %v, want ErrWithdrawn", err)
	}
	if err := result(t, b0); err != nil {
		t.Fatalf("b=0: %v", err)
	}
	if err := result(t, wch); !errors.Is(err, sender.ErrWithdrawn) {
		t.Fatalf("withdrawn message: %v", err)
	}
	mu.Lock()
	if got := fmt.Sprint(posted); got != "[a=0 a=1 b=0]" {
		t.Fatalf("posted %s", got)
	}
	mu.Unlock()
	closeSender(t, s)
	if err := result(t, send(s, "a", "3")); !errors.Is(err, sender.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// An exclusive session's message carries the fencing stamp headers; a
// non-exclusive one carries none.
func TestFenceHeaders(t *testing.T) {
	got := make(chan [2]string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- [2]string{r.Header.Get(fence.HeaderLeaseVersion), r.Header.Get(fence.HeaderSessionID)}
	}))
	defer srv.Close()
	s := httpsender.New(httpsender.Config{URL: srv.URL, Timeout: 5 * time.Second})
	defer closeSender(t, s)
	if err := result(t, sendertest.Send(s, &sender.Message{Topic: "t", Payload: []byte("x"), Fence: fence.New(7, "br/s")})); err != nil {
		t.Fatal(err)
	}
	if g := <-got; g != [2]string{"7", "br/s"} {
		t.Fatalf("stamped headers %q", g)
	}
	if err := result(t, send(s, "t", "y")); err != nil {
		t.Fatal(err)
	}
	if g := <-got; g != [2]string{"", ""} {
		t.Fatalf("non-exclusive message carries %q", g)
	}
}
