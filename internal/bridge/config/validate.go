package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/bridge/activation"
	"github.com/myriarch/myriarch/internal/bridge/leasemode"
	"github.com/myriarch/myriarch/internal/bridge/queueroom"
)

type validator struct {
	// inheritable is, by session index, the lease keys that the session
	// declares for its routes; inherited is, by route index, each lease
	// key the route took from its session, with the session's index.
	inheritable []map[string]bool
	inherited   []map[string]int
	file        string
	lines       map[string]int
	problems    Problems
	// sender is the id and type of the sender being walked, for the
	// problem of a key that belongs to another sender type.
	sender [2]string
	// remote: the check runs away from the bridge's host (CheckRemote):
	// the files and environment variables that the configuration names
	// are not read.
	remote bool
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

// objects resolves each object of a list against its table into a new In,
// refuses an id that an earlier object of the list took, and returns what
// build makes of each.
func objects[R, In, S any](v *validator, list string, raw []R, t *Table, build func(p string, r *R, in *In, vs values) S) []S {
	seen := map[string]string{}
	var out []S
	for i := range raw {
		p := fmt.Sprintf("%s[%d]", list, i)
		in := new(In)
		vs := v.resolve(p, t, &raw[i], in)
		v.unique(p, vs, seen)
		out = append(out, build(p, &raw[i], in, vs))
	}
	return out
}

// idRow is the row of an object's id: the one of the id format.
func (t *Table) idRow() *Row {
	for i := range t.Rows {
		if t.Rows[i].Rule.Format == "id" {
			return &t.Rows[i]
		}
	}
	panic("config: table " + t.Name + " has no id row")
}

// unique records an object's id, refusing one that another object of its
// kind uses; an id that broke its row's rule is not recorded.
func (v *validator) unique(prefix string, vs values, seen map[string]string) {
	r := vs.t.idRow()
	if !vs.accepted(r) {
		return
	}
	id, _ := vs.value(r).(string)
	if seen[id] != "" {
		v.add(prefix+".id", id, "is already used by %s", seen[id])
		return
	}
	seen[id] = prefix
}

func (v *validator) secret(path, file, env string) Secret {
	switch {
	case file != "" && env != "":
		v.add(path+"_file", file, "set either %s_file or %s_env, not both", filepath.Base(path), filepath.Base(path))
	case v.remote:
		// The file or variable is the bridge host's; the bridge reads it.
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
		if f.p == "" || v.remote {
			continue
		}
		if _, err := os.Stat(f.p); err != nil {
			v.add(path+"."+f.k, f.p, "cannot be read: %v", errors.Unwrap(err))
		}
	}
	return &TLSSettings{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
}

// inKeys returns the FieldError in e (also a wrapped one) with failover's
// field names mapped onto the bridge's keys; nil when e has none.
func inKeys(e error) *failover.FieldError {
	var fe *failover.FieldError
	if !errors.As(e, &fe) {
		return nil
	}
	renamed, _ := failover.RenameFields(fe, leasemode.Keys).(*failover.FieldError)
	return renamed
}

// failover reports the errors of the failover package under prefix, with
// failover's field names mapped onto the bridge's keys.
func (v *validator) failover(prefix string, err error) {
	for _, e := range failover.Errs(err) {
		if fe := inKeys(e); fe != nil {
			path := prefix + "." + fe.Field
			v.problems = append(v.problems, Problem{File: v.file, Line: v.line(path), Path: path, Value: fe.Value, Rule: fe.Rule})
			continue
		}
		v.problems = append(v.problems, Problem{File: v.file, Line: v.line(prefix), Path: prefix, Rule: failover.RenameWords(e.Error(), leasemode.Keys)})
	}
}

func (v *validator) validate(f *File) *Config {
	cfg := &Config{File: v.file}
	v.resolve("", &topTable, f, nil) // the lists that must not be empty
	v.bridge(f, cfg)
	v.store(f, cfg)
	v.sessions(f, cfg)
	v.receivers(f, cfg)
	v.senders(f, cfg)
	v.routes(f, cfg)
	v.admit(f, cfg)
	v.relocate()
	return cfg
}

func (v *validator) bridge(f *File, cfg *Config) {
	s := &cfg.Bridge
	v.resolve("bridge", &bridgeTable, &f.Bridge, s)
	s.InstanceIDSet = s.InstanceID != ""
	if s.StateDir == "" {
		s.StateDir = filepath.Dir(v.file)
	}
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
	v.resolve("stores.lease", &leaseStoreTable, &l, s) // a refused type stays as written: none of the types' rules apply
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
	}
}

// sessionIn is what the rows of a session resolve into: its settings, and
// the keys whose default depends on other keys (nil: omitted or refused).
type sessionIn struct {
	SessionSettings
	expiry    *time.Duration // session_expiry_interval
	maxQueued *int           // broker_max_queued_messages
	// policy and connectAfterLease hold the lease keys declared on the
	// session (LeaseKeys), checked here and inherited by its routes.
	policy            failover.SessionPolicy
	connectAfterLease bool
}

// given reports whether a raw string key was written (see rawValue).
func given(s string) bool { return strings.TrimSpace(s) != "" }

func (v *validator) sessions(f *File, cfg *Config) {
	cfg.Sessions = objects(v, "sessions", f.Sessions, &sessionTable, func(p string, r *Session, in *sessionIn, vs values) SessionSettings {
		s := in.SessionSettings
		v.sessionLease(p, r, in, vs)
		v311 := s.ProtocolVersion == MQTT311
		switch r.ClientIDSuffix {
		case "instance":
			s.ClientIDInstance = true
			if s.Mode == Exclusive {
				v.add(p+".client_id_suffix", r.ClientIDSuffix, "is refused for an exclusive session: every instance must use the same client_id so that the successor resumes the broker session")
			}
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
		if cfg.Bridge.DeploymentMode == leasemode.Clustered && s.Mode != Exclusive && !s.ClientIDInstance {
			v.add(p+".client_id_suffix", r.ClientIDSuffix, `must be "instance" for a %s session in clustered mode, or instances would take the client_id from each other`, s.Mode)
		}
		s.CleanStart = s.Mode == Ephemeral
		if r.CleanStart != nil {
			s.CleanStart = *r.CleanStart
			if s.CleanStart && s.Mode != Ephemeral {
				v.add(p+".clean_start", "true", "must be false for a %s session: clean_start discards the broker session that it exists to resume", s.Mode)
			}
		}
		// The default expiry depends on the mode; 3.1.1 has none.
		switch {
		case v311 && given(r.SessionExpiryInterval):
			v.add(p+".session_expiry_interval", r.SessionExpiryInterval, "does not apply to protocol_version 3.1.1: MQTT 3.1.1 has no session expiry interval; the broker keeps a persistent session as its own settings say (mosquitto: persistent_client_expiration)")
			fallthrough
		case in.expiry == nil:
			if s.Mode != Ephemeral {
				s.SessionExpiryInterval = DefaultSessionExpiry
			}
		default:
			s.SessionExpiryInterval = *in.expiry
			if s.Mode != Ephemeral && s.SessionExpiryInterval == 0 {
				v.add(p+".session_expiry_interval", r.SessionExpiryInterval, "must be positive for a %s session, or the broker drops the session on disconnect", s.Mode)
			}
		}
		s.Password = v.secret(p+".password", r.PasswordFile, r.PasswordEnv)
		s.TLS = v.tls(p+".tls", r.TLS)
		if act, err := activation.MQTT(s.ConnectTimeout, s.ReconcileTimeout, s.UnmatchedGrace); err != nil {
			v.failover(p, err)
		} else {
			s.Activation = act
		}
		if v311 && r.ReceiveMaximum != 0 {
			v.add(p+".receive_maximum", r.ReceiveMaximum, "does not apply to protocol_version 3.1.1: MQTT 3.1.1 has no receive maximum; the broker's own in-flight limit applies (mosquitto: max_inflight_messages)")
			s.ReceiveMaximum = DefaultReceiveMaximum
		}
		s.BrokerMaxQueuedMessages = -1
		if in.maxQueued != nil {
			s.BrokerMaxQueuedMessages = *in.maxQueued
		}
		s.ConnectAfterLease = true
		return s
	})
}

// sessionLease checks the lease keys declared on a session and records
// those its routes inherit: the ones written and accepted, on an exclusive
// session (on another session each is refused, like on its routes).
func (v *validator) sessionLease(p string, r *Session, in *sessionIn, vs values) {
	inherit := map[string]bool{}
	v.inheritable = append(v.inheritable, inherit)
	for i := range sessionTable.Rows {
		k := &sessionTable.Rows[i]
		if !k.ExclusiveOnly || !vs.given(k) {
			continue
		}
		switch {
		case in.Mode != Exclusive:
			v.add(p+"."+k.Key, asWritten(vs.written(k)), "applies only to exclusive sessions; session %q is %s", r.ID, in.Mode)
		case k.Key == "broker_health_step_down":
			if _, err := failover.ParseBrokerHealthStepDown(r.BrokerHealthStepDown); err != nil {
				v.failover(p, err)
			} else {
				inherit[k.Key] = true
			}
		case k.Key == "connect_after_lease" && !in.connectAfterLease:
			v.add(p+".connect_after_lease", "false", "false is not supported: an exclusive session connects only after it holds the lease, so that two instances never consume its broker session at once")
		case vs.accepted(k):
			inherit[k.Key] = true
		}
	}
}

// inherit returns the raw routes with the lease keys that each route omits
// taken from its receiver's session (those sessionLease accepted), and
// records them in v.inherited, so that a problem of an inherited value is
// reported where it is written: on the session.
func (v *validator) inherit(f *File) []Route {
	routes := slices.Clone(f.Routes)
	v.inherited = make([]map[string]int, len(routes))
	for i := range routes {
		rt := &routes[i]
		ri := slices.IndexFunc(f.Receivers, func(r Receiver) bool { return r.ID == rt.Receiver && r.ID != "" })
		if ri < 0 {
			continue
		}
		si := slices.IndexFunc(f.Sessions, func(s Session) bool { return s.ID == f.Receivers[ri].Session && s.ID != "" })
		if si < 0 || si >= len(v.inheritable) {
			continue
		}
		own := reflect.ValueOf(&rt.LeaseKeys).Elem()
		sess := reflect.ValueOf(f.Sessions[si].LeaseKeys)
		for key := range v.inheritable[si] {
			idx := fieldIndex(own.Type(), key)
			if written, _ := rawValue(own.FieldByIndex(idx), true); written {
				continue
			}
			own.FieldByIndex(idx).Set(sess.FieldByIndex(idx))
			if v.inherited[i] == nil {
				v.inherited[i] = map[string]int{}
			}
			v.inherited[i][key] = si
		}
	}
	return routes
}

// relocate moves each problem of an inherited lease key from the route to
// the session that declares it, once per session and rule.
func (v *validator) relocate() {
	var out Problems
	seen := map[Problem]bool{}
	for _, pr := range v.problems {
		var i int
		var key string
		if n, _ := fmt.Sscanf(pr.Path, "routes[%d].", &i); n == 1 && i < len(v.inherited) {
			_, key, _ = strings.Cut(pr.Path, ".")
			if si, ok := v.inherited[i][key]; ok {
				pr.Path = fmt.Sprintf("sessions[%d].%s", si, key)
				pr.Line = v.line(pr.Path)
			}
		}
		if !seen[pr] {
			seen[pr] = true
			out = append(out, pr)
		}
	}
	v.problems = out
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
	cfg.Receivers = objects(v, "receivers", f.Receivers, &receiverTable, func(p string, r *Receiver, in *ReceiverSettings, _ values) ReceiverSettings {
		rs := *in
		sess := cfg.Session(r.Session)
		if r.Session != "" && sess == nil {
			v.add(p+".session", r.Session, "names no session")
		}
		for j, t := range r.Topics {
			tp := fmt.Sprintf("%s.topics[%d]", p, j)
			var ts TopicSettings
			v.resolve(tp, &topicTable, &t, &ts)
			if sess != nil && cfg.Bridge.DeploymentMode == leasemode.Clustered && sess.Mode != Exclusive && !strings.HasPrefix(t.Filter, "$share/") {
				v.add(tp+".filter", t.Filter, "in clustered mode a receiver needs a $share/<group>/ filter or an exclusive session, or every instance receives every message")
			}
			rs.Topics = append(rs.Topics, ts)
		}
		return rs
	})
}

func (v *validator) senders(f *File, cfg *Config) {
	cfg.Senders = objects(v, "senders", f.Senders, &senderTable, func(p string, r *Sender, in *SenderSettings, vs values) SenderSettings {
		s := *in
		if s.MaxBackoff < s.InitialBackoff {
			v.add(p+".retry.max_backoff", r.Retry.MaxBackoff, "must not be below initial_backoff (%v)", s.InitialBackoff)
		}
		// Exactly the block of the sender's type.
		for i := range senderTable.Rows {
			block := &senderTable.Rows[i]
			st := block.Table
			if st == nil || st.SenderType == "" {
				continue
			}
			set := vs.given(block)
			switch {
			case st.SenderType == r.Type && !set:
				v.add(p+"."+r.Type, nil, "is required for a sender of type %s", r.Type)
			case st.SenderType != r.Type && set:
				v.add(p+"."+st.SenderType, nil, "does not apply to a sender of type %q", r.Type)
			}
		}
		bp := p + "." + r.Type
		switch {
		case r.Type == senderMQTT && r.MQTT != nil:
			m := r.MQTT
			ms := &MQTTSenderSettings{}
			v.resolve(bp, &mqttSenderTable, m, ms)
			ms.Password = v.secret(bp+".password", m.PasswordFile, m.PasswordEnv)
			ms.TLS = v.tls(bp+".tls", m.TLS)
			if ms.ClientID == "" {
				ms.ClientID = f.Bridge.ID + "-" + r.ID
			}
			s.MQTT = ms
		case r.Type == senderHTTP && r.HTTP != nil:
			s.HTTP = &HTTPSenderSettings{}
			v.resolve(bp, &httpSenderTable, r.HTTP, s.HTTP)
		case r.Type == senderNATS && r.NATS != nil:
			s.NATS = &NATSSenderSettings{}
			v.resolve(bp, &natsSenderTable, r.NATS, s.NATS)
		case r.Type == senderKafka && r.Kafka != nil:
			s.Kafka = &KafkaSenderSettings{}
			v.resolve(bp, &kafkaSenderTable, r.Kafka, s.Kafka)
		case r.Type == senderAMQP && r.AMQP != nil:
			a := &AMQPSenderSettings{}
			v.resolve(bp, &amqpSenderTable, r.AMQP, a)
			a.Password = v.secret(bp+".password", r.AMQP.PasswordFile, r.AMQP.PasswordEnv)
			a.TLS = v.tls(bp+".tls", r.AMQP.TLS)
			if r.AMQP.TLS != nil && strings.HasPrefix(a.URL, "amqp://") {
				v.add(bp+".tls", nil, "applies to an amqps:// url only (url is %q)", a.URL)
			}
			s.AMQP = a
		case r.Type == senderSQS && r.SQS != nil:
			q := &SQSSenderSettings{}
			v.resolve(bp, &sqsSenderTable, r.SQS, q)
			q.SecretAccessKey = v.secret(bp+".secret_access_key", r.SQS.SecretAccessKeyFile, r.SQS.SecretAccessKeyEnv)
			switch hasSecret := r.SQS.SecretAccessKeyFile != "" || r.SQS.SecretAccessKeyEnv != ""; {
			case q.AccessKeyID != "" && !hasSecret:
				v.add(bp+".access_key_id", q.AccessKeyID, "needs secret_access_key_env or secret_access_key_file")
			case q.AccessKeyID == "" && hasSecret:
				v.add(bp+".access_key_id", nil, "is required with a secret access key")
			}
			s.SQS = q
		case r.Type == senderFile && r.File != nil:
			s.File = &FileSenderSettings{}
			v.resolve(bp, &fileSenderTable, r.File, s.File)
		}
		return s
	})
}

// routeIn is what the rows of a route resolve into: its settings, and the
// keys of an exclusive session's lease policy.
type routeIn struct {
	RouteSettings
	// policy holds the lease keys, the startup allowance and the
	// objective; the rest of the policy is the session's and the mode's.
	policy            failover.SessionPolicy
	connectAfterLease bool
}

// leaseRows are the route rows of an exclusive session's lease policy
// (ExclusiveOnly), sorted by key.
var leaseRows = func() []*Row {
	var rows []*Row
	for i := range routeTable.Rows {
		if routeTable.Rows[i].ExclusiveOnly {
			rows = append(rows, &routeTable.Rows[i])
		}
	}
	slices.SortFunc(rows, func(a, b *Row) int { return strings.Compare(a.Key, b.Key) })
	return rows
}()

func (v *validator) routes(f *File, cfg *Config) {
	connectAfter := map[string]*bool{}
	connectAfterSrc := map[string]string{}
	cfg.Routes = objects(v, "routes", v.inherit(f), &routeTable, func(p string, r *Route, in *routeIn, vs values) RouteSettings {
		rs := in.RouteSettings
		rs.Mappings = r.Mappings
		recv := cfg.Receiver(r.Receiver)
		if r.Receiver != "" && recv == nil {
			v.add(p+".receiver", r.Receiver, "names no receiver")
		}
		for j, s := range r.Senders {
			if cfg.Sender(s) == nil {
				v.add(fmt.Sprintf("%s.senders[%d]", p, j), s, "names no sender")
			}
			if slices.Index(r.Senders, s) != j {
				v.add(fmt.Sprintf("%s.senders[%d]", p, j), s, "is listed twice")
			}
		}
		if len(r.Mappings) > 0 && r.Rewrite != nil {
			v.add(p+".mappings", nil, "and rewrite exclude each other: put the prefixes in the mappings")
		}
		for j, m := range r.Mappings {
			mp := fmt.Sprintf("%s.mappings[%d]", p, j)
			v.resolve(mp, &mappingTable, &m, nil)
			if why := validFilter(m.SourcePrefix + m.Pattern); m.Pattern != "" && why != "" {
				v.add(mp+".pattern", m.Pattern, "with source_prefix %q: %s", m.SourcePrefix, why)
			}
		}
		if r.Rewrite != nil {
			if rs.StripPrefix == "" && rs.AddPrefix == "" {
				v.add(p+".rewrite", nil, "set strip_prefix, add_prefix or both")
			}
		}
		var sess *SessionSettings
		if recv != nil {
			rs.Session = recv.Session
			sess = cfg.Session(recv.Session)
		}
		if r.Spool != nil {
			rs.Spool = v.spool(p+".spool", r, sess, cfg)
		}
		if sess != nil && sess.Mode != Exclusive {
			for _, k := range leaseRows {
				if vs.given(k) {
					v.add(p+"."+k.Key, asWritten(vs.written(k)), "applies only to routes on an exclusive session; session %q is %s", sess.ID, sess.Mode)
				}
			}
		}
		if sess != nil && sess.Mode == Exclusive {
			pol := in.policy
			pol.Lease = cfg.Bridge.DeploymentMode.Lease(in.policy.Lease)
			pol.Activation = sess.Activation
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
				if st := cfg.Sender(id); st != nil && st.MQTT != nil && st.MQTT.ProtocolVersion == MQTT311 {
					cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("route %q: sender %q publishes MQTT 3.1.1, which has no user properties: the messages of exclusive session %q reach it without the fencing stamp (%s, %s), so a consumer there cannot tell a deposed owner's late messages from its successor's", r.ID, id, sess.ID, "myriarch-lease-version", "myriarch-session-id"))
				}
			}
			if !in.connectAfterLease {
				v.add(p+".connect_after_lease", "false", "false is not supported: an exclusive session connects only after it holds the lease, so that two instances never consume its broker session at once")
			}
		}
		return rs
	})

	v.loopPeers(f, cfg)
	spoolDirs := map[string]string{}
	for i, r := range cfg.Routes {
		if r.Spool == nil || r.Spool.Backend != SpoolFile {
			continue // an outbox is keyed by its lease and route
		}
		dir := filepath.Clean(r.Spool.Dir)
		if prev, ok := spoolDirs[dir]; ok {
			// One process locks a spool directory once: the second route
			// would wait for the lock its own process holds.
			v.add(fmt.Sprintf("routes[%d].spool.dir", i), r.Spool.Dir, "is also the spool of route %q: each route needs its own spool directory", prev)
			continue
		}
		spoolDirs[dir] = r.ID
	}
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
	if cfg.Bridge.DeploymentMode == leasemode.Clustered && cfg.LeaseStore.Type == leaseStoreSQLite && slices.ContainsFunc(cfg.Sessions, func(s SessionSettings) bool { return s.Mode == Exclusive }) {
		v.add("stores.lease.type", cfg.LeaseStore.Type, "clustered mode needs a shared lease store (postgres or etcd); sqlite is process-local to one host")
	}
}

