// Package openapitest checks the API's answers against its OpenAPI
// document in tests: a round tripper that validates every response to an
// /api/ request with libopenapi-validator, and fails the request (an
// error from RoundTrip, which the test sees) when it does not match.
// Production binaries never link it.
package openapitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"

	"github.com/myriarch/myriarch/internal/fleet/api"
)

// Document returns the OpenAPI document of every route the API registers
// (an API without a store: the document needs only the route table).
func Document() ([]byte, error) {
	a := api.New(api.Options{})
	a.Register(http.NewServeMux())
	doc, err := a.OpenAPI()
	if err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}

// New returns a validator of the API's document, after validating the
// document itself against the OpenAPI 3.1 specification schema.
func New() (validator.Validator, error) {
	b, err := Document()
	if err != nil {
		return nil, err
	}
	return NewFrom(b)
}

// NewFrom is New for a given document.
func NewFrom(doc []byte) (validator.Validator, error) {
	d, err := libopenapi.NewDocument(doc)
	if err != nil {
		return nil, err
	}
	v, errs := validator.NewValidator(d)
	if len(errs) > 0 {
		return nil, fmt.Errorf("openapi validator: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		var msgs []string
		for _, e := range verrs {
			msgs = append(msgs, e.Error())
			for _, se := range e.SchemaValidationErrors {
				msgs = append(msgs, "  "+se.FieldPath+" ("+se.KeywordLocation+"): "+se.Reason)
			}
		}
		return nil, fmt.Errorf("the OpenAPI document is not valid OpenAPI 3.1:\n%s", strings.Join(msgs, "\n"))
	}
	return v, nil
}

var (
	once   sync.Once
	shared validator.Validator
	newErr error
)

// Transport wraps base (http.DefaultTransport when nil): every response
// to a request under /api/ is validated against the document; one that
// does not match its schema (status, content type, body) is an error of
// RoundTrip naming the route and every mismatch.
func Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{base: base}
}

type transport struct{ base http.RoundTripper }

// mu serialises the validator, which is not documented as safe for
// concurrent use.
var mu sync.Mutex

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil || !strings.HasPrefix(req.URL.Path, "/api/") {
		return resp, err
	}
	once.Do(func() { shared, newErr = New() })
	if newErr != nil {
		resp.Body.Close()
		return nil, newErr
	}
	if err := Check(shared, req, resp); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// Check validates resp, the answer to req, against v; resp's body stays
// readable.
func Check(v validator.Validator, req *http.Request, resp *http.Response) error {
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	// The validator reads the request's path and method only; a copy
	// without a body keeps the caller's request untouched.
	r := req.Clone(req.Context())
	r.Body = http.NoBody
	check := *resp
	check.Body = io.NopCloser(bytes.NewReader(body))
	mu.Lock()
	ok, errs := v.ValidateHttpResponse(r, &check)
	mu.Unlock()
	if ok {
		return nil
	}
	for _, e := range errs {
		if e.ValidationType == "path" && resp.StatusCode >= 400 {
			// No route of the document: the /api/ catch-all answered
			// (404, or 401/403 before it), with the error body.
			var eb api.ErrorBody
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			if dec.Decode(&eb) != nil || eb.Error == "" {
				return fmt.Errorf("openapi: the %d of %s %s is not an error body: %s", resp.StatusCode, req.Method, req.URL.Path, body)
			}
			return nil
		}
	}
	var msgs []string
	for _, e := range errs {
		m := e.Message
		if e.Reason != "" {
			m += ": " + e.Reason
		}
		for _, se := range e.SchemaValidationErrors {
			m += "; " + se.FieldPath + " (" + se.KeywordLocation + "): " + se.Reason
		}
		msgs = append(msgs, m)
	}
	snippet := string(body)
	if len(snippet) > 600 {
		snippet = snippet[:600] + "..."
	}
	return fmt.Errorf("openapi: the answer to %s %s (HTTP %d) does not match the API's document: %s\nbody: %s",
		req.Method, req.URL.Path, resp.StatusCode, strings.Join(msgs, " | "), snippet)
}
