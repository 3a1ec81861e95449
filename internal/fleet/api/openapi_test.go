package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/api"
	"github.com/myriarch/myriarch/internal/fleet/api/openapitest"
)

// TestOpenAPIDocumentsEveryRoute: every route the API registers is in the
// document (or declared hidden), with its role; the document is valid
// OpenAPI 3.1 by libopenapi-validator; and a route registered without a
// Doc is refused, naming it (the planted case).
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	a := api.New(api.Options{})
	mux := http.NewServeMux()
	a.Register(mux)
	doc, err := a.OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(doc)
	var parsed struct {
		OpenAPI string
		Paths   map[string]map[string]struct {
			Role      string `json:"x-myriarch-role"`
			Responses map[string]any
		}
	}
	if err := json.Unmarshal(b, &parsed); err != nil {
		t.Fatal(err)
	}
	if parsed.OpenAPI != "3.1.0" {
		t.Fatalf("openapi %q", parsed.OpenAPI)
	}
	documented := 0
	for _, rt := range a.Routes() {
		method, path, ok := strings.Cut(rt.Pattern, " ")
		if !ok {
			if rt.Pattern != "/api/" {
				t.Errorf("route %q without a method", rt.Pattern)
			}
			continue
		}
		op, ok := parsed.Paths[path][strings.ToLower(method)]
		if !ok {
			t.Errorf("route %q is not in the document", rt.Pattern)
			continue
		}
		if op.Role != string(rt.Role) {
			t.Errorf("route %q: x-myriarch-role %q, registered with %q", rt.Pattern, op.Role, rt.Role)
		}
		if _, ok := op.Responses["default"]; !ok {
			t.Errorf("route %q: no error response", rt.Pattern)
		}
		documented++
	}
	if documented < 40 {
		t.Fatalf("only %d routes documented", documented)
	}
	if _, err := openapitest.NewFrom(b); err != nil {
		t.Fatal(err)
	}

	// Planted: a route added without a Doc.
	planted := api.New(api.Options{})
	pm := http.NewServeMux()
	planted.Register(pm)
	planted.RegisterUndocumentedForTest(pm, "GET /api/v1/planted-undocumented")
	if _, err := planted.OpenAPI(); err == nil || !strings.Contains(err.Error(), `route "GET /api/v1/planted-undocumented" has no entry in routeDocs`) {
		t.Fatalf("an undocumented route was not refused: %v", err)
	}
}

// The validating transport catches an answer that breaks its schema (a
// missing required field, a field the document does not know, a wrong
// type) and passes one that matches.
func TestValidatingTransportCatchesAWrongAnswer(t *testing.T) {
	v, err := openapitest.New()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		body string
		code int
		ok   bool
	}{
		{`{"configs": []}`, 200, true},
		{`{"configs": null}`, 200, true},
		{`{"error": "no configuration x"}`, 404, true},
		{`{"error": "refused", "problems": [{"file": "config", "line": 3, "field": "a", "message": "m"}]}`, 422, true},
		{`{}`, 200, false},
		{`{"configs": [], "extra": 1}`, 200, false},
		{`{"configs": [{"name": 1}]}`, 200, false},
		{`{"message": "no"}`, 500, false},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(c.code)
			io.WriteString(w, c.body)
		}))
		req, _ := http.NewRequest("GET", srv.URL+"/api/v1/configs", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		err = openapitest.Check(v, req, resp)
		got, _ := io.ReadAll(resp.Body)
		srv.Close()
		if (err == nil) != c.ok {
			t.Errorf("%d %s: valid=%v, want %v (%v)", c.code, c.body, err == nil, c.ok, err)
		}
		if !bytes.Equal(got, []byte(c.body)) {
			t.Errorf("body after the check: %q", got)
		}
	}
}
