package rings

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// specials are values whose sums exercise every IEEE 754 corner: signed zeros, subnormals, the
// largest finite values, infinities and NaNs with distinct payloads.
var specials32 = []float32{0, float32(math.Copysign(0, -1)), 1, -1, math.MaxFloat32, -math.MaxFloat32,
	math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, float32(math.Inf(1)), float32(math.Inf(-1)),
	math.Float32frombits(0x7fc00001), math.Float32frombits(0xffc12345), math.Float32frombits(0x7f800001)}

var specials64 = []float64{0, math.Copysign(0, -1), 1, -1, math.MaxFloat64, -math.MaxFloat64,
	math.SmallestNonzeroFloat64, math.Inf(1), math.Inf(-1),
	math.Float64frombits(0x7ff8000000000001), math.Float64frombits(0xfff8123456789abc), math.Float64frombits(0x7ff0000000000001)}

// TestAddFloatMatchesScalar checks that the vector kernel (where the machine has one) gives what the
// scalar loop gives, for every length up to a few vector rounds, at unaligned offsets,
// with special values mixed in.
func TestAddFloatMatchesScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n <= 200; n++ {
		for off := range 3 {
			d32, s32 := make([]float32, n+off), make([]float32, n+off)
			d64, s64 := make([]float64, n+off), make([]float64, n+off)
			for i := range d32 {
				d32[i], s32[i] = float32(rng.NormFloat64()*1e3), float32(rng.NormFloat64())
				d64[i], s64[i] = rng.NormFloat64()*1e300, rng.NormFloat64()*1e300
				if rng.IntN(4) == 0 {
					d32[i] = specials32[rng.IntN(len(specials32))]
					d64[i] = specials64[rng.IntN(len(specials64))]
				}
				if rng.IntN(4) == 0 {
					s32[i] = specials32[rng.IntN(len(specials32))]
					s64[i] = specials64[rng.IntN(len(specials64))]
				}
			}
			w32, w64 := append([]float32(nil), d32[off:]...), append([]float64(nil), d64[off:]...)
			addSlice(w32, s32[off:])
			addSlice(w64, s64[off:])
			addFloat(d32[off:], s32[off:])
			addFloat(d64[off:], s64[off:])
			// Equal bits, except that when both operands are NaN either payload may come out: Go's
			// compiler orders the operands of the scalar addition as it likes (it differs with -race).
			for i := range w32 {
				if math.Float32bits(d32[off+i]) != math.Float32bits(w32[i]) && !(d32[off+i] != d32[off+i] && w32[i] != w32[i]) {
					t.Fatalf("float32 n=%d off=%d element %d: vector %#x, scalar %#x", n, off, i, math.Float32bits(d32[off+i]), math.Float32bits(w32[i]))
				}
				if math.Float64bits(d64[off+i]) != math.Float64bits(w64[i]) && !(math.IsNaN(d64[off+i]) && math.IsNaN(w64[i])) {
					t.Fatalf("float64 n=%d off=%d element %d: vector %#x, scalar %#x", n, off, i, math.Float64bits(d64[off+i]), math.Float64bits(w64[i]))
				}
			}
		}
	}
}

func BenchmarkAddF32(b *testing.B) {
	for _, n := range []int{1 << 18, 1 << 24} { // 1 MiB (cache) and 64 MiB (memory)
		d, s := make([]float32, n), make([]float32, n)
		b.Run(fmt.Sprintf("vector/%dKiB", n>>8), func(b *testing.B) {
			b.SetBytes(int64(4 * n))
			for b.Loop() {
				addFloat(d, s)
			}
		})
		b.Run(fmt.Sprintf("scalar/%dKiB", n>>8), func(b *testing.B) {
			b.SetBytes(int64(4 * n))
			for b.Loop() {
				addSlice(d, s)
			}
		})
	}
}
