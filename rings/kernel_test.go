package rings

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var allDTypes = []DType{F16, BF16, F32, F64, I8, I16, I32, I64, U8, U16, U32, U64}
var allOps = []Op{Sum, Avg, Prod, Min, Max}

// specialBits returns edge-case element values of dt: zeros, ones, extremes, and for floats NaNs,
// infinities and subnormals.
func specialBits(dt DType) []uint64 {
	switch dt {
	case F16:
		return []uint64{0, 0x8000, 0x3c00, 0xbc00, 0x7bff, 0xfbff, 0x0001, 0x8001, 0x03ff, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7c01, 0x3555}
	case BF16:
		return []uint64{0, 0x8000, 0x3f80, 0xbf80, 0x7f7f, 0xff7f, 0x0001, 0x8001, 0x007f, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x3eab}
	case F32:
		return []uint64{0, 0x80000000, 0x3f800000, 0xbf800000, 0x7f7fffff, 0xff7fffff, 1, 0x80000001, 0x007fffff,
			0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001, 0x3eaaaaab}
	case F64:
		return []uint64{0, 1 << 63, math.Float64bits(1), math.Float64bits(-1), math.Float64bits(math.MaxFloat64),
			math.Float64bits(-math.MaxFloat64), 1, 1<<63 | 1, math.Float64bits(math.Inf(1)), math.Float64bits(math.Inf(-1)),
			0x7ff8000000000000, 0xfff8000000000001, 0x7ff0000000000001, math.Float64bits(1.0 / 3)}
	}
	bits := uint(8 * dt.Size())
	mask := uint64(math.MaxUint64) >> (64 - bits)
	top := uint64(1) << (bits - 1)
	return []uint64{0, 1, mask, top, top - 1, top + 1, 2, mask - 1}
}

// randomElements fills n elements of dt with a mix of edge cases, raw random bit patterns (which, for
// integers, overflow freely), and for floats moderate values of both signs.
func randomElements(rng *rand.Rand, dt DType, n int) []byte {
	b := make([]byte, n*dt.Size())
	special := specialBits(dt)
	for i := range n {
		var v uint64
		switch k := rng.IntN(8); {
		case k == 0:
			v = special[rng.IntN(len(special))]
		case k <= 3 || !dt.isFloat():
			v = rng.Uint64()
		default:
			x := rng.NormFloat64() * math.Ldexp(1, rng.IntN(20)-10)
			if k == 7 {
				x = float64(rng.IntN(9) - 4) // small integers: exact sums, ties, zeros
			}
			v = refFromFloat(dt, x)
		}
		storeBits(dt, b, i, v)
	}
	return b
}

func TestAccumulateMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dt := range allDTypes {
		for _, op := range allOps {
			for _, n := range []int{0, 1, 7, 8, 9, 31, 1000} {
				dst := randomElements(rng, dt, n)
				src := randomElements(rng, dt, n)
				got := append([]byte(nil), dst...)
				Accumulate(dt, op, got, src)
				for i := range n {
					a, b := loadBits(dt, dst, i), loadBits(dt, src, i)
					want := refCombine(dt, op, a, b)
					if g := loadBits(dt, got, i); !refSame(dt, op, g, want) {
						t.Fatalf("%v %v n=%d [%d]: %#x op %#x = %#x, want %#x", dt, op, n, i, a, b, g, want)
					}
				}
			}
		}
	}
}

func TestFinalizeMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dt := range allDTypes {
		for _, op := range allOps {
			for _, world := range []int{1, 2, 3, 7, 8, 300} {
				buf := randomElements(rng, dt, 257)
				got := append([]byte(nil), buf...)
				Finalize(dt, op, got, world)
				for i := range 257 {
					a := loadBits(dt, buf, i)
					want := refFinalize(dt, op, a, world)
					if g := loadBits(dt, got, i); !refSame(dt, op, g, want) {
						t.Fatalf("%v %v world %d [%d]: %#x -> %#x, want %#x", dt, op, world, i, a, g, want)
					}
				}
			}
		}
	}
}

