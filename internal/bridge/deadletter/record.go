// Package deadletter owns the bridge's dead-letter file: the format of one
// record, the writer the routes append with, and a reader for the
// `myriarch-bridge deadletter` commands.
//
// The file holds one JSON object per line (JSON Lines). A record is the
// message as the route handed it to the sender that gave up — topic after
// rewrite, source topic, QoS, retain flag, MQTT 5 properties, the fencing
// stamp it carried — with the route, the sender, the attempts, the reason
// and the time. Payload and correlation data are base64 (JSON's encoding
// of bytes), so any payload round-trips. Every record has an id: 16
// hexadecimal digits written with it; a record written before ids existed
// gets one derived from its bytes (a hash of the line), stable across
// reads.
//
// The writer appends a whole line with one write and syncs the file before
// the route acknowledges the message. A crash can still leave a torn last
// line; when the writer next opens the file it ends such a line first, so
// that the torn fragment stays one corrupt line and never swallows the
// next record. The reader tolerates a torn last line (reported as torn,
// not as corrupt) and reports every other line it cannot decode by line
// number, and reads the records around it.
package deadletter

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// Record is one dead letter: one line of the dead-letter file.
type Record struct {
	// ID identifies the record (16 hexadecimal digits).
	ID string `json:"id,omitempty"`
	// Time is when the record was written.
	Time time.Time `json:"time"`
	// Route and Sender name the route and the sender that gave up.
	Route  string `json:"route"`
	Sender string `json:"sender"`
	// Topic is the topic the sender was asked to deliver to (after the
	// route's rewrite); SourceTopic the topic it arrived on.
	Topic       string `json:"topic"`
	SourceTopic string `json:"source_topic"`
	QoS         byte   `json:"qos"`
	Retain      bool   `json:"retain,omitempty"`
	// Received is when the bridge read the message from the broker (zero
	// in records written before it was recorded).
	Received time.Time `json:"received,omitzero"`
	Payload  []byte    `json:"payload"`
	// Properties are the message's MQTT 5 properties; nil for none.
	Properties *Properties `json:"properties,omitempty"`
	// LeaseVersion and SessionID are the fencing stamp the message carried
	// (see package fence); both zero for a non-exclusive session.
	LeaseVersion uint64 `json:"lease_version,omitempty"`
	SessionID    string `json:"session_id,omitempty"`
	Attempts     int    `json:"attempts"`
	Reason       string `json:"reason"`
}

// Properties are a record's MQTT 5 properties.
type Properties struct {
	User            []UserProperty `json:"user,omitempty"`
	ContentType     string         `json:"content_type,omitempty"`
	PayloadFormat   *byte          `json:"payload_format,omitempty"`
	MessageExpiry   *uint32        `json:"message_expiry,omitempty"`
	ResponseTopic   string         `json:"response_topic,omitempty"`
	CorrelationData []byte         `json:"correlation_data,omitempty"`
}

// UserProperty is one MQTT 5 user property.
type UserProperty struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// IDLen is the length of a record id.
const IDLen = 16

// NewRecord is the record of m, which the sender of route gave up on.
// The caller sets ID and Time.
func NewRecord(route, senderID string, m *sender.Message, reason string, attempts int) Record {
	r := Record{Route: route, Sender: senderID, Topic: m.Topic, SourceTopic: m.SourceTopic, QoS: m.QoS, Retain: m.Retain,
		Payload: m.Payload, LeaseVersion: m.Fence.LeaseVersion, SessionID: m.Fence.SessionID, Attempts: attempts, Reason: reason}
	if !m.Received.IsZero() {
		r.Received = m.Received.UTC()
	}
	if p := m.Properties; p != nil {
		rp := &Properties{ContentType: p.ContentType, PayloadFormat: p.PayloadFormat, MessageExpiry: p.MessageExpiry,
			ResponseTopic: p.ResponseTopic, CorrelationData: p.CorrelationData}
		for _, u := range p.User {
			rp.User = append(rp.User, UserProperty{Key: u.Key, Value: u.Value})
		}
		r.Properties = rp
	}
	return r
}

// Stamp is the fencing stamp the message carried (zero for none).
func (r *Record) Stamp() fence.Stamp {
	if r.LeaseVersion == 0 && r.SessionID == "" {
		return fence.Stamp{}
	}
	return fence.New(r.LeaseVersion, r.SessionID)
}

// Message is the record as a message for a sender, without a fencing
// stamp or tenure (the caller decides what a re-sent message carries).
func (r *Record) Message() *sender.Message {
	m := &sender.Message{Topic: r.Topic, SourceTopic: r.SourceTopic, Payload: r.Payload, QoS: r.QoS, Retain: r.Retain,
		Received: r.Received, Route: r.Route}
	if p := r.Properties; p != nil {
		sp := &sender.Properties{ContentType: p.ContentType, PayloadFormat: p.PayloadFormat, MessageExpiry: p.MessageExpiry,
			ResponseTopic: p.ResponseTopic, CorrelationData: p.CorrelationData}
		for _, u := range p.User {
			sp.User = append(sp.User, sender.UserProperty{Key: u.Key, Value: u.Value})
		}
		m.Properties = sp
	}
	return m
}

// Encode is the record's line, without the newline.
func Encode(r *Record) ([]byte, error) {
	return json.Marshal(r)
}

// Decode reads one line (without its newline). A record without an id
// gets the one derived from line (DerivedID). Decode refuses what the
// writer never writes: not one JSON object, a missing time, route,
// sender or topic, a QoS above 2, negative attempts, an id that is not
// IDLen hexadecimal digits.
func Decode(line []byte) (Record, error) {
	var r Record
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&r); err != nil {
		return Record{}, fmt.Errorf("not a dead-letter record: %w", err)
	}
	if len(bytes.TrimSpace(line[dec.InputOffset():])) > 0 {
		return Record{}, errors.New("not a dead-letter record: data after the JSON object")
	}
	switch {
	case r.Time.IsZero():
		return Record{}, errors.New("dead-letter record: time: missing")
	case r.Route == "":
		return Record{}, errors.New("dead-letter record: route: missing")
	case r.Sender == "":
		return Record{}, errors.New("dead-letter record: sender: missing")
	case r.Topic == "":
		return Record{}, errors.New("dead-letter record: topic: missing")
	case r.QoS > 2:
		return Record{}, fmt.Errorf("dead-letter record: qos: %d: must be 0, 1 or 2", r.QoS)
	case r.Attempts < 0:
		return Record{}, fmt.Errorf("dead-letter record: attempts: %d: must not be negative", r.Attempts)
	}
	if p := r.Properties; p != nil {
		// What the encoder leaves out (omitempty) reads back as absent.
		if len(p.User) == 0 {
			p.User = nil
		}
		if len(p.CorrelationData) == 0 {
			p.CorrelationData = nil
		}
	}
	if r.ID == "" {
		r.ID = DerivedID(line)
	} else if !ValidID(r.ID) {
		return Record{}, fmt.Errorf("dead-letter record: id: %q: must be %d hexadecimal digits", r.ID, IDLen)
	}
	return r, nil
}

// DerivedID is the id of a record written without one: the first IDLen
// hexadecimal digits of the SHA-256 of its line.
func DerivedID(line []byte) string {
	sum := sha256.Sum256(line)
	return hex.EncodeToString(sum[:IDLen/2])
}

// ValidID reports whether id has the form of a record id.
func ValidID(id string) bool {
	if len(id) != IDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
