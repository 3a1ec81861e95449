// Package spool is a route's durable spool on local disk: a log of
// segment files in one directory that the route appends each received
// message to before the source is acknowledged, and delivers from in
// order.
//
// A record is removed only when the route settled it (every sender
// accepted it, or it was dead-lettered): Ack. Acks are recorded as a
// low-water mark (every record below it is settled) in the file "acked",
// rewritten every FsyncInterval; a segment whose records are all below it
// is deleted. After a crash, records at or above the last recorded mark
// are delivered again (at least once): those settled since the last
// checkpoint, and those settled out of order above the mark.
//
// Crash safety: each record carries a CRC-32C; on Open the last segment
// is read to its end and a torn tail (a partial or corrupt frame) is
// truncated. A corrupt frame in an earlier segment (sealed and synced at
// rotation) is not a crash's work and fails Open with the file and offset.
//
// One process at a time: Open takes an exclusive lock (flock) on the
// directory's LOCK file and waits for it, so that an instance that takes
// over a lease on the same host opens the spool only after the previous
// holder closed it or died.
package spool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/routing"
	"github.com/myriarch/myriarch/internal/bridge/transport"
)

// Fsync policies.
const (
	FsyncAlways   = "always"   // every append is synced before the source is acknowledged
	FsyncInterval = "interval" // synced every FsyncInterval: a power loss may lose that much
	FsyncNever    = "never"    // left to the kernel: a process crash loses nothing, a power loss may
)

// Full policies.
const (
	FullBlock      = "block"       // Append waits for room: the session stops reading (backpressure)
	FullDeadLetter = "dead_letter" // Append returns ErrFull: the caller dead-letters the message
)

// Defaults.
const (
	DefaultSegmentBytes  = 64 << 20
	DefaultFsyncInterval = 200 * time.Millisecond
)

// ErrFull is returned by Append when the spool is full and the policy is
// dead_letter (routing.ErrSpoolFull: the route dead-letters the message).
var ErrFull = routing.ErrSpoolFull

// ErrClosed is returned by Append on a closed spool, or when the caller's
// quit closed while it waited.
var ErrClosed = errors.New("spool closed")

// Options configure a spool.
type Options struct {
	Dir string
	// MaxBytes and MaxMessages bound what the spool holds (0: no bound).
	MaxBytes    int64
	MaxMessages int64
	Full        string // FullBlock (default) or FullDeadLetter
	Fsync       string // FsyncAlways, FsyncInterval (default) or FsyncNever
	// FsyncInterval is the sync cadence of FsyncInterval and the cadence
	// of the ack checkpoint for every policy.
	FsyncInterval time.Duration
	SegmentBytes  int64
	// OnStats, if set, receives the spool's figures after each checkpoint
	// (every FsyncInterval) from the spool's own goroutine.
	OnStats func(Stats)
	// Now is the clock of the oldest-age figure (nil: time.Now).
	Now func() time.Time
}

// Stats are what a spool holds.
type Stats struct {
	Messages     int64   `json:"messages"`
	Bytes        int64   `json:"bytes"`
	OldestAgeS   float64 `json:"oldest_age_s"`
	PeakMessages int64   `json:"peak_messages"`
	// Recovered is what Open found unsettled.
	Recovered int64 `json:"recovered"`
	// TruncatedBytes is the torn tail Open cut.
	TruncatedBytes int64 `json:"truncated_bytes,omitempty"`
}

type segment struct {
	first uint64 // seq of the first record (the file name)
	last  uint64 // seq of the last record; first-1 when empty
	size  int64
	path  string
}

// handed is a record the reader handed out and that is not yet settled,
// or settled out of order (acked).
type handed struct {
	seq   uint64
	size  int64
	recv  time.Time
	acked bool
}

