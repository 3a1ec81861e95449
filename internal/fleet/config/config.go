// Package config loads myriarchd's configuration: a YAML file and one
// MYRIARCH_* environment variable for every key, checked against the
// defaults and ranges of the settings table before anything starts.
//
// Every key has the form section.name (for example ha.leaderSessionTimeout).
// Its environment variable is MYRIARCH_ followed by the key in upper case
// with the dot replaced by an underscore (MYRIARCH_HA_LEADERSESSIONTIMEOUT).
// The environment overrides the file; a MYRIARCH_* variable that names no
// setting but looks like one (a section's prefix, or a few edits from a
// setting's variable; not one of OtherEnv) is refused, naming the nearest
// known one. Durations are Go duration strings.
// Every problem is reported, each naming the key, the value and the rule;
// a configuration with any problem is refused whole.
package config

//go:generate go run ./gendoc

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/myriarch/myriarch/failover"
	"github.com/myriarch/myriarch/internal/fleet/authlimit"
	"github.com/myriarch/myriarch/internal/godur"
	"go.yaml.in/yaml/v3"
)

// Config is myriarchd's resolved configuration.
type Config struct {
	HA        HA
	Server    Server
	Database  Database
	Agents    Agents
	Jobs      Jobs
	GitOps    GitOps
	Artifacts Artifacts
	Telemetry Telemetry
	Log       Log
}

// Telemetry is the agents' own metrics (package telemetry).
type Telemetry struct {
	Enabled           bool
	PublicURL         string
	FlushInterval     time.Duration
	FineResolution    time.Duration
	FineRetention     time.Duration
	CoarseResolution  time.Duration
	CoarseRetention   time.Duration
	MaxSeriesPerAgent int64
}

// GitOps is the Git source of configurations (package gitops).
type GitOps struct {
	RepoURL           string
	Ref               string
	Path              string
	PollInterval      time.Duration
	Username          string
	Token             string
	TokenFile         string
	SSHKeyFile        string
	SSHKnownHostsFile string
	WebhookSecret     string
}

// HA is the high-availability section.
type HA struct {
	// LeaderSessionTimeout (T) bounds the failover after a hard failure.
	LeaderSessionTimeout time.Duration
	// HeartbeatInterval is the replica registry heartbeat.
	HeartbeatInterval time.Duration
	// LeaderLockKey is the advisory lock key.
	LeaderLockKey int64
	// ReplicaID names this replica; default the host name.
	ReplicaID string
}

// Server is the listeners and the shutdown.
type Server struct {
	// ShutdownTimeout is the drain time of each drain phase on a planned stop.
	ShutdownTimeout time.Duration
	OpAMPListen     string
	OpAMPPath       string
	HTTPListen      string
	TLSCertFile     string
	TLSKeyFile      string
	// OpAMPClientCAFile enables client certificates on the OpAMP listener:
	// a certificate signed by one of these CAs authenticates the agent
	// whose instance UID is its subject common name.
	OpAMPClientCAFile string
	// EnrollmentSecret is the shared secret that agents present as a
	// bearer token on the OpAMP connection.
	EnrollmentSecret string
	// LastSeenFlushInterval is how often last-seen times and events are
	// written to the database in one batch.
	LastSeenFlushInterval time.Duration
	// HTTPTLSCertFile and HTTPTLSKeyFile serve the REST API and UI over
	// TLS; the files are read again when they change (certificate renewal).
	HTTPTLSCertFile string
	HTTPTLSKeyFile  string
	// Timeouts of the API/UI listener.
	HTTPReadHeaderTimeout time.Duration
	HTTPReadTimeout       time.Duration
	HTTPWriteTimeout      time.Duration
	HTTPIdleTimeout       time.Duration
	// MaxRequestBytes bounds an API/UI request body.
	MaxRequestBytes int64
	// OpAMPMaxMessageBytes bounds one OpAMP message after decompression
	// (plain-HTTP body, WebSocket frame).
	OpAMPMaxMessageBytes int64
	// AuthFailuresPerMinute is how many failed authentications one source
	// address may make per minute before it is refused without a check.
	AuthFailuresPerMinute int64
	// UISessionTTL is the lifetime of a UI login session.
	UISessionTTL time.Duration

	// Agent identity and reports (internal/fleet/opampserver, identity.go
	// and security.go).
	EnrollmentsPerMinute         int64
	OpAMPHeartbeatInterval       time.Duration
	AgentMaxAttributes           int64
	AgentMaxAttributeKeyBytes    int64
	AgentMaxAttributeValueBytes  int64
	AgentMaxEffectiveConfigBytes int64
	AgentMaxHealthComponents     int64
	// Listener protection (issue 21): trusted proxies, the failure
	// penalty, the API/UI request deadline and the OpAMP body bounds.
	TrustedProxies          string
	AuthFailurePenalty      time.Duration
	RequestTimeout          time.Duration
	OpAMPBodyTimeout        time.Duration
	OpAMPBodyMinRate        int64
	OpAMPBodyBytesInFlight  int64
	OpAMPBodyBytesPerSource int64
}

// Database is the PostgreSQL connection.
type Database struct {
	URL      string
	MaxConns int64
}

// Agents is the agent bookkeeping.
type Agents struct {
	// OfflineAfter: the offline sweeper marks an agent offline whose
	// last-seen time is older than this.
	OfflineAfter time.Duration
	// EventRetention is how long agent events are kept.
	EventRetention time.Duration
	// ReconcileInterval is the event bus safety net: how often each replica
	// compares the desired state of its agents with what it delivered.
	ReconcileInterval time.Duration
	// ReconnectsPerMinute bounds the WebSocket connections one instance
	// UID may open per minute on one replica.
	ReconnectsPerMinute int64
}

// Jobs is the leader's singleton jobs.
type Jobs struct {
	OfflineSweepInterval time.Duration
	HousekeepingInterval time.Duration
	// ReplicaRetention is how long a replica row without heartbeat is kept.
	ReplicaRetention time.Duration
	// ReleaseTrackerInterval is how often the release tracker looks for
	// package sources whose own poll interval has passed.
	ReleaseTrackerInterval time.Duration
	// ArtifactPrefetchInterval is how often artifact prefetch looks for
	// missing blobs and applies retention.
	ArtifactPrefetchInterval time.Duration
	// RolloutInterval is how often the rollout engine takes each active
	// rollout one step.
	RolloutInterval time.Duration
}

