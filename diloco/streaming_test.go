package diloco_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/concord-ccl/concord/diloco"
)

func TestStreamingChurn(t *testing.T) {
	cfg := diloco.TrainerConfig{Kind: diloco.KindStreamingDiLoCo, H: 8, Fragments: 4, SyncDelay: 1, Mix: 0.5,
		BatchSize: 8, Steps: 10, Seed: 11}
	requireAborts(t, runChurn(t, cfg, 3, 3, 5))
}

// TestStreamingChurnCompressed kills a peer of three while fragments compressed to int4 top-k with
// error feedback are in flight, and lets a newcomer in later.
func TestStreamingChurnCompressed(t *testing.T) {
	cfg := diloco.TrainerConfig{Kind: diloco.KindStreamingDiLoCo, H: 6, Fragments: 3, SyncDelay: 2, Mix: 0.25,
		BatchSize: 8, Steps: 10, Seed: 12, Compression: diloco.Compression{Values: diloco.Int4, TopK: 0.02}}
	requireAborts(t, runChurn(t, cfg, 3, 4, 6))
}

// TestStreamingChurnAlone leaves one survivor, which waits until a newcomer arrives.
func TestStreamingChurnAlone(t *testing.T) {
	cfg := diloco.TrainerConfig{Kind: diloco.KindStreamingDiLoCo, H: 4, Fragments: 2, BatchSize: 8, Steps: 8, Seed: 13,
		Compression: diloco.Compression{Values: diloco.Int8}}
	runChurn(t, cfg, 2, 3, 3)
}

func TestStreamingValidate(t *testing.T) {
	for _, c := range []diloco.TrainerConfig{
		{Kind: diloco.KindStreamingDiLoCo, H: 10, Fragments: 4},
		{Kind: diloco.KindStreamingDiLoCo, H: 8, Fragments: 4, SyncDelay: 3},
		{Kind: diloco.KindStreamingDiLoCo, H: 8, Fragments: 4, SyncDelay: -1},
		{Kind: diloco.KindStreamingDiLoCo, Mix: 1},
		{Kind: diloco.KindStreamingDiLoCo, Compression: diloco.Compression{TopK: 2}},
	} {
		if err := c.Validate(); !errors.Is(err, diloco.ErrBadConfig) {
			t.Fatalf("%+v: %v, want ErrBadConfig", c, err)
		}
	}
	if k, err := diloco.ParseKind("streaming-diloco"); err != nil || k != diloco.KindStreamingDiLoCo {
		t.Fatalf("ParseKind(streaming-diloco) = %v, %v", k, err)
	}
}

// TestStreamingMatchesSerial runs streaming DiLoCo on two peers without churn and checks the final
// global parameters against the algorithm replayed serially from the package's pieces: the
// schedule of fragments, the delayed mixing, the compression with error feedback and the sum in
// rank order.
func TestStreamingMatchesSerial(t *testing.T) {
	for _, cfg := range []diloco.TrainerConfig{
		{Kind: diloco.KindStreamingDiLoCo, H: 4, Fragments: 2, SyncDelay: 1, Mix: 0.5, BatchSize: 4, Steps: 3, Seed: 9,
			Compression: diloco.Compression{Values: diloco.Int4, TopK: 0.05}},
		{Kind: diloco.KindStreamingDiLoCo, H: 6, Fragments: 3, SyncDelay: 2, BatchSize: 4, Steps: 2, Seed: 10},
		{Kind: diloco.KindStreamingDiLoCo, H: 2, Fragments: 1, BatchSize: 4, Steps: 3, Seed: 14,
			Compression: diloco.Compression{Values: diloco.Int8}},
	} {
		t.Run(cfg.Compression.String(), func(t *testing.T) { matchSerial(t, cfg) })
	}
}

func matchSerial(t *testing.T, cfg diloco.TrainerConfig) {
	{
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		g := newGroup(t)
		ps := []*peer{g.launch(ctx, cfg, nil), g.launch(ctx, cfg, nil)}
		for _, p := range ps {
			<-p.done
			if p.err != nil {
				t.Fatalf("%s: %v", p.host, p.err)
			}
		}
		cancel()
		want := serialStreaming(g.train, cfg, 2)
		for _, p := range ps {
			if !slices.Equal(p.sum.Params, want) {
				t.Fatalf("%+v: %s: parameters differ from the serial computation", cfg, p.host)
			}
			if p.sum.InnerSteps != cfg.H*cfg.Steps || p.sum.InnerTime <= 0 || p.sum.TrainTime < p.sum.InnerTime {
				t.Fatalf("%s: %d inner steps in %v of %v", p.host, p.sum.InnerSteps, p.sum.InnerTime, p.sum.TrainTime)
			}
		}
	}
}

