// Package gitops polls a Git repository for configurations (a leader job)
// with go-git, and serves the webhook that asks for an immediate poll.
//
// The repository holds, in the directory gitops.path at the branch
// gitops.ref, an index file (IndexFile) that lists the configurations, and
// one file per configuration with its content:
//
//	# myriarch-configs.yaml
//	configs:
//	  - name: edge                 # configuration name
//	    file: edge.yaml            # its content, relative to the index
//	    type: yaml                 # yaml (default) or myriarch-bridge
//	    selector: role=edge        # the agents API's selector syntax
//	    priority: 10               # precedence when several match
//	    rollout:                   # optional: a rollout for each new revision
//	      waves: ["1", "10%", "100%"]
//	      bake_s: 60
//
// Each poll fetches the branch; at a new commit it validates the whole
// index and every file (a commit with any problem writes nothing and is
// reported in last_error), then in one term-fenced transaction updates the
// configurations, stores a revision for every file whose content changed
// (recorded with the commit id and author; unchanged files make none),
// starts the rollouts the index asks for, and marks deleted the
// configurations from Git that the index no longer lists (they get no new
// rollouts; agents keep the configuration they run). A poll that loses
// leadership before its commit writes nothing.
package gitops

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/go-git/go-git/v5"
	gitconfig "github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/myriarch/myriarch/internal/fleet/configs"
	"github.com/myriarch/myriarch/internal/fleet/jobs"
	"github.com/myriarch/myriarch/internal/fleet/rollout"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// IndexFile lists the configurations of the repository directory.
const IndexFile = "myriarch-configs.yaml"

// warningPrefix marks a last_error of a commit that was applied (a rollout
// that could not start); such a commit is not applied again.
const warningPrefix = "warning: "

// JobName is the leader job.
const JobName = "gitops_poll"

// Options configure a Poller.
type Options struct {
	Store   *store.Store
	LockKey int64
	// RepoURL is https://, http://, ssh://, git@host:path or file://.
	RepoURL string
	// Ref is a branch name or a full reference (refs/heads/..., refs/tags/...).
	Ref  string
	Path string
	// PollInterval is the time between polls (a webhook polls at once).
	PollInterval time.Duration
	// Username, Token and TokenFile give HTTPS basic auth (the token is
	// read from TokenFile at every poll, so that a rotation needs no
	// restart); SSHKeyFile and SSHKnownHostsFile give SSH auth.
	Username, Token, TokenFile    string
	SSHKeyFile, SSHKnownHostsFile string
	// WebhookSecret verifies the webhook (HMAC-SHA256 for GitHub and Gitea,
	// the token for GitLab); empty refuses every webhook call.
	WebhookSecret string
	Log           *slog.Logger
}

// Poller polls one repository.
type Poller struct {
	o Options

	mu   sync.Mutex // one poll at a time; guards repo
	repo *git.Repository
}

// New returns a poller.
func New(o Options) *Poller {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Ref == "" {
		o.Ref = "main"
	}
	o.Path = strings.Trim(o.Path, "/")
	return &Poller{o: o}
}

// Source names the repository, branch and directory (without credentials);
// it is the key of its status row.
func (p *Poller) Source() string {
	u := p.o.RepoURL
	if pu, err := url.Parse(u); err == nil && pu.User != nil {
		pu.User = nil
		u = pu.String()
	}
	return u + "#" + p.o.Ref + ":/" + p.o.Path
}

func (p *Poller) fullRef() plumbing.ReferenceName {
	if strings.HasPrefix(p.o.Ref, "refs/") {
		return plumbing.ReferenceName(p.o.Ref)
	}
	return plumbing.NewBranchReferenceName(p.o.Ref)
}

// Job is the poller as a leader job: every check it polls when the poll
// interval has passed or a webhook asked for a poll.
func (p *Poller) Job(check time.Duration) jobs.Job {
	return jobs.Job{Name: JobName, Interval: check, Run: p.run}
}

