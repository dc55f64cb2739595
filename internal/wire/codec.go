package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Version is the protocol version this build speaks. Peers and masters of different versions refuse
// each other at the handshake.
const Version uint16 = 6

// Magic opens every connection.
const Magic = "CNCD"

// HandshakeSize is the size of the handshake in bytes.
const HandshakeSize = 8

// DefaultMaxFrame is the default limit on a control frame's length in bytes.
const DefaultMaxFrame = 16 << 20

// Connection kinds carried in the handshake.
const (
	KindControl uint8 = 1 // peer <-> master
	KindData    uint8 = 2 // peer -> ring neighbour
	KindState   uint8 = 3 // peer -> shared-state donor
	KindBench   uint8 = 4 // peer -> peer bandwidth test
	KindCall    uint8 = 5 // a rendezvous's target -> its asker (wire/rendezvous.go)
	KindRelay   uint8 = 6 // peer -> the master's relay (wire/rendezvous.go)
)

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("wire: malformed message")

// ErrTooLarge is wrapped when a frame's declared length exceeds the reader's limit.
var ErrTooLarge = errors.New("wire: frame too large")

// ErrVersion is wrapped when the handshake carries another protocol version.
var ErrVersion = errors.New("wire: protocol version mismatch")

// Handshake is the first thing sent on every connection.
type Handshake struct {
	Version uint16
	Kind    uint8
}

// AppendHandshake appends the encoded handshake to b.
func AppendHandshake(b []byte, h Handshake) []byte {
	b = append(b, Magic...)
	b = binary.BigEndian.AppendUint16(b, h.Version)
	return append(b, h.Kind, 0)
}

// DecodeHandshake decodes a handshake. It checks the magic, not the version: the caller compares the
// version with its own so that it can say which one it saw.
func DecodeHandshake(b []byte) (Handshake, error) {
	if len(b) != HandshakeSize {
		return Handshake{}, fmt.Errorf("%w: handshake of %d bytes", ErrMalformed, len(b))
	}
	if string(b[:4]) != Magic {
		return Handshake{}, fmt.Errorf("%w: bad magic %q", ErrMalformed, b[:4])
	}
	return Handshake{Version: binary.BigEndian.Uint16(b[4:6]), Kind: b[6]}, nil
}

// Accept is Exchange for a listener that serves several kinds: it answers with the kind the dialer
// asked for if it is among kinds, and returns it.
func Accept(rw io.ReadWriter, kinds ...uint8) (uint8, error) {
	var buf [HandshakeSize]byte
	if _, err := io.ReadFull(rw, buf[:]); err != nil {
		return 0, fmt.Errorf("wire: read handshake: %w", err)
	}
	h, err := DecodeHandshake(buf[:])
	if err != nil {
		return 0, err
	}
	if h.Version != Version {
		return 0, fmt.Errorf("%w: ours %d, theirs %d", ErrVersion, Version, h.Version)
	}
	ok := false
	for _, k := range kinds {
		ok = ok || k == h.Kind
	}
	if !ok {
		return 0, fmt.Errorf("%w: connection kind %d not served here", ErrMalformed, h.Kind)
	}
	if _, err := rw.Write(AppendHandshake(nil, Handshake{Version: Version, Kind: h.Kind})); err != nil {
		return 0, fmt.Errorf("wire: send handshake: %w", err)
	}
	return h.Kind, nil
}

// Exchange writes our handshake and reads the other side's. It returns an error wrapping ErrVersion if
// the versions differ, and an error if the kind is not want.
func Exchange(rw io.ReadWriter, kind uint8) error {
	if _, err := rw.Write(AppendHandshake(nil, Handshake{Version: Version, Kind: kind})); err != nil {
		return fmt.Errorf("wire: send handshake: %w", err)
	}
	var buf [HandshakeSize]byte
	if _, err := io.ReadFull(rw, buf[:]); err != nil {
		return fmt.Errorf("wire: read handshake: %w", err)
	}
	h, err := DecodeHandshake(buf[:])
	if err != nil {
		return err
	}
	if h.Version != Version {
		return fmt.Errorf("%w: ours %d, theirs %d", ErrVersion, Version, h.Version)
	}
	if h.Kind != kind {
		return fmt.Errorf("%w: connection kind %d, want %d", ErrMalformed, h.Kind, kind)
	}
	return nil
}

// AppendFrame appends a control frame holding m to b.
func AppendFrame(b []byte, m Message) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0, byte(m.Type()))
	b = m.Append(b)
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return b
}