// Artifacts is the agent software store.
type Artifacts struct {
	// KeepVersions is how many newest versions per package keep their blobs.
	KeepVersions int64
	// PublicURL is the base URL agents download artifacts from.
	PublicURL string
	// GitHubAPIURL is the GitHub (Enterprise) API of github package sources.
	GitHubAPIURL string
	// GitHubToken authenticates the release tracker to GitHub.
	GitHubToken string
	// Store is where new blobs go: "postgres" (large objects) or "s3".
	Store string
	// SegmentBytes is how much of a download into PostgreSQL is committed
	// at once (what a leader failover can cost again).
	SegmentBytes int64
	// S3 is the S3-compatible store (Store "s3").
	S3Endpoint      string
	S3Bucket        string
	S3Prefix        string
	S3Region        string
	S3AccessKey     string
	S3SecretKey     string
	S3SecretKeyFile string
	S3TLS           bool
	S3CAFile        string
}

// ResolveS3SecretKey returns the S3 secret key: artifacts.s3SecretKey, or the
// content of artifacts.s3SecretKeyFile (surrounding white space trimmed).
func (a Artifacts) ResolveS3SecretKey() (string, error) {
	if a.S3SecretKeyFile == "" {
		return a.S3SecretKey, nil
	}
	b, err := os.ReadFile(a.S3SecretKeyFile)
	if err != nil {
		return "", &FieldError{Field: "artifacts.s3SecretKeyFile", Value: fmt.Sprintf("%q", a.S3SecretKeyFile), Rule: "must be a readable file (" + err.Error() + ")"}
	}
	k := strings.TrimSpace(string(b))
	if k == "" {
		return "", &FieldError{Field: "artifacts.s3SecretKeyFile", Value: fmt.Sprintf("%q", a.S3SecretKeyFile), Rule: "must not be empty"}
	}
	return k, nil
}

// Log is the logging.
type Log struct {
	Level  string
	Format string
}

// Shutdown sizing of myriarchd (spec "Size the shutdown"); the arithmetic
// is failover.TerminationGracePeriod.
const (
	// FinalFlushDeadline bounds the OpAMP server's last flush of last-seen
	// times and events and the offline marking of its agents.
	FinalFlushDeadline = 15 * time.Second
	// DefaultShutdownTimeout is server.shutdownTimeout's default.
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultPreStopSleep is the Helm chart's preStopSleepSeconds.
	DefaultPreStopSleep = 10 * time.Second
)

// TerminationGracePeriod is the smallest terminationGracePeriodSeconds (or
// systemd TimeoutStopSec) that covers myriarchd's slowest planned stop:
// preStopSleepSeconds + 2 × server.shutdownTimeout + 15 + 5, rounded up to
// whole seconds.
func TerminationGracePeriod(preStopSleep, shutdownTimeout time.Duration) (time.Duration, error) {
	return failover.TerminationGracePeriod(preStopSleep, shutdownTimeout, FinalFlushDeadline)
}

// Setting describes one key of the settings table.
type Setting struct {
	Key     string
	Default string
	// Rule is the accepted range in words, for errors and docs.
	Rule    string
	Meaning string
	// Secret values are never echoed in errors.
	Secret bool
	set    func(c *Config, v string) error
}

// Env is the environment variable of the setting.
func (s Setting) Env() string { return EnvName(s.Key) }

// EnvName is the environment variable of a key.
func EnvName(key string) string {
	return "MYRIARCH_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

func durSetting(key, def string, lo, hi time.Duration, meaning string, dst func(*Config) *time.Duration) Setting {
	rule := fmt.Sprintf("must be a duration within [%s, %s]", godur.Format(lo), godur.Format(hi))
	return Setting{Key: key, Default: def, Rule: rule, Meaning: meaning, set: func(c *Config, v string) error {
		d, err := godur.Parse(v)
		if err != nil {
			return err
		}
		if d < lo || d > hi {
			return errors.New(rule)
		}
		*dst(c) = d
		return nil
	}}
}

func intSetting(key, def string, lo, hi int64, meaning string, dst func(*Config) *int64) Setting {
	rule := fmt.Sprintf("must be an integer within [%d, %d]", lo, hi)
	if lo == math.MinInt64 && hi == math.MaxInt64 {
		rule = "must be a 64-bit integer"
	}
	return Setting{Key: key, Default: def, Rule: rule, Meaning: meaning, set: func(c *Config, v string) error {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < lo || n > hi {
			return errors.New(rule)
		}
		*dst(c) = n
		return nil
	}}
}

func strSetting(key, def, rule, meaning string, check func(string) bool, dst func(*Config) *string) Setting {
	return Setting{Key: key, Default: def, Rule: rule, Meaning: meaning, set: func(c *Config, v string) error {
		if check != nil && !check(v) {
			return errors.New(rule)
		}
		*dst(c) = v
		return nil
	}}
}

func boolSetting(key, def, meaning string, dst func(*Config) *bool) Setting {
	const rule = "must be true or false"
	return Setting{Key: key, Default: def, Rule: rule, Meaning: meaning, set: func(c *Config, v string) error {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return errors.New(rule)
		}
		*dst(c) = b
		return nil
	}}
}

// hostPort is host:port with a port number and without a scheme.
func hostPort(v string) bool {
	if strings.Contains(v, "/") {
		return false
	}
	h, p, ok := strings.Cut(v, ":")
	n, err := strconv.Atoi(p)
	return ok && h != "" && err == nil && n > 0 && n <= 65535 && !strings.Contains(p, ":")
}

// s3Bucket follows the S3 bucket naming rules: 3 to 63 lower-case
// letters, digits, dots and hyphens, starting and ending with a letter or
// digit.
func s3Bucket(v string) bool {
	if v == "" {
		return true
	}
	if len(v) < 3 || len(v) > 63 {
		return false
	}
	for i, r := range v {
		alnum := r >= 'a' && r <= 'z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || i == len(v)-1 || (r != '.' && r != '-')) {
			return false
		}
	}
	return true
}

