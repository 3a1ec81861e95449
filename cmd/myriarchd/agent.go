package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/myriarch/myriarch/internal/cli"
)

func init() {
	commands.Register(cli.Command{
		Name:    "agent",
		Summary: "commands to one agent through the REST API: agent show|restart|clear-config|revoke|rotate-credential|allow-reenroll UID",
		Run:     runAgent,
	})
}

const agentUsage = `Usage:
  myriarchd agent show UID [--json]
  myriarchd agent restart UID
  myriarchd agent clear-config UID
  myriarchd agent revoke UID              (admin token)
  myriarchd agent rotate-credential UID   (admin token)
  myriarchd agent allow-reenroll UID      (admin token)
Flags (after the command): --server URL (env MYRIARCH_SERVER, default
http://127.0.0.1:8080), --token TOKEN (env MYRIARCH_TOKEN; an API token from
` + "`myriarchd token create`" + `).
restart sends the OpAMP restart command (the agent must accept it and be
online); clear-config clears the desired config, and the agent is sent an
empty config (OpAMP's "no remote config"). revoke disconnects the agent at
once on every replica; it can neither connect nor enroll again (until
allow-reenroll).
rotate-credential sends the agent a new credential; the old one stops working.
allow-reenroll lets an agent that holds a credential enroll once more with
the enrollment secret (it lost its credential, or was reinstalled with its old
instance UID), or a revoked one once more (the revoked credential stays void);
otherwise the secret never replaces an agent's credential.`

var agentCommands = []string{"show", "restart", "clear-config", "revoke", "rotate-credential", "allow-reenroll"}

// apiClient is the flags of a command that calls the REST API.
type apiClient struct {
	server, token *string
	base          *url.URL
}

func (c *apiClient) define(fs *flag.FlagSet) {
	c.server = fs.String("server", envOr("MYRIARCH_SERVER", "http://127.0.0.1:8080"), "base URL of a myriarchd replica's REST API")
	c.token = fs.String("token", os.Getenv("MYRIARCH_TOKEN"), "API token")
}

// check refuses a missing token or a server that is not an http(s) URL.
func (c *apiClient) check(in *invocation) (int, bool) {
	if *c.token == "" {
		return in.usageErr("--token (or MYRIARCH_TOKEN) is required: an API token from `myriarchd token create`"), false
	}
	base, err := url.Parse(*c.server)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return in.usageErr("--server %q: must be an http:// or https:// URL", *c.server), false
	}
	c.base = base
	return 0, true
}

// call sends method path to the server, within 30 seconds; a transport
// failure or an answer other than 2xx is reported and is not ok.
func (c *apiClient) call(in *invocation, method, path string) ([]byte, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, body, err := apiCall(ctx, method, strings.TrimSuffix(c.base.String(), "/")+path, *c.token)
	if err != nil {
		fmt.Fprintf(in.stderr, "%s: %v\n", in.prog, err)
		return nil, false
	}
	if code/100 != 2 {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			fmt.Fprintf(in.stderr, "%s: %s (HTTP %d)\n", in.prog, e.Error, code)
		} else {
			fmt.Fprintf(in.stderr, "%s: HTTP %d: %s\n", in.prog, code, strings.TrimSpace(string(body)))
		}
		return nil, false
	}
	return body, true
}

func runAgent(args []string, stdout, stderr io.Writer) int {
	var api apiClient
	var asJSON *bool
	in, code := subcommand("agent", agentUsage, agentCommands, args, stdout, stderr, func(_ string, fs *flag.FlagSet) {
		api.define(fs)
		asJSON = fs.Bool("json", false, "show: print the API's JSON")
	})
	if in == nil {
		return code
	}
	if len(in.pos) != 1 {
		return in.usageErr("want exactly one agent instance UID, got %d arguments", len(in.pos))
	}
	if code, ok := api.check(in); !ok {
		return code
	}
	method, path := agentRequest(in.sub, in.pos[0])
	body, ok := api.call(in, method, path)
	if !ok {
		return 1
	}
	if in.sub != "show" || *asJSON {
		in.stdout.Write(body)
		return 0
	}
	return printAgent(body, stdout, stderr)
}

// agentRequest is the API request of agent command sub.
func agentRequest(sub, uid string) (method, path string) {
	path = "/api/v1/agents/" + url.PathEscape(uid)
	switch sub {
	case "restart":
		return http.MethodPost, path + "/restart"
	case "clear-config":
		return http.MethodDelete, path + "/config"
	case "revoke":
		return http.MethodPost, path + "/revoke"
	case "rotate-credential":
		return http.MethodPost, path + "/credential/rotate"
	case "allow-reenroll":
		return http.MethodPost, path + "/credential/allow-reenroll"
	}
	return http.MethodGet, path
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func apiCall(ctx context.Context, method, u, token string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, b, err
}

// printAgent prints the operator's summary of GET /api/v1/agents/{uid}.
func printAgent(body []byte, stdout, stderr io.Writer) int {
	var d struct {
		Agent struct {
			InstanceUID        string            `json:"instance_uid"`
			Identifying        map[string]string `json:"identifying_attributes"`
			Status             string            `json:"status"`
			ReplicaID          string            `json:"replica_id"`
			Healthy            *bool             `json:"healthy"`
			Health             *healthNode       `json:"health"`
			RemoteConfigStatus string            `json:"remote_config_status"`
			RemoteConfigError  string            `json:"remote_config_error"`
			CapabilityNames    []string          `json:"capability_names"`
		} `json:"agent"`
	}
	if err := json.Unmarshal(body, &d); err != nil {
		fmt.Fprintf(stderr, "myriarchd agent show: unexpected answer: %v\n", err)
		return 1
	}
	a := d.Agent
	health := "not reported"
	if a.Healthy != nil {
		health = map[bool]string{true: "healthy", false: "unhealthy"}[*a.Healthy]
	}
	rc := a.RemoteConfigStatus
	if rc == "" {
		rc = "none"
	}
	if a.RemoteConfigError != "" {
		rc += ": " + a.RemoteConfigError
	}
	fmt.Fprintf(stdout, "instance_uid   %s\nservice.name   %s\nstatus         %s (replica %s)\nhealth         %s\n",
		a.InstanceUID, a.Identifying["service.name"], a.Status, a.ReplicaID, health)
	if a.Health != nil {
		a.Health.print(stdout, "  ")
	}
	fmt.Fprintf(stdout, "remote config  %s\ncapabilities   %s\n", rc, strings.Join(a.CapabilityNames, ", "))
	return 0
}

// healthNode is the stored component health (opampserver's healthJSON).
type healthNode struct {
	Healthy    bool                   `json:"healthy"`
	Status     string                 `json:"status"`
	LastError  string                 `json:"last_error"`
	Components map[string]*healthNode `json:"components"`
}

func (h *healthNode) print(w io.Writer, indent string) {
	if h.LastError != "" {
		fmt.Fprintf(w, "%serror: %s\n", indent, h.LastError)
	}
	names := make([]string, 0, len(h.Components))
	for n := range h.Components {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		c := h.Components[n]
		state := "healthy"
		if !c.Healthy {
			state = "unhealthy"
		}
		line := fmt.Sprintf("%s%s: %s", indent, n, state)
		if c.Status != "" {
			line += " (" + c.Status + ")"
		}
		fmt.Fprintln(w, line)
		c.print(w, indent+"  ")
	}
}
