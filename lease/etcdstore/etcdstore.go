// Package etcdstore is the etcd lease store, for clusters.
//
// Each lease is one key under a prefix whose value is a JSON row. Every
// compare-and-set is one etcd transaction on the key's mod revision (and
// creation is one transaction on its create revision), so a write lands
// only if nobody wrote the key since it was read. etcd leases (TTL keys) are
// not used: expiry is by observation, and keys are never deleted.
package etcdstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/internal/rowstore"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultPrefix is the key prefix of the lease rows.
const DefaultPrefix = "/myriarch/leases/"

// Options tune a store. The zero value is usable.
type Options struct {
	// Prefix of the lease keys; default DefaultPrefix.
	Prefix string
	// Clock is the store's monotonic clock; nil means lease.SystemClock.
	Clock lease.Clock
}

// Open returns a store on client. The store does not close client.
func Open(client *clientv3.Client, opts Options) lease.Store {
	p := opts.Prefix
	if p == "" {
		p = DefaultPrefix
	}
	return rowstore.New(&backend{c: client, prefix: p}, opts.Clock)
}

type backend struct {
	c      *clientv3.Client
	prefix string
}

// row is the JSON form of a lease row.
type row struct {
	Owner        string `json:"owner"`
	Version      int64  `json:"version"`
	RenewedAtNS  int64  `json:"renewed_at_ns"`
	ExpiryNS     int64  `json:"expiry_ns"`
	Endpoint     string `json:"endpoint"`
	ObsSeq       int64  `json:"obs_seq"`
	ObsElapsedNS int64  `json:"obs_elapsed_ns"`
}

func (b *backend) key(id string) string { return b.prefix + id }

func encode(r rowstore.Row) string {
	data, _ := json.Marshal(row(r))
	return string(data)
}

func (b *backend) Load(ctx context.Context, id string) (rowstore.Row, int64, bool, error) {
	resp, err := b.c.Get(ctx, b.key(id))
	if err != nil {
		return rowstore.Row{}, 0, false, fmt.Errorf("etcdstore: get %q: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return rowstore.Row{}, 0, false, nil
	}
	kv := resp.Kvs[0]
	var r row
	dec := json.NewDecoder(bytes.NewReader(kv.Value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return rowstore.Row{}, 0, false, &lease.CorruptError{ID: id, Reason: fmt.Sprintf("value of key %s is not a lease row: %v", b.key(id), err)}
	}
	return rowstore.Row(r), kv.ModRevision, true, nil
}

func (b *backend) Insert(ctx context.Context, id string, r rowstore.Row) (bool, error) {
	k := b.key(id)
	resp, err := b.c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).Then(clientv3.OpPut(k, encode(r))).Commit()
	if err != nil {
		return false, fmt.Errorf("etcdstore: create %q: %w", id, err)
	}
	return resp.Succeeded, nil
}

func (b *backend) CAS(ctx context.Context, id string, rev int64, r rowstore.Row) (bool, error) {
	k := b.key(id)
	resp, err := b.c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).Then(clientv3.OpPut(k, encode(r))).Commit()
	if err != nil {
		return false, fmt.Errorf("etcdstore: update %q: %w", id, err)
	}
	return resp.Succeeded, nil
}

func (b *backend) Close() error { return nil }

// Watch implements rowstore.Watcher: one etcd watch on the prefix reports
// every write of a row whose owner is empty (a release).
func (b *backend) Watch(ctx context.Context, released func(id string)) {
	for ctx.Err() == nil {
		for resp := range b.c.Watch(clientv3.WithRequireLeader(ctx), b.prefix, clientv3.WithPrefix()) {
			for _, ev := range resp.Events {
				var r row
				if ev.Type == clientv3.EventTypePut && json.Unmarshal(ev.Kv.Value, &r) == nil && r.Owner == "" {
					released(strings.TrimPrefix(string(ev.Kv.Key), b.prefix))
				}
			}
		}
		// The watch ended (ctx, or a lost leader): start again after a
		// pause; releases meanwhile are found by the standby's poll.
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
