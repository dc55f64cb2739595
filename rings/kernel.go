package rings

import (
	"fmt"
	"math"
	"sync"

	"github.com/x448/float16"
)

// Accumulate sets dst[i] = dst[i] op src[i] for every element, where dst and src hold elements of type
// dt. For Avg it adds; the divide happens in Finalize.
//
// Semantics, identical on every machine:
//   - f16 and bf16 elements are widened to float32, combined in float32 and rounded back to the nearest
//     representable value, ties to even.
//   - Integer Sum, Avg and Prod wrap around (two's complement), as Go arithmetic does.
//   - Min and Max return one of their two operands unchanged. If either operand is NaN the result is
//     NaN: dst when dst is NaN, otherwise src. When the operands compare equal (including +0 and -0),
//     dst is kept.
//   - Sum, Avg and Prod of floating-point values follow IEEE 754 (a NaN operand gives a NaN result).
//
// Accumulate panics if dt or op is invalid, if the lengths differ, or if the length is not a multiple of
// dt.Size(): these are programming errors. dst and src must not overlap unless they are the same slice.
// Accumulate does not retain either slice.
func Accumulate(dt DType, op Op, dst, src []byte) {
	checkKernelArgs(dt, op, dst)
	if len(src) != len(dst) {
		panic(fmt.Sprintf("rings: Accumulate with %d dst bytes and %d src bytes", len(dst), len(src)))
	}
	switch dt {
	case F16:
		accumulateF16(op, View[uint16](dst), View[uint16](src))
	case BF16:
		accumulateBF16(op, View[uint16](dst), View[uint16](src))
	case F32:
		accumulateFloat(op, View[float32](dst), View[float32](src))
	case F64:
		accumulateFloat(op, View[float64](dst), View[float64](src))
	case I8:
		accumulateInt(op, View[int8](dst), View[int8](src))
	case I16:
		accumulateInt(op, View[int16](dst), View[int16](src))
	case I32:
		accumulateInt(op, View[int32](dst), View[int32](src))
	case I64:
		accumulateInt(op, View[int64](dst), View[int64](src))
	case U8:
		accumulateInt(op, View[uint8](dst), View[uint8](src))
	case U16:
		accumulateInt(op, View[uint16](dst), View[uint16](src))
	case U32:
		accumulateInt(op, View[uint32](dst), View[uint32](src))
	case U64:
		accumulateInt(op, View[uint64](dst), View[uint64](src))
	}
}

// AccumulateInto sets dst[i] = own[i] op in[i] for every element: what copy(dst, own) followed by
// Accumulate(dt, op, dst, in) stores, bit for bit, without the copy where a vector kernel covers the
// elements (float32 and float64 Sum and Avg). own and in are left as they are; dst must overlap
// neither. It panics as Accumulate does, or if the three lengths differ.
func AccumulateInto(dt DType, op Op, dst, own, in []byte) {
	checkKernelArgs(dt, op, dst)
	if len(own) != len(dst) || len(in) != len(dst) {
		panic(fmt.Sprintf("rings: AccumulateInto with %d dst bytes, %d own bytes and %d in bytes", len(dst), len(own), len(in)))
	}
	done := 0
	if op == Sum || op == Avg {
		switch dt {
		case F32:
			done = 4 * addF32ToVec(View[float32](dst), View[float32](own), View[float32](in))
		case F64:
			done = 8 * addF64ToVec(View[float64](dst), View[float64](own), View[float64](in))
		}
	}
	// The rest as Accumulate's own scalar tail takes it.
	copy(dst[done:], own[done:])
	Accumulate(dt, op, dst[done:], in[done:])
}

// accumulateOnto sets dst[i] = src[i] op dst[i], the value Accumulate stores in src, with src
// left as it is. It reports false, doing nothing, for the element types and ops it does not cover
// (those whose result depends on the operand order beyond a NaN's payload: Min and Max of
// floating-point types; Prod of floating-point types and the 16-bit float formats, left to
// Accumulate for simplicity). Integer ops commute exactly, and a floating-point sum is computed with
// src as the first operand, as Accumulate's is.
func accumulateOnto(dt DType, op Op, dst, src []byte) bool {
	checkKernelArgs(dt, op, dst)
	if len(src) != len(dst) {
		panic(fmt.Sprintf("rings: accumulateOnto with %d dst bytes and %d src bytes", len(dst), len(src)))
	}
	switch dt {
	case F32, F64:
		if op != Sum && op != Avg {
			return false
		}
		if dt == F32 {
			addFloatOnto(View[float32](dst), View[float32](src))
		} else {
			addFloatOnto(View[float64](dst), View[float64](src))
		}
		return true
	case F16, BF16:
		return false
	}
	// Integer Sum, Prod (both wrap around) and Min, Max (equal values are the same bits) commute.
	Accumulate(dt, op, dst, src)
	return true
}