func TestMinMaxNaNPolicy(t *testing.T) {
	nan := math.Float32frombits(0x7fc00001)
	otherNaN := math.Float32frombits(0xffc00002)
	cases := []struct {
		op       Op
		dst, src float32
		want     uint32
	}{
		{Min, nan, 1, 0x7fc00001},
		{Min, 1, nan, 0x7fc00001},
		{Max, nan, 1, 0x7fc00001},
		{Max, -1, nan, 0x7fc00001},
		{Min, nan, otherNaN, 0x7fc00001}, // both NaN: dst wins
		{Max, otherNaN, nan, 0xffc00002},
		{Min, float32(math.Inf(-1)), nan, 0x7fc00001},
		{Min, 0, float32(math.Copysign(0, -1)), 0}, // equal: dst kept
		{Max, float32(math.Copysign(0, -1)), 0, 0x80000000},
		{Min, 2, 1, math.Float32bits(1)},
		{Max, 2, 1, math.Float32bits(2)},
	}
	for _, c := range cases {
		dst, src := []float32{c.dst}, []float32{c.src}
		Accumulate(F32, c.op, Bytes(dst), Bytes(src))
		if got := math.Float32bits(dst[0]); got != c.want {
			t.Errorf("%v(%v, %v) = %#x, want %#x", c.op, c.dst, c.src, got, c.want)
		}
	}
	// The same policy for the 16-bit formats: the NaN operand is returned unchanged.
	for _, dt := range []DType{F16, BF16} {
		nanBits := uint16(0x7e01)
		if dt == BF16 {
			nanBits = 0x7fc1
		}
		dst, src := []uint16{0x3c00}, []uint16{nanBits} // 1.0 in f16, NaN
		Accumulate(dt, Max, Bytes(dst), Bytes(src))
		if dst[0] != nanBits {
			t.Errorf("%v max(x, NaN) = %#x, want %#x", dt, dst[0], nanBits)
		}
	}
}

func TestHalfRounding(t *testing.T) {
	// bf16: 1 + 2^-8 is exactly halfway between 1 and 1+2^-7: ties to even keeps 1.
	cases := []struct {
		f    float32
		want uint16
	}{
		{1 + 1.0/256, 0x3f80},
		{1 + 3.0/256, 0x3f82},                      // halfway, rounds up to even mantissa
		{1 + 1.0/256 + 1.0/65536, 0x3f81},          // just above halfway
		{math.MaxFloat32, 0x7f80},                  // rounds to infinity
		{float32(math.Inf(-1)), 0xff80},            // stays infinite
		{math.Float32frombits(0x7f800001), 0x7fc0}, // signalling NaN becomes quiet NaN
	}
	for _, c := range cases {
		if got := f32ToBF16(c.f); got != c.want {
			t.Errorf("f32ToBF16(%v) = %#x, want %#x", c.f, got, c.want)
		}
	}
	// f16: 2048 + 1 is halfway between 2048 and 2050: ties to even keeps 2048.
	dst, src := []uint16{f32ToF16(2048)}, []uint16{f32ToF16(1)}
	Accumulate(F16, Sum, Bytes(dst), Bytes(src))
	if f16ToF32(dst[0]) != 2048 {
		t.Errorf("f16 2048+1 = %v, want 2048", f16ToF32(dst[0]))
	}
	dst = []uint16{f32ToF16(65504)}
	Accumulate(F16, Sum, Bytes(dst), Bytes(dst))
	if dst[0] != 0x7c00 {
		t.Errorf("f16 overflow = %#x, want +Inf", dst[0])
	}
}

func TestIntegerWrapAndTruncation(t *testing.T) {
	a, b := []int8{127, -128, -7}, []int8{1, -1, 0}
	Accumulate(I8, Sum, Bytes(a), Bytes(b))
	if a[0] != -128 || a[1] != 127 || a[2] != -7 {
		t.Errorf("i8 wrap: %v", a)
	}
	Finalize(I8, Avg, Bytes(a), 2)
	if a[0] != -64 || a[1] != 63 || a[2] != -3 {
		t.Errorf("i8 avg truncation: %v", a)
	}
	u := []uint64{math.MaxUint64}
	Accumulate(U64, Prod, Bytes(u), Bytes([]uint64{2}))
	if u[0] != math.MaxUint64-1 {
		t.Errorf("u64 prod wrap: %v", u[0])
	}
}

