package config

import (
	"slices"
	"strconv"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/bridge/activation"
	"github.com/myriarch/myriarch/internal/bridge/leasemode"
	"github.com/myriarch/myriarch/internal/bridge/sender/amqp/routingkey"
	"github.com/myriarch/myriarch/internal/godur"
)

// The tables of the configuration file, one per kind of YAML object. The
// raw types of raw.go decode the same keys (a test holds the two equal);
// docs/bridge.md shows these rows (make docs).

var topTable = Table{Name: "the top level", Rows: []Row{
	{Key: "bridge", Kind: Object, Table: &bridgeTable, Meaning: "the process-wide block"},
	{Key: "stores.lease", Kind: Object, Table: &leaseStoreTable, Meaning: "the lease store"},
	{Key: "sessions", Kind: Objects, Table: &sessionTable, Rule: Rule{Required: "at least one session is required"}, Meaning: "the MQTT connections"},
	{Key: "receivers", Kind: Objects, Table: &receiverTable, Rule: Rule{Required: "at least one receiver is required"}, Meaning: "subscriptions on the sessions"},
	{Key: "senders", Kind: Objects, Table: &senderTable, Rule: Rule{Required: "at least one sender is required"}, Meaning: "the destinations"},
	{Key: "routes", Kind: Objects, Table: &routeTable, Rule: Rule{Required: "at least one route is required"}, Meaning: "receivers to senders"},
	{Key: "opamp", Kind: Object, Table: &opampTable, Meaning: "the bridge as an agent of myriarchd"},
}}

var bridgeTable = Table{Name: "bridge", Rows: []Row{
	{Key: "id", To: to(func(s *BridgeSettings) *string { return &s.ID }), Kind: String, Rule: Rule{Required: "is required: it names this bridge in logs, metrics and lease keys", Format: "id"},
		Meaning: "names this bridge in logs, metrics and lease keys (`<id>/<session id>`)"},
	{Key: "instance_id", To: to(func(s *BridgeSettings) *string { return &s.InstanceID }), Kind: String, DefaultDoc: "hostname + random suffix", Rule: Rule{Format: "id"},
		Meaning: "this process; the lease owner is `instance_id#<boot nonce>`"},
	{Key: "deployment_mode", To: with(func(s *BridgeSettings, m string) { s.DeploymentMode, _ = leasemode.Parse(m) }), Kind: String, Default: "standalone", Rule: Rule{OneOf: []string{"standalone", "clustered"}},
		Meaning: "picks the lease baseline (see `docs/failover-budget.md`)"},
	{Key: "shutdown_timeout", To: to(func(s *BridgeSettings) *time.Duration { return &s.ShutdownTimeout }), Kind: Duration, Default: godur.Format(DefaultShutdownTimeout), Rule: Rule{Positive: true},
		Meaning: "graceful stop: intake stops, in-flight messages drain, leases are released (each only after its session's messages settled, see \"Planned stop\" under `run`); then everything is cut"},
	{Key: "http.listen", To: to(func(s *BridgeSettings) *string { return &s.HTTPListen }), Kind: String, Default: DefaultHTTPListen, Rule: Rule{Format: "listen"},
		Meaning: "address of `/live`, `/ready`, `/status`, `/metrics`; `off` disables"},
	{Key: "dead_letter.path", To: to(func(s *BridgeSettings) *string { return &s.DeadLetterPath }), Kind: String, DefaultDoc: "`" + DefaultDeadLetterPath + "` next to the config",
		Meaning: "where messages go after a sender's retries are spent"},
	{Key: "state_dir", To: to(func(s *BridgeSettings) *string { return &s.StateDir }), Kind: String, DefaultDoc: "the config's directory",
		Meaning: "per session, `<bridge id>-<session id>.subscriptions.json`: the filters the broker session holds, so that filters removed from the config are unsubscribed when the session is resumed"},
}}

var leaseStoreTable = Table{Name: "stores.lease", Rows: []Row{
	{Key: "type", To: orWritten(func(s *LeaseStoreSettings) *string { return &s.Type }), Kind: String, Default: leaseStoreSQLite, Rule: Rule{OneOf: []string{leaseStoreSQLite, leaseStorePostgres, leaseStoreEtcd}},
		Meaning: "`sqlite` is local to one host; `postgres` and `etcd` are shared by a cluster"},
	{Key: "path", Kind: String, DefaultDoc: "`" + DefaultLeaseStorePath + "` next to the config",
		Meaning: "sqlite only: the database file, shared by the bridge processes of one host"},
	{Key: "dsn", Kind: String, Meaning: "postgres only: the PostgreSQL connection string (required, or `dsn_file`)"},
	{Key: "dsn_file", Kind: String, Meaning: "postgres only: a file holding the connection string, instead of `dsn`"},
	{Key: "endpoints", Kind: Strings, Meaning: "etcd only: the etcd endpoints (at least one)"},
	{Key: "prefix", To: verbatim(func(s *LeaseStoreSettings) *string { return &s.Prefix }), Kind: String, Meaning: "etcd and postgres: the key prefix of the leases"},
}}

