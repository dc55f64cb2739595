package rings

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Quant selects how a ring collective encodes its frames on the wire, and in which phases.
//
// The MinMax encodings send each part (one frame) as a header of two values, the part's minimum lo and
// a step s, followed by one code per element: element v travels as the code round((v-lo)/s), to
// nearest with ties to even, and is decoded as lo + code*s. The header values are float32 for F16, BF16
// and F32 elements and float64 for F64 elements; those are also the types the encodings compute in.
//
// MinMaxU8 and MinMaxU16 encode only the all-gather: the reduce-scatter runs at full precision, and
// only the final value of each chunk is encoded, once, by its owner. MinMaxU8Both and MinMaxU16Both
// encode both phases: every reduce-scatter hop quantizes the partial reduction it sends, and the
// receiver decodes it and folds in its own contribution at full precision (in float32 for F16, BF16
// and F32, in float64 for F64) before encoding the next hop; the all-gather is then encoded as with
// MinMaxU8 and MinMaxU16. The both-phase encodings move about a quarter (u8) or half (u16) of the
// bytes of F32 in every frame, at the price of one quantization error per hop (the package documentation states the error
// bound).
type Quant uint8

// The supported encodings. The MinMax encodings apply to F16, BF16, F32 and F64. The both-phase
// encodings support the operations Sum, Avg, Min and Max ([Quant.SupportsOp]).
const (
	// NoQuant sends elements at full precision.
	NoQuant Quant = iota
	// MinMaxU8 encodes the all-gather with one byte per element (255 steps).
	MinMaxU8
	// MinMaxU16 encodes the all-gather with two bytes per element (65535 steps).
	MinMaxU16
	// MinMaxU8Both encodes the reduce-scatter and the all-gather with one byte per element.
	MinMaxU8Both
	// MinMaxU16Both encodes the reduce-scatter and the all-gather with two bytes per element.
	MinMaxU16Both
)

var quantNames = [...]string{
	NoQuant: "none", MinMaxU8: "minmax-u8", MinMaxU16: "minmax-u16",
	MinMaxU8Both: "minmax-u8-both", MinMaxU16Both: "minmax-u16-both",
}

// Valid reports whether q is one of the defined encodings.
func (q Quant) Valid() bool { return q <= MinMaxU16Both }

// String returns the short name of q ("none", "minmax-u8", "minmax-u16", "minmax-u8-both",
// "minmax-u16-both").
func (q Quant) String() string {
	if !q.Valid() {
		return fmt.Sprintf("quant(%d)", uint8(q))
	}
	return quantNames[q]
}

