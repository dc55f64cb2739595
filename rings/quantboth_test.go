package rings

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

var floatDTypes = []DType{F16, BF16, F32, F64}

var minMaxQuants = []Quant{MinMaxU8, MinMaxU16, MinMaxU8Both, MinMaxU16Both}

// This file checks the quantized collectives against a plain reference: one element at a time, in
// float64 with every rounding to the computing type (float32 for F16, BF16 and F32) written out.

// refRound rounds x to the computing type of dt.
func refRound(dt DType, x float64) float64 {
	if dt == F64 {
		return x
	}
	return float64(float32(x))
}

// refEncoded is one part as the reference encodes it.
type refEncoded struct {
	lo, step float64
	codes    []float64
}

// refEncode encodes values of the computing type of dt.
func refEncode(dt DType, q Quant, v []float64) (refEncoded, error) {
	if len(v) == 0 {
		return refEncoded{}, nil
	}
	lo, hi := v[0], v[0]
	for _, x := range v {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return refEncoded{}, ErrNonFinite
		}
		lo, hi = min(lo, x), max(hi, x)
	}
	L := 255.0
	if q.codeBytes() == 2 {
		L = 65535
	}
	step := refRound(dt, (hi-lo)/L)
	if step == 0 && hi > lo {
		step = math.SmallestNonzeroFloat64
		if dt != F64 {
			step = math.SmallestNonzeroFloat32
		}
	}
	top := refRound(dt, refRound(dt, L*step)+lo)
	if math.IsInf(top, 0) {
		return refEncoded{}, ErrNonFinite
	}
	e := refEncoded{lo: lo, step: step, codes: make([]float64, len(v))}
	for i, x := range v {
		if step > 0 {
			t := (x - lo) * (1 / step)
			if math.IsInf(1/step, 0) {
				t = (x - lo) / step
			}
			e.codes[i] = min(math.RoundToEven(t), L)
		}
	}
	return e, nil
}

// refDecode returns code i decoded, the product rounded before the sum.
func (e refEncoded) refDecode(dt DType, i int) float64 {
	p := refRound(dt, e.codes[i]*e.step)
	return refRound(dt, p+e.lo)
}

// refWiden returns the elements of dt in b[lo:hi) (element indices) as float64.
func refWiden(dt DType, b []byte, lo, hi int) []float64 {
	v := make([]float64, hi-lo)
	for i := range v {
		v[i] = refToFloat(dt, loadBits(dt, b, lo+i))
	}
	return v
}

// refQuantRing computes the AllReduce of inputs with quantization q and parts of pe elements, as the
// package documents it. It returns ErrNonFinite where an encoded value is not finite.
func refQuantRing(dt DType, op Op, q Quant, pe int, inputs [][]byte) ([]byte, error) {
	world := len(inputs)
	count := len(inputs[0]) / dt.Size()
	out := make([]byte, len(inputs[0]))
	for c, sp := range Partition(count, world) {
		for off := sp.Off; off < sp.Off+sp.Len; off += pe {
			end := min(off+pe, sp.Off+sp.Len)
			var final []float64
			if q.BothPhases() {
				acc := refWiden(dt, inputs[c], off, end)
				for k := 1; k < world; k++ {
					e, err := refEncode(dt, q, acc)
					if err != nil {
						return nil, err
					}
					own := refWiden(dt, inputs[(c+k)%world], off, end)
					for i := range acc {
						d := e.refDecode(dt, i)
						switch {
						case op == Sum || op == Avg:
							acc[i] = refRound(dt, d+own[i])
						case op == Min && own[i] < d, op == Max && own[i] > d, math.IsNaN(own[i]):
							acc[i] = own[i]
						default:
							acc[i] = d
						}
					}
				}
				final = make([]float64, len(acc))
				for i, v := range acc {
					if op == Avg {
						v = refRound(dt, v/float64(world))
					}
					final[i] = refToFloat(dt, refFromFloat(dt, v)) // the owner's value in dt
				}
			} else {
				// The reduce-scatter at full precision, as the plain ring computes it.
				whole := refRing(dt, op, inputs)
				final = refWiden(dt, whole, off, end)
			}
			e, err := refEncode(dt, q, final)
			if err != nil {
				return nil, err
			}
			for i := range final {
				storeBits(dt, out, off+i, refFromFloat(dt, e.refDecode(dt, i)))
			}
		}
	}
	return out, nil
}

