package runtime_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/eclipse/paho.golang/paho"
	amqpgo "github.com/rabbitmq/amqp091-go"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/embroker"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
	"github.com/myriarch/myriarch/internal/bridge/sender/amqp/amqptest"
	"github.com/myriarch/myriarch/internal/bridge/sender/sqs/sqstest"
	"github.com/myriarch/myriarch/internal/testwait"
)

// The amqp and sqs senders as the configuration builds them: one route
// delivers to a RabbitMQ exchange and to an SQS FIFO queue, with the
// configured routing key and the topic as message group.
func TestAMQPAndSQSSendersFromConfig(t *testing.T) {
	br, err := embroker.Start("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	node := amqptest.Start(t)
	conn, err := amqpgo.Dial(node.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("mqtt", "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("plant", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("plant", "bridge.site.#", "mqtt", false, nil); err != nil {
		t.Fatal(err)
	}
	sq := sqstest.Start(t)
	queueURL := sq.CreateQueue(t, "plant.fifo")

	t.Setenv("TEST_SQS_SECRET", sqstest.SecretKey)
	dir := t.TempDir()
	y := strings.NewReplacer("DIR", dir, "BROKER", br.URL, "AMQPURL", node.URL(), "QUEUE", queueURL, "ENDPOINT", sq.URL,
		"REGION", sqstest.Region, "AK", sqstest.AccessKey).Replace(`
bridge: {id: p, instance_id: i, http: {listen: "off"}, dead_letter: {path: DIR/dl.jsonl}}
sessions:
  - {id: s, brokers: ["BROKER"], connect_timeout: 1s, reconcile_timeout: 1s, unmatched_grace: 1s}
receivers:
  - {id: r, session: s, topics: [{filter: "plant/#"}]}
senders:
  - {id: rabbit, type: amqp, amqp: {url: "AMQPURL", exchange: mqtt, routing_key: "bridge.{topic}"}}
  - {id: queue, type: sqs, sqs: {queue_url: "QUEUE", region: REGION, endpoint: "ENDPOINT", access_key_id: AK, secret_access_key_env: TEST_SQS_SECRET}}
routes:
  - {id: rt, receiver: r, senders: [rabbit, queue], rewrite: {strip_prefix: "plant/", add_prefix: "site/"}}
`)
	cfg, err := config.Parse(filepath.Join(dir, "p.yaml"), []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	b, err := runtime.New(context.Background(), cfg, runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	testwait.Until(t, "active and full", waitLimit, func() bool { s := b.Status().Sessions[0]; return s.Role+"/"+s.ServiceLevel == "active/full" })
	p := publisher(t, br.URL)
	for i := range 10 {
		if _, err := p.Publish(context.Background(), &paho.Publish{Topic: "plant/m1", QoS: 1, Payload: fmt.Append(nil, i)}); err != nil {
			t.Fatal(err)
		}
	}
	var got []amqpgo.Delivery
	testwait.Until(t, "10 messages in RabbitMQ", waitLimit, func() bool {
		d, ok, err := ch.Get("plant", true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got = append(got, d)
		}
		return len(got) == 10
	})
	for i, d := range got {
		if d.RoutingKey != "bridge.site.m1" || string(d.Body) != fmt.Sprint(i) || d.DeliveryMode != amqpgo.Persistent {
			t.Fatalf("amqp message %d: key %q body %q mode %d", i, d.RoutingKey, d.Body, d.DeliveryMode)
		}
	}
	var bodies []string
	cl := sq.Client()
	testwait.Until(t, "10 messages in SQS", waitLimit, func() bool {
		r, err := cl.ReceiveMessage(context.Background(), &awssqs.ReceiveMessageInput{QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 10,
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameMessageGroupId}, VisibilityTimeout: 300})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range r.Messages {
			if g := m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]; g != "site/m1" {
				t.Fatalf("sqs group %q", g)
			}
			bodies = append(bodies, aws.ToString(m.Body))
			if _, err := cl.DeleteMessage(context.Background(), &awssqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
		return len(bodies) >= 10
	})
	if strings.Join(bodies, ",") != "0,1,2,3,4,5,6,7,8,9" {
		t.Fatalf("sqs bodies %v", bodies)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