// ParseQuant returns the Quant whose String is s.
func ParseQuant(s string) (Quant, error) {
	for q := NoQuant; q <= MinMaxU16Both; q++ {
		if quantNames[q] == s {
			return q, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown quantization %q", ErrInvalid, s)
}

// Supports reports whether q can encode elements of type dt: NoQuant encodes every type, the MinMax
// encodings the floating-point types F16, BF16, F32 and F64.
func (q Quant) Supports(dt DType) bool {
	return q == NoQuant || (q.Valid() && dt.isFloat())
}

// SupportsOp reports whether a collective that reduces with op can use q. NoQuant and the
// all-gather-only encodings work with every operation, since they encode final values only. The
// both-phase encodings support Sum, Avg, Min and Max, whose results move by at most the size of the
// quantization errors; Prod is rejected (with ErrInvalid), because a product scales a quantization
// error by every later factor, so no absolute bound holds.
func (q Quant) SupportsOp(op Op) bool {
	if !q.BothPhases() {
		return op.Valid()
	}
	return op == Sum || op == Avg || op == Min || op == Max
}

// BothPhases reports whether q encodes the reduce-scatter as well as the all-gather.
func (q Quant) BothPhases() bool { return q == MinMaxU8Both || q == MinMaxU16Both }

// codeBytes returns the size of one code: 1 or 2 bytes, 0 for NoQuant.
func (q Quant) codeBytes() int {
	switch q {
	case MinMaxU8, MinMaxU8Both:
		return 1
	case MinMaxU16, MinMaxU16Both:
		return 2
	}
	return 0
}

// levels returns the top code L: 255 or 65535.
func (q Quant) levels() float64 {
	if q.codeBytes() == 1 {
		return math.MaxUint8
	}
	return math.MaxUint16
}

// accSize returns the size of the type quantization computes in for dt: 8 for F64, else 4 (float32).
func accSize(dt DType) int {
	if dt == F64 {
		return 8
	}
	return 4
}

// QuantizedLen returns the encoded size in bytes of n elements of type dt: for NoQuant n*dt.Size(); for
// the MinMax encodings a header of two values (minimum, step; float32 for F16, BF16 and F32, float64 for
// F64) followed by n little-endian codes of 1 or 2 bytes.
func QuantizedLen(dt DType, q Quant, n int) int {
	if q == NoQuant {
		return n * dt.Size()
	}
	return 2*accSize(dt) + n*q.codeBytes()
}

// Quantize encodes the elements in src (type dt: F16, BF16, F32 or F64) into dst, which must hold
// QuantizedLen(dt, q, n) bytes. The encoding computes in float32 (F16, BF16, F32) or float64 (F64):
// with lo and hi the smallest and largest element, the step is s = (hi-lo)/L (L = 255 or 65535), the
// difference and quotient taken in float64 and rounded once to the computing type; if that rounds to
// zero although hi > lo, s is the smallest positive value of the type. Element v is stored as the code
// round((v-lo)*(1/s)), computed in float64 (the reciprocal rounded once; (v-lo)/s if 1/s overflows),
// rounded to nearest with ties to even and clamped to [0, L];
// every code is 0 when s is 0. Dequantize(Quantize(v)) differs from v by at most s/2 plus rounding (see
// QuantErrorBound).
//
// It returns an error wrapping ErrNonFinite, and leaves dst in an unspecified state, if an element is
// NaN or infinite, or if the range is so wide that a decoded value would overflow (hi-lo beyond about
// the largest finite value of the computing type). It panics if q does not support dt or if the lengths
// do not match. The two q values of each width (all-gather only, both phases) encode identically.
func Quantize(dt DType, q Quant, dst, src []byte) error {
	n := checkQuantArgs(dt, q, dst, src)
	if q == NoQuant {
		copy(dst, src)
		return nil
	}
	var scratch []byte
	if dt.Size() == 2 {
		scratch = make([]byte, 4*n)
	}
	return encodePlain(dt, q, dst, src, scratch)
}

// Dequantize decodes src, produced by Quantize with the same dt and q, into dst: element i becomes
// lo + code*s computed in the computing type, the product rounded before the addition (no fused
// multiply-add), and for F16 and BF16 then rounded to the element type (to nearest, ties to even), so
// every machine decodes the same bytes to the same values. It panics if q does not support dt or if the
// lengths do not match.
func Dequantize(dt DType, q Quant, dst, src []byte) {
	n := checkQuantArgs(dt, q, src, dst)
	if q == NoQuant {
		copy(dst, src)
		return
	}
	switch dt {
	case F16:
		decodeHalf(View[uint16](dst)[:n], q, src, f32ToF16)
	case BF16:
		decodeHalf(View[uint16](dst)[:n], q, src, f32ToBF16)
	case F32:
		decode(View[float32](dst)[:n], q, src)
	default:
		decode(View[float64](dst)[:n], q, src)
	}
}

// checkQuantArgs validates an encoded buffer against a plain one and returns the element count.
func checkQuantArgs(dt DType, q Quant, enc, plain []byte) int {
	if !dt.Valid() || !q.Supports(dt) {
		panic(fmt.Sprintf("rings: quantization %v of %v", q, dt))
	}
	n := len(plain) / dt.Size()
	if len(plain)%dt.Size() != 0 || len(enc) != QuantizedLen(dt, q, n) {
		panic(fmt.Sprintf("rings: %v %v: %d plain bytes and %d encoded bytes", q, dt, len(plain), len(enc)))
	}
	return n
}

// encodePlain encodes plain (elements of dt, q not NoQuant) into enc. For F16 and BF16 the elements
// are first widened into scratch, which holds at least 4 bytes per element.
func encodePlain(dt DType, q Quant, enc, plain, scratch []byte) error {
	switch dt {
	case F32:
		return encode(View[float32](plain), q, enc)
	case F64:
		return encode(View[float64](plain), q, enc)
	}
	acc := View[float32](scratch[:2*len(plain)])
	widen(dt, acc, plain)
	return encode(acc, q, enc)
}

// putHeader and header write and read the (lo, step) header of an encoded part.
func putHeader[T float](b []byte, lo, step T) {
	if isF32[T]() {
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(lo)))
		binary.LittleEndian.PutUint32(b[4:], math.Float32bits(float32(step)))
		return
	}
	binary.LittleEndian.PutUint64(b, math.Float64bits(float64(lo)))
	binary.LittleEndian.PutUint64(b[8:], math.Float64bits(float64(step)))
}

