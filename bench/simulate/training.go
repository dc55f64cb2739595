package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/concord-ccl/concord/rdma/plan"
)

// trainingReport is figure (c): training-iteration overhead as NIC failures accumulate.
type trainingReport struct {
	Model     trainingModel `json:"model"`
	Variants  []variant     `json:"variants"`
	Endpoints []compar      `json:"compare_with_paper"`
	Note      string        `json:"note"`
}

// trainingModel states the iteration model and its sources.
type trainingModel struct {
	Statement         string  `json:"statement"`
	Source            string  `json:"source"`
	Params            float64 `json:"params"`
	TP                int     `json:"tensor_parallel"`
	DP                int     `json:"data_parallel"`
	GlobalBatch       float64 `json:"global_batch_sequences"`
	SeqLen            float64 `json:"seq_len_tokens"`
	PeakFLOPS         float64 `json:"peak_flops_per_gpu"`
	MFU               float64 `json:"mfu"`
	ComputeSeconds    float64 `json:"compute_seconds"`
	GradBytesPerGPU   float64 `json:"grad_bytes_per_gpu"`
	AllReduceBytes    int64   `json:"allreduce_bytes_per_server_ring"`
	CommSeconds       float64 `json:"fault_free_comm_seconds"`
	CommShare         float64 `json:"fault_free_comm_share"`
	Overlap           float64 `json:"overlap"`
	FaultFreeIterSecs float64 `json:"fault_free_iteration_seconds"`
}

// variant is one planner configuration's overhead curve.
type variant struct {
	Name string  `json:"name"`
	PerK []kStat `json:"per_failures"`
}

// kStat aggregates the patterns of one failure count.
type kStat struct {
	Failures        int            `json:"failures"`
	MeanOverheadPct float64        `json:"mean_overhead_pct"`
	MinOverheadPct  float64        `json:"min_overhead_pct"`
	MaxOverheadPct  float64        `json:"max_overhead_pct"`
	MeanCommVsFF    float64        `json:"mean_comm_vs_fault_free"`
	MeanCommVsIdeal float64        `json:"mean_comm_vs_ideal"`
	Strategies      map[string]int `json:"strategies"`
	Patterns        []patternStat  `json:"patterns"`
}

// patternStat is one degraded case: its failures, chosen strategy and times.
type patternStat struct {
	Failed      [][2]int `json:"failed"` // [server, nic]
	Strategy    string   `json:"strategy"`
	CommSeconds float64  `json:"comm_seconds"`
	VsFF        float64  `json:"comm_vs_fault_free"`
	VsIdeal     float64  `json:"comm_vs_ideal"`
	OverheadPct float64  `json:"overhead_pct"`
}

// trainingVariants are the planner configurations simulated.
var trainingVariants = []struct {
	name string
	cfg  plan.Config
}{
	{"r2ccl_paper_model", plan.Config{Strategies: plan.R2CCLStrategies}},
	{"r2ccl_code_model", plan.Config{Strategies: plan.R2CCLStrategies, Model: plan.Model{BroadcastAtDegraded: true}}},
	{"with_optcc", plan.Config{}},
}

