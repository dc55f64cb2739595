package rings

import (
	"fmt"
	"unsafe"
)

// DType is the element type of a buffer.
type DType uint8

// The supported element types. Every type is stored little-endian.
const (
	F16  DType = iota + 1 // F16 is IEEE 754 binary16, stored as a uint16.
	BF16                  // BF16 is bfloat16 (the upper half of a float32), stored as a uint16.
	F32                   // F32 is IEEE 754 binary32.
	F64                   // F64 is IEEE 754 binary64.
	I8                    // I8 is a two's complement 8-bit integer.
	I16                   // I16 is a two's complement 16-bit integer.
	I32                   // I32 is a two's complement 32-bit integer.
	I64                   // I64 is a two's complement 64-bit integer.
	U8                    // U8 is an unsigned 8-bit integer.
	U16                   // U16 is an unsigned 16-bit integer.
	U32                   // U32 is an unsigned 32-bit integer.
	U64                   // U64 is an unsigned 64-bit integer.
)

var dtypeInfo = [...]struct {
	name string
	size int
}{
	F16:  {"f16", 2},
	BF16: {"bf16", 2},
	F32:  {"f32", 4},
	F64:  {"f64", 8},
	I8:   {"i8", 1},
	I16:  {"i16", 2},
	I32:  {"i32", 4},
	I64:  {"i64", 8},
	U8:   {"u8", 1},
	U16:  {"u16", 2},
	U32:  {"u32", 4},
	U64:  {"u64", 8},
}

// Valid reports whether d is one of the defined element types.
func (d DType) Valid() bool { return d >= F16 && d <= U64 }

// Size returns the number of bytes of one element, or 0 for an invalid DType.
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeInfo[d].size
}

// String returns the short lower-case name of d ("f16", "bf16", "f32", ..., "u64").
func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
	return dtypeInfo[d].name
}

// ParseDType returns the DType whose String is s.
func ParseDType(s string) (DType, error) {
	for d := F16; d <= U64; d++ {
		if dtypeInfo[d].name == s {
			return d, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown dtype %q", ErrInvalid, s)
}

// isFloat reports whether d is a floating-point type.
func (d DType) isFloat() bool { return d >= F16 && d <= F64 }

// Op is a reduction operation.
type Op uint8

// The supported reductions.
const (
	Sum  Op = iota + 1 // Sum adds the elements.
	Avg                // Avg adds the elements and divides the total by the number of peers.
	Prod               // Prod multiplies the elements.
	Min                // Min keeps the smallest element; NaN wins over numbers.
	Max                // Max keeps the largest element; NaN wins over numbers.
)

var opNames = [...]string{Sum: "sum", Avg: "avg", Prod: "prod", Min: "min", Max: "max"}

// Valid reports whether o is one of the defined operations.
func (o Op) Valid() bool { return o >= Sum && o <= Max }

// String returns the short lower-case name of o ("sum", "avg", "prod", "min", "max").
func (o Op) String() string {
	if !o.Valid() {
		return fmt.Sprintf("op(%d)", uint8(o))
	}
	return opNames[o]
}

// ParseOp returns the Op whose String is s.
func ParseOp(s string) (Op, error) {
	for o := Sum; o <= Max; o++ {
		if opNames[o] == s {
			return o, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown op %q", ErrInvalid, s)
}

// Bytes returns the memory of s as a byte slice, without copying. The result aliases s: writes through
// either are seen by both.
func Bytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(zero)))
}

// View returns the memory of b as a slice of T, without copying. The result aliases b. It panics if
// len(b) is not a multiple of the size of T. b must be aligned for T, as every buffer obtained from make
// or from Bytes is.
func View[T any](b []byte) []T {
	var zero T
	size := int(unsafe.Sizeof(zero))
	if size == 0 || len(b)%size != 0 {
		panic(fmt.Sprintf("rings: View of %d bytes as elements of %d bytes", len(b), size))
	}
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/size)
}
