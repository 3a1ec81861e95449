package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/apiclient"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

func init() {
	uid := []string{"UID"}
	apiCommands = append(apiCommands,
		apiCmd{group: "agent", name: "list", summary: "list agents (GET /api/v1/agents)",
			flags: map[string]string{"status": "online or offline", "selector": "key=value,... over the agents' attributes",
				"kind": "bridge: only the bridges", "replica": "connected to this replica", "limit": "page size within [1, 1000]",
				"bridge-id": "bridges reporting this bridge id", "role": "bridges with a session in this role (owner, standby, ...)",
				"after": "the cursor of the next page (printed after a full page)"},
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				q := url.Values{}
				for _, k := range []string{"status", "selector", "kind", "replica", "limit", "after", "bridge-id", "role"} {
					if v := x.str(k); v != "" {
						q.Set(strings.ReplaceAll(k, "-", "_"), v)
					}
				}
				l, err := c.Agents(ctx, q)
				return l, func(w io.Writer) { printAgents(w, l.Agents, l.Next) }, err
			}},
		apiCmd{group: "agent", name: "show", args: uid, summary: "an agent, its health and remote configuration (GET /api/v1/agents/{uid})",
			run: func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
				b, err := c.Agent(ctx, x.arg(0))
				return json.RawMessage(b), func(w io.Writer) { printAgent(b, w) }, err
			}},
		apiCmd{group: "agent", name: "set-config", args: uid, summary: "set the agent's desired configuration directly from --file (PUT /api/v1/agents/{uid}/config)",
			flags: map[string]string{"file": "file with the configuration; - reads standard input"},
			run: withFile(func(ctx context.Context, c *apiclient.Client, x *apiCall, content string) (any, func(io.Writer), error) {
				a, err := c.SetAgentConfig(ctx, x.arg(0), content)
				return a, func(w io.Writer) {
					fmt.Fprintf(w, "agent %s: config %s %s\n", a.InstanceUID, short(a.ConfigHash), a.Status)
				}, err
			})},
		apiCmd{group: "agent", name: "clear-config", args: uid, summary: "clear the desired configuration: the agent is sent an empty one (DELETE /api/v1/agents/{uid}/config)",
			run: onAgent((*apiclient.Client).ClearAgentConfig, func(w io.Writer, a api.ConfigAccepted) { fmt.Fprintf(w, "agent %s: %s\n", a.InstanceUID, a.Status) })},
		apiCmd{group: "agent", name: "restart", args: uid, summary: "send the OpAMP restart command; the agent must accept it and be online (POST /api/v1/agents/{uid}/restart)",
			run: onAgent((*apiclient.Client).RestartAgent, func(w io.Writer, a api.AgentAccepted) {
				fmt.Fprintf(w, "agent %s: restart %s\n", a.InstanceUID, a.Status)
			})},
		apiCmd{group: "agent", name: "credential", args: uid, summary: "the agent's own credential, never its secret (admin; GET /api/v1/agents/{uid}/credential)",
			run: onAgent((*apiclient.Client).AgentCredential, printCredential)},
		apiCmd{group: "agent", name: "rotate-credential", args: uid, summary: "send the agent a new credential; the old one stops working (admin; POST /api/v1/agents/{uid}/credential/rotate)",
			run: onAgent((*apiclient.Client).RotateCredential, func(w io.Writer, a api.AgentAccepted) {
				fmt.Fprintf(w, "agent %s: rotation %s\n", a.InstanceUID, a.Status)
			})},
		apiCmd{group: "agent", name: "allow-reenroll", args: uid, summary: "let the agent enroll once more with the enrollment secret (admin; POST /api/v1/agents/{uid}/credential/allow-reenroll)",
			run: onAgent((*apiclient.Client).AllowReenroll, printCredential)},
		apiCmd{group: "agent", name: "revoke", args: uid, summary: "disconnect the agent on every replica; it can neither connect nor enroll again until allow-reenroll (admin; POST /api/v1/agents/{uid}/revoke)",
			run: onAgent((*apiclient.Client).RevokeAgent, printCredential)},
		apiCmd{group: "agent", name: "assignment", args: uid, summary: "the configuration assigned to the agent (GET /api/v1/agents/{uid}/assignment)",
			run: onAgent((*apiclient.Client).Assignment, nil)},
	)
	registerGroup("agent", "agents through the REST API: agent list | show | set-config | clear-config | restart | credential | rotate-credential | allow-reenroll | revoke | assignment | telemetry", "", nil)
}

