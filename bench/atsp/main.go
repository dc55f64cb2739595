// Command atsp benchmarks the atsp package on the TSPLIB asymmetric
// instances shipped in atsp/testdata. For each instance it runs Solve with
// the Total objective under a wall-clock budget, then Improve from that tour
// until the known optimum is reached or the improve limit ends. It prints
// one JSON object per instance and, as the last line, a JSON object with
// every instance and a summary of the targets:
//
//   - every instance with n <= 17 is solved to optimality;
//   - every instance with n <= 70 is within 1% of optimal;
//   - Improve, started from the Solve tour, reaches the optimum of ftv33 and
//     ftv70 within the improve limit (zero seconds when Solve already has it).
//
// For ftv33 and ftv70 it also runs Improve from the identity tour, so that
// the search's own time to the optimum is visible.
//
// Usage:
//
//	go run ./bench/atsp --tsplib [--dir atsp/testdata] [--budget 1s] [--improve 10s] [--seed 1]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"time"

	"github.com/concord-ccl/concord/atsp"
)

// optimal holds the TSPLIB optimal tour lengths (see atsp/testdata/README.md).
var optimal = map[string]float64{
	"br17": 39, "ftv33": 1286, "ftv35": 1473, "ftv38": 1530, "p43": 5620,
	"ftv44": 1613, "ftv47": 1776, "ry48p": 14422, "ft53": 6905, "ftv55": 1608,
	"ftv64": 1839, "ft70": 38673, "ftv70": 1950, "kro124p": 36230, "ftv170": 2755,
	"rbg323": 1326, "rbg358": 1163, "rbg403": 2465, "rbg443": 2720,
}

// improveTargets are the instances whose optimum Improve must reach.
var improveTargets = []string{"ftv33", "ftv70"}

type instanceResult struct {
	Name         string  `json:"name"`
	N            int     `json:"n"`
	Optimal      float64 `json:"optimal"`
	Found        float64 `json:"found"`
	Gap          float64 `json:"gap"`
	SolveSeconds float64 `json:"solve_seconds"`
	Bottleneck   float64 `json:"bottleneck"`
	// Improve run, started from the Solve tour.
	ImproveFound            float64  `json:"improve_found"`
	ImproveGap              float64  `json:"improve_gap"`
	ImproveResults          int      `json:"improve_results"`
	ImproveSecondsToOptimal *float64 `json:"improve_seconds_to_optimal"`
	ImproveSeconds          float64  `json:"improve_seconds"`
	// For the improve targets only: Improve started from the identity tour
	// 0, 1, ..., n-1 instead of the Solve tour, to show the search itself.
	// Solve with the Bottleneck objective and the same budget, with
	// atsp.BottleneckLowerBound for comparison.
	BottleneckObjective             float64  `json:"bottleneck_objective_bottleneck"`
	BottleneckObjectiveTotal        float64  `json:"bottleneck_objective_total"`
	BottleneckLowerBound            float64  `json:"bottleneck_lower_bound"`
	IdentityStart                   float64  `json:"identity_start,omitempty"`
	IdentityImproveFound            float64  `json:"identity_improve_found,omitempty"`
	IdentityImproveSecondsToOptimal *float64 `json:"identity_improve_seconds_to_optimal,omitempty"`
}

type summary struct {
	OptimalNLe17   bool    `json:"optimal_n_le_17"`
	GapLe1PctNLe70 bool    `json:"gap_le_1pct_n_le_70"`
	MaxGapNLe70    float64 `json:"max_gap_n_le_70"`
	ImproveFtv33   bool    `json:"improve_ftv33_optimal"`
	ImproveFtv70   bool    `json:"improve_ftv70_optimal"`
	// Improve from the identity tour reaches the optimum within the limit.
	IdentityImproveFtv33 bool    `json:"identity_improve_ftv33_optimal"`
	IdentityImproveFtv70 bool    `json:"identity_improve_ftv70_optimal"`
	AllTargets           bool    `json:"all_targets"`
	ImproveLimitSecond   float64 `json:"improve_limit_seconds"`
}

type report struct {
	BudgetSeconds  float64          `json:"budget_seconds"`
	ImproveSeconds float64          `json:"improve_seconds"`
	Seed           int64            `json:"seed"`
	CPUs           int              `json:"gomaxprocs"`
	Instances      []instanceResult `json:"instances"`
	Summary        summary          `json:"summary"`
}

