package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// writeList answers the GET of a list: err as serviceErr (what names the
// object asked about), else the list, wrapped by answer, with an empty
// list as [] rather than null.
func writeList[T any](w http.ResponseWriter, list []T, err error, what string, answer func([]T) any) {
	if err != nil {
		serviceErr(w, err, what)
		return
	}
	if list == nil {
		list = []T{}
	}
	writeJSON(w, http.StatusOK, answer(list))
}

// intents is the answer of the intents endpoints.
func intents[T any](in []T) any { return map[string]any{"intents": in} }

// writeOne answers the GET of one object: err as serviceErr (what names
// the object asked about), else v.
func writeOne(w http.ResponseWriter, v any, err error, what string) {
	if err != nil {
		serviceErr(w, err, what)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// readBody decodes the JSON body of r into v, refusing unknown fields and
// a body over limit bytes; a refused body is answered 400.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, v any) bool {
	var raw bytes.Buffer // for checkJSONText
	dec := json.NewDecoder(io.TeeReader(http.MaxBytesReader(w, r.Body, limit), &raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeErr(w, http.StatusBadRequest, "body: "+err.Error())
		return false
	}
	if err := checkJSONText(raw.Bytes()); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return false
	}
	return true
}

// queryLimit reads the optional query parameter name, an integer within
// [1, most]; def when it is absent. A bad one is answered 400.
func queryLimit(w http.ResponseWriter, r *http.Request, name string, def, most int) (int, bool) {
	l := r.URL.Query().Get(name)
	if l == "" {
		return def, true
	}
	n, err := strconv.Atoi(l)
	if err != nil || n < 1 || n > most {
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("%s: must be an integer within [1, %d]", name, most))
		return 0, false
	}
	return n, true
}

// storedStatus is the status of a PUT or POST that stores: 201 when it
// created something, 200 when it changed or kept what was there.
func storedStatus(created bool) int {
	if created {
		return http.StatusCreated
	}
	return http.StatusOK
}
