// Package opamp makes the bridge an agent of myriarchd: an opamp-go client
// that reports the bridge (agent description, health with one component
// per session, the effective configuration with secrets redacted, the
// remote-configuration status) and applies the configurations myriarchd
// sends.
//
// A remote configuration goes through the same path as SIGHUP: it is
// validated exactly like `myriarch-bridge check` (admission included), and
// a refused one is reported FAILED with every problem, one per line, and
// changes nothing; an accepted one replaces the configuration file
// atomically and is applied by reload (runtime.Bridge.ApplyFile). The
// server manages the bridge's sessions and routes, not how the bridge
// reaches the server: a remote configuration without an opamp block keeps
// the local one.
//
// The instance uid is kept in state_dir, so a restarted bridge is the same
// agent to myriarchd.
package opamp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/open-telemetry/opamp-go/client"
	"github.com/open-telemetry/opamp-go/client/types"
	"github.com/open-telemetry/opamp-go/protobufs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/myriarch/myriarch/internal/bridge/config"
	"github.com/myriarch/myriarch/internal/bridge/mqttconn"
	"github.com/myriarch/myriarch/internal/bridge/runtime"
)

// ServiceName is the agent's service.name.
const ServiceName = "myriarch-bridge"

// Bridge is what the client reports and drives; *runtime.Bridge.
type Bridge interface {
	Status() runtime.Status
	ApplyFile(ctx context.Context, path string, data []byte, write bool) (config.Diff, error)
}

// Options configure a Client.
type Options struct {
	Settings *config.OpAMPSettings
	// File is the configuration file: reported as the effective
	// configuration, replaced by accepted remote configurations.
	File       string
	StateDir   string
	BridgeID   string
	InstanceID string
	Version    string
	Bridge     Bridge
	Logger     *slog.Logger
	// HealthEvery is how often the sessions are sampled for the health
	// report (sent only when it changed); 0 is 1s.
	HealthEvery time.Duration
	// Gatherer is the bridge's metrics registry: with it the bridge
	// reports its own metrics where myriarchd offers (ownmetrics.go),
	// every OwnMetricsInterval (0: DefaultOwnMetricsInterval).
	Gatherer           prometheus.Gatherer
	OwnMetricsInterval time.Duration
}

// Client is a running OpAMP client.
type Client struct {
	o   Options
	log *slog.Logger
	cli client.OpAMPClient
	uid types.InstanceUid

	pending chan *protobufs.AgentRemoteConfig // latest wins
	stop    chan struct{}
	wg      sync.WaitGroup

	mu         sync.Mutex
	lastHealth string
	stopped    bool
	credential string // offered by myriarchd; replaces the enrollment secret

	own *ownMetrics // nil without Options.Gatherer
}

