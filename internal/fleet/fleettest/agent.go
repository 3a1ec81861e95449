// Package fleettest has a real OpAMP agent (an opamp-go client) for tests
// and for the load tool.
package fleettest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-telemetry/opamp-go/client"
	"github.com/open-telemetry/opamp-go/client/types"
	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/testwait"
)

// AgentOptions configure an Agent.
type AgentOptions struct {
	// URL is ws://host:port/v1/opamp or http://host:port/v1/opamp.
	URL    string
	Secret string
	// HTTP selects the plain-HTTP transport.
	HTTP bool
	// Attrs are identifying attributes; "service.name" defaults to "test-agent".
	Attrs map[string]string
	// Heartbeat; 0 keeps the client default (30s), for HTTP the poll interval.
	Heartbeat time.Duration
	// FailConfig makes the agent report every remote config as failed.
	FailConfig bool
	// FailWhen, when not empty, makes the agent report as failed every
	// remote config whose body contains it (a revision broken on purpose).
	FailWhen string
	// UnhealthyWhen, when not empty, makes the agent apply a remote config
	// whose body contains it and then report itself unhealthy (a revision
	// that applies but breaks the agent); other configs make it healthy.
	UnhealthyWhen string
	// UID; zero picks a random one.
	UID types.InstanceUid
	// TLS for wss:// and https:// URLs.
	TLS *tls.Config
	// OnCommand, when set, receives server commands (restart), and the
	// agent declares AcceptsRestartCommand.
	OnCommand func(*protobufs.ServerToAgentCommand)
	// Credential makes the agent accept OpAMP connection settings: it
	// keeps the credential that myriarchd offers and presents it instead
	// of Secret from its next connection on, and takes a new instance UID
	// when told to.
	Credential bool
	// OwnMetrics declares ReportsOwnMetrics and keeps the own_metrics
	// destination myriarchd offers (OwnMetrics).
	OwnMetrics bool
}

// Agent is a running opamp-go client that applies remote configs.
type Agent struct {
	UID    types.InstanceUid
	Client client.OpAMPClient

	stopOnce sync.Once
	stopErr  error

	connected  atomic.Int64 // OnConnect calls
	connectErr atomic.Int64

	mu      sync.Mutex
	configs []string
	hash    []byte
	cred    string
	curUID  types.InstanceUid
	offers  int
	own     *protobufs.TelemetryConnectionSettings
}

// OwnMetrics is the last own_metrics destination offered, or nil.
func (a *Agent) OwnMetrics() *protobufs.TelemetryConnectionSettings {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.own
}

