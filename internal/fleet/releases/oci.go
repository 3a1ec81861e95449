package releases

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote"
)

// splitOCI returns the repository reference without scheme and whether it
// is plain HTTP.
func splitOCI(src string) (ref string, plain bool, err error) {
	ref = src
	switch {
	case strings.HasPrefix(src, "http://"):
		ref, plain = strings.TrimPrefix(src, "http://"), true
	case strings.HasPrefix(src, "https://"):
		ref = strings.TrimPrefix(src, "https://")
	}
	if _, err := remote.NewRepository(ref); err != nil {
		return "", false, err
	}
	return ref, plain, nil
}

func ociRepo(src string, client *http.Client) (*remote.Repository, error) {
	ref, plain, err := splitOCI(src)
	if err != nil {
		return nil, err
	}
	r, err := remote.NewRepository(ref)
	if err != nil {
		return nil, err
	}
	r.PlainHTTP = plain
	if client != nil {
		r.Client = client
	}
	return r, nil
}

// OCILister lists the releases of an OCI repository with oras-go.
type OCILister struct {
	// Client is the HTTP client (nil: http.DefaultClient).
	Client *http.Client
}

// List returns the releases of src whose version satisfies its constraint
// and for which known returns false.
func (l OCILister) List(ctx context.Context, src Source, known func(version string) bool) ([]Release, error) {
	repo, err := ociRepo(src.Source, l.Client)
	if err != nil {
		return nil, err
	}
	var tags []string
	if err := repo.Tags(ctx, "", func(t []string) error { tags = append(tags, t...); return nil }); err != nil {
		return nil, fmt.Errorf("listing the tags of %s: %w", src.Source, err)
	}
	var out []Release
	for _, tag := range tags {
		if !src.Accepts(tag) || known(tag) {
			continue
		}
		desc, rc, err := repo.FetchReference(ctx, tag)
		if err != nil {
			return out, fmt.Errorf("fetching the manifest of %s:%s: %w", src.Source, tag, err)
		}
		var m ocispec.Manifest
		err = json.NewDecoder(io.LimitReader(rc, 4<<20)).Decode(&m)
		rc.Close()
		if err != nil {
			return out, fmt.Errorf("manifest of %s:%s (%s): %w", src.Source, tag, desc.MediaType, err)
		}
		rel := Release{Package: src.Name, Version: tag, PublishedAt: time.Now().UTC()}
		if t, err := time.Parse(time.RFC3339, m.Annotations[AnnotationCreated]); err == nil {
			rel.PublishedAt = t.UTC()
		}
		for _, layer := range m.Layers {
			if layer.Digest.Algorithm() != digest.SHA256 {
				continue // only sha256 is verified and addressed
			}
			name := layer.Annotations[AnnotationTitle]
			if name == "" {
				name = layer.Digest.Encoded()[:12]
			}
			os, arch := Platform(layer.Annotations[AnnotationPlatform], name)
			rel.Assets = append(rel.Assets, Asset{Name: name, OS: os, Arch: arch, Digest: layer.Digest.String(), Size: layer.Size,
				URL: src.Source + "@" + layer.Digest.String(), Signature: layer.Annotations[AnnotationSignature]})
		}
		if len(rel.Assets) == 0 {
			continue
		}
		out = append(out, rel)
	}
	return out, nil
}

// OpenOCI opens an asset URL of the form repository@sha256:... .
func OpenOCI(ctx context.Context, client *http.Client, url string, size int64) (io.ReadCloser, error) {
	i := strings.LastIndex(url, "@")
	if i < 0 {
		return nil, fmt.Errorf("asset url %q: want repository@digest", url)
	}
	d, err := digest.Parse(url[i+1:])
	if err != nil {
		return nil, fmt.Errorf("asset url %q: %w", url, err)
	}
	repo, err := ociRepo(url[:i], client)
	if err != nil {
		return nil, err
	}
	if size < 0 {
		return nil, errors.New("OCI asset without size")
	}
	return repo.Blobs().Fetch(ctx, ocispec.Descriptor{MediaType: "application/octet-stream", Digest: d, Size: size})
}