var tlsTable = Table{Name: "tls", Rows: []Row{
	{Key: "ca_file", Kind: String, DefaultDoc: "the system roots", Meaning: "PEM file of the CAs that sign the server's certificate"},
	{Key: "cert_file", Kind: String, Meaning: "PEM client certificate; set together with `key_file`"},
	{Key: "key_file", Kind: String, Meaning: "PEM key of the client certificate"},
	{Key: "server_name", Kind: String, DefaultDoc: "the URL's host", Meaning: "the name the server's certificate must carry"},
	{Key: "insecure_skip_verify", Kind: Bool, Default: "false", Meaning: "skip the check of the server's certificate (tests only)"},
}}

var protocolVersionRule = Rule{OneOf: []string{MQTT5, MQTT311}, Says: "must be 5 or 3.1.1 (the MQTT version to speak to the broker)"}

var sessionTable = Table{Name: "sessions[]", Rows: slices.Concat([]Row{
	{Key: "id", To: verbatim(func(s *sessionIn) *string { return &s.ID }), Kind: String, Rule: Rule{Required: "is required", Format: "id"}, Meaning: "session name"},
	{Key: "transport", Kind: String, Default: "mqtt", Rule: Rule{OneOf: []string{"mqtt"}}, Meaning: "only MQTT (Eclipse Paho)"},
	{Key: "protocol_version", To: to(func(s *sessionIn) *string { return &s.ProtocolVersion }), Kind: String, Default: MQTT5, Rule: protocolVersionRule,
		Meaning: "the MQTT version spoken to the broker (see \"MQTT features\" for what 3.1.1 cannot carry)"},
	{Key: "session_mode", To: to(func(s *sessionIn) *string { return &s.Mode }), Kind: String, Default: Ephemeral, Rule: Rule{OneOf: []string{Ephemeral, Persistent, Exclusive}},
		Meaning: "`ephemeral` (clean session), `persistent` (resumed broker session), `exclusive` (persistent, served by one lease holder at a time)"},
	{Key: "brokers", To: verbatim(func(s *sessionIn) *[]string { return &s.Brokers }), Kind: Strings, Rule: Rule{Required: "at least one broker URL is required", Format: "mqtt-url"}, Meaning: "tried in turn"},
	{Key: "client_id", To: verbatim(func(s *sessionIn) *string { return &s.ClientID }), Kind: String, DefaultDoc: "`<bridge id>-<session id>`; required when exclusive",
		Meaning: "at most 184 bytes; an exclusive session uses the same client_id on every instance, so the successor resumes the broker session and receives what queued"},
	{Key: "client_id_suffix", Kind: String, Rule: Rule{OneOf: []string{"instance"}, Says: `must be "instance" or omitted`},
		Meaning: "`instance` appends `-<instance_id>`; refused for exclusive sessions, required for non-exclusive sessions in clustered mode"},
	{Key: "clean_start", Kind: Bool, DefaultDoc: "`true` for ephemeral, else `false`", Meaning: "`true` is refused for persistent and exclusive sessions"},
	{Key: "session_expiry_interval", To: opt(func(s *sessionIn) **time.Duration { return &s.expiry }), Kind: Duration, DefaultDoc: "`" + godur.Format(DefaultSessionExpiry) + "` (`0s` for ephemeral)",
		Rule:    Rule{Max: strconv.FormatInt(int64(maxSessionExpiry/time.Second), 10) + "s", Whole: true},
		Meaning: "positive unless ephemeral; for an exclusive session at least the worst-case failover budget, or the broker discards the queue before the successor arrives; refused with `protocol_version: 3.1.1`"},
	{Key: "keep_alive", To: to(func(s *sessionIn) *time.Duration { return &s.KeepAlive }), Kind: Duration, Default: godur.Format(DefaultKeepAlive),
		Rule:    Rule{Min: minKeepAlive.String(), Max: maxKeepAlive.String(), Whole: true, ZeroOK: true, Says: "must be whole seconds between 1s and 65535s, or 0s to disable"},
		Meaning: "MQTT keep-alive; also how fast a dead broker path is noticed"},
	{Key: "username", To: verbatim(func(s *sessionIn) *string { return &s.Username }), Kind: String, Meaning: "MQTT user name"},
	{Key: "password_file", Kind: String, Meaning: "file holding the MQTT password (not with `password_env`)"},
	{Key: "password_env", Kind: String, Meaning: "environment variable holding the MQTT password (not with `password_file`)"},
	{Key: "tls", Kind: Object, Table: &tlsTable, DefaultDoc: "none", Meaning: "client TLS, see `tls:`"},
	{Key: "connect_timeout", To: to(func(s *sessionIn) *time.Duration { return &s.ConnectTimeout }), Kind: Duration, Default: godur.Format(activation.DefaultMQTTConnectTimeout), Rule: Rule{Positive: true},
		Meaning: "bounds each connect attempt (dial, TLS, CONNECT/CONNACK)"},
	{Key: "reconcile_timeout", To: to(func(s *sessionIn) *time.Duration { return &s.ReconcileTimeout }), Kind: Duration, Default: godur.Format(activation.DefaultMQTTReconcileTimeout), Rule: Rule{Positive: true},
		Meaning: "bounds each SUBSCRIBE/UNSUBSCRIBE wait"},
	{Key: "unmatched_grace", To: to(func(s *sessionIn) *time.Duration { return &s.UnmatchedGrace }), Kind: Duration, Default: godur.Format(activation.DefaultMQTTUnmatchedGrace), Rule: Rule{Positive: true},
		Meaning: "after activation, how long messages of filters no longer configured count as residue (acknowledged and dropped quietly); later ones are logged"},
	{Key: "receive_maximum", To: to(func(s *sessionIn) *int { return &s.ReceiveMaximum }), Kind: Int, Default: strconv.Itoa(DefaultReceiveMaximum), Rule: Rule{Min: "1", Max: strconv.Itoa(maxReceiveMaximum)},
		Meaning: "MQTT receive maximum: how many unacknowledged messages the broker may send; refused with `protocol_version: 3.1.1`"},
	{Key: "broker_max_queued_messages", To: opt(func(s *sessionIn) **int { return &s.maxQueued }), Kind: Int, DefaultDoc: "not declared (1000 assumed when a route declares `peak_message_rate`)",
		Rule:    Rule{Min: "0", Says: "must be 0 (the broker queues without limit) or a positive number of messages"},
		Meaning: "the broker's per-session queue limit (0 = unlimited); an exclusive session's queue must hold `messages_at_risk`, see \"Queue room\""},
}, leaseKeyRows(func(s *sessionIn) *failover.SessionPolicy { return &s.policy }, func(s *sessionIn) *bool { return &s.connectAfterLease }, true))}

