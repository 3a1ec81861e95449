package api

import (
	"net/http"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/fleet/upgrades"
)

// routeDocs describes every registered route for the OpenAPI document,
// keyed by its pattern as registered. Adding a route means adding its row
// here (TestOpenAPIDocumentsEveryRoute fails otherwise); the role comes
// from the registration.
var routeDocs = map[string]Doc{
	"GET /healthz":             {Summary: "liveness probe", Text: "text/plain"},
	"GET /readyz":              {Summary: "readiness probe (503 while this replica cannot serve)", Text: "text/plain"},
	"GET /metrics":             {Summary: "Prometheus metrics", Text: "text/plain"},
	"GET /api/v1/openapi.json": {Summary: "this document", Response: map[string]any{}},
	"/api/":                    {Hidden: "the catch-all: answers 404 (ErrorBody) naming the unknown endpoint"},

	"GET /api/v1/overview": {Summary: "fleet overview: agent counts, leader", Response: Overview{}},
	"GET /api/v1/cluster":  {Summary: "replicas, leader, leader jobs and their last runs", Response: ClusterInfo{}},

	"GET /api/v1/agents": {Summary: "a page of agents", Response: AgentList{}, Query: map[string]string{
		"status": "online or offline", "replica": "connected to this replica", "selector": "key=value,... over the identifying and non-identifying attributes",
		"kind": "bridge: the myriarch-bridge agents", "bridge_id": "agents reporting this bridge id", "role": "agents with a session in this role (owner, standby, active, stopped)", "limit": "page size within [1, 1000]", "after": "the cursor of the next page (next of the previous page)"}},
	"GET /api/v1/agents/{uid}":                            {Summary: "an agent and its newest events", Response: AgentDetail{}},
	"PUT /api/v1/agents/{uid}/config":                     {Summary: "set the agent's desired remote configuration directly", Request: ConfigRequest{}, Status: http.StatusAccepted, Response: ConfigAccepted{}},
	"DELETE /api/v1/agents/{uid}/config":                  {Summary: "clear the desired configuration (the agent is sent an empty one)", Status: http.StatusAccepted, Response: ConfigAccepted{}},
	"POST /api/v1/agents/{uid}/restart":                   {Summary: "send the OpAMP restart command", Status: http.StatusAccepted, Response: AgentAccepted{}},
	"GET /api/v1/agents/{uid}/credential":                 {Summary: "the agent's own credential (not its secret)", Response: store.AgentCredential{}},
	"POST /api/v1/agents/{uid}/credential/rotate":         {Summary: "send the agent a new credential", Status: http.StatusAccepted, Response: AgentAccepted{}},
	"POST /api/v1/agents/{uid}/credential/allow-reenroll": {Summary: "let the agent enroll once more with the enrollment secret", Response: store.AgentCredential{}},
	"POST /api/v1/agents/{uid}/revoke":                    {Summary: "revoke the agent: disconnected on every replica, cannot enroll again", Response: store.AgentCredential{}},
	"GET /api/v1/agents/{uid}/assignment":                 {Summary: "the configuration assigned to the agent", Response: store.Assignment{}},
	"GET /api/v1/agents/{uid}/intents":                    {Summary: "the rollout intents of the agent, newest first", Response: IntentList{}},
	"GET /api/v1/agents/{uid}/telemetry": {Summary: "the agent's own metrics (rates per second of counters, values of gauges) over a window, per series (name, component)",
		Response: AgentTelemetry{}, Query: map[string]string{"window": "a duration up to telemetry.coarseRetention; default 5m (read from the fine tier up to telemetry.fineRetention)"}},
	"GET /api/v1/telemetry": {Summary: "the fleet's sums of the agents' own metrics (throughput, refused, failed) and agent counts per coarse bucket",
		Response: FleetTelemetry{}, Query: map[string]string{"window": "a duration up to telemetry.coarseRetention; default 1h"}},

	"GET /api/v1/tokens":         {Summary: "API tokens (never their secrets)", Response: TokenList{}, Query: map[string]string{"status": "active or revoked"}},
	"POST /api/v1/tokens":        {Summary: "create an API token with a role; the answer holds its secret, shown once", Request: TokenRequest{}, Status: http.StatusCreated, Response: NewToken{}},
	"DELETE /api/v1/tokens/{id}": {Summary: "revoke an API token (refused at once by every replica)", Response: Revocation{}},

	"GET /api/v1/configs":                        {Summary: "configurations", Response: ConfigList{}},
	"GET /api/v1/configs/{name}":                 {Summary: "a configuration and its revisions", Response: ConfigDetail{}},
	"PUT /api/v1/configs/{name}":                 {Summary: "create or update a configuration", Request: PutConfigRequest{}, Also: []int{http.StatusCreated}, Response: ConfigDetail{}},
	"POST /api/v1/configs/{name}/revisions":      {Summary: "validate and store the next revision", Request: RevisionRequest{}, Also: []int{http.StatusCreated}, Response: RevisionResult{}},
	"GET /api/v1/configs/{name}/revisions/{rev}": {Summary: "one revision with its content", Response: store.Revision{}},
	"GET /api/v1/configs/{name}/diff":            {Summary: "unified diff between two revisions (revision 0 is the empty document)", Response: DiffResult{}, Query: map[string]string{"from": "revision (0: the empty document)", "to": "revision"}},
	"GET /api/v1/configs/{name}/revisions/{rev}/preview": {Summary: "the agents assigned to the configuration, grouped by what they run now, with the diff to the revision",
		Response: configs.Preview{}, Query: map[string]string{"selector": "key=value,... narrowing the agents by their attributes"}},
	"GET /api/v1/gitops": {Summary: "status of every Git source", Response: GitOpsList{}},

	"GET /api/v1/rollouts":                 {Summary: "rollouts, newest first", Response: RolloutList{}, Query: map[string]string{"config": "of this configuration", "limit": "at most this many"}},
	"POST /api/v1/rollouts":                {Summary: "create a rollout (the leader plans and runs it)", Request: rollout.Request{}, Status: http.StatusAccepted, Response: rollout.Rollout{}},
	"POST /api/v1/rollouts/plan":           {Summary: "dry run of a rollout: its waves with their agents, the agents skipped and why; nothing is stored", Request: rollout.Request{}, Response: rollout.Plan{}},
	"GET /api/v1/rollouts/{id}":            {Summary: "a rollout with its waves and agents", Response: rollout.Detail{}, Query: map[string]string{"agents": "list at most this many agents"}},
	"GET /api/v1/rollouts/{id}/intents":    {Summary: "the intents of a rollout", Response: IntentList{}},
	"POST /api/v1/rollouts/{id}/{command}": {Summary: "pause, resume, abort or rollback a rollout", Status: http.StatusAccepted, Response: rollout.Rollout{}},

	"GET /api/v1/packages":                         {Summary: "package sources", Response: PackageList{}},
	"PUT /api/v1/packages/{name}":                  {Summary: "create or update a package source", Request: PackageRequest{}, Response: releases.Source{}},
	"DELETE /api/v1/packages/{name}":               {Summary: "delete a package source", Status: http.StatusNoContent, NoBody: true},
	"GET /api/v1/packages/{name}/releases":         {Summary: "the recorded releases of a package", Response: ReleaseList{}},
	"GET /api/v1/releases":                         {Summary: "the recorded releases of every package", Response: ReleaseList{}},
	"GET /api/v1/artifacts":                        {Summary: "stored artifacts and download progress", Response: ArtifactList{}},
	"GET /api/v1/packages/versions":                {Summary: "the package versions the fleet runs", Response: VersionList{}},
	"POST /api/v1/packages/{name}/offers":          {Summary: "offer a version to agents directly", Request: OfferRequest{}, Response: OfferList{}},
	"POST /api/v1/packages/{name}/rollouts":        {Summary: "create a package-version rollout", Request: PackageRolloutRequest{}, Status: http.StatusCreated, Response: upgrades.Rollout{}},
	"GET /api/v1/package-rollouts":                 {Summary: "package-version rollouts", Response: PackageRolloutList{}},
	"POST /api/v1/package-rollouts/{id}/{command}": {Summary: "pause, resume or abort a package rollout", Status: http.StatusAccepted, NoBody: true},
}