// readFile reads the file of --file (- is standard input); a missing
// flag or an unreadable file is refused input.
func (x *apiCall) readFile() string {
	f := x.str("file")
	var b []byte
	var err error
	switch f {
	case "":
		x.bad = append(x.bad, "--file is required")
		return ""
	case "-":
		b, err = io.ReadAll(os.Stdin)
	default:
		b, err = os.ReadFile(f)
	}
	if err != nil {
		x.bad = append(x.bad, fmt.Sprintf("--file: %v", err))
	}
	return string(b)
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func ts(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func printAgents(w io.Writer, agents []store.Agent, next string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "UID\tSERVICE\tSTATUS\tREPLICA\tHEALTH\tCONFIG\tBRIDGE\tROLES\tLAST SEEN")
	for _, a := range agents {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.InstanceUID, a.Identifying["service.name"], a.Status, a.ReplicaID,
			healthWord(a.Healthy, "-"), cmp.Or(a.RemoteConfigStatus, "-"),
			dash(a.BridgeID()), dash(strings.Join(a.Roles(), ",")), ts(&a.LastSeen))
	}
	_ = tw.Flush()
	if next != "" {
		fmt.Fprintf(w, "more: --after %s\n", next)
	}
}

func printCredential(w io.Writer, c store.AgentCredential) {
	fmt.Fprintf(w, "agent %s: credential issued %v, created %s, rotated %s", c.InstanceUID, c.Issued, ts(&c.CreatedAt), ts(c.RotatedAt))
	if c.RevokedAt != nil {
		fmt.Fprintf(w, ", revoked %s by %s", ts(c.RevokedAt), c.RevokedBy)
	}
	if c.ReenrollAllowedAt != nil {
		fmt.Fprintf(w, ", re-enrollment allowed %s by %s", ts(c.ReenrollAllowedAt), c.ReenrollAllowedBy)
	}
	fmt.Fprintln(w)
}

// printAgent prints the operator's summary of GET /api/v1/agents/{uid}.
func printAgent(body []byte, w io.Writer) {
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
		fmt.Fprintf(w, "unexpected answer: %v\n", err)
		return
	}
	a := d.Agent
	health := healthWord(a.Healthy, "not reported")
	rc := cmp.Or(a.RemoteConfigStatus, "none")
	if a.RemoteConfigError != "" {
		rc += ": " + a.RemoteConfigError
	}
	fmt.Fprintf(w, "instance_uid   %s\nservice.name   %s\nstatus         %s (replica %s)\nhealth         %s\n",
		a.InstanceUID, a.Identifying["service.name"], a.Status, a.ReplicaID, health)
	if a.Health != nil {
		a.Health.print(w, "  ")
	}
	fmt.Fprintf(w, "remote config  %s\ncapabilities   %s\n", rc, strings.Join(a.CapabilityNames, ", "))
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

// onAgent is the run of a command that makes one call on the agent named
// by its argument and shows the answer with show (nil: as YAML).
func onAgent[T any](call func(*apiclient.Client, context.Context, string) (T, error), show func(io.Writer, T)) func(context.Context, *apiclient.Client, *apiCall) (any, func(io.Writer), error) {
	return func(ctx context.Context, c *apiclient.Client, x *apiCall) (any, func(io.Writer), error) {
		v, err := call(c, ctx, x.arg(0))
		if show == nil {
			return v, nil, err
		}
		return v, func(w io.Writer) { show(w, v) }, err
	}
}

// healthWord is "healthy" or "unhealthy", or none when the agent reported
// no health.
func healthWord(healthy *bool, none string) string {
	if healthy == nil {
		return none
	}
	return map[bool]string{true: "healthy", false: "unhealthy"}[*healthy]
}