// Spool is one route's durable spool. Append is called by one goroutine
// (the session's handler); Next by one reader at a time (Attach); Ack
// from any goroutine.
type Spool struct {
	opts Options
	lock *os.File

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	closed  bool
	segs    []*segment // in order; the last is the active one
	active  *os.File
	dirty   bool // written since the last sync
	nextSeq uint64
	encBuf  []byte

	// What the spool holds: records not settled.
	count, bytes, peak int64
	// The reader: the next seq to hand out and where it is.
	readSeq  uint64
	readSeg  int // index in segs
	readOff  int64
	readFile *os.File
	readBuf  []byte // bytes of readSeg from readBufOff
	readAt   int64  // file offset of readBuf[0]
	// handedOut are the records handed out since the reader last
	// started, in seq order; the low-water mark is the first unsettled
	// one, or readSeq.
	handedOut []handed
	// pending are records handed out before a Rewind and not settled:
	// they will be read again. skip are records at or above the reader
	// that were settled (a late Ack after a Rewind): the reader skips
	// them.
	pending  map[uint64]handed
	skip     map[uint64]struct{}
	attached bool
	// oldestRecv is the receipt time of the record at the low-water
	// mark, when known.
	stats      Stats
	checkpoint uint64 // low-water mark last written

	// The group sync (fsync always, Enqueue): records written and not yet
	// synced, in order, and how many the syncer took and has not
	// reported; closing refuses new records while Close lets the syncer
	// finish.
	unsynced []syncWait
	syncing  int
	closing  bool
	syncKick chan struct{}
	// syncFile syncs a segment for the group sync ((*os.File).Sync; a
	// test holds it to see what queues up behind it).
	syncFile func(*os.File) error
	syncStop chan struct{}
	syncDone chan struct{}

	stop chan struct{}
	done chan struct{}
}

