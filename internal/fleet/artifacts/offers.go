package artifacts

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/open-telemetry/opamp-go/protobufs"

	"github.com/myriarch/myriarch/internal/fleet/eventbus"
	"github.com/myriarch/myriarch/internal/fleet/opampserver"
	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// Offer is one package version offered to one agent.
type Offer struct {
	InstanceUID string `json:"instance_uid"`
	Package     string `json:"package"`
	Version     string `json:"version"`
	Asset       string `json:"asset"`
	Digest      string `json:"digest"`
	Signature   string `json:"signature,omitempty"`
	SentConn    string `json:"-"`
	// Status is what the agent last reported for the package (its stored
	// PackageStatus), if anything.
	Status *ReportedStatus `json:"-"`
	// ReportedAll is the ServerProvidedAllPackagesHash (hex) that the agent
	// last reported: the AllPackagesHash of the last offer it got.
	ReportedAll string `json:"-"`
}

// ReportedStatus is the part of a stored PackageStatus that tells whether
// the agent got an offer: the hashes it names (hex).
type ReportedStatus struct {
	ServerOfferedHash string `json:"server_offered_hash"`
	AgentHasHash      string `json:"agent_has_hash"`
}

// Acknowledged reports whether the agent's status names the offered
// package hash, as offered (installing, failed) or as the one it has. It
// tells whether an offer that went out arrived; the status of an offer not
// sent yet may name the same hash for an earlier offer (a failed install
// offered again), so such an offer is never acknowledged.
func (o Offer) Acknowledged() bool {
	if o.Status == nil || o.SentConn == "" {
		return false
	}
	h := hex.EncodeToString(o.PackageHash())
	return o.Status.ServerOfferedHash == h || o.Status.AgentHasHash == h
}

// ContentHash is the raw sha256 of the file (DownloadableFile.content_hash).
func (o Offer) ContentHash() []byte {
	b, _ := hex.DecodeString(strings.TrimPrefix(o.Digest, "sha256:"))
	return b
}

// PackageHash is the OpAMP hash of the offered package: sha256 over the
// package name, the version and the content hash, so that it changes with
// either.
func (o Offer) PackageHash() []byte {
	h := sha256.New()
	h.Write([]byte(o.Package + "\x00" + o.Version + "\x00" + o.Digest))
	return h.Sum(nil)
}

// ErrNotOfferable is returned when a version cannot be offered to an agent.
var ErrNotOfferable = errors.New("cannot offer")

