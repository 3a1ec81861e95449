package mqttconn

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// mochi keeps a process-wide helper after Close.
		goleak.IgnoreTopFunction("github.com/mochi-mqtt/server/v2.(*Server).eventLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

// Packets written from several goroutines — in parts under the packet
// lock as paho's codec writes them, or whole with WritePacket — arrive
// whole and, per writer, in order through the coalescing writer.
func TestConcurrentWritesKeepOrder(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const writers, per = 4, 2000
	got := make(chan [writers]uint32, 1)
	go func() {
		s, err := l.Accept()
		if err != nil {
			close(got)
			return
		}
		defer s.Close()
		var last [writers]uint32
		rec := make([]byte, 8)
		for range writers * per {
			if _, err := io.ReadFull(s, rec); err != nil {
				break
			}
			w, n := binary.BigEndian.Uint32(rec), binary.BigEndian.Uint32(rec[4:])
			if w >= writers || n != last[w]+1 {
				t.Errorf("writer %d: record %d after %d", w, n, last[w%writers])
				break
			}
			last[w] = n
		}
		got <- last
	}()
	raw, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := Wrap(raw)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := make([]byte, 8)
			for n := 1; n <= per; n++ {
				binary.BigEndian.PutUint32(rec, uint32(w))
				binary.BigEndian.PutUint32(rec[4:], uint32(n))
				if w%2 == 1 {
					_ = c.WritePacket(rec)
					continue
				}
				// A record is one "packet": its two halves under the
				// packet lock, as paho writes its parts.
				c.Lock()
				_, _ = c.Write(rec[:4])
				_, _ = c.Write(rec[4:])
				c.Unlock()
			}
		}()
	}
	wg.Wait()
	last := <-got
	for w, n := range last {
		if n != per {
			t.Errorf("writer %d: %d of %d records arrived", w, n, per)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
