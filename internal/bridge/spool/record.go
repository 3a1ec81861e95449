package spool

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/myriarch/myriarch/internal/bridge/sender"
	"github.com/myriarch/myriarch/internal/bridge/transport"
)

// A record on disk is a frame:
//
//	u32 body length | u32 CRC-32C of the body | body
//
// and the body is
//
//	u64 seq | i64 received (Unix ns) | u8 qos | u8 flags (1 retain, 2 properties)
//	uvarint topic length | topic | uvarint payload length | payload
//	[uvarint properties length | properties as JSON]
//
// All integers are big-endian. A frame whose length runs past the end of
// the file, or whose CRC does not match, ends the readable log: on the
// last segment it is a torn tail (a write the crash interrupted) and is
// truncated on open.

const (
	frameHeader = 8
	// MaxRecordBytes bounds one record's body; a longer length is
	// corruption (MQTT's own limit is 256 MiB).
	MaxRecordBytes = 256 << 20

	flagRetain = 1
	flagProps  = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt reports a frame that is not a whole, intact record.
var ErrCorrupt = errors.New("spool: corrupt record")

// Record is one spooled message.
type Record struct {
	Seq uint64
	Msg transport.Message
}

// encodeRecord appends the frame of (seq, m) to dst.
func encodeRecord(dst []byte, seq uint64, m *transport.Message) ([]byte, error) {
	var props []byte
	if m.Properties != nil {
		b, err := json.Marshal(m.Properties)
		if err != nil {
			return dst, err
		}
		props = b
	}
	start := len(dst)
	dst = append(dst, make([]byte, frameHeader)...)
	dst = binary.BigEndian.AppendUint64(dst, seq)
	var recv int64
	if !m.Received.IsZero() {
		recv = m.Received.UnixNano()
	}
	dst = binary.BigEndian.AppendUint64(dst, uint64(recv))
	var flags byte
	if m.Retain {
		flags |= flagRetain
	}
	if props != nil {
		flags |= flagProps
	}
	dst = append(dst, m.QoS, flags)
	dst = binary.AppendUvarint(dst, uint64(len(m.Topic)))
	dst = append(dst, m.Topic...)
	dst = binary.AppendUvarint(dst, uint64(len(m.Payload)))
	dst = append(dst, m.Payload...)
	if props != nil {
		dst = binary.AppendUvarint(dst, uint64(len(props)))
		dst = append(dst, props...)
	}
	body := dst[start+frameHeader:]
	if len(body) > MaxRecordBytes {
		return dst[:start], fmt.Errorf("spool: record of %d bytes is over the %d-byte limit", len(body), MaxRecordBytes)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(len(body)))
	binary.BigEndian.PutUint32(dst[start+4:], crc32.Checksum(body, castagnoli))
	return dst, nil
}

// DecodeFrame decodes the frame at the start of b. It returns the record
// and the frame's length, io.ErrUnexpectedEOF-like errShort when b holds
// only part of a frame, or ErrCorrupt.
func DecodeFrame(b []byte) (Record, int, error) {
	if len(b) < frameHeader {
		return Record{}, 0, errShort
	}
	n := binary.BigEndian.Uint32(b)
	if n == 0 || n > MaxRecordBytes {
		return Record{}, 0, fmt.Errorf("%w: length %d", ErrCorrupt, n)
	}
	if uint64(len(b)) < frameHeader+uint64(n) {
		return Record{}, 0, errShort
	}
	body := b[frameHeader : frameHeader+int(n)]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(b[4:]) {
		return Record{}, 0, fmt.Errorf("%w: CRC mismatch", ErrCorrupt)
	}
	r, err := decodeBody(body)
	if err != nil {
		return Record{}, 0, err
	}
	return r, frameHeader + int(n), nil
}

var errShort = errors.New("spool: short frame")

func decodeBody(b []byte) (Record, error) {
	bad := func(what string) (Record, error) { return Record{}, fmt.Errorf("%w: %s", ErrCorrupt, what) }
	if len(b) < 18 {
		return bad("body too short")
	}
	var r Record
	r.Seq = binary.BigEndian.Uint64(b)
	if ns := int64(binary.BigEndian.Uint64(b[8:])); ns != 0 {
		r.Msg.Received = time.Unix(0, ns)
	}
	r.Msg.QoS, r.Msg.Retain = b[16], b[17]&flagRetain != 0
	if r.Msg.QoS > 2 || b[17]&^(flagRetain|flagProps) != 0 {
		return bad("qos or flags")
	}
	rest := b[18:]
	field := func() ([]byte, bool) {
		l, k := binary.Uvarint(rest)
		if k <= 0 || l > uint64(len(rest)-k) {
			return nil, false
		}
		f := rest[k : k+int(l)]
		rest = rest[k+int(l):]
		return f, true
	}
	t, ok := field()
	if !ok {
		return bad("topic")
	}
	r.Msg.Topic = string(t)
	p, ok := field()
	if !ok {
		return bad("payload")
	}
	r.Msg.Payload = append([]byte(nil), p...)
	if b[17]&flagProps != 0 {
		pj, ok := field()
		if !ok {
			return bad("properties")
		}
		var props sender.Properties
		if err := json.Unmarshal(pj, &props); err != nil {
			return bad("properties: " + err.Error())
		}
		r.Msg.Properties = &props
	}
	if len(rest) != 0 {
		return bad("trailing bytes")
	}
	return r, nil
}
