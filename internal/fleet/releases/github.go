package releases

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/google/go-github/v74/github"
)

// GitHubLister lists GitHub Releases (github.com or GitHub Enterprise) with
// go-github. Conditional requests with the ETags of earlier answers make an
// unchanged release list cost a 304, which GitHub does not count against
// the rate limit. Assets are verified by the digest that GitHub reports
// for them, or else by the release's checksums file (checksums.txt,
// SHA256SUMS, …: lines of "<sha256 hex>  <file name>"); an asset with
// neither is left out. Assets are downloaded from their public download
// URL.
type GitHubLister struct {
	c     *github.Client
	token string
	hc    *http.Client

	mu        sync.Mutex
	remaining int
	reset     time.Time
}

// NewGitHubLister returns a lister; baseURL empty means api.github.com,
// otherwise the GitHub Enterprise API URL (https://ghe.example.com/api/v3/).
// client may be nil.
func NewGitHubLister(baseURL, token string, client *http.Client) (*GitHubLister, error) {
	tr := http.DefaultTransport
	if client != nil && client.Transport != nil {
		tr = client.Transport
	}
	// Requests are bounded by the caller's context (the leader job's), not
	// by a client timeout.
	hc := &http.Client{Transport: &etagTransport{base: tr, cache: map[string]cachedResponse{}}}
	c := github.NewClient(hc)
	if token != "" {
		c = c.WithAuthToken(token)
	}
	if baseURL != "" {
		var err error
		if c, err = c.WithEnterpriseURLs(baseURL, baseURL); err != nil {
			return nil, fmt.Errorf("GitHub API URL %q: %w", baseURL, err)
		}
	}
	return &GitHubLister{c: c, token: token, hc: hc, remaining: -1}, nil
}

// RateLimit returns the rate limit left and its reset as last reported
// (-1 before the first answer).
func (l *GitHubLister) RateLimit() (remaining int, reset time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.remaining, l.reset
}

func (l *GitHubLister) note(resp *github.Response) {
	if resp == nil || resp.Rate.Limit == 0 {
		return
	}
	l.mu.Lock()
	l.remaining, l.reset = resp.Rate.Remaining, resp.Rate.Reset.Time
	l.mu.Unlock()
}

var checksumsRE = regexp.MustCompile(`(?i)(checksums?|sha256sums?)(\.txt)?$`)

// List implements Lister.
func (l *GitHubLister) List(ctx context.Context, src Source, known func(version string) bool) ([]Release, error) {
	owner, repo, _ := strings.Cut(src.Source, "/")
	var out []Release
	opts := &github.ListOptions{PerPage: 100}
	for {
		rels, resp, err := l.c.Repositories.ListReleases(ctx, owner, repo, opts)
		l.note(resp)
		if err != nil {
			var rle *github.RateLimitError
			if errors.As(err, &rle) {
				return out, fmt.Errorf("GitHub rate limit exhausted for %s until %s", src.Source, rle.Rate.Reset.Time.UTC().Format(time.RFC3339))
			}
			return out, fmt.Errorf("listing the releases of %s: %w", src.Source, err)
		}
		for _, r := range rels {
			tag := r.GetTagName()
			if r.GetDraft() || !src.Accepts(tag) || known(tag) {
				continue
			}
			rel, err := l.release(ctx, src, r)
			if err != nil {
				return out, err
			}
			if len(rel.Assets) > 0 {
				out = append(out, rel)
			}
		}
		if resp.NextPage == 0 {
			return out, nil
		}
		opts.Page = resp.NextPage
	}
}

func (l *GitHubLister) release(ctx context.Context, src Source, r *github.RepositoryRelease) (Release, error) {
	rel := Release{Package: src.Name, Version: r.GetTagName(), PublishedAt: r.GetPublishedAt().UTC()}
	if rel.PublishedAt.IsZero() {
		rel.PublishedAt = r.GetCreatedAt().UTC()
	}
	var sums map[string]string
	for _, a := range r.Assets {
		if checksumsRE.MatchString(a.GetName()) {
			var err error
			if sums, err = l.checksums(ctx, a.GetBrowserDownloadURL()); err != nil {
				return rel, fmt.Errorf("checksums file %s of %s %s: %w", a.GetName(), src.Source, rel.Version, err)
			}
		}
	}
	for _, a := range r.Assets {
		name := a.GetName()
		if checksumsRE.MatchString(name) || strings.HasSuffix(name, ".sig") {
			continue
		}
		d := a.GetDigest()
		if !strings.HasPrefix(d, "sha256:") {
			if h, ok := sums[name]; ok {
				d = "sha256:" + h
			} else {
				continue // cannot be verified
			}
		}
		os, arch := Platform("", name)
		rel.Assets = append(rel.Assets, Asset{Name: name, OS: os, Arch: arch, Digest: strings.ToLower(d), Size: int64(a.GetSize()), URL: a.GetBrowserDownloadURL()})
	}
	return rel, nil
}

var sumLineRE = regexp.MustCompile(`^([0-9a-fA-F]{64})\s+\*?(\S.*)$`)

func (l *GitHubLister) checksums(ctx context.Context, url string) (map[string]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := l.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	m := map[string]string{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 1<<20))
	for sc.Scan() {
		if p := sumLineRE.FindStringSubmatch(strings.TrimSpace(sc.Text())); p != nil {
			m[strings.TrimSpace(p[2])] = strings.ToLower(p[1])
		}
	}
	return m, sc.Err()
}

// etagTransport makes GET requests conditional on the ETag of the last
// answer to the same URL and turns a 304 back into that answer.
type etagTransport struct {
	base  http.RoundTripper
	mu    sync.Mutex
	cache map[string]cachedResponse
}

type cachedResponse struct {
	etag   string
	header http.Header
	body   []byte
}

// maxCachedBody bounds a cached answer (a page of releases is far smaller).
const maxCachedBody = 8 << 20

func (t *etagTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet {
		return t.base.RoundTrip(req)
	}
	key := req.URL.String()
	t.mu.Lock()
	c, ok := t.cache[key]
	t.mu.Unlock()
	if ok {
		req = req.Clone(req.Context())
		req.Header.Set("If-None-Match", c.etag)
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusNotModified && ok:
		resp.Body.Close()
		h := c.header.Clone()
		for k, v := range resp.Header { // fresh rate-limit headers
			if strings.HasPrefix(strings.ToLower(k), "x-ratelimit") {
				h[k] = v
			}
		}
		return &http.Response{Status: "200 OK", StatusCode: http.StatusOK, Proto: resp.Proto, ProtoMajor: resp.ProtoMajor, ProtoMinor: resp.ProtoMinor,
			Header: h, Body: io.NopCloser(bytes.NewReader(c.body)), ContentLength: int64(len(c.body)), Request: req}, nil
	case resp.StatusCode == http.StatusOK && resp.Header.Get("ETag") != "":
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxCachedBody+1))
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if len(b) <= maxCachedBody {
			t.mu.Lock()
			t.cache[key] = cachedResponse{etag: resp.Header.Get("ETag"), header: resp.Header.Clone(), body: b}
			t.mu.Unlock()
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
	}
	return resp, nil
}
