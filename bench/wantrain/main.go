// Command wantrain measures how busy training across continents keeps the accelerators: DDP, DiLoCo,
// streaming DiLoCo, and streaming DiLoCo with compressed outer gradients, each on three sites joined
// by the packet-level WAN emulator of internal/wanemu.
//
//	sudo go run ./bench/wantrain --step-ms 100
//
// It needs root (namespaces and TUN devices) and, for the accuracy runs, the full Fashion-MNIST set
// (Debian's dataset-fashion-mnist, or --data-dir). With the defaults the accuracy runs take about six
// minutes of two cores and the WAN runs about five (--accuracy=false or --wan=false skip either).
//
// # The WAN runs
//
// Three sites, one peer each (in this process, its sockets inside its site's namespace; the master in
// site 0), with --rtts between sites 0 and 1, 0 and 2, 1 and 2 (80, 150 and 200 ms), every directed
// link between two sites at --link-mbit (1 Gbit/s) shared by all its flows, drop-tail at one
// bandwidth-delay product, MTU 1500 with segmentation offload. The model is --model bytes of float32
// (256 MiB); an inner step is a sleep of --step-ms standing for the accelerator's compute, after which
// the worker changes a few thousand parameters, so that the outer gradients are not zero. Every byte
// of every outer sync is real and crosses the emulated WAN.
//
//   - ddp: every inner step all-reduces the whole model (float32, average) before the next.
//   - diloco: --h inner steps, then an all-reduce of the whole pseudo-gradient and the Nesterov step,
//     waited for (streaming DiLoCo with one fragment and no delay, which is DiLoCo).
//   - streaming: streaming DiLoCo with --fragments fragments, each synced in float32 while --sync-delay
//     inner steps go on and mixed in with --mix.
//   - streaming-compressed: the same, the outer gradients sent as --compress values (int4) of the
//     --topk fraction (5%) of the largest elements of every chunk of 4096, with error feedback, and an
//     outer momentum of its own (--compressed-outer-momentum 0.6: the error feedback already carries
//     what was left out, and DiLoCo's 0.9 on top of it overshoots).
//
// compute_utilization is the time spent in inner steps over the wall time, from the end of the first
// outer step to the end of the last but one (DDP: of the first step to the last), averaged over the
// peers: the start-up (connections, slow start, the first sync) and the end (where Run waits for
// the last fragment) are left out, as a long run amortizes them. sync_wait_share is the part of that
// window spent waiting for a fragment whose sync took longer than --sync-delay inner steps; the rest
// of what is not compute is the work between inner steps (copying a fragment out, mixing one in,
// hashing the state after an outer step).
// wan_bytes_per_inner_step is every IP packet that crossed between sites in that window (payload,
// headers, acknowledgements, the master's messages) over the inner steps of the group in it; wan_bytes_vs_ddp
// is its ratio to ddp's. bit_identical (per configuration and at the top) says whether every peer
// held the same shared state (the digest of the global parameters, the outer momentum and the
// counters; for ddp the hash of the reduced buffer) after every outer step.
//
// # The churn run
//
// With --churn (default), streaming-compressed runs once more on a model of --churn-model bytes: after
// outer step 1 the peer of site 2 dies (every socket it has reset, as a host's death), the survivors
// retry the fragment in flight, and a newcomer in site 2 joins at a fragment boundary, receives the
// global state, and trains to the end. churn.bit_identical says whether every peer that completed an
// outer step held the same state after it; it counts toward the top-level bit_identical.
//
// # The accuracy runs
//
// The WAN runs say nothing of model quality, so every configuration is also trained for real
// (accuracy.go): the Fashion-MNIST MLP of package diloco on the full data set, by --acc-peers peers
// with the same trainer settings, for --acc-outer outer steps of --h inner steps (DDP: as many single
// steps), on the in-memory network. test_accuracy is its test accuracy, and accuracy_delta that
// minus diloco's (a fraction: -0.005 is half a point lower).
//
// Targets, in the JSON beside the figures: streaming-compressed at compute_utilization >= 0.97 at
// --step-ms 100, its WAN bytes per inner step at most 1/1000 of ddp's, accuracy_delta >= -0.005.
// Progress goes to stderr; the JSON goes to stdout.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/concord-ccl/concord/diloco"
	"github.com/concord-ccl/concord/internal/wanemu"
)

// The targets of streaming-compressed.
const (
	targetUtilization = 0.97
	targetBytesVsDDP  = 1.0 / 1000
	targetAccDelta    = -0.005
)

