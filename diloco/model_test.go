package diloco

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"slices"
	"testing"
)

// paramBytes returns the little-endian bytes of p.
func paramBytes(p []float32) []byte {
	b := make([]byte, 4*len(p))
	for i, v := range p {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// refLoss is a naive float64 forward pass: the mean cross-entropy of the
// batch (x, y) under params.
func refLoss(params []float64, x []float32, y []uint8) float64 {
	var total float64
	h := make([]float64, Hidden)
	for b := range y {
		xb := x[b*InputSize : (b+1)*InputSize]
		for j := range Hidden {
			s := params[OffB1+j]
			for i, v := range xb {
				s += params[OffW1+j*InputSize+i] * float64(v)
			}
			h[j] = math.Max(s, 0)
		}
		var z [NumClasses]float64
		mx := math.Inf(-1)
		for k := range NumClasses {
			s := params[OffB2+k]
			for j := range Hidden {
				s += params[OffW2+k*Hidden+j] * h[j]
			}
			z[k] = s
			mx = math.Max(mx, s)
		}
		var sum float64
		for _, v := range z {
			sum += math.Exp(v - mx)
		}
		total += math.Log(sum) + mx - z[y[b]]
	}
	return total / float64(len(y))
}

func TestGradientMatchesFiniteDifferences(t *testing.T) {
	train, _, err := LoadEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	m := NewMLP(3)
	// Non-zero biases so that their gradients are exercised too.
	r := newRNG(99)
	for i := OffB1; i < OffW2; i++ {
		m.Params[i] = r.uniform(0.05)
	}
	for i := OffB2; i < NumParams; i++ {
		m.Params[i] = r.uniform(0.05)
	}
	x, y := train.Batch([]int{0, 4321, 9999}, make([]float32, n*InputSize), make([]uint8, n))
	grads := make([]float32, NumParams)
	loss := m.LossGrad(x, y, grads)

	p64 := make([]float64, NumParams)
	for i, v := range m.Params {
		p64[i] = float64(v)
	}
	if ref := refLoss(p64, x, y); math.Abs(ref-float64(loss)) > 1e-5*math.Abs(ref) {
		t.Fatalf("loss %v, reference %v", loss, ref)
	}
	// Check every bias, and weights drawn at random plus those with the
	// largest gradients.
	idx := []int{}
	for i := OffB1; i < OffW2; i += 5 {
		idx = append(idx, i)
	}
	for i := OffB2; i < NumParams; i++ {
		idx = append(idx, i)
	}
	for range 40 {
		idx = append(idx, OffW1+int(r.below(OffB1-OffW1)), OffW2+int(r.below(OffB2-OffW2)))
	}
	big := 0
	for i := OffW1; i < OffB1 && big < 40; i += 997 {
		if grads[i] != 0 {
			idx = append(idx, i)
			big++
		}
	}
	const h = 1e-6
	for _, i := range idx {
		saved := p64[i]
		p64[i] = saved + h
		up := refLoss(p64, x, y)
		p64[i] = saved - h
		down := refLoss(p64, x, y)
		p64[i] = saved
		fd := (up - down) / (2 * h)
		if diff := math.Abs(fd - float64(grads[i])); diff > 1e-4*math.Abs(fd)+2e-6 {
			t.Errorf("param %d: gradient %v, finite difference %v", i, grads[i], fd)
		}
	}
}

func TestBackwardOverwritesGradients(t *testing.T) {
	train, _, err := LoadEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	m := NewMLP(1)
	clean := make([]float32, NumParams)
	dirty := make([]float32, NumParams)
	for i := range dirty {
		dirty[i] = 123
	}
	m.LossGrad(train.X[:4*InputSize], train.Y[:4], clean)
	m.LossGrad(train.X[:4*InputSize], train.Y[:4], dirty)
	if !slices.Equal(paramBytes(clean), paramBytes(dirty)) {
		t.Fatal("stale gradient values survive Backward")
	}
}

func TestForwardIsPerSample(t *testing.T) {
	train, _, err := LoadEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	m := NewMLP(5)
	all := slices.Clone(m.Forward(train.X, 7))
	for b := range 7 {
		one := m.Forward(train.X[b*InputSize:], 1)
		if !slices.Equal(paramBytes(one), paramBytes(all[b*NumClasses:(b+1)*NumClasses])) {
			t.Fatalf("sample %d: logits alone %v, in batch %v", b, one, all[b*NumClasses:(b+1)*NumClasses])
		}
	}
}

func TestKernelsAgree(t *testing.T) {
	r := newRNG(11)
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = r.uniform(3)
		}
		return v
	}
	w, a, b := vec(InputSize), vec(InputSize), vec(InputSize)
	s0, s1 := dot2(w, a, b)
	if s0 != dot(w, a) || s1 != dot(w, b) {
		t.Fatalf("dot2 = %v %v, dot = %v %v", s0, s1, dot(w, a), dot(w, b))
	}
	// dot sums four lanes then combines them pairwise.
	var l [4]float32
	for i := range w {
		l[i%4] += float32(w[i] * a[i])
	}
	if want := (l[0] + l[1]) + (l[2] + l[3]); dot(w, a) != want {
		t.Fatalf("dot = %v, lanes give %v", dot(w, a), want)
	}
	y1, y2 := vec(Hidden), vec(Hidden)
	copy(y2, y1)
	axpy(y1, 0.5, a)
	axpy(y1, -1.25, b)
	axpy2(y2, 0.5, a, -1.25, b)
	if !slices.Equal(y1, y2) {
		t.Fatal("axpy2 differs from two axpy calls")
	}
}

