// Package config reads and validates the YAML configuration of
// myriarch-bridge. Nothing is opened here: Load returns either a fully
// validated Config, with the lease cadence and failover budgets of every
// exclusive session resolved and admitted, or every problem at once, each
// naming the file, the path of the key, the value and the rule.
package config

// The raw types mirror the YAML document. Durations are strings here so
// that a bad one is reported with its path during validation instead of
// stopping the decoder.

// File is the whole document.
type File struct {
	Bridge    Bridge     `yaml:"bridge"`
	Stores    Stores     `yaml:"stores"`
	Sessions  []Session  `yaml:"sessions"`
	Receivers []Receiver `yaml:"receivers"`
	Senders   []Sender   `yaml:"senders"`
	Routes    []Route    `yaml:"routes"`
	OpAMP     *OpAMP     `yaml:"opamp"` // see opamp.go
}

// Bridge is the process-wide block.
type Bridge struct {
	ID              string `yaml:"id"`
	InstanceID      string `yaml:"instance_id"`
	DeploymentMode  string `yaml:"deployment_mode"`
	ShutdownTimeout string `yaml:"shutdown_timeout"`
	HTTP            struct {
		Listen string `yaml:"listen"`
	} `yaml:"http"`
	DeadLetter struct {
		Path string `yaml:"path"`
	} `yaml:"dead_letter"`
	StateDir string `yaml:"state_dir"`
}

// Stores holds the lease store.
type Stores struct {
	Lease LeaseStore `yaml:"lease"`
}

// LeaseStore selects the lease store: sqlite (default), postgres or etcd.
type LeaseStore struct {
	Type      string   `yaml:"type"`
	Path      string   `yaml:"path"`
	DSN       string   `yaml:"dsn"`
	DSNFile   string   `yaml:"dsn_file"`
	Endpoints []string `yaml:"endpoints"`
	Prefix    string   `yaml:"prefix"`
}

// Session is one connection to an MQTT broker.
type Session struct {
	ID                    string   `yaml:"id"`
	Transport             string   `yaml:"transport"`
	SessionMode           string   `yaml:"session_mode"`
	Brokers               []string `yaml:"brokers"`
	ClientID              string   `yaml:"client_id"`
	ClientIDSuffix        string   `yaml:"client_id_suffix"`
	CleanStart            *bool    `yaml:"clean_start"`
	SessionExpiryInterval string   `yaml:"session_expiry_interval"`
	KeepAlive             string   `yaml:"keep_alive"`
	Username              string   `yaml:"username"`
	PasswordFile          string   `yaml:"password_file"`
	PasswordEnv           string   `yaml:"password_env"`
	TLS                   *TLS     `yaml:"tls"`
	ConnectTimeout        string   `yaml:"connect_timeout"`
	ReconcileTimeout      string   `yaml:"reconcile_timeout"`
	UnmatchedGrace        string   `yaml:"unmatched_grace"`
	ReceiveMaximum        int      `yaml:"receive_maximum"`
	// BrokerMaxQueuedMessages is the broker's per-session queue limit
	// (mosquitto max_queued_messages); 0 means unlimited.
	BrokerMaxQueuedMessages *int `yaml:"broker_max_queued_messages"`
	// ProtocolVersion is the MQTT version the session speaks: 5 (default)
	// or 3.1.1.
	ProtocolVersion string `yaml:"protocol_version"`
	// LeaseKeys of an exclusive session: every route of the session
	// inherits them.
	LeaseKeys `yaml:",inline"`
}

// LeaseKeys are the keys of an exclusive session's lease policy (the
// session block of the spec). A session declares them for all its routes;
// a route declares one to override the session's (the routes of a session
// must still resolve to the same policy).
type LeaseKeys struct {
	LeaseTTL             string `yaml:"lease_ttl"`
	RenewInterval        string `yaml:"renew_interval"`
	LeaseRenewJitter     string `yaml:"lease_renew_jitter"`
	RenewCallTimeout     string `yaml:"renew_call_timeout"`
	AcquirePollInterval  string `yaml:"acquire_poll_interval"`
	MaxRenewFails        int    `yaml:"max_renew_fails"`
	StepDownGrace        string `yaml:"step_down_grace"`
	ConnectAfterLease    *bool  `yaml:"connect_after_lease"`
	FailoverSLO          string `yaml:"failover_slo"`
	BrokerHealthStepDown string `yaml:"broker_health_step_down"`
	StartupAllowance     string `yaml:"startup_allowance"`
}