// ReadFrame reads one control frame from r and decodes it. max limits the frame length (0 means
// DefaultMaxFrame). buf is scratch space that may be reused; the returned message does not alias it.
func ReadFrame(r io.Reader, max int, buf []byte) (Message, []byte, error) {
	if max <= 0 {
		max = DefaultMaxFrame
	}
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, buf, err
	}
	n := int(binary.BigEndian.Uint32(hdr[:]))
	if n < 1 {
		return nil, buf, fmt.Errorf("%w: empty frame", ErrMalformed)
	}
	if n > max {
		return nil, buf, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, n, max)
	}
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, buf, fmt.Errorf("wire: frame body: %w", err)
	}
	m, err := Decode(Type(buf[0]), buf[1:])
	return m, buf, err
}

// encoder helpers: pure appends.

func appendU64(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }
func appendU32(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }
func appendU16(b []byte, v uint16) []byte { return binary.BigEndian.AppendUint16(b, v) }

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

func appendString(b []byte, s string) []byte {
	b = appendU32(b, uint32(len(s)))
	return append(b, s...)
}

func appendF64(b []byte, v float64) []byte { return appendU64(b, math.Float64bits(v)) }

func appendStrings(b []byte, v []string) []byte {
	b = appendU32(b, uint32(len(v)))
	for _, s := range v {
		b = appendString(b, s)
	}
	return b
}

func appendU64s(b []byte, v []uint64) []byte {
	b = appendU32(b, uint32(len(v)))
	for _, x := range v {
		b = appendU64(b, x)
	}
	return b
}

func appendBytes(b []byte, v []byte) []byte {
	b = appendU32(b, uint32(len(v)))
	return append(b, v...)
}

// decoder reads fields from a payload. The first error sticks; later reads return zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: short or invalid %s", ErrMalformed, what)
	}
}

func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail(what)
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8(what string) uint8 {
	v := d.take(1, what)
	if v == nil {
		return 0
	}
	return v[0]
}

func (d *decoder) u16(what string) uint16 {
	v := d.take(2, what)
	if v == nil {
		return 0
	}
	return binary.BigEndian.Uint16(v)
}

func (d *decoder) u32(what string) uint32 {
	v := d.take(4, what)
	if v == nil {
		return 0
	}
	return binary.BigEndian.Uint32(v)
}

func (d *decoder) u64(what string) uint64 {
	v := d.take(8, what)
	if v == nil {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

func (d *decoder) f64(what string) float64 { return math.Float64frombits(d.u64(what)) }

func (d *decoder) boolean(what string) bool {
	switch d.u8(what) {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail(what)
		return false
	}
}

// maxString bounds any string field; nothing in the protocol needs more.
const maxString = 1 << 16

func (d *decoder) str(what string) string {
	n := d.u32(what)
	if n > maxString {
		d.fail(what)
		return ""
	}
	return string(d.take(int(n), what))
}

// count reads a list length and checks that at least min bytes per item remain, so that a hostile
// count cannot make the decoder allocate more than the frame holds.
func (d *decoder) count(min int, what string) int {
	n := d.u32(what)
	if d.err != nil {
		return 0
	}
	if uint64(n)*uint64(min) > uint64(len(d.b)) {
		d.fail(what)
		return 0
	}
	return int(n)
}

// strs reads a list of strings written by appendStrings, of at most max entries (max < 0: any).
func (d *decoder) strs(max int, what string) []string {
	n := d.count(4, what)
	if max >= 0 && n > max {
		d.fail(what)
		return nil
	}
	var v []string
	for range n {
		v = append(v, d.str(what))
	}
	return v
}

// u64s reads a list of u64s written by appendU64s, of at most max entries (max < 0: any).
func (d *decoder) u64s(max int, what string) []uint64 {
	n := d.count(8, what)
	if max >= 0 && n > max {
		d.fail(what)
		return nil
	}
	var v []uint64
	for range n {
		v = append(v, d.u64(what))
	}
	return v
}

// bytes reads a byte string; its length is bounded by the frame, which the reader already limited.
func (d *decoder) bytes(what string) []byte {
	n := d.u32(what)
	v := d.take(int(n), what)
	if v == nil {
		return nil
	}
	return append([]byte{}, v...)
}

func (d *decoder) code() Code {
	c := Code(d.u8("code"))
	if c > codeMax {
		d.fail("code")
	}
	return c
}

func (d *decoder) finish() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(d.b))
	}
	return d.err
}
