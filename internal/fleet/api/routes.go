package api

import (
	"context"
	"net/http"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// endpoint is one row of the route table: the pattern, the role a token
// needs for it and its handler. The OpenAPI document describes each row
// (routeDocs), and TestOpenAPIDocumentsEveryRoute fails on a row without one.
type endpoint struct {
	role    store.Role
	pattern string
	h       http.HandlerFunc
}

// endpoints is the route table of every /api/ endpoint behind a token, in
// one place so that the roles can be read (and reviewed) side by side.
func (a *API) endpoints() []endpoint {
	viewer, operator, admin := store.RoleViewer, store.RoleOperator, store.RoleAdmin
	return []endpoint{
		{viewer, "GET /api/v1/overview", answer(a.Overview, "overview")},
		{viewer, "GET /api/v1/cluster", answer(a.Cluster, "cluster")},

		{viewer, "GET /api/v1/agents", a.listAgents},
		{viewer, "GET /api/v1/agents/{uid}", a.getAgent},
		{operator, "PUT /api/v1/agents/{uid}/config", a.setConfig},
		{operator, "DELETE /api/v1/agents/{uid}/config", a.clearConfig},
		{operator, "POST /api/v1/agents/{uid}/restart", a.restartAgent},
		{viewer, "GET /api/v1/agents/{uid}/assignment", a.assignment},
		{viewer, "GET /api/v1/agents/{uid}/intents", a.agentIntents},
		{viewer, "GET /api/v1/agents/{uid}/telemetry", a.agentTelemetry},
		{viewer, "GET /api/v1/telemetry", a.fleetTelemetry},
		{admin, "GET /api/v1/agents/{uid}/credential", a.getCredential},
		{admin, "POST /api/v1/agents/{uid}/credential/rotate", a.rotateCredential},
		{admin, "POST /api/v1/agents/{uid}/credential/allow-reenroll", a.allowReenroll},
		{admin, "POST /api/v1/agents/{uid}/revoke", a.revokeAgent},

		{admin, "GET /api/v1/tokens", a.listTokens},
		{admin, "POST /api/v1/tokens", a.createToken},
		{admin, "DELETE /api/v1/tokens/{id}", a.revokeToken},

		{viewer, "GET /api/v1/configs", a.listConfigs},
		{viewer, "GET /api/v1/configs/{name}", a.getConfig},
		{operator, "PUT /api/v1/configs/{name}", a.putConfig},
		{operator, "POST /api/v1/configs/{name}/revisions", a.addRevision},
		{viewer, "GET /api/v1/configs/{name}/revisions/{rev}", a.getRevision},
		{viewer, "GET /api/v1/configs/{name}/revisions/{rev}/preview", a.previewRevision},
		{viewer, "GET /api/v1/configs/{name}/diff", a.diff},
		{viewer, "GET /api/v1/gitops", a.gitopsStatus},

		{viewer, "GET /api/v1/rollouts", a.listRollouts},
		{operator, "POST /api/v1/rollouts", a.createRollout},
		// Operator, like creating one: a plan answers with the same
		// refusals as the rollout it previews.
		{operator, "POST /api/v1/rollouts/plan", a.planRollout},
		{viewer, "GET /api/v1/rollouts/{id}", a.getRollout},
		{viewer, "GET /api/v1/rollouts/{id}/intents", a.rolloutIntents},
		{operator, "POST /api/v1/rollouts/{id}/{command}", a.rolloutCommand},

		{viewer, "GET /api/v1/packages", a.listPackages},
		{operator, "PUT /api/v1/packages/{name}", a.putPackage},
		{operator, "DELETE /api/v1/packages/{name}", a.deletePackage},
		{viewer, "GET /api/v1/packages/{name}/releases", a.listReleases},
		{viewer, "GET /api/v1/releases", a.listReleases},
		{viewer, "GET /api/v1/artifacts", a.listArtifacts},
		{viewer, "GET /api/v1/packages/versions", a.packageVersions},
		{operator, "POST /api/v1/packages/{name}/offers", a.offerPackage},
		{operator, "POST /api/v1/packages/{name}/rollouts", a.createPackageRollout},
		{viewer, "GET /api/v1/package-rollouts", a.listPackageRollouts},
		{operator, "POST /api/v1/package-rollouts/{id}/{command}", a.commandPackageRollout},

		// The catch-all answers unknown endpoints only to a valid token.
		{viewer, "/api/", func(w http.ResponseWriter, r *http.Request) {
			writeErr(w, http.StatusNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
		}},
	}
}

// answer is the handler of an endpoint that answers what get returns (the
// API's methods that the UI shares).
func answer[T any](get func(context.Context) (T, error), what string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := get(r.Context())
		writeOne(w, v, err, what)
	}
}