func (p *Poller) run(ctx context.Context, fence jobs.Fence) error {
	st, ok, err := GetStatus(ctx, p.o.Store.Pool, p.Source())
	if err != nil {
		return err
	}
	due := !ok || st.LastPollAt == nil || time.Since(*st.LastPollAt) >= p.o.PollInterval ||
		(st.PollRequestedAt != nil && st.PollRequestedAt.After(*st.LastPollAt))
	if !due {
		return nil
	}
	_, err = p.Poll(ctx, fence)
	return err
}

func (p *Poller) auth() (transport.AuthMethod, error) {
	switch {
	case p.o.SSHKeyFile != "":
		a, err := gitssh.NewPublicKeysFromFile("git", p.o.SSHKeyFile, "")
		if err != nil {
			return nil, fmt.Errorf("gitops.sshKeyFile %s: %w", p.o.SSHKeyFile, err)
		}
		if p.o.SSHKnownHostsFile != "" {
			cb, err := gitssh.NewKnownHostsCallback(p.o.SSHKnownHostsFile)
			if err != nil {
				return nil, fmt.Errorf("gitops.sshKnownHostsFile %s: %w", p.o.SSHKnownHostsFile, err)
			}
			a.HostKeyCallback = cb
		}
		return a, nil
	case p.o.TokenFile != "":
		b, err := os.ReadFile(p.o.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("gitops.tokenFile: %w", err)
		}
		return &githttp.BasicAuth{Username: p.o.Username, Password: strings.TrimSpace(string(b))}, nil
	case p.o.Token != "":
		return &githttp.BasicAuth{Username: p.o.Username, Password: p.o.Token}, nil
	}
	return nil, nil
}

// fetch brings the in-memory repository up to date and returns the commit
// of the ref.
func (p *Poller) fetch(ctx context.Context) (*object.Commit, error) {
	auth, err := p.auth()
	if err != nil {
		return nil, err
	}
	if p.repo == nil {
		r, err := git.Init(memory.NewStorage(), nil)
		if err != nil {
			return nil, err
		}
		if _, err := r.CreateRemote(&gitconfig.RemoteConfig{Name: "origin", URLs: []string{p.o.RepoURL}}); err != nil {
			return nil, err
		}
		p.repo = r
	}
	const local = "refs/myriarch/head"
	err = p.repo.FetchContext(ctx, &git.FetchOptions{RemoteName: "origin", Auth: auth, Force: true, Tags: git.NoTags,
		RefSpecs: []gitconfig.RefSpec{gitconfig.RefSpec("+" + string(p.fullRef()) + ":" + local)}})
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return nil, fmt.Errorf("fetching %s from %s: %w", p.o.Ref, p.Source(), err)
	}
	ref, err := p.repo.Reference(local, true)
	if err != nil {
		return nil, fmt.Errorf("ref %s: %w", p.o.Ref, err)
	}
	return p.repo.CommitObject(ref.Hash())
}

// Entry is one configuration of the index.
type Entry struct {
	Name     string    `yaml:"name"`
	File     string    `yaml:"file"`
	Type     string    `yaml:"type"`
	Selector string    `yaml:"selector"`
	Priority int       `yaml:"priority"`
	Rollout  yaml.Node `yaml:"rollout"`
}

type index struct {
	Configs []Entry `yaml:"configs"`
}

// parsed is one configuration read from a commit.
type parsed struct {
	def     store.ConfigDef
	content string
	spec    *rollout.Spec
}

