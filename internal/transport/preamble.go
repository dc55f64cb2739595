package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The wire format of sessions over byte-stream transports. Every connection of a session starts with a
// fixed-size preamble written by the dialling end:
//
//	magic "CNSS" (4 bytes) | version (1 byte) | body length (1 byte) | session id (16 bytes) | stream index (4 bytes, big-endian)
//
// Stream index 0 is the session's control connection, opened by DialSession. Even indexes from 2 up are
// streams the dialling side opened; odd indexes are streams the accepting side asked the dialling side to
// open for it (dialling is always done by the side that dialled the session, so sessions work through
// NAT). After the preamble, a stream carries the application's bytes only.
//
// The control connection then carries control frames in both directions:
//
//	type (1 byte) | payload length (1 byte) | payload
//
// The accepting side answers the preamble with frameAccept or frameRefuse. Later, frameOpen asks the
// dialling side to open the stream with the given index, and frameOpenFailed reports that it could not.
// Closing the control connection closes the session.
const (
	preambleMagic   = "CNSS"
	preambleVersion = 1
	// preambleBody is the length of the preamble after its fixed header: id and stream index.
	preambleBody = sessionIDSize + 4
	// preambleSize is the length of a whole version-1 preamble.
	preambleSize  = len(preambleMagic) + 2 + preambleBody
	sessionIDSize = 16
)

// Control frame types.
const (
	frameAccept     = 1 // the session is accepted; no payload
	frameRefuse     = 2 // the session is refused (backlog full or listener closing); no payload
	frameOpen       = 3 // open the stream whose index is the payload (4 bytes)
	frameOpenFailed = 4 // the stream whose index is the payload (4 bytes) could not be opened
)

// maxFrameSize is the largest control frame: header and the largest payload.
const maxFrameSize = 2 + 4

// errBadPreamble is wrapped by every error of parsePreamble.
var errBadPreamble = errors.New("bad session preamble")

// errBadFrame is wrapped by every error of parseFrame.
var errBadFrame = errors.New("bad session control frame")

// sessionID identifies a session on every connection that belongs to it.
type sessionID [sessionIDSize]byte

// preamble is the decoded first bytes of a session's connection.
type preamble struct {
	id    sessionID
	index uint32
}

// appendPreamble appends the encoding of p to b.
func appendPreamble(b []byte, p preamble) []byte {
	b = append(b, preambleMagic...)
	b = append(b, preambleVersion, preambleBody)
	b = append(b, p.id[:]...)
	return binary.BigEndian.AppendUint32(b, p.index)
}

// parsePreamble decodes a preamble from b, which must hold exactly preambleSize bytes.
func parsePreamble(b []byte) (preamble, error) {
	if len(b) != preambleSize {
		return preamble{}, fmt.Errorf("%w: %d bytes, want %d", errBadPreamble, len(b), preambleSize)
	}
	if string(b[:4]) != preambleMagic {
		return preamble{}, fmt.Errorf("%w: magic %q", errBadPreamble, b[:4])
	}
	if b[4] != preambleVersion {
		return preamble{}, fmt.Errorf("%w: version %d, want %d", errBadPreamble, b[4], preambleVersion)
	}
	if b[5] != preambleBody {
		return preamble{}, fmt.Errorf("%w: body length %d, want %d", errBadPreamble, b[5], preambleBody)
	}
	var p preamble
	copy(p.id[:], b[6:6+sessionIDSize])
	p.index = binary.BigEndian.Uint32(b[6+sessionIDSize:])
	return p, nil
}

// frame is a decoded control frame.
type frame struct {
	typ   byte
	index uint32 // for frameOpen and frameOpenFailed
}

// appendFrame appends the encoding of f to b.
func appendFrame(b []byte, f frame) []byte {
	switch f.typ {
	case frameOpen, frameOpenFailed:
		b = append(b, f.typ, 4)
		return binary.BigEndian.AppendUint32(b, f.index)
	default:
		return append(b, f.typ, 0)
	}
}

// frameLen returns the payload length announced by a frame header, or an error when the header names
// an unknown type or a length that does not fit the type.
func frameLen(header [2]byte) (int, error) {
	want := 0
	switch header[0] {
	case frameAccept, frameRefuse:
	case frameOpen, frameOpenFailed:
		want = 4
	default:
		return 0, fmt.Errorf("%w: unknown type %d", errBadFrame, header[0])
	}
	if int(header[1]) != want {
		return 0, fmt.Errorf("%w: type %d with %d payload bytes, want %d", errBadFrame, header[0], header[1], want)
	}
	return want, nil
}

// parseFrame decodes one control frame from the start of b. It returns the frame and the number of bytes
// it took, or an error when b holds an invalid or incomplete frame.
func parseFrame(b []byte) (frame, int, error) {
	if len(b) < 2 {
		return frame{}, 0, fmt.Errorf("%w: %d bytes, want a 2-byte header", errBadFrame, len(b))
	}
	n, err := frameLen([2]byte{b[0], b[1]})
	if err != nil {
		return frame{}, 0, err
	}
	if len(b) < 2+n {
		return frame{}, 0, fmt.Errorf("%w: %d payload bytes, want %d", errBadFrame, len(b)-2, n)
	}
	f := frame{typ: b[0]}
	if n == 4 {
		f.index = binary.BigEndian.Uint32(b[2:6])
	}
	return f, 2 + n, nil
}