// The answers that the handlers write as maps, named for the document
// and for clients (internal/fleet/apiclient).
type (
	// AgentAccepted is the answer of an agent command carried out by the
	// replica the agent is connected to.
	AgentAccepted struct {
		InstanceUID string `json:"instance_uid"`
		Status      string `json:"status"`
	}
	// ConfigAccepted is the answer of setting or clearing an agent's
	// desired configuration.
	ConfigAccepted struct {
		InstanceUID string `json:"instance_uid"`
		ConfigHash  string `json:"config_hash"`
		Status      string `json:"status"`
	}
	// IntentList is the answer of the intents endpoints.
	IntentList struct {
		Intents []rollout.Intent `json:"intents"`
	}
	// PackageList is the answer of GET /api/v1/packages.
	PackageList struct {
		Packages []releases.Source `json:"packages"`
	}
	// ReleaseList is the answer of the releases endpoints.
	ReleaseList struct {
		Releases []releases.Release `json:"releases"`
	}
	// ArtifactList is the answer of GET /api/v1/artifacts.
	ArtifactList struct {
		Blobs     []artifacts.Blob     `json:"blobs"`
		Downloads []artifacts.Progress `json:"downloads"`
	}
	// VersionList is the answer of GET /api/v1/packages/versions.
	VersionList struct {
		Versions []store.PackageVersionCount `json:"versions"`
	}
	// OfferList is the answer of POST /api/v1/packages/{name}/offers.
	OfferList struct {
		Offers []artifacts.Offer `json:"offers"`
	}
	// PackageRolloutList is the answer of GET /api/v1/package-rollouts.
	PackageRolloutList struct {
		Rollouts []upgrades.Rollout `json:"rollouts"`
	}
)
