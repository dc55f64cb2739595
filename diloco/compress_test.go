package diloco

import (
	"cmp"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// naiveTopK is the reference of topK on one chunk: sort the indices by magnitude, larger first,
// ties by index.
func naiveTopK(g []float32, k int) []uint32 {
	idx := make([]uint32, len(g))
	for i := range idx {
		idx[i] = uint32(i)
	}
	mag := func(i uint32) float32 { return float32(math.Abs(float64(g[i]))) }
	slices.SortStableFunc(idx, func(a, b uint32) int { return cmp.Compare(mag(b), mag(a)) })
	out := slices.Clone(idx[:min(k, len(g))])
	slices.Sort(out)
	return out
}

// randomGradient returns n values of mixed scales, with repeated values and zeros, so that ties
// fall at the cut.
func randomGradient(r *rand.Rand, n int) []float32 {
	g := make([]float32, n)
	for i := range g {
		switch r.IntN(6) {
		case 0:
			g[i] = 0
		case 1:
			g[i] = float32(r.IntN(5)-2) * 0.25 // ties
		default:
			g[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(5)-3)))
		}
	}
	return g
}

func TestTopKMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var mags []uint32
	for trial := range 300 {
		n := 1 + r.IntN(compressChunk)
		g := randomGradient(r, n)
		for _, k := range []int{1, r.IntN(n) + 1, n / 100, n - 1, n} {
			var got []uint32
			got, mags = topK(g, k, 0, nil, mags)
			if want := naiveTopK(g, k); !slices.Equal(got, want) {
				t.Fatalf("trial %d, n %d, k %d: topK = %v, want %v", trial, n, k, got, want)
			}
		}
	}
}

// TestEncodeDecode checks every encoding: the payload has PayloadBytes bytes, DecodeAdd adds exactly
// the values the encoder says it sent (and nothing elsewhere), the error of a quantized value is at
// most half its block's step, and the error feedback is the input minus what was sent, bit for bit.
func TestEncodeDecode(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range []Compression{
		{Values: Float32, TopK: 0.1}, {Values: Int8}, {Values: Int4}, {Values: Int8, TopK: 0.03}, {Values: Int4, TopK: 0.01}, {Values: Int4, TopK: 0.5},
	} {
		for trial := range 50 {
			n := 1 + r.IntN(3*compressChunk)
			g := randomGradient(r, n)
			z := compressor{c: c}
			payload := make([]byte, c.PayloadBytes(n))
			z.encode(payload, g)
			if len(z.idx) != c.Kept(n) {
				t.Fatalf("%v n %d: sent %d values, want %d", c, n, len(z.idx), c.Kept(n))
			}
			if c.sparse() {
				// Each chunk sends its own top-k.
				var want []uint32
				for lo := 0; lo < n; lo += compressChunk {
					chunk := g[lo:min(n, lo+compressChunk)]
					for _, i := range naiveTopK(chunk, c.keptIn(len(chunk))) {
						want = append(want, uint32(lo)+i)
					}
				}
				if !slices.Equal(z.idx, want) {
					t.Fatalf("%v n %d: sent indices differ from the top-k of every chunk", c, n)
				}
			}
			acc := make([]float32, n)
			if err := c.DecodeAdd(acc, payload); err != nil {
				t.Fatalf("%v n %d trial %d: %v", c, n, trial, err)
			}
			sent := map[uint32]float32{}
			for j, i := range z.idx {
				sent[i] = z.vals[j]
			}
			levels := map[ValueBits]float64{Int8: 127, Int4: 7}[c.Values]
			for i := range acc {
				v, ok := sent[uint32(i)]
				if !ok {
					v = 0
				}
				if math.Float32bits(acc[i]) != math.Float32bits(v) && !(acc[i] == 0 && v == 0) {
					t.Fatalf("%v n %d: element %d decoded %v, encoder sent %v", c, n, i, acc[i], v)
				}
			}
			for j, i := range z.idx {
				if c.Values == Float32 {
					if z.vals[j] != g[i] {
						t.Fatalf("%v: element %d sent %v, have %v", c, i, z.vals[j], g[i])
					}
					continue
				}
				blk := z.idx[j/compressBlock*compressBlock : min(len(z.idx), (j/compressBlock+1)*compressBlock)]
				var m float64
				for _, b := range blk {
					m = max(m, math.Abs(float64(g[b])))
				}
				if d := math.Abs(float64(g[i] - z.vals[j])); d > m/levels/2*1.0001 {
					t.Fatalf("%v: element %d sent %v for %v: error %v over half a step %v", c, i, z.vals[j], g[i], d, m/levels/2)
				}
			}
			e := make([]float32, n)
			z.feedback(e, g)
			for i := range e {
				want := g[i]
				if v, ok := sent[uint32(i)]; ok {
					want = g[i] - v
				}
				if math.Float32bits(e[i]) != math.Float32bits(want) {
					t.Fatalf("%v: feedback of element %d is %v, want %v", c, i, e[i], want)
				}
			}
		}
	}
}

