package stopbound

import (
	"testing"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/config"
)

func TestStop(t *testing.T) {
	if ReleaseBound != 5*time.Second {
		t.Fatalf("ReleaseBound %v, want the 5s cap of a step-down phase", ReleaseBound)
	}
	for _, c := range []struct {
		in   time.Duration
		want time.Duration
	}{
		{config.DefaultShutdownTimeout, 40 * time.Second},
		{time.Second, 11 * time.Second},
		{1500 * time.Millisecond, 12 * time.Second},
		{2 * time.Minute, 130 * time.Second},
	} {
		got, err := Stop(c.in)
		if err != nil || got != c.want {
			t.Errorf("Stop(%v) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []time.Duration{0, -time.Second, time.Duration(1<<63 - 1)} {
		if _, err := Stop(bad); err == nil {
			t.Errorf("Stop(%v): no error", bad)
		}
	}
}
