// Package releases is myriarchd's release tracker: a leader job that polls
// the package source of every tracked package (an OCI registry, GitHub
// Releases), keeps the versions that satisfy the package's semver
// constraint, and records each new release with its assets per OS/arch,
// their digests and published_at. The records are term-fenced writes, so a
// replica that lost leadership cannot add to them.
//
// A package source is configured through the API (PUT
// /api/v1/packages/{name}); its last poll and error are in the API, the UI
// and the metrics.
//
// OCI layout of a release: a tag per version (v1.2.3 or 1.2.3) on an image
// or artifact manifest whose layers are the assets. Each layer's
// org.opencontainers.image.title names the asset; the platform comes from
// the layer annotation vnd.myriarch.platform ("linux/amd64") or else from
// the name (…_linux_amd64…); a layer without either is for every platform.
// The optional vnd.myriarch.signature annotation is the base64 ed25519
// signature of the asset's digest string ("sha256:<hex>").
package releases

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"
)

// Source types.
const (
	TypeOCI    = "oci"
	TypeGitHub = "github"
)

// Bounds of a source's poll interval.
const (
	MinPollInterval = time.Second
	MaxPollInterval = 24 * time.Hour
)

// Annotations read from OCI layers.
const (
	AnnotationPlatform  = "vnd.myriarch.platform"
	AnnotationSignature = "vnd.myriarch.signature"
	AnnotationTitle     = "org.opencontainers.image.title"
	AnnotationCreated   = "org.opencontainers.image.created"
)

// Source is the configuration of one tracked package.
type Source struct {
	Name string `json:"name"`
	// Type is "oci" or "github".
	Type string `json:"type"`
	// Source is, for oci, the repository ("registry.example.com/agents/x";
	// prefix http:// for a plain-HTTP registry); for github, "owner/repo".
	Source string `json:"source"`
	// Constraint is a semver constraint (">= 1.2, < 2"); empty = any.
	Constraint    string        `json:"constraint"`
	PollInterval  time.Duration `json:"-"`
	PollIntervalS float64       `json:"poll_interval_s"`
	// PublicKey is a base64 ed25519 public key; when set, every asset must
	// carry a valid signature.
	PublicKey string `json:"public_key,omitempty"`

	LastPolledAt *time.Time `json:"last_polled_at"`
	LastError    string     `json:"last_error"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// Validate checks every field and reports each problem with the field, the
// value and the rule.
func (s Source) Validate() error {
	var errs []error
	bad := func(field, value, rule string) {
		errs = append(errs, fmt.Errorf("%s %q: %s", field, value, rule))
	}
	if !nameRE.MatchString(s.Name) {
		bad("name", s.Name, "must be 1-63 characters of a-z, 0-9, '.', '_', '-', starting with a letter or digit")
	}
	switch s.Type {
	case TypeOCI:
		if _, _, err := splitOCI(s.Source); err != nil {
			bad("source", s.Source, "must be an OCI repository such as registry.example.com/agents/otelcol (prefix http:// for plain HTTP): "+err.Error())
		}
	case TypeGitHub:
		if p := strings.Split(s.Source, "/"); len(p) != 2 || p[0] == "" || p[1] == "" {
			bad("source", s.Source, "must be owner/repo")
		}
	default:
		bad("type", s.Type, "must be oci or github")
	}
	if s.Constraint != "" {
		if _, err := semver.NewConstraint(s.Constraint); err != nil {
			bad("constraint", s.Constraint, "must be a semver constraint such as >= 1.2, < 2: "+err.Error())
		}
	}
	if s.PollInterval < MinPollInterval || s.PollInterval > MaxPollInterval {
		bad("poll_interval", s.PollInterval.String(), fmt.Sprintf("must be a duration within [%s, %s]", MinPollInterval, MaxPollInterval))
	}
	if s.PublicKey != "" {
		if k, err := base64.StdEncoding.DecodeString(s.PublicKey); err != nil || len(k) != ed25519.PublicKeySize {
			bad("public_key", s.PublicKey, "must be a base64 ed25519 public key (32 bytes)")
		}
	}
	return errors.Join(errs...)
}

// Accepts reports whether version satisfies the constraint.
func (s Source) Accepts(version string) bool {
	v, err := semver.NewVersion(version)
	if err != nil {
		return false
	}
	if s.Constraint == "" {
		return true
	}
	c, err := semver.NewConstraint(s.Constraint)
	return err == nil && c.Check(v)
}

// Release is one version of a package.
type Release struct {
	Package     string    `json:"package"`
	Version     string    `json:"version"`
	PublishedAt time.Time `json:"published_at"`
	RecordedAt  time.Time `json:"recorded_at"`
	Assets      []Asset   `json:"assets"`
}

// Asset is one downloadable file of a release.
type Asset struct {
	Name string `json:"name"`
	OS   string `json:"os"`
	Arch string `json:"arch"`
	// Digest is "sha256:<hex>" of the content.
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
	// URL is where the prefetcher downloads it (oci: source@digest).
	URL string `json:"url"`
	// Signature is the base64 ed25519 signature of Digest, if any.
	Signature string `json:"signature,omitempty"`
}

// VerifySignature checks the asset's signature against a base64 public key;
// an empty key accepts everything.
func VerifySignature(publicKey, digest, signature string) error {
	if publicKey == "" {
		return nil
	}
	k, err := base64.StdEncoding.DecodeString(publicKey)
	if err != nil || len(k) != ed25519.PublicKeySize {
		return errors.New("public key is not a base64 ed25519 key")
	}
	sig, err := base64.StdEncoding.DecodeString(signature)
	if err != nil || signature == "" {
		return fmt.Errorf("asset %s has no valid base64 signature", digest)
	}
	if !ed25519.Verify(k, []byte(digest), sig) {
		return fmt.Errorf("signature of %s does not verify with the package's public key", digest)
	}
	return nil
}

var platformRE = regexp.MustCompile(`(?i)[_.-](linux|darwin|windows|freebsd)[_.-](amd64|arm64|arm|386|ppc64le|s390x|riscv64)`)

// Platform derives os and arch from an explicit "os/arch" or else from
// the file name; both empty means every platform.
func Platform(explicit, name string) (os, arch string) {
	if o, a, ok := strings.Cut(explicit, "/"); ok && o != "" && a != "" {
		return strings.ToLower(o), strings.ToLower(a)
	}
	if m := platformRE.FindStringSubmatch(name); m != nil {
		return strings.ToLower(m[1]), strings.ToLower(m[2])
	}
	return "", ""
}

// SortVersions sorts semver versions newest first; invalid ones last.
func SortVersions(vs []string) {
	slices.SortStableFunc(vs, func(a, b string) int {
		va, ea := semver.NewVersion(a)
		vb, eb := semver.NewVersion(b)
		switch {
		case ea != nil && eb != nil:
			return strings.Compare(a, b)
		case ea != nil:
			return 1
		case eb != nil:
			return -1
		}
		return vb.Compare(va)
	})
}