// Open opens (creating) the spool in opts.Dir, waiting for the
// directory's lock until ctx ends, and recovers what it holds.
func Open(ctx context.Context, opts Options) (*Spool, error) {
	if opts.Full == "" {
		opts.Full = FullBlock
	}
	if opts.Fsync == "" {
		opts.Fsync = FsyncInterval
	}
	if opts.FsyncInterval <= 0 {
		opts.FsyncInterval = DefaultFsyncInterval
	}
	if opts.SegmentBytes <= 0 {
		opts.SegmentBytes = DefaultSegmentBytes
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(opts.Dir, 0o750); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(opts.Dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = lock.Close()
			return nil, fmt.Errorf("spool %s: lock: %w", opts.Dir, err)
		}
		select {
		case <-ctx.Done():
			_ = lock.Close()
			return nil, fmt.Errorf("spool %s: another process holds it: %w", opts.Dir, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	s := &Spool{opts: opts, lock: lock, changed: make(chan struct{}), pending: map[uint64]handed{}, skip: map[uint64]struct{}{},
		stop: make(chan struct{}), done: make(chan struct{}),
		syncKick: make(chan struct{}, 1), syncStop: make(chan struct{}), syncDone: make(chan struct{}), syncFile: (*os.File).Sync}
	if err := s.recover(); err != nil {
		s.closeFiles()
		_ = lock.Close()
		return nil, err
	}
	go s.loop()
	if opts.Fsync == FsyncAlways {
		go s.syncLoop()
	} else {
		close(s.syncDone)
	}
	return s, nil
}

func (s *Spool) segPath(first uint64) string {
	return filepath.Join(s.opts.Dir, fmt.Sprintf("%020d.seg", first))
}

// recover reads the checkpoint and the segments, truncates a torn tail
// and positions the reader at the low-water mark.
func (s *Spool) recover() error {
	var mark uint64
	if b, err := os.ReadFile(filepath.Join(s.opts.Dir, "acked")); err == nil {
		v, perr := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if perr != nil {
			return fmt.Errorf("spool %s: acked: %q is not a sequence number", s.opts.Dir, b)
		}
		mark = v
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	names, err := filepath.Glob(filepath.Join(s.opts.Dir, "*.seg"))
	if err != nil {
		return err
	}
	sort.Strings(names)
	for i, name := range names {
		first, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(name), ".seg"), 10, 64)
		if err != nil {
			return fmt.Errorf("spool: %s: not a segment name", name)
		}
		seg := &segment{first: first, last: first - 1, path: name}
		b, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		off := 0
		for off < len(b) {
			r, n, err := DecodeFrame(b[off:])
			if err == nil && r.Seq != seg.last+1 {
				err = fmt.Errorf("%w: seq %d after %d", ErrCorrupt, r.Seq, seg.last)
			}
			if err != nil {
				if i != len(names)-1 {
					return fmt.Errorf("spool: %s at offset %d: %w (not the last segment: not a torn tail; move the directory aside to start empty)", name, off, err)
				}
				// The torn tail of the crash: cut it.
				s.stats.TruncatedBytes = int64(len(b) - off)
				if err := os.Truncate(name, int64(off)); err != nil {
					return err
				}
				break
			}
			seg.last = r.Seq
			if r.Seq >= mark {
				s.count++
				s.bytes += int64(n)
			}
			off += n
		}
		seg.size = int64(off)
		if len(s.segs) > 0 && seg.first != s.segs[len(s.segs)-1].last+1 {
			return fmt.Errorf("spool: %s starts at %d, the previous segment ends at %d", name, seg.first, s.segs[len(s.segs)-1].last)
		}
		s.segs = append(s.segs, seg)
	}
	// Drop the segments wholly below the mark.
	s.nextSeq = max(mark, 1)
	if n := len(s.segs); n > 0 {
		s.nextSeq = max(s.nextSeq, s.segs[n-1].last+1)
	}
	for len(s.segs) > 1 && s.segs[0].last < mark {
		if err := os.Remove(s.segs[0].path); err != nil {
			return err
		}
		s.segs = s.segs[1:]
	}
	if len(s.segs) == 0 || s.segs[len(s.segs)-1].size >= s.opts.SegmentBytes {
		s.segs = append(s.segs, &segment{first: s.nextSeq, last: s.nextSeq - 1, path: s.segPath(s.nextSeq)})
	}
	act := s.segs[len(s.segs)-1]
	f, err := os.OpenFile(act.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	s.active = f
	if err := syncDir(s.opts.Dir); err != nil {
		return err
	}
	s.stats.Recovered = s.count
	s.peak = s.count
	s.checkpoint = mark
	s.readSeq = max(mark, s.segs[0].first)
	s.readSeg = 0
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// notify wakes everyone waiting for a change; with s.mu held.
func (s *Spool) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Append writes m to the spool (synced per the fsync policy) before it
// returns. When the spool is full it waits for room (block) until quit
// closes (ErrClosed), or returns ErrFull (dead_letter).
func (s *Spool) Append(m *transport.Message, quit <-chan struct{}) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.appendLocked(m, quit, false)
}

// maxUnsynced bounds the records written and not yet reported synced by
// the group sync (fsync always): Enqueue waits beyond it.
const maxUnsynced = 1024

// syncWait is a record written and waiting for the group sync, or a
// refusal of the full policy in its place in the order.
type syncWait struct {
	path   string
	full   bool
	stored func(error)
}

// Enqueue is the route's hand-over (routing.GroupSpool). With fsync
// always it writes m and returns; the spool's syncer then syncs, once,
// every segment written since its previous sync and reports each record
// stored, in order: one fsync for all the records that arrived during the
// previous one, instead of one per record on the session's packet loop.
// With interval or never a written record is as durable as it will be
// at once, so stored is called before Enqueue returns. A record the
// full policy refuses (dead_letter) is reported with ErrFull in its
// place in the order. An error returned (closed, a failed write) means m
// was not taken and stored is not called.
func (s *Spool) Enqueue(m *transport.Message, quit <-chan struct{}, stored func(error)) error {
	s.mu.Lock()
	if s.opts.Fsync != FsyncAlways {
		err := s.appendLocked(m, quit, false)
		s.mu.Unlock()
		if err != nil && !errors.Is(err, ErrFull) {
			return err
		}
		stored(err)
		return nil
	}
	for len(s.unsynced)+s.syncing >= maxUnsynced && !s.closed && !s.closing {
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-quit:
			return ErrClosed
		}
		s.mu.Lock()
	}
	err := s.appendLocked(m, quit, true)
	switch {
	case err == nil:
		s.unsynced = append(s.unsynced, syncWait{path: s.segs[len(s.segs)-1].path, stored: stored})
	case errors.Is(err, ErrFull):
		s.unsynced = append(s.unsynced, syncWait{full: true, stored: stored})
	default:
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	select {
	case s.syncKick <- struct{}{}:
	default:
	}
	return nil
}

// syncLoop is the group sync of fsync always: it syncs what Enqueue
// wrote and reports it, until Close, whose last pass syncs and reports
// what was written before it.
func (s *Spool) syncLoop() {
	defer close(s.syncDone)
	for {
		stopping := false
		select {
		case <-s.syncStop:
			stopping = true
		case <-s.syncKick:
		}
		for {
			s.mu.Lock()
			batch := s.unsynced
			s.unsynced = nil
			s.syncing = len(batch)
			s.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			err := syncSegments(batch, s.syncFile)
			if err != nil {
				// As when Append's fsync fails: this process stops using
				// the spool; what it wrote is the next Open's.
				err = fmt.Errorf("spool %s: fsync: %w", s.opts.Dir, err)
				s.mu.Lock()
				s.closed = true
				s.notify()
				s.mu.Unlock()
			}
			for _, w := range batch {
				switch {
				case err != nil:
					w.stored(err)
				case w.full:
					w.stored(ErrFull)
				default:
					w.stored(nil)
				}
			}
			s.mu.Lock()
			s.syncing = 0
			s.notify()
			s.mu.Unlock()
		}
		if stopping {
			return
		}
	}
}

// syncSegments syncs each segment file the batch wrote to, through a
// descriptor of its own (fsync syncs the file, whichever descriptor
// wrote): the active one may be rotated meanwhile, which syncs it too. A
// segment already deleted held only settled records.
func syncSegments(batch []syncWait, sync func(*os.File) error) error {
	last := ""
	for _, w := range batch {
		if w.full || w.path == last {
			continue
		}
		last = w.path
		f, err := os.Open(w.path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		err = sync(f)
		_ = f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// appendLocked writes m, with s.mu held (released while it waits for
// room). group leaves the sync of fsync always to the syncer.
func (s *Spool) appendLocked(m *transport.Message, quit <-chan struct{}, group bool) error {
	buf, err := encodeRecord(s.encBuf[:0], s.nextSeq, m)
	if err != nil {
		return err
	}
	s.encBuf = buf
	size := int64(len(buf))
	for {
		if s.closed || s.closing {
			return ErrClosed
		}
		full := (s.opts.MaxMessages > 0 && s.count+1 > s.opts.MaxMessages) || (s.opts.MaxBytes > 0 && s.count > 0 && s.bytes+size > s.opts.MaxBytes)
		if !full {
			break
		}
		if s.opts.Full == FullDeadLetter {
			return ErrFull
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-quit:
			s.mu.Lock()
			return ErrClosed
		}
		s.mu.Lock()
		// The seq may not have moved (only Append moves it), but the
		// buffer is re-encoded in case.
		if buf, err = encodeRecord(s.encBuf[:0], s.nextSeq, m); err != nil {
			return err
		}
		s.encBuf = buf
	}
	act := s.segs[len(s.segs)-1]
	if act.size > 0 && act.size+size > s.opts.SegmentBytes {
		if err := s.rotate(); err != nil {
			return err
		}
		act = s.segs[len(s.segs)-1]
	}
	if _, err := s.active.Write(buf); err != nil {
		// A full disk (ENOSPC, EFBIG): cut what part of the record was
		// written and refuse only this message (it stays unacknowledged
		// at the source), so that the route goes on delivering what the
		// spool holds, which frees room. If the cut fails, a partial
		// write is a torn tail for the next Open and this process stops
		// using the spool.
		if terr := s.active.Truncate(act.size); terr == nil {
			return fmt.Errorf("spool %s: write: %w", s.opts.Dir, err)
		}
		s.closed = true
		s.notify()
		return fmt.Errorf("spool %s: write: %w", s.opts.Dir, err)
	}
	switch {
	case s.opts.Fsync == FsyncAlways && group:
		// The syncer syncs it before the source is acknowledged.
	case s.opts.Fsync == FsyncAlways:
		if err := s.active.Sync(); err != nil {
			s.closed = true
			s.notify()
			return fmt.Errorf("spool %s: fsync: %w", s.opts.Dir, err)
		}
	default:
		s.dirty = true
	}
	act.size += size
	act.last = s.nextSeq
	s.nextSeq++
	s.count++
	s.bytes += size
	s.peak = max(s.peak, s.count)
	s.notify()
	return nil
}

// rotate seals the active segment (synced unless fsync is never) and
// starts the next; with s.mu held.
func (s *Spool) rotate() error {
	if s.opts.Fsync != FsyncNever {
		if err := s.active.Sync(); err != nil {
			return err
		}
	}
	if err := s.active.Close(); err != nil {
		return err
	}
	seg := &segment{first: s.nextSeq, last: s.nextSeq - 1, path: s.segPath(s.nextSeq)}
	f, err := os.OpenFile(seg.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	s.active, s.dirty = f, false
	s.segs = append(s.segs, seg)
	if s.opts.Fsync != FsyncNever {
		return syncDir(s.opts.Dir)
	}
	return nil
}

// Attach makes the caller the spool's one reader, waiting until the
// previous one detached or quit closes (false).
func (s *Spool) Attach(quit <-chan struct{}) bool {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return false
		}
		if !s.attached {
			s.attached = true
			s.mu.Unlock()
			return true
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-quit:
			return false
		}
	}
}

// Detach ends the reader and rewinds: what it was handed and did not see
// settled is handed out again to the next reader, in order.
func (s *Spool) Detach() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attached = false
	if len(s.handedOut) > 0 {
		back := s.readSeq
		for _, h := range s.handedOut {
			if !h.acked {
				s.pending[h.seq] = h
				back = min(back, h.seq)
			}
		}
		for _, h := range s.handedOut {
			if h.acked && h.seq > back {
				s.skip[h.seq] = struct{}{}
			}
		}
		s.handedOut = s.handedOut[:0]
		if back < s.readSeq {
			s.seek(back)
		}
	}
	s.notify()
}

// seek moves the reader to seq; with s.mu held.
func (s *Spool) seek(seq uint64) {
	s.readSeq = seq
	s.readSeg = 0
	for i, g := range s.segs {
		if seq >= g.first && seq <= g.last+1 {
			s.readSeg = i
			break
		}
	}
	s.readOff = 0
	s.dropReadFile()
}

func (s *Spool) dropReadFile() {
	if s.readFile != nil {
		_ = s.readFile.Close()
		s.readFile = nil
	}
	s.readBuf = s.readBuf[:0]
	s.readAt = 0
}

// Next hands out the next record, waiting for one until quit closes
// (false). Records come in seq order; a record settled already (a late
// Ack after a Rewind) is skipped.
func (s *Spool) Next(quit <-chan struct{}) (uint64, *transport.Message, bool, error) {
	r, ok, err := s.NextRecord(quit)
	return r.Seq, &r.Msg, ok, err
}

// NextRecord is Next returning the record.
func (s *Spool) NextRecord(quit <-chan struct{}) (Record, bool, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return Record{}, false, nil
		}
		if s.readSeq < s.nextSeq {
			r, size, err := s.read()
			if err != nil {
				s.mu.Unlock()
				return Record{}, false, err
			}
			_, skipped := s.skip[r.Seq]
			if skipped {
				delete(s.skip, r.Seq)
				s.mu.Unlock()
				continue
			}
			delete(s.pending, r.Seq)
			s.handedOut = append(s.handedOut, handed{seq: r.Seq, size: size, recv: r.Msg.Received})
			s.mu.Unlock()
			return r, true, nil
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-quit:
			return Record{}, false, nil
		}
	}
}

// read decodes the record at the reader and moves past it; with s.mu
// held and readSeq < nextSeq.
func (s *Spool) read() (Record, int64, error) {
	for {
		seg := s.segs[s.readSeg]
		if s.readSeq > seg.last {
			s.readSeg++
			s.readOff = 0
			s.dropReadFile()
			continue
		}
		if s.readFile == nil {
			f, err := os.Open(seg.path)
			if err != nil {
				return Record{}, 0, err
			}
			s.readFile = f
		}
		rel := int(s.readOff - s.readAt)
		if rel >= 0 && rel <= len(s.readBuf) {
			r, n, err := DecodeFrame(s.readBuf[rel:])
			if err == nil {
				s.readOff += int64(n)
				if r.Seq < s.readSeq {
					continue // before a seek target
				}
				if r.Seq != s.readSeq {
					return Record{}, 0, fmt.Errorf("spool %s: %s at offset %d: seq %d, want %d", s.opts.Dir, seg.path, s.readOff-int64(n), r.Seq, s.readSeq)
				}
				s.readSeq++
				return r, int64(n), nil
			}
			if !errors.Is(err, errShort) {
				return Record{}, 0, fmt.Errorf("spool %s: %s at offset %d: %w", s.opts.Dir, seg.path, s.readOff, err)
			}
		}
		// Refill from readOff, at most to what is written.
		want := min(max(int64(256<<10), 2*int64(len(s.readBuf))), seg.size-s.readOff)
		if want <= 0 {
			return Record{}, 0, fmt.Errorf("spool %s: %s: record %d missing at offset %d", s.opts.Dir, seg.path, s.readSeq, s.readOff)
		}
		if cap(s.readBuf) < int(want) {
			s.readBuf = make([]byte, want)
		}
		s.readBuf = s.readBuf[:want]
		n, err := s.readFile.ReadAt(s.readBuf, s.readOff)
		if int64(n) < want {
			return Record{}, 0, fmt.Errorf("spool %s: %s: short read at %d: %v", s.opts.Dir, seg.path, s.readOff, err)
		}
		s.readAt = s.readOff
	}
}

// Ack settles record seq: every sender accepted it or it was
// dead-lettered. Acking a record twice, or one not handed out by this
// reader, is harmless.
func (s *Spool) Ack(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := slices.BinarySearchFunc(s.handedOut, seq, func(h handed, seq uint64) int {
		switch {
		case h.seq < seq:
			return -1
		case h.seq > seq:
			return 1
		}
		return 0
	})
	switch {
	case ok:
		if s.handedOut[i].acked {
			return
		}
		s.handedOut[i].acked = true
		s.settle(s.handedOut[i].size)
		// Drop the settled prefix.
		k := 0
		for k < len(s.handedOut) && s.handedOut[k].acked {
			k++
		}
		if k > 0 {
			n := copy(s.handedOut, s.handedOut[k:])
			s.handedOut = s.handedOut[:n]
		}
	default:
		if h, ok := s.pending[seq]; ok {
			delete(s.pending, seq)
			s.skip[seq] = struct{}{}
			s.settle(h.size)
		}
	}
	s.notify()
}

func (s *Spool) settle(size int64) {
	s.count--
	s.bytes -= size
}

// lowWater is the first unsettled seq; with s.mu held.
func (s *Spool) lowWater() uint64 {
	w := s.readSeq
	if len(s.handedOut) > 0 {
		w = min(w, s.handedOut[0].seq)
	}
	for seq := range s.pending {
		w = min(w, seq)
	}
	return w
}

// Stats reports what the spool holds.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statsLocked()
}

func (s *Spool) statsLocked() Stats {
	st := s.stats
	st.Messages, st.Bytes, st.PeakMessages = s.count, s.bytes, s.peak
	if s.count > 0 {
		var oldest time.Time
		if len(s.handedOut) > 0 {
			oldest = s.handedOut[0].recv
		}
		for _, h := range s.pending {
			if oldest.IsZero() || (!h.recv.IsZero() && h.recv.Before(oldest)) {
				oldest = h.recv
			}
		}
		if oldest.IsZero() {
			oldest = s.oldestUnread()
		}
		if !oldest.IsZero() {
			st.OldestAgeS = max(0, s.opts.Now().Sub(oldest).Seconds())
		}
	}
	return st
}

// oldestUnread is the receipt time of the record at the reader, read
// from disk (only when nothing is handed out: an outage, where it is the
// figure the alert needs).
func (s *Spool) oldestUnread() time.Time {
	if s.readSeq >= s.nextSeq {
		return time.Time{}
	}
	seg := s.segs[s.readSeg]
	f, err := os.Open(seg.path)
	if err != nil {
		return time.Time{}
	}
	defer f.Close()
	off := s.readOff
	var hdr [frameHeader + 16]byte
	for {
		if _, err := f.ReadAt(hdr[:], off); err != nil {
			return time.Time{}
		}
		n := int64(uint32(hdr[0])<<24 | uint32(hdr[1])<<16 | uint32(hdr[2])<<8 | uint32(hdr[3]))
		seq := uint64(0)
		for _, c := range hdr[8:16] {
			seq = seq<<8 | uint64(c)
		}
		if seq >= s.readSeq {
			var ns int64
			for _, c := range hdr[16:24] {
				ns = ns<<8 | int64(c)
			}
			if ns == 0 {
				return time.Time{}
			}
			return time.Unix(0, ns)
		}
		off += frameHeader + n
	}
}

// loop syncs (interval policy), writes the ack checkpoint and deletes
// settled segments every FsyncInterval, until Close.
func (s *Spool) loop() {
	defer close(s.done)
	t := time.NewTicker(s.opts.FsyncInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.tick()
		}
	}
}

