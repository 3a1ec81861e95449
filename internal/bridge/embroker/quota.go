package embroker

import (
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// sendQuotaOff turns off mochi-mqtt v2.7.9's per-client send quota (the
// client's receive maximum) once a session is established, for two bugs
// of that version:
//
//   - Inflight.NextImmediate read-locks the client's in-flight map and then
//     read-locks it again through GetAll. A publish to that client that
//     asks for the write lock in between blocks the second read lock, and
//     the broker deadlocks: the subscriber's read loop, every publisher to
//     it and Close hang. mochi runs NextImmediate after every packet a
//     client sends while its send quota is above zero, so a QoS 1
//     subscriber that acknowledges while messages are published to it hits
//     it under load (seen in this repository's tests under -race).
//   - A subscriber whose receive maximum is used up stops receiving: the
//     quota is not given back as acknowledgements arrive.
//
// With a zero maximum send quota mochi neither holds messages back for
// quota nor calls NextImmediate. Flow control toward a slow client is then
// TCP's and the client's pending-writes limit (MaximumClientWritesPending).
type sendQuotaOff struct{ mochi.HookBase }

func (*sendQuotaOff) ID() string { return "myriarch-send-quota-off" }

func (*sendQuotaOff) Provides(b byte) bool { return b == mochi.OnSessionEstablished }

// OnSessionEstablished runs after the session was set up (quotas included)
// and before mochi reads the client's first packet.
func (*sendQuotaOff) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	cl.State.Inflight.ResetSendQuota(0)
}