// recordStream is a Stream that keeps a copy of every frame it sends, for tests that read the wire.
// frames and sent belong to the sending goroutine until the operation has returned.
type recordStream struct {
	Stream
	frames map[ChunkID][]byte
	sent   Traffic
}

func (s *recordStream) Send(id ChunkID, payload []byte) error {
	s.frames[id] = bytes.Clone(payload)
	s.sent.Frames++
	s.sent.Bytes += int64(len(payload))
	return s.Stream.Send(id, payload)
}

func recordRing(world int) []*recordStream {
	streams := make([]*recordStream, world)
	for r, s := range newRing(world) {
		streams[r] = &recordStream{Stream: s, frames: map[ChunkID][]byte{}}
	}
	return streams
}

// runQuantRing runs AllReduce on every rank over recording streams and returns results and errors.
func runQuantRing(inputs [][]byte, dt DType, op Op, opt Options, inPlace bool) ([][]byte, []error, []*recordStream) {
	world := len(inputs)
	streams := recordRing(world)
	out := make([][]byte, world)
	errs := onEveryRank(world, func(r int) error {
		send := bytes.Clone(inputs[r])
		out[r] = send
		if !inPlace {
			out[r] = make([]byte, len(send))
		}
		return AllReduce(context.Background(), streams[r], r, world, send, out[r], dt, op, opt, nil)
	})
	return out, errs, streams
}

// offsetElements returns n values of dt that sit close to a large offset, so that rounding, not the
// range, dominates the quantization error.
func offsetElements(rng *rand.Rand, dt DType, n int) []byte {
	b := make([]byte, n*dt.Size())
	base := float64(rng.IntN(2000) - 1000)
	for i := range n {
		storeBits(dt, b, i, refFromFloat(dt, base+rng.NormFloat64()*0.01))
	}
	return b
}

func TestQuantizedAllReduceMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(51, 52))
	i := 0
	for _, world := range []int{1, 2, 3, 5} {
		for _, dt := range floatDTypes {
			for _, q := range minMaxQuants {
				for _, op := range []Op{Sum, Avg, Min, Max} {
					count := []int{0, world + 1, 97}[i%3]
					partBytes := []int{5 * dt.Size(), 1, 0}[i%3]
					inPlace := i%2 == 0
					i++
					inputs := make([][]byte, world)
					for r := range inputs {
						inputs[r] = moderateElements(rng, dt, count)
					}
					want, err := refQuantRing(dt, op, q, partElems(partBytes, dt.Size()), inputs)
					if err != nil {
						t.Fatal(err)
					}
					out, errs, _ := runQuantRing(inputs, dt, op, Options{PartBytes: partBytes, Quant: q}, inPlace)
					for r := range world {
						if errs[r] != nil {
							t.Fatalf("W=%d %v %v %v: rank %d: %v", world, dt, q, op, r, errs[r])
						}
						for k := range count {
							if g, w := loadBits(dt, out[r], k), loadBits(dt, want, k); g != w {
								t.Fatalf("W=%d %v %v %v count=%d partBytes=%d: rank %d element %d = %#x, want %#x",
									world, dt, q, op, count, partBytes, r, k, g, w)
							}
						}
					}
				}
			}
		}
	}
}

