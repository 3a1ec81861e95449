package artifacts_test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/fleet/artifacts"
)

// A download that outlasts the server's write timeout but keeps moving
// completes; a client that stops reading is cut off one timeout after its
// last progress; without the wrapper the same slow download is cut (the
// control: the server's timeout is what the wrapper works around).
func TestWriteProgressDeadline(t *testing.T) {
	const size = 24 << 20
	const timeout = 400 * time.Millisecond
	body := bytes.Repeat([]byte("artifact"), size/8)
	blob := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for off := 0; off < len(body); off += 64 << 10 {
			if _, err := w.Write(body[off : off+64<<10]); err != nil {
				return
			}
		}
	})
	serve := func(h http.Handler) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h, WriteTimeout: timeout}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
		return "http://" + ln.Addr().String() + "/"
	}
	// slowRead reads in 1 MiB steps with a pause after each: about 2.4 s
	// in all, six times the server's write timeout.
	slowRead := func(url string, pause time.Duration, stallAfter int) (int, error) {
		resp, err := http.Get(url)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		buf := make([]byte, 1<<20)
		n := 0
		for i := 0; ; i++ {
			if i == stallAfter {
				time.Sleep(8 * timeout)
			}
			m, err := io.ReadFull(resp.Body, buf)
			n += m
			if err == io.EOF || err == io.ErrUnexpectedEOF && n == size {
				return n, nil
			}
			if err != nil {
				return n, err
			}
			time.Sleep(pause)
		}
	}

	wrapped := serve(artifacts.WriteProgressDeadline(blob, timeout))
	if n, err := slowRead(wrapped, 100*time.Millisecond, -1); err != nil || n != size {
		t.Fatalf("a slow but steady download: %d of %d bytes, %v", n, size, err)
	}
	if n, err := slowRead(wrapped, 0, 2); err == nil || n >= size {
		t.Fatalf("a client that stopped reading for 8 timeouts got %d of %d bytes, err %v", n, size, err)
	}
	if n, err := slowRead(serve(blob), 100*time.Millisecond, -1); err == nil || n >= size {
		t.Fatalf("control without the wrapper: %d of %d bytes, err %v (the server's timeout did not cut it)", n, size, err)
	}
}