// accumulateOntoSaving is accumulateOnto that first copies dst's original bytes into save (as long
// as dst). Where a vector kernel covers the elements it does both in one pass, reading dst once. It
// reports false, having done nothing, where accumulateOnto would.
func accumulateOntoSaving(dt DType, op Op, dst, src, save []byte) bool {
	if len(save) != len(dst) {
		panic(fmt.Sprintf("rings: accumulateOntoSaving with %d dst bytes and %d save bytes", len(dst), len(save)))
	}
	switch dt {
	case F32, F64:
		checkKernelArgs(dt, op, dst)
		if len(src) != len(dst) {
			panic(fmt.Sprintf("rings: accumulateOntoSaving with %d dst bytes and %d src bytes", len(dst), len(src)))
		}
		if op != Sum && op != Avg {
			return false
		}
		if dt == F32 {
			addFloatOntoSaving(View[float32](dst), View[float32](src), View[float32](save))
		} else {
			addFloatOntoSaving(View[float64](dst), View[float64](src), View[float64](save))
		}
		return true
	case F16, BF16:
		return false
	}
	copy(save, dst)
	return accumulateOnto(dt, op, dst, src)
}

// Finalize applies the last step of op to buf, a fully reduced buffer of elements of type dt. For Avg it
// divides every element by world: floating-point types divide in their own precision (f16 and bf16 in
// float32, then round to nearest even); integer types use Go integer division, which truncates toward
// zero. For every other op it does nothing.
//
// Finalize panics if dt or op is invalid, if len(buf) is not a multiple of dt.Size(), or if op is Avg
// and world < 1.
func Finalize(dt DType, op Op, buf []byte, world int) {
	checkKernelArgs(dt, op, buf)
	if op != Avg {
		return
	}
	if world < 1 {
		panic(fmt.Sprintf("rings: Finalize with world %d", world))
	}
	switch dt {
	case F16:
		divHalf(View[uint16](buf), world, f16ToF32, f32ToF16)
	case BF16:
		divHalf(View[uint16](buf), world, bf16ToF32, f32ToBF16)
	case F32:
		divFloat(View[float32](buf), world)
	case F64:
		divFloat(View[float64](buf), world)
	case I8:
		divSigned(View[int8](buf), world)
	case I16:
		divSigned(View[int16](buf), world)
	case I32:
		divSigned(View[int32](buf), world)
	case I64:
		divSigned(View[int64](buf), world)
	case U8:
		divUnsigned(View[uint8](buf), world)
	case U16:
		divUnsigned(View[uint16](buf), world)
	case U32:
		divUnsigned(View[uint32](buf), world)
	case U64:
		divUnsigned(View[uint64](buf), world)
	}
}

func checkKernelArgs(dt DType, op Op, buf []byte) {
	if !dt.Valid() || !op.Valid() {
		panic(fmt.Sprintf("rings: kernel called with dtype %v and op %v", dt, op))
	}
	if len(buf)%dt.Size() != 0 {
		panic(fmt.Sprintf("rings: %d bytes is not a whole number of %v elements", len(buf), dt))
	}
}

// f16ToF32 widens an IEEE binary16 value, exactly.
func f16ToF32(h uint16) float32 { return float16.Frombits(h).Float32() }

// f16Widen returns a table of every binary16 value widened to float32 (256 KiB, built on first use). A
// table lookup is several times faster than the bit manipulation in the hot loop.
var f16Widen = sync.OnceValue(func() *[1 << 16]float32 {
	t := new([1 << 16]float32)
	for i := range t {
		t[i] = f16ToF32(uint16(i))
	}
	return t
})

// f32ToF16 rounds a float32 to binary16, to nearest, ties to even.
func f32ToF16(f float32) uint16 { return float16.Fromfloat32(f).Bits() }

// bf16ToF32 widens a bfloat16 value, exactly: bfloat16 is the upper half of a float32.
func bf16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// f32ToBF16 rounds a float32 to bfloat16, to nearest, ties to even. A NaN stays a NaN (made quiet) with
// its sign and upper payload bits.
func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x0040
	}
	// Adding 0x7fff plus the lowest kept bit rounds to nearest with ties to even; a carry into the
	// exponent is the correct rounding up to the next binade or to infinity.
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

type float interface{ ~float32 | ~float64 }

type integer interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64
}

func accumulateFloat[T float](op Op, d, s []T) {
	switch op {
	case Sum, Avg:
		addFloat(d, s)
	case Prod:
		mulSlice(d, s)
	case Min:
		s = s[:len(d)]
		for i, b := range s {
			if a := d[i]; b < a || (b != b && a == a) {
				d[i] = b
			}
		}
	case Max:
		s = s[:len(d)]
		for i, b := range s {
			if a := d[i]; b > a || (b != b && a == a) {
				d[i] = b
			}
		}
	}
}

func accumulateInt[T integer](op Op, d, s []T) {
	switch op {
	case Sum, Avg:
		addSlice(d, s)
	case Prod:
		mulSlice(d, s)
	case Min:
		s = s[:len(d)]
		for i, b := range s {
			if b < d[i] {
				d[i] = b
			}
		}
	case Max:
		s = s[:len(d)]
		for i, b := range s {
			if b > d[i] {
				d[i] = b
			}
		}
	}
}

