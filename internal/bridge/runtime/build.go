package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/mqttconn"
	"github.com/myriarch/myriarch/internal/bridge/sender"
	amqpsender "github.com/myriarch/myriarch/internal/bridge/sender/amqp"
	"github.com/myriarch/myriarch/internal/bridge/sender/amqp/routingkey"
	filesender "github.com/myriarch/myriarch/internal/bridge/sender/file"
	httpsender "github.com/myriarch/myriarch/internal/bridge/sender/http"
	kafkasender "github.com/myriarch/myriarch/internal/bridge/sender/kafka"
	mqttsender "github.com/myriarch/myriarch/internal/bridge/sender/mqtt"
	mqtt311sender "github.com/myriarch/myriarch/internal/bridge/sender/mqtt311"
	natssender "github.com/myriarch/myriarch/internal/bridge/sender/nats"
	sqssender "github.com/myriarch/myriarch/internal/bridge/sender/sqs"
	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/etcdstore"
	"github.com/myriarch/myriarch/lease/pgstore"
	"github.com/myriarch/myriarch/lease/sqlitestore"
)

func tlsFiles(t *config.TLSSettings) *mqttconn.TLSFiles {
	if t == nil {
		return nil
	}
	return &mqttconn.TLSFiles{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
}

// openSender opens one configured sender.
func openSender(s config.SenderSettings, instanceID string, log *slog.Logger) (sender.Sender, error) {
	switch {
	case s.MQTT != nil:
		m := s.MQTT
		tc, err := mqttconn.TLSConfig(tlsFiles(m.TLS))
		if err != nil {
			return nil, err
		}
		c := sender.MQTTConfig{Broker: m.Broker, ClientID: m.ClientID + "-" + instanceID, Username: m.Username,
			Password: []byte(m.Password.Reveal()), TLS: tc, QoS: m.QoS, KeepAlive: m.KeepAlive, ConnectTimeout: m.ConnectTimeout,
			Timeout: m.Timeout, Logger: log}
		if m.ProtocolVersion == config.MQTT311 {
			return mqtt311sender.New(c), nil
		}
		return mqttsender.New(c), nil
	case s.HTTP != nil:
		return httpsender.New(httpsender.Config{URL: s.HTTP.URL, Headers: s.HTTP.Headers, Timeout: s.HTTP.Timeout}), nil
	case s.NATS != nil:
		return natssender.Dial(natssender.Config{URL: s.NATS.URL, SubjectPrefix: s.NATS.SubjectPrefix, Timeout: s.NATS.Timeout, Name: "myriarch-bridge " + instanceID})
	case s.Kafka != nil:
		return kafkasender.Dial(kafkasender.Config{Brokers: s.Kafka.Brokers, Topic: s.Kafka.Topic, Timeout: s.Kafka.Timeout})
	case s.File != nil:
		return filesender.Open(s.File.Path)
	case s.AMQP != nil:
		a := s.AMQP
		tc, err := mqttconn.TLSConfig(tlsFiles(a.TLS))
		if err != nil {
			return nil, err
		}
		key, err := routingkey.Parse(a.RoutingKey)
		if err != nil {
			return nil, fmt.Errorf("routing_key %q: %w", a.RoutingKey, err)
		}
		return amqpsender.New(amqpsender.Config{URL: a.URL, Username: a.Username, Password: a.Password.Reveal(), TLS: tc, Exchange: a.Exchange,
			RoutingKey: key, Mandatory: a.Mandatory, Timeout: a.Timeout, Name: "myriarch-bridge " + instanceID, Logger: log}), nil
	case s.SQS != nil:
		q := s.SQS
		return sqssender.New(context.Background(), sqssender.Config{QueueURL: q.QueueURL, Region: q.Region, Endpoint: q.Endpoint,
			AccessKeyID: q.AccessKeyID, SecretAccessKey: q.SecretAccessKey.Reveal(), BodyEncoding: q.BodyEncoding, Timeout: q.Timeout})
	}
	return nil, fmt.Errorf("unknown sender type %q", s.Type)
}

// openSenders opens every sender, or none: on an error the ones opened are
// closed again.
func openSenders(ctx context.Context, cfg *config.Config, instanceID string, log *slog.Logger) (map[string]sender.Sender, error) {
	out := map[string]sender.Sender{}
	for _, s := range cfg.Senders {
		snd, err := openSender(s, instanceID, log.With("sender", s.ID))
		if err != nil {
			for _, o := range out {
				_ = o.Close(ctx)
			}
			return nil, fmt.Errorf("sender %q: %w", s.ID, err)
		}
		out[s.ID] = snd
	}
	return out, nil
}

// openStore opens the configured lease store.
func openStore(ctx context.Context, s config.LeaseStoreSettings) (lease.Store, error) {
	switch s.Type {
	case "sqlite":
		return sqlitestore.Open(ctx, s.Path, sqlitestore.Options{})
	case "postgres":
		return pgstore.OpenDSN(ctx, s.DSN.Reveal(), pgstore.Options{})
	case "etcd":
		cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints, DialTimeout: 5e9})
		if err != nil {
			return nil, err
		}
		return &closingStore{Store: etcdstore.Open(cli, etcdstore.Options{Prefix: s.Prefix}), close: cli.Close}, nil
	}
	return nil, errors.New("unknown lease store type " + s.Type)
}

// closingStore closes the etcd client with the store.
type closingStore struct {
	lease.Store
	close func() error
}

func (c *closingStore) Close() error {
	err := c.Store.Close()
	if cerr := c.close(); err == nil {
		err = cerr
	}
	return err
}

// NotifyRelease forwards the wrapped store's release hints; without it the
// wrapper would hide them and an etcd standby would wait for its poll.
func (c *closingStore) NotifyRelease(ctx context.Context, id string) <-chan struct{} {
	if n, ok := c.Store.(lease.ReleaseNotifier); ok {
		return n.NotifyRelease(ctx, id)
	}
	return nil
}

// The wrapper must keep the fast path of the store it wraps.
var _ lease.ReleaseNotifier = (*closingStore)(nil)

func defaultInstanceID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "bridge"
	}
	var b [4]byte
	_, _ = randRead(b[:])
	return fmt.Sprintf("%s-%x", h, b)
}
