package gitops_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/fleet/config"
	"github.com/myriarch/myriarch/internal/fleet/daemon"
	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/gitops"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/pgleader"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const secret = "0123456789abcdef-secret"

const httpBackend = "/usr/lib/git-core/git-http-backend"

// gitBin finds git; without it the test skips, except under CI=true.
func gitBin(t *testing.T) {
	t.Helper()
	_, err1 := exec.LookPath("git")
	_, err2 := os.Stat(httpBackend)
	if err1 == nil && err2 == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("git and git-http-backend are required (apt-get install -y git)")
	}
	t.Skip("git not installed (apt-get install -y git)")
}

// repo is a bare repository and a working clone that pushes to it.
type repo struct {
	t          *testing.T
	bare, work string
}

func (r *repo) git(dir string, args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=Ada Ops", "GIT_AUTHOR_EMAIL=ada@example.com",
		"GIT_COMMITTER_NAME=Ada Ops", "GIT_COMMITTER_EMAIL=ada@example.com", "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("git %q: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func newRepo(t *testing.T) *repo {
	dir := t.TempDir()
	r := &repo{t: t, bare: filepath.Join(dir, "configs.git"), work: filepath.Join(dir, "work")}
	r.git(dir, "init", "-q", "--bare", "-b", "main", r.bare)
	r.git(dir, "clone", "-q", r.bare, r.work)
	r.git(r.work, "checkout", "-q", "-b", "main")
	return r
}

// commit writes files (empty content removes one), commits and pushes;
// it returns the commit id.
func (r *repo) commit(msg string, files map[string]string) string {
	r.t.Helper()
	for name, body := range files {
		p := filepath.Join(r.work, name)
		if body == "" {
			r.git(r.work, "rm", "-q", name)
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			r.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			r.t.Fatal(err)
		}
		r.git(r.work, "add", name)
	}
	r.git(r.work, "commit", "-q", "-m", msg)
	r.git(r.work, "push", "-q", "origin", "main")
	return r.git(r.work, "rev-parse", "HEAD")
}

func startDaemon(t *testing.T, pg *pgtest.Cluster, extra map[string]string) *daemon.Daemon {
	t.Helper()
	ov := map[string]string{
		"database.url": pg.DSN(""), "server.enrollmentSecret": secret, "ha.replicaId": "replica-g",
		"server.opampListen": "127.0.0.1:0", "server.httpListen": "127.0.0.1:0", "ha.leaderSessionTimeout": "10s",
		"ha.heartbeatInterval": "1s", "server.lastSeenFlushInterval": "200ms", "jobs.rolloutInterval": "100ms",
	}
	for k, v := range extra {
		ov[k] = v
	}
	cfg, err := config.Load(config.Source{Environ: []string{}, Overrides: ov})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := daemon.Start(ctx, daemon.Options{Config: cfg, Log: slog.New(slog.DiscardHandler), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Shutdown() })
	if !fleettest.Eventually(30*time.Second, d.Elector.IsLeader) {
		t.Fatal("no leader")
	}
	return d
}

const index1 = `configs:
  - name: edge
    file: edge.yaml
    selector: role=edge
    priority: 10
    rollout:
      waves: ["100%"]
      bake_s: 0
  - name: core
    file: core/core.yaml
    selector: role=core
`

// Polling a bare repository over file://: new commits become revisions of
// the changed files only, with the commit id and author; a commit with a
// bad file writes nothing and says why; a configuration removed from the
// index is marked deleted; a poll whose term ends before it commits writes
// nothing.
func TestPollFileRepository(t *testing.T) {
	gitBin(t)
	r := newRepo(t)
	pg := pgtest.New(t)
	d := startDaemon(t, pg, nil)
	ctx := context.Background()
	p := gitops.New(gitops.Options{Store: d.Store, LockKey: 7012024, RepoURL: "file://" + r.bare, Ref: "main", Path: "fleet", PollInterval: time.Hour})
	fence := d.Elector.InTerm

	c1 := r.commit("first", map[string]string{"fleet/myriarch-configs.yaml": index1, "fleet/edge.yaml": "edge: 1\n", "fleet/core/core.yaml": "core: 1\n"})
	res, err := p.Poll(ctx, fence)
	if err != nil {
		t.Fatal(err)
	}
	if res.Commit != c1 || len(res.Revisions) != 2 || len(res.Rollouts) != 1 {
		t.Fatalf("first poll: %+v", res)
	}
	rev, err := store.GetRevision(ctx, d.Store.Pool, "edge", 1)
	if err != nil || rev.SourceCommit != c1 || rev.Author != "Ada Ops <ada@example.com>" || rev.Content != "edge: 1\n" {
		t.Fatalf("edge revision 1: %+v %v", rev, err)
	}
	c, _ := store.GetConfig(ctx, d.Store.Pool, "edge")
	if c.Source != "git" || c.SourcePath != "fleet/edge.yaml" || c.Priority != 10 || c.Selector["role"] != "edge" {
		t.Errorf("edge: %+v", c)
	}
	// The same commit again changes nothing.
	if res, err = p.Poll(ctx, fence); err != nil || res.Changed {
		t.Fatalf("second poll: %+v %v", res, err)
	}
	// Only the changed file gets a revision.
	c2 := r.commit("edge 2", map[string]string{"fleet/edge.yaml": "edge: 2\n", "README.md": "not a config\n"})
	if res, err = p.Poll(ctx, fence); err != nil || len(res.Revisions) != 1 || res.Revisions[0] != "edge@2" || res.Commit != c2 {
		t.Fatalf("poll of c2: %+v %v", res, err)
	}
	if revs, _ := store.Revisions(ctx, d.Store.Pool, "core"); len(revs) != 1 {
		t.Errorf("core got a revision for an unchanged file: %+v", revs)
	}
	// A bad file: nothing of the commit is written, the error names it.
	c3 := r.commit("bad", map[string]string{"fleet/edge.yaml": "edge: 3\n", "fleet/core/core.yaml": "core: [\n"})
	_, err = p.Poll(ctx, fence)
	if err == nil || !strings.Contains(err.Error(), "fleet/myriarch-configs.yaml: configs[1] (core): fleet/core/core.yaml: content (type yaml): not well-formed YAML") {
		t.Fatalf("bad commit: %v", err)
	}
	if revs, _ := store.Revisions(ctx, d.Store.Pool, "edge"); len(revs) != 2 {
		t.Errorf("edge of a refused commit was stored: %d revisions", len(revs))
	}
	st, _, _ := gitops.GetStatus(ctx, d.Store.Pool, p.Source())
	if st.LastCommit != c2 || !strings.Contains(st.LastError, "commit "+c3) {
		t.Errorf("status after a bad commit: %+v", st)
	}
	// Fixed, and core removed from the index: core is marked deleted.
	index2 := strings.Split(index1, "  - name: core")[0]
	c4 := r.commit("drop core", map[string]string{"fleet/myriarch-configs.yaml": index2, "fleet/core/core.yaml": ""})
	if res, err = p.Poll(ctx, fence); err != nil || res.Commit != c4 || len(res.Deleted) != 1 || res.Deleted[0] != "core" {
		t.Fatalf("poll of c4: %+v %v", res, err)
	}
	if c, _ := store.GetConfig(ctx, d.Store.Pool, "core"); c.DeletedAt == nil {
		t.Error("core not marked deleted")
	}
	st, _, _ = gitops.GetStatus(ctx, d.Store.Pool, p.Source())
	if st.LastCommit != c4 || st.LastChangeAt == nil {
		t.Errorf("status: %+v", st)
	}

	// A poll whose transaction cannot commit in its term writes nothing:
	// this fence runs the writes and then finds the term gone.
	stale := func(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, d.Store.Pool, func(tx pgx.Tx) error {
			if err := fn(ctx, tx); err != nil {
				return err
			}
			return &pgleader.StaleTermError{Reason: "test: the term ended before the commit"}
		})
	}
	r.commit("edge 5", map[string]string{"fleet/edge.yaml": "edge: 5\n"})
	if _, err = p.Poll(ctx, stale); !errors.Is(err, pgleader.ErrStaleTerm) {
		t.Fatalf("stale poll: %v", err)
	}
	if revs, _ := store.Revisions(ctx, d.Store.Pool, "edge"); len(revs) != 3 {
		t.Errorf("a poll of an ended term stored revisions: %d (want 3: 1, 2 and the 3 of c4)", len(revs))
	}
	if st2, _, _ := gitops.GetStatus(ctx, d.Store.Pool, p.Source()); st2.LastCommit != c4 {
		t.Errorf("a poll of an ended term moved the status: %+v", st2)
	}
	// Auto rollouts: each new revision of edge started one.
	rs, err := rollout.Service{Store: d.Store}.List(ctx, "edge", 10)
	if err != nil || len(rs) < 1 || !strings.HasPrefix(rs[len(rs)-1].CreatedBy, "gitops ") {
		t.Errorf("auto rollouts: %+v %v", rs, err)
	}
}