var receiverTable = Table{Name: "receivers[]", Rows: []Row{
	{Key: "id", To: verbatim(func(r *ReceiverSettings) *string { return &r.ID }), Kind: String, Rule: Rule{Required: "is required", Format: "id"}, Meaning: "receiver name"},
	{Key: "session", To: verbatim(func(r *ReceiverSettings) *string { return &r.Session }), Kind: String, Rule: Rule{Required: "is required"}, Meaning: "the session it subscribes on"},
	{Key: "topics", Kind: Objects, Table: &topicTable, Rule: Rule{Required: "at least one topic filter is required"}, Meaning: "the subscriptions, see `topics:`"},
}}

var topicTable = Table{Name: "topics[]", Rows: []Row{
	{Key: "filter", To: verbatim(func(t *TopicSettings) *string { return &t.Filter }), Kind: String, Rule: Rule{Required: "must not be empty", Format: "filter"},
		Meaning: "in clustered mode a filter on a non-exclusive session must be `$share/`, or every instance would receive and deliver every message"},
	{Key: "qos", To: with(func(t *TopicSettings, q int) { t.QoS = byte(q) }), Kind: Int, Default: "1", Rule: Rule{OneOf: []string{"0", "1", "2"}}, Meaning: "the subscription's QoS"},
}}

// senderTypes are the sender types, each with the table of its block.
var senderTypes = []*Table{&mqttSenderTable, &httpSenderTable, &natsSenderTable, &kafkaSenderTable, &fileSenderTable, &amqpSenderTable, &sqsSenderTable}

