package api

import (
	"net/http"

	"github.com/myriarch/myriarch/internal/fleet/store"
)

// RegisterUndocumentedForTest registers pattern (viewer) without a Doc:
// the planted case of the document's test.
func (a *API) RegisterUndocumentedForTest(mux *http.ServeMux, pattern string) {
	a.route(mux, store.RoleViewer, pattern, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
}