// read parses and validates the index and the files of a commit.
func (p *Poller) read(c *object.Commit) ([]parsed, error) {
	tree, err := c.Tree()
	if err != nil {
		return nil, err
	}
	if p.o.Path != "" {
		if tree, err = tree.Tree(p.o.Path); err != nil {
			return nil, fmt.Errorf("gitops.path %q: not a directory in commit %s", p.o.Path, c.Hash)
		}
	}
	idxName := path.Join(p.o.Path, IndexFile)
	f, err := tree.File(IndexFile)
	if err != nil {
		return nil, fmt.Errorf("%s: not found in commit %s", idxName, c.Hash)
	}
	raw, err := f.Contents()
	if err != nil {
		return nil, err
	}
	var idx index
	dec := yaml.NewDecoder(strings.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&idx); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", idxName, err)
	}
	var errs []error
	var out []parsed
	seen := map[string]bool{}
	for i, e := range idx.Configs {
		where := fmt.Sprintf("%s: configs[%d] (%s)", idxName, i, e.Name)
		if e.Type == "" {
			e.Type = configs.TypeYAML
		}
		sel, err := store.ParseSelector(e.Selector)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		def := store.ConfigDef{Name: e.Name, Type: e.Type, Selector: sel, Priority: e.Priority, Source: "git", SourcePath: path.Join(p.o.Path, e.File)}
		if err := configs.CheckDef(def); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		if seen[e.Name] {
			errs = append(errs, fmt.Errorf("%s: name %q: listed twice", where, e.Name))
			continue
		}
		seen[e.Name] = true
		if e.File == "" || strings.Contains(e.File, "..") {
			errs = append(errs, fmt.Errorf("%s: file %q: must name a file below the index's directory", where, e.File))
			continue
		}
		cf, err := tree.File(e.File)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: file %q: not found in commit %s", where, def.SourcePath, c.Hash))
			continue
		}
		content, err := cf.Contents()
		if err != nil {
			return nil, err
		}
		if err := configs.Validate(e.Type, content); err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", where, def.SourcePath, err))
			continue
		}
		pe := parsed{def: def, content: content}
		if e.Rollout.Kind != 0 {
			var generic any
			if err := e.Rollout.Decode(&generic); err != nil {
				errs = append(errs, fmt.Errorf("%s: rollout: %w", where, err))
				continue
			}
			b, _ := json.Marshal(generic)
			var sp rollout.Spec
			jd := json.NewDecoder(bytes.NewReader(b))
			jd.DisallowUnknownFields()
			if err := jd.Decode(&sp); err != nil {
				errs = append(errs, fmt.Errorf("%s: rollout: %w", where, err))
				continue
			}
			if err := sp.WithDefaults().Validate(); err != nil {
				errs = append(errs, fmt.Errorf("%s: rollout: %w", where, err))
				continue
			}
			pe.spec = &sp
			pe.def.AutoRollout = b
		}
		out = append(out, pe)
	}
	return out, errors.Join(errs...)
}

// Result is what one poll did.
type Result struct {
	Commit    string   `json:"commit"`
	Changed   bool     `json:"changed"`
	Revisions []string `json:"revisions"` // name@revision
	Rollouts  []int64  `json:"rollouts"`
	Deleted   []string `json:"deleted"`
}