// spool resolves a route's spool block. A file spool is local to one
// host: on an exclusive session it needs the sqlite lease store (every
// instance on the one host, sharing the directory under its lock); with a
// shared store the successor may run on another host, where it could not
// read the spool, so a clustered exclusive session uses the postgres
// backend (package outbox), which lives in the lease store's database and
// is fenced by its lease rows. There is no etcd backend: etcd is not a
// place for a message backlog (its whole keyspace is bounded by its quota,
// 2 GiB by default, and every value is replicated through the Raft log).
func (v *validator) spool(p string, r *Route, sess *SessionSettings, cfg *Config) *SpoolSettings {
	s := &SpoolSettings{}
	vs := v.resolve(p, &spoolTable, r.Spool, s)
	if s.MaxBytes == 0 && s.MaxMessages == 0 {
		v.add(p+".max_bytes", "0", "and max_messages are both 0: a spool needs a bound (bytes, messages or both), or a destination outage fills the disk")
	}
	exclusive := sess != nil && sess.Mode == Exclusive
	if s.Backend == SpoolPostgres {
		for i := range spoolTable.Rows {
			row := &spoolTable.Rows[i]
			switch row.Key {
			case "dir", "fsync", "fsync_interval", "segment_bytes":
				if vs.given(row) {
					v.add(p+"."+row.Key, vs.written(row),
						"is a setting of the file spool; backend postgres keeps the spool in the lease store's database and acknowledges the source after the INSERT committed")
				}
			}
		}
		s.Dir = ""
		switch {
		case sess != nil && !exclusive:
			v.add(p+".backend", SpoolPostgres, "needs an exclusive session: the postgres spool is fenced by the session's lease, and session %q is %s (use backend file)", sess.ID, sess.Mode)
		case cfg.LeaseStore.Type == leaseStoreEtcd:
			v.add(p+".backend", SpoolPostgres, "needs stores.lease.type postgres: the spool lives in the lease store's database and is fenced by its lease rows, and this lease store is etcd (there is no etcd spool: see \"Durable spool\")")
		case cfg.LeaseStore.Type != leaseStorePostgres:
			v.add(p+".backend", SpoolPostgres, "needs stores.lease.type postgres: the spool lives in the lease store's database and is fenced by its lease rows, and this lease store is %s (with sqlite every instance is on one host: use backend file)", cfg.LeaseStore.Type)
		}
		return s
	}
	if s.Dir == "" {
		s.Dir = filepath.Join(cfg.Bridge.StateDir, cfg.Bridge.ID+"-"+r.ID+".spool")
	} else if !filepath.IsAbs(s.Dir) && v.file != "" {
		s.Dir = filepath.Join(filepath.Dir(v.file), s.Dir)
	}
	if exclusive {
		switch cfg.LeaseStore.Type {
		case leaseStorePostgres:
			v.add(p+".backend", SpoolFile, "a file spool is local to one host, and with a postgres lease store the successor of exclusive session %q may run on another host, where it could not read the spool: use backend: postgres (the spool in the lease store's database, fenced by the session's lease), or no spool", sess.ID)
		case leaseStoreEtcd:
			v.add(p+".backend", SpoolFile, "a file spool is local to one host, and with an etcd lease store the successor of exclusive session %q may run on another host, where it could not read the spool; the clustered spool is built on PostgreSQL only (backend: postgres with stores.lease.type postgres), or use a sqlite lease store (one host) or no spool", sess.ID)
		}
	}
	return s
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
			case st.MQTT != nil && st.MQTT.ProtocolVersion == MQTT311:
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

// asWritten prints a raw value as the file has it.
func asWritten(raw any) string {
	switch x := raw.(type) {
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	return fmt.Sprint(raw)
}

func boolStr(b *bool) string {
	if b == nil {
		return "true"
	}
	return strconv.FormatBool(*b)
}

// overrides reports a divergence between a route that inherits a lease
// key from its session and one that declares another value for it, at the
// declaring route's key; false for another divergence.
func (v *validator) overrides(f *File, d failover.Divergence, routeBySource map[string]int) bool {
	key, _, _ := strings.Cut(failover.RenameWords(d.Input, leasemode.Keys), " ")
	a, okA := routeBySource[d.First]
	b, okB := routeBySource[d.Other]
	if !okA || !okB || a >= len(v.inherited) || b >= len(v.inherited) {
		return false
	}
	si, inhA := v.inherited[a][key]
	decl, heir := b, a
	if _, inhB := v.inherited[b][key]; inhA == inhB {
		return false
	} else if inhB {
		si = v.inherited[b][key]
		decl, heir = a, b
	}
	raw, ok := lookup(reflect.ValueOf(f.Routes[decl]), key)
	if !ok {
		return false
	}
	_, written := rawValue(raw, true)
	_, sessVal := rawValue(reflect.ValueOf(f.Sessions[si].LeaseKeys).FieldByIndex(fieldIndex(reflect.TypeFor[LeaseKeys](), key)), true)
	v.add(fmt.Sprintf("routes[%d].%s", decl, key), asWritten(written),
		"differs from %s: %s of session %q, which routes[%d] %q inherits; the routes of a session must resolve to the same lease policy: declare it on the session alone, or alike on every route",
		key, asWritten(sessVal), d.SessionID, heir, f.Routes[heir].ID)
	return true
}

// admit canonicalizes and admits the exclusive sessions in one pass of
// failover.Preflight: each route's refusals are reported with its paths,
// then the divergences between routes of one session.
func (v *validator) admit(f *File, cfg *Config) {
	var inputs []failover.SessionInput
	var routeOf []int // input index → route index
	routeBySource := map[string]int{}
	for i, r := range cfg.Routes {
		if r.Policy == nil {
			continue
		}
		src := fmt.Sprintf("routes[%d] %q", i, r.ID)
		inputs = append(inputs, failover.SessionInput{Source: src, SessionID: r.Session, Policy: *r.Policy})
		routeOf = append(routeOf, i)
		routeBySource[src] = i
	}
	pf := failover.Preflight(inputs)
	results := slices.Clone(pf.Sources)
	slices.SortFunc(results, func(a, b failover.SourceResult) int { return a.Input - b.Input })
	for _, res := range results {
		i := routeOf[res.Input]
		r := cfg.Routes[i]
		p := fmt.Sprintf("routes[%d]", i)
		for _, e := range failover.Errs(res.Assessment.Err) {
			if fe := inKeys(e); fe != nil {
				path := p + "." + fe.Field
				switch fe.Field {
				case "connect_timeout", "reconcile_timeout", "unmatched_grace":
					path = fmt.Sprintf("sessions[%d].%s", slices.IndexFunc(cfg.Sessions, func(s SessionSettings) bool { return s.ID == r.Session }), fe.Field)
				}
				v.problems = append(v.problems, Problem{File: v.file, Line: v.line(path), Path: path, Value: fe.Value, Rule: fe.Rule})
				continue
			}
			v.add(p, nil, "%s", failover.RenameWords(e.Error(), leasemode.Keys))
		}
	}
	for _, d := range pf.Divergences {
		if v.overrides(f, d, routeBySource) {
			continue
		}
		v.problems = append(v.problems, Problem{File: v.file, Rule: failover.RenameWords(d.Error(), leasemode.Keys)})
	}
	canon := pf.Sessions
	cfg.Admission = pf
	cfg.Exclusive = canon
	for _, c := range canon {
		for _, w := range c.Assessment.Warnings {
			cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("session %q: %s", c.SessionID, failover.RenameWords(w, leasemode.Keys)))
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
			q := queueroom.Assess(rate, s.BrokerMaxQueuedMessages, worst)
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
