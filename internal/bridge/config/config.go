package config

import (
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/bridge/leasemode"
)

// Config is a validated configuration with every default applied.
type Config struct {
	File       string
	Bridge     BridgeSettings
	LeaseStore LeaseStoreSettings
	Sessions   []SessionSettings
	Receivers  []ReceiverSettings
	Senders    []SenderSettings
	Routes     []RouteSettings
	// Exclusive is the canonical, admitted policy of every exclusive
	// session that a route uses, sorted by session ID.
	Exclusive []failover.CanonicalSession
	// Admission is the one admission run over the routes' policies: each
	// route's assessment (also of routes whose session was refused) and
	// the divergences between routes of one session.
	Admission failover.Preflighted
	// QueueRoom is the queue-room admission of each admitted exclusive
	// session, by session ID.
	QueueRoom map[string]failover.QueueRoom
	Warnings  []string
	// OpAMP is the opamp block; nil without one (see opamp.go).
	OpAMP *OpAMPSettings
}

// MQTT protocol versions of sessions and mqtt senders (protocol_version).
const (
	MQTT5   = "5"
	MQTT311 = "3.1.1"
)

// Session modes.
const (
	Ephemeral  = "ephemeral"
	Persistent = "persistent"
	Exclusive  = "exclusive"
)

// Defaults.
const (
	DefaultShutdownTimeout   = 30 * time.Second
	DefaultHTTPListen        = "127.0.0.1:9464"
	DefaultKeepAlive         = 30 * time.Second
	DefaultSessionExpiry     = time.Hour
	DefaultReceiveMaximum    = 1000
	DefaultMaxInFlight       = 1000
	DefaultRetryAttempts     = 5
	DefaultInitialBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff        = 5 * time.Second
	DefaultSenderTimeout     = 10 * time.Second
	DefaultLeaseStorePath    = "myriarch-bridge-lease.db"
	DefaultDeadLetterPath    = "myriarch-bridge-deadletter.jsonl"
	DefaultSpoolMaxBytes     = 1 << 30
	DefaultSpoolSegmentBytes = 64 << 20
	maxSessionExpiry         = time.Duration(0xFFFFFFFF) * time.Second
	maxReceiveMaximum        = 65535
	maxKeepAlive             = 65535 * time.Second
	minKeepAlive             = time.Second
	// SpoolFile and SpoolPostgres are the spool backends.
	SpoolFile     = "file"
	SpoolPostgres = "postgres"

	leaseStoreSQLite        = "sqlite"
	leaseStorePostgres      = "postgres"
	leaseStoreEtcd          = "etcd"
	senderMQTT, senderHTTP  = "mqtt", "http"
	senderNATS, senderKafka = "nats", "kafka"
	senderFile              = "file"
	senderAMQP, senderSQS   = "amqp", "sqs"
)

// BridgeSettings is the process-wide block.
type BridgeSettings struct {
	ID              string
	InstanceID      string
	InstanceIDSet   bool // false: derived from the hostname and a random suffix
	DeploymentMode  leasemode.Mode
	ShutdownTimeout time.Duration
	HTTPListen      string
	DeadLetterPath  string
	// StateDir holds each session's record of its subscribed filters.
	StateDir string
}

// LeaseStoreSettings selects the lease store.
type LeaseStoreSettings struct {
	Type      string // sqlite, postgres or etcd
	Path      string
	DSN       Secret
	Endpoints []string
	Prefix    string
}

// Secret is a value that is never printed.
type Secret string

func (Secret) String() string { return "[redacted]" }

// GoString keeps %#v from printing the secret.
func (Secret) GoString() string { return "[redacted]" }

// MarshalText keeps encoders from printing the secret.
func (Secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }

// Reveal returns the secret for the one place that needs it.
func (s Secret) Reveal() string { return string(s) }

// TLSSettings configures a client TLS connection.
type TLSSettings struct {
	CAFile, CertFile, KeyFile, ServerName string
	InsecureSkipVerify                    bool
}

// SessionSettings is one MQTT session.
type SessionSettings struct {
	ID                    string
	Mode                  string
	Brokers               []string
	ClientID              string
	ClientIDInstance      bool // append "-" + instance_id at run time
	CleanStart            bool
	SessionExpiryInterval time.Duration
	KeepAlive             time.Duration
	Username              string
	Password              Secret
	TLS                   *TLSSettings
	ConnectTimeout        time.Duration
	ReconcileTimeout      time.Duration
	UnmatchedGrace        time.Duration
	ReceiveMaximum        int
	Activation            failover.Activation
	// ConnectAfterLease is the routes' connect_after_lease (exclusive only).
	ConnectAfterLease bool
	// BrokerMaxQueuedMessages is the broker's per-session queue limit as
	// declared: -1 not declared, 0 unlimited.
	BrokerMaxQueuedMessages int
	// ProtocolVersion is MQTT5 or MQTT311.
	ProtocolVersion string
}

