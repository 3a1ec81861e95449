package api

import (
	"encoding"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/version"
)

// The OpenAPI 3.1 document of the API (GET /api/v1/openapi.json) is built
// from the route table: every route registered through a.route or
// a.public has a Doc in routeDocs (openapi_routes.go) naming its request
// and response Go types; their schemas are derived by reflection from the
// types and their json tags, so a field added to a response type is in
// the document without a second edit. The role a route needs comes from
// its registration (x-myriarch-role), not from the Doc. A route without a
// Doc fails TestOpenAPIDocumentsEveryRoute; a response that does not match
// its schema fails the API tests (they validate every response).

// Doc describes one route for the OpenAPI document.
type Doc struct {
	Summary string
	// Query lists the query parameters: name → description.
	Query map[string]string
	// Request is a value of the JSON request body's type; nil: no body.
	Request any
	// Status is the success status (default 200); Also lists other
	// success statuses with the same body (a PUT that creates: 201).
	Status int
	Also   []int
	// Response is a value of the success body's type; nil with NoBody
	// for an empty answer (204, 202 without a body).
	Response any
	NoBody   bool
	// Text is the content type of a body that is not JSON (probes, metrics).
	Text string
	// Hidden routes are registered but not in the document (the /api/
	// catch-all, which answers 404 to what no other route matches); the
	// text says why.
	Hidden string
}

// ErrorBody is the body of every answer of the API that is not a success.
type ErrorBody struct {
	Error string `json:"error"`
	// Problems are the located problems of refused content (a
	// configuration revision, an agent's remote configuration): file
	// ("config" for content sent in a request), line, field and message.
	Problems []Problem `json:"problems,omitempty"`
}