func listenAddr(v string) bool {
	if v == "" {
		return false
	}
	i := strings.LastIndex(v, ":")
	if i < 0 {
		return false
	}
	p, err := strconv.Atoi(v[i+1:])
	return err == nil && p >= 0 && p <= 65535
}

// Settings is the settings table, in documentation order.
var Settings = []Setting{
	durSetting("ha.leaderSessionTimeout", "30s", failover.MinLeaderSessionTimeout, failover.MaxLeaderSessionTimeout,
		"Bound of the leader failover after a hard failure (T).", func(c *Config) *time.Duration { return &c.HA.LeaderSessionTimeout }),
	durSetting("ha.heartbeatInterval", "10s", time.Second, 5*time.Minute,
		"Interval of the replica registry heartbeat.", func(c *Config) *time.Duration { return &c.HA.HeartbeatInterval }),
	intSetting("ha.leaderLockKey", "7012024", math.MinInt64, math.MaxInt64,
		"Advisory lock key; change it only if another application on the same database uses it.", func(c *Config) *int64 { return &c.HA.LeaderLockKey }),
	strSetting("ha.replicaId", "", "must be at most 128 characters", "Name of this replica in the registry; empty means the host name.",
		func(s string) bool { return len(s) <= 128 }, func(c *Config) *string { return &c.HA.ReplicaID }),
	durSetting("server.shutdownTimeout", godur.Format(DefaultShutdownTimeout), time.Second, 10*time.Minute,
		"Time to drain on a planned stop (each of the two drain phases).", func(c *Config) *time.Duration { return &c.Server.ShutdownTimeout }),
	strSetting("server.opampListen", ":4320", "must be host:port", "Listen address of the OpAMP server (WebSocket and plain HTTP).",
		listenAddr, func(c *Config) *string { return &c.Server.OpAMPListen }),
	strSetting("server.opampPath", "/v1/opamp", "must start with /", "URL path of the OpAMP endpoint.",
		func(s string) bool { return strings.HasPrefix(s, "/") }, func(c *Config) *string { return &c.Server.OpAMPPath }),
	strSetting("server.httpListen", ":8080", "must be host:port", "Listen address of the REST API, the UI, /healthz, /readyz and /metrics.",
		listenAddr, func(c *Config) *string { return &c.Server.HTTPListen }),
	strSetting("server.tlsCertFile", "", "", "PEM certificate for the OpAMP listener; empty serves plain TCP.", nil,
		func(c *Config) *string { return &c.Server.TLSCertFile }),
	strSetting("server.tlsKeyFile", "", "", "PEM key for server.tlsCertFile.", nil,
		func(c *Config) *string { return &c.Server.TLSKeyFile }),
	strSetting("server.opampClientCaFile", "", "", "PEM CA bundle for OpAMP client certificates (mutual TLS, needs server.tlsCertFile): a certificate it signed authenticates the agent whose instance UID is the certificate's subject common name (or a urn:uuid: URI name). Empty: no client certificates.", nil,
		func(c *Config) *string { return &c.Server.OpAMPClientCAFile }),
	secret(strSetting("server.enrollmentSecret", "", "must be at least 16 characters", "Secret that agents send as `Authorization: Bearer <secret>` on the OpAMP connection to enroll; an agent that accepts OpAMP connection settings then gets its own credential. Required.",
		func(s string) bool { return len(s) >= 16 }, func(c *Config) *string { return &c.Server.EnrollmentSecret })),
	durSetting("server.lastSeenFlushInterval", "5s", 100*time.Millisecond, time.Minute,
		"How often last-seen times and agent events are written in one batch.", func(c *Config) *time.Duration { return &c.Server.LastSeenFlushInterval }),
	strSetting("server.httpTlsCertFile", "", "", "PEM certificate for the REST API/UI listener; empty serves plain HTTP. Read again when the file changes.", nil,
		func(c *Config) *string { return &c.Server.HTTPTLSCertFile }),
	strSetting("server.httpTlsKeyFile", "", "", "PEM key for server.httpTlsCertFile.", nil,
		func(c *Config) *string { return &c.Server.HTTPTLSKeyFile }),
	durSetting("server.httpReadHeaderTimeout", "10s", time.Second, 5*time.Minute,
		"Time a client of the API/UI listener has to send the request headers.", func(c *Config) *time.Duration { return &c.Server.HTTPReadHeaderTimeout }),
	durSetting("server.httpReadTimeout", "30s", time.Second, 10*time.Minute,
		"Time to read a whole API/UI request, body included.", func(c *Config) *time.Duration { return &c.Server.HTTPReadTimeout }),
	durSetting("server.httpWriteTimeout", "60s", time.Second, 10*time.Minute,
		"Time to write an API/UI response; for an artifact download, the longest time without progress (a download may take longer as long as it moves).", func(c *Config) *time.Duration { return &c.Server.HTTPWriteTimeout }),
	durSetting("server.httpIdleTimeout", "120s", time.Second, time.Hour,
		"How long an idle keep-alive API/UI connection stays open.", func(c *Config) *time.Duration { return &c.Server.HTTPIdleTimeout }),
	intSetting("server.maxRequestBytes", "4194304", 4096, 1<<30,
		"Largest API/UI request body in bytes; larger ones get 413.", func(c *Config) *int64 { return &c.Server.MaxRequestBytes }),
	intSetting("server.opampMaxMessageBytes", "4194304", 4096, 1<<30,
		"Largest OpAMP message in bytes after gzip decompression (plain-HTTP body or WebSocket message); larger ones close the connection.",
		func(c *Config) *int64 { return &c.Server.OpAMPMaxMessageBytes }),
	intSetting("server.authFailuresPerMinute", "30", 1, 1000000,
		"Failed authentications (API token, UI login, OpAMP secret or credential) one source address may make per minute at full speed; beyond it the source's checks are slowed (server.authFailurePenalty) while valid credentials from it are still accepted. Artifact downloads beyond it get 429 without a check.",
		func(c *Config) *int64 { return &c.Server.AuthFailuresPerMinute }),
	durSetting("server.uiSessionTtl", "12h", time.Minute, 30*24*time.Hour,
		"Lifetime of a UI login session (kept on the server; logout ends it).", func(c *Config) *time.Duration { return &c.Server.UISessionTTL }),
	// Agent identity and reports (internal/fleet/opampserver).
	intSetting("server.enrollmentsPerMinute", "600", 1, 1000000,
		"Enrollments of new instance UIDs with the enrollment secret one replica accepts per minute; beyond it the agent is refused and its source waits 30s (429 with Retry-After); counted in myriarch_opamp_enrollments_total{result=\"rate_limited\"}.",
		func(c *Config) *int64 { return &c.Server.EnrollmentsPerMinute }),
	heartbeatSetting("server.opampHeartbeatInterval", "0s",
		"Heartbeat interval offered to every agent with its credential (opamp-go applies it; over plain HTTP it becomes the poll interval). 0s: each agent keeps its own interval (a WebSocket agent is offered the interval its heartbeats show).",
		func(c *Config) *time.Duration { return &c.Server.OpAMPHeartbeatInterval }),
	intSetting("server.agentMaxAttributes", "256", 1, 100000,
		"Most identifying plus non-identifying attributes an agent may report; a larger description is refused whole with an error naming this setting.",
		func(c *Config) *int64 { return &c.Server.AgentMaxAttributes }),
	intSetting("server.agentMaxAttributeKeyBytes", "256", 1, 1<<20,
		"Longest attribute key in bytes an agent may report.",
		func(c *Config) *int64 { return &c.Server.AgentMaxAttributeKeyBytes }),
	intSetting("server.agentMaxAttributeValueBytes", "4096", 1, 1<<24,
		"Longest attribute value in bytes an agent may report.",
		func(c *Config) *int64 { return &c.Server.AgentMaxAttributeValueBytes }),
	intSetting("server.agentMaxEffectiveConfigBytes", "1048576", 1, 1<<30,
		"Largest effective config in bytes (all files) an agent may report.",
		func(c *Config) *int64 { return &c.Server.AgentMaxEffectiveConfigBytes }),
	intSetting("server.agentMaxHealthComponents", "1000", 1, 1000000,
		"Most component health entries (nested ones included) an agent may report.",
		func(c *Config) *int64 { return &c.Server.AgentMaxHealthComponents }),
	strSetting("server.trustedProxies", "", "must be a comma-separated list of IP addresses and CIDR prefixes",
		"Load balancers (HAProxy, nginx) in front of the replicas whose word on the client address is taken: from them, the right-most X-Forwarded-For address that is not itself a trusted proxy, or the address of a PROXY protocol v1/v2 header, is the source that server.authFailuresPerMinute counts. From any other peer both are ignored. Applies to the OpAMP and the API/UI listener. Empty: the peer address is the source.",
		func(s string) bool { _, err := authlimit.ParseProxies(s); return err == nil }, func(c *Config) *string { return &c.Server.TrustedProxies }),
	durSetting("server.authFailurePenalty", "1s", 100*time.Millisecond, time.Minute,
		"Once a source passed server.authFailuresPerMinute, its checks run one at a time and each failed one is answered 429 after this pause, holding the next: guessing slows to one per penalty. A valid token or credential is still accepted (one that worked before skips the queue).",
		func(c *Config) *time.Duration { return &c.Server.AuthFailurePenalty }),
	durSetting("server.requestTimeout", "5s", time.Second, 10*time.Minute,
		"Deadline of an API or UI request, token or session check included: during a database outage the request is answered 503 by then.",
		func(c *Config) *time.Duration { return &c.Server.RequestTimeout }),
	durSetting("server.opampBodyTimeout", "30s", time.Second, 10*time.Minute,
		"Time an authenticated plain-HTTP OpAMP request has to send its body; a slower one is cut (408).",
		func(c *Config) *time.Duration { return &c.Server.OpAMPBodyTimeout }),
	intSetting("server.opampBodyMinRate", "4096", 0, 1<<30,
		"Slowest plain-HTTP OpAMP body in bytes per second, averaged from two seconds after the headers; a slower one is cut (408). 0: only server.opampBodyTimeout.",
		func(c *Config) *int64 { return &c.Server.OpAMPBodyMinRate }),
	intSetting("server.opampBodyBytesInFlight", "67108864", 4096, 1<<40,
		"Bytes of plain-HTTP OpAMP bodies (after decompression) the OpAMP listener holds at once; a body that would pass it is answered 503 with Retry-After. At least server.opampBodyBytesPerSource.",
		func(c *Config) *int64 { return &c.Server.OpAMPBodyBytesInFlight }),
	intSetting("server.opampBodyBytesPerSource", "8388608", 4096, 1<<40,
		"Bytes of plain-HTTP OpAMP bodies one source address holds at once; beyond it 429 with Retry-After. At least server.opampMaxMessageBytes.",
		func(c *Config) *int64 { return &c.Server.OpAMPBodyBytesPerSource }),
	secret(strSetting("database.url", "", "must be a postgres:// URL or a key=value connection string", "PostgreSQL connection string. Required (not with --dev).",
		func(s string) bool {
			return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") || strings.Contains(s, "=")
		},
		func(c *Config) *string { return &c.Database.URL })),
	intSetting("database.maxConns", "20", 2, 1000,
		"Size of the pool of ordinary connections.", func(c *Config) *int64 { return &c.Database.MaxConns }),
	durSetting("agents.offlineAfter", "90s", 10*time.Second, 24*time.Hour,
		"The offline sweeper marks agents offline whose last-seen time is older; keep it above the agents' heartbeat (30s) plus server.lastSeenFlushInterval.",
		func(c *Config) *time.Duration { return &c.Agents.OfflineAfter }),
	durSetting("agents.eventRetention", "168h", time.Hour, 8760*time.Hour,
		"Housekeeping deletes agent events older than this.", func(c *Config) *time.Duration { return &c.Agents.EventRetention }),
	durSetting("agents.reconcileInterval", "30s", time.Second, 10*time.Minute,
		"Safety net of the event bus: how often a replica redelivers desired state that did not reach its agents.",
		func(c *Config) *time.Duration { return &c.Agents.ReconcileInterval }),
	intSetting("agents.reconnectsPerMinute", "30", 1, 100000,
		"WebSocket connections one instance UID may open per minute on one replica; beyond it the agent gets 429 with Retry-After (a duplicated UID cannot storm).",
		func(c *Config) *int64 { return &c.Agents.ReconnectsPerMinute }),
	durSetting("jobs.offlineSweepInterval", "15s", time.Second, time.Hour,
		"Interval of the offline sweeper (leader only).", func(c *Config) *time.Duration { return &c.Jobs.OfflineSweepInterval }),
	durSetting("jobs.housekeepingInterval", "10m", 10*time.Second, 24*time.Hour,
		"Interval of housekeeping (leader only).", func(c *Config) *time.Duration { return &c.Jobs.HousekeepingInterval }),
	durSetting("jobs.replicaRetention", "24h", time.Minute, 8760*time.Hour,
		"Housekeeping deletes replica registry rows without heartbeat for longer than this.",
		func(c *Config) *time.Duration { return &c.Jobs.ReplicaRetention }),
	durSetting("jobs.releaseTrackerInterval", "10s", time.Second, time.Hour,
		"How often the release tracker (leader only) looks for package sources whose own poll interval has passed.",
		func(c *Config) *time.Duration { return &c.Jobs.ReleaseTrackerInterval }),
	durSetting("jobs.artifactPrefetchInterval", "30s", time.Second, 24*time.Hour,
		"How often artifact prefetch (leader only) downloads missing blobs of tracked releases and applies retention.",
		func(c *Config) *time.Duration { return &c.Jobs.ArtifactPrefetchInterval }),
	intSetting("artifacts.keepVersions", "3", 1, 1000,
		"Blobs of this many newest versions per package are kept, plus those of every version an agent reports as installed.",
		func(c *Config) *int64 { return &c.Artifacts.KeepVersions }),
	strSetting("artifacts.publicUrl", "", "must be empty or an http:// or https:// URL",
		"Base URL at which agents reach the HTTP listener, used in the download URLs offered to them; empty means http://<host of the replica>:<port of server.httpListen>.",
		func(s string) bool {
			return s == "" || strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://")
		},
		func(c *Config) *string { return &c.Artifacts.PublicURL }),
	strSetting("artifacts.githubApiUrl", "", "must be empty or an http:// or https:// URL",
		"API of the github package sources: empty is api.github.com; for GitHub Enterprise https://<host>/api/v3/.",
		func(s string) bool {
			return s == "" || strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://")
		},
		func(c *Config) *string { return &c.Artifacts.GitHubAPIURL }),
	strSetting("artifacts.githubToken", "", "", "Token of the release tracker for the GitHub API (raises the rate limit, reads private repositories' release lists); prefer the environment variable.", nil,
		func(c *Config) *string { return &c.Artifacts.GitHubToken }),
	strSetting("artifacts.store", "postgres", "must be postgres or s3",
		"Where prefetched blobs are stored: postgres (large objects in the database, nothing else needed) or s3 (an S3-compatible object store, the artifacts.s3* settings). Blobs already stored stay where they are and are still served.",
		func(s string) bool { return s == "postgres" || s == "s3" }, func(c *Config) *string { return &c.Artifacts.Store }),
	intSetting("artifacts.segmentBytes", "8388608", 256<<10, 1<<30,
		"A download into PostgreSQL is committed every this many bytes, with its hash state, so that a new leader resumes it from there instead of from byte 0.",
		func(c *Config) *int64 { return &c.Artifacts.SegmentBytes }),
	strSetting("artifacts.s3Endpoint", "", "must be host:port (no scheme; TLS is artifacts.s3Tls)",
		"S3-compatible endpoint, for artifacts.store s3.",
		func(s string) bool { return s == "" || hostPort(s) }, func(c *Config) *string { return &c.Artifacts.S3Endpoint }),
	strSetting("artifacts.s3Bucket", "", "must be an S3 bucket name: 3 to 63 lower-case letters, digits, dots and hyphens, starting and ending with a letter or digit",
		"Bucket of the blobs (it must exist).", s3Bucket, func(c *Config) *string { return &c.Artifacts.S3Bucket }),
	strSetting("artifacts.s3Prefix", "myriarch/", "must not start with / and must be at most 512 characters",
		"Key prefix of the blobs in the bucket; retention deletes objects under <prefix>blobs/ that no blob names, so do not share it.",
		func(s string) bool { return !strings.HasPrefix(s, "/") && len(s) <= 512 }, func(c *Config) *string { return &c.Artifacts.S3Prefix }),
	strSetting("artifacts.s3Region", "", "", "Region of the bucket; empty asks the endpoint.", nil,
		func(c *Config) *string { return &c.Artifacts.S3Region }),
	strSetting("artifacts.s3AccessKey", "", "", "Access key id.", nil, func(c *Config) *string { return &c.Artifacts.S3AccessKey }),
	secret(strSetting("artifacts.s3SecretKey", "", "", "Secret access key; prefer the environment variable or artifacts.s3SecretKeyFile. Never logged.", nil,
		func(c *Config) *string { return &c.Artifacts.S3SecretKey })),
	strSetting("artifacts.s3SecretKeyFile", "", "", "File with the secret access key, read at start.", nil,
		func(c *Config) *string { return &c.Artifacts.S3SecretKeyFile }),
	boolSetting("artifacts.s3Tls", "true", "Speak https to the endpoint.", func(c *Config) *bool { return &c.Artifacts.S3TLS }),
	strSetting("artifacts.s3CaFile", "", "", "PEM CA bundle that verifies the endpoint's certificate besides the system's (needs artifacts.s3Tls).", nil,
		func(c *Config) *string { return &c.Artifacts.S3CAFile }),
	durSetting("jobs.rolloutInterval", "2s", 100*time.Millisecond, time.Minute,
		"Interval of the rollout planner and engine (leader only): how often each active rollout takes a step (reads reports, sends the next agents, opens the next wave).",
		func(c *Config) *time.Duration { return &c.Jobs.RolloutInterval }),
	strSetting("gitops.repoUrl", "", "must be an https://, http://, ssh://, file:// or user@host:path URL", "Git repository of configurations; empty disables GitOps polling.",
		func(s string) bool {
			return s == "" || strings.HasPrefix(s, "https://") || strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "ssh://") ||
				strings.HasPrefix(s, "file://") || (strings.Contains(s, "@") && strings.Contains(s, ":"))
		}, func(c *Config) *string { return &c.GitOps.RepoURL }),
	strSetting("gitops.ref", "main", "must not be empty", "Branch (or full reference such as refs/tags/prod) to poll.",
		func(s string) bool { return strings.TrimSpace(s) != "" }, func(c *Config) *string { return &c.GitOps.Ref }),
	strSetting("gitops.path", "", "must be a relative path", "Directory of the repository that holds myriarch-configs.yaml; empty is the root.",
		func(s string) bool { return !strings.HasPrefix(s, "/") && !strings.Contains(s, "..") }, func(c *Config) *string { return &c.GitOps.Path }),
	durSetting("gitops.pollInterval", "1m", time.Second, 24*time.Hour,
		"Time between polls of the repository (leader only); a webhook call polls at once.", func(c *Config) *time.Duration { return &c.GitOps.PollInterval }),
	strSetting("gitops.username", "git", "", "User name of HTTPS basic auth with gitops.token (GitLab: oauth2).", nil,
		func(c *Config) *string { return &c.GitOps.Username }),
	strSetting("gitops.token", "", "", "HTTPS access token; prefer the environment variable or gitops.tokenFile.", nil,
		func(c *Config) *string { return &c.GitOps.Token }),
	strSetting("gitops.tokenFile", "", "", "File with the HTTPS access token, read at every poll.", nil,
		func(c *Config) *string { return &c.GitOps.TokenFile }),
	strSetting("gitops.sshKeyFile", "", "", "Private SSH key (unencrypted PEM/OpenSSH) for ssh:// and user@host:path URLs.", nil,
		func(c *Config) *string { return &c.GitOps.SSHKeyFile }),
	strSetting("gitops.sshKnownHostsFile", "", "", "known_hosts file that verifies the SSH server; empty uses the system's (SSH_KNOWN_HOSTS, ~/.ssh/known_hosts).", nil,
		func(c *Config) *string { return &c.GitOps.SSHKnownHostsFile }),
	strSetting("gitops.webhookSecret", "", "must be empty or at least 16 characters", "Secret of POST /api/v1/gitops/webhook (HMAC-SHA256 for GitHub and Gitea, the token for GitLab); empty refuses webhook calls.",
		func(s string) bool { return s == "" || len(s) >= 16 }, func(c *Config) *string { return &c.GitOps.WebhookSecret }),
	boolSetting("telemetry.enabled", "true",
		"Offer agents that report their own metrics (OpAMP ReportsOwnMetrics) the OTLP/HTTP endpoint POST /v1/metrics on the OpAMP listener, authenticated with their own credential, and keep the rates of docs/myriarchd.md#telemetry.",
		func(c *Config) *bool { return &c.Telemetry.Enabled }),
	strSetting("telemetry.publicUrl", "", "must be empty or an http:// or https:// URL",
		"URL of the OTLP/HTTP metrics endpoint offered to agents (with its path, e.g. https://opamp.example.com/v1/metrics); empty: the address the agent used for OpAMP, with http(s) and the path /v1/metrics.",
		func(s string) bool {
			return s == "" || strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://")
		}, func(c *Config) *string { return &c.Telemetry.PublicURL }),
	durSetting("telemetry.flushInterval", "10s", 100*time.Millisecond, time.Minute,
		"How often received own metrics are written in one batch.", func(c *Config) *time.Duration { return &c.Telemetry.FlushInterval }),
	durSetting("telemetry.fineResolution", "10s", time.Second, 10*time.Minute,
		"Bucket of the fine tier: one value per series and bucket (the last sent).", func(c *Config) *time.Duration { return &c.Telemetry.FineResolution }),
	durSetting("telemetry.fineRetention", "1h", time.Minute, 7*24*time.Hour,
		"How long the fine tier is kept; windows up to it are read from it.", func(c *Config) *time.Duration { return &c.Telemetry.FineRetention }),
	durSetting("telemetry.coarseResolution", "1m", 10*time.Second, time.Hour,
		"Bucket of the coarse tier; also the interval of the leader's telemetry job (fleet sums, retention).", func(c *Config) *time.Duration { return &c.Telemetry.CoarseResolution }),
	durSetting("telemetry.coarseRetention", "168h", time.Hour, 8760*time.Hour,
		"How long the coarse tier and the fleet sums are kept; the longest window the API answers.", func(c *Config) *time.Duration { return &c.Telemetry.CoarseRetention }),
	intSetting("telemetry.maxSeriesPerAgent", "256", 1, 100000,
		"Most series one agent keeps (a series is a catalog name and a component); further ones are dropped and counted in myriarch_telemetry_samples_dropped_total.",
		func(c *Config) *int64 { return &c.Telemetry.MaxSeriesPerAgent }),
	strSetting("log.level", "info", "must be one of debug, info, warn, error", "Log level.",
		func(s string) bool { return slices.Contains([]string{"debug", "info", "warn", "error"}, s) }, func(c *Config) *string { return &c.Log.Level }),
	strSetting("log.format", "text", "must be text or json", "Log format.",
		func(s string) bool { return s == "text" || s == "json" }, func(c *Config) *string { return &c.Log.Format }),
}