// Poll fetches and applies the ref now. Every write goes through one
// fenced transaction (rollout.InTerm).
func (p *Poller) Poll(ctx context.Context, fence jobs.Fence) (Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	src := p.Source()
	c, err := p.fetch(ctx)
	if err != nil {
		return Result{}, p.recordError(ctx, fence, src, "", err)
	}
	res := Result{Commit: c.Hash.String()}
	st, ok, err := GetStatus(ctx, p.o.Store.Pool, src)
	if err != nil {
		return res, err
	}
	if ok && st.LastCommit == res.Commit && (st.LastError == "" || strings.HasPrefix(st.LastError, warningPrefix)) {
		return res, rollout.InTerm(ctx, fence, p.o.LockKey, func(ctx context.Context, tx pgx.Tx, term int64) error {
			_, err := tx.Exec(ctx, `UPDATE gitops_sources SET last_poll_at = now(), term = $2 WHERE source = $1`, src, term)
			return err
		})
	}
	entries, err := p.read(c)
	if err != nil {
		return res, p.recordError(ctx, fence, src, res.Commit, err)
	}
	author := strings.TrimSpace(c.Author.Name + " <" + c.Author.Email + ">")
	short := res.Commit[:12]
	var notes []string
	err = rollout.InTerm(ctx, fence, p.o.LockKey, func(ctx context.Context, tx pgx.Tx, term int64) error {
		res.Revisions, res.Rollouts, res.Deleted, notes = nil, nil, nil, nil
		names := make([]string, 0, len(entries))
		for _, e := range entries {
			names = append(names, e.def.Name)
			if _, err := store.PutConfig(ctx, tx, e.def); err != nil {
				return fmt.Errorf("%s: %w", e.def.Name, err)
			}
			rev, created, err := configs.AddRevision(ctx, tx, e.def.Name, e.content, author, res.Commit)
			if err != nil {
				return fmt.Errorf("%s: %w", e.def.Name, err)
			}
			if !created {
				continue
			}
			res.Changed = true
			res.Revisions = append(res.Revisions, fmt.Sprintf("%s@%d", e.def.Name, rev.Revision))
			if e.spec == nil {
				continue
			}
			ro, err := rollout.Create(ctx, tx, rollout.Request{Config: e.def.Name, ToRevision: rev.Revision, Spec: *e.spec}, "gitops "+short)
			var inv *rollout.InvalidError
			switch {
			case err == nil:
				res.Rollouts = append(res.Rollouts, ro.ID)
			case errors.Is(err, rollout.ErrConflict) || errors.As(err, &inv):
				notes = append(notes, fmt.Sprintf("%srollout of %s revision %d not started: %v", warningPrefix, e.def.Name, rev.Revision, err))
			default:
				return err
			}
		}
		if res.Deleted, err = store.MarkGitConfigsDeleted(ctx, tx, names); err != nil {
			return err
		}
		if len(res.Deleted) > 0 {
			res.Changed = true
		}
		_, err = tx.Exec(ctx, `INSERT INTO gitops_sources (source, last_commit, last_poll_at, last_change_at, last_error, term)
			VALUES ($1, $2, now(), CASE WHEN $3 THEN now() END, $4, $5)
			ON CONFLICT (source) DO UPDATE SET last_commit = $2, last_poll_at = now(),
				last_change_at = CASE WHEN $3 THEN now() ELSE gitops_sources.last_change_at END, last_error = $4, term = $5`,
			src, res.Commit, res.Changed, strings.Join(notes, "; "), term)
		return err
	})
	if err != nil {
		return res, err
	}
	if res.Changed {
		p.o.Log.Info("applied a Git commit", "source", src, "commit", res.Commit, "revisions", res.Revisions, "rollouts", res.Rollouts, "deleted", res.Deleted)
	}
	for _, n := range notes {
		p.o.Log.Warn("gitops", "source", src, "commit", res.Commit, "note", n)
	}
	return res, nil
}

func (p *Poller) recordError(ctx context.Context, fence jobs.Fence, src, commit string, cause error) error {
	msg := cause.Error()
	if commit != "" {
		msg = "commit " + commit + ": " + msg
	}
	err := rollout.InTerm(ctx, fence, p.o.LockKey, func(ctx context.Context, tx pgx.Tx, term int64) error {
		_, err := tx.Exec(ctx, `INSERT INTO gitops_sources (source, last_poll_at, last_error, term) VALUES ($1, now(), $2, $3)
			ON CONFLICT (source) DO UPDATE SET last_poll_at = now(), last_error = $2, term = $3`, src, msg, term)
		return err
	})
	return errors.Join(errors.New(msg), err)
}

// Status is the state of one source.
type Status struct {
	Source          string     `json:"source"`
	LastCommit      string     `json:"last_commit"`
	LastPollAt      *time.Time `json:"last_poll_at"`
	LastChangeAt    *time.Time `json:"last_change_at"`
	LastError       string     `json:"last_error"`
	PollRequestedAt *time.Time `json:"poll_requested_at"`
}

const statusCols = "source, last_commit, last_poll_at, last_change_at, last_error, poll_requested_at"

// GetStatus reads the status of a source.
func GetStatus(ctx context.Context, q store.Querier, src string) (Status, bool, error) {
	rows, err := q.Query(ctx, "SELECT "+statusCols+" FROM gitops_sources WHERE source = $1", src)
	if err != nil {
		return Status{}, false, err
	}
	s, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Status])
	if errors.Is(err, pgx.ErrNoRows) {
		return s, false, nil
	}
	return s, err == nil, err
}

