// Command mkimage builds the container images of myriarchd and
// myriarch-bridge into docker-archive tarballs (`make image`):
//
//	go run ./internal/image/mkimage -version 0.1.0 -out dist
//
// writes dist/myriarchd-0.1.0.tar and dist/myriarch-bridge-0.1.0.tar,
// tagged ghcr.io/myriarch/<name>:<version>; load them with
// `docker load -i` or `podman load -i`. No Docker daemon is needed.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/myriarch/myriarch/internal/image"
)

func main() {
	version := flag.String("version", "", "image tag and linked version (required; make image passes the charts' appVersion)")
	out := flag.String("out", "dist", "output directory")
	revision := flag.String("revision", "", "VCS revision for the org.opencontainers.image.revision label")
	goarch := flag.String("goarch", runtime.GOARCH, "target architecture")
	ca := flag.String("ca-certs", "/etc/ssl/certs/ca-certificates.crt", "CA bundle to include (\"\" for none)")
	flag.Parse()
	if *version == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: mkimage -version V [-out DIR] [-revision SHA] [-goarch ARCH]")
		os.Exit(2)
	}
	// Reproducible builds set SOURCE_DATE_EPOCH; otherwise now.
	created := time.Now().UTC().Truncate(time.Second)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "SOURCE_DATE_EPOCH: %q: must be whole seconds since 1970\n", s)
			os.Exit(2)
		}
		created = time.Unix(sec, 0).UTC()
	}
	if err := run(*version, *out, *revision, *goarch, *ca, created); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(version, out, revision, goarch, ca string, created time.Time) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	bins, err := os.MkdirTemp("", "mkimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bins)
	paths, err := image.BuildBinaries(context.Background(), ".", bins, version, "linux", goarch, image.Daemons)
	if err != nil {
		return err
	}
	for _, d := range image.Daemons {
		img, err := image.Build(image.Spec{Daemon: d, Binary: paths[d.Name], Version: version, Revision: revision,
			CACerts: ca, Created: created, Platform: v1.Platform{OS: "linux", Architecture: goarch}})
		if err != nil {
			return err
		}
		file := filepath.Join(out, d.Name+"-"+version+".tar")
		if err := image.Write(file, d, version, img); err != nil {
			return err
		}
		digest, err := img.Digest()
		if err != nil {
			return err
		}
		st, err := os.Stat(file)
		if err != nil {
			return err
		}
		fmt.Printf("%s  %s  %s  %.1f MB\n", file, image.Ref(d, version), digest, float64(st.Size())/1e6)
	}
	return nil
}
