package rings

import (
	"encoding/binary"
	"math"
)

// This file holds a deliberately plain reference for the kernels: one element at a time, raw bits read
// with encoding/binary, floating-point math done in float64 and rounded to the element format by a
// separate rounding routine, integers in 64 bits and truncated.

// loadBits returns the raw bits of element i.
func loadBits(dt DType, b []byte, i int) uint64 {
	switch dt.Size() {
	case 1:
		return uint64(b[i])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b[2*i:]))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b[4*i:]))
	default:
		return binary.LittleEndian.Uint64(b[8*i:])
	}
}

// storeBits writes the low bits of v as element i.
func storeBits(dt DType, b []byte, i int, v uint64) {
	switch dt.Size() {
	case 1:
		b[i] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	default:
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
}

// refDecodeSmall decodes an IEEE-style small float with the given field widths.
func refDecodeSmall(bits uint64, mant, exp uint) float64 {
	sign := 1.0
	if bits>>(mant+exp)&1 == 1 {
		sign = -1
	}
	e := int(bits >> mant & (1<<exp - 1))
	m := float64(bits & (1<<mant - 1))
	bias := 1<<(exp-1) - 1
	switch {
	case e == 1<<exp-1 && m != 0:
		return math.NaN()
	case e == 1<<exp-1:
		return math.Inf(int(sign))
	case e == 0:
		return sign * math.Ldexp(m, 1-bias-int(mant))
	default:
		return sign * math.Ldexp(m+float64(uint64(1)<<mant), e-bias-int(mant))
	}
}

// refEncodeSmall rounds x to the nearest value of a small float format, ties to even. NaN encodes as
// the canonical quiet NaN (callers compare NaNs by class only).
func refEncodeSmall(x float64, mant, exp uint) uint64 {
	expMask := uint64(1)<<exp - 1
	if math.IsNaN(x) {
		return expMask<<mant | 1<<(mant-1)
	}
	var sign uint64
	if math.Signbit(x) {
		sign = 1 << (mant + exp)
		x = -x
	}
	bias := 1<<(exp-1) - 1
	if math.IsInf(x, 0) {
		return sign | expMask<<mant
	}
	if x == 0 {
		return sign
	}
	_, fe := math.Frexp(x)
	e := max(fe-1, 1-bias)
	m := math.RoundToEven(math.Ldexp(x, int(mant)-e))
	if m >= math.Ldexp(1, int(mant)+1) {
		m /= 2
		e++
	}
	if e > bias {
		return sign | expMask<<mant
	}
	mi := uint64(m)
	if mi < 1<<mant {
		return sign | mi
	}
	return sign | uint64(e+bias)<<mant | (mi - 1<<mant)
}

func refToFloat(dt DType, bits uint64) float64 {
	switch dt {
	case F16:
		return refDecodeSmall(bits, 10, 5)
	case BF16:
		return refDecodeSmall(bits, 7, 8)
	case F32:
		return float64(math.Float32frombits(uint32(bits)))
	default:
		return math.Float64frombits(bits)
	}
}

func refFromFloat(dt DType, x float64) uint64 {
	switch dt {
	case F16:
		return refEncodeSmall(x, 10, 5)
	case BF16:
		return refEncodeSmall(x, 7, 8)
	case F32:
		return uint64(math.Float32bits(float32(x)))
	default:
		return math.Float64bits(x)
	}
}

func refIsNaN(dt DType, bits uint64) bool {
	return dt.isFloat() && math.IsNaN(refToFloat(dt, bits))
}

// refSigned sign-extends the raw bits of a signed integer element.
func refSigned(dt DType, bits uint64) int64 {
	shift := 64 - 8*dt.Size()
	return int64(bits<<shift) >> shift
}

func refIsSigned(dt DType) bool { return dt >= I8 && dt <= I64 }

// refCombine returns a op b for raw element bits.
func refCombine(dt DType, op Op, a, b uint64) uint64 {
	if dt.isFloat() {
		x, y := refToFloat(dt, a), refToFloat(dt, b)
		switch op {
		case Sum, Avg:
			return refFromFloat(dt, x+y)
		case Prod:
			return refFromFloat(dt, x*y)
		case Min, Max:
			switch {
			case math.IsNaN(x):
				return a
			case math.IsNaN(y):
				return b
			case op == Min && y < x, op == Max && y > x:
				return b
			}
			return a
		}
	}
	mask := uint64(math.MaxUint64) >> (64 - 8*dt.Size())
	switch op {
	case Sum, Avg:
		return (a + b) & mask
	case Prod:
		return (a * b) & mask
	}
	less := a < b // b wins for Min when b < a, for Max when a < b
	bLess := b < a
	if refIsSigned(dt) {
		less = refSigned(dt, a) < refSigned(dt, b)
		bLess = refSigned(dt, b) < refSigned(dt, a)
	}
	if (op == Min && bLess) || (op == Max && less) {
		return b
	}
	return a
}

// refFinalize returns the last step of op applied to a fully reduced element.
func refFinalize(dt DType, op Op, a uint64, world int) uint64 {
	if op != Avg {
		return a
	}
	if dt.isFloat() {
		return refFromFloat(dt, refToFloat(dt, a)/float64(world))
	}
	mask := uint64(math.MaxUint64) >> (64 - 8*dt.Size())
	if refIsSigned(dt) {
		return uint64(refSigned(dt, a)/int64(world)) & mask
	}
	return a / uint64(world)
}

// refSame reports whether a kernel result matches the reference: equal bits, or, where the reference
// is a NaN produced by arithmetic (whose payload IEEE 754 leaves open), any NaN.
func refSame(dt DType, op Op, got, want uint64) bool {
	if got == want {
		return true
	}
	return op != Min && op != Max && refIsNaN(dt, want) && refIsNaN(dt, got)
}