// TestBothPhasesHalvesAreAllReduce checks that ReduceScatter then AllGather with a both-phase encoding
// compute AllReduce's bytes, and that ReduceScatter alone leaves each owned chunk unencoded.
func TestBothPhasesHalvesAreAllReduce(t *testing.T) {
	rng := rand.New(rand.NewPCG(53, 54))
	for _, world := range []int{1, 2, 4} {
		for _, dt := range floatDTypes {
			for _, op := range []Op{Avg, Max} {
				const count = 29
				opt := Options{PartBytes: 3 * dt.Size(), Quant: MinMaxU8Both}
				inputs := make([][]byte, world)
				for r := range inputs {
					inputs[r] = moderateElements(rng, dt, count)
				}
				flat, errs, _ := runQuantRing(inputs, dt, op, opt, true)
				halves := make([][]byte, world)
				scattered := make([][]byte, world)
				streams := memRing(world)
				errs2 := onEveryRank(world, func(r int) error {
					halves[r] = bytes.Clone(inputs[r])
					if err := ReduceScatter(context.Background(), streams[r], r, world, halves[r], dt, op, opt); err != nil {
						return err
					}
					scattered[r] = bytes.Clone(halves[r])
					return AllGather(context.Background(), streams[r], r, world, halves[r], dt, opt)
				})
				for r := range world {
					if errs[r] != nil || errs2[r] != nil {
						t.Fatalf("W=%d %v %v: rank %d: %v, %v", world, dt, op, r, errs[r], errs2[r])
					}
					if !bytes.Equal(flat[r], halves[r]) {
						t.Fatalf("W=%d %v %v: rank %d: halves differ from AllReduce", world, dt, op, r)
					}
					// Encoding the owned chunk after the reduce-scatter gives the final result.
					sp := Shard(count, r, world)
					lo, hi := bytesOf(dt, sp)
					got := quantRoundTrip(dt, MinMaxU8Both, scattered[r], sp, 3)
					if !bytes.Equal(got[lo:hi], flat[r][lo:hi]) {
						t.Fatalf("W=%d %v %v: rank %d: owned chunk after the reduce-scatter does not encode to the result", world, dt, op, r)
					}
				}
			}
		}
	}
}

// quantBound returns the documented bound on |result - exact| for one element: hdr holds the (lo, step)
// headers of the encodings it went through, in order (the all-gather last), xs its contributions.
func quantBound(dt DType, q Quant, op Op, hdr [][2]float64, xs []float64) float64 {
	world := float64(len(xs))
	u, sigma := math.Ldexp(1, -24), math.SmallestNonzeroFloat32
	if dt == F64 {
		u, sigma = math.Ldexp(1, -53), math.SmallestNonzeroFloat64
	}
	var uo, sigmaO float64
	switch dt {
	case F16:
		uo, sigmaO = math.Ldexp(1, -11), math.Ldexp(1, -24)
	case BF16:
		uo, sigmaO = math.Ldexp(1, -8), math.Ldexp(1, -133)
	}
	L := q.levels()
	var steps, mags, x float64
	for i, h := range hdr {
		half := h[1] / 2
		if op == Avg && i < len(hdr)-1 {
			half /= world
		}
		steps += half
		mags += math.Abs(h[0]) + L*h[1]
	}
	for _, v := range xs {
		x += math.Abs(v)
	}
	return steps + (6*u+3*uo)*(mags+world*x) + 2*world*(L+2)*(sigma+sigmaO)
}

// exactResult returns the exact reduction of xs (Avg divided by their number) rounded to float64.
func exactResult(op Op, xs []float64) float64 {
	switch op {
	case Min, Max:
		v := xs[0]
		for _, x := range xs {
			if op == Min {
				v = min(v, x)
			} else {
				v = max(v, x)
			}
		}
		return v
	}
	sum := new(big.Float).SetPrec(4096)
	for _, x := range xs {
		sum.Add(sum, new(big.Float).SetFloat64(x))
	}
	if op == Avg {
		sum.Quo(sum, new(big.Float).SetInt64(int64(len(xs))))
	}
	v, _ := sum.Float64()
	return v
}

