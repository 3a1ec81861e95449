package mqttconn

import (
	"bytes"
	"net"
	"testing"

	"github.com/eclipse/paho.golang/packets"
)

// pipe returns a Conn reading what the returned net.Conn writes.
func pipe(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	a, b := net.Pipe()
	c := Wrap(a)
	t.Cleanup(func() { _ = c.Close(); _ = b.Close() })
	return c, b
}

// What AppendPublish encodes, paho.golang's decoder reads back, and a
// PUBLISH that paho.golang encodes (with properties) DecodePublish reads
// back: the two codecs agree on the wire format.
func TestPublishRoundTrip(t *testing.T) {
	expiry := uint32(60)
	props := &packets.Properties{ContentType: "text/plain", MessageExpiry: &expiry, User: []packets.User{{Key: "k", Value: "v"}}}
	for _, qos := range []byte{0, 1, 2} {
		payload := bytes.Repeat([]byte{0xab}, 300) // a two-byte remaining length
		b := AppendPublish(nil, "a/b", 7, qos, true, qos > 0, props.Pack(packets.PUBLISH), payload)
		cp, err := packets.ReadPacket(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		p := cp.Content.(*packets.Publish)
		wantID := uint16(7)
		if qos == 0 {
			wantID = 0
		}
		if p.Topic != "a/b" || p.QoS != qos || !p.Retain || p.Duplicate != (qos > 0) || p.PacketID != wantID || !bytes.Equal(p.Payload, payload) {
			t.Fatalf("QoS %d: paho decoded %+v", qos, p)
		}
		if p.Properties.ContentType != "text/plain" || *p.Properties.MessageExpiry != 60 || len(p.Properties.User) != 1 {
			t.Fatalf("QoS %d: properties %+v", qos, p.Properties)
		}

		var enc bytes.Buffer
		if _, err := p.WriteTo(&enc); err != nil {
			t.Fatal(err)
		}
		c, w := pipe(t)
		go func() { _, _ = w.Write(enc.Bytes()) }()
		hdr, body, err := c.ReadPacket()
		if err != nil {
			t.Fatal(err)
		}
		d, err := DecodePublish(hdr, body)
		if err != nil {
			t.Fatal(err)
		}
		if d.Topic != "a/b" || d.QoS != qos || !d.Retain || d.PacketID != wantID || !bytes.Equal(d.Payload, payload) {
			t.Fatalf("QoS %d: decoded %+v", qos, d)
		}
		pp, err := UnpackProperties(d.Properties)
		if err != nil {
			t.Fatal(err)
		}
		if pp.ContentType != "text/plain" || *pp.MessageExpiry != 60 || len(pp.User) != 1 || pp.User[0].Value != "v" {
			t.Fatalf("QoS %d: properties %+v", qos, pp)
		}
	}
}

func TestAcksRoundTrip(t *testing.T) {
	for _, c := range []struct {
		typ    byte
		reason byte
	}{{packets.PUBACK, 0}, {packets.PUBACK, 0x87}, {packets.PUBREC, 0}, {packets.PUBREL, 0}, {packets.PUBCOMP, 0x92}} {
		b := AppendAck(nil, c.typ, 513, c.reason)
		cp, err := packets.ReadPacket(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("type %d: %v", c.typ, err)
		}
		if cp.Type != c.typ || cp.PacketID() != 513 {
			t.Fatalf("type %d: paho read %v", c.typ, cp)
		}
		if c.typ == packets.PUBREL && cp.Flags != 2 {
			t.Fatalf("PUBREL flags %d", cp.Flags)
		}
		id, reason, err := DecodeAck(b[2:])
		if err != nil || id != 513 || reason != c.reason {
			t.Fatalf("type %d: DecodeAck = %d %#x %v", c.typ, id, reason, err)
		}
	}
}

// Malformed input is an error, not a panic or a misread.
func TestDecodeMalformed(t *testing.T) {
	for name, body := range map[string][]byte{
		"empty":            {},
		"topic too long":   {0, 9, 'a'},
		"no packet id":     {0, 1, 'a', 0},
		"properties short": {0, 1, 'a', 0, 1, 5},
		"bad vbi":          {0, 1, 'a', 0, 1, 0xff, 0xff, 0xff, 0xff, 0x7f},
	} {
		if _, err := DecodePublish(packets.PUBLISH<<4|2, body); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := DecodePublish(packets.PUBLISH<<4|6, []byte{0, 1, 'a', 0, 1, 0}); err == nil {
		t.Error("QoS 3: no error")
	}
	if _, _, err := DecodeAck([]byte{1}); err == nil {
		t.Error("short ack: no error")
	}
	c, w := pipe(t)
	go func() { _, _ = w.Write([]byte{packets.PINGRESP << 4, 0xff, 0xff, 0xff, 0xff, 0x7f}) }()
	if _, _, err := c.ReadPacket(); err == nil {
		t.Error("five-byte remaining length: no error")
	}
}

// BenchmarkCodec is the hot path's encoding and decoding per message: a
// PUBLISH encoded and decoded, and its PUBACK encoded and decoded, here
// ("own": none of it allocates; ReadPacket's one allocation per PUBLISH
// is the message's body) and with paho.golang's codec, which the bridge
// used before ("paho").
func BenchmarkCodec(b *testing.B) {
	payload := make([]byte, 256)
	b.Run("own", func(b *testing.B) {
		var buf, ack []byte
		b.ReportAllocs()
		for b.Loop() {
			buf = AppendPublish(buf[:0], "plant/1/telemetry", 7, 1, false, false, nil, payload)
			p, err := DecodePublish(buf[0], buf[3:])
			if err != nil || p.PacketID != 7 {
				b.Fatal(p, err)
			}
			ack = AppendAck(ack[:0], packets.PUBACK, p.PacketID, 0)
			if id, _, err := DecodeAck(ack[2:]); err != nil || id != 7 {
				b.Fatal(id, err)
			}
		}
	})
	b.Run("paho", func(b *testing.B) {
		var buf, ack bytes.Buffer
		b.ReportAllocs()
		for b.Loop() {
			buf.Reset()
			if _, err := (&packets.Publish{Topic: "plant/1/telemetry", QoS: 1, PacketID: 7, Payload: payload, Properties: &packets.Properties{}}).WriteTo(&buf); err != nil {
				b.Fatal(err)
			}
			cp, err := packets.ReadPacket(&buf)
			if err != nil || cp.PacketID() != 7 {
				b.Fatal(cp, err)
			}
			ack.Reset()
			if _, err := (&packets.Puback{PacketID: 7, Properties: &packets.Properties{}}).WriteTo(&ack); err != nil {
				b.Fatal(err)
			}
			if cp, err := packets.ReadPacket(&ack); err != nil || cp.PacketID() != 7 {
				b.Fatal(cp, err)
			}
		}
	})
}

// A connection starts with a small read buffer and no write buffer, takes
// the large read buffer once it has read bufSize bytes, and reads every
// packet intact across the switch (including packets that straddle it).
func TestReadBufferGrowsWithUse(t *testing.T) {
	c, w := pipe(t)
	if c.r.Size() != smallBufSize || cap(c.buf) != 0 || cap(c.spare) != 0 {
		t.Fatalf("a new connection: read buffer %d, write buffers %d and %d; want %d, 0, 0", c.r.Size(), cap(c.buf), cap(c.spare), smallBufSize)
	}
	const n = 600 // 600 × ~300 bytes: well past bufSize
	go func() {
		var all []byte
		for i := range n {
			all = AppendPublish(all, "a/b", uint16(i+1), 1, false, false, nil, bytes.Repeat([]byte{byte(i)}, 290))
		}
		// Writes of odd sizes, so that packets straddle reads.
		for len(all) > 0 {
			k := min(len(all), 777)
			if _, err := w.Write(all[:k]); err != nil {
				return
			}
			all = all[k:]
		}
	}()
	for i := range n {
		hdr, body, err := c.ReadPacket()
		if err != nil {
			t.Fatal(err)
		}
		d, err := DecodePublish(hdr, body)
		if err != nil {
			t.Fatal(err)
		}
		if d.PacketID != uint16(i+1) || len(d.Payload) != 290 || d.Payload[0] != byte(i) || d.Payload[289] != byte(i) {
			t.Fatalf("packet %d: id %d, payload %d bytes starting %d", i, d.PacketID, len(d.Payload), d.Payload[0])
		}
	}
	if !c.big || c.r.Size() != bufSize {
		t.Fatalf("after %d packets: read buffer %d (big %t), want %d", n, c.r.Size(), c.big, bufSize)
	}
}
