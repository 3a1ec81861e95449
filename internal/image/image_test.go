package image

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Both images are built the way `make image` builds them, read back from
// their tarballs as docker load would, and inspected: entry point, user,
// labels, the tag in the tarball's manifest; then the binary is extracted
// from the layers, checked to be static, and started with --help and
// --version.
func TestImages(t *testing.T) {
	const version = "0.0.0-test"
	dir := t.TempDir()
	paths, err := BuildBinaries(context.Background(), "../..", dir, version, "linux", runtime.GOARCH, Daemons)
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, d := range Daemons {
		t.Run(d.Name, func(t *testing.T) {
			spec := Spec{Daemon: d, Binary: paths[d.Name], Version: version, Revision: "abc123", CACerts: ca, Created: created,
				Platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}
			built, err := Build(spec)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(dir, d.Name+".tar")
			if err := Write(file, d, version, built); err != nil {
				t.Fatal(err)
			}
			checkDockerManifest(t, file, Ref(d, version))
			podmanLoad(t, file, Ref(d, version))
			tag, _ := name.NewTag(Ref(d, version))
			img, err := tarball.ImageFromPath(file, &tag)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			c := cf.Config
			if len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/usr/local/bin/"+d.Name {
				t.Errorf("entrypoint %v", c.Entrypoint)
			}
			if strings.Join(c.Cmd, " ") != strings.Join(d.Cmd, " ") {
				t.Errorf("cmd %v, want %v", c.Cmd, d.Cmd)
			}
			if c.User != "65532:65532" {
				t.Errorf("user %q, want the non-root 65532:65532", c.User)
			}
			for k, v := range map[string]string{
				"org.opencontainers.image.title":    d.Name,
				"org.opencontainers.image.version":  version,
				"org.opencontainers.image.revision": "abc123",
				"org.opencontainers.image.created":  "2026-11-30T12:00:00Z",
				"org.opencontainers.image.source":   "https://github.com/myriarch/myriarch",
			} {
				if got := c.Labels[k]; got != v {
					t.Errorf("label %s = %q, want %q", k, got, v)
				}
			}
			if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
				t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
			}
			fs := extract(t, img)
			if !bytes.Contains(fs["etc/passwd"].data, []byte("nonroot:x:65532:65532:")) {
				t.Errorf("/etc/passwd: %q", fs["etc/passwd"].data)
			}
			if fs["etc/ssl/certs/ca-certificates.crt"].data == nil {
				t.Error("no CA certificates")
			}
			bin := fs["usr/local/bin/"+d.Name]
			if bin.mode&0o111 == 0 || len(bin.data) == 0 {
				t.Fatalf("binary mode %o, %d bytes", bin.mode, len(bin.data))
			}
			exe := filepath.Join(t.TempDir(), d.Name)
			if err := os.WriteFile(exe, bin.data, 0o755); err != nil {
				t.Fatal(err)
			}
			ef, err := elf.Open(exe)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range ef.Progs {
				if p.Type == elf.PT_INTERP {
					t.Error("the binary is dynamically linked; the image has no libc")
				}
			}
			ef.Close()
			out, err := exec.Command(exe, "--help").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "Usage: "+d.Name) {
				t.Errorf("%s --help: %v\n%s", d.Name, err, out)
			}
			out, err = exec.Command(exe, "--version").CombinedOutput()
			if err != nil || !strings.HasPrefix(string(out), d.Name+" "+version+" ") {
				t.Errorf("%s --version: %v\n%s", d.Name, err, out)
			}
			// Equal inputs give the same image.
			again, err := Build(spec)
			if err != nil {
				t.Fatal(err)
			}
			d1, _ := built.Digest()
			d2, _ := again.Digest()
			if d1 != d2 {
				t.Errorf("two builds of the same input: %s and %s", d1, d2)
			}
		})
	}
}

// checkDockerManifest reads manifest.json of the tarball: docker load and
// podman load take the tag from RepoTags.
func checkDockerManifest(t *testing.T, file, ref string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatal("no manifest.json in the tarball")
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != "manifest.json" {
			continue
		}
		var m []struct {
			Config   string
			RepoTags []string
			Layers   []string
		}
		if err := json.NewDecoder(tr).Decode(&m); err != nil {
			t.Fatal(err)
		}
		if len(m) != 1 || len(m[0].RepoTags) != 1 || m[0].RepoTags[0] != ref || len(m[0].Layers) != 2 {
			t.Fatalf("manifest.json %+v, want one image tagged %s with two layers", m, ref)
		}
		return
	}
}

type entry struct {
	mode int64
	data []byte
}

func extract(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := map[string]entry{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(h.Name, "/")] = entry{mode: h.Mode, data: b}
	}
}

func TestBuildRefusesMissingInput(t *testing.T) {
	if _, err := Build(Spec{Daemon: Daemons[0], Version: "1"}); err == nil || !strings.Contains(err.Error(), "binary") {
		t.Fatalf("no binary: %v", err)
	}
	if _, err := Build(Spec{Daemon: Daemons[0], Version: "1", Binary: "/nonexistent"}); err == nil {
		t.Fatal("missing binary accepted")
	}
}

// podmanLoad loads the tarball with the real podman (no daemon; its own
// throwaway storage) and checks what podman sees: the tag, the user and
// the entry point. Running the container is not possible in every sandbox
// (crun needs to set rlimits), so the binary is run outside, above.
func podmanLoad(t *testing.T, file, ref string) {
	t.Helper()
	tool, err := exec.LookPath("podman")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("podman not found (apt-get install podman); CI needs it")
		}
		t.Log("podman not found (apt-get install podman); not loading the image with it")
		return
	}
	dir := t.TempDir()
	args := []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"), "--storage-driver", "vfs", "--events-backend", "none"}
	podman := func(a ...string) string {
		t.Helper()
		out, err := exec.Command(tool, append(args, a...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("podman %s: %v\n%s", strings.Join(a, " "), err, out)
		}
		return string(out)
	}
	if out := podman("load", "-i", file); !strings.Contains(out, "Loaded image: "+ref) {
		t.Fatalf("podman load: %s", out)
	}
	got := podman("image", "inspect", "--format", "{{.Config.User}} {{index .Config.Entrypoint 0}} {{index .Config.Labels \"org.opencontainers.image.version\"}}", ref)
	want := fmt.Sprintf("65532:65532 /usr/local/bin/%s %s", filepath.Base(strings.Split(ref, ":")[0]), strings.Split(ref, ":")[1])
	if strings.TrimSpace(got) != want {
		t.Errorf("podman image inspect: %q, want %q", got, want)
	}
}