func header[T float](b []byte) (lo, step T) {
	if isF32[T]() {
		return T(math.Float32frombits(binary.LittleEndian.Uint32(b))), T(math.Float32frombits(binary.LittleEndian.Uint32(b[4:])))
	}
	return T(math.Float64frombits(binary.LittleEndian.Uint64(b))), T(math.Float64frombits(binary.LittleEndian.Uint64(b[8:])))
}

// isF32 reports whether T is float32 (rather than float64).
func isF32[T float]() bool {
	var probe T = 1 << 30
	probe++ // exact in float64, rounds away in float32
	return probe == 1<<30
}

// smallestPositive returns the smallest positive (subnormal) value of T.
func smallestPositive[T float]() T {
	if isF32[T]() {
		return T(math.SmallestNonzeroFloat32)
	}
	return T(math.SmallestNonzeroFloat64)
}

// encode quantizes x into enc (header, then codes). See Quantize for the arithmetic.
func encode[T float](x []T, q Quant, enc []byte) error {
	var lo, hi T
	for i, v := range x {
		if v-v != 0 { // NaN or ±Inf
			return fmt.Errorf("%w: element %d is %v", ErrNonFinite, i, v)
		}
		if i == 0 || v < lo {
			lo = v
		}
		if i == 0 || v > hi {
			hi = v
		}
	}
	levels := q.levels()
	step := T((float64(hi) - float64(lo)) / levels)
	if step == 0 && hi > lo {
		step = smallestPositive[T]()
	}
	// The largest decoded value, lo + L*s, must be finite.
	if top := T(T(levels)*step) + lo; top-top != 0 {
		return fmt.Errorf("%w: range [%v, %v] is too wide to encode", ErrNonFinite, lo, hi)
	}
	size := len(enc) - len(x)*q.codeBytes()
	putHeader(enc, lo, step)
	codes := enc[size:]
	if step == 0 {
		clear(codes)
		return nil
	}
	flo, fstep := float64(lo), float64(step)
	inv := 1 / fstep
	if q.codeBytes() == 1 {
		codes = codes[:len(x)]
		for i, v := range x {
			codes[i] = uint8(codeOf(float64(v), flo, inv, fstep, levels))
		}
		return nil
	}
	codes = codes[:2*len(x)]
	for i, v := range x {
		binary.LittleEndian.PutUint16(codes[2*i:], uint16(codeOf(float64(v), flo, inv, fstep, levels)))
	}
	return nil
}

// codeOf returns the code of v: round((v-lo)*inv) clamped to levels, with inv = 1/step; when the step
// is so small (a float64 subnormal) that inv overflows, it divides by step instead.
func codeOf(v, lo, inv, step, levels float64) float64 {
	t := (v - lo) * inv
	if inv > math.MaxFloat64 {
		t = (v - lo) / step
	}
	return min(roundCode(t), levels)
}

// roundCode rounds t, with 0 <= t < 2^51, to the nearest integer, ties to even: adding 2^52 leaves no
// fraction bits, so the addition itself rounds, and the subtraction is exact. Go never reassociates
// floating-point arithmetic, so the two operations stay as written.
func roundCode(t float64) float64 {
	const shift = 1 << 52
	return (t + shift) - shift
}

