package config

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/bridge/activation"
	"github.com/myriarch/myriarch/internal/godur"
)

type validator struct {
	file     string
	lines    map[string]int
	problems Problems
}

func (v *validator) line(path string) int {
	for p := path; p != ""; {
		if l, ok := v.lines[p]; ok {
			return l
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return 0
}

func (v *validator) add(path string, value any, rule string, args ...any) {
	val := ""
	switch x := value.(type) {
	case nil:
	case string:
		val = strconv.Quote(x)
	default:
		val = fmt.Sprint(x)
	}
	v.problems = append(v.problems, Problem{File: v.file, Line: v.line(path), Path: path, Value: val, Rule: fmt.Sprintf(rule, args...)})
}

// duration parses an optional non-negative Go duration; "" yields def.
func (v *validator) duration(path, s string, def time.Duration) time.Duration {
	if strings.TrimSpace(s) == "" {
		return def
	}
	d, err := godur.Parse(s)
	if err != nil {
		v.add(path, s, godur.Rule)
		return def
	}
	if d < 0 {
		v.add(path, s, "must not be negative")
		return def
	}
	return d
}

func (v *validator) positive(path, s string, def time.Duration) time.Duration {
	d := v.duration(path, s, def)
	if strings.TrimSpace(s) != "" && d == 0 {
		v.add(path, s, "must be a positive duration")
		return def
	}
	return d
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

func (v *validator) id(path, id string, seen map[string]string) {
	switch {
	case id == "":
		v.add(path, nil, "is required")
	case !idPattern.MatchString(id):
		v.add(path, id, "must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
	case seen[id] != "":
		v.add(path, id, "is already used by %s", seen[id])
	default:
		seen[id] = strings.TrimSuffix(path, ".id")
	}
}

func (v *validator) secret(path, file, env string) Secret {
	switch {
	case file != "" && env != "":
		v.add(path+"_file", file, "set either %s_file or %s_env, not both", filepath.Base(path), filepath.Base(path))
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			v.add(path+"_file", file, "cannot be read: %v", errors.Unwrap(err))
			return ""
		}
		return Secret(strings.TrimRight(string(b), "\r\n"))
	case env != "":
		s, ok := os.LookupEnv(env)
		if !ok {
			v.add(path+"_env", env, "names an environment variable that is not set")
		}
		return Secret(s)
	}
	return ""
}

func (v *validator) tls(path string, t *TLS) *TLSSettings {
	if t == nil {
		return nil
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		v.add(path, nil, "cert_file and key_file must be set together")
	}
	for _, f := range []struct{ k, p string }{{"ca_file", t.CAFile}, {"cert_file", t.CertFile}, {"key_file", t.KeyFile}} {
		if f.p == "" {
			continue
		}
		if _, err := os.Stat(f.p); err != nil {
			v.add(path+"."+f.k, f.p, "cannot be read: %v", errors.Unwrap(err))
		}
	}
	return &TLSSettings{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
}

func (v *validator) brokerURL(path, s string) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		v.add(path, s, "must be a URL such as tcp://host:1883, ssl://host:8883 or mqtts://host:8883")
		return
	}
	switch u.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts":
	default:
		v.add(path, s, "scheme must be tcp, mqtt, ssl, tls or mqtts")
		return
	}
	if u.Port() == "" {
		v.add(path, s, "must name a port")
	}
}

func (v *validator) validate(f *File) *Config {
	cfg := &Config{File: v.file}
	v.bridge(f, cfg)
	v.store(f, cfg)
	v.sessions(f, cfg)
	v.receivers(f, cfg)
	v.senders(f, cfg)
	v.routes(f, cfg)
	v.admit(cfg)
	return cfg
}

func (v *validator) bridge(f *File, cfg *Config) {
	b := f.Bridge
	s := &cfg.Bridge
	s.ID = b.ID
	if b.ID == "" {
		v.add("bridge.id", nil, "is required: it names this bridge in logs, metrics and lease keys")
	} else if !idPattern.MatchString(b.ID) {
		v.add("bridge.id", b.ID, "must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	s.InstanceID = b.InstanceID
	s.InstanceIDSet = b.InstanceID != ""
	if b.InstanceID != "" && !idPattern.MatchString(b.InstanceID) {
		v.add("bridge.instance_id", b.InstanceID, "must be 1-128 letters, digits, '.', '_' or '-'")
	}
	mode, err := failover.ParseDeploymentMode(b.DeploymentMode)
	if err != nil {
		v.add("bridge.deployment_mode", b.DeploymentMode, "must be standalone or clustered")
	}
	s.DeploymentMode = mode
	s.ShutdownTimeout = v.positive("bridge.shutdown_timeout", b.ShutdownTimeout, DefaultShutdownTimeout)
	s.HTTPListen = b.HTTP.Listen
	if s.HTTPListen == "" {
		s.HTTPListen = DefaultHTTPListen
	} else if s.HTTPListen != "off" {
		if _, _, err := splitHostPort(s.HTTPListen); err != nil {
			v.add("bridge.http.listen", s.HTTPListen, `must be host:port, :port or "off"`)
		}
	}
	s.StateDir = b.StateDir
	if s.StateDir == "" {
		s.StateDir = filepath.Dir(v.file)
	}
	s.DeadLetterPath = b.DeadLetter.Path
	if s.DeadLetterPath == "" {
		s.DeadLetterPath = filepath.Join(filepath.Dir(v.file), DefaultDeadLetterPath)
	}
}

func splitHostPort(s string) (string, int, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return "", 0, errors.New("no port")
	}
	p, err := strconv.Atoi(s[i+1:])
	if err != nil || p < 0 || p > 65535 {
		return "", 0, errors.New("bad port")
	}
	return s[:i], p, nil
}

func (v *validator) store(f *File, cfg *Config) {
	l := f.Stores.Lease
	s := &cfg.LeaseStore
	s.Type = l.Type
	if s.Type == "" {
		s.Type = leaseStoreSQLite
	}
	s.Prefix = l.Prefix
	switch s.Type {
	case leaseStoreSQLite:
		s.Path = l.Path
		if s.Path == "" {
			s.Path = filepath.Join(filepath.Dir(v.file), DefaultLeaseStorePath)
		}
		if l.DSN != "" || l.DSNFile != "" || len(l.Endpoints) > 0 {
			v.add("stores.lease", nil, "type sqlite takes only path")
		}
	case leaseStorePostgres:
		if l.DSN != "" && l.DSNFile != "" {
			v.add("stores.lease.dsn", nil, "set either dsn or dsn_file, not both")
		}
		s.DSN = Secret(l.DSN)
		if l.DSNFile != "" {
			s.DSN = v.secret("stores.lease.dsn", l.DSNFile, "")
		}
		if s.DSN == "" && l.DSNFile == "" {
			v.add("stores.lease.dsn", nil, "is required for type postgres (or dsn_file)")
		}
	case leaseStoreEtcd:
		s.Endpoints = l.Endpoints
		if len(s.Endpoints) == 0 {
			v.add("stores.lease.endpoints", nil, "at least one endpoint is required for type etcd")
		}
	default:
		v.add("stores.lease.type", l.Type, "must be sqlite, postgres or etcd")
	}
}

func (v *validator) sessions(f *File, cfg *Config) {
	seen := map[string]string{}
	for i, r := range f.Sessions {
		p := fmt.Sprintf("sessions[%d]", i)
		v.id(p+".id", r.ID, seen)
		s := SessionSettings{ID: r.ID, Mode: r.SessionMode, Brokers: r.Brokers, ClientID: r.ClientID}
		if r.Transport != "" && r.Transport != "mqtt" {
			v.add(p+".transport", r.Transport, "must be mqtt")
		}
		s.ProtocolVersion = v.protocolVersion(p+".protocol_version", r.ProtocolVersion)
		v311 := s.ProtocolVersion == MQTT311
		switch s.Mode {
		case "":
			s.Mode = Ephemeral
		case Ephemeral, Persistent, Exclusive:
		default:
			v.add(p+".session_mode", r.SessionMode, "must be ephemeral, persistent or exclusive")
		}
		if len(r.Brokers) == 0 {
			v.add(p+".brokers", nil, "at least one broker URL is required")
		}
		for j, b := range r.Brokers {
			v.brokerURL(fmt.Sprintf("%s.brokers[%d]", p, j), b)
		}
		switch r.ClientIDSuffix {
		case "":
		case "instance":
			s.ClientIDInstance = true
			if s.Mode == Exclusive {
				v.add(p+".client_id_suffix", r.ClientIDSuffix, "is refused for an exclusive session: every instance must use the same client_id so that the successor resumes the broker session")
			}
		default:
			v.add(p+".client_id_suffix", r.ClientIDSuffix, `must be "instance" or omitted`)
		}
		if s.ClientID == "" {
			if s.Mode == Exclusive {
				v.add(p+".client_id", nil, "is required for an exclusive session: the same client_id on every instance lets the successor resume the broker session")
			} else {
				s.ClientID = f.Bridge.ID + "-" + r.ID
			}
		}
		if len(s.ClientID) > 23*8 {
			v.add(p+".client_id", s.ClientID, "is longer than 184 bytes")
		}
		if cfg.Bridge.DeploymentMode == failover.Clustered && s.Mode != Exclusive && !s.ClientIDInstance {
			v.add(p+".client_id_suffix", r.ClientIDSuffix, `must be "instance" for a %s session in clustered mode, or instances would take the client_id from each other`, s.Mode)
		}
		s.CleanStart = s.Mode == Ephemeral
		if r.CleanStart != nil {
			s.CleanStart = *r.CleanStart
			if s.CleanStart && s.Mode != Ephemeral {
				v.add(p+".clean_start", "true", "must be false for a %s session: clean_start discards the broker session that it exists to resume", s.Mode)
			}
		}
		def := DefaultSessionExpiry
		if s.Mode == Ephemeral {
			def = 0
		}
		if v311 && r.SessionExpiryInterval != "" {
			v.add(p+".session_expiry_interval", r.SessionExpiryInterval, "does not apply to protocol_version 3.1.1: MQTT 3.1.1 has no session expiry interval; the broker keeps a persistent session as its own settings say (mosquitto: persistent_client_expiration)")
			r.SessionExpiryInterval = ""
		}
		s.SessionExpiryInterval = v.duration(p+".session_expiry_interval", r.SessionExpiryInterval, def)
		if s.SessionExpiryInterval > maxSessionExpiry {
			v.add(p+".session_expiry_interval", r.SessionExpiryInterval, "must be at most %v", maxSessionExpiry)
		}
		if s.SessionExpiryInterval%time.Second != 0 {
			v.add(p+".session_expiry_interval", r.SessionExpiryInterval, "must be whole seconds (MQTT carries seconds)")
		}
		if s.Mode != Ephemeral && s.SessionExpiryInterval == 0 {
			v.add(p+".session_expiry_interval", r.SessionExpiryInterval, "must be positive for a %s session, or the broker drops the session on disconnect", s.Mode)
		}
		s.KeepAlive = v.duration(p+".keep_alive", r.KeepAlive, DefaultKeepAlive)
		if s.KeepAlive != 0 && (s.KeepAlive < minKeepAlive || s.KeepAlive > maxKeepAlive || s.KeepAlive%time.Second != 0) {
			v.add(p+".keep_alive", r.KeepAlive, "must be whole seconds between 1s and 65535s, or 0s to disable")
		}
		s.Username = r.Username
		s.Password = v.secret(p+".password", r.PasswordFile, r.PasswordEnv)
		s.TLS = v.tls(p+".tls", r.TLS)
		s.ConnectTimeout = v.positive(p+".connect_timeout", r.ConnectTimeout, activation.DefaultMQTTConnectTimeout)
		s.ReconcileTimeout = v.positive(p+".reconcile_timeout", r.ReconcileTimeout, activation.DefaultMQTTReconcileTimeout)
		s.UnmatchedGrace = v.positive(p+".unmatched_grace", r.UnmatchedGrace, activation.DefaultMQTTUnmatchedGrace)
		if act, err := activation.MQTT(s.ConnectTimeout, s.ReconcileTimeout, s.UnmatchedGrace); err != nil {
			v.failover(p, err)
		} else {
			s.Activation = act
		}
		if v311 && r.ReceiveMaximum != 0 {
			v.add(p+".receive_maximum", r.ReceiveMaximum, "does not apply to protocol_version 3.1.1: MQTT 3.1.1 has no receive maximum; the broker's own in-flight limit applies (mosquitto: max_inflight_messages)")
			r.ReceiveMaximum = 0
		}
		s.ReceiveMaximum = r.ReceiveMaximum
		if s.ReceiveMaximum == 0 {
			s.ReceiveMaximum = DefaultReceiveMaximum
		}
		if s.ReceiveMaximum < 1 || s.ReceiveMaximum > maxReceiveMaximum {
			v.add(p+".receive_maximum", r.ReceiveMaximum, "must be within [1, 65535]")
		}
		s.BrokerMaxQueuedMessages = -1
		if q := r.BrokerMaxQueuedMessages; q != nil {
			s.BrokerMaxQueuedMessages = *q
			if *q < 0 {
				v.add(p+".broker_max_queued_messages", *q, "must be 0 (the broker queues without limit) or a positive number of messages")
				s.BrokerMaxQueuedMessages = -1
			}
		}
		s.ConnectAfterLease = true
		cfg.Sessions = append(cfg.Sessions, s)
	}
	if len(f.Sessions) == 0 {
		v.add("sessions", nil, "at least one session is required")
	}
}

// protocolVersion parses a protocol_version: 5 (default) or 3.1.1.
func (v *validator) protocolVersion(path, s string) string {
	switch strings.TrimSpace(s) {
	case "", MQTT5:
		return MQTT5
	case MQTT311:
		return MQTT311
	}
	v.add(path, s, "must be 5 or 3.1.1 (the MQTT version to speak to the broker)")
	return MQTT5
}

// failover reports the errors of the failover package under prefix.
func (v *validator) failover(prefix string, err error) {
	for _, e := range failover.Errs(err) {
		var fe *failover.FieldError
		if errors.As(e, &fe) {
			path := prefix + "." + fe.Field
			v.problems = append(v.problems, Problem{File: v.file, Line: v.line(path), Path: path, Value: fe.Value, Rule: fe.Rule})
			continue
		}
		v.problems = append(v.problems, Problem{File: v.file, Line: v.line(prefix), Path: prefix, Rule: e.Error()})
	}
}

// validFilter checks an MQTT topic filter, including $share/group/filter.
func validFilter(f string) string {
	if f == "" {
		return "must not be empty"
	}
	if rest, ok := strings.CutPrefix(f, "$share/"); ok {
		group, filter, ok := strings.Cut(rest, "/")
		if !ok || group == "" || strings.ContainsAny(group, "+#") || filter == "" {
			return "a shared subscription must be $share/<group>/<filter>"
		}
		f = filter
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if strings.Contains(l, "#") && (l != "#" || i != len(levels)-1) {
			return "'#' must be a whole level and the last one"
		}
		if strings.Contains(l, "+") && l != "+" {
			return "'+' must be a whole level"
		}
	}
	return ""
}

func (v *validator) receivers(f *File, cfg *Config) {
	seen := map[string]string{}
	for i, r := range f.Receivers {
		p := fmt.Sprintf("receivers[%d]", i)
		v.id(p+".id", r.ID, seen)
		rs := ReceiverSettings{ID: r.ID, Session: r.Session}
		sess := cfg.Session(r.Session)
		if r.Session == "" {
			v.add(p+".session", nil, "is required")
		} else if sess == nil {
			v.add(p+".session", r.Session, "names no session")
		}
		if len(r.Topics) == 0 {
			v.add(p+".topics", nil, "at least one topic filter is required")
		}
		for j, t := range r.Topics {
			tp := fmt.Sprintf("%s.topics[%d]", p, j)
			if rule := validFilter(t.Filter); rule != "" {
				v.add(tp+".filter", t.Filter, "%s", rule)
			}
			qos := 1
			if t.QoS != nil {
				qos = *t.QoS
			}
			if qos < 0 || qos > 2 {
				v.add(tp+".qos", qos, "must be 0, 1 or 2")
			}
			if sess != nil && cfg.Bridge.DeploymentMode == failover.Clustered && sess.Mode != Exclusive && !strings.HasPrefix(t.Filter, "$share/") {
				v.add(tp+".filter", t.Filter, "in clustered mode a receiver needs a $share/<group>/ filter or an exclusive session, or every instance receives every message")
			}
			rs.Topics = append(rs.Topics, TopicSettings{Filter: t.Filter, QoS: byte(max(0, min(2, qos)))})
		}
		cfg.Receivers = append(cfg.Receivers, rs)
	}
	if len(f.Receivers) == 0 {
		v.add("receivers", nil, "at least one receiver is required")
	}
}

func (v *validator) senders(f *File, cfg *Config) {
	seen := map[string]string{}
	for i, r := range f.Senders {
		p := fmt.Sprintf("senders[%d]", i)
		v.id(p+".id", r.ID, seen)
		s := SenderSettings{ID: r.ID, Type: r.Type}
		s.MaxAttempts = r.Retry.MaxAttempts
		if s.MaxAttempts == 0 {
			s.MaxAttempts = DefaultRetryAttempts
		}
		if s.MaxAttempts < 1 {
			v.add(p+".retry.max_attempts", r.Retry.MaxAttempts, "must be at least 1")
		}
		s.InitialBackoff = v.positive(p+".retry.initial_backoff", r.Retry.InitialBackoff, DefaultInitialBackoff)
		s.MaxBackoff = v.positive(p+".retry.max_backoff", r.Retry.MaxBackoff, DefaultMaxBackoff)
		if s.MaxBackoff < s.InitialBackoff {
			v.add(p+".retry.max_backoff", r.Retry.MaxBackoff, "must not be below initial_backoff (%v)", s.InitialBackoff)
		}
		blocks := map[string]bool{senderMQTT: r.MQTT != nil, senderHTTP: r.HTTP != nil, senderNATS: r.NATS != nil, senderKafka: r.Kafka != nil, senderFile: r.File != nil}
		if _, ok := blocks[r.Type]; !ok {
			v.add(p+".type", r.Type, "must be mqtt, http, nats, kafka or file")
		} else if !blocks[r.Type] {
			v.add(p+"."+r.Type, nil, "is required for a sender of type %s", r.Type)
		}
		for k, set := range blocks {
			if set && k != r.Type {
				v.add(p+"."+k, nil, "does not apply to a sender of type %q", r.Type)
			}
		}
		switch {
		case r.Type == senderMQTT && r.MQTT != nil:
			m := r.MQTT
			s.Broker = m.Broker
			if m.Broker == "" {
				v.add(p+".mqtt.broker", nil, "is required")
			} else {
				v.brokerURL(p+".mqtt.broker", m.Broker)
			}
			s.ClientID = m.ClientID
			if s.ClientID == "" {
				s.ClientID = f.Bridge.ID + "-" + r.ID
			}
			s.Username = m.Username
			s.Password = v.secret(p+".mqtt.password", m.PasswordFile, m.PasswordEnv)
			s.TLS = v.tls(p+".mqtt.tls", m.TLS)
			qos := 1
			if m.QoS != nil {
				qos = *m.QoS
			}
			if qos < 0 || qos > 2 {
				v.add(p+".mqtt.qos", qos, "must be 0, 1 or 2")
			}
			s.QoS = byte(max(0, min(2, qos)))
			s.KeepAlive = v.duration(p+".mqtt.keep_alive", m.KeepAlive, DefaultKeepAlive)
			s.ConnectTimeout = v.positive(p+".mqtt.connect_timeout", m.ConnectTimeout, activation.DefaultMQTTConnectTimeout)
			s.Timeout = v.positive(p+".mqtt.timeout", m.Timeout, DefaultSenderTimeout)
			s.ProtocolVersion = v.protocolVersion(p+".mqtt.protocol_version", m.ProtocolVersion)
		case r.Type == senderHTTP && r.HTTP != nil:
			h := r.HTTP
			s.URL = h.URL
			if u, err := url.Parse(h.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				v.add(p+".http.url", h.URL, "must be an http:// or https:// URL")
			}
			s.Headers = h.Headers
			s.Timeout = v.positive(p+".http.timeout", h.Timeout, DefaultSenderTimeout)
		case r.Type == senderNATS && r.NATS != nil:
			n := r.NATS
			s.URL = n.URL
			if u, err := url.Parse(n.URL); err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "" {
				v.add(p+".nats.url", n.URL, "must be a nats:// or tls:// URL")
			}
			s.SubjectPrefix = n.SubjectPrefix
			s.Timeout = v.positive(p+".nats.timeout", n.Timeout, DefaultSenderTimeout)
		case r.Type == senderKafka && r.Kafka != nil:
			k := r.Kafka
			s.KafkaBrokers = k.Brokers
			if len(k.Brokers) == 0 {
				v.add(p+".kafka.brokers", nil, "at least one host:port is required")
			}
			s.KafkaTopic = k.Topic
			if k.Topic == "" {
				v.add(p+".kafka.topic", nil, "is required")
			}
			s.Timeout = v.positive(p+".kafka.timeout", k.Timeout, DefaultSenderTimeout)
			if s.Timeout > 0 && s.Timeout < time.Second {
				// franz-go refuses a record delivery timeout below 1s.
				v.add(p+".kafka.timeout", k.Timeout, "must be at least 1s (the Kafka client's minimum record delivery timeout)")
			}
		case r.Type == senderFile && r.File != nil:
			s.Path = r.File.Path
			if s.Path == "" {
				v.add(p+".file.path", nil, "is required")
			}
		}
		cfg.Senders = append(cfg.Senders, s)
	}
	if len(f.Senders) == 0 {
		v.add("senders", nil, "at least one sender is required")
	}
}

func (v *validator) routes(f *File, cfg *Config) {
	seen := map[string]string{}
	connectAfter := map[string]*bool{}
	connectAfterSrc := map[string]string{}
	for i, r := range f.Routes {
		p := fmt.Sprintf("routes[%d]", i)
		v.id(p+".id", r.ID, seen)
		rs := RouteSettings{ID: r.ID, Receiver: r.Receiver, Senders: r.Senders, MaxInFlight: r.MaxInFlight, PeakMessageRate: r.PeakMessageRate, LoopPeer: r.LoopPeer}
		if r.PeakMessageRate < 0 || math.IsNaN(r.PeakMessageRate) || math.IsInf(r.PeakMessageRate, 0) {
			v.add(p+".peak_message_rate", r.PeakMessageRate, "must be a positive number of messages per second, or omitted")
			rs.PeakMessageRate = 0
		}
		recv := cfg.Receiver(r.Receiver)
		if r.Receiver == "" {
			v.add(p+".receiver", nil, "is required")
		} else if recv == nil {
			v.add(p+".receiver", r.Receiver, "names no receiver")
		}
		if len(r.Senders) == 0 {
			v.add(p+".senders", nil, "at least one sender is required")
		}
		for j, s := range r.Senders {
			if cfg.Sender(s) == nil {
				v.add(fmt.Sprintf("%s.senders[%d]", p, j), s, "names no sender")
			}
			if slices.Index(r.Senders, s) != j {
				v.add(fmt.Sprintf("%s.senders[%d]", p, j), s, "is listed twice")
			}
		}
		if rs.MaxInFlight == 0 {
			rs.MaxInFlight = DefaultMaxInFlight
		}
		if rs.MaxInFlight < 1 || rs.MaxInFlight > 1<<20 {
			v.add(p+".max_in_flight", r.MaxInFlight, "must be within [1, 1048576]")
		}
		if len(r.Mappings) > 0 && r.Rewrite != nil {
			v.add(p+".mappings", nil, "and rewrite exclude each other: put the prefixes in the mappings")
		}
		for j, m := range r.Mappings {
			mp := fmt.Sprintf("%s.mappings[%d]", p, j)
			if m.Pattern == "" {
				v.add(mp+".pattern", nil, "is required")
			} else if why := validFilter(m.SourcePrefix + m.Pattern); why != "" {
				v.add(mp+".pattern", m.Pattern, "with source_prefix %q: %s", m.SourcePrefix, why)
			}
			if strings.ContainsAny(m.SourcePrefix, "+#") {
				v.add(mp+".source_prefix", m.SourcePrefix, "must not contain MQTT wildcards")
			}
			if strings.ContainsAny(m.DestinationPrefix, "+#") {
				v.add(mp+".destination_prefix", m.DestinationPrefix, "must not contain MQTT wildcards")
			}
		}
		rs.Mappings = r.Mappings
		switch rs.Retain = r.Retain; rs.Retain {
		case "":
			rs.Retain = "keep"
		case "keep", "clear", "drop":
		default:
			v.add(p+".retain", r.Retain, "must be keep, clear or drop")
		}
		if r.Rewrite != nil {
			rs.StripPrefix, rs.AddPrefix = r.Rewrite.StripPrefix, r.Rewrite.AddPrefix
			if strings.ContainsAny(rs.AddPrefix, "+#") {
				v.add(p+".rewrite.add_prefix", rs.AddPrefix, "must not contain MQTT wildcards")
			}
			if rs.StripPrefix == "" && rs.AddPrefix == "" {
				v.add(p+".rewrite", nil, "set strip_prefix, add_prefix or both")
			}
		}
		var sess *SessionSettings
		if recv != nil {
			rs.Session = recv.Session
			sess = cfg.Session(recv.Session)
		}
		leaseKeys := map[string]string{
			"lease_ttl": r.LeaseTTL, "renew_interval": r.RenewInterval, "lease_renew_jitter": r.LeaseRenewJitter,
			"renew_call_timeout": r.RenewCallTimeout, "acquire_poll_interval": r.AcquirePollInterval,
			"step_down_grace": r.StepDownGrace, "failover_slo": r.FailoverSLO,
			"broker_health_step_down": r.BrokerHealthStepDown, "startup_allowance": r.StartupAllowance,
		}
		if sess != nil && sess.Mode != Exclusive {
			keys := slices.Sorted(func(yield func(string) bool) {
				for k, val := range leaseKeys {
					if val != "" && !yield(k) {
						return
					}
				}
			})
			if r.MaxRenewFails != 0 {
				keys = append(keys, "max_renew_fails")
			}
			if r.ConnectAfterLease != nil {
				keys = append(keys, "connect_after_lease")
			}
			if r.PeakMessageRate != 0 {
				keys = append(keys, "peak_message_rate")
				leaseKeys["peak_message_rate"] = strconv.FormatFloat(r.PeakMessageRate, 'g', -1, 64)
			}
			for _, k := range keys {
				v.add(p+"."+k, leaseKeys[k], "applies only to routes on an exclusive session; session %q is %s", sess.ID, sess.Mode)
			}
		}
		if sess != nil && sess.Mode == Exclusive {
			pol := failover.SessionPolicy{
				Lease: failover.LeaseConfig{
					DeploymentMode:      cfg.Bridge.DeploymentMode,
					LeaseTTL:            v.duration(p+".lease_ttl", r.LeaseTTL, 0),
					RenewInterval:       v.duration(p+".renew_interval", r.RenewInterval, 0),
					LeaseRenewJitter:    v.duration(p+".lease_renew_jitter", r.LeaseRenewJitter, 0),
					RenewCallTimeout:    v.duration(p+".renew_call_timeout", r.RenewCallTimeout, 0),
					AcquirePollInterval: v.duration(p+".acquire_poll_interval", r.AcquirePollInterval, 0),
					MaxRenewFails:       r.MaxRenewFails,
					StepDownGrace:       v.duration(p+".step_down_grace", r.StepDownGrace, 0),
				},
				StartupAllowance: v.duration(p+".startup_allowance", r.StartupAllowance, 0),
				FailoverSLO:      v.positive(p+".failover_slo", r.FailoverSLO, 0),
				Activation:       sess.Activation,
			}
			if r.MaxRenewFails < 0 {
				v.add(p+".max_renew_fails", r.MaxRenewFails, "must not be negative")
				pol.Lease.MaxRenewFails = 0
			}
			bh, err := failover.ParseBrokerHealthStepDown(r.BrokerHealthStepDown)
			if err != nil {
				v.failover(p, err)
			}
			pol.BrokerHealthStepDown = bh
			rs.Policy = &pol
			if prev, ok := connectAfter[sess.ID]; ok && !sameBool(prev, r.ConnectAfterLease) {
				v.add(p+".connect_after_lease", boolStr(r.ConnectAfterLease), "disagrees with %s on session %q; routes that share a session must agree", connectAfterSrc[sess.ID], sess.ID)
			} else if !ok {
				connectAfter[sess.ID], connectAfterSrc[sess.ID] = r.ConnectAfterLease, p
			}
			for _, id := range r.Senders {
				if st := cfg.Sender(id); st != nil && st.Type == senderMQTT && st.ProtocolVersion == MQTT311 {
					cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("route %q: sender %q publishes MQTT 3.1.1, which has no user properties: the messages of exclusive session %q reach it without the fencing stamp (%s, %s), so a consumer there cannot tell a deposed owner's late messages from its successor's", r.ID, id, sess.ID, "myriarch-lease-version", "myriarch-session-id"))
				}
			}
			if r.ConnectAfterLease != nil && !*r.ConnectAfterLease {
				v.add(p+".connect_after_lease", "false", "false is not supported: an exclusive session connects only after it holds the lease, so that two instances never consume its broker session at once")
			}
		}
		cfg.Routes = append(cfg.Routes, rs)
	}
	if len(f.Routes) == 0 {
		v.add("routes", nil, "at least one route is required")
	}
	v.loopPeers(f, cfg)
	for i, s := range cfg.Sessions {
		used := slices.ContainsFunc(cfg.Routes, func(rt RouteSettings) bool { return rt.Session == s.ID && s.ID != "" })
		if s.Mode == Exclusive && !used {
			v.add(fmt.Sprintf("sessions[%d].id", i), s.ID, "an exclusive session needs at least one route: its lease policy is the session block of its routes")
		}
	}
	for _, r := range cfg.Receivers {
		used := slices.ContainsFunc(cfg.Routes, func(rt RouteSettings) bool { return rt.Receiver == r.ID })
		if !used && r.ID != "" {
			cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("receiver %q is used by no route; its session still subscribes and its messages are acknowledged undelivered", r.ID))
		}
	}
	if cfg.Bridge.DeploymentMode == failover.Clustered && cfg.LeaseStore.Type == leaseStoreSQLite && slices.ContainsFunc(cfg.Sessions, func(s SessionSettings) bool { return s.Mode == Exclusive }) {
		v.add("stores.lease.type", cfg.LeaseStore.Type, "clustered mode needs a shared lease store (postgres or etcd); sqlite is process-local to one host")
	}
}