var senderTable = Table{Name: "senders[]", Rows: []Row{
	{Key: "id", To: verbatim(func(s *SenderSettings) *string { return &s.ID }), Kind: String, Rule: Rule{Required: "is required", Format: "id"}, Meaning: "sender name"},
	{Key: "type", To: verbatim(func(s *SenderSettings) *string { return &s.Type }), Kind: String, Rule: Rule{Required: "must be mqtt, http, nats, kafka, file, amqp or sqs", OneOf: []string{senderMQTT, senderHTTP, senderNATS, senderKafka, senderFile, senderAMQP, senderSQS}},
		Meaning: "the destination; the block of the same name holds its settings"},
	{Key: "retry.max_attempts", To: to(func(s *SenderSettings) *int { return &s.MaxAttempts }), Kind: Int, Default: strconv.Itoa(DefaultRetryAttempts), Rule: Rule{Min: "1"}, Meaning: "deliveries tried before the message is dead-lettered"},
	{Key: "retry.initial_backoff", To: to(func(s *SenderSettings) *time.Duration { return &s.InitialBackoff }), Kind: Duration, Default: godur.Format(DefaultInitialBackoff), Rule: Rule{Positive: true}, Meaning: "wait before the first retry; doubled each time"},
	{Key: "retry.max_backoff", To: to(func(s *SenderSettings) *time.Duration { return &s.MaxBackoff }), Kind: Duration, Default: godur.Format(DefaultMaxBackoff), Rule: Rule{Positive: true}, Meaning: "the longest wait between retries; not below `initial_backoff`"},
	{Key: senderMQTT, Kind: Object, Table: &mqttSenderTable, Meaning: "type mqtt only, see `mqtt:`"},
	{Key: senderHTTP, Kind: Object, Table: &httpSenderTable, Meaning: "type http only, see `http:`"},
	{Key: senderNATS, Kind: Object, Table: &natsSenderTable, Meaning: "type nats only, see `nats:`"},
	{Key: senderKafka, Kind: Object, Table: &kafkaSenderTable, Meaning: "type kafka only, see `kafka:`"},
	{Key: senderFile, Kind: Object, Table: &fileSenderTable, Meaning: "type file only, see `file:`"},
	{Key: senderAMQP, Kind: Object, Table: &amqpSenderTable, Meaning: "type amqp only, see `amqp:`"},
	{Key: senderSQS, Kind: Object, Table: &sqsSenderTable, Meaning: "type sqs only, see `sqs:`"},
}}

// timeoutRow is the timeout of one delivery, common to six sender types.
func timeoutRow[D any](r Rule, field func(*D) *time.Duration) Row {
	r.Positive = true
	return Row{Key: "timeout", Kind: Duration, To: to(field), Default: godur.Format(DefaultSenderTimeout), Rule: r,
		Meaning: "bounds one delivery: a POST, a flush round trip, a PUBACK wait, a Kafka record including the client's own retries, an AMQP publisher confirm (and the connect), an SQS call including the SDK's retries"}
}

var mqttSenderTable = Table{Name: "mqtt", SenderType: senderMQTT, Rows: []Row{
	{Key: "broker", To: verbatim(func(s *MQTTSenderSettings) *string { return &s.Broker }), Kind: String, Rule: Rule{Required: "is required", Format: "mqtt-url"}, Meaning: "the broker it publishes to"},
	{Key: "client_id", To: verbatim(func(s *MQTTSenderSettings) *string { return &s.ClientID }), Kind: String, DefaultDoc: "`<bridge id>-<sender id>`", Meaning: "`-<instance_id>` is appended"},
	{Key: "username", To: verbatim(func(s *MQTTSenderSettings) *string { return &s.Username }), Kind: String, Meaning: "MQTT user name"},
	{Key: "password_file", Kind: String, Meaning: "file holding the MQTT password (not with `password_env`)"},
	{Key: "password_env", Kind: String, Meaning: "environment variable holding the MQTT password (not with `password_file`)"},
	{Key: "tls", Kind: Object, Table: &tlsTable, DefaultDoc: "none", Meaning: "client TLS, see `tls:`"},
	{Key: "qos", To: with(func(s *MQTTSenderSettings, q int) { s.QoS = byte(q) }), Kind: Int, Default: "1", Rule: Rule{OneOf: []string{"0", "1", "2"}}, Meaning: "accepted when the PUBACK arrives (QoS 1) or the PUBCOMP (QoS 2); QoS 0 when written"},
	{Key: "keep_alive", To: to(func(s *MQTTSenderSettings) *time.Duration { return &s.KeepAlive }), Kind: Duration, Default: godur.Format(DefaultKeepAlive), Meaning: "MQTT keep-alive"},
	{Key: "connect_timeout", To: to(func(s *MQTTSenderSettings) *time.Duration { return &s.ConnectTimeout }), Kind: Duration, Default: godur.Format(activation.DefaultMQTTConnectTimeout), Rule: Rule{Positive: true}, Meaning: "bounds each connect attempt"},
	timeoutRow(Rule{}, func(s *MQTTSenderSettings) *time.Duration { return &s.Timeout }),
	{Key: "protocol_version", To: to(func(s *MQTTSenderSettings) *string { return &s.ProtocolVersion }), Kind: String, Default: MQTT5, Rule: protocolVersionRule, Meaning: "the MQTT version spoken to the broker; 3.1.1 carries no fencing stamp and no hop stamp"},
}}

