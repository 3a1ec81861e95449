package apiclient

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// --ca-file: a server whose certificate a private CA signed is reached
// with that CA and refused without it; the token is sent; an error body
// with problems becomes an *Error.
func TestPrivateCAAndErrors(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get("Authorization") != "Bearer myr_t" {
			w.WriteHeader(401)
			w.Write([]byte(`{"error": "invalid API token"}`))
			return
		}
		if r.Method == "POST" {
			w.WriteHeader(422)
			w.Write([]byte(`{"error": "refused", "problems": [{"file": "config", "line": 3, "field": "a", "message": "unknown key"}]}`))
			return
		}
		w.Write([]byte(`{"configs": [{"name": "web"}]}`))
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c, err := New(Options{Server: srv.URL, Token: "myr_t", CAFile: ca})
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Configs(ctx)
	if err != nil || len(l.Configs) != 1 || l.Configs[0].Name != "web" {
		t.Fatalf("with the CA: %+v %v", l, err)
	}
	_, err = c.AddRevision(ctx, "web", "a: 1")
	var e *Error
	if !errors.As(err, &e) || e.Status != 422 || len(e.Problems) != 1 || e.Problems[0].Line != 3 || !strings.Contains(err.Error(), "refused (HTTP 422 from POST /api/v1/configs/web/revisions)") {
		t.Fatalf("error: %#v", err)
	}
	noCA, _ := New(Options{Server: srv.URL, Token: "myr_t"})
	if _, err := noCA.Configs(ctx); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: %v", err)
	}
	bad, _ := New(Options{Server: srv.URL, Token: "myr_x", CAFile: ca})
	if _, err := bad.Configs(ctx); !errors.As(err, &e) || e.Status != 401 || e.Message != "invalid API token" {
		t.Fatalf("bad token: %v", err)
	}
}

// The command line warns when the token would cross the network in clear
// text; loopback and https:// are quiet.
func TestPlainHTTP(t *testing.T) {
	for server, want := range map[string]bool{
		"http://127.0.0.1:8080": false, "http://localhost:8080": false, "http://[::1]:8080": false,
		"http://127.1.2.3": false, "https://fleet.example.com": false,
		"http://lab:8080": true, "http://10.0.0.5:8080": true, "http://[2001:db8::1]:8080": true,
	} {
		c, err := New(Options{Server: server, Token: "myr_x"})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.PlainHTTP(); got != want {
			t.Errorf("%s: PlainHTTP %v, want %v", server, got, want)
		}
	}
}

// A redirect is not followed: net/http would keep the Authorization
// header on the same host, also from https:// down to http://.
func TestRedirectIsNotFollowed(t *testing.T) {
	var leaked atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/api/v1/overview", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	})
	mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, r *http.Request) {
		leaked.Store(r.Header.Get("Authorization") != "")
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c, err := New(Options{Server: srv.URL, Token: "myr_secret"})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Do(context.Background(), "GET", "/api/v1/overview", nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "redirected to "+srv.URL+"/elsewhere: not followed") {
		t.Fatalf("redirect: %v", err)
	}
	if leaked.Load() {
		t.Fatal("the token followed the redirect")
	}
}