// secret marks a setting whose value is never echoed.
func secret(s Setting) Setting { s.Secret = true; return s }

// Lookup returns the setting of key (case-insensitive).
func Lookup(key string) (Setting, bool) {
	for _, s := range Settings {
		if strings.EqualFold(s.Key, key) {
			return s, true
		}
	}
	return Setting{}, false
}

// OtherEnv are the MYRIARCH_* environment variables that are not settings
// but that myriarchd's commands read (the file of serve, migrate, token
// bootstrap and budget; the server, token, CA and contexts file of the
// commands that call the API). Load accepts them;
// every other MYRIARCH_* variable that names no setting is refused.
var OtherEnv = []string{"MYRIARCH_CONFIG", "MYRIARCH_SERVER", "MYRIARCH_TOKEN", "MYRIARCH_CA_FILE", "MYRIARCH_CONTEXTS"}

// looksLikeASetting reports whether name, a MYRIARCH_* variable that is no
// setting, was meant as one: it starts with a section of the settings
// (MYRIARCH_SERVER_..., MYRIARCH_HA_...) or is within three edits of a
// setting's variable. Other MYRIARCH_* variables belong to something else
// on the host and are left alone: the bridge's *_env secrets (the examples
// name them MYRIARCH_SOURCE_PASSWORD), the benchmarks' MYRIARCH_BENCH_*.
func looksLikeASetting(name string) bool {
	for _, s := range Settings {
		section, _, _ := strings.Cut(s.Key, ".")
		if strings.HasPrefix(name, "MYRIARCH_"+strings.ToUpper(section)+"_") || editDistance(name, s.Env()) <= 3 {
			return true
		}
	}
	return false
}