// Smart HTTP through git http-backend with a token, and the webhook of a
// replica configured with gitops.*: a verified push polls at once.
func TestPollSmartHTTPAndWebhook(t *testing.T) {
	gitBin(t)
	r := newRepo(t)
	const token = "glpat-test-token"
	backend := &cgi.Handler{Path: httpBackend, Root: "/git",
		Env: []string{"GIT_PROJECT_ROOT=" + filepath.Dir(r.bare), "GIT_HTTP_EXPORT_ALL=1"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if u, p, ok := req.BasicAuth(); !ok || u != "oauth2" || p != token {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, req)
	}))
	defer srv.Close()
	url := srv.URL + "/git/configs.git"
	r.commit("first", map[string]string{"myriarch-configs.yaml": "configs:\n  - name: web\n    file: web.yaml\n", "web.yaml": "web: 1\n"})

	pg := pgtest.New(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, pg, map[string]string{"gitops.repoUrl": url, "gitops.username": "oauth2", "gitops.tokenFile": tokenFile,
		"gitops.pollInterval": "1h", "gitops.webhookSecret": "webhook-secret-0123"})
	ctx := context.Background()
	waitRevision := func(name string, rev int) {
		t.Helper()
		if !fleettest.Eventually(30*time.Second, func() bool {
			_, err := store.GetRevision(ctx, d.Store.Pool, name, rev)
			return err == nil
		}) {
			t.Fatalf("revision %d of %s never appeared", rev, name)
		}
	}
	waitRevision("web", 1) // the first poll of the new leader
	// A wrong token is reported, not applied (a source of its own: the
	// full ref name).
	bad := gitops.New(gitops.Options{Store: d.Store, LockKey: 7012024, RepoURL: url, Ref: "refs/heads/main", Username: "oauth2", Token: "wrong"})
	if _, err := bad.Poll(ctx, d.Elector.InTerm); err == nil || !strings.Contains(err.Error(), "fetching refs/heads/main") {
		t.Fatalf("wrong token: %v", err)
	}
	c2 := r.commit("web 2", map[string]string{"web.yaml": "web: 2\n"})
	hook := "http://" + d.HTTPAddr().String() + "/api/v1/gitops/webhook"
	post := func(body string, headers map[string]string) int {
		req, _ := http.NewRequest("POST", hook, strings.NewReader(body))
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	sign := func(body string) string {
		m := hmac.New(sha256.New, []byte("webhook-secret-0123"))
		m.Write([]byte(body))
		return hex.EncodeToString(m.Sum(nil))
	}
	push := `{"ref":"refs/heads/main","after":"` + c2 + `"}`
	if c := post(push, map[string]string{"X-Hub-Signature-256": "sha256=" + sign(push+" ")}); c != 401 {
		t.Errorf("bad GitHub signature: %d", c)
	}
	if c := post(push, map[string]string{"X-Gitlab-Token": "nope"}); c != 401 {
		t.Errorf("bad GitLab token: %d", c)
	}
	if c := post(push, nil); c != 401 {
		t.Errorf("unsigned: %d", c)
	}
	other := `{"ref":"refs/heads/dev"}`
	if c := post(other, map[string]string{"X-Gitea-Signature": sign(other)}); c != 202 {
		t.Errorf("Gitea push to another branch: %d", c)
	}
	if c := post(push, map[string]string{"X-Hub-Signature-256": "sha256=" + sign(push), "X-GitHub-Event": "push"}); c != 202 {
		t.Fatalf("GitHub push: %d", c)
	}
	waitRevision("web", 2)
	rev, _ := store.GetRevision(ctx, d.Store.Pool, "web", 2)
	if rev.SourceCommit != c2 {
		t.Errorf("revision 2 from %s, want %s", rev.SourceCommit, c2)
	}
	c3 := r.commit("web 3", map[string]string{"web.yaml": "web: 3\n"})
	if c := post(push, map[string]string{"X-Gitlab-Token": "webhook-secret-0123", "X-Gitlab-Event": "Push Hook"}); c != 202 {
		t.Fatalf("GitLab push: %d", c)
	}
	waitRevision("web", 3)
	// Status in the API and metrics.
	tok, _ := d.Store.CreateToken(ctx, "t")
	req, _ := http.NewRequest("GET", "http://"+d.HTTPAddr().String()+"/api/v1/gitops", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(b, []byte(c3)) || bytes.Contains(b, []byte(token)) {
		t.Errorf("GET /api/v1/gitops: %s", b)
	}
	mfs, _ := d.Reg.Gather()
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "myriarch_gitops_last_poll_timestamp_seconds" && len(mf.Metric) == 2 {
			found = true
		}
	}
	if !found {
		t.Error("myriarch_gitops_last_poll_timestamp_seconds missing")
	}
}
