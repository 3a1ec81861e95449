// Package apiclient is the Go client of myriarchd's REST API: one typed
// method per endpoint over the api package's request and answer types, a
// token, and a server's own CA. The CLI (cmd/myriarchd) uses it for every
// command that is not serve, migrate, token bootstrap or a lab, so that
// what the CLI does passes the API's roles, validation and logs; and the
// contexts file (contexts.go) names the servers and tokens of several
// clusters.
package apiclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/upgrades"
	"github.com/myriarch/myriarch/internal/godur"
)

// Client calls one replica's API.
type Client struct {
	base  *url.URL
	token string
	hc    *http.Client
}

// Options name the server and the credentials.
type Options struct {
	// Server is the base URL of a replica's API (http:// or https://).
	Server string
	// Token is an API token (myr_...).
	Token string
	// CAFile is a PEM bundle of the CA that signed the server's
	// certificate, for a private CA; empty: the system's roots.
	CAFile string
	// Transport is the HTTP transport (tests); nil: a default one.
	Transport http.RoundTripper
	// Timeout bounds each call; default 30s.
	Timeout time.Duration
}

// New checks o and returns a client. It refuses a missing token and a
// server that is not an http(s) URL, naming the setting.
func New(o Options) (*Client, error) {
	base, err := url.Parse(o.Server)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("server %q: must be an http:// or https:// URL of a myriarchd replica", o.Server)
	}
	if o.Token == "" {
		return nil, errors.New("token: required: an API token (myriarchd token create, or token bootstrap for the first one)")
	}
	if strings.ContainsAny(o.Token, " \t\r\n") {
		return nil, errors.New("token: must not contain white space")
	}
	rt := o.Transport
	if rt == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		if o.CAFile != "" {
			pem, err := os.ReadFile(o.CAFile)
			if err != nil {
				return nil, fmt.Errorf("ca file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("ca file %s: no PEM certificate in it", o.CAFile)
			}
			tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		}
		rt = tr
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	base.Path = strings.TrimSuffix(base.Path, "/")
	hc := &http.Client{Transport: rt, Timeout: o.Timeout, CheckRedirect: refuseRedirect}
	return &Client{base: base, token: o.Token, hc: hc}, nil
}

// refuseRedirect stops at a redirect: the API answers none, and following
// one could carry the token elsewhere (net/http keeps Authorization on the
// same host, also from https:// to http://).
func refuseRedirect(req *http.Request, via []*http.Request) error {
	return fmt.Errorf("the server redirected to %s: not followed, as the token would go with it (set --server to the replica's API URL)", req.URL.Redacted())
}

// PlainHTTP reports whether the client sends its token in clear text to
// another machine: an http:// server that is not a loopback address
// (localhost, 127.0.0.0/8, ::1). The command line warns then.
func (c *Client) PlainHTTP() bool {
	if c.base.Scheme != "http" {
		return false
	}
	h := c.base.Hostname()
	if h == "localhost" {
		return false
	}
	ip := net.ParseIP(h)
	return ip == nil || !ip.IsLoopback()
}

// Server is the base URL the client calls.
func (c *Client) Server() string { return c.base.String() }

// Error is an answer of the server that is not a success.
type Error struct {
	Method, Path string
	Status       int
	// Message is the server's error; the body itself when it is not the
	// API's error body.
	Message  string
	Problems []api.Problem
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s (HTTP %d from %s %s)", e.Message, e.Status, e.Method, e.Path)
}

// Do sends method path (with query q) and body (JSON, nil for none) and
// decodes a success answer into out (nil: discard). An answer that is not
// a success is an *Error.
func (c *Client) Do(ctx context.Context, method, path string, q url.Values, body, out any) error {
	raw, err := c.DoRaw(ctx, method, path, q, body)
	if err != nil || out == nil || len(raw) == 0 {
		return err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s %s: unexpected answer: %w", method, path, err)
	}
	return nil
}

// DoRaw is Do returning the body of a success answer as it came.
func (c *Client) DoRaw(ctx context.Context, method, path string, q url.Values, body any) ([]byte, error) {
	u := *c.base
	u.Path += path
	u.RawQuery = q.Encode()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, c.base.Redacted()+path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 == 2 {
		return raw, nil
	}
	e := &Error{Method: method, Path: path, Status: resp.StatusCode}
	var eb api.ErrorBody
	if json.Unmarshal(raw, &eb) == nil && eb.Error != "" {
		e.Message, e.Problems = eb.Error, eb.Problems
	} else {
		e.Message = strings.TrimSpace(string(raw))
		if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
	}
	return nil, e
}

