// Package sqs is the bridge's Amazon SQS sender, on aws-sdk-go-v2. It
// sends what has queued with SendMessageBatch (up to 10 messages and
// 256 KiB a call, calls in order) and counts a message accepted when SQS
// listed it among the batch's successful entries.
//
// A FIFO queue (its URL ends in ".fifo") gets each message with the MQTT
// topic as its MessageGroupId, so that one topic keeps its order and
// different topics do not wait for each other, and a MessageDeduplicationId
// derived from the fencing stamp and the message itself: a retry of the
// same message by the same tenure carries the same id, so SQS drops the
// duplicate within its 5-minute deduplication interval. A topic that is
// not a valid group id (longer than 128 characters, or characters outside
// ASCII 33-126) is hashed: "sha256-" and the first 64 hex digits.
//
// Message attributes: mqtt_topic, mqtt_received (RFC 3339 UTC), the
// fencing stamp (Myriarch-Lease-Version, Myriarch-Session-Id, see package
// fence), and mqtt_payload_encoding "base64" when the body is base64.
package sqs

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
)

// Body encodings.
const (
	// Text sends the payload as the body; a payload SQS cannot carry (not
	// UTF-8, or characters outside SQS's allowed set) fails for good.
	Text = "text"
	// Base64 sends the payload base64-encoded (standard alphabet).
	Base64 = "base64"
)

// Limits of SendMessageBatch.
const (
	MaxBatchEntries = 10
	MaxBatchBytes   = 256 << 10
)

// Config configures the sender.
type Config struct {
	QueueURL string
	Region   string
	// Endpoint overrides the SQS endpoint (tests, VPC endpoints, other
	// implementations of the API); "" is AWS's for the region.
	Endpoint string
	// AccessKeyID and SecretAccessKey are static credentials; without
	// them the SDK's default chain applies (environment, shared files,
	// web identity, the instance's role).
	AccessKeyID     string
	SecretAccessKey string
	// BodyEncoding is Text (default) or Base64.
	BodyEncoding string
	// Timeout bounds one SendMessageBatch call, the SDK's retries
	// included.
	Timeout time.Duration
}

// DefaultTimeout bounds each call when Config.Timeout is not positive.
const DefaultTimeout = 10 * time.Second

// Sender sends to one SQS queue.
type Sender struct {
	*sender.Batch
	cl   *awssqs.Client
	cfg  Config
	fifo bool
	tr   *http.Transport
}

// New creates the client (it connects on the first send).
func New(ctx context.Context, cfg Config) (*Sender, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.BodyEncoding == "" {
		cfg.BodyEncoding = Text
	}
	opts := []func(*awsconfig.LoadOptions) error{awsconfig.WithRegion(cfg.Region)}
	if cfg.AccessKeyID != "" {
		opts = append(opts, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, "")))
	}
	ac, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, err
	}
	// The client's transport, frozen as the SDK built it (a CA bundle from
	// AWS_CA_BUNDLE included), so that Close can drop its idle
	// connections and their goroutines.
	var tr *http.Transport
	if bc, ok := ac.HTTPClient.(*awshttp.BuildableClient); ok {
		frozen := bc.Freeze()
		if hc, ok := frozen.(*http.Client); ok {
			tr, _ = hc.Transport.(*http.Transport)
		}
		ac.HTTPClient = frozen
	}
	cl := awssqs.NewFromConfig(ac, func(o *awssqs.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	})
	s := &Sender{cl: cl, cfg: cfg, fifo: strings.HasSuffix(cfg.QueueURL, ".fifo"), tr: tr}
	s.Batch = sender.NewBatch(10*MaxBatchEntries, s.deliver)
	return s, nil
}

// deliver sends ms in calls of up to MaxBatchEntries messages, in order.
// A message that fails stops the later messages of its topic in ms; a
// call that fails as a whole stops everything after it.
func (s *Sender) deliver(ctx context.Context, ms []*sender.Message) []error {
	errs := make([]error, len(ms))
	failed := map[string]bool{}
	var entries []types.SendMessageBatchRequestEntry
	var idx []int
	size := 0
	flush := func() error {
		if len(entries) == 0 {
			return nil
		}
		defer func() { entries, idx, size = entries[:0], idx[:0], 0 }()
		cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
		defer cancel()
		out, err := s.cl.SendMessageBatch(cctx, &awssqs.SendMessageBatchInput{QueueUrl: &s.cfg.QueueURL, Entries: entries})
		if err != nil {
			err = classify(err, len(entries))
			for _, i := range idx {
				errs[i] = err
				failed[ms[i].Topic] = true
			}
			return err
		}
		ok := make(map[string]bool, len(out.Successful))
		for _, e := range out.Successful {
			ok[aws.ToString(e.Id)] = true
		}
		bad := make(map[string]types.BatchResultErrorEntry, len(out.Failed))
		for _, e := range out.Failed {
			bad[aws.ToString(e.Id)] = e
		}
		for k, i := range idx {
			id := strconv.Itoa(k)
			switch e, isBad := bad[id]; {
			case ok[id]:
			case isBad:
				err := fmt.Errorf("sqs: %s: %s", aws.ToString(e.Code), aws.ToString(e.Message))
				if e.SenderFault {
					err = sender.Permanent(err)
				}
				errs[i] = err
				failed[ms[i].Topic] = true
			default:
				errs[i] = errors.New("sqs: the answer lists the message neither as sent nor as failed")
				failed[ms[i].Topic] = true
			}
		}
		return nil
	}
	var check sender.TenureCheck
	for i, m := range ms {
		if failed[m.Topic] || check.Withdrawn(m) {
			errs[i] = sender.ErrWithdrawn
			continue
		}
		e, n, err := s.entry(m, len(entries))
		if err != nil {
			errs[i] = err
			failed[m.Topic] = true
			continue
		}
		if len(entries) == MaxBatchEntries || (len(entries) > 0 && size+n > MaxBatchBytes) {
			if err := flush(); err != nil {
				for j := i; j < len(ms); j++ {
					errs[j] = sender.ErrWithdrawn
				}
				return errs
			}
			if failed[m.Topic] {
				errs[i] = sender.ErrWithdrawn
				continue
			}
			e.Id = aws.String("0")
		}
		entries = append(entries, e)
		idx = append(idx, i)
		size += n
	}
	_ = flush()
	return errs
}

