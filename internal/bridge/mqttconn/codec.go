package mqttconn

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"unsafe"

	"github.com/eclipse/paho.golang/packets"
)

// The hot path's packets — PUBLISH and the four acknowledgments — are
// encoded and decoded here without paho.golang's intermediate buffers
// (packets.ReadPacket costs about ten allocations per PUBLISH and
// packets.ControlPacket.WriteTo about eight); every other packet goes
// through paho.golang's codec (Parse, and WriteTo on a packets type).

// ReadPacket reads one packet and returns its fixed header's first byte
// (type and flags) and its body. The body of a PUBLISH is newly allocated:
// a message decoded from it (DecodePublish) owns it and may be kept. The
// body of any other packet is a buffer of c that the next ReadPacket
// overwrites. ReadPacket is called from one goroutine only.
func (c *Conn) ReadPacket() (hdr byte, body []byte, err error) {
	if !c.big && c.read >= bufSize && c.r.Buffered() == 0 {
		// A busy connection: the large buffer saves system calls.
		c.r, c.big = bufio.NewReaderSize(c.src, bufSize), true
	}
	hdr, err = c.r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n, shift := 0, 0
	for {
		b, err := c.r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		n |= int(b&0x7f) << shift
		if b < 0x80 {
			break
		}
		if shift += 7; shift > 21 {
			return 0, nil, errors.New("mqtt: malformed remaining length")
		}
	}
	if hdr>>4 == packets.PUBLISH {
		body = make([]byte, n)
	} else {
		if cap(c.scratch) < n {
			c.scratch = make([]byte, n)
		}
		body = c.scratch[:n]
	}
	if _, err := ioReadFull(c, body); err != nil {
		return 0, nil, err
	}
	if !c.big {
		c.read += n
	}
	return hdr, body, nil
}

func ioReadFull(c *Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Parse decodes a packet that ReadPacket returned with paho.golang's
// codec (it copies body, so the result may be kept).
func Parse(hdr byte, body []byte) (*packets.ControlPacket, error) {
	b := make([]byte, 0, len(body)+5)
	b = append(b, hdr)
	b = appendVBI(b, len(body))
	b = append(b, body...)
	return packets.ReadPacket(bytes.NewReader(b))
}

// Publish is a decoded PUBLISH. Topic and Payload point into the packet's
// body (which the Publish owns); Properties is the encoded property block
// including its length prefix, empty when the packet carries none.
type Publish struct {
	Topic      string
	Payload    []byte
	Properties []byte
	PacketID   uint16
	QoS        byte
	Retain     bool
	Duplicate  bool
}

var errShort = errors.New("mqtt: packet shorter than its fields")

// DecodePublish decodes an MQTT 5 PUBLISH from the body ReadPacket
// returned. The topic is a string over the body's bytes, not a copy: the
// body is never written again.
func DecodePublish(hdr byte, body []byte) (Publish, error) {
	p := Publish{QoS: (hdr >> 1) & 3, Retain: hdr&1 != 0, Duplicate: hdr&8 != 0}
	if p.QoS == 3 {
		return p, errors.New("mqtt: PUBLISH with QoS 3")
	}
	if len(body) < 2 {
		return p, errShort
	}
	tl := int(binary.BigEndian.Uint16(body))
	rest := body[2:]
	if len(rest) < tl {
		return p, errShort
	}
	if tl > 0 {
		p.Topic = unsafe.String(&rest[0], tl)
	}
	rest = rest[tl:]
	if p.QoS > 0 {
		if len(rest) < 2 {
			return p, errShort
		}
		p.PacketID = binary.BigEndian.Uint16(rest)
		rest = rest[2:]
	}
	pl, k, err := readVBI(rest)
	if err != nil {
		return p, err
	}
	if len(rest) < k+pl {
		return p, errShort
	}
	if pl > 0 {
		p.Properties = rest[:k+pl]
	}
	p.Payload = rest[k+pl:]
	return p, nil
}

// UnpackProperties decodes a Publish's property block.
func UnpackProperties(block []byte) (*packets.Properties, error) {
	pp := &packets.Properties{}
	if len(block) == 0 {
		return pp, nil
	}
	if err := pp.Unpack(bytes.NewBuffer(block), packets.PUBLISH); err != nil {
		return nil, err
	}
	return pp, nil
}

// DecodeAck decodes the packet identifier and reason code of a PUBACK,
// PUBREC, PUBREL or PUBCOMP body (success when the body has none).
func DecodeAck(body []byte) (id uint16, reason byte, err error) {
	if len(body) < 2 {
		return 0, 0, errShort
	}
	id = binary.BigEndian.Uint16(body)
	if len(body) > 2 {
		reason = body[2]
	}
	return id, reason, nil
}

// AppendPublish appends a PUBLISH packet to dst. props is an encoded
// property block without its length prefix (packets.Properties.Pack).
func AppendPublish(dst []byte, topic string, id uint16, qos byte, retain, dup bool, props, payload []byte) []byte {
	hdr := packets.PUBLISH<<4 | qos<<1
	if retain {
		hdr |= 1
	}
	if dup {
		hdr |= 8
	}
	n := 2 + len(topic) + vbiLen(len(props)) + len(props) + len(payload)
	if qos > 0 {
		n += 2
	}
	dst = append(dst, hdr)
	dst = appendVBI(dst, n)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(topic)))
	dst = append(dst, topic...)
	if qos > 0 {
		dst = binary.BigEndian.AppendUint16(dst, id)
	}
	dst = appendVBI(dst, len(props))
	dst = append(dst, props...)
	return append(dst, payload...)
}

// AppendAck appends a PUBACK, PUBREC, PUBREL or PUBCOMP (typ, one of the
// packets constants) for id with a reason code and no properties; a
// success is sent in its two-byte form.
func AppendAck(dst []byte, typ byte, id uint16, reason byte) []byte {
	hdr := typ << 4
	if typ == packets.PUBREL {
		hdr |= 2 // PUBREL's reserved flags
	}
	if reason == 0 {
		return append(dst, hdr, 2, byte(id>>8), byte(id))
	}
	return append(dst, hdr, 3, byte(id>>8), byte(id), reason)
}

func vbiLen(n int) int {
	switch {
	case n < 128:
		return 1
	case n < 16384:
		return 2
	case n < 2097152:
		return 3
	}
	return 4
}

func appendVBI(dst []byte, n int) []byte {
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		dst = append(dst, d)
		if n == 0 {
			return dst
		}
	}
}

// readVBI decodes a variable byte integer at the start of b and returns
// it and its length.
func readVBI(b []byte) (v, n int, err error) {
	shift := 0
	for i, d := range b {
		v |= int(d&0x7f) << shift
		if d < 0x80 {
			return v, i + 1, nil
		}
		if shift += 7; shift > 21 {
			break
		}
	}
	return 0, 0, errors.New("mqtt: malformed variable byte integer")
}