// TestQuantizedAllReduceErrorBound checks the documented error bound element by element against the
// exact result, with the steps read off the wire, for every float type, encoding and quantized op.
func TestQuantizedAllReduceErrorBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(55, 56))
	i := 0
	for world := 2; world <= 8; world++ {
		for _, dt := range floatDTypes {
			for _, q := range minMaxQuants {
				for _, op := range []Op{Sum, Avg, Min, Max} {
					count := []int{45, 130}[i%2]
					partBytes := []int{16 * dt.Size(), 7 * dt.Size()}[i%2]
					gen := moderateElements
					if i%3 == 2 {
						gen = offsetElements
					}
					i++
					inputs := make([][]byte, world)
					for r := range inputs {
						inputs[r] = gen(rng, dt, count)
					}
					out, errs, streams := runQuantRing(inputs, dt, op, Options{PartBytes: partBytes, Quant: q}, false)
					pe := partElems(partBytes, dt.Size())
					var worst float64 // largest error as a fraction of the bound
					for c, sp := range Partition(count, world) {
						for k := sp.Off; k < sp.Off+sp.Len; k++ {
							p := uint32((k - sp.Off) / pe)
							var hdr [][2]float64
							if q.BothPhases() {
								for s := range world - 1 {
									hdr = append(hdr, readHeader(dt, streams[(c+s)%world].frames[ChunkID{uint32(s), p}]))
								}
							}
							hdr = append(hdr, readHeader(dt, streams[mod(c-1, world)].frames[ChunkID{uint32(world - 1), p}]))
							xs := make([]float64, world)
							for r := range world {
								xs[r] = refToFloat(dt, loadBits(dt, inputs[r], k))
							}
							exact := exactResult(op, xs)
							bound := quantBound(dt, q, op, hdr, xs)
							for r := range world {
								if errs[r] != nil {
									t.Fatalf("W=%d %v %v %v: rank %d: %v", world, dt, q, op, r, errs[r])
								}
								got := refToFloat(dt, loadBits(dt, out[r], k))
								if e := math.Abs(got - exact); !(e <= bound) {
									t.Fatalf("W=%d %v %v %v: rank %d element %d = %v, exact %v: error %g above the bound %g",
										world, dt, q, op, r, k, got, exact, e, bound)
								}
								worst = max(worst, math.Abs(got-exact)/bound)
							}
							if !bytes.Equal(out[0], out[world-1]) {
								t.Fatalf("W=%d %v %v %v: results differ between ranks", world, dt, q, op)
							}
						}
					}
					if testing.Verbose() && world == 8 {
						t.Logf("W=%d %v %v %v: largest error %.3f of the bound", world, dt, q, op, worst)
					}
				}
			}
		}
	}
}

// readHeader returns the (lo, step) header of an encoded frame.
func readHeader(dt DType, frame []byte) [2]float64 {
	if dt == F64 {
		return [2]float64{math.Float64frombits(binary.LittleEndian.Uint64(frame)), math.Float64frombits(binary.LittleEndian.Uint64(frame[8:]))}
	}
	return [2]float64{float64(math.Float32frombits(binary.LittleEndian.Uint32(frame))), float64(math.Float32frombits(binary.LittleEndian.Uint32(frame[4:])))}
}

// TestQuantizeMatchesReference compares the encoder's codes and header and the decoder's values with
// the plain reference, bit for bit, for every float type.
func TestQuantizeMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(57, 58))
	for _, dt := range floatDTypes {
		for _, q := range minMaxQuants {
			for trial := range 40 {
				n := rng.IntN(300)
				x := moderateElements(rng, dt, n)
				switch trial % 4 {
				case 1:
					x = offsetElements(rng, dt, n)
				case 3:
					// Ranges of subnormals, where the step rounds to zero or its reciprocal
					// overflows.
					x = make([]byte, n*dt.Size())
					for i := range n {
						v := math.Ldexp(float64(rng.IntN(5)), -1074)
						if dt != F64 {
							v = math.Ldexp(float64(rng.IntN(5)), -149)
						}
						storeBits(dt, x, i, refFromFloat(dt, v))
					}
				}
				enc := make([]byte, QuantizedLen(dt, q, n))
				if err := Quantize(dt, q, enc, x); err != nil {
					t.Fatal(err)
				}
				e, err := refEncode(dt, q, refWiden(dt, x, 0, n))
				if err != nil {
					t.Fatal(err)
				}
				if n > 0 {
					if h := readHeader(dt, enc); h != [2]float64{e.lo, e.step} {
						t.Fatalf("%v %v: header %v, want %v", dt, q, h, [2]float64{e.lo, e.step})
					}
				}
				dec := make([]byte, len(x))
				Dequantize(dt, q, dec, enc)
				codes := enc[2*accSize(dt):]
				for i := range n {
					code := float64(codes[i])
					if q.codeBytes() == 2 {
						code = float64(binary.LittleEndian.Uint16(codes[2*i:]))
					}
					if code != e.codes[i] {
						t.Fatalf("%v %v: element %d code %v, want %v", dt, q, i, code, e.codes[i])
					}
					if g, w := loadBits(dt, dec, i), refFromFloat(dt, e.refDecode(dt, i)); g != w {
						t.Fatalf("%v %v: element %d decodes to %#x, want %#x", dt, q, i, g, w)
					}
				}
			}
		}
	}
}

