// Package image builds the container images of Myriarch's daemons without
// a Docker daemon: a static (CGO_ENABLED=0) binary on an empty base, with a
// non-root user, the host's CA certificates and OCI labels, written as a
// tarball that `docker load` and `podman load` accept.
//
// There is no base image to pull: the first layer holds only /etc/passwd,
// /etc/group (the user nonroot, 65532, as in distroless), the CA bundle and
// an empty /tmp; the second holds the binary at /usr/local/bin/<name>.
// Timestamps come from the Created time, so equal inputs give equal images.
package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/google/go-containerregistry/pkg/name"
)

// Registry is where the images are published; the Helm charts' default
// image.repository is Registry + "/" + the binary's name, tagged with the
// chart's appVersion (a test in deploy/ keeps them equal).
const Registry = "ghcr.io/myriarch"

// UID is the user the images run as (nonroot in distroless images).
const UID = 65532

// Daemon describes one image.
type Daemon struct {
	Name        string   // binary and image name: myriarchd, myriarch-bridge
	Description string   // org.opencontainers.image.description
	Cmd         []string // arguments after the entry point by default
	Ports       []string // exposed, e.g. "8080/tcp"
}

// Daemons are the two images `make image` builds.
var Daemons = []Daemon{
	{Name: "myriarchd", Description: "Myriarch fleet control plane (OpAMP server, REST API, UI)",
		Cmd: []string{"serve", "--config", "/etc/myriarchd/config.yaml"}, Ports: []string{"8080/tcp", "4320/tcp"}},
	{Name: "myriarch-bridge", Description: "Myriarch MQTT bridge with lease-guarded exclusive sessions",
		Cmd: []string{"run", "-c", "/etc/myriarch-bridge/bridge.yaml"}, Ports: []string{"9464/tcp"}},
}

// Spec is what goes into one image.
type Spec struct {
	Daemon   Daemon
	Binary   string // path of the static binary
	Version  string // image tag and org.opencontainers.image.version
	Revision string // org.opencontainers.image.revision (optional)
	CACerts  string // CA bundle to copy to /etc/ssl/certs/ca-certificates.crt ("" for none)
	Created  time.Time
	Platform v1.Platform
}

// Ref is the image reference of d at version.
func Ref(d Daemon, version string) string { return Registry + "/" + d.Name + ":" + version }

// BinaryPath is where the binary lives inside the image.
func BinaryPath(d Daemon) string { return "/usr/local/bin/" + d.Name }

// Build assembles the image.
func Build(s Spec) (v1.Image, error) {
	if s.Daemon.Name == "" || s.Version == "" || s.Binary == "" {
		return nil, fmt.Errorf("image: name %q, version %q and binary %q are all required", s.Daemon.Name, s.Version, s.Binary)
	}
	bin, err := os.ReadFile(s.Binary)
	if err != nil {
		return nil, fmt.Errorf("image: binary: %w", err)
	}
	files := []file{
		{path: "etc/", dir: true},
		{path: "etc/passwd", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, UID)},
		{path: "etc/group", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", UID)},
		{path: "home/", dir: true},
		{path: "home/nonroot/", dir: true, uid: UID},
		{path: "tmp/", dir: true, mode: 0o1777},
	}
	if s.CACerts != "" {
		ca, err := os.ReadFile(s.CACerts)
		if err != nil {
			return nil, fmt.Errorf("image: CA certificates: %w", err)
		}
		files = append(files, file{path: "etc/ssl/", dir: true}, file{path: "etc/ssl/certs/", dir: true},
			file{path: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: ca})
	}
	base, err := layer(files, s.Created)
	if err != nil {
		return nil, err
	}
	app, err := layer([]file{{path: "usr/", dir: true}, {path: "usr/local/", dir: true}, {path: "usr/local/bin/", dir: true},
		{path: BinaryPath(s.Daemon)[1:], mode: 0o755, data: bin}}, s.Created)
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1),
		mutate.Addendum{Layer: base, History: v1.History{Created: v1.Time{Time: s.Created}, CreatedBy: "myriarch image: passwd, group, CA certificates", Comment: "base"}},
		mutate.Addendum{Layer: app, History: v1.History{Created: v1.Time{Time: s.Created}, CreatedBy: "myriarch image: " + BinaryPath(s.Daemon)}})
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = s.Platform.Architecture, s.Platform.OS
	cf.Created = v1.Time{Time: s.Created}
	cf.Config.Entrypoint = []string{BinaryPath(s.Daemon)}
	cf.Config.Cmd = s.Daemon.Cmd
	cf.Config.User = fmt.Sprintf("%d:%d", UID, UID)
	cf.Config.WorkingDir = "/home/nonroot"
	cf.Config.Env = []string{"PATH=/usr/local/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt", "HOME=/home/nonroot"}
	cf.Config.ExposedPorts = map[string]struct{}{}
	for _, p := range s.Daemon.Ports {
		cf.Config.ExposedPorts[p] = struct{}{}
	}
	cf.Config.Labels = Labels(s)
	return mutate.ConfigFile(img, cf)
}

// Labels are the OCI annotations of the image config.
func Labels(s Spec) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       s.Daemon.Name,
		"org.opencontainers.image.description": s.Daemon.Description,
		"org.opencontainers.image.version":     s.Version,
		"org.opencontainers.image.created":     s.Created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.source":      "https://github.com/myriarch/myriarch",
		"org.opencontainers.image.vendor":      "Myriarch",
	}
	if s.Revision != "" {
		l["org.opencontainers.image.revision"] = s.Revision
	}
	return l
}

// Write writes img as a tarball that docker load and podman load accept,
// tagged Ref(d, version).
func Write(path string, d Daemon, version string, img v1.Image) error {
	tag, err := name.NewTag(Ref(d, version), name.StrictValidation)
	if err != nil {
		return fmt.Errorf("image: tag: %w", err)
	}
	return tarball.WriteToFile(path, tag, img)
}

type file struct {
	path string
	dir  bool
	mode int64
	uid  int
	data []byte
}

func layer(files []file, created time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.path, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: created, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag = tar.TypeDir
			if h.Mode == 0 {
				h.Mode = 0o755
			}
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
}
