package sqs_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/bridge/fence"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/sender/sendertest"
	sqssender "github.com/myriarch/myriarch/internal/bridge/sender/sqs"
	"github.com/myriarch/myriarch/internal/bridge/sender/sqs/sqstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, srv *sqstest.Server, queueURL, enc string) *sqssender.Sender {
	t.Helper()
	s, err := sqssender.New(context.Background(), sqssender.Config{QueueURL: queueURL, Region: sqstest.Region, Endpoint: srv.URL,
		AccessKeyID: sqstest.AccessKey, SecretAccessKey: sqstest.SecretKey, BodyEncoding: enc, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// receiveAll takes every message from the queue.
func receiveAll(t *testing.T, srv *sqstest.Server, queueURL string) []types.Message {
	t.Helper()
	var out []types.Message
	cl := srv.Client()
	for empty := 0; empty < 2; {
		r, err := cl.ReceiveMessage(context.Background(), &awssqs.ReceiveMessageInput{QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 10,
			MessageAttributeNames: []string{"All"}, MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}, VisibilityTimeout: 300})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Messages) == 0 {
			empty++
			continue
		}
		out = append(out, r.Messages...)
		for _, m := range r.Messages {
			if _, err := cl.DeleteMessage(context.Background(), &awssqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out
}

func attr(m types.Message, k string) string {
	return aws.ToString(m.MessageAttributes[k].StringValue)
}

// sendAll sends ms (in order, without waiting in between, as a route does)
// and returns their results.
func sendAll(t *testing.T, s sender.Sender, ms []*sender.Message) []error {
	t.Helper()
	chs := make([]chan error, len(ms))
	for i, m := range ms {
		chs[i] = sendertest.Send(s, m)
	}
	errs := make([]error, len(ms))
	for i := range chs {
		errs[i] = sendertest.Result(t, chs[i])
	}
	return errs
}

func TestFIFOKeepsTopicOrderDedupsRetriesAndCarriesTheStamp(t *testing.T) {
	srv := sqstest.Start(t)
	q := srv.CreateQueue(t, "bridge.fifo")
	s := open(t, srv, q, "")

	long := strings.Repeat("x/", 100) // 200 characters: hashed as a group id
	topics := []string{"site/a", "site/b", long}
	var ms []*sender.Message
	base := time.Now()
	for i := range 45 {
		ms = append(ms, &sender.Message{Topic: topics[i%3], SourceTopic: "in/" + topics[i%3], Route: "r",
			Payload: []byte(fmt.Sprintf("%d", i)), Received: base.Add(time.Duration(i)), Fence: fence.New(9, "b/s")})
	}
	for i, err := range sendAll(t, s, ms) {
		if err != nil {
			t.Fatalf("message %d not accepted: %v", i, err)
		}
	}
	// A retry of messages already accepted (same tenure, same message):
	// SQS drops them as duplicates.
	for i, err := range sendAll(t, s, ms[:5]) {
		if err != nil {
			t.Fatalf("retry %d not accepted: %v", i, err)
		}
	}

	got := receiveAll(t, srv, q)
	if len(got) != 45 {
		t.Fatalf("queue holds %d messages, want 45 (the 5 retries deduplicated)", len(got))
	}
	last := map[string]int{}
	for _, m := range got {
		n, err := strconv.Atoi(aws.ToString(m.Body))
		if err != nil {
			t.Fatalf("body %q", aws.ToString(m.Body))
		}
		topic := topics[n%3]
		group := m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
		if want := sqssender.GroupID(topic); group != want {
			t.Errorf("message %d: group %q, want %q", n, group, want)
		}
		if prev, ok := last[topic]; ok && n < prev {
			t.Errorf("topic %q: message %d after %d", topic, n, prev)
		}
		last[topic] = n
		st, ok := fence.Parse(attr(m, fence.HeaderLeaseVersion), attr(m, fence.HeaderSessionID))
		if !ok || st.LeaseVersion != 9 || st.SessionID != "b/s" || attr(m, "mqtt_topic") != "in/"+topic {
			t.Errorf("message %d: attributes %v", n, m.MessageAttributes)
		}
		if dd := m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]; dd != sqssender.DedupID(ms[n]) {
			t.Errorf("message %d: dedup id %q", n, dd)
		}
	}
	if g := sqssender.GroupID(long); !strings.HasPrefix(g, "sha256-") || len(g) != 71 {
		t.Errorf("long topic's group id %q", g)
	}
}

func TestPayloadsSQSCannotCarry(t *testing.T) {
	srv := sqstest.Start(t)
	q := srv.CreateQueue(t, "plain")
	binary := []byte{0xff, 0x00, 'a'}

	// Text: a binary payload is refused for good, and the topic's later
	// message in the same batch is not sent ahead of it.
	s := open(t, srv, q, sqssender.Text)
	errs := sendAll(t, s, []*sender.Message{
		{Topic: "t", SourceTopic: "t", Payload: binary},
		{Topic: "t", SourceTopic: "t", Payload: []byte("after")},
		{Topic: "u", SourceTopic: "u", Payload: []byte("other topic")},
	})
	if !sender.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "base64") {
		t.Fatalf("binary payload as text: %v", errs[0])
	}
	if errs[1] != nil && !errors.Is(errs[1], sender.ErrWithdrawn) {
		t.Fatalf("later message of the topic: %v", errs[1])
	}
	if errs[2] != nil {
		t.Fatalf("other topic: %v", errs[2])
	}

	// Base64 carries anything, marked; an empty payload is marked too.
	s64 := open(t, srv, q, sqssender.Base64)
	for _, err := range sendAll(t, s64, []*sender.Message{{Topic: "t", SourceTopic: "t", Payload: binary}, {Topic: "t", SourceTopic: "t"}}) {
		if err != nil {
			t.Fatal(err)
		}
	}
	got := receiveAll(t, srv, q)
	var b64, empty int
	for _, m := range got {
		if attr(m, "mqtt_payload_encoding") == "base64" && aws.ToString(m.Body) == base64.StdEncoding.EncodeToString(binary) {
			b64++
		}
		if attr(m, "mqtt_payload_empty") == "true" {
			empty++
		}
	}
	if b64 != 1 || empty != 1 {
		t.Fatalf("base64 messages %d, empty %d, of %d received", b64, empty, len(got))
	}
}

func TestNotAcceptedWithoutTheQueue(t *testing.T) {
	srv := sqstest.Start(t)
	s := open(t, srv, srv.URL+"/123456789012/missing", "")
	err := sendertest.Result(t, sendertest.Send(s, &sender.Message{Topic: "t", SourceTopic: "t", Payload: []byte("x")}))
	if err == nil || sender.IsPermanent(err) {
		t.Fatalf("missing queue: %v, want a failure that is retried", err)
	}
}

func TestValidText(t *testing.T) {
	for _, ok := range []string{"", "plain", "tab\tnl\ncr\r", "ü€😀", "\uE000\uFFFD"} {
		if err := sqssender.ValidText([]byte(ok)); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"\x00", "a\x1fb", "\xff", "\uFFFE", "\xed\xa0\x80"} {
		if err := sqssender.ValidText([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
