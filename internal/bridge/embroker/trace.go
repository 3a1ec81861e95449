package embroker

import (
	"log/slog"
	"os"
	"unicode/utf8"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// TraceEnv, set to 1, makes every embedded broker log the life of each
// QoS 1 and 2 message (published, queued to a subscriber with its packet
// id, acknowledged, dropped): what a lab round that lost a message needs
// to tell a broker's loss from a bridge's. Off by default: a lab round
// at 200 msg/s writes about a thousand lines a second with it.
const TraceEnv = "MYRIARCH_EMBROKER_TRACE"

// dropLog writes every message mochi-mqtt gives up on to the broker's
// log, always: mochi counts such drops in its $SYS figures and says
// nothing, and a lost message in a lab round must be explainable from the
// broker's log. With trace set it logs each message's whole life too.
type dropLog struct {
	mochi.HookBase
	log   *slog.Logger
	trace bool
}

func newDropLog(log *slog.Logger) *dropLog {
	return &dropLog{log: log, trace: os.Getenv(TraceEnv) == "1"}
}

func (h *dropLog) ID() string { return "myriarch-drop-log" }

func (h *dropLog) Provides(b byte) bool {
	switch b {
	case mochi.OnPublishDropped, mochi.OnQosDropped, mochi.OnPacketIDExhausted:
		return true
	case mochi.OnPublished, mochi.OnQosPublish, mochi.OnQosComplete:
		return h.trace
	}
	return false
}

// payload is the first bytes of a message's payload, as text: the lab's
// payloads are "<nonce>/<seq>".
func payload(pk packets.Packet) string {
	p := pk.Payload
	if len(p) > 40 {
		p = p[:40]
	}
	if !utf8.Valid(p) {
		return "(binary)"
	}
	return string(p)
}

// OnPublishDropped: mochi could not queue the message for a subscriber
// (its pending writes full) and rolled its in-flight entry back.
func (h *dropLog) OnPublishDropped(cl *mochi.Client, pk packets.Packet) {
	h.log.Warn("message dropped: subscriber's pending writes full", "client", cl.ID, "topic", pk.TopicName, "payload", payload(pk), "qos", pk.FixedHeader.Qos)
}

// OnQosDropped: an in-flight message left a client's session without an
// acknowledgment. At a takeover mochi first copies the old connection's
// in-flight messages to the new one and then clears the old one's, so
// such a drop on a taken-over client is a loss only when the new
// connection never resends that payload (see the trace).
func (h *dropLog) OnQosDropped(cl *mochi.Client, pk packets.Packet) {
	if cl.IsTakenOver() {
		if h.trace {
			h.log.Info("in-flight cleared on the taken-over connection", "client", cl.ID, "remote", cl.Net.Remote, "packet_id", pk.PacketID, "payload", payload(pk))
		}
		return
	}
	h.log.Warn("in-flight message dropped", "client", cl.ID, "remote", cl.Net.Remote, "topic", pk.TopicName, "packet_id", pk.PacketID, "payload", payload(pk))
}

func (h *dropLog) OnPacketIDExhausted(cl *mochi.Client, pk packets.Packet) {
	h.log.Warn("message dropped: packet ids exhausted", "client", cl.ID, "topic", pk.TopicName, "payload", payload(pk))
}

func (h *dropLog) OnPublished(cl *mochi.Client, pk packets.Packet) {
	if pk.FixedHeader.Qos > 0 {
		h.log.Info("trace published", "from", cl.ID, "topic", pk.TopicName, "payload", payload(pk))
	}
}

func (h *dropLog) OnQosPublish(cl *mochi.Client, pk packets.Packet, _ int64, resends int) {
	h.log.Info("trace queued", "client", cl.ID, "remote", cl.Net.Remote, "packet_id", pk.PacketID, "resends", resends, "payload", payload(pk))
}

func (h *dropLog) OnQosComplete(cl *mochi.Client, pk packets.Packet) {
	// pk is the acknowledgment: the payload is the one "queued" with
	// this packet id on this connection last.
	h.log.Info("trace acknowledged", "client", cl.ID, "remote", cl.Net.Remote, "packet_id", pk.PacketID)
}