func p(s string) string { return url.PathEscape(s) }

// Overview is GET /api/v1/overview.
func (c *Client) Overview(ctx context.Context) (api.Overview, error) {
	return call[api.Overview](ctx, c, "GET", "/api/v1/overview", nil, nil)
}

// Cluster is GET /api/v1/cluster.
func (c *Client) Cluster(ctx context.Context) (api.ClusterInfo, error) {
	return call[api.ClusterInfo](ctx, c, "GET", "/api/v1/cluster", nil, nil)
}

// Agents is GET /api/v1/agents with the filters in q (status, replica,
// selector, kind, limit, after).
func (c *Client) Agents(ctx context.Context, q url.Values) (api.AgentList, error) {
	return call[api.AgentList](ctx, c, "GET", "/api/v1/agents", q, nil)
}

// Agent is GET /api/v1/agents/{uid}; the answer as it came (the CLI
// prints fields the store's Agent does not decode, such as capability names).
func (c *Client) Agent(ctx context.Context, uid string) ([]byte, error) {
	return c.DoRaw(ctx, "GET", "/api/v1/agents/"+p(uid), nil, nil)
}

// SetAgentConfig is PUT /api/v1/agents/{uid}/config.
func (c *Client) SetAgentConfig(ctx context.Context, uid, content string) (api.ConfigAccepted, error) {
	return call[api.ConfigAccepted](ctx, c, "PUT", "/api/v1/agents/"+p(uid)+"/config", nil, api.ConfigRequest{Config: content})
}

// ClearAgentConfig is DELETE /api/v1/agents/{uid}/config.
func (c *Client) ClearAgentConfig(ctx context.Context, uid string) (api.ConfigAccepted, error) {
	return call[api.ConfigAccepted](ctx, c, "DELETE", "/api/v1/agents/"+p(uid)+"/config", nil, nil)
}

// RestartAgent is POST /api/v1/agents/{uid}/restart.
func (c *Client) RestartAgent(ctx context.Context, uid string) (api.AgentAccepted, error) {
	return call[api.AgentAccepted](ctx, c, "POST", "/api/v1/agents/"+p(uid)+"/restart", nil, nil)
}

// AgentCredential is GET /api/v1/agents/{uid}/credential.
func (c *Client) AgentCredential(ctx context.Context, uid string) (store.AgentCredential, error) {
	return call[store.AgentCredential](ctx, c, "GET", "/api/v1/agents/"+p(uid)+"/credential", nil, nil)
}

// RotateCredential is POST /api/v1/agents/{uid}/credential/rotate.
func (c *Client) RotateCredential(ctx context.Context, uid string) (api.AgentAccepted, error) {
	return call[api.AgentAccepted](ctx, c, "POST", "/api/v1/agents/"+p(uid)+"/credential/rotate", nil, nil)
}

// AllowReenroll is POST /api/v1/agents/{uid}/credential/allow-reenroll.
func (c *Client) AllowReenroll(ctx context.Context, uid string) (store.AgentCredential, error) {
	return call[store.AgentCredential](ctx, c, "POST", "/api/v1/agents/"+p(uid)+"/credential/allow-reenroll", nil, nil)
}

// RevokeAgent is POST /api/v1/agents/{uid}/revoke.
func (c *Client) RevokeAgent(ctx context.Context, uid string) (store.AgentCredential, error) {
	return call[store.AgentCredential](ctx, c, "POST", "/api/v1/agents/"+p(uid)+"/revoke", nil, nil)
}

// Assignment is GET /api/v1/agents/{uid}/assignment.
func (c *Client) Assignment(ctx context.Context, uid string) (store.Assignment, error) {
	return call[store.Assignment](ctx, c, "GET", "/api/v1/agents/"+p(uid)+"/assignment", nil, nil)
}

// AgentTelemetry is GET /api/v1/agents/{uid}/telemetry: the agent's own
// metrics over window (0: the server's default, 5m).
func (c *Client) AgentTelemetry(ctx context.Context, uid string, window time.Duration) (api.AgentTelemetry, error) {
	return call[api.AgentTelemetry](ctx, c, "GET", "/api/v1/agents/"+p(uid)+"/telemetry", windowQuery(window), nil)
}

// FleetTelemetry is GET /api/v1/telemetry: the fleet's sums over window
// (0: the server's default, 1h).
func (c *Client) FleetTelemetry(ctx context.Context, window time.Duration) (api.FleetTelemetry, error) {
	return call[api.FleetTelemetry](ctx, c, "GET", "/api/v1/telemetry", windowQuery(window), nil)
}

