package config

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSpoolSettings(t *testing.T) {
	cfg, err := Parse("/etc/b/good.yaml", []byte(edit(t, "    lease_ttl: 10s\n", "    lease_ttl: 10s\n    spool: {max_messages: 5000, fsync: always}\n")))
	if err != nil {
		t.Fatal(err)
	}
	sp := cfg.Routes[0].Spool
	if sp == nil {
		t.Fatal("no spool")
	}
	want := SpoolSettings{Backend: "file", Dir: filepath.Join("/etc/b", "plant-bridge-telemetry-archive.spool"), MaxBytes: DefaultSpoolMaxBytes, MaxMessages: 5000,
		Full: "block", Fsync: "always", FsyncInterval: 200 * time.Millisecond, SegmentBytes: DefaultSpoolSegmentBytes}
	if *sp != want {
		t.Fatalf("spool %+v\nwant  %+v", *sp, want)
	}
	cfg, err = Parse("good.yaml", []byte(good))
	if err != nil || cfg.Routes[0].Spool != nil {
		t.Fatalf("a route without spool: %v %+v", err, cfg.Routes[0].Spool)
	}
}

func TestSpoolRefusals(t *testing.T) {
	cases := []struct{ block, want string }{
		{"{full: drop}", `routes[0].spool.full: "drop": must be block or dead_letter`},
		{"{fsync: sometimes}", `routes[0].spool.fsync: "sometimes": must be always, interval or never`},
		{"{max_bytes: 0}", `routes[0].spool.max_bytes: "0": and max_messages are both 0`},
		{"{max_messages: -1}", `routes[0].spool.max_messages: -1: must be 0 (no bound) or a positive number of messages`},
		{"{fsync_interval: 0s}", `routes[0].spool.fsync_interval: "0s": must be a positive duration`},
		{"{segment_bytes: 10}", `routes[0].spool.segment_bytes: 10: must be within [4096, 1073741824]`},
		{"{sync: always}", `routes[0].spool.sync: unknown key`},
		{"{backend: s3}", `routes[0].spool.backend: "s3": must be file or postgres`},
	}
	for _, c := range cases {
		_, err := Parse("bad.yaml", []byte(edit(t, "    lease_ttl: 10s\n", "    lease_ttl: 10s\n    spool: "+c.block+"\n")))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("spool %s: got %v\nwant a problem containing %s", c.block, err, c.want)
		}
	}
}

const pgStore = "lease: {type: postgres, dsn: 'postgres://x@127.0.0.1/db'}"

// The file spool on an exclusive session with a shared lease store is
// refused, and the error points at the backend that fits.
func TestFileSpoolRefusedOnSharedStore(t *testing.T) {
	for _, c := range []struct{ store, want string }{
		{pgStore, `routes[0].spool.backend: "file": a file spool is local to one host, and with a postgres lease store the successor of exclusive session "plant" may run on another host, where it could not read the spool: use backend: postgres`},
		{"lease: {type: etcd, endpoints: ['127.0.0.1:2379']}", `routes[0].spool.backend: "file": a file spool is local to one host, and with an etcd lease store the successor of exclusive session "plant" may run on another host, where it could not read the spool; the clustered spool is built on PostgreSQL only`},
	} {
		y := edit(t, "lease: {type: sqlite, path: /tmp/lease.db}", c.store, "    lease_ttl: 10s\n", "    lease_ttl: 10s\n    spool: {}\n")
		_, err := Parse("bad.yaml", []byte(y))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s with a file spool: %v\nwant %s", c.store, err, c.want)
		}
	}
}

// backend postgres: an exclusive session on the postgres lease store; the
// shape the lab's clustered pair uses (spool: {backend: postgres, ...}).
func TestPostgresSpool(t *testing.T) {
	y := edit(t, "lease: {type: sqlite, path: /tmp/lease.db}", pgStore, "    lease_ttl: 10s\n", "    lease_ttl: 10s\n    spool: {backend: postgres, max_messages: 100000, full: dead_letter}\n")
	cfg, err := Parse("good.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	want := SpoolSettings{Backend: "postgres", MaxBytes: DefaultSpoolMaxBytes, MaxMessages: 100000, Full: "dead_letter",
		Fsync: "interval", FsyncInterval: 200 * time.Millisecond, SegmentBytes: DefaultSpoolSegmentBytes}
	if sp := cfg.Routes[0].Spool; sp == nil || *sp != want {
		t.Fatalf("spool %+v\nwant  %+v", sp, want)
	}
	// Two routes with the postgres backend: no shared-directory clash.
	y2 := strings.Replace(y, "routes:\n", "routes:\n  - {id: second, receiver: telemetry, senders: [archive], lease_ttl: 10s, step_down_grace: 3s, failover_slo: 120s, broker_health_step_down: 20s, spool: {backend: postgres}}\n", 1)
	if _, err := Parse("good.yaml", []byte(y2)); err != nil {
		t.Fatalf("two postgres spools: %v", err)
	}
}