// names of the configurations, in the order they run.
var names = []string{"ddp", "diloco", "streaming", "streaming-compressed"}

type options struct {
	model      int
	stepMs     int
	h          int
	fragments  int
	syncDelay  int
	mix        float64
	values     diloco.ValueBits
	topk       float64
	cOuterLR   float64
	cOuterMom  float64
	ddpSteps   int
	outer      int
	linkMbit   float64
	rtts       [3]time.Duration
	configs    []string
	churn      bool
	churnModel int
	accuracy   bool
	wan        bool
	dataDir    string
	accOuter   int
	accPeers   int
	batch      int
	timeout    time.Duration
}

func main() {
	var o options
	var model, churnModel, rtts, configs, values string
	flag.StringVar(&model, "model", "256MiB", "model size in bytes of float32 (suffixes KiB, MiB, GiB)")
	flag.IntVar(&o.stepMs, "step-ms", 100, "emulated compute of one inner step, ms")
	flag.IntVar(&o.h, "h", 100, "inner steps per outer step")
	flag.IntVar(&o.fragments, "fragments", 4, "fragments of streaming DiLoCo (must divide --h)")
	flag.IntVar(&o.syncDelay, "sync-delay", 24, "inner steps a fragment's sync overlaps (at most --h/--fragments)")
	flag.Float64Var(&o.mix, "mix", 0.5, "weight of the local parameters when a fragment is mixed in")
	flag.StringVar(&values, "compress", "int4", "streaming-compressed: value encoding (int8, int4)")
	flag.Float64Var(&o.topk, "topk", 0.05, "streaming-compressed: fraction of every chunk's elements sent")
	flag.Float64Var(&o.cOuterLR, "compressed-outer-lr", 0.7, "streaming-compressed: outer learning rate")
	flag.Float64Var(&o.cOuterMom, "compressed-outer-momentum", 0.6, "streaming-compressed: outer momentum (error feedback already carries what was not sent)")
	flag.IntVar(&o.ddpSteps, "ddp-steps", 3, "ddp: inner steps on the WAN")
	flag.IntVar(&o.outer, "outer-steps", 4, "diloco and streaming: outer steps on the WAN (the window is the second to the last but one)")
	flag.Float64Var(&o.linkMbit, "link-mbit", 1000, "capacity of every directed link between sites, Mbit/s")
	flag.StringVar(&rtts, "rtts", "80ms,150ms,200ms", "round-trip times between sites 0-1, 0-2 and 1-2")
	flag.StringVar(&configs, "configs", strings.Join(names, ","), "configurations to run")
	flag.BoolVar(&o.churn, "churn", true, "run streaming-compressed again with a peer killed and a newcomer")
	flag.StringVar(&churnModel, "churn-model", "32MiB", "model size of the churn run")
	flag.BoolVar(&o.accuracy, "accuracy", true, "train every configuration on Fashion-MNIST for its test accuracy")
	flag.BoolVar(&o.wan, "wan", true, "run the configurations on the emulated WAN (root)")
	flag.StringVar(&o.dataDir, "data-dir", diloco.DefaultDir(), "directory of the full Fashion-MNIST IDX files")
	flag.IntVar(&o.accOuter, "acc-outer", 60, "accuracy runs: outer steps")
	flag.IntVar(&o.accPeers, "acc-peers", 3, "accuracy runs: peers")
	flag.IntVar(&o.batch, "batch", 64, "accuracy runs: minibatch size")
	flag.DurationVar(&o.timeout, "timeout", 40*time.Minute, "limit on the whole run")
	flag.Parse()
	var err error
	if o.model, err = parseSize("--model", model); err != nil {
		fail(err)
	}
	if o.churnModel, err = parseSize("--churn-model", churnModel); err != nil {
		fail(err)
	}
	if o.values, err = diloco.ParseValueBits(values); err != nil {
		fail(err)
	}
	for i, s := range strings.Split(rtts, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || i >= 3 || d < 0 {
			fail(fmt.Errorf("--rtts: want three durations, got %q", rtts))
		}
		o.rtts[i] = d
	}
	for _, c := range strings.Split(configs, ",") {
		if !slices.Contains(names, c) {
			fail(fmt.Errorf("--configs: %q is not one of %s", c, strings.Join(names, ", ")))
		}
		o.configs = append(o.configs, c)
	}
	if o.stepMs <= 0 || o.ddpSteps < 2 || o.outer < 3 || o.accOuter < 1 || o.accPeers < 2 || o.batch < 1 {
		fail(fmt.Errorf("need --step-ms > 0, --ddp-steps >= 2, --outer-steps >= 3, --acc-outer >= 1, --acc-peers >= 2, --batch >= 1"))
	}
	for _, c := range trainerConfigs(&o) {
		if err := c.Validate(); err != nil {
			fail(err)
		}
	}
	res, err := run(&o)
	if err != nil {
		fail(err)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(res)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "wantrain:", err)
	os.Exit(1)
}

