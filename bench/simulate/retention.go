package main

import (
	"math"

	"github.com/concord-ccl/concord/rdma/plan"
)

// retentionReport is figure (b): AllReduce throughput retention (fault-free time over degraded time)
// against message size with one of 8 NICs failed on the paper's two-node testbed.
type retentionReport struct {
	Topology string   `json:"topology"`
	Sizes    []int64  `json:"sizes"`
	Curves   []curve  `json:"curves"`
	Compare  []compar `json:"compare_with_paper"`
	Note     string   `json:"note"`
}

// curve is one strategy's retention per size, with its time over the fault-free ring and over Ideal.
type curve struct {
	Name      string    `json:"name"`
	Retention []float64 `json:"retention"`
	VsFF      []float64 `json:"vs_fault_free"`
	VsIdeal   []float64 `json:"vs_ideal"`
}

// compar sets one reproduced figure beside the paper's.
type compar struct {
	What       string  `json:"what"`
	Bytes      int64   `json:"bytes"`
	Reproduced float64 `json:"reproduced"`
	Paper      float64 `json:"paper"`
	Diff       float64 `json:"diff"`
	Why        string  `json:"why,omitempty"`
}

// retentionCases are the curves of figure (b): a name, the strategies the planner may pick from and
// the model's choices. A single strategy gives that strategy's curve.
var retentionCases = []struct {
	name string
	cfg  plan.Config
}{
	{"hot_repair", plan.Config{Strategies: []plan.Strategy{plan.HotRepair}}},
	{"balance", plan.Config{Strategies: []plan.Strategy{plan.Balance}}},
	{"r2ccl_allreduce_appendix_a", plan.Config{Strategies: []plan.Strategy{plan.R2CCL}}},
	{"r2ccl_allreduce_code_model", plan.Config{Strategies: []plan.Strategy{plan.R2CCL},
		Model: plan.Model{BroadcastAtDegraded: true, SplitEqualsLoss: true}}},
	{"optcc", plan.Config{Strategies: []plan.Strategy{plan.OptCC}}},
	{"planner_r2ccl_strategies", plan.Config{Strategies: plan.R2CCLStrategies}},
	{"planner_all_strategies", plan.Config{}},
}

func retention(o options) (retentionReport, error) {
	var r retentionReport
	bw := o.testbedGbps * 1e9 / 8
	t := plan.Uniform(2, 8, 2, o.alphaMicros*1e-6, bw).WithNICDown(1, 1, true)
	r.Topology = "2 servers x 8 GPUs, 8 NICs of --testbed-gbps each (NICs 0-3 and 4-7 in two NUMA domains), " +
		"NIC 1 of server 1 failed (X = 1/8), α = --alpha-us per message"
	for e := 3; e <= 34; e++ {
		r.Sizes = append(r.Sizes, int64(1)<<e)
	}
	byName := map[string]curve{}
	for _, c := range retentionCases {
		cv := curve{Name: c.name}
		for _, b := range r.Sizes {
			p, err := plan.Choose(t, b, c.cfg)
			if err != nil {
				return r, err
			}
			cv.Retention = append(cv.Retention, p.FaultFreeSeconds/p.Seconds)
			cv.VsFF = append(cv.VsFF, p.Seconds/p.FaultFreeSeconds)
			cv.VsIdeal = append(cv.VsIdeal, p.Seconds/p.IdealSeconds)
		}
		r.Curves = append(r.Curves, cv)
		byName[c.name] = cv
	}
	at := func(name string, bytes int64) float64 {
		for i, b := range r.Sizes {
			if b == bytes {
				return 100 * byName[name].Retention[i]
			}
		}
		return math.NaN()
	}
	const large, small = int64(16) << 30, int64(4) << 20
	add := func(what, name string, bytes int64, paper float64, why string) {
		v := at(name, bytes)
		r.Compare = append(r.Compare, compar{What: what, Bytes: bytes, Reproduced: v, Paper: paper, Diff: v - paper, Why: why})
	}
	add("hot repair retention %, large messages", "hot_repair", large, 54,
		"the model halves the node (the backup NIC carries two channels): 50%. The testbed's fault-free "+
			"ring runs at 369 of 400 GB/s (92% of line rate, §8.4) while a doubly loaded NIC runs near line "+
			"rate, so it measures 0.5/0.92 = 54%; one β per NIC does not capture that")
	add("Balance retention %, large messages", "balance", large, 83,
		"the model spreads the failed NIC's share over the 7 healthy NICs at no cost: 7/8 = 87.5%. On the "+
			"testbed the detoured flows also cross PCIe switches and the CPU link; the model charges the CPU "+
			"link only when the topology sets CPULinkBandwidth, which this run does not")
	add("R²CCL-AllReduce retention %, large messages (R²CCL's code model: Y = X, broadcast at the degraded node's rate)",
		"r2ccl_allreduce_code_model", large, 93, "")
	add("R²CCL-AllReduce retention %, large messages (Appendix A model at Y*)", "r2ccl_allreduce_appendix_a", large, 93,
		"Appendix A charges the broadcast at the healthy nodes' residual bandwidth X·B, so at X = 1/8, below its "+
			"own crossover ng/(3ng−2) = 0.348, it predicts R²CCL-AllReduce slower than Balance; the testbed "+
			"measured 93%, which matches the code's model (broadcast at the degraded node's (1−X)·B) instead")
	add("Balance retention %, small messages (<32 MB)", "balance", small, 92,
		"latency-bound in the model: the ring's 2(N−1)·α is the same with and without the failure")
	add("R²CCL-AllReduce retention %, small messages (<32 MB), code model", "r2ccl_allreduce_code_model", small, 66,
		"the model adds only the reduce-in and broadcast chains' 2(n−1)·α; the paper attributes its drop to "+
			"data-dependency coordination (kernel launches, synchronization) the model does not represent")
	r.Note = "retention = fault-free time / degraded time for the same message; vs_fault_free is its inverse; " +
		"vs_ideal = time / Ideal. The planner curves take the model's cheapest strategy per size."
	return r, nil
}