// entry builds the batch entry of m (id k) and its size as SQS counts it.
func (s *Sender) entry(m *sender.Message, k int) (types.SendMessageBatchRequestEntry, int, error) {
	var body string
	attrs := map[string]types.MessageAttributeValue{}
	switch s.cfg.BodyEncoding {
	case Base64:
		body = base64.StdEncoding.EncodeToString(m.Payload)
		attrs["mqtt_payload_encoding"] = str("base64")
	default:
		if err := ValidText(m.Payload); err != nil {
			return types.SendMessageBatchRequestEntry{}, 0, sender.Permanent(fmt.Errorf("sqs: %w; set sqs.body_encoding: base64 to carry any payload", err))
		}
		body = string(m.Payload)
	}
	if body == "" {
		// SQS refuses an empty body; an empty MQTT payload (a retained
		// message's deletion) is carried as base64's empty string would
		// be: marked, with a placeholder body.
		body = "-"
		attrs["mqtt_payload_empty"] = str("true")
	}
	if m.SourceTopic != "" {
		attrs["mqtt_topic"] = str(m.SourceTopic)
	}
	if !m.Received.IsZero() {
		attrs["mqtt_received"] = str(m.Received.UTC().Format(time.RFC3339Nano))
	}
	if f := m.Fence; !f.IsZero() {
		attrs[fence.HeaderLeaseVersion] = str(f.Version())
		if f.SessionID != "" {
			attrs[fence.HeaderSessionID] = str(f.SessionID)
		}
	}
	n := len(body)
	for k, v := range attrs {
		n += len(k) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue))
	}
	e := types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(k)), MessageBody: aws.String(body), MessageAttributes: attrs}
	if s.fifo {
		e.MessageGroupId = aws.String(GroupID(m.Topic))
		e.MessageDeduplicationId = aws.String(DedupID(m))
	}
	return e, n, nil
}

func str(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

// classify marks a whole call's failure permanent when the one message it
// carried was refused for what it is.
func classify(err error, entries int) error {
	var tooLong *types.BatchRequestTooLong
	var contents *types.InvalidMessageContents
	if entries == 1 && (errors.As(err, &tooLong) || errors.As(err, &contents)) {
		return sender.Permanent(err)
	}
	return err
}

// ValidText reports why p cannot be an SQS message body as is: SQS takes
// UTF-8 text of the characters #x9, #xA, #xD, #x20-#xD7FF, #xE000-#xFFFD
// and #x10000-#x10FFFF only.
func ValidText(p []byte) error {
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRune(p[i:])
		if r == utf8.RuneError && n <= 1 {
			return fmt.Errorf("payload is not UTF-8 (byte %d)", i)
		}
		if !(r == 0x9 || r == 0xA || r == 0xD || (r >= 0x20 && r <= 0xD7FF) || (r >= 0xE000 && r <= 0xFFFD) || r >= 0x10000) {
			return fmt.Errorf("payload has character %U at byte %d, which SQS does not accept", r, i)
		}
		i += n
	}
	return nil
}

// GroupID is the MessageGroupId of a topic on a FIFO queue: the topic
// itself when SQS accepts it (1-128 characters in ASCII 33-126), else
// "sha256-" and the first 64 hex digits of its SHA-256.
func GroupID(topic string) string {
	ok := topic != "" && len(topic) <= 128
	for i := 0; ok && i < len(topic); i++ {
		ok = topic[i] >= 33 && topic[i] <= 126
	}
	if ok {
		return topic
	}
	sum := sha256.Sum256([]byte(topic))
	return "sha256-" + hex.EncodeToString(sum[:])
}

// DedupID is the MessageDeduplicationId of m: the SHA-256 (64 hex digits)
// of its fencing stamp, route, topics, receive time and payload. The same
// message retried by the same tenure gets the same id; a successor's
// redelivery (another lease version) does not, so it is kept — and the
// consumer's fencing recipe sorts it out.
func DedupID(m *sender.Message) string {
	h := sha256.New()
	var n [8]byte
	field := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	binary.BigEndian.PutUint64(n[:], m.Fence.LeaseVersion)
	h.Write(n[:])
	field([]byte(m.Fence.SessionID))
	field([]byte(m.Route))
	field([]byte(m.SourceTopic))
	field([]byte(m.Topic))
	binary.BigEndian.PutUint64(n[:], uint64(m.Received.UnixNano()))
	h.Write(n[:])
	field(m.Payload)
	return hex.EncodeToString(h.Sum(nil))
}

// Close stops the sender: what is queued is sent within ctx, the rest
// fails.
func (s *Sender) Close(ctx context.Context) error {
	err := s.Batch.Close(ctx)
	if s.tr != nil {
		s.tr.CloseIdleConnections()
	}
	return err
}
