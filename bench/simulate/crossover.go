package main

import (
	"math"

	"github.com/concord-ccl/concord/rdma/plan"
)

// crossoverReport is figure (a): standard ring versus R²CCL-AllReduce against the lost fraction X.
type crossoverReport struct {
	Servers int `json:"servers"`
	GPUs    int `json:"gpus"`
	// Formula is Appendix A's ng/(3ng−2); Reproduced is where the model's two curves cross (bisection,
	// α = 0, the large-message limit); Diff is their difference.
	Formula    float64 `json:"formula"`
	Reproduced float64 `json:"reproduced"`
	Diff       float64 `json:"diff"`
	// Testbed repeats the check for the paper's two-node testbed (n = 2, g = 8).
	Testbed struct {
		Formula    float64 `json:"formula"`
		Reproduced float64 `json:"reproduced"`
		Diff       float64 `json:"diff"`
	} `json:"testbed"`
	// WithAlpha is the crossover for a 256 MiB message with the α of --alpha-us: latency moves it.
	WithAlpha struct {
		Bytes      int64   `json:"bytes"`
		Reproduced float64 `json:"reproduced"`
	} `json:"with_alpha"`
	Curve []crossPoint `json:"curve"`
	Note  string       `json:"note"`
}

// crossPoint is one X of the curve: both strategies' times over the fault-free ring and over Ideal.
type crossPoint struct {
	X               float64 `json:"x"`
	YStar           float64 `json:"y_star"`
	StandardVsFF    float64 `json:"standard_vs_fault_free"`
	R2CCLVsFF       float64 `json:"r2ccl_vs_fault_free"`
	StandardVsIdeal float64 `json:"standard_vs_ideal"`
	R2CCLVsIdeal    float64 `json:"r2ccl_vs_ideal"`
}

// lossTopology returns n servers of g NICs (bandwidth bw, latency alpha) with server 0 slowed to lose
// the fraction x of its bandwidth; a continuous X needs slowed NICs rather than failed ones.
func lossTopology(n, g int, bw, alpha, x float64) plan.Topology {
	t := plan.Uniform(n, g, 2, alpha, bw)
	for j := range t.Nodes[0].NICs {
		t.Nodes[0].NICs[j].Beta /= 1 - x
	}
	return t
}

// gap returns T_R²CCL − T_standard at lost fraction x.
func gap(n, g int, bw, alpha, x, bytes float64) (float64, error) {
	t := lossTopology(n, g, bw, alpha, x)
	std, err := plan.Cost(t, plan.Balance, bytes, plan.Model{})
	if err != nil {
		return 0, err
	}
	r2, err := plan.Cost(t, plan.R2CCL, bytes, plan.Model{})
	if err != nil {
		return 0, err
	}
	return r2.Seconds - std.Seconds, nil
}

// bisect finds the X in (0, 1) where R²CCL-AllReduce starts to win.
func bisect(n, g int, bw, alpha, bytes float64) (float64, error) {
	lo, hi := 1e-6, 1-1e-6
	for range 200 {
		mid := (lo + hi) / 2
		d, err := gap(n, g, bw, alpha, mid, bytes)
		if err != nil {
			return 0, err
		}
		if d > 0 {
			lo = mid
		} else {
			hi = mid
		}
		if hi-lo < 1e-15 {
			break
		}
	}
	return (lo + hi) / 2, nil
}

func crossover(o options) (crossoverReport, error) {
	var r crossoverReport
	bw := o.nicGbps * 1e9 / 8
	const bytes = 1 << 30
	r.Servers, r.GPUs = o.servers, o.gpus
	r.Formula = plan.Crossover(o.servers, o.gpus)
	var err error
	if r.Reproduced, err = bisect(o.servers, o.gpus, bw, 0, bytes); err != nil {
		return r, err
	}
	r.Diff = r.Reproduced - r.Formula
	r.Testbed.Formula = plan.Crossover(2, 8)
	if r.Testbed.Reproduced, err = bisect(2, 8, o.testbedGbps*1e9/8, 0, bytes); err != nil {
		return r, err
	}
	r.Testbed.Diff = r.Testbed.Reproduced - r.Testbed.Formula
	r.WithAlpha.Bytes = 256 << 20
	if r.WithAlpha.Reproduced, err = bisect(o.servers, o.gpus, bw, o.alphaMicros*1e-6, float64(r.WithAlpha.Bytes)); err != nil {
		return r, err
	}
	// The fault-free reference is the same servers with none slowed.
	ff, err := plan.FaultFree(lossTopology(o.servers, o.gpus, bw, 0, 0), bytes, plan.Model{})
	if err != nil {
		return r, err
	}
	for i := 1; i <= 95; i++ {
		x := float64(i) / 100
		t := lossTopology(o.servers, o.gpus, bw, 0, x)
		id, err := plan.Ideal(t, bytes)
		if err != nil {
			return r, err
		}
		std, _ := plan.Cost(t, plan.Balance, bytes, plan.Model{})
		r2, _ := plan.Cost(t, plan.R2CCL, bytes, plan.Model{})
		r.Curve = append(r.Curve, crossPoint{X: x, YStar: r2.Y,
			StandardVsFF: std.Seconds / ff, R2CCLVsFF: r2.Seconds / ff,
			StandardVsIdeal: std.Seconds / id, R2CCLVsIdeal: r2.Seconds / id})
	}
	r.Note = "α = 0 (large-message limit), Appendix A's model: R²CCL-AllReduce at Y*, the standard ring " +
		"at the degraded server's remaining bandwidth (Balance). The server loses X continuously (slowed " +
		"NICs). Reproduced is found by bisection on the model, independent of the closed form."
	if math.IsNaN(r.Reproduced) {
		r.Note += " Bisection failed."
	}
	return r, nil
}
