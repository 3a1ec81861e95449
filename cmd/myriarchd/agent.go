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
once on every replica; it can neither connect nor enroll again.
rotate-credential sends the agent a new credential; the old one stops working.
allow-reenroll lets an agent that holds a credential enroll once more with
the enrollment secret (it lost its credential, or was reinstalled with its old
instance UID); otherwise the secret never replaces an agent's credential.`

var agentCommands = map[string]bool{"show": true, "restart": true, "clear-config": true, "revoke": true, "rotate-credential": true, "allow-reenroll": true}

func runAgent(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || !agentCommands[args[0]] {
		fmt.Fprintln(stderr, agentUsage)
		return cli.ExitUsage
	}
	sub := args[0]
	fs := flag.NewFlagSet("agent "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, agentUsage) }
	server := fs.String("server", envOr("MYRIARCH_SERVER", "http://127.0.0.1:8080"), "base URL of a myriarchd replica's REST API")
	token := fs.String("token", os.Getenv("MYRIARCH_TOKEN"), "API token")
	asJSON := fs.Bool("json", false, "show: print the API's JSON")
	var pos []string
	rest := args[1:]
	for {
		if err := fs.Parse(rest); err != nil {
			return cli.ExitUsage
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "myriarchd agent %s: want exactly one agent instance UID, got %d arguments\n", sub, len(pos))
		return cli.ExitUsage
	}
	if *token == "" {
		fmt.Fprintf(stderr, "myriarchd agent %s: --token (or MYRIARCH_TOKEN) is required: an API token from `myriarchd token create`\n", sub)
		return cli.ExitUsage
	}
	base, err := url.Parse(*server)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		fmt.Fprintf(stderr, "myriarchd agent %s: --server %q: must be an http:// or https:// URL\n", sub, *server)
		return cli.ExitUsage
	}
	path := "/api/v1/agents/" + url.PathEscape(pos[0])
	method := http.MethodGet
	switch sub {
	case "restart":
		method, path = http.MethodPost, path+"/restart"
	case "clear-config":
		method, path = http.MethodDelete, path+"/config"
	case "revoke":
		method, path = http.MethodPost, path+"/revoke"
	case "rotate-credential":
		method, path = http.MethodPost, path+"/credential/rotate"
	case "allow-reenroll":
		method, path = http.MethodPost, path+"/credential/allow-reenroll"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, body, err := apiCall(ctx, method, strings.TrimSuffix(base.String(), "/")+path, *token)
	if err != nil {
		fmt.Fprintf(stderr, "myriarchd agent %s: %v\n", sub, err)
		return 1
	}
	if code/100 != 2 {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			fmt.Fprintf(stderr, "myriarchd agent %s: %s (HTTP %d)\n", sub, e.Error, code)
		} else {
			fmt.Fprintf(stderr, "myriarchd agent %s: HTTP %d: %s\n", sub, code, strings.TrimSpace(string(body)))
		}
		return 1
	}
	if sub != "show" || *asJSON {
		stdout.Write(body)
		return 0
	}
	return printAgent(body, stdout, stderr)
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
