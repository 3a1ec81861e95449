package config

import (
	"errors"
	"testing"
	"time"
)

// failover names the library's field; myriarchd reports its own key.
func TestKeepaliveRefusalNamesMyriarchdKey(t *testing.T) {
	c := &Config{}
	c.HA.LeaderSessionTimeout = time.Second
	_, err := c.keepalive()
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "ha.leaderSessionTimeout" || fe.Value != "1s" {
		t.Fatalf("keepalive refusal %v, want it named ha.leaderSessionTimeout", err)
	}
	c.HA.LeaderSessionTimeout = 30 * time.Second
	if k, err := c.keepalive(); err != nil || k.T != 30*time.Second || c.Keepalive() != k {
		t.Fatalf("keepalive at 30s: %+v %v", k, err)
	}
}
