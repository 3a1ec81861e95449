package releases_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/myriarch/myriarch/internal/fleet/fleettest"
	"github.com/myriarch/myriarch/internal/fleet/releases"
	"github.com/myriarch/myriarch/internal/fleet/releases/ocitest"
	"github.com/myriarch/myriarch/internal/fleet/store"
	"github.com/myriarch/myriarch/internal/pgtest"
	"github.com/myriarch/myriarch/pgleader"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSourceValidateNamesFieldValueAndRule(t *testing.T) {
	err := releases.Source{Name: "Bad Name", Type: "ftp", Source: "x", Constraint: ">>1", PollInterval: 0, PublicKey: "zz"}.Validate()
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{`name "Bad Name"`, `type "ftp": must be oci or github`, `constraint ">>1"`, `poll_interval "0s": must be a duration within [1s, 24h0m0s]`, `public_key "zz"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	ok := releases.Source{Name: "otelcol", Type: "oci", Source: "http://127.0.0.1:5000/agents/otelcol", Constraint: ">= 1, < 2", PollInterval: time.Minute}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	if !ok.Accepts("v1.4.0") || ok.Accepts("2.0.0") || ok.Accepts("latest") {
		t.Fatal("constraint")
	}
}

func TestPlatformAndSort(t *testing.T) {
	if o, a := releases.Platform("", "otelcol_0.1.0_linux_arm64.tar.gz"); o != "linux" || a != "arm64" {
		t.Fatal(o, a)
	}
	if o, a := releases.Platform("windows/amd64", "x.zip"); o != "windows" || a != "amd64" {
		t.Fatal(o, a)
	}
	vs := []string{"v1.2.0", "latest", "1.10.0", "v1.9.1"}
	releases.SortVersions(vs)
	if strings.Join(vs, ",") != "1.10.0,v1.9.1,v1.2.0,latest" {
		t.Fatal(vs)
	}
}

// leader starts a store and an elected elector on a fresh database.
func leader(t *testing.T) (*store.Store, *pgleader.Leadership, int64) {
	t.Helper()
	pg := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := store.Open(ctx, pg.DSN(""), 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	el, stopElector, err := fleettest.Elect(st.Pool, "r1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); stopElector(); st.Close() })
	term := el.Term()
	return st, el, term
}

func TestTrackerRecordsReleasesFromARealRegistry(t *testing.T) {
	reg := ocitest.Start(t)
	st, el, term := leader(t)
	ctx := context.Background()

	pub, priv, _ := ed25519.GenerateKey(nil)
	sign := func(d []byte) string {
		return base64.StdEncoding.EncodeToString(ed25519.Sign(priv, []byte(digestOf(d))))
	}
	amd, arm := []byte("agent linux amd64 v1.0.0"), []byte("agent linux arm64 v1.0.0")
	push := func(tag string, files ...ocitest.File) {
		t.Helper()
		if err := reg.Push(ctx, "agents/otelcol", tag, files); err != nil {
			t.Fatal(err)
		}
	}
	push("v1.0.0", ocitest.File{Name: "otelcol_linux_amd64.tar.gz", Data: amd, Signature: sign(amd)},
		ocitest.File{Name: "agent-arm.tgz", Platform: "linux/arm64", Data: arm, Signature: sign(arm)})
	push("v1.1.0", ocitest.File{Name: "otelcol_linux_amd64.tar.gz", Data: []byte("v1.1.0")})
	push("v2.0.0", ocitest.File{Name: "otelcol_linux_amd64.tar.gz", Data: []byte("v2")})
	push("latest", ocitest.File{Name: "otelcol_linux_amd64.tar.gz", Data: []byte("v2")})

	src := releases.Source{Name: "otelcol", Type: "oci", Source: reg.Repo("agents/otelcol"), Constraint: "< 2", PollInterval: time.Second,
		PublicKey: base64.StdEncoding.EncodeToString(pub)}
	if err := releases.PutSource(ctx, st.Pool, src); err != nil {
		t.Fatal(err)
	}
	bad := releases.Source{Name: "broken", Type: "oci", Source: "http://127.0.0.1:1/nothing/here", PollInterval: time.Second}
	if err := releases.PutSource(ctx, st.Pool, bad); err != nil {
		t.Fatal(err)
	}
	tr := releases.NewTracker(st.Pool, map[string]releases.Lister{"oci": releases.OCILister{}}, pgleader.DefaultLockKey, nil, nil)
	err := tr.Run(ctx, el.InTerm)
	if err == nil || !strings.Contains(err.Error(), "package broken") {
		t.Fatalf("want the broken source's error, got %v", err)
	}
	rels, err := releases.ListReleases(ctx, st.Pool, "otelcol")
	if err != nil {
		t.Fatal(err)
	}
	if len(rels) != 2 || rels[0].Version != "v1.1.0" || rels[1].Version != "v1.0.0" {
		t.Fatalf("releases: %+v", rels)
	}
	// The recorded term is the one the job's own fence checked.
	var terms []int64
	if rows, err := st.Pool.Query(ctx, `SELECT DISTINCT term FROM package_releases`); err != nil {
		t.Fatal(err)
	} else if terms, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil || len(terms) != 1 || terms[0] != term {
		t.Fatalf("recorded terms %v (%v), want [%d]", terms, err, term)
	}
	r := rels[1]
	if len(r.Assets) != 2 || !r.PublishedAt.Equal(time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)) {
		t.Fatalf("release: %+v", r)
	}
	for _, a := range r.Assets {
		want := amd
		if a.Arch == "arm64" {
			want = arm
		}
		if a.OS != "linux" || a.Digest != digestOf(want) || a.Size != int64(len(want)) {
			t.Fatalf("asset: %+v", a)
		}
		if err := releases.VerifySignature(src.PublicKey, a.Digest, a.Signature); err != nil {
			t.Fatal(err)
		}
		if releases.VerifySignature(src.PublicKey, digestOf([]byte("other")), a.Signature) == nil {
			t.Fatal("signature verified for another digest")
		}
	}
	srcs, _ := releases.ListSources(ctx, st.Pool)
	for _, s := range srcs {
		if (s.Name == "broken") != (s.LastError != "") || s.LastPolledAt == nil {
			t.Fatalf("source status: %+v", s)
		}
	}

	// A new release inside the constraint is recorded on a later poll; the
	// known ones are not fetched again.
	push("v1.2.0", ocitest.File{Name: "otelcol_linux_amd64.tar.gz", Data: []byte("v1.2.0")})
	time.Sleep(1100 * time.Millisecond) // the source's poll interval (1s) must pass
	_ = tr.Run(ctx, el.InTerm)
	rels, _ = releases.ListReleases(ctx, st.Pool, "otelcol")
	if len(rels) != 3 || rels[0].Version != "v1.2.0" {
		t.Fatalf("after the new tag: %+v", rels)
	}
}

func TestTrackerWritesNothingWithoutTheTerm(t *testing.T) {
	reg := ocitest.Start(t)
	pg := pgtest.New(t)
	ctx := context.Background()
	st, err := store.Open(ctx, pg.DSN(""), 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := reg.Push(ctx, "a/b", "1.0.0", []ocitest.File{{Name: "x_linux_amd64", Data: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if err := releases.PutSource(ctx, st.Pool, releases.Source{Name: "b", Type: "oci", Source: reg.Repo("a/b"), PollInterval: time.Second}); err != nil {
		t.Fatal(err)
	}
	// A leadership whose term is over: its fence refuses every write.
	other, stop, err := fleettest.Elect(st.Pool, "r2")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	tr := releases.NewTracker(st.Pool, map[string]releases.Lister{"oci": releases.OCILister{}}, pgleader.DefaultLockKey, nil, nil)
	if err := tr.Run(ctx, other.InTerm); !errors.Is(err, pgleader.ErrStaleTerm) {
		t.Fatalf("want a stale-term error, got %v", err)
	}
	if rels, _ := releases.ListReleases(ctx, st.Pool, ""); len(rels) != 0 {
		t.Fatalf("recorded without the term: %+v", rels)
	}
}

// The tracker writes through the fence the job runner hands it, not through
// whatever term the replica holds later: a run of an old term is refused
// even while a newer term leads, and the newer term's run records itself.
func TestTrackerOfAnOldTermIsRefusedWhileANewerTermLeads(t *testing.T) {
	reg := ocitest.Start(t)
	pg := pgtest.New(t)
	ctx := context.Background()
	st, err := store.Open(ctx, pg.DSN(""), 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := reg.Push(ctx, "a/b", "1.0.0", []ocitest.File{{Name: "x_linux_amd64", Data: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if err := releases.PutSource(ctx, st.Pool, releases.Source{Name: "b", Type: "oci", Source: reg.Repo("a/b"), PollInterval: time.Second}); err != nil {
		t.Fatal(err)
	}
	old, stopOld, err := fleettest.Elect(st.Pool, "r1")
	if err != nil {
		t.Fatal(err)
	}
	stopOld()
	cur, stopCur, err := fleettest.Elect(st.Pool, "r1")
	if err != nil {
		t.Fatal(err)
	}
	defer stopCur()
	if cur.Term() <= old.Term() {
		t.Fatalf("terms %d then %d", old.Term(), cur.Term())
	}
	tr := releases.NewTracker(st.Pool, map[string]releases.Lister{"oci": releases.OCILister{}}, pgleader.DefaultLockKey, nil, nil)
	if err := tr.Run(ctx, old.InTerm); !errors.Is(err, pgleader.ErrStaleTerm) {
		t.Fatalf("want a stale-term error, got %v", err)
	}
	if rels, _ := releases.ListReleases(ctx, st.Pool, ""); len(rels) != 0 {
		t.Fatalf("recorded by an old term: %+v", rels)
	}
	if err := tr.Run(ctx, cur.InTerm); err != nil {
		t.Fatal(err)
	}
	var term int64
	if err := st.Pool.QueryRow(ctx, `SELECT term FROM package_releases`).Scan(&term); err != nil || term != cur.Term() {
		t.Fatalf("recorded term %d (%v), want %d", term, err, cur.Term())
	}
}
