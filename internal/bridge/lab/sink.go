package lab

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/myriarch/myriarch/internal/bridge/fence"
)

// The fencing stamps every message delivered by an exclusive session
// carries (MQTT 5 user properties), as package fence names them.
const (
	PropLeaseVersion = fence.MQTTLeaseVersion
	PropSessionID    = fence.MQTTSessionID
)

// delivery is one message as the sink received it.
type delivery struct {
	At      time.Time
	Seq     int
	Version int64 // 0: unstamped
	Session string
}

// sink records every delivery of this run (payload "<nonce>/<seq>").
type sink struct {
	nonce string

	mu   sync.Mutex
	all  []delivery
	seen map[int]int
	maxV int64
}

func newSink(nonce string) *sink { return &sink{nonce: nonce, seen: map[int]int{}} }

func (s *sink) receive(p *paho.Publish) {
	now := time.Now()
	n, ok := strings.CutPrefix(string(p.Payload), s.nonce+"/")
	if !ok {
		return
	}
	seq, err := strconv.Atoi(n)
	if err != nil {
		return
	}
	d := delivery{At: now, Seq: seq}
	if p.Properties != nil {
		d.Version, _ = strconv.ParseInt(p.Properties.User.Get(PropLeaseVersion), 10, 64)
		d.Session = p.Properties.User.Get(PropSessionID)
	}
	s.mu.Lock()
	s.all = append(s.all, d)
	s.seen[seq]++
	s.maxV = max(s.maxV, d.Version)
	s.mu.Unlock()
}

// maxVersion is the highest lease version delivered so far.
func (s *sink) maxVersion() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxV
}

// counts is the number of deliveries and of distinct messages.
func (s *sink) counts() (total, unique int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.all), len(s.seen)
}

// firstAbove is the first delivery stamped with a version above v.
func (s *sink) firstAbove(v int64) (delivery, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.all {
		if d.Version > v {
			return d, true
		}
	}
	return delivery{}, false
}

func (s *sink) deliveries() []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]delivery(nil), s.all...)
}