// loopPeers checks the loop pairs: a route's loop_peer names another route
// that names it back, and both deliver only to mqtt senders, since the hop
// stamp that breaks the loop travels as an MQTT 5 user property.
func (v *validator) loopPeers(f *File, cfg *Config) {
	for i, r := range f.Routes {
		if r.LoopPeer == "" {
			continue
		}
		p := fmt.Sprintf("routes[%d].loop_peer", i)
		j := slices.IndexFunc(f.Routes, func(o Route) bool { return o.ID == r.LoopPeer })
		switch {
		case r.LoopPeer == r.ID:
			v.add(p, r.LoopPeer, "must name the route of the opposite direction, not the route itself")
			continue
		case j < 0:
			v.add(p, r.LoopPeer, "names no route")
			continue
		case f.Routes[j].LoopPeer != r.ID:
			v.add(p, r.LoopPeer, "route %q must name %q as its loop_peer: a loop pair is two routes that name each other (it has %q)", r.LoopPeer, r.ID, f.Routes[j].LoopPeer)
		}
		for k, s := range r.Senders {
			st := cfg.Sender(s)
			switch {
			case st == nil:
			case st.Type != senderMQTT:
				v.add(fmt.Sprintf("routes[%d].senders[%d]", i, k), s, "is a %s sender; a route with loop_peer needs mqtt senders, which carry the hop stamp (user property %q) that its peer recognises", st.Type, "myriarch-bridge-hop")
			case st.ProtocolVersion == MQTT311:
				v.add(fmt.Sprintf("routes[%d].senders[%d]", i, k), s, "publishes MQTT 3.1.1, which has no user properties; a route with loop_peer needs MQTT 5 senders, which carry the hop stamp (user property %q) that its peer recognises", "myriarch-bridge-hop")
			}
		}
		if rs := cfg.Routes[i]; rs.Session != "" {
			if sess := cfg.Session(rs.Session); sess != nil && sess.ProtocolVersion == MQTT311 {
				v.add(p, r.LoopPeer, "needs an MQTT 5 session: session %q speaks MQTT 3.1.1, which has no user properties, so the route cannot see the hop stamp (user property %q) of its peer's messages", sess.ID, "myriarch-bridge-hop")
			}
		}
	}
}