// serialStreaming replays streaming DiLoCo with world peers in one goroutine and returns the final
// global parameters.
func serialStreaming(train *diloco.Dataset, cfg diloco.TrainerConfig, world int) []float32 {
	n := diloco.NumParams
	global := diloco.NewMLP(cfg.Seed).Params
	mom := make([]float32, n)
	type worker struct {
		local, errfb, grads []float32
		adam                *diloco.AdamW
		enc                 *diloco.Encoder
		s                   *diloco.Sampler
		m                   diloco.MLP
	}
	ws := make([]*worker, world)
	for r := range ws {
		ws[r] = &worker{local: slices.Clone(global), errfb: make([]float32, n), grads: make([]float32, n),
			adam: diloco.NewAdamW(cfg.Inner, n), enc: diloco.NewEncoder(cfg.Compression)}
	}
	x := make([]float32, cfg.BatchSize*diloco.InputSize)
	y := make([]uint8, cfg.BatchSize)
	b := cfg.H / cfg.Fragments
	span := func(f int) (int, int) { return f * n / cfg.Fragments, (f + 1) * n / cfg.Fragments }
	var epoch, consumed uint64
	due, dueFrag := -1, -1 // step at which a fragment is mixed in, and which
	mixIn := func() {
		lo, hi := span(dueFrag)
		for _, w := range ws {
			for i := lo; i < hi; i++ {
				w.local[i] = float32(cfg.Mix*w.local[i]) + float32((1-cfg.Mix)*global[i])
			}
		}
		due = -1
	}
	launch := func(c int) {
		f := (c/b - 1) % cfg.Fragments
		lo, hi := span(f)
		avg := make([]float32, hi-lo)
		if !cfg.Compression.Enabled() {
			for i := range avg {
				var sum float32
				for _, w := range ws {
					sum += global[lo+i] - w.local[lo+i]
				}
				avg[i] = sum / float32(world)
			}
		} else {
			size := cfg.Compression.PayloadBytes(hi - lo)
			for _, w := range ws {
				g := make([]float32, hi-lo)
				diloco.PseudoGradient(g, global[lo:hi], w.local[lo:hi])
				for i := range g {
					g[i] += w.errfb[lo+i]
				}
				p := make([]byte, size)
				w.enc.Encode(p, g)
				if err := cfg.Compression.DecodeAdd(avg, p); err != nil {
					panic(err)
				}
				w.enc.Feedback(w.errfb[lo:hi], g)
			}
			for i := range avg {
				avg[i] /= float32(world)
			}
		}
		o := diloco.Nesterov{Config: diloco.NewNesterov(cfg.Outer, 0).Config, State: mom[lo:hi]}
		o.Step(global[lo:hi], avg)
		due, dueFrag = c+cfg.SyncDelay, f
	}
	for c := 0; ; c += b {
		if due == c {
			mixIn()
		}
		if c > 0 {
			launch(c)
			if cfg.SyncDelay == 0 || c >= cfg.Steps*cfg.H {
				mixIn()
			}
		}
		if c >= cfg.Steps*cfg.H {
			return global
		}
		for r, w := range ws {
			w.s = diloco.NewSampler(train, r, world)
			w.s.Epoch, w.s.Pos = epoch, int(consumed/uint64(world))
		}
		for step := c; step < c+b; step++ {
			if due == step {
				mixIn()
			}
			for _, w := range ws {
				w.m.Params = w.local
				bx, by := train.Batch(w.s.Next(cfg.BatchSize), x, y)
				w.m.LossGrad(bx, by, w.grads)
				w.adam.Step(w.local, w.grads)
			}
			consumed += uint64(world * cfg.BatchSize)
			for ; consumed >= uint64(train.N); consumed -= uint64(train.N) {
				epoch++
			}
		}
	}
}
