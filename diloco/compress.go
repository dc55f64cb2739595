package diloco

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ValueBits selects how the values of a compressed outer gradient are encoded.
type ValueBits uint8

// Value encodings.
const (
	// Float32 sends every value in full precision. It is the zero value.
	Float32 ValueBits = iota
	// Int8 sends each value as a signed integer in [-127, 127] times a scale per block of
	// compressBlock values: the block's largest magnitude over 127.
	Int8
	// Int4 sends each value as a signed integer in [-7, 7], two to a byte, times a scale per block
	// of compressBlock values: the block's largest magnitude over 7.
	Int4
)

// String returns the name ParseValueBits accepts.
func (b ValueBits) String() string {
	switch b {
	case Float32:
		return "f32"
	case Int8:
		return "int8"
	case Int4:
		return "int4"
	}
	return fmt.Sprintf("ValueBits(%d)", uint8(b))
}

// ParseValueBits returns the encoding named s: "f32", "int8" or "int4".
func ParseValueBits(s string) (ValueBits, error) {
	for _, b := range []ValueBits{Float32, Int8, Int4} {
		if b.String() == s {
			return b, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown value encoding %q (want f32, int8 or int4)", ErrBadConfig, s)
}

// compressBlock is the number of consecutive sent values that share one scale.
const compressBlock = 64

// Compression configures how a peer encodes its outer gradients. The zero value sends them whole
// in float32, as a plain all-reduce would.
//
// A compressed outer gradient keeps the TopK fraction of its elements of largest magnitude (all
// when TopK is 0), their indices and their values in Values. What a peer leaves out or rounds away
// it keeps in an error-feedback buffer of its own and adds to its next outer gradient of the same
// elements, so nothing is lost, only delayed.
type Compression struct {
	// Values is the encoding of the values sent. Default Float32.
	Values ValueBits
	// TopK is the fraction of the elements sent, in [0, 1]; 0 sends every element (dense, no
	// indices). Default 0.
	TopK float64
}

// Enabled reports whether c encodes anything differently from a plain float32 all-reduce.
func (c Compression) Enabled() bool { return c.Values != Float32 || (c.TopK > 0 && c.TopK < 1) }

// sparse reports whether c sends indices.
func (c Compression) sparse() bool { return c.TopK > 0 && c.TopK < 1 }

// Validate reports the first field of c that is out of range, wrapping ErrBadConfig.
func (c Compression) Validate() error {
	switch {
	case c.Values > Int4:
		return fmt.Errorf("%w: Compression.Values %d is not a known encoding", ErrBadConfig, c.Values)
	case !(c.TopK >= 0 && c.TopK <= 1):
		return fmt.Errorf("%w: Compression.TopK %v must be in [0, 1]", ErrBadConfig, c.TopK)
	}
	return nil
}

// String describes c, for logs and results: "f32", "int4", "int4+top0.01".
func (c Compression) String() string {
	if c.sparse() {
		return fmt.Sprintf("%s+top%g", c.Values, c.TopK)
	}
	return c.Values.String()
}

// Kept returns the number of elements sent of an outer gradient of n elements: all of them, or
// the TopK fraction rounded up (at least one of a non-empty gradient).
func (c Compression) Kept(n int) int {
	if !c.sparse() || n == 0 {
		return n
	}
	return min(n, max(1, int(math.Ceil(c.TopK*float64(n)))))
}

// PayloadBytes returns the size of the encoding of an outer gradient of n elements. Every peer's
// encoding of n elements has this size, whatever the values.
//
// Layout (little endian): the scales, one float32 per block of compressBlock kept values (none
// for Float32); the indices, one uint32 per kept value in increasing order (only with TopK); the
// values, as float32, int8, or int4 pairs (the first of a pair in the low nibble).
func (c Compression) PayloadBytes(n int) int {
	k := c.Kept(n)
	size := 0
	if c.sparse() {
		size += 4 * k
	}
	switch c.Values {
	case Float32:
		size += 4 * k
	case Int8:
		size += 4*blocks(k) + k
	case Int4:
		size += 4*blocks(k) + (k+1)/2
	}
	return size
}

func blocks(k int) int { return (k + compressBlock - 1) / compressBlock }

// ErrMalformedPayload is returned (wrapped) by DecodeAdd for a payload that is not an encoding of
// an outer gradient of the given size: wrong length, indices out of range or not increasing,
// non-finite scales or values.
var ErrMalformedPayload = errors.New("diloco: malformed compressed payload")

// compressor encodes one peer's outer gradients. Its buffers are reused from call to call; it is
// used by one goroutine at a time.
type compressor struct {
	c    Compression
	hist [1 << 16]uint32
	idx  []uint32  // indices kept by the last encode
	vals []float32 // their decoded values
}

// encode writes the encoding of g (len n) to dst, which must hold c.PayloadBytes(n) bytes, and
// remembers which elements it sent and the values the receivers decode for them (sent).
func (z *compressor) encode(dst []byte, g []float32) {
	n := len(g)
	k := z.c.Kept(n)
	if z.c.sparse() {
		z.idx = topK(g, k, z.idx[:0], &z.hist)
	} else {
		z.idx = z.idx[:0]
		for i := range n {
			z.idx = append(z.idx, uint32(i))
		}
	}
	if cap(z.vals) < k {
		z.vals = make([]float32, k)
	}
	z.vals = z.vals[:k]
	for j, i := range z.idx {
		z.vals[j] = g[i]
	}
	off := 0
	var scales []byte
	if z.c.Values != Float32 {
		scales = dst[:4*blocks(k)]
		off = len(scales)
	}
	if z.c.sparse() {
		for j, i := range z.idx {
			binary.LittleEndian.PutUint32(dst[off+4*j:], i)
		}
		off += 4 * k
	}
	out := dst[off:]
	switch z.c.Values {
	case Float32:
		for j, v := range z.vals {
			binary.LittleEndian.PutUint32(out[4*j:], math.Float32bits(v))
		}
	case Int8, Int4:
		levels := float32(127)
		if z.c.Values == Int4 {
			levels = 7
			clear(out[:(k+1)/2])
		}
		for b := 0; b*compressBlock < k; b++ {
			blk := z.vals[b*compressBlock : min(k, (b+1)*compressBlock)]
			scale := blockScale(blk, levels)
			binary.LittleEndian.PutUint32(scales[4*b:], math.Float32bits(scale))
			for j, v := range blk {
				q := quantize(v, scale, levels)
				blk[j] = float32(float32(q) * scale) // what the receivers decode
				at := b*compressBlock + j
				if z.c.Values == Int8 {
					out[at] = byte(q)
				} else {
					out[at/2] |= byte(q&0x0f) << (4 * (at % 2))
				}
			}
		}
	}
}

// blockScale returns the scale of a block of values: its largest finite magnitude over levels, so
// that the largest maps to ±levels; 0 for a block of zeros.
func blockScale(blk []float32, levels float32) float32 {
	var m float32
	for _, v := range blk {
		a := float32(math.Abs(float64(v)))
		if a > m && a <= math.MaxFloat32 {
			m = a
		}
	}
	return m / levels
}

// quantize returns v/scale rounded to the nearest integer (halves away from zero), clamped to
// [-levels, levels]; 0 when scale is 0 or v is NaN.
func quantize(v, scale, levels float32) int8 {
	if scale == 0 || v != v {
		return 0
	}
	q := math.Round(float64(v / scale))
	q = max(-float64(levels), min(float64(levels), q))
	return int8(q)
}

// feedback sets err, the error-feedback buffer of the elements of g, to what the last encode of g
// did not deliver: g minus the decoded values at the sent indices, g elsewhere.
func (z *compressor) feedback(err, g []float32) {
	copy(err, g)
	for j, i := range z.idx {
		err[i] = g[i] - z.vals[j]
	}
}

// DecodeAdd adds the outer gradient of n elements that payload encodes with c into acc (len n),
// element by element in index order. It returns an error wrapping ErrMalformedPayload, with acc
// unchanged, when payload is not such an encoding.
func (c Compression) DecodeAdd(acc []float32, payload []byte) error {
	n := len(acc)
	if len(payload) != c.PayloadBytes(n) {
		return fmt.Errorf("%w: %d bytes, an encoding of %d elements as %v has %d", ErrMalformedPayload, len(payload), n, c, c.PayloadBytes(n))
	}
	k := c.Kept(n)
	off := 0
	var scales []byte
	if c.Values != Float32 {
		scales = payload[:4*blocks(k)]
		off = len(scales)
		for b := range blocks(k) {
			s := math.Float32frombits(binary.LittleEndian.Uint32(scales[4*b:]))
			if !(s >= 0 && s <= math.MaxFloat32) {
				return fmt.Errorf("%w: block %d has scale %v", ErrMalformedPayload, b, s)
			}
		}
	}
	var idx []byte
	if c.sparse() {
		idx = payload[off : off+4*k]
		off += 4 * k
		prev := int64(-1)
		for j := range k {
			i := int64(binary.LittleEndian.Uint32(idx[4*j:]))
			if i <= prev || i >= int64(n) {
				return fmt.Errorf("%w: index %d at position %d (after %d, of %d elements)", ErrMalformedPayload, i, j, prev, n)
			}
			prev = i
		}
	}
	vals := payload[off:]
	value := func(j int) float32 {
		switch c.Values {
		case Int8:
			s := math.Float32frombits(binary.LittleEndian.Uint32(scales[4*(j/compressBlock):]))
			return float32(float32(int8(vals[j])) * s)
		case Int4:
			q := int8(vals[j/2]>>(4*(j%2))) << 4 >> 4 // sign-extend the nibble
			s := math.Float32frombits(binary.LittleEndian.Uint32(scales[4*(j/compressBlock):]))
			return float32(float32(q) * s)
		}
		return math.Float32frombits(binary.LittleEndian.Uint32(vals[4*j:]))
	}
	if c.Values == Float32 {
		for j := range k {
			if v := value(j); !(v >= -math.MaxFloat32 && v <= math.MaxFloat32) {
				return fmt.Errorf("%w: value %d is %v", ErrMalformedPayload, j, v)
			}
		}
	}
	if c.Values == Int8 {
		for j := range k {
			if int8(vals[j]) == -128 {
				return fmt.Errorf("%w: value %d is -128", ErrMalformedPayload, j)
			}
		}
	}
	if c.Values == Int4 {
		for j := range k {
			if vals[j/2]>>(4*(j%2))&0x0f == 0x08 {
				return fmt.Errorf("%w: value %d is -8", ErrMalformedPayload, j)
			}
		}
		if k%2 == 1 && vals[k/2]>>4 != 0 {
			return fmt.Errorf("%w: padding nibble is not zero", ErrMalformedPayload)
		}
	}
	for j := range k {
		i := j
		if idx != nil {
			i = int(binary.LittleEndian.Uint32(idx[4*j:]))
		}
		acc[i] += value(j)
	}
	return nil
}

// topK appends to dst the indices of the k elements of g of largest magnitude, in increasing order,
// and returns it. Among elements of equal magnitude at the cut, the lower indices win, so the
// choice depends on g alone. It reads g three times: a histogram of the upper 16 bits of every
// magnitude's float32 bits (which order like the magnitudes), one of the lower 16 bits of those in
// the bucket of the cut, and the collection.
func topK(g []float32, k int, dst []uint32, hist *[1 << 16]uint32) []uint32 {
	if k <= 0 {
		return dst
	}
	if k >= len(g) {
		for i := range g {
			dst = append(dst, uint32(i))
		}
		return dst
	}
	mag := func(v float32) uint32 { return math.Float32bits(v) & 0x7fffffff }
	clear(hist[:])
	for _, v := range g {
		hist[mag(v)>>16]++
	}
	// The bucket of the cut: the highest hi with at least k magnitudes at or above it.
	above := 0 // magnitudes in buckets above hi
	hi := len(hist) - 1
	for ; hi > 0 && above+int(hist[hi]) < k; hi-- {
		above += int(hist[hi])
	}
	clear(hist[:])
	for _, v := range g {
		if m := mag(v); m>>16 == uint32(hi) {
			hist[m&0xffff]++
		}
	}
	lo := len(hist) - 1
	for ; lo > 0 && above+int(hist[lo]) < k; lo-- {
		above += int(hist[lo])
	}
	cut := uint32(hi)<<16 | uint32(lo)
	ties := k - above // elements equal to the cut to take, lowest indices first
	for i, v := range g {
		m := mag(v)
		if m > cut {
			dst = append(dst, uint32(i))
		} else if m == cut && ties > 0 {
			dst = append(dst, uint32(i))
			ties--
		}
	}
	return dst
}