// addSlice is the hot loop of Sum and Avg: d[i] += s[i], unrolled by eight. Re-slicing s to the length of
// d and taking fixed-size windows lets the compiler drop the bounds checks inside the unrolled body.
func addSlice[T integer | float](d, s []T) {
	s = s[:len(d)]
	i := 0
	for ; len(d)-i >= 8; i += 8 {
		dd := d[i : i+8 : i+8]
		ss := s[i : i+8 : i+8]
		dd[0] += ss[0]
		dd[1] += ss[1]
		dd[2] += ss[2]
		dd[3] += ss[3]
		dd[4] += ss[4]
		dd[5] += ss[5]
		dd[6] += ss[6]
		dd[7] += ss[7]
	}
	for ; i < len(d); i++ {
		d[i] += s[i]
	}
}

// addFloat is addSlice for floating-point elements: a vector kernel takes what it can where the
// machine has one, and addSlice the rest. Both perform the same addition per element.
func addFloat[T float](d, s []T) {
	s = s[:len(d)]
	done := 0
	switch dd := any(d).(type) {
	case []float32:
		done = addF32Vec(dd, any(s).([]float32))
	case []float64:
		done = addF64Vec(dd, any(s).([]float64))
	}
	addSlice(d[done:], s[done:])
}

// addFloatOnto sets d[i] = s[i] + d[i]: addFloat with the operands' roles swapped, s the first.
func addFloatOnto[T float](d, s []T) {
	s = s[:len(d)]
	done := 0
	switch dd := any(d).(type) {
	case []float32:
		done = addF32OntoVec(dd, any(s).([]float32))
	case []float64:
		done = addF64OntoVec(dd, any(s).([]float64))
	}
	d, s = d[done:], s[done:]
	for i, b := range s {
		d[i] = b + d[i]
	}
}

// addFloatOntoSaving sets save[i] = d[i], then d[i] = s[i] + d[i]: addFloatOnto keeping d's original.
func addFloatOntoSaving[T float](d, s, save []T) {
	s, save = s[:len(d)], save[:len(d)]
	done := 0
	switch dd := any(d).(type) {
	case []float32:
		done = addF32OntoSaveVec(dd, any(s).([]float32), any(save).([]float32))
	case []float64:
		done = addF64OntoSaveVec(dd, any(s).([]float64), any(save).([]float64))
	}
	d, s, save = d[done:], s[done:], save[done:]
	for i, b := range s {
		save[i] = d[i]
		d[i] = b + d[i]
	}
}

func mulSlice[T integer | float](d, s []T) {
	s = s[:len(d)]
	for i, b := range s {
		d[i] *= b
	}
}

// accumulateF16 and accumulateBF16 are the same loops over the two 16-bit float formats. They are
// written out per format, rather than taking the conversions as function values, so that the
// conversions are called directly (and inlined where the compiler can) in the hot loop.

func accumulateF16(op Op, d, s []uint16) {
	s = s[:len(d)]
	w := f16Widen()
	switch op {
	case Sum, Avg:
		for i, h := range s {
			d[i] = f32ToF16(w[d[i]] + w[h])
		}
	case Prod:
		for i, h := range s {
			d[i] = f32ToF16(w[d[i]] * w[h])
		}
	case Min:
		for i, h := range s {
			if a, b := w[d[i]], w[h]; b < a || (b != b && a == a) {
				d[i] = h
			}
		}
	case Max:
		for i, h := range s {
			if a, b := w[d[i]], w[h]; b > a || (b != b && a == a) {
				d[i] = h
			}
		}
	}
}

func accumulateBF16(op Op, d, s []uint16) {
	s = s[:len(d)]
	switch op {
	case Sum, Avg:
		for i, h := range s {
			d[i] = f32ToBF16(bf16ToF32(d[i]) + bf16ToF32(h))
		}
	case Prod:
		for i, h := range s {
			d[i] = f32ToBF16(bf16ToF32(d[i]) * bf16ToF32(h))
		}
	case Min:
		for i, h := range s {
			if a, b := bf16ToF32(d[i]), bf16ToF32(h); b < a || (b != b && a == a) {
				d[i] = h
			}
		}
	case Max:
		for i, h := range s {
			if a, b := bf16ToF32(d[i]), bf16ToF32(h); b > a || (b != b && a == a) {
				d[i] = h
			}
		}
	}
}

func divHalf(d []uint16, world int, widen func(uint16) float32, narrow func(float32) uint16) {
	w := float32(world)
	for i, h := range d {
		d[i] = narrow(widen(h) / w)
	}
}

func divFloat[T float](d []T, world int) {
	w := T(world)
	for i := range d {
		d[i] /= w
	}
}

func divSigned[T ~int8 | ~int16 | ~int32 | ~int64](d []T, world int) {
	w := int64(world)
	for i, v := range d {
		d[i] = T(int64(v) / w)
	}
}

func divUnsigned[T ~uint8 | ~uint16 | ~uint32 | ~uint64](d []T, world int) {
	w := uint64(world)
	for i, v := range d {
		d[i] = T(uint64(v) / w)
	}
}