// Start connects to myriarchd in the background (opamp-go retries) and
// starts the client's reporting and applying goroutines; Stop ends them.
func Start(ctx context.Context, o Options) (*Client, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.HealthEvery <= 0 {
		o.HealthEvery = time.Second
	}
	c := &Client{o: o, log: o.Logger.With("component", "opamp"), pending: make(chan *protobufs.AgentRemoteConfig, 1),
		stop: make(chan struct{})}
	uid, err := LoadOrCreateUID(c.uidFile())
	if err != nil {
		return nil, err
	}
	c.uid = uid
	if b, err := os.ReadFile(c.credentialFile()); err == nil {
		c.credential = strings.TrimSpace(string(b))
	}
	s := o.Settings
	if strings.HasPrefix(s.ServerURL, "http") {
		c.cli = client.NewHTTP(nil)
	} else {
		c.cli = client.NewWebSocket(nil)
	}
	host, _ := os.Hostname()
	if err := c.cli.SetAgentDescription(&protobufs.AgentDescription{
		IdentifyingAttributes: kvs("service.name", ServiceName, "service.instance.id", o.InstanceID, "service.version", o.Version),
		NonIdentifyingAttributes: kvs("myriarch.bridge.id", o.BridgeID, "host.name", host, "os.type", "linux",
			"myriarch.bridge.config_file", o.File),
	}); err != nil {
		return nil, err
	}
	if err := c.cli.SetHealth(c.health()); err != nil {
		return nil, err
	}
	caps := protobufs.AgentCapabilities_AgentCapabilities_ReportsStatus | protobufs.AgentCapabilities_AgentCapabilities_AcceptsRemoteConfig |
		protobufs.AgentCapabilities_AgentCapabilities_ReportsRemoteConfig | protobufs.AgentCapabilities_AgentCapabilities_ReportsHealth |
		protobufs.AgentCapabilities_AgentCapabilities_ReportsEffectiveConfig |
		protobufs.AgentCapabilities_AgentCapabilities_AcceptsOpAMPConnectionSettings
	if s.HeartbeatInterval > 0 {
		caps |= protobufs.AgentCapabilities_AgentCapabilities_ReportsHeartbeat
	}
	tc, err := mqttconn.TLSConfig(tlsFiles(s.TLS))
	if err != nil {
		return nil, fmt.Errorf("opamp.tls: %w", err)
	}
	onSettings := func(context.Context, *protobufs.ConnectionSettingsOffers) error { return nil }
	if o.Gatherer != nil {
		c.own = newOwnMetrics(c, o.Gatherer, o.OwnMetricsInterval, tc)
		caps |= protobufs.AgentCapabilities_AgentCapabilities_ReportsOwnMetrics
		onSettings = c.own.onConnectionSettings
	}
	if err := c.cli.SetCapabilities(&caps); err != nil {
		return nil, err
	}
	settings := types.StartSettings{
		OpAMPServerURL: s.ServerURL,
		Header:         http.Header{"Authorization": []string{"Bearer " + s.EnrollmentSecret.Reveal()}},
		// A credential myriarchd offered replaces the enrollment secret
		// from the next connection on, and after restarts.
		HeaderFunc: func(h http.Header) http.Header {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.credential != "" {
				h.Set("Authorization", "Bearer "+c.credential)
			}
			return h
		},
		InstanceUid: uid,
		TLSConfig:   tc,
		Callbacks: types.Callbacks{
			OnOpampConnectionSettings: c.onConnectionSettings,
			OnConnectionSettings:      onSettings,
			OnConnect:                 func(context.Context) { c.log.Info("connected to myriarchd", "url", s.ServerURL) },
			OnConnectFailed:           func(_ context.Context, err error) { c.log.Debug("connecting to myriarchd", "err", err) },
			OnError: func(_ context.Context, e *protobufs.ServerErrorResponse) {
				c.log.Warn("myriarchd reported an error", "message", e.GetErrorMessage())
			},
			OnMessage:          c.onMessage,
			GetEffectiveConfig: c.effectiveConfig,
		},
	}
	if s.HeartbeatInterval > 0 {
		hb := s.HeartbeatInterval
		settings.HeartbeatInterval = &hb
	}
	if err := c.cli.Start(ctx, settings); err != nil {
		return nil, err
	}
	c.wg.Add(2)
	go c.reportHealth()
	go c.applyLoop()
	if c.own != nil {
		c.wg.Add(1)
		go c.own.run()
	}
	c.log.Info("OpAMP client started", "url", s.ServerURL, "instance_uid", UIDString(uid))
	return c, nil
}

// OwnMetricsSent is how many exports of its own metrics succeeded.
func (c *Client) OwnMetricsSent() int {
	if c.own == nil {
		return 0
	}
	return c.own.Sends()
}

// UID is the agent's instance uid.
func (c *Client) UID() types.InstanceUid { return c.uid }

// Stop stops the goroutines and the opamp-go client; it is safe to call
// twice (opamp-go's own Stop is not).
func (c *Client) Stop(ctx context.Context) error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	c.mu.Unlock()
	close(c.stop)
	c.wg.Wait()
	return c.cli.Stop(ctx)
}

func (c *Client) uidFile() string {
	return filepath.Join(c.o.StateDir, c.o.BridgeID+"-opamp-instance-uid")
}

func (c *Client) credentialFile() string {
	return filepath.Join(c.o.StateDir, c.o.BridgeID+"-opamp-credential")
}

