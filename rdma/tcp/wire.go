package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/concord-ccl/concord/rdma"
)

// Frames on a connection's socket: a 4-byte big-endian length of what follows, one kind byte, then the
// kind's body. Only a chunk's body has a variable part (its data); every other body has a fixed size.
//
//	hello       version u8, from u32, to u32, fromNIC u16, toNIC u16, class u8, index u32, lane u8
//	helloAck    (empty): the acceptor paired the socket with its Connect
//	chunk       tag u32, seq u64, data
//	ack         tag u32, seq u64: the chunk was read whole into the receiver's memory
//	probe       id u64
//	probeReply  id u64
const (
	kindHello byte = 1 + iota
	kindHelloAck
	kindChunk
	kindAck
	kindProbe
	kindProbeReply
)

// version is the protocol version sent in hello; a peer with another version is refused. Version 2
// has two sockets per connection (the lane in hello).
const version = 2

// Sizes of the fixed parts.
const (
	prefixLen    = 5 // length u32 + kind u8
	helloLen     = 1 + 4 + 4 + 2 + 2 + 1 + 4 + 1
	chunkHeadLen = 4 + 8
	ackLen       = 4 + 8
	idLen        = 8
)

// errFrame reports a malformed frame; the connection that carried it is failed.
var errFrame = errors.New("tcp: malformed frame")

// hello opens every socket: the dialer names itself, the acceptor, the connection it is for and which
// of its two sockets this is (see [lane]).
type hello struct {
	Version uint8
	From    rdma.NodeID
	To      rdma.NodeID
	FromNIC rdma.NICID
	ToNIC   rdma.NICID
	Class   rdma.Class
	Index   uint32
	Lane    uint8
}

// frame is one decoded frame. Which fields mean something depends on Kind.
type frame struct {
	Kind  byte
	Hello hello
	Tag   uint32
	Seq   uint64
	ID    uint64 // probe and probeReply
	Data  []byte // chunk only; aliases the decoded buffer
}

// bodyLen returns the fixed body length of kind, or -1 for an unknown kind. A chunk's is the length of
// its head, before the data.
func bodyLen(kind byte) int {
	switch kind {
	case kindHello:
		return helloLen
	case kindHelloAck:
		return 0
	case kindChunk:
		return chunkHeadLen
	case kindAck:
		return ackLen
	case kindProbe, kindProbeReply:
		return idLen
	}
	return -1
}

// appendPrefix appends the length prefix and kind of a frame whose body is bodyLen bytes long.
func appendPrefix(b []byte, kind byte, bodyLen int) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(1+bodyLen))
	return append(b, kind)
}

// appendHello appends a complete hello frame.
func appendHello(b []byte, h hello) []byte {
	b = appendPrefix(b, kindHello, helloLen)
	b = append(b, h.Version)
	b = binary.BigEndian.AppendUint32(b, uint32(h.From))
	b = binary.BigEndian.AppendUint32(b, uint32(h.To))
	b = binary.BigEndian.AppendUint16(b, uint16(h.FromNIC))
	b = binary.BigEndian.AppendUint16(b, uint16(h.ToNIC))
	b = append(b, byte(h.Class))
	b = binary.BigEndian.AppendUint32(b, h.Index)
	return append(b, h.Lane)
}

// appendChunkHead appends the prefix and head of a chunk frame carrying n bytes of data; the data
// follows separately (the writer sends it from the caller's buffer without a copy).
func appendChunkHead(b []byte, tag uint32, seq uint64, n int) []byte {
	b = appendPrefix(b, kindChunk, chunkHeadLen+n)
	b = binary.BigEndian.AppendUint32(b, tag)
	return binary.BigEndian.AppendUint64(b, seq)
}

// appendAck appends a complete ack frame.
func appendAck(b []byte, tag uint32, seq uint64) []byte {
	b = appendPrefix(b, kindAck, ackLen)
	b = binary.BigEndian.AppendUint32(b, tag)
	return binary.BigEndian.AppendUint64(b, seq)
}

// appendID appends a complete probe or probeReply frame.
func appendID(b []byte, kind byte, id uint64) []byte {
	b = appendPrefix(b, kind, idLen)
	return binary.BigEndian.AppendUint64(b, id)
}

// decodeBody decodes the fixed body of a frame of the given kind into f. body must be exactly
// bodyLen(kind) bytes.
func decodeBody(kind byte, body []byte, f *frame) error {
	n := bodyLen(kind)
	if n < 0 {
		return fmt.Errorf("%w: unknown kind %d", errFrame, kind)
	}
	if len(body) != n {
		return fmt.Errorf("%w: kind %d body of %d bytes, want %d", errFrame, kind, len(body), n)
	}
	f.Kind = kind
	switch kind {
	case kindHello:
		f.Hello = hello{
			Version: body[0],
			From:    rdma.NodeID(binary.BigEndian.Uint32(body[1:])),
			To:      rdma.NodeID(binary.BigEndian.Uint32(body[5:])),
			FromNIC: rdma.NICID(binary.BigEndian.Uint16(body[9:])),
			ToNIC:   rdma.NICID(binary.BigEndian.Uint16(body[11:])),
			Class:   rdma.Class(body[13]),
			Index:   binary.BigEndian.Uint32(body[14:]),
			Lane:    body[18],
		}
	case kindChunk, kindAck:
		f.Tag = binary.BigEndian.Uint32(body)
		f.Seq = binary.BigEndian.Uint64(body[4:])
	case kindProbe, kindProbeReply:
		f.ID = binary.BigEndian.Uint64(body)
	}
	return nil
}

// decodeFrame decodes one whole frame at the start of b and returns it with the number of bytes it
// took. A chunk's data may be at most maxData bytes; its Data aliases b.
func decodeFrame(b []byte, maxData int) (frame, int, error) {
	var f frame
	if len(b) < prefixLen {
		return f, 0, fmt.Errorf("%w: %d bytes, shorter than a prefix", errFrame, len(b))
	}
	size := int64(binary.BigEndian.Uint32(b))
	kind := b[4]
	n := bodyLen(kind)
	if n < 0 {
		return f, 0, fmt.Errorf("%w: unknown kind %d", errFrame, kind)
	}
	body := size - 1
	if body < int64(n) || (kind != kindChunk && body != int64(n)) || body-int64(n) > int64(maxData) {
		return f, 0, fmt.Errorf("%w: kind %d with length %d", errFrame, kind, size)
	}
	if int64(len(b)-prefixLen) < body {
		return f, 0, fmt.Errorf("%w: truncated: %d of %d bytes", errFrame, len(b)-prefixLen, body)
	}
	if err := decodeBody(kind, b[prefixLen:prefixLen+n], &f); err != nil {
		return f, 0, err
	}
	end := prefixLen + int(body)
	if kind == kindChunk {
		f.Data = b[prefixLen+n : end]
	}
	return f, end, nil
}