// unknownEnvRule is the refusal of an unknown MYRIARCH_* variable, naming
// the known variable (and its key) nearest to it in edit distance.
func unknownEnvRule(name string) string {
	best, bestD := Setting{}, -1
	for _, s := range Settings {
		if d := editDistance(name, s.Env()); bestD < 0 || d < bestD {
			best, bestD = s, d
		}
	}
	return fmt.Sprintf("unknown environment variable (no setting has it); the nearest known one is %s (key %s)", best.Env(), best.Key)
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// FieldError is one refused value.
type FieldError = failover.FieldError

// Source is where configuration comes from.
type Source struct {
	// File is a YAML file; empty for none.
	File string
	// YAML is inline YAML, used after File (for tests).
	YAML []byte
	// Environ is the environment as KEY=VALUE; nil means os.Environ().
	Environ []string
	// Overrides are key → value applied last (command-line flags).
	Overrides map[string]string
	// Optional names keys whose "required" rule is waived (e.g. database.url
	// with --dev, which provides its own).
	Optional []string
}

var required = []string{"database.url", "server.enrollmentSecret"}

// Load resolves the configuration: defaults, then the file, then the
// environment, then the overrides. All problems are returned together.
func Load(src Source) (*Config, error) {
	values := map[string]string{}
	origin := map[string]string{}
	var errs []error
	for _, s := range Settings {
		values[s.Key] = s.Default
		origin[s.Key] = "default"
	}
	readYAML := func(name string, data []byte) {
		flat, err := flattenYAML(data)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			return
		}
		keys := make([]string, 0, len(flat))
		for k := range flat {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			s, ok := Lookup(k)
			if !ok {
				// The value is not shown: a misspelt secret key would echo the secret.
				errs = append(errs, &FieldError{Field: k, Value: "(not shown)", Rule: "unknown key (" + name + ")"})
				continue
			}
			values[s.Key] = flat[k]
			origin[s.Key] = name
		}
	}
	if src.File != "" {
		data, err := os.ReadFile(src.File)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		readYAML(src.File, data)
	}
	if src.YAML != nil {
		readYAML("yaml", src.YAML)
	}
	env := src.Environ
	if env == nil {
		env = os.Environ()
	}
	known := map[string]Setting{}
	for _, s := range Settings {
		known[s.Env()] = s
	}
	var unknownEnv []string
	for _, kv := range env {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, "MYRIARCH_") {
			continue
		}
		if s, ok := known[name]; ok {
			values[s.Key] = val
			origin[s.Key] = name
		} else if !slices.Contains(OtherEnv, name) && looksLikeASetting(name) {
			unknownEnv = append(unknownEnv, name)
		}
	}
	slices.Sort(unknownEnv)
	for _, name := range unknownEnv {
		// A misspelt variable would otherwise leave its key at the default
		// without a word; the value is not shown (it may be a secret).
		errs = append(errs, &FieldError{Field: name, Value: "(not shown)", Rule: unknownEnvRule(name)})
	}
	for k, v := range src.Overrides {
		s, ok := Lookup(k)
		if !ok {
			errs = append(errs, &FieldError{Field: k, Value: "(not shown)", Rule: "unknown key"})
			continue
		}
		values[s.Key] = v
		origin[s.Key] = "flag"
	}
	c := &Config{}
	for _, s := range Settings {
		v := values[s.Key]
		if v == "" && slices.Contains(required, s.Key) {
			if !slices.Contains(src.Optional, s.Key) {
				errs = append(errs, &FieldError{Field: s.Key, Value: `""`, Rule: "is required (set it in the file or " + s.Env() + ")"})
			}
			continue
		}
		if v == "" && s.Default == "" {
			continue
		}
		if err := s.set(c, v); err != nil {
			shown := fmt.Sprintf("%q", v)
			if s.Secret {
				shown = fmt.Sprintf("(redacted, %d characters)", len(v))
			}
			errs = append(errs, &FieldError{Field: s.Key, Value: shown + " (from " + origin[s.Key] + ")", Rule: err.Error()})
		}
	}
	if len(errs) == 0 {
		errs = append(errs, c.crossCheck()...)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if c.HA.ReplicaID == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "myriarchd"
		}
		c.HA.ReplicaID = h
	}
	return c, nil
}