func TestExpLog(t *testing.T) {
	r := newRNG(3)
	for range 100000 {
		x := -float64(r.next()>>11) / (1 << 53) * 800
		got, want := expDet(x), math.Exp(x)
		if math.Abs(got-want) > 4e-16*want && !(want < 1e-300 && math.Abs(got-want) < 1e-320) {
			t.Fatalf("expDet(%v) = %v, want %v", x, got, want)
		}
		y := math.Ldexp(float64(r.next()>>11)/(1<<53)+0.5, int(r.below(200))-100)
		if got, want := logDet(y), math.Log(y); math.Abs(got-want) > 4e-16*math.Max(1, math.Abs(want)) {
			t.Fatalf("logDet(%v) = %v, want %v", y, got, want)
		}
	}
	for _, c := range [][2]float64{{0, 1}, {-800, 0}, {-math.Ln2, 0.5}} {
		if got := expDet(c[0]); got != c[1] {
			t.Errorf("expDet(%v) = %v, want %v", c[0], got, c[1])
		}
	}
	for _, c := range [][2]float64{{1, 0}, {2, math.Ln2}, {0, math.Inf(-1)}} {
		if got := logDet(c[0]); got != c[1] {
			t.Errorf("logDet(%v) = %v, want %v", c[0], got, c[1])
		}
	}
	// The smallest subnormal is 2^-1074. (math.Log on amd64 gets this one
	// wrong, which is one more reason not to use it.)
	if got := logDet(5e-324); math.Abs(got-(-1074*math.Ln2)) > 1e-12 {
		t.Errorf("logDet of the smallest subnormal = %v", got)
	}
}

func TestInitIsDeterministic(t *testing.T) {
	a, b, c := NewMLP(7), NewMLP(7), NewMLP(8)
	if !slices.Equal(paramBytes(a.Params), paramBytes(b.Params)) {
		t.Fatal("same seed, different parameters")
	}
	if slices.Equal(a.Params, c.Params) {
		t.Fatal("different seeds, same parameters")
	}
	for i, v := range a.Params {
		lim := float32(0)
		switch {
		case i < OffB1:
			lim = 0.0875
		case i >= OffW2 && i < OffB2:
			lim = 0.1502
		}
		if v < -lim || v > lim {
			t.Fatalf("param %d = %v outside ±%v", i, v, lim)
		}
	}
	if a.W1()[0] != a.Params[OffW1] || &a.B1()[0] != &a.Params[OffB1] || &a.W2()[0] != &a.Params[OffW2] || len(a.B2()) != NumClasses {
		t.Fatal("views do not alias the parameter vector")
	}
}

// goldenTrainHash is the SHA-256 of the parameter bytes after the short run
// in TestTrainingIsBitReproducible. It must be the same on every machine,
// architecture and GOAMD64 level; a change means the numerics changed.
const goldenTrainHash = "973a3419e1e2c69d4bee26b4539955bfc52cb3dd21f6fde1694d974fa5a032a8"

func TestTrainingIsBitReproducible(t *testing.T) {
	train, test, err := LoadEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	cfg := LocalConfig{Seed: 2, Steps: 6, BatchSize: 17, AdamW: AdamWConfig{WeightDecay: 0.01}}
	small := &Dataset{X: test.X[:50*InputSize], Y: test.Y[:50], N: 50}
	r1 := TrainLocal(cfg, train, small)
	r2 := TrainLocal(cfg, train, small)
	b1, b2 := paramBytes(r1.Params), paramBytes(r2.Params)
	if !slices.Equal(b1, b2) || !slices.Equal(r1.Losses, r2.Losses) || r1.TestLoss != r2.TestLoss {
		t.Fatal("two runs with the same seed differ")
	}
	sum := sha256.Sum256(b1)
	if got := hex.EncodeToString(sum[:]); got != goldenTrainHash {
		t.Fatalf("parameter hash %s, want %s", got, goldenTrainHash)
	}
}