func TestKernelPanicsOnMisuse(t *testing.T) {
	cases := map[string]func(){
		"length mismatch": func() { Accumulate(F32, Sum, make([]byte, 8), make([]byte, 4)) },
		"partial element": func() { Accumulate(F32, Sum, make([]byte, 6), make([]byte, 6)) },
		"bad dtype":       func() { Accumulate(0, Sum, nil, nil) },
		"bad op":          func() { Finalize(F32, 9, nil, 1) },
		"zero world":      func() { Finalize(F32, Avg, make([]byte, 4), 0) },
	}
	for name, f := range cases {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func benchmarkAccumulate(b *testing.B, dt DType, op Op) {
	const size = 64 << 20
	dst, src := make([]byte, size), make([]byte, size)
	b.SetBytes(size)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		Accumulate(dt, op, dst, src)
	}
	b.ReportMetric(float64(b.N)*size/time.Since(start).Seconds()/1e9, "GB/s")
}

// BenchmarkAccumulateF32 measures the Sum kernel over 64 MiB of f32; GB/s counts bytes of dst.
func BenchmarkAccumulateF32(b *testing.B) { benchmarkAccumulate(b, F32, Sum) }

// BenchmarkAccumulateOthers measures the other kernels over 64 MiB, for comparison.
func BenchmarkAccumulateOthers(b *testing.B) {
	for _, c := range []struct {
		dt DType
		op Op
	}{{F64, Sum}, {I32, Sum}, {I64, Sum}, {F32, Max}, {BF16, Sum}, {F16, Sum}, {U8, Prod}} {
		b.Run(fmt.Sprintf("%v-%v", c.dt, c.op), func(b *testing.B) { benchmarkAccumulate(b, c.dt, c.op) })
	}
}

// TestAccumulateOntoMatchesAccumulate checks that accumulateOnto(dst, src) stores in dst what
// Accumulate(src, dst) stores in src, bit for bit (NaN payloads included, except where both operands
// are NaN and the scalar tail's operand order is the compiler's), for every type and op it covers,
// and that it leaves alone the ones it does not.
func TestAccumulateOntoMatchesAccumulate(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range allDTypes {
		for _, op := range allOps {
			for _, n := range []int{0, 1, 7, 31, 32, 33, 100, 1000} {
				dst := randomElements(rng, dt, n)
				src := randomElements(rng, dt, n)
				want := append([]byte(nil), src...)
				Accumulate(dt, op, want, dst)
				got := append([]byte(nil), dst...)
				srcCopy := append([]byte(nil), src...)
				covered := accumulateOnto(dt, op, got, src)
				if string(src) != string(srcCopy) {
					t.Fatalf("%v %v n=%d: src changed", dt, op, n)
				}
				float := dt == F32 || dt == F64 || dt == F16 || dt == BF16
				if wantCovered := !float || ((dt == F32 || dt == F64) && (op == Sum || op == Avg)); covered != wantCovered {
					t.Fatalf("%v %v: covered %v, want %v", dt, op, covered, wantCovered)
				}
				if !covered {
					if string(got) != string(dst) {
						t.Fatalf("%v %v n=%d: dst changed though not covered", dt, op, n)
					}
					continue
				}
				checkOntoBits(t, dt, op, got, want, dst, src, "Accumulate")
			}
		}
	}
}

// checkOntoBits fails t unless got, accumulateOnto's result (or a variant's) for the inputs dst and
// src, equals want, what the reference (named ref) gives, element by element. The exception is an
// element where both inputs are NaN past the vector kernels' prefix (all of it without them): there
// the scalar loop's operand order is the compiler's, and the sum may keep either payload.
func checkOntoBits(t *testing.T, dt DType, op Op, got, want, dst, src []byte, ref string) {
	t.Helper()
	n := len(dst) / dt.Size()
	vec := addF32OntoVec(make([]float32, n), make([]float32, n))
	if dt == F64 {
		vec = addF64OntoVec(make([]float64, n), make([]float64, n))
	}
	float := dt == F32 || dt == F64 || dt == F16 || dt == BF16
	for i := range n {
		g, w := loadBits(dt, got, i), loadBits(dt, want, i)
		bothNaN := float && refIsNaN(dt, loadBits(dt, dst, i)) && refIsNaN(dt, loadBits(dt, src, i))
		if g != w && !(bothNaN && i >= vec) {
			t.Fatalf("%v %v n=%d [%d]: %#x, %s gives %#x", dt, op, n, i, g, ref, w)
		}
	}
}

// TestAccumulateOntoSavingMatchesAccumulateOnto checks that accumulateOntoSaving stores in dst
// what accumulateOnto stores, bit for bit (NaN payloads included, except where both operands are NaN
// and accumulateOnto's scalar tail ran), copies dst's original into save wherever save starts, covers
// the same types and ops, and where it does not cover them leaves dst and save alone.
func TestAccumulateOntoSavingMatchesAccumulateOnto(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, dt := range allDTypes {
		for _, op := range allOps {
			for _, n := range []int{0, 1, 7, 15, 16, 17, 31, 32, 33, 100, 1000} {
				dst := randomElements(rng, dt, n)
				src := randomElements(rng, dt, n)
				want := append([]byte(nil), dst...)
				wantCovered := accumulateOnto(dt, op, want, src)
				got := append([]byte(nil), dst...)
				srcCopy := append([]byte(nil), src...)
				// save starts at different offsets from a 32-byte boundary: the vector kernel's
				// stores need one, and the elements before it go one by one.
				shift := rng.IntN(8) * dt.Size()
				save := randomElements(rng, dt, n+8)[shift:][:n*dt.Size()]
				saveBefore := append([]byte(nil), save...)
				covered := accumulateOntoSaving(dt, op, got, src, save)
				switch {
				case string(src) != string(srcCopy):
					t.Fatalf("%v %v n=%d: src changed", dt, op, n)
				case covered != wantCovered:
					t.Fatalf("%v %v: covered %v, accumulateOnto's %v", dt, op, covered, wantCovered)
				case !covered && (string(got) != string(dst) || string(save) != string(saveBefore)):
					t.Fatalf("%v %v n=%d: dst or save changed though not covered", dt, op, n)
				case !covered:
					continue
				case string(save) != string(dst):
					t.Fatalf("%v %v n=%d: save is not dst's original", dt, op, n)
				}
				checkOntoBits(t, dt, op, got, want, dst, src, "accumulateOnto")
			}
		}
	}
}

// TestAccumulateIntoMatchesCopyAndAccumulate checks that AccumulateInto(dst, own, in) stores what
// copy(dst, own) and Accumulate(dst, in) store, bit for bit (NaN payloads included), for every type,
// op and length, and leaves own and in alone.
func TestAccumulateIntoMatchesCopyAndAccumulate(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, dt := range allDTypes {
		for _, op := range allOps {
			for _, n := range []int{0, 1, 7, 15, 16, 17, 31, 32, 33, 100, 1000} {
				own := randomElements(rng, dt, n)
				in := randomElements(rng, dt, n)
				want := append([]byte(nil), own...)
				Accumulate(dt, op, want, in)
				ownCopy, inCopy := append([]byte(nil), own...), append([]byte(nil), in...)
				got := randomElements(rng, dt, n)
				AccumulateInto(dt, op, got, own, in)
				if string(own) != string(ownCopy) || string(in) != string(inCopy) {
					t.Fatalf("%v %v n=%d: an operand changed", dt, op, n)
				}
				if string(got) != string(want) {
					t.Fatalf("%v %v n=%d: AccumulateInto differs from copy and Accumulate", dt, op, n)
				}
			}
		}
	}
}

// TestAccumulateOntoNaNOrder checks the operand order where it shows: when both operands are NaN,
// the sum keeps the payload of the first operand, which for accumulateOnto(dst, src) is src's, as
// Accumulate(src, dst) keeps src's.
func TestAccumulateOntoNaNOrder(t *testing.T) {
	const n = 64
	d32, s32 := make([]float32, n), make([]float32, n)
	d64, s64 := make([]float64, n), make([]float64, n)
	for i := range n {
		d32[i], s32[i] = math.Float32frombits(0x7fc00001), math.Float32frombits(0xffc00002)
		d64[i], s64[i] = math.Float64frombits(0x7ff8000000000001), math.Float64frombits(0xfff8000000000002)
	}
	// accumulateOntoSaving runs every element through the vector kernel, wherever save starts.
	sv32, sv64 := make([]float32, n+1)[1:], make([]float64, n+1)[1:]
	g32, g64 := append([]float32(nil), d32...), append([]float64(nil), d64...)
	accumulateOntoSaving(F32, Sum, Bytes(g32), Bytes(s32), Bytes(sv32))
	accumulateOntoSaving(F64, Sum, Bytes(g64), Bytes(s64), Bytes(sv64))
	if addF32OntoVec(make([]float32, 32), make([]float32, 32)) > 0 { // a vector kernel ran
		for i := range n {
			if math.Float32bits(g32[i]) != 0xffc00002 || math.Float64bits(g64[i]) != 0xfff8000000000002 {
				t.Fatalf("accumulateOntoSaving [%d]: %#x, %#x; want src's payloads", i, math.Float32bits(g32[i]), math.Float64bits(g64[i]))
			}
		}
	}
	w32, w64 := append([]float32(nil), s32...), append([]float64(nil), s64...)
	Accumulate(F32, Sum, Bytes(w32), Bytes(d32))
	Accumulate(F64, Sum, Bytes(w64), Bytes(d64))
	accumulateOnto(F32, Sum, Bytes(d32), Bytes(s32))
	accumulateOnto(F64, Sum, Bytes(d64), Bytes(s64))
	vec32 := addF32OntoVec(make([]float32, n), make([]float32, n))
	vec64 := addF64OntoVec(make([]float64, n), make([]float64, n))
	for i := range vec32 {
		if math.Float32bits(d32[i]) != math.Float32bits(w32[i]) {
			t.Fatalf("float32 [%d]: %#x, Accumulate gives %#x", i, math.Float32bits(d32[i]), math.Float32bits(w32[i]))
		}
	}
	for i := range vec64 {
		if math.Float64bits(d64[i]) != math.Float64bits(w64[i]) {
			t.Fatalf("float64 [%d]: %#x, Accumulate gives %#x", i, math.Float64bits(d64[i]), math.Float64bits(w64[i]))
		}
	}
}