// decode sets x[i] = T(T(code)*step) + lo. The conversion of the product rounds it before the
// addition, so the compiler cannot fuse the two into a multiply-add.
func decode[T float](x []T, q Quant, src []byte) {
	size := len(src) - len(x)*q.codeBytes()
	lo, step := header[T](src)
	codes := src[size:]
	if q.codeBytes() == 1 {
		codes = codes[:len(x)]
		for i, c := range codes {
			x[i] = T(T(c)*step) + lo
		}
		return
	}
	codes = codes[:2*len(x)]
	for i := range x {
		x[i] = T(T(binary.LittleEndian.Uint16(codes[2*i:]))*step) + lo
	}
}

// decodeHalf decodes into 16-bit floats: in float32, then narrowed.
func decodeHalf(x []uint16, q Quant, src []byte, narrow func(float32) uint16) {
	size := len(src) - len(x)*q.codeBytes()
	lo, step := header[float32](src)
	codes := src[size:]
	if q.codeBytes() == 1 {
		codes = codes[:len(x)]
		for i, c := range codes {
			x[i] = narrow(float32(float32(c)*step) + lo)
		}
		return
	}
	codes = codes[:2*len(x)]
	for i := range x {
		x[i] = narrow(float32(float32(binary.LittleEndian.Uint16(codes[2*i:]))*step) + lo)
	}
}

// decodeFold sets acc[i] = d[i] op acc[i], where d is the decoded src and acc holds the local
// contribution in the computing type: the received value on the left, as Accumulate folds. op is one
// of Sum, Avg, Min and Max; Min and Max keep the received value when the two compare equal and take
// the local one when it is NaN (a decoded value is never NaN).
func decodeFold[T float](acc []T, op Op, q Quant, src []byte) {
	size := len(src) - len(acc)*q.codeBytes()
	lo, step := header[T](src)
	codes := src[size:]
	one := q.codeBytes() == 1
	code := func(i int) T {
		if one {
			return T(codes[i])
		}
		return T(binary.LittleEndian.Uint16(codes[2*i:]))
	}
	switch op {
	case Sum, Avg:
		if one {
			codes := codes[:len(acc)]
			for i, c := range codes {
				d := T(T(c)*step) + lo
				acc[i] = d + acc[i]
			}
			return
		}
		for i := range acc {
			d := T(code(i)*step) + lo
			acc[i] = d + acc[i]
		}
	case Min:
		for i := range acc {
			d := T(code(i)*step) + lo
			if b := acc[i]; !(b < d || b != b) {
				acc[i] = d
			}
		}
	case Max:
		for i := range acc {
			d := T(code(i)*step) + lo
			if b := acc[i]; !(b > d || b != b) {
				acc[i] = d
			}
		}
	default:
		panic(fmt.Sprintf("rings: quantized reduce-scatter with %v", op))
	}
}

// widen sets acc[i] to element i of plain (type dt) in the computing type, exactly.
func widen[T float](dt DType, acc []T, plain []byte) {
	switch dt {
	case F16:
		w := f16Widen()
		for i, h := range View[uint16](plain)[:len(acc)] {
			acc[i] = T(w[h])
		}
	case BF16:
		for i, h := range View[uint16](plain)[:len(acc)] {
			acc[i] = T(bf16ToF32(h))
		}
	case F32:
		for i, v := range View[float32](plain)[:len(acc)] {
			acc[i] = T(v)
		}
	default:
		for i, v := range View[float64](plain)[:len(acc)] {
			acc[i] = T(v)
		}
	}
}

// narrow stores acc (the computing type) into plain as elements of dt, rounding F16 and BF16 to
// nearest with ties to even.
func narrow[T float](dt DType, plain []byte, acc []T) {
	switch dt {
	case F16:
		d := View[uint16](plain)[:len(acc)]
		for i, v := range acc {
			d[i] = f32ToF16(float32(v))
		}
	case BF16:
		d := View[uint16](plain)[:len(acc)]
		for i, v := range acc {
			d[i] = f32ToBF16(float32(v))
		}
	case F32:
		d := View[float32](plain)[:len(acc)]
		for i, v := range acc {
			d[i] = float32(v)
		}
	default:
		d := View[float64](plain)[:len(acc)]
		for i, v := range acc {
			d[i] = float64(v)
		}
	}
}