func TestPostgresSpoolRefusals(t *testing.T) {
	spool := func(block string) (string, string) {
		return "    lease_ttl: 10s\n", "    lease_ttl: 10s\n    spool: " + block + "\n"
	}
	cases := []struct {
		name  string
		pairs []string
		want  string
	}{
		{"sqlite store", []string{}, `routes[0].spool.backend: "postgres": needs stores.lease.type postgres: the spool lives in the lease store's database and is fenced by its lease rows, and this lease store is sqlite`},
		{"etcd store", []string{"lease: {type: sqlite, path: /tmp/lease.db}", "lease: {type: etcd, endpoints: ['127.0.0.1:2379']}"},
			`routes[0].spool.backend: "postgres": needs stores.lease.type postgres: the spool lives in the lease store's database and is fenced by its lease rows, and this lease store is etcd (there is no etcd spool`},
		{"not exclusive", []string{"lease: {type: sqlite, path: /tmp/lease.db}", pgStore, "    session_mode: exclusive\n", "    session_mode: persistent\n"},
			`routes[0].spool.backend: "postgres": needs an exclusive session: the postgres spool is fenced by the session's lease, and session "plant" is persistent (use backend file)`},
		{"file settings", []string{"lease: {type: sqlite, path: /tmp/lease.db}", pgStore}, `routes[0].spool.dir: "/var/spool/x": is a setting of the file spool; backend postgres keeps the spool in the lease store's database`},
	}
	for _, c := range cases {
		block := "{backend: postgres}"
		if c.name == "file settings" {
			block = "{backend: postgres, dir: /var/spool/x}"
		}
		o, n := spool(block)
		y := edit(t, append(c.pairs, o, n)...)
		_, err := Parse("bad.yaml", []byte(y))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v\nwant a problem containing %s", c.name, err, c.want)
		}
	}
}

// Two routes on one spool directory: the second would wait for the lock
// the first holds in the same process, and the route would never serve.
func TestSpoolSharedDirRefused(t *testing.T) {
	y := edit(t, "    lease_ttl: 10s\n", "    lease_ttl: 10s\n    spool: {dir: /var/spool/x, max_messages: 10}\n",
		"routes:\n", "routes:\n  - {id: second, receiver: telemetry, senders: [archive], lease_ttl: 10s, step_down_grace: 3s, failover_slo: 120s, broker_health_step_down: 20s, spool: {dir: /var/spool/x/, max_messages: 10}}\n")
	_, err := Parse("bad.yaml", []byte(y))
	if err == nil || !strings.Contains(err.Error(), `routes[1].spool.dir: "/var/spool/x": is also the spool of route "second"`) {
		t.Fatalf("two routes on one spool dir: %v", err)
	}
}

// A reload that changes or removes a route's spool changes its session:
// the running tenure holds the old spool open (locked) with the old
// settings, and a kept session would go on using it.
func TestCompareSpoolChange(t *testing.T) {
	with := func(block string) string {
		return edit(t, "    lease_ttl: 10s\n", "    lease_ttl: 10s\n"+block)
	}
	old := mustParse(t, with("    spool: {max_messages: 10}\n"))
	for _, tc := range []struct{ name, block, changed string }{
		{"same spool", "    spool: {max_messages: 10}\n", "[]"},
		{"new bound", "    spool: {max_messages: 20}\n", "[plant]"},
		{"new dir", "    spool: {max_messages: 10, dir: /tmp/elsewhere}\n", "[plant]"},
		{"spool removed", "", "[plant]"},
	} {
		d, ps := Compare(old, mustParse(t, with(tc.block)))
		if len(ps) > 0 {
			t.Fatal(ps)
		}
		if got := sprintf("%v", d.Changed); got != tc.changed {
			t.Errorf("%s: changed %s, want %s", tc.name, got, tc.changed)
		}
	}
	// A spool added to a kept session's route is opened by the route swap.
	d, _ := Compare(mustParse(t, good), old)
	if got := sprintf("%v", d.Kept); got != "[plant]" {
		t.Errorf("spool added: kept %s, want [plant]", got)
	}
}
