package diloco

import (
	"errors"
	"math"
	"slices"
	"testing"
)

// randVec returns n values uniform in ±scale.
func randVec(r *rng, n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = r.uniform(scale)
	}
	return v
}

// close32 reports whether got is within rel of want, relative to the larger
// of |want| and floor.
func close32(got float32, want, rel, floor float64) bool {
	return math.Abs(float64(got)-want) <= rel*math.Max(math.Abs(want), floor)
}

func TestAdamWMatchesReference(t *testing.T) {
	r := newRNG(21)
	const n, steps = 1001, 30
	cfg := AdamWConfig{LR: 0.01, Beta1: 0.8, Beta2: 0.99, Eps: 1e-6, WeightDecay: 0.1}
	opt := NewAdamW(cfg, n)
	p := randVec(r, n, 1)
	// The reference: the textbook algorithm, in float64.
	rp := make([]float64, n)
	rm := make([]float64, n)
	rv := make([]float64, n)
	for i, v := range p {
		rp[i] = float64(v)
	}
	lr, b1, b2, eps, wd := float64(cfg.LR), float64(cfg.Beta1), float64(cfg.Beta2), float64(cfg.Eps), float64(cfg.WeightDecay)
	for step := 1; step <= steps; step++ {
		g := randVec(r, n, 2)
		opt.Step(p, g)
		for i := range rp {
			gi := float64(g[i])
			rp[i] -= lr * wd * rp[i]
			rm[i] = b1*rm[i] + (1-b1)*gi
			rv[i] = b2*rv[i] + (1-b2)*gi*gi
			mhat := rm[i] / (1 - math.Pow(b1, float64(step)))
			vhat := rv[i] / (1 - math.Pow(b2, float64(step)))
			rp[i] -= lr * mhat / (math.Sqrt(vhat) + eps)
		}
	}
	if opt.Steps() != steps {
		t.Fatalf("Steps() = %d", opt.Steps())
	}
	m, v := opt.M(), opt.V()
	for i := range n {
		if !close32(p[i], rp[i], 1e-5, 1) || !close32(m[i], rm[i], 1e-4, 1e-2) || !close32(v[i], rv[i], 1e-4, 1e-2) {
			t.Fatalf("element %d: p %v m %v v %v, reference %v %v %v", i, p[i], m[i], v[i], rp[i], rm[i], rv[i])
		}
	}
}

func TestAdamWStateIsTheWholeState(t *testing.T) {
	// An optimiser rebuilt from a copy of State continues bit for bit.
	r := newRNG(5)
	const n = 64
	a := NewAdamW(AdamWConfig{WeightDecay: 0.05}, n)
	p := randVec(r, n, 1)
	for range 3 {
		a.Step(p, randVec(r, n, 1))
	}
	b := NewAdamW(AdamWConfig{WeightDecay: 0.05}, n)
	copy(b.State, a.State)
	q := slices.Clone(p)
	g := randVec(r, n, 1)
	a.Step(p, g)
	b.Step(q, g)
	if !slices.Equal(paramBytes(p), paramBytes(q)) || !slices.Equal(paramBytes(a.State), paramBytes(b.State)) {
		t.Fatal("restored optimiser diverges")
	}
	a.Reset()
	if a.Steps() != 0 || slices.ContainsFunc(a.State, func(v float32) bool { return v != 0 }) {
		t.Fatal("Reset left state behind")
	}
}

func TestNesterovMatchesReference(t *testing.T) {
	r := newRNG(8)
	const n, steps = 777, 20
	o := NewNesterov(NesterovConfig{}, n)
	if o.Config.LR != 0.7 || o.Config.Momentum != 0.9 {
		t.Fatalf("defaults %+v", o.Config)
	}
	p := randVec(r, n, 1)
	rp := make([]float64, n)
	rb := make([]float64, n)
	for i, v := range p {
		rp[i] = float64(v)
	}
	for range steps {
		g := randVec(r, n, 0.1)
		o.Step(p, g)
		for i := range rp {
			gi := float64(g[i])
			rb[i] = 0.9*rb[i] + gi
			rp[i] -= 0.7 * (gi + 0.9*rb[i])
		}
	}
	for i := range n {
		if !close32(p[i], rp[i], 1e-5, 1) || !close32(o.State[i], rb[i], 1e-5, 1) {
			t.Fatalf("element %d: p %v buf %v, reference %v %v", i, p[i], o.State[i], rp[i], rb[i])
		}
	}
}

