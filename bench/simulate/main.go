// Command simulate reproduces the R²CCL paper's scheduling results at paper scale with the α–β model
// of package rdma/plan, used as a flow-level model: every schedule is a set of concurrent flows
// (rings, reduce-in and broadcast chains), each paced by its slowest link, and a node's flows share
// its NICs' bandwidth. Run it as
//
//	go run ./bench/simulate --servers 64 --gpus 8 --failures 1-10 --patterns 50
//
// It computes, in seconds of CPU time: the single-failure crossover between the standard ring (under
// Balance) and R²CCL-AllReduce against the lost fraction X, beside Appendix A's closed form
// ng/(3ng−2); AllReduce throughput retention against message size with one of 8 NICs failed on the
// paper's two-node testbed (§8.4) for hot repair, Balance, R²CCL-AllReduce and OptCC; and the
// training-iteration overhead of a 7B model on --servers × --gpus as --failures random NIC failures
// are injected, --patterns seeded patterns each (Fig. 10).
//
// Progress goes to stderr; stdout gets one JSON object, on the last line, with every reproduced
// figure beside the paper's, the differences, and for every degraded case its time against the
// fault-free time and against the model's ideal. PNG plots are written under --out (docs/ by
// default); docs/simulate.md explains them.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// options are the command's flags.
type options struct {
	servers, gpus          int
	failMin, failMax       int
	patterns               int
	seed                   uint64
	out                    string
	plots                  bool
	nicGbps, testbedGbps   float64
	alphaMicros            float64
	mfu, seqLen, batchSize float64
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "simulate:", err)
		os.Exit(1)
	}
}

// parseRange parses "a-b" or "a".
func parseRange(s string) (int, int, error) {
	lo, hi, found := strings.Cut(s, "-")
	a, err := strconv.Atoi(lo)
	if err != nil {
		return 0, 0, fmt.Errorf("--failures %q: %w", s, err)
	}
	b := a
	if found {
		if b, err = strconv.Atoi(hi); err != nil {
			return 0, 0, fmt.Errorf("--failures %q: %w", s, err)
		}
	}
	if a < 1 || b < a {
		return 0, 0, fmt.Errorf("--failures %q: want 1 <= a <= b", s)
	}
	return a, b, nil
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.servers, "servers", 64, "servers in the training simulation")
	fs.IntVar(&o.gpus, "gpus", 8, "GPUs (and NICs) per server")
	failures := fs.String("failures", "1-10", "range of concurrent NIC failures, a-b")
	fs.IntVar(&o.patterns, "patterns", 50, "random failure patterns per failure count")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the failure patterns")
	fs.StringVar(&o.out, "out", "docs", "directory for the PNG plots")
	fs.BoolVar(&o.plots, "plots", true, "write the PNG plots")
	fs.Float64Var(&o.nicGbps, "nic-gbps", 200, "NIC bandwidth of the simulated cluster in Gbit/s (paper §8.1: 200)")
	fs.Float64Var(&o.testbedGbps, "testbed-gbps", 400, "NIC bandwidth of the two-node testbed in Gbit/s (paper §8.1: 400)")
	fs.Float64Var(&o.alphaMicros, "alpha-us", 5, "per-message NIC latency α in microseconds")
	fs.Float64Var(&o.mfu, "mfu", 0.40, "model FLOPs utilization of the A100s (assumed)")
	fs.Float64Var(&o.seqLen, "seq-len", 2048, "sequence length in tokens (assumed)")
	fs.Float64Var(&o.batchSize, "batch", 512, "global batch size in sequences (paper §8.2: 512)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.failMin, o.failMax, err = parseRange(*failures); err != nil {
		return o, err
	}
	switch {
	case o.servers < 2:
		return o, errors.New("--servers: need at least 2")
	case o.gpus < 2:
		return o, errors.New("--gpus: need at least 2")
	case o.failMax > o.servers*o.gpus-o.servers:
		return o, errors.New("--failures: more failures than NICs that can fail without isolating a server")
	case o.patterns < 1:
		return o, errors.New("--patterns: need at least 1")
	case o.nicGbps <= 0 || o.testbedGbps <= 0 || o.alphaMicros < 0:
		return o, errors.New("--nic-gbps, --testbed-gbps, --alpha-us: need positive values")
	case o.mfu <= 0 || o.mfu > 1 || o.seqLen <= 0 || o.batchSize <= 0:
		return o, errors.New("--mfu, --seq-len, --batch: out of range")
	}
	return o, nil
}

// report is the JSON document printed on the last line.
type report struct {
	Model     modelDoc        `json:"model"`
	Crossover crossoverReport `json:"crossover"`
	Retention retentionReport `json:"retention"`
	Training  trainingReport  `json:"training"`
	Figures   []string        `json:"figures"`
	Elapsed   float64         `json:"elapsed_seconds"`
}

// modelDoc states the simulation model in the JSON.
type modelDoc struct {
	Kind      string `json:"kind"`
	CostModel string `json:"cost_model"`
	Ideal     string `json:"ideal"`
	Source    string `json:"source"`
}

func run(args []string, stdout, stderr io.Writer) error {
	start := time.Now()
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	progress := func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) }
	var rep report
	rep.Model = modelDoc{
		Kind: "flow-level α–β model (no packets): every schedule is a set of concurrent flows (rings, " +
			"reduce-in and broadcast chains), each paced by its slowest link; a node's flows share its " +
			"healthy NICs; NVLink and reduction arithmetic are free",
		CostModel: "ring AllReduce over N = n·g ranks: 2(N−1)·α + a·D/R, a = 2(N−1)/N, R the slowest " +
			"ring edge's bandwidth (an edge sums the rails both ends have healthy); strategies and " +
			"formulas in package rdma/plan",
		Ideal: "Ideal = 2⌈log2 n⌉·α_min + max(n·a·D/Σ_i R_i, D/R_min)",
		Source: "R²CCL (arXiv 2512.25059) §5–6, §8.2, §8.4, Appendix A and D; OptCC (arXiv 2606.01680) " +
			"for the O(1/p) bound",
	}
	progress("crossover: %d servers x %d GPUs", o.servers, o.gpus)
	if rep.Crossover, err = crossover(o); err != nil {
		return err
	}
	progress("retention: 2 servers x 8 GPUs, one of 8 NICs failed")
	if rep.Retention, err = retention(o); err != nil {
		return err
	}
	if rep.Training, err = training(o, progress); err != nil {
		return err
	}
	if o.plots {
		if err := os.MkdirAll(o.out, 0o755); err != nil {
			return err
		}
		for _, f := range []struct {
			name string
			draw func(string) error
		}{
			{"crossover.png", func(p string) error { return plotCrossover(rep.Crossover, p) }},
			{"retention.png", func(p string) error { return plotRetention(rep.Retention, p) }},
			{"training_overhead.png", func(p string) error { return plotTraining(rep.Training, p) }},
		} {
			p := filepath.Join(o.out, f.name)
			if err := f.draw(p); err != nil {
				return fmt.Errorf("plot %s: %w", p, err)
			}
			rep.Figures = append(rep.Figures, p)
			progress("wrote %s", p)
		}
	}
	rep.Elapsed = time.Since(start).Seconds()
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}
