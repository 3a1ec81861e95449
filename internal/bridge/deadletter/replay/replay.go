// Package replay re-sends dead-lettered messages (`myriarch-bridge
// deadletter replay`): through a route — the route's current topic rewrite
// applied to the source topic, delivered by the route's sender that gave
// up on the record — or through one named sender with the recorded topic.
//
// Sends are sequential: the next message goes only after the destination's
// verdict on the one before, so per-topic order is the file's order and
// the journal says exactly what arrived. When a message fails, the later
// records of its topic to the same sender are not sent in that run, so
// that a topic's order survives (a later run sends them).
//
// A replayed message carries no fencing stamp. It is not an act of any
// lease tenure: the original stamp would be discarded by a consumer that
// follows package fence's recipe as soon as the session moved on (the
// replay would vanish), and the current owner's stamp would claim an
// authority the command does not hold. A consumer that fences treats it
// like a message of a non-exclusive session: it applies it. Senders that
// carry MQTT 5 user properties mark it with ReplayProperty (the record's
// id). The retain flag is cleared unless KeepRetain: a replayed retained
// message would replace whatever the topic retained since.
//
// What was sent is appended to the replay journal (see
// deadletter.Journal) right after each verdict; a record whose replay
// was accepted is not sent again unless Again. A crash between a
// destination's acceptance and the journal write sends that one record
// again on the next run: at least once, like the bridge.
package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/deadletter"
	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// ReplayProperty is the MQTT 5 user property that marks a replayed
// message; its value is the dead-letter record's id.
const ReplayProperty = "myriarch-replay-of"

// Destination is where the records go.
type Destination struct {
	// Route, if set, replays through that route: Rewrite maps a record's
	// source topic to the topic the route delivers it to now (false: the
	// route does not take it now), and RouteSenders are the route's
	// senders; a record goes to the one that gave up on it.
	Route        string
	Rewrite      func(sourceTopic string) (string, bool)
	RouteSenders []string
	// Sender, if Route is empty, replays every record through that
	// sender with its recorded topic.
	Sender string
	// Types are the senders' types by id, for the output.
	Types map[string]string
}

// Options configure Run.
type Options struct {
	Dest Destination
	// Senders are the opened senders by id; unused in a dry run.
	Senders map[string]sender.Sender
	// Journal says what was replayed before and, unless DryRun, records
	// this run.
	Journal *deadletter.Journal
	DryRun  bool
	// Again sends records that the journal says were replayed.
	Again bool
	// KeepRetain keeps the recorded retain flag.
	KeepRetain bool
	// Rate is the most messages sent per second; 0 is no limit.
	Rate float64
	// Timeout bounds the wait for one message's verdict; past it the run
	// stops (the sender may still deliver it: outcome unknown).
	Timeout time.Duration
	// Run identifies this run in the journal.
	Run string
	// Out receives one JSON object per record (Line).
	Out io.Writer
}

