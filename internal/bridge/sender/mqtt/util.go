package mqtt

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

type stamp struct {
	mu sync.Mutex
	t  time.Time
}

func newStamp() *stamp { return &stamp{t: time.Now()} }

func (s *stamp) set(t time.Time) {
	s.mu.Lock()
	s.t = t
	s.mu.Unlock()
}

func (s *stamp) get() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.t
}

func sortBySeq(items []item) []item {
	slices.SortStableFunc(items, func(a, b item) int { return cmp.Compare(a.seq, b.seq) })
	return items
}