// TestDequantizeDoesNotFuse checks, against exact arithmetic, that decoding rounds the product
// code*step before adding the minimum, and that the inputs include cases where a fused multiply-add
// would give a different result, so the test would catch a fusing compiler.
func TestDequantizeDoesNotFuse(t *testing.T) {
	rng := rand.New(rand.NewPCG(59, 60))
	for _, dt := range []DType{F32, F64} {
		prec := uint(24)
		if dt == F64 {
			prec = 53
		}
		round := func(x *big.Float) *big.Float { return new(big.Float).SetPrec(prec).SetMode(big.ToNearestEven).Set(x) }
		const n = 4000
		x := moderateElements(rng, dt, n)
		q := MinMaxU16Both
		enc := make([]byte, QuantizedLen(dt, q, n))
		if err := Quantize(dt, q, enc, x); err != nil {
			t.Fatal(err)
		}
		dec := make([]byte, len(x))
		Dequantize(dt, q, dec, enc)
		h := readHeader(dt, enc)
		lo, step := new(big.Float).SetFloat64(h[0]), new(big.Float).SetFloat64(h[1])
		fusedDiffers := 0
		for i := range n {
			code := new(big.Float).SetInt64(int64(binary.LittleEndian.Uint16(enc[2*accSize(dt)+2*i:])))
			prod := new(big.Float).SetPrec(256).Mul(code, step)
			twice := round(new(big.Float).SetPrec(256).Add(round(prod), lo))
			fused := round(new(big.Float).SetPrec(256).Add(prod, lo))
			want, _ := twice.Float64()
			if got := refToFloat(dt, loadBits(dt, dec, i)); got != want {
				t.Fatalf("%v element %d decodes to %v, want %v (product rounded first)", dt, i, got, want)
			}
			if f, _ := fused.Float64(); f != want {
				fusedDiffers++
			}
		}
		if fusedDiffers == 0 {
			t.Fatalf("%v: no input tells fused from unfused decoding", dt)
		}
	}
}

func TestQuantizedNonFiniteFailsTheOperation(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 62))
	for _, dt := range floatDTypes {
		for _, q := range []Quant{MinMaxU8Both, MinMaxU16} {
			for _, bad := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
				const world, count = 4, 23
				inputs := make([][]byte, world)
				for r := range inputs {
					inputs[r] = moderateElements(rng, dt, count)
				}
				storeBits(dt, inputs[rng.IntN(world)], rng.IntN(count), refFromFloat(dt, bad))
				before := make([][]byte, world)
				for r := range inputs {
					before[r] = bytes.Clone(inputs[r])
				}
				streams := memRing(world)
				errs := onEveryRank(world, func(r int) error {
					return AllReduce(context.Background(), streams[r], r, world, inputs[r], inputs[r], dt, Sum, Options{PartBytes: 4 * dt.Size(), Quant: q}, nil)
				})
				found := false
				for r := range world {
					if !errors.Is(errs[r], ErrAborted) {
						t.Fatalf("%v %v %v: rank %d: error %v, want ErrAborted", dt, q, bad, r, errs[r])
					}
					found = found || errors.Is(errs[r], ErrNonFinite)
					if !bytes.Equal(inputs[r], before[r]) {
						t.Fatalf("%v %v %v: rank %d: buffer modified by a failed operation", dt, q, bad, r)
					}
				}
				if !found {
					t.Fatalf("%v %v %v: no rank reported ErrNonFinite", dt, q, bad)
				}
			}
		}
	}
}