// ReceiverSettings is a set of subscriptions on one session.
type ReceiverSettings struct {
	ID      string
	Session string
	Topics  []TopicSettings
}

// TopicSettings is one subscription.
type TopicSettings struct {
	Filter string
	QoS    byte
}

// SenderSettings is one destination: the settings common to every type
// and, set for its type only, the settings of that type.
type SenderSettings struct {
	ID             string
	Type           string
	MaxAttempts    int
	InitialBackoff time.Duration
	MaxBackoff     time.Duration

	MQTT  *MQTTSenderSettings
	HTTP  *HTTPSenderSettings
	NATS  *NATSSenderSettings
	Kafka *KafkaSenderSettings
	File  *FileSenderSettings
	AMQP  *AMQPSenderSettings
	SQS   *SQSSenderSettings
}

// MQTTSenderSettings publishes to another broker.
type MQTTSenderSettings struct {
	Broker         string
	ClientID       string
	Username       string
	Password       Secret
	TLS            *TLSSettings
	QoS            byte
	KeepAlive      time.Duration
	ConnectTimeout time.Duration
	Timeout        time.Duration
	// ProtocolVersion is MQTT5 or MQTT311.
	ProtocolVersion string
}

// HTTPSenderSettings POSTs each message.
type HTTPSenderSettings struct {
	URL     string
	Headers map[string]string
	Timeout time.Duration
}

// NATSSenderSettings publishes to NATS.
type NATSSenderSettings struct {
	URL           string
	SubjectPrefix string
	Timeout       time.Duration
}

// KafkaSenderSettings produces to Kafka.
type KafkaSenderSettings struct {
	Brokers []string
	Topic   string
	Timeout time.Duration
}

// AMQPSenderSettings publishes to an AMQP 0.9.1 broker.
type AMQPSenderSettings struct {
	URL        string
	Username   string
	Password   Secret
	TLS        *TLSSettings
	Exchange   string
	RoutingKey string // a valid routingkey template
	Mandatory  bool
	Timeout    time.Duration
}

// SQSSenderSettings sends to an SQS queue.
type SQSSenderSettings struct {
	QueueURL        string
	Region          string
	Endpoint        string
	AccessKeyID     string
	SecretAccessKey Secret
	BodyEncoding    string
	Timeout         time.Duration
}

// FileSenderSettings appends JSON lines.
type FileSenderSettings struct {
	Path string
}

// RouteSettings is one route.
type RouteSettings struct {
	ID          string
	Receiver    string
	Session     string // the receiver's session
	Senders     []string
	MaxInFlight int
	StripPrefix string
	AddPrefix   string
	// Mappings replace StripPrefix/AddPrefix when set.
	Mappings []Mapping
	// Retain is keep, clear or drop (see routing.RetainPolicy).
	Retain string
	// LoopPeer names the route of the opposite direction of a loop pair
	// ("" none).
	LoopPeer string
	// Policy is set when the session is exclusive.
	Policy *failover.SessionPolicy
	// PeakMessageRate is the declared peak rate in msg/s; 0 undeclared.
	PeakMessageRate float64
	// Spool is the route's durable spool; nil without one.
	Spool *SpoolSettings
}

// SpoolSettings is a route's durable spool: package spool (backend file)
// or package outbox (backend postgres).
type SpoolSettings struct {
	// Backend is SpoolFile or SpoolPostgres.
	Backend string
	// Dir is the file spool's directory; empty for the postgres backend.
	Dir                   string
	MaxBytes, MaxMessages int
	Full                  string // block or dead_letter
	Fsync                 string // always, interval or never
	FsyncInterval         time.Duration
	SegmentBytes          int
}

// Session returns the session with the given ID.
func (c *Config) Session(id string) *SessionSettings {
	for i := range c.Sessions {
		if c.Sessions[i].ID == id {
			return &c.Sessions[i]
		}
	}
	return nil
}

// Receiver returns the receiver with the given ID.
func (c *Config) Receiver(id string) *ReceiverSettings {
	for i := range c.Receivers {
		if c.Receivers[i].ID == id {
			return &c.Receivers[i]
		}
	}
	return nil
}

// Sender returns the sender with the given ID.
func (c *Config) Sender(id string) *SenderSettings {
	for i := range c.Senders {
		if c.Senders[i].ID == id {
			return &c.Senders[i]
		}
	}
	return nil
}

// ExclusiveSession returns the canonical policy of an exclusive session.
func (c *Config) ExclusiveSession(id string) *failover.CanonicalSession {
	for i := range c.Exclusive {
		if c.Exclusive[i].SessionID == id {
			return &c.Exclusive[i]
		}
	}
	return nil
}