// StartAgent starts an agent. Stop it with Stop.
func StartAgent(ctx context.Context, o AgentOptions) (*Agent, error) {
	a := &Agent{UID: o.UID}
	if a.UID == (types.InstanceUid{}) {
		_, _ = rand.Read(a.UID[:])
		a.UID[6] = (a.UID[6] & 0x0f) | 0x40
		a.UID[8] = (a.UID[8] & 0x3f) | 0x80
	}
	if o.HTTP {
		a.Client = client.NewHTTP(nil)
	} else {
		a.Client = client.NewWebSocket(nil)
	}
	attrs := map[string]string{"service.name": "test-agent"}
	for k, v := range o.Attrs {
		attrs[k] = v
	}
	var kvs []*protobufs.KeyValue
	for k, v := range attrs {
		kvs = append(kvs, &protobufs.KeyValue{Key: k, Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_StringValue{StringValue: v}}})
	}
	if err := a.Client.SetAgentDescription(&protobufs.AgentDescription{IdentifyingAttributes: kvs,
		NonIdentifyingAttributes: []*protobufs.KeyValue{{Key: "os.type", Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_StringValue{StringValue: "linux"}}}}}); err != nil {
		return nil, err
	}
	if err := a.Client.SetHealth(&protobufs.ComponentHealth{Healthy: true, Status: "ok", StartTimeUnixNano: uint64(time.Now().UnixNano())}); err != nil {
		return nil, err
	}
	caps := protobufs.AgentCapabilities_AgentCapabilities_ReportsStatus | protobufs.AgentCapabilities_AgentCapabilities_AcceptsRemoteConfig |
		protobufs.AgentCapabilities_AgentCapabilities_ReportsRemoteConfig | protobufs.AgentCapabilities_AgentCapabilities_ReportsHealth |
		protobufs.AgentCapabilities_AgentCapabilities_ReportsEffectiveConfig
	if o.Heartbeat > 0 {
		caps |= protobufs.AgentCapabilities_AgentCapabilities_ReportsHeartbeat
	}
	if o.OnCommand != nil {
		caps |= protobufs.AgentCapabilities_AgentCapabilities_AcceptsRestartCommand
	}
	if o.Credential {
		caps |= protobufs.AgentCapabilities_AgentCapabilities_AcceptsOpAMPConnectionSettings
	}
	if o.OwnMetrics {
		caps |= protobufs.AgentCapabilities_AgentCapabilities_ReportsOwnMetrics
	}
	a.curUID = a.UID
	if err := a.Client.SetCapabilities(&caps); err != nil {
		return nil, err
	}
	settings := types.StartSettings{
		OpAMPServerURL: o.URL,
		Header:         http.Header{"Authorization": []string{"Bearer " + o.Secret}},
		HeaderFunc: func(h http.Header) http.Header {
			if c := a.Credential(); c != "" {
				h.Set("Authorization", "Bearer "+c)
			}
			return h
		},
		InstanceUid: a.UID,
		TLSConfig:   o.TLS,
		Callbacks: types.Callbacks{
			OnOpampConnectionSettings: func(_ context.Context, s *protobufs.OpAMPConnectionSettings) error {
				for _, h := range s.GetHeaders().GetHeaders() {
					if h.Key == "Authorization" {
						a.mu.Lock()
						a.cred, _ = strings.CutPrefix(h.Value, "Bearer ")
						a.offers++
						a.mu.Unlock()
					}
				}
				return nil
			},
			OnConnectionSettings: func(_ context.Context, s *protobufs.ConnectionSettingsOffers) error {
				if s.GetOwnMetrics() != nil {
					a.mu.Lock()
					a.own = s.GetOwnMetrics()
					a.mu.Unlock()
				}
				return nil
			},
			OnConnect:       func(context.Context) { a.connected.Add(1) },
			OnConnectFailed: func(context.Context, error) { a.connectErr.Add(1) },
			OnCommand: func(_ context.Context, c *protobufs.ServerToAgentCommand) error {
				if o.OnCommand != nil {
					o.OnCommand(c)
				}
				return nil
			},
			OnMessage: func(ctx context.Context, msg *types.MessageData) {
				if id := msg.AgentIdentification; id != nil && len(id.NewInstanceUid) == 16 {
					a.mu.Lock()
					a.curUID = types.InstanceUid(id.NewInstanceUid)
					a.mu.Unlock()
				}
				if msg.RemoteConfig == nil {
					return
				}
				body := ""
				if f := msg.RemoteConfig.Config.GetConfigMap()[""]; f != nil {
					body = string(f.Body)
				}
				a.mu.Lock()
				a.configs = append(a.configs, body)
				a.hash = msg.RemoteConfig.ConfigHash
				a.mu.Unlock()
				if o.UnhealthyWhen != "" {
					h := &protobufs.ComponentHealth{Healthy: true, Status: "ok", StartTimeUnixNano: uint64(time.Now().UnixNano())}
					if strings.Contains(body, o.UnhealthyWhen) {
						h = &protobufs.ComponentHealth{Healthy: false, Status: "crashing", LastError: "pipeline broken by the new config",
							StartTimeUnixNano: uint64(time.Now().UnixNano())}
					}
					_ = a.Client.SetHealth(h)
				}
				st := protobufs.RemoteConfigStatuses_RemoteConfigStatuses_APPLIED
				errMsg := ""
				if o.FailConfig || (o.FailWhen != "" && strings.Contains(body, o.FailWhen)) {
					st, errMsg = protobufs.RemoteConfigStatuses_RemoteConfigStatuses_FAILED, "refused by test agent"
				}
				_ = a.Client.SetRemoteConfigStatus(&protobufs.RemoteConfigStatus{LastRemoteConfigHash: msg.RemoteConfig.ConfigHash, Status: st, ErrorMessage: errMsg})
				_ = a.Client.UpdateEffectiveConfig(ctx)
			},
			GetEffectiveConfig: func(context.Context) (*protobufs.EffectiveConfig, error) {
				a.mu.Lock()
				defer a.mu.Unlock()
				body := "initial: true\n"
				if len(a.configs) > 0 {
					body = a.configs[len(a.configs)-1]
				}
				return &protobufs.EffectiveConfig{ConfigMap: &protobufs.AgentConfigMap{ConfigMap: map[string]*protobufs.AgentConfigFile{"": {Body: []byte(body)}}}}, nil
			},
		},
	}
	if o.Heartbeat > 0 {
		hb := o.Heartbeat
		settings.HeartbeatInterval = &hb
	}
	if err := a.Client.Start(ctx, settings); err != nil {
		return nil, err
	}
	return a, nil
}

// Configs returns the remote config bodies received so far.
func (a *Agent) Configs() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.configs...)
}

// Credential is the agent credential myriarchd offered last ("" before).
func (a *Agent) Credential() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cred
}

// CredentialOffers counts the credentials received.
func (a *Agent) CredentialOffers() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.offers
}

// CurrentUID is the instance UID the agent uses now (a new one when
// myriarchd told it to take one).
func (a *Agent) CurrentUID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return uidString(a.curUID)
}

// Connects is how often the agent connected.
func (a *Agent) Connects() int64 { return a.connected.Load() }

// ConnectFailures is how often a connection attempt failed.
func (a *Agent) ConnectFailures() int64 { return a.connectErr.Load() }

// Stop stops the client; a second call returns the first one's result
// (opamp-go's Stop blocks forever when called twice).
func (a *Agent) Stop(ctx context.Context) error {
	a.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		a.stopErr = a.Client.Stop(ctx)
	})
	return a.stopErr
}

// UIDString is the uid as myriarchd shows it.
func (a *Agent) UIDString() string { return uidString(a.UID) }

func uidString(u types.InstanceUid) string {
	const hexd = "0123456789abcdef"
	b := make([]byte, 0, 36)
	for i, x := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, hexd[x>>4], hexd[x&15])
	}
	return string(b)
}

// Eventually reports whether cond holds within timeout (testwait.Eventually).
func Eventually(timeout time.Duration, cond func() bool) bool {
	return testwait.Eventually(timeout, cond)
}
