package diloco

import (
	"fmt"
	"math"
)

// NesterovConfig holds the hyper-parameters of the outer optimiser. The zero
// value selects the defaults of DiLoCo; a field left at zero takes its
// default.
type NesterovConfig struct {
	// LR is the outer learning rate. Default 0.7.
	LR float32
	// Momentum is the momentum coefficient, in [0, 1). Default 0.9.
	Momentum float32
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c NesterovConfig) withDefaults() NesterovConfig {
	if c.LR == 0 {
		c.LR = 0.7
	}
	if c.Momentum == 0 {
		c.Momentum = 0.9
	}
	return c
}

// Validate reports the first field of c (after defaults) that is out of
// range, wrapping ErrBadConfig.
func (c NesterovConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case !(c.LR > 0) || math.IsInf(float64(c.LR), 0):
		return fmt.Errorf("%w: NesterovConfig.LR %v must be positive and finite", ErrBadConfig, c.LR)
	case !(c.Momentum >= 0 && c.Momentum < 1):
		return fmt.Errorf("%w: NesterovConfig.Momentum %v must be in [0, 1)", ErrBadConfig, c.Momentum)
	}
	return nil
}

// Nesterov is SGD with Nesterov momentum, DiLoCo's outer optimiser. It is
// applied to the global parameters with the pseudo-gradient (the global
// parameters before the round minus the average of the workers' parameters
// after it; see PseudoGradient). Its state, the momentum buffer, is one
// contiguous vector. A Nesterov is not safe for concurrent use.
//
// One step does, for every element, with g the pseudo-gradient:
//
//	buf = momentum*buf + g
//	p   = p - lr*(g + momentum*buf)
//
// in float32 with every product rounded before it is added.
type Nesterov struct {
	// Config is the configuration with defaults filled in. It may be changed
	// between steps.
	Config NesterovConfig
	// State is the momentum buffer, n float32s, zero before the first step.
	State []float32
}

// NewNesterov returns an outer optimiser for n parameters with a zeroed
// momentum buffer. cfg's zero fields take their defaults.
func NewNesterov(cfg NesterovConfig, n int) *Nesterov {
	return &Nesterov{Config: cfg.withDefaults(), State: make([]float32, n)}
}

// Step applies one update to params using pseudoGrad; both must have the
// length n given to NewNesterov.
func (o *Nesterov) Step(params, pseudoGrad []float32) {
	n := len(o.State)
	if len(params) != n || len(pseudoGrad) != n {
		panic(fmt.Sprintf("diloco: Nesterov step with %d params, %d pseudo-gradients for n=%d", len(params), len(pseudoGrad), n))
	}
	mu, lr := o.Config.Momentum, o.Config.LR
	buf := o.State
	params = params[:n:n]
	for i, g := range pseudoGrad[:n:n] {
		b := float32(mu*buf[i]) + g
		buf[i] = b
		params[i] -= float32(lr * (g + float32(mu*b)))
	}
}

// StepMean is Step with the pseudo-gradient sum[i]/n: the mean of n workers' pseudo-gradients
// whose sum is given. It computes the same bits as dividing first and calling Step.
func (o *Nesterov) StepMean(params, sum []float32, n float32) {
	l := len(o.State)
	if len(params) != l || len(sum) != l {
		panic(fmt.Sprintf("diloco: Nesterov step with %d params, %d sums for n=%d", len(params), len(sum), l))
	}
	mu, lr := o.Config.Momentum, o.Config.LR
	buf := o.State
	params = params[:l:l]
	for i, s := range sum[:l:l] {
		g := s / n
		b := float32(mu*buf[i]) + g
		buf[i] = b
		params[i] -= float32(lr * (g + float32(mu*b)))
	}
}

// PseudoGradient writes before - after into dst element by element; all
// three must have the same length (dst may alias either input). With before
// the global parameters at the start of a round and after the average of
// the workers' parameters at its end, dst is the outer gradient.
func PseudoGradient(dst, before, after []float32) {
	n := len(dst)
	if len(before) != n || len(after) != n {
		panic(fmt.Sprintf("diloco: pseudo-gradient of %d, %d into %d elements", len(before), len(after), n))
	}
	before = before[:n:n]
	after = after[:n:n]
	for i := range dst {
		dst[i] = before[i] - after[i]
	}
}