func (c *Config) crossCheck() []error {
	var errs []error
	if (c.Server.TLSCertFile == "") != (c.Server.TLSKeyFile == "") {
		errs = append(errs, &FieldError{Field: "server.tlsKeyFile", Value: fmt.Sprintf("%q", c.Server.TLSKeyFile),
			Rule: "server.tlsCertFile and server.tlsKeyFile must be set together"})
	}
	if c.Server.OpAMPClientCAFile != "" && c.Server.TLSCertFile == "" {
		errs = append(errs, &FieldError{Field: "server.opampClientCaFile", Value: fmt.Sprintf("%q", c.Server.OpAMPClientCAFile),
			Rule: "needs server.tlsCertFile and server.tlsKeyFile (client certificates need TLS)"})
	}
	if (c.Server.HTTPTLSCertFile == "") != (c.Server.HTTPTLSKeyFile == "") {
		errs = append(errs, &FieldError{Field: "server.httpTlsKeyFile", Value: fmt.Sprintf("%q", c.Server.HTTPTLSKeyFile),
			Rule: "server.httpTlsCertFile and server.httpTlsKeyFile must be set together"})
	}
	if c.Agents.OfflineAfter <= 2*c.Server.LastSeenFlushInterval {
		errs = append(errs, &FieldError{Field: "agents.offlineAfter", Value: c.Agents.OfflineAfter.String(),
			Rule: fmt.Sprintf("must be more than 2 × server.lastSeenFlushInterval (%v)", 2*c.Server.LastSeenFlushInterval)})
	}
	if c.Server.OpAMPBodyBytesPerSource < c.Server.OpAMPMaxMessageBytes {
		errs = append(errs, &FieldError{Field: "server.opampBodyBytesPerSource", Value: strconv.FormatInt(c.Server.OpAMPBodyBytesPerSource, 10),
			Rule: fmt.Sprintf("must be at least server.opampMaxMessageBytes (%d), or no message that large could arrive", c.Server.OpAMPMaxMessageBytes)})
	}
	if c.Server.OpAMPBodyBytesInFlight < c.Server.OpAMPBodyBytesPerSource {
		errs = append(errs, &FieldError{Field: "server.opampBodyBytesInFlight", Value: strconv.FormatInt(c.Server.OpAMPBodyBytesInFlight, 10),
			Rule: fmt.Sprintf("must be at least server.opampBodyBytesPerSource (%d)", c.Server.OpAMPBodyBytesPerSource)})
	}
	if _, err := c.keepalive(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.Telemetry.check()...)
	return append(errs, c.Artifacts.check()...)
}