// Statuses lists every source polled so far.
func Statuses(ctx context.Context, q store.Querier) ([]Status, error) {
	rows, err := q.Query(ctx, "SELECT "+statusCols+" FROM gitops_sources ORDER BY source")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Status])
}

// Webhook answers push notifications of GitHub (X-Hub-Signature-256),
// Gitea (X-Gitea-Signature), both HMAC-SHA256 of the body with the secret,
// and GitLab (X-Gitlab-Token, the secret itself). A verified push to the
// configured ref (or a payload without ref, such as a ping) asks the
// leader for an immediate poll; it may reach any replica.
func (p *Poller) Webhook() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 25<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if p.o.WebhookSecret == "" {
			http.Error(w, "webhook disabled: gitops.webhookSecret is not set", http.StatusNotFound)
			return
		}
		if !p.verify(r.Header, body) {
			http.Error(w, "webhook signature missing or wrong (X-Hub-Signature-256, X-Gitea-Signature or X-Gitlab-Token)", http.StatusUnauthorized)
			return
		}
		var payload struct {
			Ref string `json:"ref"`
		}
		_ = json.Unmarshal(body, &payload)
		if payload.Ref != "" && payload.Ref != string(p.fullRef()) {
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprintf(w, "ignored: push to %s, polling %s\n", payload.Ref, p.fullRef())
			return
		}
		_, err = p.o.Store.Pool.Exec(r.Context(), `INSERT INTO gitops_sources (source, poll_requested_at) VALUES ($1, now())
			ON CONFLICT (source) DO UPDATE SET poll_requested_at = now()`, p.Source())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintln(w, "poll requested")
	})
}

func (p *Poller) verify(h http.Header, body []byte) bool {
	secret := []byte(p.o.WebhookSecret)
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	want := mac.Sum(nil)
	check := func(sig string) bool {
		got, err := hex.DecodeString(sig)
		return err == nil && hmac.Equal(got, want)
	}
	if s, ok := strings.CutPrefix(h.Get("X-Hub-Signature-256"), "sha256="); ok {
		return check(s)
	}
	if s := h.Get("X-Gitea-Signature"); s != "" {
		return check(s)
	}
	if t := h.Get("X-Gitlab-Token"); t != "" {
		return subtle.ConstantTimeCompare([]byte(t), secret) == 1
	}
	return false
}

// Collector exports myriarch_gitops_last_poll_timestamp_seconds,
// myriarch_gitops_last_change_timestamp_seconds and
// myriarch_gitops_last_poll_failed per source, from the database (the same
// on every replica).
type Collector struct{ Store *store.Store }

var (
	descPoll   = prometheus.NewDesc("myriarch_gitops_last_poll_timestamp_seconds", "Last poll of the Git source.", []string{"source"}, nil)
	descChange = prometheus.NewDesc("myriarch_gitops_last_change_timestamp_seconds", "Last poll that changed configurations.", []string{"source"}, nil)
	descFailed = prometheus.NewDesc("myriarch_gitops_last_poll_failed", "1 when the last poll of the Git source failed (last_error).", []string{"source"}, nil)
)

// Describe implements prometheus.Collector.
func (c Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPoll
	ch <- descChange
	ch <- descFailed
}

// Collect implements prometheus.Collector.
func (c Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	sts, err := Statuses(ctx, c.Store.Pool)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descPoll, err)
		return
	}
	ts := func(t *time.Time) float64 {
		if t == nil {
			return 0
		}
		return float64(t.UnixNano()) / 1e9
	}
	for _, s := range sts {
		failed := 0.0
		if s.LastError != "" {
			failed = 1
		}
		ch <- prometheus.MustNewConstMetric(descPoll, prometheus.GaugeValue, ts(s.LastPollAt), s.Source)
		ch <- prometheus.MustNewConstMetric(descChange, prometheus.GaugeValue, ts(s.LastChangeAt), s.Source)
		ch <- prometheus.MustNewConstMetric(descFailed, prometheus.GaugeValue, failed, s.Source)
	}
}
