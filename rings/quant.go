package rings

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Quant selects how the all-gather phase of AllReduce encodes final values on the wire.
type Quant uint8

// The supported encodings. MinMax encodings apply to F32 and F64 only.
const (
	// NoQuant sends elements at full precision.
	NoQuant Quant = iota
	// MinMaxU8 sends each part as its minimum and step, then one byte per element.
	MinMaxU8
	// MinMaxU16 sends each part as its minimum and step, then two bytes per element.
	MinMaxU16
)

var quantNames = [...]string{NoQuant: "none", MinMaxU8: "minmax-u8", MinMaxU16: "minmax-u16"}

// Valid reports whether q is one of the defined encodings.
func (q Quant) Valid() bool { return q <= MinMaxU16 }

// String returns the short name of q ("none", "minmax-u8", "minmax-u16").
func (q Quant) String() string {
	if !q.Valid() {
		return fmt.Sprintf("quant(%d)", uint8(q))
	}
	return quantNames[q]
}

// ParseQuant returns the Quant whose String is s.
func ParseQuant(s string) (Quant, error) {
	for q := NoQuant; q <= MinMaxU16; q++ {
		if quantNames[q] == s {
			return q, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown quantization %q", ErrInvalid, s)
}

// Supports reports whether q can encode elements of type dt.
func (q Quant) Supports(dt DType) bool {
	return q == NoQuant || (q.Valid() && (dt == F32 || dt == F64))
}

func (q Quant) codeBytes() int { return int(q) } // MinMaxU8: 1, MinMaxU16: 2

func (q Quant) levels() float64 {
	if q == MinMaxU8 {
		return math.MaxUint8
	}
	return math.MaxUint16
}

// QuantizedLen returns the encoded size in bytes of n elements of type dt: for NoQuant n*dt.Size(); for
// the MinMax encodings a header of two dt values (minimum, step) followed by n little-endian codes.
func QuantizedLen(dt DType, q Quant, n int) int {
	if q == NoQuant {
		return n * dt.Size()
	}
	return 2*dt.Size() + n*q.codeBytes()
}

// Quantize encodes the elements in src (type dt, F32 or F64) into dst, which must hold
// QuantizedLen(dt, q, n) bytes. With min and max the smallest and largest element, the step is
// max/L - min/L (L = 255 or 65535, computed in dt's precision) and element x is stored as the code
// round((x-min)/step), to nearest with ties to even, clamped to [0, L]; all codes are 0 when the step
// is 0. Dequantize(Quantize(x)) differs from x by at most about half a step.
//
// It returns an error wrapping ErrNonFinite, and leaves dst in an unspecified state, if an element is
// NaN or infinite, or if the range is so wide (close to twice the largest finite value) that decoding
// would overflow. It panics if q does not support dt or if the lengths do not match.
func Quantize(dt DType, q Quant, dst, src []byte) error {
	n := checkQuantArgs(dt, q, dst, src)
	if q == NoQuant {
		copy(dst, src)
		return nil
	}
	if dt == F32 {
		return quantize(View[float32](src)[:n], q, dst, putF32)
	}
	return quantize(View[float64](src)[:n], q, dst, putF64)
}

// Dequantize decodes src, produced by Quantize with the same dt and q, into dst: element i becomes
// min + code*step, with the product rounded to dt before the addition (no fused multiply-add), so every
// machine decodes the same bytes to the same values. It panics if q does not support dt or if the
// lengths do not match.
func Dequantize(dt DType, q Quant, dst, src []byte) {
	n := checkQuantArgs(dt, q, src, dst)
	if q == NoQuant {
		copy(dst, src)
		return
	}
	if dt == F32 {
		dequantize(View[float32](dst)[:n], q, src, getF32)
		return
	}
	dequantize(View[float64](dst)[:n], q, src, getF64)
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

func putF32(b []byte, v float32) { binary.LittleEndian.PutUint32(b, math.Float32bits(v)) }
func putF64(b []byte, v float64) { binary.LittleEndian.PutUint64(b, math.Float64bits(v)) }
func getF32(b []byte) float32    { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }
func getF64(b []byte) float64    { return math.Float64frombits(binary.LittleEndian.Uint64(b)) }

func quantize[T float](x []T, q Quant, dst []byte, put func([]byte, T)) error {
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
	levels := T(q.levels())
	// Dividing before subtracting keeps the step finite for any finite range; the largest decoded value
	// must be finite too, which rules out ranges close to the whole of the type.
	step := hi/levels - lo/levels
	if top := T(levels*step) + lo; top-top != 0 {
		return fmt.Errorf("%w: range [%v, %v] is too wide to encode", ErrNonFinite, lo, hi)
	}
	size := len(dst) - len(x)*q.codeBytes()
	put(dst, lo)
	put(dst[size/2:], step)
	codes := dst[size:]
	code := func(v T) T {
		if step > 0 {
			return min(T(math.RoundToEven(float64((v-lo)/step))), levels)
		}
		return 0
	}
	if q == MinMaxU8 {
		codes = codes[:len(x)]
		for i, v := range x {
			codes[i] = uint8(code(v))
		}
	} else {
		codes = codes[:2*len(x)]
		for i, v := range x {
			binary.LittleEndian.PutUint16(codes[2*i:], uint16(code(v)))
		}
	}
	return nil
}

func dequantize[T float](x []T, q Quant, src []byte, get func([]byte) T) {
	size := len(src) - len(x)*q.codeBytes()
	lo, step := get(src), get(src[size/2:])
	codes := src[size:]
	if q == MinMaxU8 {
		codes = codes[:len(x)]
		for i, c := range codes {
			x[i] = T(T(c)*step) + lo
		}
		return
	}
	for i := range x {
		x[i] = T(T(binary.LittleEndian.Uint16(codes[2*i:]))*step) + lo
	}
}