func windowQuery(window time.Duration) url.Values {
	if window <= 0 {
		return nil
	}
	return url.Values{"window": {godur.Format(window)}}
}

// Tokens is GET /api/v1/tokens (status: "", active or revoked).
func (c *Client) Tokens(ctx context.Context, status string) (api.TokenList, error) {
	var v api.TokenList
	q := url.Values{}
	if status != "" {
		q.Set("status", status)
	}
	return v, c.Do(ctx, "GET", "/api/v1/tokens", q, nil, &v)
}

// CreateToken is POST /api/v1/tokens.
func (c *Client) CreateToken(ctx context.Context, name string, role store.Role) (api.NewToken, error) {
	return call[api.NewToken](ctx, c, "POST", "/api/v1/tokens", nil, api.TokenRequest{Name: name, Role: role})
}

// RevokeToken is DELETE /api/v1/tokens/{id}.
func (c *Client) RevokeToken(ctx context.Context, id int64) (api.Revocation, error) {
	return call[api.Revocation](ctx, c, "DELETE", "/api/v1/tokens/"+strconv.FormatInt(id, 10), nil, nil)
}

// Configs is GET /api/v1/configs.
func (c *Client) Configs(ctx context.Context) (api.ConfigList, error) {
	return call[api.ConfigList](ctx, c, "GET", "/api/v1/configs", nil, nil)
}

// Config is GET /api/v1/configs/{name}.
func (c *Client) Config(ctx context.Context, name string) (api.ConfigDetail, error) {
	return call[api.ConfigDetail](ctx, c, "GET", "/api/v1/configs/"+p(name), nil, nil)
}

// PutConfig is PUT /api/v1/configs/{name}.
func (c *Client) PutConfig(ctx context.Context, name string, req api.PutConfigRequest) (api.ConfigDetail, error) {
	return call[api.ConfigDetail](ctx, c, "PUT", "/api/v1/configs/"+p(name), nil, req)
}

// AddRevision is POST /api/v1/configs/{name}/revisions.
func (c *Client) AddRevision(ctx context.Context, name, content string) (api.RevisionResult, error) {
	return call[api.RevisionResult](ctx, c, "POST", "/api/v1/configs/"+p(name)+"/revisions", nil, api.RevisionRequest{Content: content})
}

// Revision is GET /api/v1/configs/{name}/revisions/{rev}.
func (c *Client) Revision(ctx context.Context, name string, rev int) (store.Revision, error) {
	return call[store.Revision](ctx, c, "GET", "/api/v1/configs/"+p(name)+"/revisions/"+strconv.Itoa(rev), nil, nil)
}

// Diff is GET /api/v1/configs/{name}/diff?from=&to=.
func (c *Client) Diff(ctx context.Context, name string, from, to int) (api.DiffResult, error) {
	var v api.DiffResult
	q := url.Values{"from": {strconv.Itoa(from)}, "to": {strconv.Itoa(to)}}
	return v, c.Do(ctx, "GET", "/api/v1/configs/"+p(name)+"/diff", q, nil, &v)
}

// GitOps is GET /api/v1/gitops.
func (c *Client) GitOps(ctx context.Context) (api.GitOpsList, error) {
	return call[api.GitOpsList](ctx, c, "GET", "/api/v1/gitops", nil, nil)
}

// Rollouts is GET /api/v1/rollouts (config: "" for every configuration).
func (c *Client) Rollouts(ctx context.Context, config string) (api.RolloutList, error) {
	var v api.RolloutList
	q := url.Values{}
	if config != "" {
		q.Set("config", config)
	}
	return v, c.Do(ctx, "GET", "/api/v1/rollouts", q, nil, &v)
}

// CreateRollout is POST /api/v1/rollouts.
func (c *Client) CreateRollout(ctx context.Context, req rollout.Request) (rollout.Rollout, error) {
	return call[rollout.Rollout](ctx, c, "POST", "/api/v1/rollouts", nil, req)
}

// Rollout is GET /api/v1/rollouts/{id}.
func (c *Client) Rollout(ctx context.Context, id int64) (rollout.Detail, error) {
	return call[rollout.Detail](ctx, c, "GET", "/api/v1/rollouts/"+strconv.FormatInt(id, 10), nil, nil)
}