// TestErrorFeedbackLosesNothing compresses a stream of gradients with error feedback: what was sent
// over all rounds plus the final error equals what went in, up to float32 rounding.
func TestErrorFeedbackLosesNothing(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const n, rounds = 10000, 40
	c := Compression{Values: Int4, TopK: 0.02}
	z := compressor{c: c}
	e := make([]float32, n)
	in := make([]float64, n)
	out := make([]float64, n)
	payload := make([]byte, c.PayloadBytes(n))
	for range rounds {
		g := randomGradient(r, n)
		for i := range g {
			in[i] += float64(g[i])
			g[i] += e[i]
		}
		z.encode(payload, g)
		acc := make([]float32, n)
		if err := c.DecodeAdd(acc, payload); err != nil {
			t.Fatal(err)
		}
		for i, v := range acc {
			out[i] += float64(v)
		}
		z.feedback(e, g)
	}
	for i := range in {
		if d := math.Abs(in[i] - out[i] - float64(e[i])); d > 1e-3 {
			t.Fatalf("element %d: in %v, out %v, error %v: %v lost", i, in[i], out[i], e[i], d)
		}
	}
}

func TestDecodeAddRejects(t *testing.T) {
	const n = 1000
	g := randomGradient(rand.New(rand.NewPCG(7, 8)), n)
	for _, c := range []Compression{{Values: Int4, TopK: 0.05}, {Values: Int8}, {Values: Float32, TopK: 0.01}} {
		z := compressor{c: c}
		good := make([]byte, c.PayloadBytes(n))
		z.encode(good, g)
		bad := map[string][]byte{"short": good[:len(good)-1], "long": append(slices.Clone(good), 0)}
		if c.Values != Float32 {
			b := slices.Clone(good)
			b[3] = 0xff // the first scale's sign and exponent: NaN
			bad["scale"] = b
		}
		if c.sparse() {
			off := 0
			if c.Values != Float32 {
				off = 4 * blocks(c.Kept(n))
			}
			b := slices.Clone(good)
			putOffset(b[off:], 0, 1000) // offset 1000 of 1000
			bad["index range"] = b
			b = slices.Clone(good)
			putOffset(b[off:], 1, uint16(offset(b[off:], 0))) // the second offset equals the first
			bad["index order"] = b
		}
		for name, p := range bad {
			acc := make([]float32, n)
			if err := c.DecodeAdd(acc, p); !errors.Is(err, ErrMalformedPayload) {
				t.Fatalf("%v %s: %v, want ErrMalformedPayload", c, name, err)
			}
			if slices.ContainsFunc(acc, func(v float32) bool { return v != 0 }) {
				t.Fatalf("%v %s: acc changed", c, name)
			}
		}
	}
}

func TestOffsets(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, k := range []int{1, 2, 3, 10, 101} {
		want := make([]uint16, k)
		b := make([]byte, offsetBytes(k))
		for j := range want {
			want[j] = uint16(r.IntN(compressChunk))
			putOffset(b, j, want[j])
		}
		for j, o := range want {
			if got := offset(b, j); got != int(o) {
				t.Fatalf("k %d: offset %d reads %d, wrote %d", k, j, got, o)
			}
		}
	}
}

func TestCompressionValidate(t *testing.T) {
	for _, c := range []Compression{{Values: 9}, {TopK: -0.1}, {TopK: 1.5}, {TopK: math.NaN()}} {
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Fatalf("%+v: %v, want ErrBadConfig", c, err)
		}
	}
	if b, err := ParseValueBits("int4"); err != nil || b != Int4 {
		t.Fatalf("ParseValueBits(int4) = %v, %v", b, err)
	}
	if _, err := ParseValueBits("int3"); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("ParseValueBits(int3): %v", err)
	}
}

func FuzzDecodeAdd(f *testing.F) {
	g := randomGradient(rand.New(rand.NewPCG(9, 10)), 300)
	for _, c := range []Compression{{Values: Int4, TopK: 0.05}, {Values: Int8, TopK: 0.1}, {Values: Float32, TopK: 0.02}, {Values: Int4}} {
		z := compressor{c: c}
		p := make([]byte, c.PayloadBytes(len(g)))
		z.encode(p, g)
		f.Add(uint8(c.Values), c.TopK, uint16(len(g)), p)
	}
	f.Fuzz(func(t *testing.T, values uint8, topk float64, n uint16, payload []byte) {
		c := Compression{Values: ValueBits(values % 3), TopK: topk}
		if c.Validate() != nil {
			return
		}
		acc := make([]float32, n)
		if err := c.DecodeAdd(acc, payload); err != nil {
			if !errors.Is(err, ErrMalformedPayload) {
				t.Fatalf("error %v does not wrap ErrMalformedPayload", err)
			}
			if slices.ContainsFunc(acc, func(v float32) bool { return v != 0 }) {
				t.Fatal("acc changed by a rejected payload")
			}
		}
	})
}

// BenchmarkEncode measures the encoding of a fragment of 16M elements (a quarter of a 256 MiB model)
// as int4 values of the top 3% of every chunk.
func BenchmarkEncode(b *testing.B) {
	const n = 16 << 20
	g := randomGradient(rand.New(rand.NewPCG(11, 12)), n)
	z := compressor{c: Compression{Values: Int4, TopK: 0.03}}
	dst := make([]byte, z.c.PayloadBytes(n))
	b.SetBytes(4 * n)
	for b.Loop() {
		z.encode(dst, g)
	}
}