func sameBool(a, b *bool) bool {
	return (a == nil || *a) == (b == nil || *b)
}

func boolStr(b *bool) string {
	if b == nil {
		return "true"
	}
	return strconv.FormatBool(*b)
}

// admit canonicalizes and admits the exclusive sessions in one pass of
// failover.Preflight: each route's refusals are reported with its paths,
// then the divergences between routes of one session.
func (v *validator) admit(cfg *Config) {
	var inputs []failover.SessionInput
	var routeOf []int // input index → route index
	for i, r := range cfg.Routes {
		if r.Policy == nil {
			continue
		}
		inputs = append(inputs, failover.SessionInput{Source: fmt.Sprintf("routes[%d] %q", i, r.ID), SessionID: r.Session, Policy: *r.Policy})
		routeOf = append(routeOf, i)
	}
	pf := failover.Preflight(inputs)
	results := slices.Clone(pf.Sources)
	slices.SortFunc(results, func(a, b failover.SourceResult) int { return a.Input - b.Input })
	for _, res := range results {
		i := routeOf[res.Input]
		r := cfg.Routes[i]
		p := fmt.Sprintf("routes[%d]", i)
		for _, e := range failover.Errs(res.Assessment.Err) {
			var fe *failover.FieldError
			if errors.As(e, &fe) {
				path := p + "." + fe.Field
				switch fe.Field {
				case "connect_timeout", "reconcile_timeout", "unmatched_grace":
					path = fmt.Sprintf("sessions[%d].%s", slices.IndexFunc(cfg.Sessions, func(s SessionSettings) bool { return s.ID == r.Session }), fe.Field)
				}
				v.problems = append(v.problems, Problem{File: v.file, Line: v.line(path), Path: path, Value: fe.Value, Rule: fe.Rule})
				continue
			}
			v.add(p, nil, "%v", e)
		}
	}
	for _, d := range pf.Divergences {
		v.problems = append(v.problems, Problem{File: v.file, Rule: d.Error()})
	}
	canon := pf.Sessions
	cfg.Admission = pf
	cfg.Exclusive = canon
	for _, c := range canon {
		for _, w := range c.Assessment.Warnings {
			cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("session %q: %s", c.SessionID, w))
		}
		s := cfg.Session(c.SessionID)
		idx := slices.IndexFunc(cfg.Sessions, func(x SessionSettings) bool { return x.ID == c.SessionID })
		// The resumed broker session must outlive the failover, or the
		// queued messages the successor should receive are gone.
		worst := time.Duration(0)
		if b := c.Assessment.OwnerDeath; b != nil {
			worst = b.Total
		}
		if b := c.Assessment.BrokerPath; b != nil {
			worst = max(worst, b.Total)
		}
		if s != nil && s.ProtocolVersion == MQTT311 {
			cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("session %q speaks MQTT 3.1.1, which has no session expiry interval: the broker must keep its persistent session for at least the worst-case failover budget (%v) by its own settings (mosquitto: persistent_client_expiration, unset = forever), or the queued messages are gone before the successor resumes it", c.SessionID, worst))
		} else if s != nil && s.SessionExpiryInterval < worst {
			v.add(fmt.Sprintf("sessions[%d].session_expiry_interval", idx), s.SessionExpiryInterval.String(),
				"must be at least the worst-case failover budget (%v), or the broker discards the queued messages before the successor resumes the session", worst)
		}
		// The queue must hold what arrives while nobody consumes the
		// session, or the broker drops it silently.
		if s != nil {
			perReceiver := map[string]float64{}
			for _, rt := range cfg.Routes {
				if rt.Session == s.ID {
					// Routes that share a receiver see the same messages.
					perReceiver[rt.Receiver] = max(perReceiver[rt.Receiver], rt.PeakMessageRate)
				}
			}
			rate := 0.0
			for _, r := range perReceiver {
				rate += r
			}
			q := failover.AssessQueueRoom(rate, s.BrokerMaxQueuedMessages, worst)
			if cfg.QueueRoom == nil {
				cfg.QueueRoom = map[string]failover.QueueRoom{}
			}
			cfg.QueueRoom[s.ID] = q
			var fe *failover.FieldError
			if errors.As(q.Err, &fe) {
				path := fmt.Sprintf("sessions[%d].broker_max_queued_messages", idx)
				var val any = q.Limit
				if q.LimitAssumed {
					val = nil
				}
				v.add(path, val, "%s", fe.Rule)
			}
		}
	}
}