var httpSenderTable = Table{Name: "http", SenderType: senderHTTP, Rows: []Row{
	{Key: "url", To: verbatim(func(s *HTTPSenderSettings) *string { return &s.URL }), Kind: String, Rule: Rule{Required: "must be an http:// or https:// URL", Format: "http-url"}, Meaning: "each message is POSTed here; accepted on a 2xx answer; the topic is in `X-Myriarch-Topic`"},
	{Key: "headers", To: verbatim(func(s *HTTPSenderSettings) *map[string]string { return &s.Headers }), Kind: StringMap, Meaning: "headers added to each POST"},
	timeoutRow(Rule{}, func(s *HTTPSenderSettings) *time.Duration { return &s.Timeout }),
}}

var natsSenderTable = Table{Name: "nats", SenderType: senderNATS, Rows: []Row{
	{Key: "url", To: verbatim(func(s *NATSSenderSettings) *string { return &s.URL }), Kind: String, Rule: Rule{Required: "must be a nats:// or tls:// URL", Format: "nats-url"}, Meaning: "the NATS server; accepted on a flush round trip after the batch"},
	{Key: "subject_prefix", To: verbatim(func(s *NATSSenderSettings) *string { return &s.SubjectPrefix }), Kind: String, Meaning: "prepended to the subject (`/` in topics becomes `.`)"},
	timeoutRow(Rule{}, func(s *NATSSenderSettings) *time.Duration { return &s.Timeout }),
}}

var kafkaSenderTable = Table{Name: "kafka", SenderType: senderKafka, Rows: []Row{
	{Key: "brokers", To: verbatim(func(s *KafkaSenderSettings) *[]string { return &s.Brokers }), Kind: Strings, Rule: Rule{Required: "at least one host:port is required"}, Meaning: "seed brokers, `host:port`"},
	{Key: "topic", To: verbatim(func(s *KafkaSenderSettings) *string { return &s.Topic }), Kind: String, Rule: Rule{Required: "is required"}, Meaning: "the Kafka topic; the MQTT topic is the record key"},
	timeoutRow(Rule{Min: "1s", Says: "must be at least 1s (the Kafka client's minimum record delivery timeout)"},
		func(s *KafkaSenderSettings) *time.Duration { return &s.Timeout }),
}}

var fileSenderTable = Table{Name: "file", SenderType: senderFile, Rows: []Row{
	{Key: "path", To: verbatim(func(s *FileSenderSettings) *string { return &s.Path }), Kind: String, Rule: Rule{Required: "is required"}, Meaning: "JSON lines are appended here"},
}}

var amqpSenderTable = Table{Name: "amqp", SenderType: senderAMQP, Rows: []Row{
	{Key: "url", To: verbatim(func(s *AMQPSenderSettings) *string { return &s.URL }), Kind: String, Rule: Rule{Required: "must be an amqp:// or amqps:// URL", Format: "amqp-url"},
		Meaning: "the broker, `amqp://host:port/vhost`; accepted when the broker confirmed the message (publisher confirms)"},
	{Key: "username", To: verbatim(func(s *AMQPSenderSettings) *string { return &s.Username }), Kind: String, DefaultDoc: "the URL's", Meaning: "AMQP user name; replaces the URL's credentials"},
	{Key: "password_file", Kind: String, Meaning: "file holding the password (not with `password_env`)"},
	{Key: "password_env", Kind: String, Meaning: "environment variable holding the password (not with `password_file`)"},
	{Key: "tls", Kind: Object, Table: &tlsTable, DefaultDoc: "none", Meaning: "client TLS for `amqps://`, see `tls:`"},
	{Key: "exchange", To: verbatim(func(s *AMQPSenderSettings) *string { return &s.Exchange }), Kind: String, DefaultDoc: "the default exchange",
		Meaning: "the exchange published to; it must exist (the sender checks, and declares nothing)"},
	{Key: "routing_key", To: to(func(s *AMQPSenderSettings) *string { return &s.RoutingKey }), Kind: String, Default: routingkey.Default, Rule: Rule{Format: "routing-key"},
		Meaning: "template of the routing key: `{topic}` is the MQTT topic with `/` turned into `.`, `{topic_raw}` the topic as is, other text is literal; on the default exchange, a queue name"},
	{Key: "mandatory", To: to(func(s *AMQPSenderSettings) *bool { return &s.Mandatory }), Kind: Bool, Default: "true",
		Meaning: "a message no queue takes is returned by the broker and not accepted (retried, then dead-lettered); `false` lets the broker drop it"},
	timeoutRow(Rule{}, func(s *AMQPSenderSettings) *time.Duration { return &s.Timeout }),
}}