func (t Telemetry) check() []error {
	var errs []error
	if t.CoarseResolution%t.FineResolution != 0 {
		errs = append(errs, &FieldError{Field: "telemetry.coarseResolution", Value: t.CoarseResolution.String(),
			Rule: fmt.Sprintf("must be a multiple of telemetry.fineResolution (%v)", t.FineResolution)})
	}
	if t.FineResolution%time.Second != 0 || t.CoarseResolution%time.Second != 0 {
		errs = append(errs, &FieldError{Field: "telemetry.fineResolution", Value: t.FineResolution.String(),
			Rule: "telemetry.fineResolution and telemetry.coarseResolution must be whole seconds"})
	}
	if t.FineRetention < 3*t.FineResolution {
		errs = append(errs, &FieldError{Field: "telemetry.fineRetention", Value: t.FineRetention.String(),
			Rule: fmt.Sprintf("must be at least 3 × telemetry.fineResolution (%v)", 3*t.FineResolution)})
	}
	if t.CoarseRetention < t.FineRetention {
		errs = append(errs, &FieldError{Field: "telemetry.coarseRetention", Value: t.CoarseRetention.String(),
			Rule: fmt.Sprintf("must be at least telemetry.fineRetention (%v)", t.FineRetention)})
	}
	return errs
}

