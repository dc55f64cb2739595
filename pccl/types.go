package pccl

import (
	"fmt"

	"github.com/concord-ccl/concord/rings"
)

// DType is the element type of a collective's buffers.
type DType = rings.DType

// Element types.
const (
	F16  = rings.F16
	BF16 = rings.BF16
	F32  = rings.F32
	F64  = rings.F64
	I8   = rings.I8
	I16  = rings.I16
	I32  = rings.I32
	I64  = rings.I64
	U8   = rings.U8
	U16  = rings.U16
	U32  = rings.U32
	U64  = rings.U64
)

// Op is a reduction.
type Op = rings.Op

// Reductions. Avg divides the sum by the number of peers (integer division for integer types).
const (
	Sum  = rings.Sum
	Avg  = rings.Avg
	Prod = rings.Prod
	Min  = rings.Min
	Max  = rings.Max
)

// Quant selects how a collective's frames are encoded on the wire (see the rings package for the
// error bound).
type Quant = rings.Quant

// Quantizations. MinMaxU8 and MinMaxU16 encode the all-gather only; the Both variants also encode
// every reduce-scatter hop, accumulating in full precision, and support Sum, Avg, Min and Max.
const (
	NoQuant       = rings.NoQuant
	MinMaxU8      = rings.MinMaxU8
	MinMaxU16     = rings.MinMaxU16
	MinMaxU8Both  = rings.MinMaxU8Both
	MinMaxU16Both = rings.MinMaxU16Both
)

// Bytes returns the bytes of a typed slice without copying, to pass as a collective buffer.
func Bytes[T any](s []T) []byte { return rings.Bytes(s) }

// Desc describes one collective. Every peer must pass the same Count, DType, Op and Quant for a Tag.
type Desc struct {
	Tag   uint64 // operations on different tags may run at once
	Count int    // number of elements
	DType DType
	Op    Op
	// Quant encodes the frames on the wire. On a flat ring it applies to every hop; when the
	// AllReduce runs hierarchically (peers announce sites), it applies to the WAN phase only, and the
	// reduce-scatter and all-gather inside each site run at full precision.
	Quant Quant
}

func (d Desc) validate(send, recv []byte) error {
	switch {
	case !d.DType.Valid():
		return fmt.Errorf("%w: dtype %v", ErrInvalid, d.DType)
	case !d.Op.Valid():
		return fmt.Errorf("%w: op %v", ErrInvalid, d.Op)
	case !d.Quant.Valid() || !d.Quant.Supports(d.DType):
		return fmt.Errorf("%w: quantization %v with dtype %v", ErrInvalid, d.Quant, d.DType)
	case !d.Quant.SupportsOp(d.Op):
		return fmt.Errorf("%w: quantization %v with op %v", ErrInvalid, d.Quant, d.Op)
	case d.Count < 0:
		return fmt.Errorf("%w: count %d", ErrInvalid, d.Count)
	case len(send) != d.Count*d.DType.Size():
		return fmt.Errorf("%w: send has %d bytes, %d %v elements need %d", ErrInvalid, len(send), d.Count, d.DType, d.Count*d.DType.Size())
	case len(recv) != len(send):
		return fmt.Errorf("%w: recv has %d bytes, send has %d", ErrInvalid, len(recv), len(send))
	}
	return nil
}