// TLS configures a client TLS connection.
type TLS struct {
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// Receiver is a set of topic filters on one session.
type Receiver struct {
	ID      string  `yaml:"id"`
	Session string  `yaml:"session"`
	Topics  []Topic `yaml:"topics"`
}

// Topic is one subscription.
type Topic struct {
	Filter string `yaml:"filter"`
	QoS    *int   `yaml:"qos"`
}

// Sender is one destination.
type Sender struct {
	ID    string      `yaml:"id"`
	Type  string      `yaml:"type"`
	Retry Retry       `yaml:"retry"`
	MQTT  *MQTTSender `yaml:"mqtt"`
	HTTP  *HTTPSender `yaml:"http"`
	NATS  *NATSSender `yaml:"nats"`
	Kafka *KafkaSend  `yaml:"kafka"`
	File  *FileSender `yaml:"file"`
	AMQP  *AMQPSender `yaml:"amqp"`
	SQS   *SQSSender  `yaml:"sqs"`
}

// Retry is a sender's retry policy before dead-lettering.
type Retry struct {
	MaxAttempts    int    `yaml:"max_attempts"`
	InitialBackoff string `yaml:"initial_backoff"`
	MaxBackoff     string `yaml:"max_backoff"`
}

// MQTTSender publishes to another broker.
type MQTTSender struct {
	Broker         string `yaml:"broker"`
	ClientID       string `yaml:"client_id"`
	Username       string `yaml:"username"`
	PasswordFile   string `yaml:"password_file"`
	PasswordEnv    string `yaml:"password_env"`
	TLS            *TLS   `yaml:"tls"`
	QoS            *int   `yaml:"qos"`
	KeepAlive      string `yaml:"keep_alive"`
	ConnectTimeout string `yaml:"connect_timeout"`
	Timeout        string `yaml:"timeout"`
	// ProtocolVersion is the MQTT version the sender speaks: 5 (default)
	// or 3.1.1.
	ProtocolVersion string `yaml:"protocol_version"`
}

// HTTPSender POSTs each message.
type HTTPSender struct {
	URL     string            `yaml:"url"`
	Headers map[string]string `yaml:"headers"`
	Timeout string            `yaml:"timeout"`
}

// NATSSender publishes to NATS.
type NATSSender struct {
	URL           string `yaml:"url"`
	SubjectPrefix string `yaml:"subject_prefix"`
	Timeout       string `yaml:"timeout"`
}

// KafkaSend produces to Kafka.
type KafkaSend struct {
	Brokers []string `yaml:"brokers"`
	Topic   string   `yaml:"topic"`
	Timeout string   `yaml:"timeout"`
}

// AMQPSender publishes to an AMQP 0.9.1 broker (RabbitMQ).
type AMQPSender struct {
	URL          string `yaml:"url"`
	Username     string `yaml:"username"`
	PasswordFile string `yaml:"password_file"`
	PasswordEnv  string `yaml:"password_env"`
	TLS          *TLS   `yaml:"tls"`
	Exchange     string `yaml:"exchange"`
	// RoutingKey is a pointer: an empty key is a value of its own.
	RoutingKey *string `yaml:"routing_key"`
	Mandatory  *bool   `yaml:"mandatory"`
	Timeout    string  `yaml:"timeout"`
}

// SQSSender sends to an Amazon SQS queue.
type SQSSender struct {
	QueueURL            string `yaml:"queue_url"`
	Region              string `yaml:"region"`
	Endpoint            string `yaml:"endpoint"`
	AccessKeyID         string `yaml:"access_key_id"`
	SecretAccessKeyFile string `yaml:"secret_access_key_file"`
	SecretAccessKeyEnv  string `yaml:"secret_access_key_env"`
	BodyEncoding        string `yaml:"body_encoding"`
	Timeout             string `yaml:"timeout"`
}

// FileSender appends JSON lines.
type FileSender struct {
	Path string `yaml:"path"`
}

// Route takes one receiver to its senders. The lease keys apply when the
// receiver's session is exclusive; those the route omits are the
// session's.
type Route struct {
	ID          string   `yaml:"id"`
	Receiver    string   `yaml:"receiver"`
	Senders     []string `yaml:"senders"`
	MaxInFlight int      `yaml:"max_in_flight"`
	Rewrite     *Rewrite `yaml:"rewrite"`
	// Mappings map topics like mosquitto's bridge "topic" lines, several
	// per route, each with its own prefixes (instead of rewrite).
	Mappings []Mapping `yaml:"mappings"`
	// Retain is keep (default), clear or drop: what the route does with
	// messages that carry the retain flag.
	Retain string `yaml:"retain"`
	// LoopPeer names the route that bridges the opposite direction
	// between the same brokers; the two must name each other (see
	// routing.RouteConfig.LoopPeer).
	LoopPeer string `yaml:"loop_peer"`

	LeaseKeys `yaml:",inline"`
	// PeakMessageRate is the route's peak message rate (msg/s), for the
	// queue-room admission of its exclusive session.
	PeakMessageRate float64 `yaml:"peak_message_rate"`
	// Spool is the route's durable spool.
	Spool *Spool `yaml:"spool"`
}

// Spool is a route's durable spool.
type Spool struct {
	Backend       string `yaml:"backend"`
	Dir           string `yaml:"dir"`
	MaxBytes      *int   `yaml:"max_bytes"`
	MaxMessages   *int   `yaml:"max_messages"`
	Full          string `yaml:"full"`
	Fsync         string `yaml:"fsync"`
	FsyncInterval string `yaml:"fsync_interval"`
	SegmentBytes  int    `yaml:"segment_bytes"`
}

// Mapping is one topic mapping of a route.
type Mapping struct {
	Pattern           string `yaml:"pattern"`
	SourcePrefix      string `yaml:"source_prefix"`
	DestinationPrefix string `yaml:"destination_prefix"`
}

// Rewrite replaces a topic prefix.
type Rewrite struct {
	StripPrefix string `yaml:"strip_prefix"`
	AddPrefix   string `yaml:"add_prefix"`
}
