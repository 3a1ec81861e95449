package api

import (
	"net/http"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// TokenRequest is the body of POST /api/v1/tokens.
type TokenRequest struct {
	Name string `json:"name"`
	// Role is viewer, operator or admin.
	Role store.Role `json:"role"`
}

// NewToken is the answer of POST /api/v1/tokens: the stored record and
// the token itself, which is shown this once (only its hash is kept).
type NewToken struct {
	Token  store.Token `json:"token"`
	Secret string      `json:"secret"`
}

// createToken creates an API token (admin). It is logged with the token
// that created it, as revocations are.
func (a *API) createToken(w http.ResponseWriter, r *http.Request) {
	var req TokenRequest
	if !a.readJSON(w, r, &req, `{"name": "<name>", "role": "viewer|operator|admin"}`) {
		return
	}
	if err := store.CheckTokenName(req.Name); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	if _, err := store.ParseRole(string(req.Role)); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	t, secret, err := a.o.Store.IssueTokenRole(r.Context(), req.Name, req.Role)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	a.o.Log.Info("API token created", "id", t.ID, "name", t.Name, "role", t.Role, "by", tokenRef(r.Context()))
	writeJSON(w, http.StatusCreated, NewToken{Token: t, Secret: secret})
}
