// Package ocitest starts a real OCI registry for tests: Debian's
// docker-registry (the CNCF distribution registry) on a loopback port,
// and pushes release artifacts to it with oras-go.
package ocitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote"
)

// Binary is the registry executable of the Debian package docker-registry.
const Binary = "/usr/bin/docker-registry"

// Registry is a running registry.
type Registry struct {
	// Host is host:port.
	Host string
}

// Start starts a registry for the test and stops it at cleanup. Without the
// binary the test is skipped, or fails under CI=true.
func Start(t testing.TB) *Registry {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing (apt-get install -y docker-registry): %v", Binary, err)
		}
		t.Skipf("%s is missing (apt-get install -y docker-registry)", Binary)
	}
	// Port 0: the registry binds a port of the kernel's choice and logs
	// it ("listening on ..."). A port found free here and bound by the
	// registry after its start-up could be taken by another process in
	// between.
	dir := t.TempDir()
	cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:0\n", filepath.Join(dir, "data"))
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(Binary, "serve", cfgPath)
	logBuf := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logBuf, logBuf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	deadline := time.Now().Add(30 * time.Second)
	host := ""
	for {
		var err error
		if host == "" {
			host = listeningOn(logBuf.String())
		}
		if host != "" {
			var resp *http.Response
			if resp, err = http.Get("http://" + host + "/v2/"); err == nil {
				resp.Body.Close()
				break
			}
		}
		select {
		case <-done:
			t.Fatalf("registry exited: %s", logBuf.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry not up on %q: %v: %s", host, err, logBuf.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return &Registry{Host: host}
}

// listeningOn is the address in the registry's log line
// msg="listening on host:port", "" until it was written whole.
func listeningOn(log string) string {
	for line := range strings.Lines(log) {
		_, rest, ok := strings.Cut(line, `msg="listening on `)
		if !ok || !strings.HasSuffix(line, "\n") {
			continue
		}
		if addr, _, ok := strings.Cut(rest, `"`); ok {
			return addr
		}
	}
	return ""
}

// lockedBuffer is the registry's log, written by exec's copying goroutine
// while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Repo is the plain-HTTP source string of a repository on r.
func (r *Registry) Repo(name string) string { return "http://" + r.Host + "/" + name }

// File is one asset to push.
type File struct {
	Name     string
	Platform string // "linux/amd64" or ""
	Data     []byte
	// Signature is set as the signature annotation when not empty.
	Signature string
}

// Push pushes files as the layers of one manifest tagged tag in repo.
func (r *Registry) Push(ctx context.Context, repo, tag string, files []File) error {
	rp, err := remote.NewRepository(r.Host + "/" + repo)
	if err != nil {
		return err
	}
	rp.PlainHTTP = true
	var layers []ocispec.Descriptor
	for _, f := range files {
		d := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(f.Data), Size: int64(len(f.Data)),
			Annotations: map[string]string{ocispec.AnnotationTitle: f.Name}}
		if f.Platform != "" {
			d.Annotations["vnd.myriarch.platform"] = f.Platform
		}
		if f.Signature != "" {
			d.Annotations["vnd.myriarch.signature"] = f.Signature
		}
		if err := rp.Push(ctx, d, bytes.NewReader(f.Data)); err != nil {
			return err
		}
		layers = append(layers, d)
	}
	cfgData := []byte("{}")
	cfg := ocispec.Descriptor{MediaType: "application/vnd.myriarch.release.config.v1+json", Digest: digest.FromBytes(cfgData), Size: int64(len(cfgData))}
	if err := rp.Push(ctx, cfg, bytes.NewReader(cfgData)); err != nil {
		return err
	}
	m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, Config: cfg, Layers: layers,
		Annotations: map[string]string{ocispec.AnnotationCreated: "2026-11-01T10:00:00Z"}}
	m.SchemaVersion = 2
	mb, _ := json.Marshal(m)
	md := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(mb), Size: int64(len(mb))}
	if err := rp.Push(ctx, md, bytes.NewReader(mb)); err != nil {
		return err
	}
	return rp.Tag(ctx, md, tag)
}