var sqsSenderTable = Table{Name: "sqs", SenderType: senderSQS, Rows: []Row{
	{Key: "queue_url", To: verbatim(func(s *SQSSenderSettings) *string { return &s.QueueURL }), Kind: String, Rule: Rule{Required: "must be an http:// or https:// URL", Format: "http-url"},
		Meaning: "the queue; a name ending in `.fifo` is a FIFO queue: group id per topic, deduplication id from the stamp and the message"},
	{Key: "region", To: verbatim(func(s *SQSSenderSettings) *string { return &s.Region }), Kind: String, Rule: Rule{Required: "is required (the queue's AWS region)"}, Meaning: "the queue's AWS region"},
	{Key: "endpoint", To: verbatim(func(s *SQSSenderSettings) *string { return &s.Endpoint }), Kind: String, DefaultDoc: "AWS's for the region", Rule: Rule{Format: "http-url"},
		Meaning: "another SQS endpoint (a VPC endpoint, a compatible implementation)"},
	{Key: "access_key_id", To: verbatim(func(s *SQSSenderSettings) *string { return &s.AccessKeyID }), Kind: String, DefaultDoc: "the SDK's default chain",
		Meaning: "static credentials, with `secret_access_key_*`; without, the environment, shared files, web identity or the instance's role"},
	{Key: "secret_access_key_file", Kind: String, Meaning: "file holding the secret access key (not with `secret_access_key_env`)"},
	{Key: "secret_access_key_env", Kind: String, Meaning: "environment variable holding the secret access key (not with `secret_access_key_file`)"},
	{Key: "body_encoding", To: to(func(s *SQSSenderSettings) *string { return &s.BodyEncoding }), Kind: String, Default: "text", Rule: Rule{OneOf: []string{"text", "base64"}},
		Meaning: "`text` sends the payload as the body and dead-letters a payload SQS cannot carry (not UTF-8, control characters); `base64` carries any payload, marked `mqtt_payload_encoding: base64`"},
	timeoutRow(Rule{}, func(s *SQSSenderSettings) *time.Duration { return &s.Timeout }),
}}

var routeTable = Table{Name: "routes[]", Rows: slices.Concat([]Row{
	{Key: "id", To: verbatim(func(r *routeIn) *string { return &r.ID }), Kind: String, Rule: Rule{Required: "is required", Format: "id"}, Meaning: "route name"},
	{Key: "receiver", To: verbatim(func(r *routeIn) *string { return &r.Receiver }), Kind: String, Rule: Rule{Required: "is required"}, Meaning: "where messages come from"},
	{Key: "senders", To: verbatim(func(r *routeIn) *[]string { return &r.Senders }), Kind: Strings, Rule: Rule{Required: "at least one sender is required"}, Meaning: "where they go; a message is acknowledged when every sender accepted it"},
	{Key: "rewrite.strip_prefix", To: verbatim(func(r *routeIn) *string { return &r.StripPrefix }), Kind: String, Meaning: "removed from the start of the topic"},
	{Key: "rewrite.add_prefix", To: verbatim(func(r *routeIn) *string { return &r.AddPrefix }), Kind: String, Rule: Rule{Format: "topic-prefix"}, Meaning: "put before the topic (after strip_prefix)"},
	{Key: "mappings", Kind: Objects, Table: &mappingTable,
		Meaning: "instead of `rewrite`, like mosquitto's bridge `topic` lines: the route takes only messages on `source_prefix` + a topic matching `pattern`, and the first mapping that matches delivers them as `destination_prefix` + that topic (see \"MQTT features\")"},
	{Key: "retain", To: to(func(r *routeIn) *string { return &r.Retain }), Kind: String, Default: "keep", Rule: Rule{OneOf: []string{"keep", "clear", "drop"}},
		Meaning: "messages with the retain flag: `keep` forwards them retained, `clear` forwards them without the flag (the destination stores nothing), `drop` acknowledges them without forwarding (see \"MQTT features\")"},
	{Key: "loop_peer", To: verbatim(func(r *routeIn) *string { return &r.LoopPeer }), Kind: String,
		Meaning: "the route of the opposite direction between the same two brokers; the two must name each other and deliver only to MQTT 5 `mqtt` senders; each stamps what it publishes and drops what its peer published, so that the pair does not echo (see \"MQTT features\")"},
	{Key: "max_in_flight", To: to(func(r *routeIn) *int { return &r.MaxInFlight }), Kind: Int, Default: strconv.Itoa(DefaultMaxInFlight), Rule: Rule{Min: "1", Max: strconv.Itoa(1 << 20)},
		Meaning: "messages the route holds; a full route stops intake (backpressure)"},
	{Key: "spool", Kind: Object, Table: &spoolTable, DefaultDoc: "none",
		Meaning: "a durable spool, on local disk or (clustered exclusive sessions) in the PostgreSQL lease store: the source is acknowledged once the spool holds a message, and the route delivers from it in order, see `spool:` and \"Durable spool\""},
}, leaseKeyRows(func(r *routeIn) *failover.SessionPolicy { return &r.policy }, func(r *routeIn) *bool { return &r.connectAfterLease }, false), []Row{
	{Key: "peak_message_rate", To: to(func(r *routeIn) *float64 { return &r.PeakMessageRate }), ExclusiveOnly: true, Kind: Number, DefaultDoc: "not declared", Rule: Rule{Min: "0", Says: "must be a positive number of messages per second, or omitted"},
		Meaning: "exclusive sessions only: the route's peak message rate (msg/s); admission refuses a broker queue smaller than rate × worst-case budget (see \"Queue room\")"},
})}

