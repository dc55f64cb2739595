package diloco

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
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

// compressChunk is the number of consecutive elements among which top-k chooses on its own: each
// chunk sends its TopK fraction, so an index fits in 12 bits (its offset in the chunk) and every
// chunk is represented.
const compressChunk = 4096

// offsetBytes is the size of k packed 12-bit offsets: two to three bytes, an odd last one in two.
func offsetBytes(k int) int { return (3*k + 1) / 2 }

// putOffset writes offset o (below 4096) as the j-th of the packed offsets in b: the j-th pair
// takes bytes 3(j/2) to 3(j/2)+2, the first offset of it in the low 12 bits.
func putOffset(b []byte, j int, o uint16) {
	at := 3 * (j / 2)
	if j%2 == 0 {
		b[at] = byte(o)
		b[at+1] = b[at+1]&0xf0 | byte(o>>8)
	} else {
		b[at+1] = b[at+1]&0x0f | byte(o<<4)
		b[at+2] = byte(o >> 4)
	}
}

// offset reads the j-th packed offset of b.
func offset(b []byte, j int) int {
	at := 3 * (j / 2)
	if j%2 == 0 {
		return int(b[at]) | int(b[at+1]&0x0f)<<8
	}
	return int(b[at+1]>>4) | int(b[at+2])<<4
}

// Compression configures how a peer encodes its outer gradients. The zero value sends them whole
// in float32, as a plain all-reduce would.
//
// A compressed outer gradient keeps, in every chunk of compressChunk elements, the TopK fraction
// of the chunk's elements of largest magnitude (all when TopK is 0): their offsets in the chunk
// and their values in Values. What a peer leaves out or rounds away
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

// Kept returns the number of elements sent of an outer gradient of n elements: all of them, or in
// every chunk the TopK fraction of its elements rounded up (at least one).
func (c Compression) Kept(n int) int {
	if !c.sparse() {
		return n
	}
	k := (n / compressChunk) * c.keptIn(compressChunk)
	if r := n % compressChunk; r > 0 {
		k += c.keptIn(r)
	}
	return k
}

// keptIn returns the number of elements sent of a chunk of m elements.
func (c Compression) keptIn(m int) int {
	if !c.sparse() {
		return m
	}
	return min(m, max(1, int(math.Ceil(c.TopK*float64(m)))))
}

// PayloadBytes returns the size of the encoding of an outer gradient of n elements. Every peer's
// encoding of n elements has this size, whatever the values.
//
// Layout (little endian): the scales, one float32 per block of compressBlock kept values (none
// for Float32); the offsets, 12 bits per kept value packed two to three bytes (putOffset), chunk
// after chunk, increasing within a chunk (only with TopK); the values in the same order, as
// float32, int8, or int4 pairs (the first of a pair in the low nibble).
func (c Compression) PayloadBytes(n int) int {
	k := c.Kept(n)
	size := 0
	if c.sparse() {
		size += offsetBytes(k)
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
	mags []uint32  // scratch of topK
	idx  []uint32  // indices kept by the last encode
	vals []float32 // their decoded values
}

// encode writes the encoding of g (len n) to dst, which must hold c.PayloadBytes(n) bytes, and
// remembers which elements it sent and the values the receivers decode for them (sent).
func (z *compressor) encode(dst []byte, g []float32) {
	n := len(g)
	k := z.c.Kept(n)
	if z.c.sparse() {
		z.idx = z.idx[:0]
		for lo := 0; lo < n; lo += compressChunk {
			chunk := g[lo:min(n, lo+compressChunk)]
			z.idx, z.mags = topK(chunk, z.c.keptIn(len(chunk)), uint32(lo), z.idx, z.mags)
		}
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
		offs := dst[off : off+offsetBytes(k)]
		clear(offs)
		for j, i := range z.idx {
			putOffset(offs, j, uint16(i%compressChunk))
		}
		off += len(offs)
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
	var offs []byte
	if c.sparse() {
		offs = payload[off : off+offsetBytes(k)]
		off += len(offs)
		if k%2 == 1 && offs[len(offs)-1]>>4 != 0 {
			return fmt.Errorf("%w: padding of the offsets is not zero", ErrMalformedPayload)
		}
		j := 0
		for lo := 0; lo < n; lo += compressChunk {
			m := min(compressChunk, n-lo)
			prev := -1
			for range c.keptIn(m) {
				o := offset(offs, j)
				if o <= prev || o >= m {
					return fmt.Errorf("%w: offset %d at position %d in the chunk at %d (after %d, of %d elements)", ErrMalformedPayload, o, j, lo, prev, m)
				}
				prev = o
				j++
			}
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
	if offs == nil {
		for j := range k {
			acc[j] += value(j)
		}
		return nil
	}
	j := 0
	for lo := 0; lo < n; lo += compressChunk {
		for range c.keptIn(min(compressChunk, n-lo)) {
			acc[lo+offset(offs, j)] += value(j)
			j++
		}
	}
	return nil
}

// topK appends to dst base plus the offsets of the k elements of g of largest magnitude, in
// increasing order, and returns it with the scratch mags. Among elements of equal magnitude at the
// cut, the lower offsets win, so the choice depends on g alone. A magnitude's float32 bits order
// like the magnitudes; the cut is found by two histograms of 8 bits of them (the upper 8, then the
// next 8 within the bucket of the cut), and the few elements left in its bucket are sorted.
func topK(g []float32, k int, base uint32, dst []uint32, mags []uint32) ([]uint32, []uint32) {
	if k >= len(g) {
		for i := range g {
			dst = append(dst, base+uint32(i))
		}
		return dst, mags
	}
	if k <= 0 {
		return dst, mags
	}
	var h [256]int
	mags = mags[:0]
	for _, v := range g {
		m := math.Float32bits(v) & 0x7fffffff
		mags = append(mags, m)
		h[m>>23]++
	}
	// bucket returns the bucket of h holding the need-th largest, and how many lie above it.
	bucket := func(need int) (b, above int) {
		for b = len(h) - 1; b > 0 && above+h[b] < need; b-- {
			above += h[b]
		}
		return b, above
	}
	hi, above := bucket(k)
	h = [256]int{}
	for _, m := range mags {
		if int(m>>23) == hi {
			h[m>>15&0xff]++
		}
	}
	mid, above2 := bucket(k - above)
	prefix := uint32(hi<<8 | mid)
	// The elements of the cut's bucket, largest first, lower offsets first among equals.
	type cand struct{ m, i uint32 }
	var cs []cand
	for i, m := range mags {
		if m>>15 == prefix {
			cs = append(cs, cand{m, uint32(i)})
		}
	}
	slices.SortFunc(cs, func(a, b cand) int {
		if a.m != b.m {
			return cmp.Compare(b.m, a.m)
		}
		return cmp.Compare(a.i, b.i)
	})
	last := cs[k-above-above2-1]
	cut := uint64(last.m)<<32 | uint64(^last.i)
	for i, m := range mags {
		if uint64(m)<<32|uint64(^uint32(i)) >= cut {
			dst = append(dst, base+uint32(i))
		}
	}
	return dst, mags
}
