package diloco

import (
	"errors"
	"fmt"
	"math"
)

// ErrBadConfig is returned (wrapped, naming the field) by the Validate
// methods of the configurations in this package.
var ErrBadConfig = errors.New("diloco: bad config")

// AdamWConfig holds the hyper-parameters of AdamW. The zero value selects
// the defaults; a field left at zero takes its default.
type AdamWConfig struct {
	// LR is the learning rate. Default 1e-3.
	LR float32
	// Beta1 is the decay rate of the first moment estimate, in [0, 1).
	// Default 0.9.
	Beta1 float32
	// Beta2 is the decay rate of the second moment estimate, in [0, 1).
	// Default 0.999.
	Beta2 float32
	// Eps is added to the root of the second moment. Default 1e-8.
	Eps float32
	// WeightDecay is the decoupled weight decay coefficient: each step
	// multiplies the parameters by 1 - LR*WeightDecay. Default 0 (none).
	WeightDecay float32
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c AdamWConfig) withDefaults() AdamWConfig {
	if c.LR == 0 {
		c.LR = 1e-3
	}
	if c.Beta1 == 0 {
		c.Beta1 = 0.9
	}
	if c.Beta2 == 0 {
		c.Beta2 = 0.999
	}
	if c.Eps == 0 {
		c.Eps = 1e-8
	}
	return c
}

// Validate reports the first field of c (after defaults) that is out of
// range, wrapping ErrBadConfig.
func (c AdamWConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case !(c.LR > 0) || math.IsInf(float64(c.LR), 0):
		return fmt.Errorf("%w: AdamWConfig.LR %v must be positive and finite", ErrBadConfig, c.LR)
	case !(c.Beta1 >= 0 && c.Beta1 < 1):
		return fmt.Errorf("%w: AdamWConfig.Beta1 %v must be in [0, 1)", ErrBadConfig, c.Beta1)
	case !(c.Beta2 >= 0 && c.Beta2 < 1):
		return fmt.Errorf("%w: AdamWConfig.Beta2 %v must be in [0, 1)", ErrBadConfig, c.Beta2)
	case !(c.Eps > 0) || math.IsInf(float64(c.Eps), 0):
		return fmt.Errorf("%w: AdamWConfig.Eps %v must be positive and finite", ErrBadConfig, c.Eps)
	case !(c.WeightDecay >= 0) || math.IsInf(float64(c.WeightDecay), 0):
		return fmt.Errorf("%w: AdamWConfig.WeightDecay %v must be non-negative and finite", ErrBadConfig, c.WeightDecay)
	}
	return nil
}

// AdamW is the Adam optimiser with decoupled weight decay (Loshchilov and
// Hutter), for a parameter vector of fixed length n. All of its state lives
// in one contiguous vector, State, so that it can be shared, hashed and
// transferred as one tensor. An AdamW is not safe for concurrent use.
//
// One step t (counted from 1) does, for every element, with g the gradient:
//
//	p = p * (1 - lr*wd)
//	m = beta1*m + (1-beta1)*g
//	v = beta2*v + (1-beta2)*g*g
//	p = p - (lr/(1-beta1^t)) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
//
// in float32 with every product rounded before it is added. The scalars that
// depend on t only are computed in float64 from basic operations and then
// rounded, so the result is the same on every machine.
type AdamW struct {
	// Config is the configuration with defaults filled in. It may be changed
	// between steps (a learning-rate schedule, for instance).
	Config AdamWConfig
	// State holds 2n+1 float32s: the first moments m (n), the second
	// moments v (n) and the number of steps taken so far (1, an integer
	// stored exactly up to 2^24 steps). The zero vector is the state before
	// the first step.
	State []float32
	n     int
}

// NewAdamW returns an AdamW for n parameters with zeroed state. cfg's zero
// fields take their defaults; call cfg.Validate first to reject bad values.
func NewAdamW(cfg AdamWConfig, n int) *AdamW {
	return &AdamW{Config: cfg.withDefaults(), State: make([]float32, 2*n+1), n: n}
}

// M returns the view of the first moments, aliasing State.
func (a *AdamW) M() []float32 { return a.State[:a.n:a.n] }

// V returns the view of the second moments, aliasing State.
func (a *AdamW) V() []float32 { return a.State[a.n : 2*a.n : 2*a.n] }

// Steps returns the number of steps taken so far, as recorded in State.
func (a *AdamW) Steps() uint64 { return uint64(a.State[2*a.n]) }

// Reset zeroes the state, as before the first step.
func (a *AdamW) Reset() { clear(a.State) }

// Step applies one update to params using grads; both must have the length
// n given to NewAdamW.
func (a *AdamW) Step(params, grads []float32) {
	n := a.n
	if len(params) != n || len(grads) != n || len(a.State) != 2*n+1 {
		panic(fmt.Sprintf("diloco: AdamW step with %d params, %d grads, %d state for n=%d", len(params), len(grads), len(a.State), n))
	}
	c := a.Config
	t := a.Steps() + 1
	if t < 1<<24 {
		a.State[2*n] = float32(t)
	}
	bc1 := 1 - powInt(float64(c.Beta1), t)
	bc2 := 1 - powInt(float64(c.Beta2), t)
	stepSize := float32(float64(c.LR) / bc1)
	invBc2 := float32(1 / math.Sqrt(bc2))
	decay := 1 - float32(c.LR*c.WeightDecay)
	k := adamConsts{
		b1: c.Beta1, ob1: 1 - c.Beta1, b2: c.Beta2, ob2: 1 - c.Beta2,
		invBc2: invBc2, eps: c.Eps, decay: decay, stepSize: stepSize,
	}
	adamUpdate(params[:n:n], grads[:n:n], a.State[:n:n], a.State[n:2*n:2*n], &k)
}

// adamConsts holds the scalars of one AdamW step, in the order the
// assembly version reads them.
type adamConsts struct {
	b1, ob1, b2, ob2, invBc2, eps, decay, stepSize float32
}

// adamUpdateGeneric updates the parameters p and the moments m and v with
// the gradient g, element by element; all four have the same length.
func adamUpdateGeneric(p, g, m, v []float32, k *adamConsts) {
	n := len(p)
	g, m, v = g[:n], m[:n], v[:n]
	for i, gi := range g {
		mi := float32(k.b1*m[i]) + float32(k.ob1*gi)
		vi := float32(k.b2*v[i]) + float32(float32(k.ob2*gi)*gi)
		m[i] = mi
		v[i] = vi
		denom := float32(sqrt32(vi)*k.invBc2) + k.eps
		p[i] = float32(p[i]*k.decay) - float32(k.stepSize*mi)/denom
	}
}

// sqrt32 returns the correctly rounded float32 square root of x (rounding
// the float64 root to float32 cannot round twice wrongly for a square root).
func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }

// powInt returns b^t by repeated squaring in float64; every product is
// rounded in a fixed order, so the result is the same everywhere.
func powInt(b float64, t uint64) float64 {
	r := 1.0
	for t > 0 {
		if t&1 == 1 {
			r = float64(r * b)
		}
		b = float64(b * b)
		t >>= 1
	}
	return r
}