// Line is what Run prints for one record, as one JSON line.
type Line struct {
	ID          string `json:"id"`
	Line        int    `json:"line"`
	Via         string `json:"via"`
	Route       string `json:"route,omitempty"`
	Sender      string `json:"sender"`
	SenderType  string `json:"sender_type,omitempty"`
	Topic       string `json:"topic"`
	SourceTopic string `json:"source_topic"`
	QoS         byte   `json:"qos"`
	Retain      bool   `json:"retain"`
	Bytes       int    `json:"bytes"`
	// Action is "send" or "skip" (SkipReason says why).
	Action     string `json:"action"`
	SkipReason string `json:"skip_reason,omitempty"`
	// Outcome (not in a dry run) is a deadletter.Outcome* for a sent
	// record.
	Outcome string `json:"outcome,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Summary counts what Run did.
type Summary struct {
	Selected, Sent, Failed, Unknown, Skipped int
	// WouldSend counts the records a dry run would send.
	WouldSend int
}

// ErrUnknownOutcome stops a run whose message got no verdict in time.
var ErrUnknownOutcome = errors.New("no verdict from the destination within the timeout; the replay stopped (the message may still arrive)")

// Run replays entries in order.
func Run(ctx context.Context, entries []deadletter.Entry, o Options) (Summary, error) {
	var sum Summary
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	enc := json.NewEncoder(o.Out)
	failedTopics := map[[2]string]bool{} // sender, topic
	start := time.Now()
	sends := 0
	for _, e := range entries {
		sum.Selected++
		ln, m := plan(e, o)
		if ln.Action == "send" {
			if failedTopics[[2]string{ln.Sender, ln.Topic}] {
				ln.Action, ln.SkipReason = "skip", "an earlier record of the topic failed in this run (order)"
			}
		}
		if ln.Action == "skip" || o.DryRun {
			if ln.Action == "skip" {
				sum.Skipped++
			} else {
				sum.WouldSend++
			}
			if err := enc.Encode(ln); err != nil {
				return sum, err
			}
			continue
		}
		if err := pace(ctx, start, sends, o.Rate); err != nil {
			return sum, err
		}
		sends++
		err := send(ctx, o.Senders[ln.Sender], m, o.Timeout)
		ln.Outcome = deadletter.OutcomeSent
		switch {
		case errors.Is(err, ErrUnknownOutcome):
			ln.Outcome, ln.Error = deadletter.OutcomeUnknown, Redact(err.Error())
			sum.Unknown++
		case err != nil:
			ln.Outcome, ln.Error = deadletter.OutcomeFailed, Redact(err.Error())
			sum.Failed++
			failedTopics[[2]string{ln.Sender, ln.Topic}] = true
		default:
			sum.Sent++
		}
		jerr := o.Journal.Append(deadletter.JournalEntry{Time: time.Now().UTC(), Run: o.Run, RecordID: e.ID, RecordLine: e.Line,
			Via: ln.Via, Route: ln.Route, Sender: ln.Sender, Topic: ln.Topic, Bytes: ln.Bytes, Outcome: ln.Outcome, Error: ln.Error})
		if encErr := enc.Encode(ln); encErr != nil && jerr == nil {
			jerr = encErr
		}
		if jerr != nil {
			return sum, fmt.Errorf("stopped: %w", jerr)
		}
		if ln.Outcome == deadletter.OutcomeUnknown {
			return sum, err
		}
	}
	return sum, nil
}

// plan is what Run does with e: its output line and, to send, the message.
func plan(e deadletter.Entry, o Options) (Line, *sender.Message) {
	d := o.Dest
	ln := Line{ID: e.ID, Line: e.Line, Topic: e.Topic, SourceTopic: e.SourceTopic, QoS: e.QoS,
		Retain: e.Retain && o.KeepRetain, Bytes: len(e.Payload), Action: "send"}
	if d.Route != "" {
		ln.Via, ln.Route, ln.Sender = "route", d.Route, e.Sender
		src := e.SourceTopic
		if src == "" {
			src = e.Topic
		}
		switch topic, ok := d.Rewrite(src); {
		case !slices.Contains(d.RouteSenders, e.Sender):
			ln.Action, ln.SkipReason = "skip", fmt.Sprintf("sender %q (which gave up on the record) is not a sender of route %q now; use --sender", e.Sender, d.Route)
		case !ok:
			ln.Action, ln.SkipReason = "skip", fmt.Sprintf("route %q does not take source topic %q now", d.Route, src)
		default:
			ln.Topic = topic
		}
	} else {
		ln.Via, ln.Sender = "sender", d.Sender
	}
	ln.SenderType = d.Types[ln.Sender]
	if ln.Action == "send" && !o.Again && o.Journal != nil {
		if j, ok := o.Journal.Replayed(e.ID); ok {
			via := "sender " + j.Sender
			if j.Via == "route" {
				via = "route " + j.Route + ", sender " + j.Sender
			}
			ln.Action, ln.SkipReason = "skip", fmt.Sprintf("replayed at %s (run %s, %s); --again sends it again", j.Time.Format(time.RFC3339), j.Run, via)
		}
	}
	if ln.Action != "send" {
		return ln, nil
	}
	m := e.Message()
	m.Topic, m.Retain = ln.Topic, ln.Retain
	if d.Route != "" {
		m.Route = d.Route
	}
	// The marker, on a copy: the record's properties stay as read.
	var p sender.Properties
	if m.Properties != nil {
		p = *m.Properties
	}
	p.User = append(slices.Clip(p.User), sender.UserProperty{Key: ReplayProperty, Value: e.ID})
	m.Properties = &p
	return ln, m
}

// pace waits until the n-th send (from 0) may start at rate msg/s.
func pace(ctx context.Context, start time.Time, n int, rate float64) error {
	if rate <= 0 || n == 0 {
		return ctx.Err()
	}
	at := start.Add(time.Duration(float64(n) / rate * float64(time.Second)))
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// send hands m to s and waits for the verdict.
func send(ctx context.Context, s sender.Sender, m *sender.Message, timeout time.Duration) error {
	if s == nil {
		return errors.New("sender not opened")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	verdict := make(chan error, 1)
	s.Send(m, func(err error) { verdict <- err })
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-verdict:
		return err
	case <-t.C:
		return ErrUnknownOutcome
	}
}

// userinfo matches the credentials of a URL (scheme://user:password@).
var userinfo = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]*@`)

// Redact masks credentials in URLs in s: a sender's error may quote its
// URL, and the output and the journal are no place for a password.
func Redact(s string) string {
	return userinfo.ReplaceAllString(s, "${1}[redacted]@")
}
