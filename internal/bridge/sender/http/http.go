// Package http is the bridge's HTTP sender: it POSTs each message's payload
// and counts it accepted on a 2xx answer. The MQTT topic travels in the
// X-Myriarch-Topic header, the route in X-Myriarch-Route; a message of an
// exclusive session carries its fencing stamp in Myriarch-Lease-Version and
// Myriarch-Session-Id (package fence). A 4xx answer that
// refuses the message itself is a permanent failure (see Permanent): the
// route dead-letters the message without retrying it.
package http

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// Config configures the sender.
type Config struct {
	URL     string
	Headers map[string]string
	Timeout time.Duration // per POST; DefaultTimeout when not positive
	Client  *http.Client  // nil: a client with Timeout
}

// DefaultTimeout bounds each POST (the whole exchange) when Config.Timeout
// is not positive: a destination that never answers fails the message
// instead of holding the sender forever.
const DefaultTimeout = 10 * time.Second

// Sender POSTs messages, one at a time and in order. After a failed POST,
// the later messages of the same topic that were queued with it are not
// posted (ErrWithdrawn): the route retries the failed one first.
type Sender struct {
	*sender.Batch
	cfg    Config
	client *http.Client
}

// New creates the sender.
func New(cfg Config) *Sender {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	s := &Sender{cfg: cfg, client: cfg.Client}
	if s.client == nil {
		s.client = &http.Client{Timeout: cfg.Timeout}
	}
	s.Batch = sender.NewBatch(64, func(ctx context.Context, ms []*sender.Message) []error {
		errs := make([]error, len(ms))
		// A topic whose message failed gets no later POST in this batch:
		// the route retries that message before them, in order.
		var failed map[string]bool
		for i, m := range ms {
			if failed[m.Topic] || m.Withdrawn() {
				errs[i] = sender.ErrWithdrawn
				continue
			}
			if errs[i] = s.post(ctx, m); errs[i] != nil {
				if failed == nil {
					failed = map[string]bool{}
				}
				failed[m.Topic] = true
			}
		}
		return errs
	})
	return s
}

func (s *Sender) post(ctx context.Context, m *sender.Message) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.URL, bytes.NewReader(m.Payload))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	for k, v := range s.cfg.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("X-Myriarch-Topic", m.Topic)
	req.Header.Set("X-Myriarch-Route", m.Route)
	m.Fence.SetHeaders(req.Header)
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		err := fmt.Errorf("POST %s: %s", s.cfg.URL, resp.Status)
		if Permanent(resp.StatusCode) {
			return sender.Permanent(err)
		}
		return err
	}
	return nil
}

// Permanent reports whether an answer refuses the message itself, so that
// posting it again cannot succeed: every 4xx except 401, 403 and 404
// (credentials or a deployment that an operator may fix while the
// messages wait), 408 (a timeout), 425 and 429 (come back later). Other
// answers (5xx, 3xx) and transport errors are retried.
func Permanent(status int) bool {
	if status < 400 || status >= 500 {
		return false
	}
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusRequestTimeout,
		http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return true
}

// Close stops the sender and its idle connections.
func (s *Sender) Close(ctx context.Context) error {
	err := s.Batch.Close(ctx)
	s.client.CloseIdleConnections()
	return err
}
