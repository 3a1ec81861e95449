package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// badText says why s cannot reach PostgreSQL as text ("" when it can):
// text holds neither NUL nor invalid UTF-8, and a query that carries them
// fails in the database with a SQLSTATE that is no answer for a client.
func badText(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "must be valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "must not contain NUL (U+0000)"
	}
	return ""
}

// CheckRequestText refuses a path or query parameter that PostgreSQL
// cannot store as text (NUL, invalid UTF-8), naming it: a 400, where the
// database would answer a 500 with a SQLSTATE. The UI checks its pages'
// parameters with it too.
func CheckRequestText(r *http.Request) error {
	if why := badText(r.URL.Path); why != "" {
		return fmt.Errorf("path %q: %s", r.URL.Path, why)
	}
	for k, vs := range r.URL.Query() {
		if why := badText(k); why != "" {
			return fmt.Errorf("query parameter %q: %s", k, why)
		}
		for _, v := range vs {
			if why := badText(v); why != "" {
				return fmt.Errorf("query parameter %s %q: %s", k, v, why)
			}
		}
	}
	return nil
}

// checkJSONText finds a string of a JSON body that holds NUL (encoding/json
// turns invalid UTF-8 into U+FFFD, so NUL is the one left), naming the key
// it is the value of. A body that is not JSON passes: the decoder refuses
// it with its own message.
func checkJSONText(body []byte) error {
	if !bytes.Contains(body, []byte(`\u0000`)) && bytes.IndexByte(body, 0) < 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	// For each open object or array: whether it is an object, and
	// whether its next string is a key.
	type frame struct{ obj, wantKey bool }
	var stack []frame
	key := ""
	for {
		tok, err := dec.Token()
		if err != nil { // io.EOF, or not JSON: the decoder said so already
			return nil
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{':
				stack = append(stack, frame{obj: true, wantKey: true})
			case '[':
				stack = append(stack, frame{})
			default:
				stack = stack[:len(stack)-1]
				if n := len(stack); n > 0 && stack[n-1].obj {
					stack[n-1].wantKey = true
				}
			}
			continue
		}
		s, isString := tok.(string)
		if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].wantKey {
			stack[n-1].wantKey = false
			if isString && strings.IndexByte(s, 0) >= 0 {
				return fmt.Errorf("body: key %q: must not contain NUL (U+0000)", s)
			}
			key = s
			continue
		}
		if isString && strings.IndexByte(s, 0) >= 0 {
			return fmt.Errorf("body: %s %q: must not contain NUL (U+0000)", key, s)
		}
		if n := len(stack); n > 0 && stack[n-1].obj {
			stack[n-1].wantKey = true
		}
	}
}