func (a Artifacts) check() []error {
	var errs []error
	if a.S3SecretKey != "" && a.S3SecretKeyFile != "" {
		errs = append(errs, &FieldError{Field: "artifacts.s3SecretKeyFile", Value: fmt.Sprintf("%q", a.S3SecretKeyFile),
			Rule: "set artifacts.s3SecretKey or artifacts.s3SecretKeyFile, not both"})
	}
	if a.S3CAFile != "" && !a.S3TLS {
		errs = append(errs, &FieldError{Field: "artifacts.s3CaFile", Value: fmt.Sprintf("%q", a.S3CAFile), Rule: "needs artifacts.s3Tls true"})
	}
	if a.Store != "s3" {
		return errs
	}
	for _, f := range []struct{ key, v string }{
		{"artifacts.s3Endpoint", a.S3Endpoint}, {"artifacts.s3Bucket", a.S3Bucket}, {"artifacts.s3AccessKey", a.S3AccessKey},
	} {
		if f.v == "" {
			errs = append(errs, &FieldError{Field: f.key, Value: `""`, Rule: "is required with artifacts.store s3"})
		}
	}
	if a.S3SecretKey == "" && a.S3SecretKeyFile == "" {
		errs = append(errs, &FieldError{Field: "artifacts.s3SecretKey", Value: `""`,
			Rule: "artifacts.s3SecretKey (or " + EnvName("artifacts.s3SecretKey") + ") or artifacts.s3SecretKeyFile is required with artifacts.store s3"})
	}
	return errs
}

// Keepalive is the lock-session derivation for this configuration.
func (c *Config) Keepalive() failover.LeaderKeepalive {
	k, _ := c.keepalive() // checked by Load
	return k
}

// keepalive is the one call of the derivation, its refusal named by
// myriarchd's key.
func (c *Config) keepalive() (failover.LeaderKeepalive, error) {
	k, err := failover.DeriveLeaderKeepalive(c.HA.LeaderSessionTimeout)
	return k, failover.RenameFields(err, map[string]string{"LeaderSessionTimeout": "ha.leaderSessionTimeout"})
}

// flattenYAML turns a two-level YAML mapping into section.key → scalar.
func flattenYAML(data []byte) (map[string]string, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, err
	}
	out := map[string]string{}
	if len(root.Content) == 0 {
		return out, nil
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: the top level must be a mapping of sections", doc.Line)
	}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		sec, body := doc.Content[i], doc.Content[i+1]
		if body.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("line %d: %s must be a mapping", body.Line, sec.Value)
		}
		for j := 0; j+1 < len(body.Content); j += 2 {
			k, v := body.Content[j], body.Content[j+1]
			if v.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: %s.%s must be a single value", v.Line, sec.Value, k.Value)
			}
			out[sec.Value+"."+k.Value] = v.Value
		}
	}
	return out, nil
}

// MarkdownTable renders the settings table of docs/configuration.md.
func MarkdownTable() string {
	var b strings.Builder
	b.WriteString("| Key | Environment variable | Default | Accepted | Meaning |\n|---|---|---|---|---|\n")
	for _, s := range Settings {
		def := "`" + s.Default + "`"
		if s.Default == "" {
			def = "(empty)"
		}
		rule := s.Rule
		if rule == "" {
			rule = "any"
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s | %s |\n", s.Key, s.Env(), def, rule, s.Meaning)
	}
	return b.String()
}

// heartbeatSetting is a duration of whole seconds within [1s, 24h], or 0s
// for "not set" (OpAMP offers heartbeat intervals in whole seconds).
func heartbeatSetting(key, def, meaning string, dst func(*Config) *time.Duration) Setting {
	const rule = "must be 0s (unset) or a whole number of seconds within [1s, 24h]"
	return Setting{Key: key, Default: def, Rule: rule, Meaning: meaning, set: func(c *Config, v string) error {
		d, err := godur.Parse(v)
		if err != nil {
			return err
		}
		if d != 0 && (d < time.Second || d > 24*time.Hour || d%time.Second != 0) {
			return errors.New(rule)
		}
		*dst(c) = d
		return nil
	}}
}