func TestQuantizedRejectsUnsupported(t *testing.T) {
	b := make([]byte, 16)
	s := newRing(2)[0]
	ctx := context.Background()
	for _, c := range []struct {
		name string
		err  error
	}{
		{"both-phase Prod", AllReduce(ctx, s, 0, 2, b, b, F32, Prod, Options{Quant: MinMaxU8Both}, nil)},
		{"both-phase Prod reduce-scatter", ReduceScatter(ctx, s, 0, 2, b, F32, Prod, Options{Quant: MinMaxU16Both})},
		{"all-gather-only reduce-scatter", ReduceScatter(ctx, s, 0, 2, b, F32, Sum, Options{Quant: MinMaxU16})},
		{"both-phase integers", AllReduce(ctx, s, 0, 2, b, b, I32, Sum, Options{Quant: MinMaxU8Both}, nil)},
	} {
		if !errors.Is(c.err, ErrInvalid) {
			t.Errorf("%s: error %v, want ErrInvalid", c.name, c.err)
		}
	}
	if s.sends != 0 || s.recvs != 0 {
		t.Error("stream used by an invalid call")
	}
	for q := NoQuant; q <= MinMaxU16Both; q++ {
		for _, op := range allOps {
			want := !q.BothPhases() || op != Prod
			if q.SupportsOp(op) != want {
				t.Errorf("%v.SupportsOp(%v) = %v", q, op, !want)
			}
		}
		if got, err := ParseQuant(q.String()); got != q || err != nil {
			t.Errorf("ParseQuant(%q) = %v, %v", q.String(), got, err)
		}
	}
	// Prod stays available with an all-gather-only encoding, as the all-gather carries final values.
	streams := memRing(2)
	errs := onEveryRank(2, func(r int) error {
		x := Bytes([]float32{1, 2, 3, 4})
		return AllReduce(ctx, streams[r], r, 2, x, x, F32, Prod, Options{Quant: MinMaxU8}, nil)
	})
	if errs[0] != nil || errs[1] != nil {
		t.Errorf("all-gather-only Prod: %v, %v", errs[0], errs[1])
	}
}