// Problem is one located problem of refused content.
type Problem struct {
	File    string `json:"file"`
	Line    int    `json:"line,omitempty"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// problemRE finds a located problem in a validation error's text, as the
// configuration checks write them: "<file>:<line>: <field>: <message>",
// one a line; the first may follow a prefix ("content (type
// myriarch-bridge): refused by the bridge's check: ").
var problemRE = regexp.MustCompile(`(?:^|: )(config):(\d+): (?:([A-Za-z_][\w.\[\]-]*): )?(.*)$`)

// yamlLineRE finds the line of a YAML syntax error ("line 3: did not find ...").
var yamlLineRE = regexp.MustCompile(`not well-formed YAML: (?:yaml: )?line (\d+): (.*)$`)

// problemsOf extracts the located problems from an error message of
// refused content; nil when it names no line.
func problemsOf(msg string) []Problem {
	var ps []Problem
	for _, line := range strings.Split(msg, "\n") {
		if m := problemRE.FindStringSubmatch(line); m != nil {
			var n int
			fmt.Sscan(m[2], &n)
			ps = append(ps, Problem{File: m[1], Line: n, Field: m[3], Message: m[4]})
		} else if m := yamlLineRE.FindStringSubmatch(line); m != nil {
			var n int
			fmt.Sscan(m[1], &n)
			ps = append(ps, Problem{File: "config", Line: n, Message: "not well-formed YAML: " + m[2]})
		}
	}
	return ps
}

// OpenAPI returns the OpenAPI 3.1 document of the registered routes
// (after Register). It fails on a route without a Doc and on a type the
// reflection cannot describe.
func (a *API) OpenAPI() (map[string]any, error) {
	g := &schemaGen{defs: map[string]any{}, names: map[reflect.Type]string{}}
	paths := map[string]map[string]any{}
	var errs []string
	for _, rt := range a.routes {
		d, ok := routeDocs[rt.Pattern]
		if !ok {
			errs = append(errs, fmt.Sprintf("route %q has no entry in routeDocs (internal/fleet/api/openapi_routes.go)", rt.Pattern))
			continue
		}
		if d.Hidden != "" {
			continue
		}
		method, path, ok := strings.Cut(rt.Pattern, " ")
		if !ok {
			errs = append(errs, fmt.Sprintf("route %q: a documented route needs a method", rt.Pattern))
			continue
		}
		op, err := g.operation(rt, d, path)
		if err != nil {
			errs = append(errs, fmt.Sprintf("route %q: %v", rt.Pattern, err))
			continue
		}
		if paths[path] == nil {
			paths[path] = map[string]any{}
		}
		paths[path][strings.ToLower(method)] = op
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("openapi: %s", strings.Join(errs, "; "))
	}
	return map[string]any{
		"openapi":           "3.1.0",
		"jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
		"info": map[string]any{
			"title":   "myriarchd REST API",
			"version": version.String(),
			"description": "The fleet control plane's API. Every /api/v1 endpoint except this document needs an API token " +
				"(Authorization: Bearer myr_...) whose role allows the endpoint's x-myriarch-role (viewer < operator < admin). " +
				"Every answer that is not a success has the body ErrorBody.",
		},
		"paths": paths,
		"components": map[string]any{
			"schemas": g.defs,
			"securitySchemes": map[string]any{
				"token": map[string]any{"type": "http", "scheme": "bearer", "description": "an API token (myriarchd token create)"},
			},
		},
	}, nil
}

var pathParamRE = regexp.MustCompile(`\{([^}$]+)\}`)

func (g *schemaGen) operation(rt Route, d Doc, path string) (map[string]any, error) {
	op := map[string]any{"operationId": operationID(rt.Pattern), "x-myriarch-role": string(rt.Role)}
	if d.Summary != "" {
		op["summary"] = d.Summary
	}
	if rt.Role != Public {
		op["security"] = []any{map[string]any{"token": []any{}}}
		op["description"] = "Needs a token with role " + string(rt.Role) + " or above."
	} else {
		op["security"] = []any{}
		op["description"] = "Needs no token."
	}
	var params []any
	for _, m := range pathParamRE.FindAllStringSubmatch(path, -1) {
		typ := map[string]any{"type": "string"}
		if m[1] == "id" || m[1] == "rev" {
			typ = map[string]any{"type": "integer", "minimum": 1}
		}
		params = append(params, map[string]any{"name": m[1], "in": "path", "required": true, "schema": typ})
	}
	qs := make([]string, 0, len(d.Query))
	for q := range d.Query {
		qs = append(qs, q)
	}
	slices.Sort(qs)
	for _, q := range qs {
		params = append(params, map[string]any{"name": q, "in": "query", "required": false, "description": d.Query[q], "schema": map[string]any{"type": "string"}})
	}
	if len(params) > 0 {
		op["parameters"] = params
	}
	if d.Request != nil {
		s, err := g.schema(reflect.TypeOf(d.Request))
		if err != nil {
			return nil, err
		}
		op["requestBody"] = map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{"schema": s}}}
	}
	status := d.Status
	if status == 0 {
		status = http.StatusOK
	}
	ok := map[string]any{"description": http.StatusText(status)}
	switch {
	case d.Text != "":
		ok["content"] = map[string]any{d.Text: map[string]any{"schema": map[string]any{"type": "string"}}}
	case d.NoBody:
	case d.Response == nil:
		return nil, fmt.Errorf("no Response type (set NoBody for an empty answer)")
	default:
		s, err := g.schema(reflect.TypeOf(d.Response))
		if err != nil {
			return nil, err
		}
		ok["content"] = map[string]any{"application/json": map[string]any{"schema": s}}
	}
	responses := map[string]any{}
	for _, c := range append([]int{status}, d.Also...) {
		responses[fmt.Sprint(c)] = ok
	}
	if d.Text != "" {
		responses["default"] = map[string]any{"description": "failure", "content": map[string]any{d.Text: map[string]any{"schema": map[string]any{"type": "string"}}}}
	} else {
		eb, err := g.schema(reflect.TypeFor[ErrorBody]())
		if err != nil {
			return nil, err
		}
		responses["default"] = map[string]any{"description": "refused or failed (400, 401, 403, 404, 409, 413, 422, 429, 500, 503)",
			"content": map[string]any{"application/json": map[string]any{"schema": eb}}}
	}
	op["responses"] = responses
	return op, nil
}

// operationID is a stable identifier of a route: "GET /api/v1/agents/{uid}"
// → "get_agents_uid".
func operationID(pattern string) string {
	method, path, _ := strings.Cut(pattern, " ")
	path = strings.TrimPrefix(path, "/api/v1")
	var b strings.Builder
	b.WriteString(strings.ToLower(method))
	for _, r := range path {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case r >= 'A' && r <= 'Z':
			b.WriteRune(r + 'a' - 'A')
		case r == '/' || r == '-':
			b.WriteByte('_')
		}
	}
	return strings.TrimRight(strings.ReplaceAll(b.String(), "__", "_"), "_")
}

// schemaGen derives JSON Schemas (OpenAPI 3.1, JSON Schema 2020-12) from
// Go types as encoding/json marshals them. Named struct types become
// components (by package and name, "store.Agent") referenced with $ref.
type schemaGen struct {
	defs  map[string]any
	names map[reflect.Type]string
}

var (
	timeType      = reflect.TypeFor[time.Time]()
	rawType       = reflect.TypeFor[json.RawMessage]()
	marshalerType = reflect.TypeFor[json.Marshaler]()
	textType      = reflect.TypeFor[encoding.TextMarshaler]()
	roleType      = reflect.TypeFor[store.Role]()
)

// customJSON describes the types whose MarshalJSON adds to their fields:
// the extra properties, with their schemas. A type with its own
// MarshalJSON that is not here is refused, so that the document cannot
// silently describe something else than what is sent.
var customJSON = map[reflect.Type]map[string]any{
	reflect.TypeFor[store.Agent](): {
		"capability_names": map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
		"bridge_id":        map[string]any{"type": "string", "description": "the bridge id a myriarch-bridge reports (\"\" for other agents)"},
		"roles":            map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "description": "the distinct roles of the bridge's sessions"},
	},
}

func nullable(s map[string]any) map[string]any {
	if t, ok := s["type"].(string); ok {
		s["type"] = []any{t, "null"}
	}
	return s
}

// schema returns the schema of t (a $ref for a named struct).
func (g *schemaGen) schema(t reflect.Type) (map[string]any, error) {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}, nil
	case t == rawType:
		return map[string]any{}, nil // any JSON value
	case t == roleType:
		return map[string]any{"type": "string", "enum": []any{string(store.RoleViewer), string(store.RoleOperator), string(store.RoleAdmin)}}, nil
	}
	if _, custom := customJSON[t]; !custom && t.Kind() != reflect.Pointer && t.Kind() != reflect.Interface &&
		(t.Implements(marshalerType) || t.Implements(textType)) {
		return nil, fmt.Errorf("type %v has its own JSON encoding: describe it in customJSON", t)
	}
	switch t.Kind() {
	case reflect.Pointer:
		s, err := g.schema(t.Elem())
		if err != nil {
			return nil, err
		}
		if _, ref := s["$ref"]; ref {
			return map[string]any{"anyOf": []any{s, map[string]any{"type": "null"}}}, nil
		}
		return nullable(s), nil
	case reflect.Bool:
		return map[string]any{"type": "boolean"}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}, nil
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}, nil
	case reflect.String:
		return map[string]any{"type": "string"}, nil
	case reflect.Interface:
		return map[string]any{}, nil
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": []any{"string", "null"}, "contentEncoding": "base64"}, nil
		}
		items, err := g.schema(t.Elem())
		if err != nil {
			return nil, err
		}
		// A nil slice is sent as null.
		return map[string]any{"type": []any{"array", "null"}, "items": items}, nil
	case reflect.Array:
		items, err := g.schema(t.Elem())
		return map[string]any{"type": "array", "items": items}, err
	case reflect.Map:
		if t.Key().Kind() != reflect.String && !t.Key().Implements(textType) && !isInt(t.Key().Kind()) {
			return nil, fmt.Errorf("map key type %v cannot be JSON", t.Key())
		}
		v, err := g.schema(t.Elem())
		if err != nil {
			return nil, err
		}
		return map[string]any{"type": []any{"object", "null"}, "additionalProperties": v}, nil
	case reflect.Struct:
		return g.structRef(t)
	}
	return nil, fmt.Errorf("type %v (%v) cannot be described", t, t.Kind())
}

func isInt(k reflect.Kind) bool {
	return k >= reflect.Int && k <= reflect.Uint64
}

// structRef puts the schema of struct t into the components (once) and
// returns a reference to it; an anonymous struct is inlined.
func (g *schemaGen) structRef(t reflect.Type) (map[string]any, error) {
	if t.Name() == "" {
		return g.structSchema(t)
	}
	name, ok := g.names[t]
	if !ok {
		name = componentName(t)
		for _, taken := range g.names {
			if taken == name {
				return nil, fmt.Errorf("two types are named %s", name)
			}
		}
		g.names[t] = name
		g.defs[name] = map[string]any{} // placeholder: recursive types
		s, err := g.structSchema(t)
		if err != nil {
			return nil, err
		}
		g.defs[name] = s
	}
	return map[string]any{"$ref": "#/components/schemas/" + name}, nil
}

// componentName is "pkg.Type", with the package's last path element.
func componentName(t reflect.Type) string {
	pkg := t.PkgPath()
	if i := strings.LastIndex(pkg, "/"); i >= 0 {
		pkg = pkg[i+1:]
	}
	return pkg + "." + t.Name()
}

// structSchema describes the fields of t as encoding/json writes them:
// the json tag's name, embedded structs flattened, "-" left out; a field
// without omitempty is required. No other property is allowed, so that a
// field sent but not described fails the validation.
func (g *schemaGen) structSchema(t reflect.Type) (map[string]any, error) {
	props := map[string]any{}
	var required []string
	if err := g.fields(t, props, &required, map[string]bool{}); err != nil {
		return nil, err
	}
	for k, v := range customJSON[t] {
		props[k] = v
		required = append(required, k)
	}
	slices.Sort(required)
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	return s, nil
}

func (g *schemaGen) fields(t reflect.Type, props map[string]any, required *[]string, seen map[string]bool) error {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		ft := f.Type
		if f.Anonymous && name == "" {
			et := ft
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				if _, custom := customJSON[et]; custom || et.Implements(marshalerType) {
					return fmt.Errorf("%v embeds %v, which has its own JSON encoding (the embedding struct marshals as it alone)", t, et)
				}
				if err := g.fields(et, props, required, seen); err != nil {
					return err
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if seen[name] {
			continue // the shallower field wins, as in encoding/json
		}
		seen[name] = true
		var s map[string]any
		var err error
		if strings.Contains(opts, "string") {
			s = map[string]any{"type": "string"}
		} else if s, err = g.schema(ft); err != nil {
			return fmt.Errorf("%v.%s: %w", t, f.Name, err)
		}
		props[name] = s
		if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
			*required = append(*required, name)
		}
	}
	return nil
}

// serveOpenAPI answers GET /api/v1/openapi.json.
func (a *API) serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	doc, err := a.OpenAPI()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, doc)
}