func main() {
	tsplib := flag.Bool("tsplib", false, "run the shipped TSPLIB ATSP instances")
	dir := flag.String("dir", "atsp/testdata", "directory holding the .atsp files (relative to the repository root)")
	budget := flag.Duration("budget", time.Second, "Solve budget per instance")
	improve := flag.Duration("improve", 10*time.Second, "Improve limit per instance")
	seed := flag.Int64("seed", 1, "search seed")
	only := flag.String("only", "", "run just this instance (by name)")
	flag.Parse()
	if !*tsplib {
		fmt.Fprintln(os.Stderr, "atsp bench: pass --tsplib to run the TSPLIB instances")
		os.Exit(2)
	}
	rep, err := run(*dir, *budget, *improve, *seed, *only)
	if err != nil {
		fmt.Fprintln(os.Stderr, "atsp bench:", err)
		os.Exit(1)
	}
	out, err := json.Marshal(rep)
	if err != nil {
		fmt.Fprintln(os.Stderr, "atsp bench:", err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}

func run(dir string, budget, improve time.Duration, seed int64, only string) (*report, error) {
	type loaded struct {
		inst *atsp.Instance
		opt  float64
	}
	var all []loaded
	for name, opt := range optimal {
		if only != "" && name != only {
			continue
		}
		f, err := os.Open(filepath.Join(dir, name+".atsp"))
		if err != nil {
			return nil, err
		}
		inst, err := atsp.ReadTSPLIB(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		all = append(all, loaded{inst, opt})
	}
	sort.Slice(all, func(a, b int) bool {
		if all[a].inst.N != all[b].inst.N {
			return all[a].inst.N < all[b].inst.N
		}
		return all[a].inst.Name < all[b].inst.Name
	})
	rep := &report{
		BudgetSeconds:  budget.Seconds(),
		ImproveSeconds: improve.Seconds(),
		Seed:           seed,
		CPUs:           runtime.GOMAXPROCS(0),
		Summary:        summary{OptimalNLe17: true, GapLe1PctNLe70: true, ImproveLimitSecond: improve.Seconds()},
	}
	improved := map[string]bool{}
	identity := map[string]bool{}
	for _, l := range all {
		r, err := runInstance(l.inst, l.opt, budget, improve, seed)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", l.inst.Name, err)
		}
		line, _ := json.Marshal(r)
		fmt.Println(string(line))
		rep.Instances = append(rep.Instances, r)
		if r.N <= 17 && r.Found != r.Optimal {
			rep.Summary.OptimalNLe17 = false
		}
		if r.N <= 70 {
			rep.Summary.MaxGapNLe70 = math.Max(rep.Summary.MaxGapNLe70, r.Gap)
			if r.Gap > 0.01 {
				rep.Summary.GapLe1PctNLe70 = false
			}
		}
		improved[r.Name] = r.ImproveSecondsToOptimal != nil
		if r.IdentityStart > 0 {
			identity[r.Name] = r.IdentityImproveSecondsToOptimal != nil
		}
	}
	rep.Summary.ImproveFtv33 = improved["ftv33"]
	rep.Summary.ImproveFtv70 = improved["ftv70"]
	rep.Summary.IdentityImproveFtv33 = identity["ftv33"]
	rep.Summary.IdentityImproveFtv70 = identity["ftv70"]
	rep.Summary.AllTargets = rep.Summary.OptimalNLe17 && rep.Summary.GapLe1PctNLe70
	for _, name := range improveTargets {
		rep.Summary.AllTargets = rep.Summary.AllTargets && improved[name]
	}
	return rep, nil
}

func runInstance(inst *atsp.Instance, opt float64, budget, improve time.Duration, seed int64) (instanceResult, error) {
	o := atsp.Options{Objective: atsp.Total, Budget: budget, Seed: seed}
	start := time.Now()
	tour, sc, err := atsp.Solve(inst.Cost, o)
	if err != nil {
		return instanceResult{}, err
	}
	r := instanceResult{
		Name: inst.Name, N: inst.N, Optimal: opt, Found: sc.Total,
		Gap: (sc.Total - opt) / opt, SolveSeconds: time.Since(start).Seconds(),
		Bottleneck: sc.Bottleneck, ImproveFound: sc.Total,
	}
	_, bs, err := atsp.Solve(inst.Cost, atsp.Options{Objective: atsp.Bottleneck, Budget: budget, Seed: seed})
	if err != nil {
		return instanceResult{}, err
	}
	r.BottleneckObjective, r.BottleneckObjectiveTotal = bs.Bottleneck, bs.Total
	r.BottleneckLowerBound = atsp.BottleneckLowerBound(inst.Cost)
	found, results, toOpt, took := improveRun(inst, tour, sc.Total, opt, improve, seed+1)
	r.ImproveFound, r.ImproveResults, r.ImproveSecondsToOptimal, r.ImproveSeconds = found, results, toOpt, took
	r.ImproveGap = (r.ImproveFound - opt) / opt
	for _, name := range improveTargets {
		if name != inst.Name {
			continue
		}
		id := make(atsp.Tour, inst.N)
		for i := range id {
			id[i] = i
		}
		r.IdentityStart = atsp.Evaluate(inst.Cost, id).Total
		r.IdentityImproveFound, _, r.IdentityImproveSecondsToOptimal, _ = improveRun(inst, id, r.IdentityStart, opt, improve, seed+2)
	}
	return r, nil
}

// improveRun runs Improve from tour (of total cost startTotal) until the
// optimum is reached or limit ends. It returns the best total, the number of
// results, the seconds to reach the optimum (nil if not reached) and the
// seconds spent.
func improveRun(inst *atsp.Instance, tour atsp.Tour, startTotal, opt float64, limit time.Duration, seed int64) (float64, int, *float64, float64) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	start := time.Now()
	found, results := startTotal, 0
	var toOpt *float64
	if startTotal <= opt {
		zero := 0.0
		toOpt = &zero
		cancel()
	}
	for res := range atsp.Improve(ctx, inst.Cost, tour, atsp.Options{Objective: atsp.Total, Seed: seed}) {
		results++
		found = res.Score.Total
		if res.Score.Total <= opt && toOpt == nil {
			t := time.Since(start).Seconds()
			toOpt = &t
			cancel()
		}
	}
	return found, results, toOpt, time.Since(start).Seconds()
}