// TestSentTrafficMatchesTheWire checks SentTraffic against what the collectives hand their Stream.
func TestSentTrafficMatchesTheWire(t *testing.T) {
	rng := rand.New(rand.NewPCG(63, 64))
	for _, world := range []int{1, 2, 3, 5} {
		for _, dt := range []DType{F16, F32, F64} {
			for _, q := range append([]Quant{NoQuant}, minMaxQuants...) {
				for _, k := range []Kind{KindAllReduce, KindReduceScatter, KindAllGather} {
					if k == KindReduceScatter && q != NoQuant && !q.BothPhases() {
						continue
					}
					const count = 53
					opt := Options{PartBytes: 6 * dt.Size(), Quant: q}
					streams := recordRing(world)
					bufs := make([][]byte, world)
					for r := range bufs {
						bufs[r] = moderateElements(rng, dt, count)
					}
					errs := onEveryRank(world, func(r int) error {
						switch k {
						case KindReduceScatter:
							return ReduceScatter(context.Background(), streams[r], r, world, bufs[r], dt, Sum, opt)
						case KindAllGather:
							return AllGather(context.Background(), streams[r], r, world, bufs[r], dt, opt)
						}
						return AllReduce(context.Background(), streams[r], r, world, bufs[r], bufs[r], dt, Sum, opt, nil)
					})
					for r := range world {
						if errs[r] != nil {
							t.Fatalf("W=%d %v %v %v: rank %d: %v", world, dt, q, k, r, errs[r])
						}
						want, err := SentTraffic(k, count, dt, r, world, opt)
						if err != nil {
							t.Fatal(err)
						}
						if streams[r].sent != want {
							t.Fatalf("W=%d %v %v %v: rank %d sent %+v, SentTraffic says %+v", world, dt, q, k, r, streams[r].sent, want)
						}
					}
				}
			}
		}
	}
	if _, err := SentTraffic(KindReduceScatter, 10, F32, 0, 2, Options{Quant: MinMaxU8}); !errors.Is(err, ErrInvalid) {
		t.Errorf("all-gather-only reduce-scatter: %v", err)
	}
	if _, err := SentTraffic(KindAllReduce, 10, F32, 2, 2, Options{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("rank outside the world: %v", err)
	}
}

// TestU8WireRatio checks that an AllReduce of F32 with MinMaxU8Both puts at most 0.3 times the bytes of
// the unencoded one on the wire, headers and 64 bytes of framing per frame included, for realistic
// sizes and part sizes.
func TestU8WireRatio(t *testing.T) {
	const framing = 64
	for _, world := range []int{2, 4, 8, 16} {
		for _, partBytes := range []int{16 << 10, 256 << 10, 0} {
			for _, count := range []int{1 << 20, 64 << 20} {
				full, err := SentTraffic(KindAllReduce, count, F32, 0, world, Options{PartBytes: partBytes})
				if err != nil {
					t.Fatal(err)
				}
				u8, err := SentTraffic(KindAllReduce, count, F32, 0, world, Options{PartBytes: partBytes, Quant: MinMaxU8Both})
				if err != nil {
					t.Fatal(err)
				}
				ratio := float64(u8.OnWire(framing)) / float64(full.OnWire(framing))
				if ratio > 0.3 {
					t.Errorf("W=%d parts of %d bytes, %d elements: u8 moves %.4f of the f32 bytes", world, partBytes, count, ratio)
				}
				// The all-gather-only encoding cannot get there: half the frames stay f32.
				ag, _ := SentTraffic(KindAllReduce, count, F32, 0, world, Options{PartBytes: partBytes, Quant: MinMaxU8})
				if r := float64(ag.OnWire(framing)) / float64(full.OnWire(framing)); r < 0.6 {
					t.Errorf("W=%d: all-gather-only ratio %.4f", world, r)
				}
			}
		}
	}
}

// TestRetainerBothPhases runs the both-phase AllReduce over streams that keep every payload until a
// delayed acknowledgement (the encoded reduce-scatter frames are received into again by the
// all-gather) and compares with the copying streams.
func TestRetainerBothPhases(t *testing.T) {
	rng := rand.New(rand.NewPCG(65, 66))
	var seed uint64 = 1000
	for _, batch := range []int{1, 3, 1 << 30} {
		for _, world := range []int{2, 3, 4} {
			for _, dt := range []DType{BF16, F32} {
				what := fmt.Sprintf("batch %d W=%d %v", batch, world, dt)
				const count = 45
				opt := Options{PartBytes: 4 * dt.Size(), Quant: MinMaxU8Both}
				inputs := make([][]byte, world)
				for r := range world {
					inputs[r] = moderateElements(rng, dt, count)
				}
				want, errs, _ := runQuantRing(inputs, dt, Avg, opt, false)
				seed++
				streams := newRetainRing(world, batch, seed)
				got := make([][]byte, world)
				errs2 := onEveryRank(world, func(r int) error {
					got[r] = bytes.Clone(inputs[r])
					return AllReduce(context.Background(), streams[r], r, world, got[r], got[r], dt, Avg, opt, nil)
				})
				for r := range world {
					if errs[r] != nil || errs2[r] != nil {
						t.Fatalf("%s: rank %d: %v, %v", what, r, errs[r], errs2[r])
					}
					streams[r].check(t, what, r)
					if !bytes.Equal(got[r], want[r]) {
						t.Fatalf("%s: rank %d: result differs from the copying stream's", what, r)
					}
				}
			}
		}
	}
}

// FuzzDequantize decodes arbitrary bytes: it must not panic, and the same bytes decode to the same
// values.
func FuzzDequantize(f *testing.F) {
	f.Add(uint8(0), uint8(1), []byte("0123456789abcdefghij"))
	f.Add(uint8(3), uint8(4), make([]byte, 40))
	f.Fuzz(func(t *testing.T, d, qq uint8, enc []byte) {
		dt := floatDTypes[int(d)%len(floatDTypes)]
		q := minMaxQuants[int(qq)%len(minMaxQuants)]
		n := (len(enc) - 2*accSize(dt)) / q.codeBytes()
		if n < 0 {
			return
		}
		enc = enc[:QuantizedLen(dt, q, n)]
		a, b := make([]byte, n*dt.Size()), make([]byte, n*dt.Size())
		Dequantize(dt, q, a, enc)
		Dequantize(dt, q, b, enc)
		if !bytes.Equal(a, b) {
			t.Fatal("decoding is not deterministic")
		}
	})
}

// TestBothPhasesAllocationsDoNotGrowWithParts checks that the encoded pipeline allocates per call, not
// per part.
func TestBothPhasesAllocationsDoNotGrowWithParts(t *testing.T) {
	var pool BufferPool
	for _, dt := range []DType{F16, F32} {
		allocs := func(partBytes int) float64 {
			in := [][]byte{make([]byte, 4096), make([]byte, 4096)}
			opt := Options{PartBytes: partBytes, Pool: &pool, Quant: MinMaxU8Both}
			return testing.AllocsPerRun(20, func() {
				streams := newRing(2)
				done := make(chan error, 1)
				go func() {
					done <- AllReduce(context.Background(), streams[1], 1, 2, in[1], in[1], dt, Sum, opt, nil)
				}()
				if err := AllReduce(context.Background(), streams[0], 0, 2, in[0], in[0], dt, Sum, opt, nil); err != nil {
					t.Fatal(err)
				}
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			})
		}
		few, many := allocs(4096), allocs(4*dt.Size())
		if many > few+16 {
			t.Fatalf("%v: %v allocations with many parts per chunk, %v with 1: allocation per part", dt, many, few)
		}
	}
}

// TestHierarchicalPlanBothPhases quantizes every phase of the hierarchical plan (reduce-scatter in the
// site, all-reduce across sites, all-gather in the site) and checks that every peer ends with the
// same bits, close to the exact average.
func TestHierarchicalPlanBothPhases(t *testing.T) {
	rng := rand.New(rand.NewPCG(67, 68))
	h := hierarchy{2, 3}
	world := h.world()
	for _, dt := range floatDTypes {
		const count = 61
		inputs := make([][]byte, world)
		for g := range world {
			inputs[g] = moderateElements(rng, dt, count)
		}
		site, cross := h.rings(memRing)
		out := make([][]byte, world)
		errs := onEveryRank(world, func(g int) error {
			p := h.plan(g, site, cross, dt, Avg, count, 8, MinMaxU16Both)
			for i := range p.Phases {
				p.Phases[i].Quant = MinMaxU16Both
			}
			out[g] = bytes.Clone(inputs[g])
			return p.Execute(context.Background(), out[g], out[g], nil)
		})
		for g := range world {
			if errs[g] != nil {
				t.Fatalf("%v: rank %d: %v", dt, g, errs[g])
			}
			if !bytes.Equal(out[g], out[0]) {
				t.Fatalf("%v: rank %d differs from rank 0", dt, g)
			}
		}
		for k := range count {
			xs := make([]float64, world)
			for g := range world {
				xs[g] = refToFloat(dt, loadBits(dt, inputs[g], k))
			}
			exact, got := exactResult(Avg, xs), refToFloat(dt, loadBits(dt, out[0], k))
			// Loose: a few u16 steps of the partial ranges, and the roundings of the site's partial
			// sums to the element type.
			var x float64
			for _, v := range xs {
				x += math.Abs(v)
			}
			uo := map[DType]float64{F16: math.Ldexp(1, -11), BF16: math.Ldexp(1, -8)}[dt]
			tol := (3*uo + 2e-3) * x
			if math.Abs(got-exact) > tol {
				t.Fatalf("%v element %d = %v, exact %v", dt, k, got, exact)
			}
		}
	}
}

// BenchmarkAllReduceRingQuantizedBoth is BenchmarkAllReduceRing with both phases encoded as
// MinMaxU8Both.
func BenchmarkAllReduceRingQuantizedBoth(b *testing.B) { benchmarkRing(b, MinMaxU8Both) }
