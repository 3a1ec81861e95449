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
	want := SpoolSettings{Dir: filepath.Join("/etc/b", "plant-bridge-telemetry-archive.spool"), MaxBytes: DefaultSpoolMaxBytes, MaxMessages: 5000,
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
	}
	for _, c := range cases {
		_, err := Parse("bad.yaml", []byte(edit(t, "    lease_ttl: 10s\n", "    lease_ttl: 10s\n    spool: "+c.block+"\n")))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("spool %s: got %v\nwant a problem containing %s", c.block, err, c.want)
		}
	}
	// A file spool on an exclusive session with a shared store.
	y := edit(t, "lease: {type: sqlite, path: /tmp/lease.db}", "lease: {type: postgres, dsn: 'postgres://x@127.0.0.1/db'}",
		"    lease_ttl: 10s\n", "    lease_ttl: 10s\n    spool: {}\n")
	_, err := Parse("bad.yaml", []byte(y))
	if err == nil || !strings.Contains(err.Error(), `routes[0].spool: a file spool is local to one host, and with a postgres lease store`) {
		t.Errorf("postgres store with a file spool: %v", err)
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
