package embroker

import (
	"log/slog"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// connectionLog writes each client's session start and end to the broker's
// log: in a lab round, which client_id connected when, resumed or not, and
// why it went, is what explains a takeover (mochi itself logs only
// listener errors without the client).
type connectionLog struct {
	mochi.HookBase
	log *slog.Logger
}

func (h *connectionLog) ID() string { return "myriarch-connection-log" }

func (h *connectionLog) Provides(b byte) bool {
	return b == mochi.OnSessionEstablished || b == mochi.OnDisconnect
}

func (h *connectionLog) OnSessionEstablished(cl *mochi.Client, pk packets.Packet) {
	h.log.Info("session established", "client", cl.ID, "remote", cl.Net.Remote, "protocol", cl.Properties.ProtocolVersion,
		"clean_start", pk.Connect.Clean, "username", string(cl.Properties.Username))
}

func (h *connectionLog) OnDisconnect(cl *mochi.Client, err error, expire bool) {
	h.log.Info("client disconnected", "client", cl.ID, "remote", cl.Net.Remote, "error", err, "session_expires", expire)
}
