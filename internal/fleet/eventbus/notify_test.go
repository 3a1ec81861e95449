package eventbus_test

import (
	"testing"

	"github.com/myriarch/myriarch/internal/fleet/eventbus"
	"github.com/myriarch/myriarch/internal/fleet/opampserver"
	"github.com/myriarch/myriarch/internal/fleet/store"
)

// TestParse reads back the payload of every kind, and reads a payload
// without a known prefix as a new desired config.
func TestParse(t *testing.T) {
	for _, k := range []eventbus.Kind{eventbus.DesiredConfig, eventbus.Restart, eventbus.Revoke, eventbus.Rotate, eventbus.Packages} {
		e := eventbus.Event{Kind: k, UID: "0190a1b2-uid"}
		if got := eventbus.Parse(e.Payload()); got != e {
			t.Errorf("Parse(%q) = %+v, want %+v", e.Payload(), got, e)
		}
	}
	if got := eventbus.Parse("reboot:x"); got != (eventbus.Event{Kind: eventbus.DesiredConfig, UID: "reboot:x"}) {
		t.Errorf("Parse(reboot:x) = %+v", got)
	}
}

// TestNamesAgree holds the copies of the notification names that other
// packages still declare to eventbus's (until they use it).
func TestNamesAgree(t *testing.T) {
	for name, pair := range map[string][2]string{
		"store.NotifyChannel":              {store.NotifyChannel, eventbus.Channel},
		"store.RestartNotifyPrefix":        {store.RestartNotifyPrefix, string(eventbus.Restart)},
		"store.RevokeNotifyPrefix":         {store.RevokeNotifyPrefix, string(eventbus.Revoke)},
		"store.RotateNotifyPrefix":         {store.RotateNotifyPrefix, string(eventbus.Rotate)},
		"opampserver.PackagesNotifyPrefix": {opampserver.PackagesNotifyPrefix, string(eventbus.Packages)},
	} {
		if pair[0] != pair[1] {
			t.Errorf("%s = %q, eventbus says %q", name, pair[0], pair[1])
		}
	}
}