// onConnectionSettings accepts the per-agent credential myriarchd offers
// (an Authorization header) and keeps it in state_dir (mode 0600), so
// that restarts use it too. Other offered settings are not applied.
func (c *Client) onConnectionSettings(_ context.Context, s *protobufs.OpAMPConnectionSettings) error {
	for _, h := range s.GetHeaders().GetHeaders() {
		if !strings.EqualFold(h.Key, "Authorization") {
			continue
		}
		cred, ok := strings.CutPrefix(h.Value, "Bearer ")
		if !ok || cred == "" {
			return errors.New("offered Authorization header is not a bearer token")
		}
		if err := config.WriteFileAtomic(c.credentialFile(), []byte(cred+"\n")); err != nil {
			c.log.Error("keeping the offered OpAMP credential failed; still enrolling with the secret", "err", err)
			return err
		}
		c.mu.Lock()
		c.credential = cred
		c.mu.Unlock()
		c.log.Info("accepted the agent credential offered by myriarchd", "file", c.credentialFile())
	}
	return nil
}

func (c *Client) onMessage(_ context.Context, msg *types.MessageData) {
	if id := msg.AgentIdentification; id != nil && len(id.NewInstanceUid) == len(c.uid) {
		// myriarchd saw this uid on another connected agent (a copied
		// state_dir): keep the new one it gave.
		var nu types.InstanceUid
		copy(nu[:], id.NewInstanceUid)
		if err := config.WriteFileAtomic(c.uidFile(), []byte(UIDString(nu)+"\n")); err != nil {
			c.log.Error("keeping the new OpAMP instance uid failed", "err", err)
		} else {
			c.log.Warn("myriarchd assigned a new instance uid", "old", UIDString(c.uid), "new", UIDString(nu))
		}
	}
	if msg.RemoteConfig == nil {
		return
	}
	// Hand over to the applying goroutine: a reload may take up to
	// shutdown_timeout, and this is opamp-go's receiving goroutine.
	for {
		select {
		case c.pending <- msg.RemoteConfig:
			return
		default:
		}
		select {
		case <-c.pending: // a newer one supersedes it
		default:
		}
	}
}

func (c *Client) applyLoop() {
	defer c.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A stop cancels an apply in progress (its reload then stops short,
	// like the process's own shutdown).
	go func() {
		select {
		case <-c.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-c.stop:
			return
		case rc := <-c.pending:
			c.apply(ctx, rc)
		}
	}
}

// apply validates and applies one remote configuration and reports the
// outcome.
func (c *Client) apply(ctx context.Context, rc *protobufs.AgentRemoteConfig) {
	status := func(st protobufs.RemoteConfigStatuses, msg string) {
		if err := c.cli.SetRemoteConfigStatus(&protobufs.RemoteConfigStatus{LastRemoteConfigHash: rc.ConfigHash, Status: st, ErrorMessage: msg}); err != nil {
			c.log.Warn("reporting the remote configuration status", "err", err)
		}
	}
	f := rc.GetConfig().GetConfigMap()[""]
	if f == nil || len(bytes.TrimSpace(f.Body)) == 0 {
		// No remote configuration (myriarchd cleared the desired one):
		// the bridge keeps running what it has.
		status(protobufs.RemoteConfigStatuses_RemoteConfigStatuses_APPLIED, "")
		return
	}
	hash := hex.EncodeToString(rc.ConfigHash)
	status(protobufs.RemoteConfigStatuses_RemoteConfigStatuses_APPLYING, "")
	local, err := os.ReadFile(c.o.File)
	if err != nil {
		status(protobufs.RemoteConfigStatuses_RemoteConfigStatuses_FAILED, fmt.Sprintf("reading %s: %v", c.o.File, err))
		return
	}
	body, err := config.WithLocalOpAMP(f.Body, local)
	if err != nil {
		status(protobufs.RemoteConfigStatuses_RemoteConfigStatuses_FAILED, err.Error())
		return
	}
	d, err := c.o.Bridge.ApplyFile(ctx, c.o.File, body, true)
	if err != nil {
		c.log.Warn("remote configuration refused; nothing changed", "hash", hash, "err", err)
		status(protobufs.RemoteConfigStatuses_RemoteConfigStatuses_FAILED, err.Error())
		return
	}
	c.log.Info("remote configuration applied", "hash", hash, "kept", d.Kept, "changed", d.Changed, "added", d.Added, "removed", d.Removed)
	status(protobufs.RemoteConfigStatuses_RemoteConfigStatuses_APPLIED, "")
	if err := c.cli.UpdateEffectiveConfig(ctx); err != nil {
		c.log.Warn("reporting the effective configuration", "err", err)
	}
	c.sendHealth()
}

func (c *Client) effectiveConfig(context.Context) (*protobufs.EffectiveConfig, error) {
	data, err := os.ReadFile(c.o.File)
	if err != nil {
		return nil, err
	}
	red, err := config.Redacted(data)
	if err != nil {
		return nil, err
	}
	return &protobufs.EffectiveConfig{ConfigMap: &protobufs.AgentConfigMap{ConfigMap: map[string]*protobufs.AgentConfigFile{
		"": {Body: red, ContentType: "text/yaml"}}}}, nil
}

func (c *Client) reportHealth() {
	defer c.wg.Done()
	t := time.NewTicker(c.o.HealthEvery)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.sendHealth()
		}
	}
}

