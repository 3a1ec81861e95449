package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

func (a *API) getCredential(w http.ResponseWriter, r *http.Request) {
	uid := r.PathValue("uid")
	c, ok, err := a.o.Store.AgentCredentialOf(r.Context(), uid)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	if !ok {
		writeErr(w, http.StatusNotFound, "agent "+uid+" has no credential (it connects with the enrollment secret, or is unknown)")
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// RotateCredential asks the replica agent uid is connected to for a new
// credential (also used by the UI and the CLI through the API).
func (a *API) RotateCredential(ctx context.Context, uid string) error {
	return a.o.Store.RequestCredentialRotation(ctx, uid)
}

func (a *API) rotateCredential(w http.ResponseWriter, r *http.Request) {
	uid := r.PathValue("uid")
	err := a.RotateCredential(r.Context(), uid)
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeErr(w, http.StatusNotFound, "agent "+uid+" has no credential to rotate")
	case errors.Is(err, store.ErrRevoked):
		writeErr(w, http.StatusConflict, "agent "+uid+" is revoked")
	case err != nil:
		writeErr(w, http.StatusInternalServerError, err.Error())
	default:
		a.o.Log.Info("agent credential rotation requested", "agent", uid, "token", TokenName(r.Context()))
		writeJSON(w, http.StatusAccepted, AgentAccepted{InstanceUID: uid, Status: "requested; the replica the agent is connected to sends it a new credential"})
	}
}

// RevokeAgent revokes agent uid: it is disconnected at once on every
// replica and can neither connect nor enroll again (also used by the UI).
func (a *API) RevokeAgent(ctx context.Context, uid string) (store.AgentCredential, error) {
	return a.o.Store.RevokeAgent(ctx, uid, tokenRef(ctx))
}

func (a *API) revokeAgent(w http.ResponseWriter, r *http.Request) {
	uid := r.PathValue("uid")
	c, err := a.RevokeAgent(r.Context(), uid)
	if !agentErr(w, uid, err) {
		a.o.Log.Info("agent revoked", "agent", uid, "by", c.RevokedBy)
		writeJSON(w, http.StatusOK, c)
	}
}

// AllowReenroll lets agent uid enroll once more with the enrollment
// secret although it holds a credential (it lost it, or was reinstalled
// with its old instance UID) or was revoked (the revocation is lifted for
// that one enrollment); without this the secret never replaces an agent's
// credential (also used by the UI and the CLI through the API).
// It is an agent event (reenroll_allowed) and a log line.
func (a *API) AllowReenroll(ctx context.Context, uid string) (store.AgentCredential, error) {
	c, err := a.o.Store.AllowReenroll(ctx, uid, tokenRef(ctx))
	if err != nil {
		return c, err
	}
	a.o.Log.Info("agent re-enrollment allowed", "agent", uid, "by", c.ReenrollAllowedBy)
	err = a.o.Store.InsertEvents(ctx, []store.Event{{InstanceUID: uid, At: time.Now(), Kind: store.EventReenrollAllowed,
		Detail: "the next enrollment with the secret replaces the credential; allowed by " + c.ReenrollAllowedBy}})
	return c, err
}

func (a *API) allowReenroll(w http.ResponseWriter, r *http.Request) {
	uid := r.PathValue("uid")
	c, err := a.AllowReenroll(r.Context(), uid)
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeErr(w, http.StatusNotFound, "agent "+uid+" has no credential and is not revoked (the enrollment secret enrolls it without an allowance)")
	case err != nil:
		writeErr(w, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, http.StatusOK, c)
	}
}