// PlanRollout is POST /api/v1/rollouts/plan: the dry run of CreateRollout.
func (c *Client) PlanRollout(ctx context.Context, req rollout.Request) (rollout.Plan, error) {
	return call[rollout.Plan](ctx, c, "POST", "/api/v1/rollouts/plan", nil, req)
}

// Preview is GET /api/v1/configs/{name}/revisions/{rev}/preview, narrowed
// by selector ("" for every agent of the configuration).
func (c *Client) Preview(ctx context.Context, name string, rev int, selector string) (configs.Preview, error) {
	var v configs.Preview
	q := url.Values{}
	if selector != "" {
		q.Set("selector", selector)
	}
	return v, c.Do(ctx, "GET", "/api/v1/configs/"+p(name)+"/revisions/"+strconv.Itoa(rev)+"/preview", q, nil, &v)
}

// RolloutCommand is POST /api/v1/rollouts/{id}/{command}.
func (c *Client) RolloutCommand(ctx context.Context, id int64, command string) (rollout.Rollout, error) {
	return call[rollout.Rollout](ctx, c, "POST", "/api/v1/rollouts/"+strconv.FormatInt(id, 10)+"/"+p(command), nil, nil)
}

// Packages is GET /api/v1/packages.
func (c *Client) Packages(ctx context.Context) (api.PackageList, error) {
	return call[api.PackageList](ctx, c, "GET", "/api/v1/packages", nil, nil)
}

// PutPackage is PUT /api/v1/packages/{name}.
func (c *Client) PutPackage(ctx context.Context, name string, req api.PackageRequest) (releases.Source, error) {
	return call[releases.Source](ctx, c, "PUT", "/api/v1/packages/"+p(name), nil, req)
}

// DeletePackage is DELETE /api/v1/packages/{name}.
func (c *Client) DeletePackage(ctx context.Context, name string) error {
	return c.Do(ctx, "DELETE", "/api/v1/packages/"+p(name), nil, nil, nil)
}

// Releases is GET /api/v1/releases, or /api/v1/packages/{name}/releases
// for one package.
func (c *Client) Releases(ctx context.Context, pkg string) (api.ReleaseList, error) {
	var v api.ReleaseList
	path := "/api/v1/releases"
	if pkg != "" {
		path = "/api/v1/packages/" + p(pkg) + "/releases"
	}
	return v, c.Do(ctx, "GET", path, nil, nil, &v)
}

// Versions is GET /api/v1/packages/versions.
func (c *Client) Versions(ctx context.Context) (api.VersionList, error) {
	return call[api.VersionList](ctx, c, "GET", "/api/v1/packages/versions", nil, nil)
}

// Artifacts is GET /api/v1/artifacts.
func (c *Client) Artifacts(ctx context.Context) (api.ArtifactList, error) {
	return call[api.ArtifactList](ctx, c, "GET", "/api/v1/artifacts", nil, nil)
}

// Offer is POST /api/v1/packages/{name}/offers.
func (c *Client) Offer(ctx context.Context, pkg string, req api.OfferRequest) (api.OfferList, error) {
	return call[api.OfferList](ctx, c, "POST", "/api/v1/packages/"+p(pkg)+"/offers", nil, req)
}

// CreatePackageRollout is POST /api/v1/packages/{name}/rollouts.
func (c *Client) CreatePackageRollout(ctx context.Context, pkg string, req api.PackageRolloutRequest) (upgrades.Rollout, error) {
	return call[upgrades.Rollout](ctx, c, "POST", "/api/v1/packages/"+p(pkg)+"/rollouts", nil, req)
}

// PackageRollouts is GET /api/v1/package-rollouts.
func (c *Client) PackageRollouts(ctx context.Context) (api.PackageRolloutList, error) {
	return call[api.PackageRolloutList](ctx, c, "GET", "/api/v1/package-rollouts", nil, nil)
}

// PackageRolloutCommand is POST /api/v1/package-rollouts/{id}/{command}.
func (c *Client) PackageRolloutCommand(ctx context.Context, id int64, command string) error {
	return c.Do(ctx, "POST", "/api/v1/package-rollouts/"+strconv.FormatInt(id, 10)+"/"+p(command), nil, nil, nil)
}

// OpenAPI is GET /api/v1/openapi.json, as it came.
func (c *Client) OpenAPI(ctx context.Context) ([]byte, error) {
	return c.DoRaw(ctx, "GET", "/api/v1/openapi.json", nil, nil)
}

// call is c.Do answering a T.
func call[T any](ctx context.Context, c *Client, method, path string, q url.Values, body any) (T, error) {
	var v T
	return v, c.Do(ctx, method, path, q, body, &v)
}