// sendHealth reports the health if it changed since the last report.
func (c *Client) sendHealth() {
	h := c.health()
	key := healthKey(h)
	c.mu.Lock()
	same := key == c.lastHealth
	c.lastHealth = key
	c.mu.Unlock()
	if same {
		return
	}
	if err := c.cli.SetHealth(h); err != nil && !errors.Is(err, context.Canceled) {
		c.log.Debug("reporting health", "err", err)
	}
}

func healthKey(h *protobufs.ComponentHealth) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v|%s|%s", h.Healthy, h.Status, h.LastError)
	for _, k := range sortedKeys(h.ComponentHealthMap) {
		c := h.ComponentHealthMap[k]
		fmt.Fprintf(&b, "|%s:%v:%s:%s", k, c.Healthy, c.Status, c.LastError)
	}
	return b.String()
}

func kvs(pairs ...string) []*protobufs.KeyValue {
	var out []*protobufs.KeyValue
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, &protobufs.KeyValue{Key: pairs[i], Value: &protobufs.AnyValue{Value: &protobufs.AnyValue_StringValue{StringValue: pairs[i+1]}}})
	}
	return out
}

func tlsFiles(t *config.TLSSettings) *mqttconn.TLSFiles {
	if t == nil {
		return nil
	}
	return &mqttconn.TLSFiles{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
}

// LoadOrCreateUID reads the instance uid kept at path (32 hex digits), or
// creates and keeps a new random (version 4) one.
func LoadOrCreateUID(path string) (types.InstanceUid, error) {
	var uid types.InstanceUid
	if b, err := os.ReadFile(path); err == nil {
		s := strings.ReplaceAll(strings.TrimSpace(string(b)), "-", "")
		if raw, err := hex.DecodeString(s); err == nil && len(raw) == len(uid) {
			copy(uid[:], raw)
			return uid, nil
		}
		return uid, fmt.Errorf("%s: %q: must hold an instance uid of 32 hex digits (delete the file to get a new one)", path, strings.TrimSpace(string(b)))
	} else if !errors.Is(err, os.ErrNotExist) {
		return uid, err
	}
	if _, err := rand.Read(uid[:]); err != nil {
		return uid, err
	}
	uid[6] = (uid[6] & 0x0f) | 0x40
	uid[8] = (uid[8] & 0x3f) | 0x80
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return uid, err
	}
	if err := config.WriteFileAtomic(path, []byte(UIDString(uid)+"\n")); err != nil {
		return uid, fmt.Errorf("keeping the OpAMP instance uid: %w", err)
	}
	return uid, nil
}

// UIDString is the uid in the form myriarchd shows (8-4-4-4-12).
func UIDString(u types.InstanceUid) string {
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
