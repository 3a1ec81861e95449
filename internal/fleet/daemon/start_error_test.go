package daemon

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/pgtest"
)

// A replica that cannot open its listeners after the database is open
// returns the error naming the setting and stops what it had started
// (goleak in TestMain checks the goroutines), instead of crashing in its
// own clean-up: it used to abort through the nil *Daemon of the error
// return.
func TestStartFailsCleanlyWhenAListenerIsTaken(t *testing.T) {
	c := pgtest.New(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, key := range []string{"server.httpListen", "server.opampListen"} {
		t.Run(key, func(t *testing.T) {
			cfg := testConfig(t, c.DSN(""), "a", map[string]string{key: taken.Addr().String()})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			d, err := Start(ctx, Options{Config: cfg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "test"})
			if err == nil {
				_ = d.Shutdown()
				t.Fatalf("Start with %s on a taken port succeeded", key)
			}
			if d != nil {
				t.Errorf("Start returned a replica with its error %v", err)
			}
			if !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), taken.Addr().String()) {
				t.Errorf("error %q does not name %s and the address", err, key)
			}
		})
	}
}