func (s *Spool) tick() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if s.dirty && s.opts.Fsync == FsyncInterval {
		if err := s.active.Sync(); err == nil {
			s.dirty = false
		}
	}
	mark := s.lowWater()
	var doomed []string
	if mark != s.checkpoint {
		// Sync the data before the mark moves past it? The mark only
		// names settled records, so it never needs unsynced data.
		if err := writeMark(s.opts.Dir, mark, s.opts.Fsync != FsyncNever); err == nil {
			s.checkpoint = mark
			for len(s.segs) > 1 && s.segs[0].last < mark && s.readSeg > 0 {
				doomed = append(doomed, s.segs[0].path)
				s.segs = s.segs[1:]
				s.readSeg--
			}
		}
	}
	st := s.statsLocked()
	s.mu.Unlock()
	for _, p := range doomed {
		_ = os.Remove(p)
	}
	if s.opts.OnStats != nil {
		s.opts.OnStats(st)
	}
}

func writeMark(dir string, mark uint64, sync bool) error {
	tmp := filepath.Join(dir, "acked.tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(strconv.FormatUint(mark, 10) + "\n"); err != nil {
		_ = f.Close()
		return err
	}
	if sync {
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "acked"))
}

// Close syncs, writes the checkpoint and releases the directory. Waiting
// Append, Attach and Next calls return.
func (s *Spool) Close() error {
	s.mu.Lock()
	if s.lock == nil {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	s.notify()
	s.mu.Unlock()
	// What Enqueue wrote is synced and reported stored (it is in the
	// spool either way).
	close(s.syncStop)
	<-s.syncDone
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if !s.closed && s.opts.Fsync != FsyncNever {
		err = s.active.Sync()
	}
	if mark := s.lowWater(); mark != s.checkpoint && !s.closed {
		if werr := writeMark(s.opts.Dir, mark, s.opts.Fsync != FsyncNever); werr != nil && err == nil {
			err = werr
		}
	}
	s.closed = true
	s.notify()
	s.closeFiles()
	if s.lock != nil {
		_ = s.lock.Close() // releases the flock
		s.lock = nil
	}
	return err
}

func (s *Spool) closeFiles() {
	if s.active != nil {
		_ = s.active.Close()
		s.active = nil
	}
	s.dropReadFile()
}

var _ routing.GroupSpool = (*Spool)(nil)

// Dir is the spool's directory.
func (s *Spool) Dir() string { return s.opts.Dir }
