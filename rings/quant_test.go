package rings

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

func TestQuantNames(t *testing.T) {
	for q := NoQuant; q <= MinMaxU16; q++ {
		got, err := ParseQuant(q.String())
		if err != nil || got != q {
			t.Errorf("ParseQuant(%q) = %v, %v", q.String(), got, err)
		}
	}
	if _, err := ParseQuant("fp8"); !errors.Is(err, ErrInvalid) {
		t.Errorf("ParseQuant(fp8) error %v", err)
	}
	if Quant(5).Valid() || MinMaxU8.Supports(I32) || !MinMaxU16.Supports(BF16) || !MinMaxU8.Supports(F64) || !NoQuant.Supports(U8) {
		t.Error("unexpected Valid/Supports")
	}
}

// moderateElements returns n finite values of dt (F32 or F64) spread over several magnitudes.
func moderateElements(rng *rand.Rand, dt DType, n int) []byte {
	b := make([]byte, n*dt.Size())
	for i := range n {
		storeBits(dt, b, i, refFromFloat(dt, rng.NormFloat64()*math.Ldexp(1, rng.IntN(12)-6)))
	}
	return b
}

func TestQuantizeRoundTripError(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for _, dt := range []DType{F32, F64} {
		eps := math.Ldexp(1, -23)
		if dt == F64 {
			eps = math.Ldexp(1, -52)
		}
		for _, q := range []Quant{MinMaxU8, MinMaxU16} {
			inputs := [][]byte{moderateElements(rng, dt, 1000), moderateElements(rng, dt, 1), nil}
			constant := make([]byte, 5*dt.Size())
			for i := range 5 {
				storeBits(dt, constant, i, refFromFloat(dt, -2.5))
			}
			extremes := make([]byte, 3*dt.Size())
			big := math.MaxFloat32
			if dt == F64 {
				big = math.MaxFloat64
			}
			for i, v := range []float64{-big / 4, 0, big / 4} {
				storeBits(dt, extremes, i, refFromFloat(dt, v))
			}
			inputs = append(inputs, constant, extremes)
			for _, x := range inputs {
				n := len(x) / dt.Size()
				enc := make([]byte, QuantizedLen(dt, q, n))
				if err := Quantize(dt, q, enc, x); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, len(x))
				Dequantize(dt, q, got, enc)
				// Read the header independently and bound every element's error by half a step plus
				// the rounding of the decode.
				lo := refToFloat(dt, loadBits(dt, enc, 0))
				step := refToFloat(dt, loadBits(dt, enc, 1))
				for i := range n {
					v, d := refToFloat(dt, loadBits(dt, x, i)), refToFloat(dt, loadBits(dt, got, i))
					if v < lo {
						t.Fatalf("%v %v: header min %v above element %v", dt, q, lo, v)
					}
					bound := step/2*(1+1e-6) + 4*eps*(math.Abs(lo)+math.Abs(v)+step*q.levels())
					if err := math.Abs(d - v); !(err <= bound) {
						t.Fatalf("%v %v n=%d: element %d = %v decodes to %v (error %g, bound %g)", dt, q, n, i, v, d, err, bound)
					}
				}
			}
		}
	}
}

func TestQuantizeRejectsNonFinite(t *testing.T) {
	for _, v := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), -math.MaxFloat32} {
		x := []float32{1, v, math.MaxFloat32}
		enc := make([]byte, QuantizedLen(F32, MinMaxU8, 3))
		if err := Quantize(F32, MinMaxU8, enc, Bytes(x)); !errors.Is(err, ErrNonFinite) {
			t.Errorf("Quantize with %v: error %v", v, err)
		}
	}
}

// quantizedReference is the ring result with every part of every chunk encoded and decoded once.
func quantizedReference(dt DType, op Op, q Quant, partBytes int, inputs [][]byte) []byte {
	full := refRing(dt, op, inputs)
	size := dt.Size()
	pe := max(partBytes/size, 1)
	if partBytes == 0 {
		pe = DefaultPartBytes / size
	}
	for _, sp := range Partition(len(full)/size, len(inputs)) {
		for off := 0; off < sp.Len; off += pe {
			part := full[(sp.Off+off)*size : (sp.Off+min(off+pe, sp.Len))*size]
			enc := make([]byte, QuantizedLen(dt, q, len(part)/size))
			if err := Quantize(dt, q, enc, part); err != nil {
				panic(err)
			}
			Dequantize(dt, q, part, enc)
		}
	}
	return full
}

func TestAllReduceQuantized(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	for _, w := range []int{1, 2, 3, 4, 5} {
		for _, dt := range []DType{F32, F64} {
			for _, q := range []Quant{MinMaxU8, MinMaxU16} {
				for i, op := range []Op{Sum, Avg, Max} {
					for j, count := range []int{0, 1, w + 1, 301} {
						partBytes := []int{7 * dt.Size(), 5, 0}[(i+j)%3]
						inputs := make([][]byte, w)
						for r := range inputs {
							inputs[r] = moderateElements(rng, dt, count)
						}
						want := quantizedReference(dt, op, q, partBytes, inputs)
						streams := newRing(w)
						out := make([][]byte, w)
						errs := make([]error, w)
						done := make(chan struct{})
						for r := range w {
							out[r] = make([]byte, len(inputs[r]))
							go func() {
								defer func() { done <- struct{}{} }()
								errs[r] = AllReduce(context.Background(), streams[r], r, w, inputs[r], out[r], dt, op,
									Options{PartBytes: partBytes, Quant: q}, nil)
							}()
						}
						for range w {
							<-done
						}
						for r := range w {
							if errs[r] != nil {
								t.Fatalf("W=%d %v %v %v count=%d rank %d: %v", w, dt, q, op, count, r, errs[r])
							}
							if !bytes.Equal(out[r], want) {
								t.Fatalf("W=%d %v %v %v count=%d partBytes=%d rank %d: result differs from the reference", w, dt, q, op, count, partBytes, r)
							}
						}
					}
				}
			}
		}
	}
}

func TestAllReduceQuantizedNonFiniteAborts(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 20))
	const world = 4
	c := ringCase{world: world, dt: F32, op: Sum, count: 40, veto: -1, opt: Options{PartBytes: 16, Quant: MinMaxU8}}
	// randomElements includes NaN and infinities, so some final value is non-finite.
	run := runRing(t, rng, c)
	checkAborted(t, c, run)
	found := false
	for r := range world {
		found = found || errors.Is(run.errs[r], ErrNonFinite)
	}
	if !found {
		t.Fatal("no rank reported ErrNonFinite")
	}
}

func TestAllReduceQuantizedRejectsIntegers(t *testing.T) {
	b := make([]byte, 8)
	s := newRing(2)[0]
	for _, opt := range []Options{{Quant: MinMaxU8}, {Quant: Quant(7)}} {
		if err := AllReduce(context.Background(), s, 0, 2, b, b, I32, Sum, opt, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("%v on i32: error %v", opt.Quant, err)
		}
	}
}
