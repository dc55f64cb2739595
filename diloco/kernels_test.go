package diloco

import (
	"math"
	"slices"
	"testing"
)

// oddVec returns n values of mixed magnitude, including zeros, negative
// zeros, subnormals and large values, so that the kernels are compared on
// the roundings that matter.
func oddVec(r *rng, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		switch r.below(10) {
		case 0:
			v[i] = 0
		case 1:
			v[i] = float32(math.Copysign(0, -1))
		case 2:
			v[i] = math.Float32frombits(uint32(r.below(1 << 23))) // subnormal
		case 3:
			v[i] = r.uniform(1e30)
		default:
			v[i] = r.uniform(2)
		}
	}
	return v
}

// floatBits returns the bit patterns of v, so that comparisons see the sign of
// zero.
func floatBits(v []float32) []uint32 {
	b := make([]uint32, len(v))
	for i, f := range v {
		b[i] = math.Float32bits(f)
	}
	return b
}

func TestDot4MatchesGeneric(t *testing.T) {
	r := newRNG(31)
	for _, n := range []int{0, 4, 8, 784} {
		for _, stride := range []int{n, n + 4, n + 3} {
			w := oddVec(r, n)
			x := oddVec(r, 3*stride+n)
			var got, want [16]float32
			dot4(w, x, stride, &got)
			dot4Generic(w, x, stride, &want)
			if !slices.Equal(floatBits(got[:]), floatBits(want[:])) {
				t.Fatalf("n=%d stride=%d: %v, want %v", n, stride, got, want)
			}
			for b := range 4 {
				if n > 0 && sum4(got[4*b:]) != dot(w, x[b*stride:b*stride+n]) && !math.IsNaN(float64(sum4(got[4*b:]))) {
					t.Fatalf("n=%d sample %d: lanes sum to %v, dot gives %v", n, b, sum4(got[4*b:]), dot(w, x[b*stride:]))
				}
			}
		}
	}
}

func TestAxpy4MatchesGeneric(t *testing.T) {
	r := newRNG(32)
	for _, n := range []int{0, 4, 12, 784} {
		y := oddVec(r, n)
		y2 := slices.Clone(y)
		y3 := slices.Clone(y)
		xs := [4][]float32{oddVec(r, n), oddVec(r, n+5), oddVec(r, n), oddVec(r, n)}
		a := [4]float32{0.5, -3, 1e-20, 7}
		axpy4(y, &a, xs[0], xs[1], xs[2], xs[3])
		axpy4Generic(y2, &a, xs[0], xs[1], xs[2], xs[3])
		for k := range 4 {
			axpy(y3, a[k], xs[k])
		}
		if !slices.Equal(floatBits(y), floatBits(y2)) || !slices.Equal(floatBits(y), floatBits(y3)) {
			t.Fatalf("n=%d: axpy4, generic and four axpy calls differ", n)
		}
	}
}

func TestAdamUpdateMatchesGeneric(t *testing.T) {
	r := newRNG(33)
	for _, n := range []int{0, 1, 3, 4, 7, 1025} {
		k := adamConsts{b1: 0.9, ob1: 0.1, b2: 0.999, ob2: 1 - float32(0.999), invBc2: 3.7, eps: 1e-8, decay: 0.99999, stepSize: 0.01}
		p, g := oddVec(r, n), oddVec(r, n)
		m, v := randVec(r, n, 1), randVec(r, n, 1)
		for i := range v {
			v[i] = float32(math.Abs(float64(v[i])))
		}
		p2, m2, v2 := slices.Clone(p), slices.Clone(m), slices.Clone(v)
		adamUpdate(p, g, m, v, &k)
		adamUpdateGeneric(p2, g, m2, v2, &k)
		if !slices.Equal(floatBits(p), floatBits(p2)) || !slices.Equal(floatBits(m), floatBits(m2)) || !slices.Equal(floatBits(v), floatBits(v2)) {
			t.Fatalf("n=%d: adamUpdate differs from the portable code", n)
		}
	}
}