func training(o options, progress func(string, ...any)) (trainingReport, error) {
	var r trainingReport
	const params, tp, peak = 7e9, 4, 312e12
	gpus := o.servers * o.gpus
	m := trainingModel{Params: params, TP: tp, DP: gpus / tp, GlobalBatch: o.batchSize, SeqLen: o.seqLen,
		PeakFLOPS: peak, MFU: o.mfu}
	m.ComputeSeconds = 6 * params * o.batchSize * o.seqLen / (float64(gpus) * peak * o.mfu)
	m.GradBytesPerGPU = 2 * params / tp
	// tp data-parallel groups, each with gpus/tp ranks per server, share every server's NICs: one ring
	// of g/tp ranks per server carrying tp gradient shards moves the same bytes per server.
	m.AllReduceBytes = int64(m.GradBytesPerGPU * tp)
	bw := o.nicGbps * 1e9 / 8
	healthy := plan.Uniform(o.servers, o.gpus, 2, o.alphaMicros*1e-6, bw)
	healthy.GPUsPerNode = max(1, o.gpus/tp)
	ff, err := plan.FaultFree(healthy, float64(m.AllReduceBytes), plan.Model{})
	if err != nil {
		return r, err
	}
	m.CommSeconds = ff
	m.FaultFreeIterSecs = m.ComputeSeconds + ff
	m.CommShare = ff / m.FaultFreeIterSecs
	m.Statement = fmt.Sprintf("iteration = compute + gradient AllReduce, no overlap (overlap = 0): "+
		"compute = 6·P·batch·seq/(GPUs·peak·MFU); the data-parallel gradient AllReduce (bf16, P/TP "+
		"parameters per GPU; %d data-parallel groups of %d ranks per server share the server's %d NICs, "+
		"modelled as one ring carrying their bytes) is the only traffic that crosses servers (TP stays "+
		"inside a server on NVLink), so failures change only its time. Overhead = iteration / fault-free "+
		"iteration − 1", tp, healthy.GPUsPerNode, o.gpus)
	m.Source = "paper §8.2 (7B model, global batch 512, 64 servers x 8 A100, two TP groups per server, " +
		"8 x 200 Gbps NICs per server, SimAI); sequence length 2048 and MFU 0.40 are assumptions " +
		"(the paper states neither); A100 bf16 peak 312 TFLOP/s"
	r.Model = m

	nics := o.servers * o.gpus
	for _, v := range trainingVariants {
		vr := variant{Name: v.name}
		for k := o.failMin; k <= o.failMax; k++ {
			rng := rand.New(rand.NewPCG(o.seed, uint64(k)))
			st := kStat{Failures: k, MinOverheadPct: math.Inf(1), Strategies: map[string]int{}}
			for range o.patterns {
				t := healthy.Clone()
				var failed [][2]int
				for len(failed) < k {
					id := rng.IntN(nics)
					s, j := id/o.gpus, id%o.gpus
					if t.Nodes[s].NICs[j].Down || t.NodeBandwidth(s) <= t.Nodes[s].NICs[j].Bandwidth() {
						continue // already failed, or the server's last NIC
					}
					t.Nodes[s].NICs[j].Down = true
					failed = append(failed, [2]int{s, j})
				}
				slices.SortFunc(failed, func(a, b [2]int) int {
					if a[0] != b[0] {
						return a[0] - b[0]
					}
					return a[1] - b[1]
				})
				p, err := plan.Choose(t, m.AllReduceBytes, v.cfg)
				if err != nil {
					return r, fmt.Errorf("%s, %d failures: %w", v.name, k, err)
				}
				over := 100 * (p.Seconds - ff) / m.FaultFreeIterSecs
				ps := patternStat{Failed: failed, Strategy: p.Strategy.String(), CommSeconds: p.Seconds,
					VsFF: p.Seconds / p.FaultFreeSeconds, VsIdeal: p.Seconds / p.IdealSeconds, OverheadPct: over}
				st.Patterns = append(st.Patterns, ps)
				st.Strategies[ps.Strategy]++
				st.MeanOverheadPct += over
				st.MeanCommVsFF += ps.VsFF
				st.MeanCommVsIdeal += ps.VsIdeal
				st.MinOverheadPct = min(st.MinOverheadPct, over)
				st.MaxOverheadPct = max(st.MaxOverheadPct, over)
			}
			n := float64(o.patterns)
			st.MeanOverheadPct /= n
			st.MeanCommVsFF /= n
			st.MeanCommVsIdeal /= n
			vr.PerK = append(vr.PerK, st)
			progress("training %s: %d failures: mean overhead %.2f%%", v.name, k, st.MeanOverheadPct)
		}
		r.Variants = append(r.Variants, vr)
	}
	paper := map[int]float64{1: 1.5, 10: 4.3}
	for _, v := range r.Variants {
		for _, st := range v.PerK {
			if p, ok := paper[st.Failures]; ok {
				r.Endpoints = append(r.Endpoints, compar{
					What:       fmt.Sprintf("%s: mean overhead %% with %d failures", v.Name, st.Failures),
					Reproduced: st.MeanOverheadPct, Paper: p, Diff: st.MeanOverheadPct - p,
					Why: endpointWhy[v.Name][st.Failures]})
			}
		}
	}
	r.Note = "failures are NICs drawn uniformly without replacement (never a server's last NIC), seeded by " +
		"--seed and the failure count; the planner picks the model's cheapest strategy per pattern. " +
		"r2ccl_paper_model uses Appendix A's costs (R²CCL-AllReduce only above X = ng/(3ng−2)); " +
		"r2ccl_code_model charges the broadcast at the degraded node's rate as R²CCL's code documentation " +
		"does; with_optcc adds this package's OptCC-bound schedule."
	return r, nil
}

// endpointWhy explains each variant's difference from the paper's Fig. 10 endpoints.
var endpointWhy = map[string]map[int]string{
	"r2ccl_paper_model": {
		1: "X = 1/8 is below Appendix A's crossover (0.334 at 64 x 8), so the model's argmin is the standard " +
			"ring under Balance: communication x 8/7, +14.3% of a 16.9% communication share = 2.4%. The " +
			"paper's 1.5% implies SimAI's R²CCL-AllReduce slowed communication by only about 9% at X = 1/8, " +
			"less than its own Appendix A allows; r2ccl_code_model (1.3%) is the closer account",
		10: "the curve grows only with patterns that put two or more failures on one server (X = 1/4 in " +
			"about 44% of patterns at 10 failures): scattered single failures cost no more than one, because " +
			"a ring is paced by its slowest server and re-ranking removes rail mismatches. A flow-level model " +
			"has no congestion between detoured flows, which a packet-level simulator (SimAI) adds per failure",
	},
	"r2ccl_code_model": {
		1: "R²CCL-AllReduce with the broadcast charged at the degraded server's rate: communication +7.2% at " +
			"X = 1/8",
		10: "same cause as r2ccl_paper_model at 10 failures, with the cheaper R²CCL-AllReduce on the " +
			"concentrated patterns",
	},
	"with_optcc": {
		1:  "not in the paper: OptCC's bound (overhead O(1/p)) attained in the model",
		10: "not in the paper: OptCC's bound (overhead O(1/p)) attained in the model",
	},
}
