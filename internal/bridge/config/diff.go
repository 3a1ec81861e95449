package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
)

// Diff is what a reload from one validated configuration to another
// changes. A session is kept when its connection settings, its
// subscriptions and (exclusive) its resolved lease cadence and failover
// policy are all unchanged: it keeps its lease and its broker connection,
// and only its routes are swapped. Any other difference in a session makes
// it Changed: it stops (an exclusive one steps down and releases its
// lease) and starts again with the new settings.
type Diff struct {
	Added, Removed, Changed, Kept []string // session IDs, in configuration order
	// SendersChanged are the IDs of senders that are new or whose
	// settings differ; SendersRemoved are no longer configured.
	SendersChanged, SendersRemoved []string
}

// Empty reports that the reload changes no session and no sender.
func (d Diff) Empty() bool {
	return len(d.Added)+len(d.Removed)+len(d.Changed)+len(d.SendersChanged)+len(d.SendersRemoved) == 0
}

// Compare diffs two validated configurations. Settings that only a restart
// can change (the bridge block except shutdown_timeout, the lease store)
// are refused, one Problem each, naming the new file.
func Compare(old, cur *Config) (Diff, Problems) {
	var ps Problems
	ob, nb := old.Bridge, cur.Bridge
	ob.ShutdownTimeout, nb.ShutdownTimeout = 0, 0
	if ob.InstanceIDSet == nb.InstanceIDSet && !ob.InstanceIDSet {
		ob.InstanceID, nb.InstanceID = "", ""
	}
	restart := func(path string, a, b any) {
		if !reflect.DeepEqual(a, b) {
			ps = append(ps, Problem{File: cur.File, Path: path, Value: fmt.Sprintf("%v", b),
				Rule: fmt.Sprintf("differs from the running configuration (%v); it takes a restart, not a reload", a)})
		}
	}
	restart("bridge.id", ob.ID, nb.ID)
	restart("bridge.instance_id", ob.InstanceID, nb.InstanceID)
	restart("bridge.deployment_mode", ob.DeploymentMode, nb.DeploymentMode)
	restart("bridge.http.listen", ob.HTTPListen, nb.HTTPListen)
	restart("bridge.dead_letter.path", ob.DeadLetterPath, nb.DeadLetterPath)
	restart("bridge.state_dir", ob.StateDir, nb.StateDir)
	if !reflect.DeepEqual(old.OpAMP, cur.OpAMP) {
		ps = append(ps, Problem{File: cur.File, Path: "opamp", Rule: "differs from the running configuration; it takes a restart, not a reload"})
	}
	if !reflect.DeepEqual(old.LeaseStore, cur.LeaseStore) {
		ps = append(ps, Problem{File: cur.File, Path: "stores.lease", Rule: "differs from the running configuration; it takes a restart, not a reload"})
	}
	var d Diff
	for _, s := range cur.Sessions {
		switch {
		case old.Session(s.ID) == nil:
			d.Added = append(d.Added, s.ID)
		case SessionUnchanged(old, cur, s.ID):
			d.Kept = append(d.Kept, s.ID)
		default:
			d.Changed = append(d.Changed, s.ID)
		}
	}
	for _, s := range old.Sessions {
		if cur.Session(s.ID) == nil {
			d.Removed = append(d.Removed, s.ID)
		}
	}
	for _, s := range cur.Senders {
		if o := old.Sender(s.ID); o == nil || !reflect.DeepEqual(*o, s) {
			d.SendersChanged = append(d.SendersChanged, s.ID)
		}
	}
	for _, s := range old.Senders {
		if cur.Sender(s.ID) == nil {
			d.SendersRemoved = append(d.SendersRemoved, s.ID)
		}
	}
	return d, ps
}

// SessionUnchanged reports whether session id has the same connection
// settings, the same subscriptions and, if exclusive, the same resolved
// lease cadence and failover policy in both configurations. Routes and
// senders may differ: they are swapped while the session stays connected.
func SessionUnchanged(old, cur *Config, id string) bool {
	a, b := old.Session(id), cur.Session(id)
	if a == nil || b == nil || !reflect.DeepEqual(*a, *b) {
		return false
	}
	if !slices.Equal(Subscriptions(old, id), Subscriptions(cur, id)) {
		return false
	}
	ea, eb := old.ExclusiveSession(id), cur.ExclusiveSession(id)
	if (ea == nil) != (eb == nil) {
		return false
	}
	if !sameSpools(old, cur, id) {
		return false
	}
	return ea == nil || reflect.DeepEqual(ea.Assessment, eb.Assessment)
}

// sameSpools reports whether every route of session id that had a spool
// keeps the same spool settings. A tenure holds its routes' spools open
// until it ends, so a changed (or removed) spool takes a new tenure: the
// session changes, its spools close, and the next tenure opens the new
// ones. A spool added to a route is opened by the kept session's route
// swap.
func sameSpools(old, cur *Config, id string) bool {
	for _, a := range old.Routes {
		if a.Session != id || a.Spool == nil {
			continue
		}
		i := slices.IndexFunc(cur.Routes, func(b RouteSettings) bool { return b.ID == a.ID })
		if i < 0 {
			continue // a removed route: its spool stays as it is
		}
		if b := cur.Routes[i]; b.Session != id || b.Spool == nil || *a.Spool != *b.Spool {
			return false
		}
	}
	return true
}

// Subscriptions is the deduplicated, sorted subscription list of session
// id: every topic filter of its receivers, with the QoS of its first
// appearance.
func Subscriptions(c *Config, id string) []TopicSettings {
	seen := map[string]bool{}
	var out []TopicSettings
	for _, r := range c.Receivers {
		if r.Session != id {
			continue
		}
		for _, t := range r.Topics {
			if !seen[t.Filter] {
				seen[t.Filter] = true
				out = append(out, t)
			}
		}
	}
	slices.SortFunc(out, func(x, y TopicSettings) int {
		switch {
		case x.Filter < y.Filter:
			return -1
		case x.Filter > y.Filter:
			return 1
		}
		return 0
	})
	return out
}

// WriteFileAtomic replaces path with data so that a reader (or a restart)
// sees either the old file or the new one, never a part: it writes a
// temporary file in the same directory, syncs it and renames it over
// path, keeping path's permissions.
func WriteFileAtomic(path string, data []byte) error {
	mode := os.FileMode(0o600)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