var spoolTable = Table{Name: "spool", Rows: []Row{
	{Key: "backend", To: to(func(s *SpoolSettings) *string { return &s.Backend }), Kind: String, Default: SpoolFile, Rule: Rule{OneOf: []string{SpoolFile, SpoolPostgres}},
		Meaning: "`file`: segment files in `dir` on this host (a non-exclusive session, or an exclusive one with the sqlite lease store); `postgres`: the table `myriarch_bridge_outbox` in the lease store's database (`stores.lease.dsn`), for an exclusive session whose lease store is `postgres`, every write fenced by the session's lease version so that the successor on another host continues from it"},
	{Key: "dir", To: verbatim(func(s *SpoolSettings) *string { return &s.Dir }), Kind: String, DefaultDoc: "`<state_dir>/<bridge id>-<route id>.spool`",
		Meaning: "`file` only: the spool's directory (segment files, the `acked` checkpoint, a `LOCK` file); one route's, on a local file system"},
	{Key: "max_bytes", To: to(func(s *SpoolSettings) *int { return &s.MaxBytes }), Kind: Int, Default: strconv.Itoa(DefaultSpoolMaxBytes), Rule: Rule{Min: "0", Says: "must be 0 (no bound) or a positive number of bytes"},
		Meaning: "the most the spool holds, in bytes of records (a record is the message plus about 30 bytes; 48 with `postgres`); 0 is no bound"},
	{Key: "max_messages", To: to(func(s *SpoolSettings) *int { return &s.MaxMessages }), Kind: Int, Default: "0", Rule: Rule{Min: "0", Says: "must be 0 (no bound) or a positive number of messages"},
		Meaning: "the most messages the spool holds; 0 is no bound (one of the two bounds must be set)"},
	{Key: "full", To: to(func(s *SpoolSettings) *string { return &s.Full }), Kind: String, Default: "block", Rule: Rule{OneOf: []string{"block", "dead_letter"}},
		Meaning: "a full spool: `block` stops taking messages from the source (which then queues them, within its own limit), `dead_letter` writes the message to the dead-letter file (reason `spool full`) and acknowledges it"},
	{Key: "fsync", To: to(func(s *SpoolSettings) *string { return &s.Fsync }), Kind: String, Default: "interval", Rule: Rule{OneOf: []string{"always", "interval", "never"}},
		Meaning: "`file` only (the `postgres` backend acknowledges the source after the INSERT committed, with `synchronous_commit` on, one INSERT for the messages that arrived during the previous one): `always`: each message is synced to disk before the source is acknowledged, one fsync for the messages written during the previous one; `interval`: synced every `fsync_interval` (a power loss may lose that much, a process crash nothing); `never`: left to the kernel"},
	{Key: "fsync_interval", To: to(func(s *SpoolSettings) *time.Duration { return &s.FsyncInterval }), Kind: Duration, Default: "200ms", Rule: Rule{Positive: true, Max: "1m"},
		Meaning: "`file` only: the sync cadence of `fsync: interval`, and for every policy the cadence of the acknowledgment checkpoint (what a restart delivers again)"},
	{Key: "segment_bytes", To: to(func(s *SpoolSettings) *int { return &s.SegmentBytes }), Kind: Int, Default: strconv.Itoa(DefaultSpoolSegmentBytes), Rule: Rule{Min: "4096", Max: strconv.Itoa(1 << 30)},
		Meaning: "`file` only: the size of one segment file; a segment is deleted once every message in it was delivered or dead-lettered"},
}}

var mappingTable = Table{Name: "mappings[]", Rows: []Row{
	{Key: "pattern", Kind: String, Rule: Rule{Required: "is required"}, Meaning: "topic filter below `source_prefix`"},
	{Key: "source_prefix", Kind: String, Rule: Rule{Format: "topic-prefix"}, Meaning: "the prefix of the source topics"},
	{Key: "destination_prefix", Kind: String, Rule: Rule{Format: "topic-prefix"}, Meaning: "replaces `source_prefix` on delivery"},
}}

