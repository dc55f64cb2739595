package main

/*
#include "impl.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"github.com/concord-ccl/concord/pccl"
)

// addrString returns a as "host:port".
func addrString(a *C.ccoip_socket_address_t) (string, error) {
	var ip netip.Addr
	switch a.inet.protocol {
	case C.inetIPv4:
		var b [4]byte
		for i := range b {
			b[i] = byte(a.inet.ipv4.data[i])
		}
		ip = netip.AddrFrom4(b)
	case C.inetIPv6:
		var b [16]byte
		for i := range b {
			b[i] = byte(a.inet.ipv6.data[i])
		}
		ip = netip.AddrFrom16(b)
	default:
		return "", fmt.Errorf("%w: address protocol %d", pccl.ErrInvalid, a.inet.protocol)
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(int(a.port))), nil
}

// dtypes maps PCCL's element types to Concord's.
var dtypes = map[C.pcclDataType_t]pccl.DType{
	C.pcclUint8: pccl.U8, C.pcclInt8: pccl.I8, C.pcclInt16: pccl.I16, C.pcclUint16: pccl.U16,
	C.pcclUint32: pccl.U32, C.pcclInt32: pccl.I32, C.pcclUint64: pccl.U64, C.pcclInt64: pccl.I64,
	C.pcclFloat16: pccl.F16, C.pcclBFloat16: pccl.BF16, C.pcclFloat: pccl.F32, C.pcclDouble: pccl.F64,
}

// ops maps PCCL's reductions to Concord's.
var ops = map[C.pcclRedOp_t]pccl.Op{
	C.pcclSum: pccl.Sum, C.pcclAvg: pccl.Avg, C.pcclProd: pccl.Prod, C.pcclMax: pccl.Max, C.pcclMin: pccl.Min,
}

// dtypeOf returns Concord's element type for t.
func dtypeOf(t C.pcclDataType_t) (pccl.DType, error) {
	d, ok := dtypes[t]
	if !ok {
		return 0, fmt.Errorf("%w: data type %d", pccl.ErrInvalid, t)
	}
	return d, nil
}

// descOf converts a PCCL reduce descriptor. PCCL's two quantization algorithms map to Concord's
// affine min/step encoding of the all-gather, and concordQuantMinMaxBothPhases to the same encoding on
// both phases, each of the quantized type's width; they need a float or double source and a uint8 or
// uint16 quantized type.
func descOf(d *C.pcclReduceDescriptor_t) (pccl.Desc, error) {
	dt, err := dtypeOf(d.src_descriptor.datatype)
	if err != nil {
		return pccl.Desc{}, err
	}
	op, ok := ops[d.op]
	if !ok {
		return pccl.Desc{}, fmt.Errorf("%w: reduce op %d", pccl.ErrInvalid, d.op)
	}
	if h := d.src_descriptor.distribution_hint; h > C.pcclDistributionUniform {
		return pccl.Desc{}, fmt.Errorf("%w: distribution hint %d", pccl.ErrInvalid, h)
	}
	if d.count == 0 {
		return pccl.Desc{}, fmt.Errorf("%w: count is 0", pccl.ErrInvalid)
	}
	q := pccl.NoQuant
	switch alg := d.quantization_options.algorithm; alg {
	case C.pcclQuantNone:
	case C.pcclQuantMinMax, C.pcclQuantZeroPointScale, C.concordQuantMinMaxBothPhases:
		both := alg == C.concordQuantMinMaxBothPhases
		switch d.quantization_options.quantized_datatype {
		case C.pcclUint8:
			q = pick(both, pccl.MinMaxU8Both, pccl.MinMaxU8)
		case C.pcclUint16:
			q = pick(both, pccl.MinMaxU16Both, pccl.MinMaxU16)
		default:
			return pccl.Desc{}, fmt.Errorf("%w: quantized data type %d (uint8 and uint16 are supported)",
				pccl.ErrInvalid, d.quantization_options.quantized_datatype)
		}
	default:
		return pccl.Desc{}, fmt.Errorf("%w: quantization algorithm %d", pccl.ErrInvalid, d.quantization_options.algorithm)
	}
	if !q.Supports(dt) {
		return pccl.Desc{}, fmt.Errorf("%w: quantization %v of %v (float and double only)", pccl.ErrInvalid, q, dt)
	}
	if !q.SupportsOp(op) {
		return pccl.Desc{}, fmt.Errorf("%w: quantization %v with %v (both phases: sum, avg, min and max only)", pccl.ErrInvalid, q, op)
	}
	return pccl.Desc{Tag: uint64(d.tag), Count: int(d.count), DType: dt, Op: op, Quant: q}, nil
}

// strategies maps PCCL's sync strategies to Concord's.
var strategies = map[C.pcclSharedStateSyncStrategy_t]pccl.Strategy{
	C.PCCL_SHARED_STATE_SYNC_STRATEGY_ENFORCE_POPULAR: pccl.EnforcePopular,
	C.PCCL_SHARED_STATE_SYNC_STRATEGY_RECEIVE_ONLY:    pccl.ReceiveOnly,
	C.PCCL_SHARED_STATE_SYNC_STRATEGY_SEND_ONLY:       pccl.SendOnly,
}

// errNull is the error of a NULL pointer argument.
func errNull(what string) error { return fmt.Errorf("%w: %s is NULL", pccl.ErrInvalid, what) }

// errUnknownHandle is the error of a handle that is not (or no longer) a live object.
var errUnknownHandle = errors.New("pccl: unknown or destroyed handle")

// pick returns a if cond, else b.
func pick[T any](cond bool, a, b T) T {
	if cond {
		return a
	}
	return b
}
