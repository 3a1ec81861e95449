package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// ErrCannotRestart is returned by RestartAgent for an agent that is
// offline or does not accept the restart command.
var ErrCannotRestart = errors.New("cannot restart")

// RestartAgent asks the replica agent uid is connected to for an OpAMP
// restart command (also used by the UI). The request is delivered once,
// within store.RestartRequestTTL, or not at all.
func (a *API) RestartAgent(ctx context.Context, uid string) error {
	ag, err := a.o.Store.GetAgent(ctx, uid)
	if err != nil {
		return err
	}
	if ag.Capabilities&uint64(protobufs.AgentCapabilities_AgentCapabilities_AcceptsRestartCommand) == 0 {
		return fmt.Errorf("%w: agent %s does not accept the restart command (its capabilities: %v)", ErrCannotRestart, uid, store.CapabilityNames(ag.Capabilities))
	}
	if ag.Status != "online" {
		return fmt.Errorf("%w: agent %s is %s; a restart is delivered only to a connected agent", ErrCannotRestart, uid, ag.Status)
	}
	_, err = a.o.Store.RequestRestart(ctx, uid)
	return err
}

func (a *API) restartAgent(w http.ResponseWriter, r *http.Request) {
	uid := r.PathValue("uid")
	err := a.RestartAgent(r.Context(), uid)
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeErr(w, http.StatusNotFound, "no agent "+uid)
	case errors.Is(err, ErrCannotRestart):
		writeErr(w, http.StatusConflict, err.Error())
	case err != nil:
		writeErr(w, http.StatusInternalServerError, err.Error())
	default:
		a.o.Log.Info("agent restart requested", "agent", uid, "token", TokenName(r.Context()))
		writeJSON(w, http.StatusAccepted, AgentAccepted{InstanceUID: uid, Status: "requested; sent to the agent by the replica it is connected to"})
	}
}

// ClearConfig clears the desired config of agent uid (also used by the
// UI): the agent is sent an empty config map, OpAMP's "no remote config".
func (a *API) ClearConfig(ctx context.Context, uid string) (string, error) {
	return a.o.Store.SetDesiredConfig(ctx, uid, "")
}

func (a *API) clearConfig(w http.ResponseWriter, r *http.Request) {
	uid := r.PathValue("uid")
	hash, err := a.ClearConfig(r.Context(), uid)
	if agentErr(w, uid, err) {
		return
	}
	a.o.Log.Info("remote config cleared", "agent", uid, "token", TokenName(r.Context()))
	writeJSON(w, http.StatusAccepted, map[string]string{"instance_uid": uid, "config_hash": hash,
		"status": "cleared; the agent is sent an empty config by the replica it is connected to"})
}