// OfferVersion offers version of pkg to the agents uids: each must declare
// the AcceptsPackages capability; for each it picks the asset of the
// agent's platform (os.type, host.arch) or the one for all platforms,
// requires the blob to be stored and verified, records the offer and
// notifies the replica the agent is connected to. All or nothing.
func OfferVersion(ctx context.Context, pool *pgxpool.Pool, pkg, version string, uids []string, by string) ([]Offer, error) {
	if len(uids) == 0 {
		return nil, fmt.Errorf("%w: agents: the list is empty", ErrNotOfferable)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var out []Offer
	for _, uid := range uids {
		o, err := OfferTx(ctx, tx, pkg, version, uid, by)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, tx.Commit(ctx)
}

// OfferTx records, inside tx, the offer of version of pkg to agent uid and
// notifies the replica the agent is connected to when tx commits.
func OfferTx(ctx context.Context, tx pgx.Tx, pkg, version, uid, by string) (Offer, error) {
	target, err := store.AgentOfferTarget(ctx, tx, uid)
	if errors.Is(err, store.ErrNotFound) {
		return Offer{}, fmt.Errorf("%w: agent %q: no such agent", ErrNotOfferable, uid)
	}
	if err != nil {
		return Offer{}, err
	}
	os, arch, caps := target.OS, target.Arch, target.Capabilities
	if caps&uint64(protobufs.AgentCapabilities_AgentCapabilities_AcceptsPackages) == 0 {
		// It would ignore the offer, and the offer would wait for an
		// install that never comes (the OpenTelemetry supervisor v0.149.0
		// is such an agent).
		return Offer{}, fmt.Errorf("%w: agent %s does not accept packages (capability AcceptsPackages; it declares %v)",
			ErrNotOfferable, uid, store.CapabilityNames(caps))
	}
	asset, err := releases.PlatformAsset(ctx, tx, pkg, version, os, arch)
	if errors.Is(err, releases.ErrNotFound) {
		return Offer{}, fmt.Errorf("%w: %s %s has no asset for agent %s (platform %q)", ErrNotOfferable, pkg, version, uid, os+"/"+arch)
	}
	if err != nil {
		return Offer{}, err
	}
	o := Offer{InstanceUID: uid, Package: pkg, Version: version, Asset: asset.Name, Digest: asset.Digest, Signature: asset.Signature}
	stored, err := BlobStored(ctx, tx, o.Digest)
	if err != nil {
		return Offer{}, err
	}
	if !stored {
		return Offer{}, fmt.Errorf("%w: asset %s of %s %s (%s) is not prefetched yet; see GET /api/v1/artifacts", ErrNotOfferable, o.Asset, pkg, version, o.Digest)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO agent_package_offers (instance_uid, package, version, asset, digest, signature, offered_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (instance_uid, package) DO UPDATE SET version = $3, asset = $4, digest = $5, signature = $6, offered_by = $7,
			offered_at = now(), sent_conn = '', sent_at = NULL`, uid, pkg, version, o.Asset, o.Digest, o.Signature, by); err != nil {
		return Offer{}, err
	}
	if err := eventbus.Notify(ctx, tx, eventbus.Packages, uid); err != nil {
		return Offer{}, err
	}
	return o, nil
}

// Offers returns the offers of the agents uids, by agent.
func Offers(ctx context.Context, pool *pgxpool.Pool, uids []string) (map[string][]Offer, error) {
	rows, err := pool.Query(ctx, `SELECT instance_uid, package, version, asset, digest, signature, sent_conn
		FROM agent_package_offers WHERE instance_uid = ANY($1) ORDER BY instance_uid, package`, uids)
	if err != nil {
		return nil, err
	}
	os, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Offer, error) {
		var o Offer
		return o, r.Scan(&o.InstanceUID, &o.Package, &o.Version, &o.Asset, &o.Digest, &o.Signature, &o.SentConn)
	})
	if err != nil || len(os) == 0 {
		return map[string][]Offer{}, err
	}
	with := make([]string, 0, len(os))
	for _, o := range os {
		if len(with) == 0 || with[len(with)-1] != o.InstanceUID {
			with = append(with, o.InstanceUID)
		}
	}
	statuses, err := store.AgentPackageStatuses(ctx, pool, with)
	if err != nil {
		return nil, err
	}
	m := map[string][]Offer{}
	for _, o := range os {
		st := statuses[o.InstanceUID]
		o.ReportedAll = st.AllPackagesHash
		if raw, ok := st.Packages[o.Package]; ok && string(raw) != "null" {
			o.Status = new(ReportedStatus)
			if err := json.Unmarshal(raw, o.Status); err != nil {
				return nil, fmt.Errorf("package status of %s for %s: %w", o.InstanceUID, o.Package, err)
			}
		}
		m[o.InstanceUID] = append(m[o.InstanceUID], o)
	}
	return m, nil
}

// DeleteOffer withdraws the offer of package pkg to agent uid, if any.
func DeleteOffer(ctx context.Context, q store.Querier, uid, pkg string) error {
	_, err := q.Exec(ctx, `DELETE FROM agent_package_offers WHERE instance_uid = $1 AND package = $2`, uid, pkg)
	return err
}

// MarkSent records that the offers of uid went out on connection connID.
func MarkSent(ctx context.Context, pool *pgxpool.Pool, uid, connID string) error {
	_, err := pool.Exec(ctx, `UPDATE agent_package_offers SET sent_conn = $2, sent_at = now() WHERE instance_uid = $1`, uid, connID)
	return err
}

// MarkResent records that the offers of uid go out again on connection
// connID, if they went out there last at least after ago. The condition is
// on the rows the update locks, so of two replicas that decide to re-send
// at once only one does (the second sees the first one's sent_at).
func MarkResent(ctx context.Context, pool *pgxpool.Pool, uid, connID string, after time.Duration) (bool, error) {
	tag, err := pool.Exec(ctx, `UPDATE agent_package_offers SET sent_at = now()
		WHERE instance_uid = $1 AND sent_conn = $2 AND sent_at <= now() - make_interval(secs => $3)`,
		uid, connID, after.Seconds())
	return tag.RowsAffected() > 0, err
}

// OfferSource gives the OpAMP server the package offers of its agents
// (opampserver.Packages), with download URLs on this replica.
type OfferSource struct {
	Pool *pgxpool.Pool
	// BaseURL returns the base URL at which agents reach this replica's
	// HTTP listener.
	BaseURL func() string
	// Tokens issues the download token that each offer carries as its
	// Authorization header, for the agent it is offered to and the blob
	// offered (AgentAuth checks it).
	Tokens *Tokens
}

// Pending implements opampserver.Packages.
func (s OfferSource) Pending(ctx context.Context, uids []string) (map[string]opampserver.PendingPackages, error) {
	offers, err := Offers(ctx, s.Pool, uids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]opampserver.PendingPackages, len(offers))
	for uid, os := range offers {
		if out[uid], err = s.available(ctx, os); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Sent implements opampserver.Packages.
func (s OfferSource) Sent(ctx context.Context, uid, connID string) error {
	return MarkSent(ctx, s.Pool, uid, connID)
}

// Resend implements opampserver.Packages.
func (s OfferSource) Resend(ctx context.Context, uid, connID string, after time.Duration) (bool, error) {
	return MarkResent(ctx, s.Pool, uid, connID, after)
}

// available builds the PackagesAvailable message of one agent's offers: all
// of them, since an OpAMP agent removes the packages that are not offered.
// Each file carries a fresh download token of that agent for that blob;
// the hashes do not depend on it, so an agent that has the packages does
// not download them again when the offer is re-sent.
func (s OfferSource) available(ctx context.Context, os []Offer) (opampserver.PendingPackages, error) {
	pa := &protobufs.PackagesAvailable{Packages: map[string]*protobufs.PackageAvailable{}}
	all := sha256.New()
	p := opampserver.PendingPackages{Msg: pa, SentConn: os[0].SentConn, Acked: true}
	var detail []string
	for _, o := range os { // ordered by package
		var hdr *protobufs.Headers
		if s.Tokens != nil {
			tok, err := s.Tokens.Issue(ctx, o.InstanceUID, o.Digest)
			if err != nil {
				return opampserver.PendingPackages{}, err
			}
			hdr = &protobufs.Headers{Headers: []*protobufs.Header{{Key: "Authorization", Value: "Bearer " + tok}}}
		}
		sig, _ := base64.StdEncoding.DecodeString(o.Signature)
		ph := o.PackageHash()
		pa.Packages[o.Package] = &protobufs.PackageAvailable{Type: protobufs.PackageType_PackageType_TopLevel, Version: o.Version, Hash: ph,
			File: &protobufs.DownloadableFile{DownloadUrl: URL(s.BaseURL(), o.Digest), ContentHash: o.ContentHash(), Signature: sig, Headers: hdr}}
		all.Write(ph)
		if o.SentConn != p.SentConn {
			p.SentConn = ""
		}
		p.Acked = p.Acked && o.Acknowledged()
		detail = append(detail, o.Package+" "+o.Version)
	}
	pa.AllPackagesHash = all.Sum(nil)
	// An agent names the offer's AllPackagesHash as soon as it starts on
	// it, before it reaches each package (opamp-go).
	if allHex := hex.EncodeToString(pa.AllPackagesHash); !p.Acked && p.SentConn != "" && os[0].ReportedAll == allHex {
		p.Acked = true
	}
	p.Detail = strings.Join(detail, ", ")
	return p, nil
}