func TestNesterovOneStepExact(t *testing.T) {
	// With a zero buffer: buf = g, p -= lr*(g + mu*g). Values chosen so
	// that every operation is exact.
	o := NewNesterov(NesterovConfig{LR: 0.5, Momentum: 0.5}, 3)
	p := []float32{1, 2, 3}
	o.Step(p, []float32{2, -4, 0})
	if want := []float32{-0.5, 5, 3}; !slices.Equal(p, want) {
		t.Fatalf("params %v, want %v", p, want)
	}
	if want := []float32{2, -4, 0}; !slices.Equal(o.State, want) {
		t.Fatalf("buffer %v, want %v", o.State, want)
	}
}

func TestPseudoGradient(t *testing.T) {
	before := []float32{1, 2, 3}
	after := []float32{0.5, 2, 4}
	dst := make([]float32, 3)
	PseudoGradient(dst, before, after)
	if want := []float32{0.5, 0, -1}; !slices.Equal(dst, want) {
		t.Fatalf("got %v, want %v", dst, want)
	}
	PseudoGradient(before, before, after) // in place
	if !slices.Equal(before, dst) {
		t.Fatalf("in place: %v", before)
	}
}

func TestConfigValidate(t *testing.T) {
	nan := float32(math.NaN())
	for name, err := range map[string]error{
		"zero AdamW":     AdamWConfig{}.Validate(),
		"zero Nesterov":  NesterovConfig{}.Validate(),
		"zero local":     LocalConfig{}.Validate(),
		"explicit AdamW": AdamWConfig{LR: 0.1, Beta1: 0.5, Beta2: 0.5, Eps: 1, WeightDecay: 1}.Validate(),
	} {
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, err := range map[string]error{
		"lr":          AdamWConfig{LR: -1}.Validate(),
		"lr nan":      AdamWConfig{LR: nan}.Validate(),
		"beta1":       AdamWConfig{Beta1: 1}.Validate(),
		"beta2":       AdamWConfig{Beta2: -0.1}.Validate(),
		"eps":         AdamWConfig{Eps: -1}.Validate(),
		"decay":       AdamWConfig{WeightDecay: -1}.Validate(),
		"outer lr":    NesterovConfig{LR: float32(math.Inf(1))}.Validate(),
		"momentum":    NesterovConfig{Momentum: 1.5}.Validate(),
		"steps":       LocalConfig{Steps: -1}.Validate(),
		"batch":       LocalConfig{BatchSize: -2}.Validate(),
		"local adamw": LocalConfig{AdamW: AdamWConfig{Beta1: 2}}.Validate(),
	} {
		if !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: got %v, want ErrBadConfig", name, err)
		}
	}
}

// TestNesterovStepMean checks that StepMean gives the same bits as dividing the sum first and
// calling Step, which is what the peers of a run must agree on.
func TestNesterovStepMean(t *testing.T) {
	r := newRNG(9)
	const n = 1001
	a, b := NewNesterov(NesterovConfig{}, n), NewNesterov(NesterovConfig{}, n)
	pa := randVec(r, n, 1)
	pb := slices.Clone(pa)
	for range 10 {
		sum := randVec(r, n, 0.3)
		mean := make([]float32, n)
		for i, s := range sum {
			mean[i] = s / 3
		}
		a.Step(pa, mean)
		b.StepMean(pb, sum, 3)
	}
	if !slices.Equal(pa, pb) || !slices.Equal(a.State, b.State) {
		t.Fatal("StepMean differs from Step of the mean")
	}
}