func parseSize(name, s string) (int, error) {
	mult := 1
	for suf, m := range map[string]int{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if strings.HasSuffix(s, suf) {
			s, mult = strings.TrimSuffix(s, suf), m
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || n*mult%4 != 0 {
		return 0, fmt.Errorf("%s: %q is not a size in whole float32s", name, s)
	}
	return n * mult, nil
}

// trainerConfigs returns the trainer settings of every configuration, as the accuracy runs use
// them; the WAN runs take DiLoCo as streaming DiLoCo with one fragment and no delay.
func trainerConfigs(o *options) map[string]diloco.TrainerConfig {
	streaming := diloco.TrainerConfig{Kind: diloco.KindStreamingDiLoCo, H: o.h, Fragments: o.fragments,
		SyncDelay: o.syncDelay, Mix: float32(o.mix), BatchSize: o.batch}
	compressed := streaming
	compressed.Compression = diloco.Compression{Values: o.values, TopK: o.topk}
	compressed.Outer = diloco.NesterovConfig{LR: float32(o.cOuterLR), Momentum: float32(o.cOuterMom)}
	return map[string]diloco.TrainerConfig{
		"ddp":                  {Kind: diloco.KindDDP, BatchSize: o.batch},
		"diloco":               {Kind: diloco.KindDiLoCo, H: o.h, BatchSize: o.batch},
		"streaming":            streaming,
		"streaming-compressed": compressed,
	}
}

// config is one configuration's object in the JSON.
type config struct {
	Name               string   `json:"name"`
	ComputeUtilization float64  `json:"compute_utilization"`
	SyncWaitShare      float64  `json:"sync_wait_share"`
	WANBytesPerInner   float64  `json:"wan_bytes_per_inner_step"`
	WANBytesVsDDP      *float64 `json:"wan_bytes_vs_ddp,omitempty"`
	TestAccuracy       *float64 `json:"test_accuracy"`
	AccuracyDelta      *float64 `json:"accuracy_delta"`
	BitIdentical       bool     `json:"bit_identical"`
	InnerSteps         int      `json:"inner_steps_measured"`
	WindowSeconds      float64  `json:"window_seconds"`
	Compression        string   `json:"compression"`
	Aborts             int      `json:"aborts"`
}

type result struct {
	Setup        map[string]any    `json:"setup"`
	Configs      []*config         `json:"configs"`
	Churn        *churnResult      `json:"churn,omitempty"`
	BitIdentical bool              `json:"bit_identical"`
	Targets      map[string]target `json:"targets"`
	Seconds      float64           `json:"seconds"`
}

// target is one figure against its limit.
type target struct {
	Value *float64 `json:"value"`
	Limit float64  `json:"limit"`
	Met   bool     `json:"met"`
}

func round(x float64) float64 {
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	// Four significant digits: the byte ratios are small.
	p := math.Pow(10, 3-math.Floor(math.Log10(math.Abs(x))))
	return math.Round(x*p) / p
}

func ptr(x float64) *float64 { return &x }

func run(o *options) (*result, error) {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	res := &result{
		Setup: map[string]any{"sites": 3, "rtts_ms": []float64{ms(o.rtts[0]), ms(o.rtts[1]), ms(o.rtts[2])},
			"link_mbit": o.linkMbit, "model_bytes": o.model, "step_ms": o.stepMs, "h": o.h, "fragments": o.fragments,
			"sync_delay": o.syncDelay, "mix": o.mix, "compression": diloco.Compression{Values: o.values, TopK: o.topk}.String(),
			"ddp_steps": o.ddpSteps, "outer_steps": o.outer, "acc_outer_steps": o.accOuter, "acc_peers": o.accPeers, "batch": o.batch},
		BitIdentical: true,
		Targets:      map[string]target{},
	}
	cfgs := trainerConfigs(o)
	var acc map[string]float64
	if o.accuracy {
		var err error
		if acc, err = accuracies(ctx, o, cfgs); err != nil {
			return nil, err
		}
	}
	if !o.wan {
		for _, name := range o.configs {
			c := &config{Name: name, Compression: cfgs[name].Compression.String(), BitIdentical: true}
			if a, ok := acc[name]; ok {
				c.TestAccuracy = ptr(round(a))
				if d, ok := acc["diloco"]; ok {
					c.AccuracyDelta = ptr(round(a - d))
				}
			}
			res.Configs = append(res.Configs, c)
		}
		res.Seconds = round(time.Since(t0).Seconds())
		return res, nil
	}
	tb, err := wanemu.New(wanemu.Config{Sites: 3, Offload: true, NamePrefix: "cwtrain", Links: map[[2]int]wanemu.Link{
		{0, 1}: link(o, o.rtts[0]), {1, 0}: link(o, o.rtts[0]),
		{0, 2}: link(o, o.rtts[1]), {2, 0}: link(o, o.rtts[1]),
		{1, 2}: link(o, o.rtts[2]), {2, 1}: link(o, o.rtts[2]),
	}})
	if err != nil {
		return nil, err
	}
	if err := tb.Start(); err != nil {
		return nil, err
	}
	defer tb.Close()
	w := &wan{tb: tb}
	byName := map[string]*config{}
	for _, name := range o.configs {
		var m measured
		var err error
		if name == "ddp" {
			m, err = w.ddp(ctx, o)
		} else {
			cfg := cfgs[name]
			if name == "diloco" {
				cfg = diloco.TrainerConfig{Kind: diloco.KindStreamingDiLoCo, H: o.h, Fragments: 1}
			}
			m, err = w.streaming(ctx, o, cfg, o.model)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		c := &config{Name: name, ComputeUtilization: round(m.util), SyncWaitShare: round(m.waitShare), WANBytesPerInner: round(m.bytesPerInner),
			BitIdentical: m.identical, InnerSteps: m.inner, WindowSeconds: round(m.window.Seconds()),
			Compression: cfgs[name].Compression.String(), Aborts: m.aborts}
		if name == "ddp" {
			c.Compression = "f32"
		}
		if a, ok := acc[name]; ok {
			c.TestAccuracy = ptr(round(a))
		}
		fmt.Fprintf(os.Stderr, "wantrain: %s: compute utilization %.4f, %.4g WAN bytes per inner step, bit-identical %v\n",
			name, m.util, m.bytesPerInner, m.identical)
		res.BitIdentical = res.BitIdentical && m.identical
		res.Configs = append(res.Configs, c)
		byName[name] = c
	}
	if d, ok := acc["diloco"]; ok {
		for _, c := range res.Configs {
			if a, ok := acc[c.Name]; ok {
				c.AccuracyDelta = ptr(round(a - d))
			}
		}
	}
	if ddp := byName["ddp"]; ddp != nil {
		for _, c := range res.Configs {
			c.WANBytesVsDDP = ptr(round(c.WANBytesPerInner / ddp.WANBytesPerInner))
		}
	}
	if o.churn {
		ch, err := w.churn(ctx, o, cfgs["streaming-compressed"])
		if err != nil {
			return nil, fmt.Errorf("churn: %w", err)
		}
		res.Churn = ch
		res.BitIdentical = res.BitIdentical && ch.BitIdentical
	}
	if sc := byName["streaming-compressed"]; sc != nil {
		res.Targets["streaming_compressed_compute_utilization"] = target{ptr(sc.ComputeUtilization), targetUtilization, sc.ComputeUtilization >= targetUtilization}
		if sc.WANBytesVsDDP != nil {
			res.Targets["streaming_compressed_wan_bytes_vs_ddp"] = target{sc.WANBytesVsDDP, targetBytesVsDDP, *sc.WANBytesVsDDP <= targetBytesVsDDP}
		}
		if sc.AccuracyDelta != nil {
			res.Targets["streaming_compressed_accuracy_delta"] = target{sc.AccuracyDelta, targetAccDelta, *sc.AccuracyDelta >= targetAccDelta}
		}
	}
	res.Seconds = round(time.Since(t0).Seconds())
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// link is a directed link between two sites of round-trip time rtt.
func link(o *options, rtt time.Duration) wanemu.Link {
	return wanemu.Link{Delay: rtt / 2, CapacityMbit: o.linkMbit}
}