var opampTable = Table{Name: "opamp", Rows: []Row{
	{Key: "server_url", To: verbatim(func(s *OpAMPSettings) *string { return &s.ServerURL }), Kind: String, Rule: Rule{Required: "is required"}, Meaning: "myriarchd's OpAMP endpoint: `ws://`, `wss://`, `http://` or `https://`, without credentials"},
	{Key: "enrollment_secret_file", Kind: String, Meaning: "file holding the enrollment secret (or `enrollment_secret_env`; one is required)"},
	{Key: "enrollment_secret_env", Kind: String, Meaning: "environment variable holding the enrollment secret"},
	{Key: "tls", Kind: Object, Table: &tlsTable, DefaultDoc: "none", Meaning: "for `wss://` and `https://`, see `tls:`"},
	{Key: "heartbeat_interval", To: to(func(s *OpAMPSettings) *time.Duration { return &s.HeartbeatInterval }), Kind: Duration, DefaultDoc: "opamp-go's 30s", Rule: Rule{Positive: true, Min: "1s", Says: "must be at least 1s"}, Meaning: "how often the agent reports when nothing changed"},
}}

// leaseKeyRows declares the keys of an exclusive session's lease policy
// once, for the two objects that take them (raw LeaseKeys): a session,
// whose routes inherit them, and a route, whose own value overrides the
// session's. D is the object's destination, pol its policy and cal its
// connect_after_lease.
func leaseKeyRows[D any](pol func(*D) *failover.SessionPolicy, cal func(*D) *bool, session bool) []Row {
	lease := func(field func(*failover.LeaseConfig) *time.Duration) *dest {
		return to(func(d *D) *time.Duration { return field(&pol(d).Lease) })
	}
	def := func(doc string) string {
		if session {
			return doc
		}
		return "the session's, else " + doc
	}
	return []Row{
		{Key: "lease_ttl", To: lease(func(l *failover.LeaseConfig) *time.Duration { return &l.LeaseTTL }), ExclusiveOnly: true, Kind: Duration, DefaultDoc: def("baseline of `deployment_mode`"),
			Meaning: "exclusive sessions only: the lease's time to live (see `docs/failover-budget.md`)"},
		{Key: "renew_interval", To: lease(func(l *failover.LeaseConfig) *time.Duration { return &l.RenewInterval }), ExclusiveOnly: true, Kind: Duration, DefaultDoc: def("derived"), Meaning: "exclusive sessions only: the lease cadence"},
		{Key: "lease_renew_jitter", To: lease(func(l *failover.LeaseConfig) *time.Duration { return &l.LeaseRenewJitter }), ExclusiveOnly: true, Kind: Duration, DefaultDoc: def("derived"), Meaning: "exclusive sessions only: the lease cadence"},
		{Key: "renew_call_timeout", To: lease(func(l *failover.LeaseConfig) *time.Duration { return &l.RenewCallTimeout }), ExclusiveOnly: true, Kind: Duration, DefaultDoc: def("derived"), Meaning: "exclusive sessions only: the lease cadence"},
		{Key: "acquire_poll_interval", To: lease(func(l *failover.LeaseConfig) *time.Duration { return &l.AcquirePollInterval }), ExclusiveOnly: true, Kind: Duration, DefaultDoc: def("derived"), Meaning: "exclusive sessions only: the standby's poll"},
		{Key: "max_renew_fails", To: to(func(d *D) *int { return &pol(d).Lease.MaxRenewFails }), ExclusiveOnly: true, Kind: Int, DefaultDoc: def("baseline of `deployment_mode`"), Rule: Rule{Min: "0"}, Meaning: "exclusive sessions only: the lease cadence"},
		{Key: "step_down_grace", To: lease(func(l *failover.LeaseConfig) *time.Duration { return &l.StepDownGrace }), ExclusiveOnly: true, Kind: Duration, DefaultDoc: def("baseline of `deployment_mode`"), Meaning: "exclusive sessions only: below `lease_ttl`"},
		{Key: "connect_after_lease", To: to(cal), ExclusiveOnly: true, Kind: Bool, Default: "true", DefaultDoc: def("`true`"), Meaning: "exclusive sessions only: the session connects only while it holds the lease; `false` is refused"},
		{Key: "failover_slo", To: to(func(d *D) *time.Duration { return &pol(d).FailoverSLO }), ExclusiveOnly: true, Kind: Duration, DefaultDoc: def("none"), Rule: Rule{Positive: true}, Meaning: "exclusive sessions only: the objective both failover budgets must fit"},
		{Key: "broker_health_step_down", ExclusiveOnly: true, Kind: String, DefaultDoc: def("omitted"), Rule: Rule{Says: `must be "off" or a positive duration`},
			Meaning: "exclusive sessions only: `off`, or how long an owner's broker path may stay lost before it releases the lease; must be answered when `failover_slo` is declared"},
		{Key: "startup_allowance", To: to(func(d *D) *time.Duration { return &pol(d).StartupAllowance }), ExclusiveOnly: true, Kind: Duration, Default: "0s", DefaultDoc: def("`0s`"), Meaning: "exclusive sessions only: added to both budgets, within [0s, 10m]"},
	}
}
