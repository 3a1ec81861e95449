package releases_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/releases"
)

// githubReplay serves the recorded GitHub REST answers of testdata/github
// the way GitHub does: Link pagination, rate-limit headers, ETags and 304
// for a matching If-None-Match.
type githubReplay struct {
	base      string
	files     map[string][]byte
	requests  atomic.Int64
	notMod    atomic.Int64
	exhausted atomic.Bool
	auth      atomic.Value
}

func (g *githubReplay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.requests.Add(1)
	if a := r.Header.Get("Authorization"); a != "" {
		g.auth.Store(a)
	}
	reset := time.Date(2026, 11, 30, 18, 0, 0, 0, time.UTC).Unix()
	w.Header().Set("X-RateLimit-Limit", "5000")
	w.Header().Set("X-RateLimit-Reset", fmt.Sprint(reset))
	w.Header().Set("X-RateLimit-Resource", "core")
	if g.exhausted.Load() {
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Used", "5000")
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"message":"API rate limit exceeded for user ID 1.","documentation_url":"https://docs.github.com/rest/overview/resources-in-the-rest-api#rate-limiting"}`)
		return
	}
	w.Header().Set("X-RateLimit-Remaining", "4990")
	switch {
	case r.URL.Path == "/api/v3/repos/myriarch/otelcol-dist/releases":
		page := r.URL.Query().Get("page")
		name, etag := "releases_page1.json", `W/"a1b2c3-page1"`
		if page == "2" {
			name, etag = "releases_page2.json", `W/"a1b2c3-page2"`
		} else {
			next := g.base + "/api/v3/repos/myriarch/otelcol-dist/releases?page=2&per_page=100"
			w.Header().Set("Link", fmt.Sprintf(`<%s>; rel="next", <%s>; rel="last"`, next, next))
		}
		w.Header().Set("ETag", etag)
		if r.Header.Get("If-None-Match") == etag {
			g.notMod.Add(1)
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Write(g.files[name])
	case strings.HasSuffix(r.URL.Path, "/releases/download/v1.0.0/checksums.txt"):
		w.Write(g.files["checksums"])
	default:
		http.NotFound(w, r)
	}
}

func TestGitHubListerReplaysReleasesPaginationETagsAndRateLimit(t *testing.T) {
	g := &githubReplay{files: map[string][]byte{}}
	srv := httptest.NewServer(g)
	defer srv.Close()
	g.base = srv.URL
	shas := map[string]string{
		"SHA_110_LINUX_AMD64":  strings.TrimPrefix(digestOf([]byte("linux 1.1.0")), "sha256:"),
		"SHA_110_DARWIN_ARM64": strings.TrimPrefix(digestOf([]byte("darwin 1.1.0")), "sha256:"),
	}
	for _, n := range []string{"releases_page1.json", "releases_page2.json"} {
		b, err := os.ReadFile("testdata/github/" + n)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(b), "{{BASE}}", srv.URL)
		for k, v := range shas {
			s = strings.ReplaceAll(s, "{{"+k+"}}", v)
		}
		g.files[n] = []byte(s)
	}
	sumLinux := strings.TrimPrefix(digestOf([]byte("linux 1.0.0")), "sha256:")
	g.files["checksums"] = []byte(sumLinux + "  otelcol_1.0.0_linux_amd64.tar.gz\n" +
		strings.ToUpper(strings.TrimPrefix(digestOf([]byte("win 1.0.0")), "sha256:")) + " *otelcol_1.0.0_windows_amd64.zip\n")

	l, err := releases.NewGitHubLister(srv.URL+"/", "ghp_testtoken", nil)
	if err != nil {
		t.Fatal(err)
	}
	src := releases.Source{Name: "otelcol", Type: "github", Source: "myriarch/otelcol-dist", Constraint: ">= 1.0.0", PollInterval: time.Minute}
	ctx := context.Background()
	rels, err := l.List(ctx, src, func(string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	if len(rels) != 2 || rels[0].Version != "v1.1.0" || rels[1].Version != "v1.0.0" {
		t.Fatalf("releases: %+v", rels)
	}
	if !rels[0].PublishedAt.Equal(time.Date(2026, 11, 10, 9, 1, 2, 0, time.UTC)) || len(rels[0].Assets) != 2 ||
		rels[0].Assets[0].Digest != "sha256:"+shas["SHA_110_LINUX_AMD64"] || rels[0].Assets[1].OS != "darwin" || rels[0].Assets[1].Arch != "arm64" {
		t.Fatalf("v1.1.0 (digests from the API): %+v", rels[0])
	}
	v100 := rels[1]
	if len(v100.Assets) != 2 || v100.Assets[0].Digest != "sha256:"+sumLinux || v100.Assets[1].OS != "windows" ||
		v100.Assets[1].Digest != digestOf([]byte("win 1.0.0")) || !strings.HasSuffix(v100.Assets[0].URL, "/download/v1.0.0/otelcol_1.0.0_linux_amd64.tar.gz") {
		t.Fatalf("v1.0.0 (digests from checksums.txt): %+v", v100)
	}
	if a, _ := g.auth.Load().(string); a != "Bearer ghp_testtoken" {
		t.Fatalf("authorization sent: %q", a)
	}
	if rem, reset := l.RateLimit(); rem != 4990 || reset.Unix() != time.Date(2026, 11, 30, 18, 0, 0, 0, time.UTC).Unix() {
		t.Fatalf("rate limit: %d %s", rem, reset)
	}

	// Polling again: both pages answer 304 (no rate-limit cost), nothing new.
	before := g.requests.Load()
	rels, err = l.List(ctx, src, func(v string) bool { return v == "v1.1.0" || v == "v1.0.0" })
	if err != nil || len(rels) != 0 {
		t.Fatalf("second poll: %v %+v", err, rels)
	}
	if g.notMod.Load() != 2 || g.requests.Load()-before != 2 {
		t.Fatalf("want 2 conditional requests answered 304, got %d 304s of %d requests", g.notMod.Load(), g.requests.Load()-before)
	}

	// An exhausted rate limit stops the poll with the reset time.
	g.exhausted.Store(true)
	_, err = l.List(ctx, src, func(string) bool { return false })
	if err == nil || !strings.Contains(err.Error(), "rate limit exhausted") || !strings.Contains(err.Error(), "2026-11-30T18:00:00Z") {
		t.Fatalf("want a rate-limit error naming the reset, got %v", err)
	}
}
