package rings

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// memRing returns the Streams of an in-process ring of world ranks.
func memRing(world int) []Stream {
	streams := make([]Stream, world)
	for r, s := range newRing(world) {
		streams[r] = s
	}
	return streams
}

// onEveryRank runs f(rank) for every rank concurrently and returns the errors.
func onEveryRank(world int, f func(rank int) error) []error {
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() { errs[r] = f(r) })
	}
	wg.Wait()
	return errs
}

// refReduced is refRing with a chosen finalization: div 0 leaves the reduced value unfinalized.
func refReduced(dt DType, op Op, inputs [][]byte, div int) []byte {
	world := len(inputs)
	count := len(inputs[0]) / dt.Size()
	out := make([]byte, len(inputs[0]))
	for c, sp := range Partition(count, world) {
		for i := sp.Off; i < sp.Off+sp.Len; i++ {
			v := loadBits(dt, inputs[c], i)
			for k := 1; k < world; k++ {
				v = refCombine(dt, op, v, loadBits(dt, inputs[(c+k)%world], i))
			}
			if div > 0 {
				v = refFinalize(dt, op, v, div)
			}
			storeBits(dt, out, i, v)
		}
	}
	return out
}

// bytesOf returns the byte range of span sp of dt elements.
func bytesOf(dt DType, sp Span) (lo, hi int) {
	return sp.Off * dt.Size(), (sp.Off + sp.Len) * dt.Size()
}

func TestOwnedChunkAndShard(t *testing.T) {
	for world := 1; world <= 6; world++ {
		owners := make([]int, world)
		for r := range world {
			c := OwnedChunk(r, world)
			owners[c]++
			if c != (r+1)%world {
				t.Fatalf("OwnedChunk(%d, %d) = %d", r, world, c)
			}
			if got, want := Shard(17, r, world), Partition(17, world)[c]; got != want {
				t.Fatalf("Shard(17, %d, %d) = %v, want %v", r, world, got, want)
			}
		}
		for c, n := range owners {
			if n != 1 {
				t.Fatalf("world %d: chunk %d has %d owners", world, c, n)
			}
		}
	}
}

func TestReduceScatterMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	i := 0
	for _, world := range []int{1, 2, 3, 5} {
		for _, dt := range allDTypes {
			for _, op := range allOps {
				for _, count := range []int{0, world - 1, 2*world + 3, 41} {
					divs := []Divisor{DivideByWorld, NoFinalize, 7}
					div := divs[i%len(divs)]
					opt := Options{PartBytes: []int{1, 3 * dt.Size(), 0}[i%3], Divisor: div}
					i++
					inputs := make([][]byte, world)
					bufs := make([][]byte, world)
					for r := range world {
						inputs[r] = randomElements(rng, dt, count)
						bufs[r] = bytes.Clone(inputs[r])
					}
					streams := memRing(world)
					errs := onEveryRank(world, func(r int) error {
						return ReduceScatter(context.Background(), streams[r], r, world, bufs[r], dt, op, opt)
					})
					want := refReduced(dt, op, inputs, map[Divisor]int{DivideByWorld: world, NoFinalize: 0, 7: 7}[div])
					for r := range world {
						if errs[r] != nil {
							t.Fatalf("W=%d %v %v count=%d: rank %d: %v", world, dt, op, count, r, errs[r])
						}
						sp := Shard(count, r, world)
						for e := sp.Off; e < sp.Off+sp.Len; e++ {
							g, w := loadBits(dt, bufs[r], e), loadBits(dt, want, e)
							if !refSame(dt, op, g, w) {
								t.Fatalf("W=%d %v %v count=%d divisor %d: rank %d element %d = %#x, want %#x", world, dt, op, count, div, r, e, g, w)
							}
						}
					}
				}
			}
		}
	}
}

// quantRoundTrip returns b passed through the encoding q part by part (the parts of chunk sp), as an
// owner adopts it.
func quantRoundTrip(dt DType, q Quant, b []byte, sp Span, partElems int) []byte {
	out := bytes.Clone(b)
	for off := sp.Off; off < sp.Off+sp.Len; off += partElems {
		n := min(partElems, sp.Off+sp.Len-off)
		lo, hi := off*dt.Size(), (off+n)*dt.Size()
		enc := make([]byte, QuantizedLen(dt, q, n))
		if err := Quantize(dt, q, enc, b[lo:hi]); err != nil {
			panic(err)
		}
		Dequantize(dt, q, out[lo:hi], enc)
	}
	return out
}

func TestAllGatherMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	i := 0
	for _, world := range []int{1, 2, 3, 4} {
		for _, dt := range allDTypes {
			quants := []Quant{NoQuant}
			if dt == F32 || dt == F64 {
				quants = append(quants, MinMaxU8, MinMaxU16)
			}
			for _, q := range quants {
				for _, count := range []int{0, world - 1, 2*world + 3, 41} {
					partBytes := []int{1, 3 * dt.Size(), 0}[i%3]
					i++
					bufs := make([][]byte, world)
					want := make([]byte, count*dt.Size())
					for r := range world {
						if q == NoQuant {
							bufs[r] = randomElements(rng, dt, count)
						} else {
							bufs[r] = moderateElements(rng, dt, count)
						}
						// want takes each chunk from its owner, encoded as the owner adopts it.
						sp := Shard(count, r, world)
						own := bufs[r]
						if q != NoQuant {
							own = quantRoundTrip(dt, q, own, sp, partElems(partBytes, dt.Size()))
						}
						lo, hi := bytesOf(dt, sp)
						copy(want[lo:hi], own[lo:hi])
					}
					streams := memRing(world)
					opt := Options{PartBytes: partBytes, Quant: q}
					errs := onEveryRank(world, func(r int) error {
						return AllGather(context.Background(), streams[r], r, world, bufs[r], dt, opt)
					})
					for r := range world {
						if errs[r] != nil {
							t.Fatalf("W=%d %v %v count=%d: rank %d: %v", world, dt, q, count, r, errs[r])
						}
						if !bytes.Equal(bufs[r], want) {
							t.Fatalf("W=%d %v %v count=%d partBytes=%d: rank %d holds %x, want %x", world, dt, q, count, partBytes, r, bufs[r], want)
						}
					}
				}
			}
		}
	}
}

// TestReduceScatterThenAllGatherIsAllReduce checks bit for bit, NaN payloads included, that the two
// halves in a row on one stream compute what AllReduce computes.
func TestReduceScatterThenAllGatherIsAllReduce(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 26))
	i := 0
	for _, world := range []int{1, 2, 3, 4} {
		for _, dt := range allDTypes {
			for _, op := range allOps {
				quants := []Quant{NoQuant}
				if dt == F32 || dt == F64 {
					quants = append(quants, MinMaxU8)
				}
				for _, q := range quants {
					count := []int{world + 1, 37}[i%2]
					opt := Options{PartBytes: []int{2 * dt.Size(), 0}[i%2], Quant: q}
					i++
					inputs := make([][]byte, world)
					for r := range world {
						if q == NoQuant {
							inputs[r] = randomElements(rng, dt, count)
						} else {
							inputs[r] = moderateElements(rng, dt, count)
						}
					}
					flat := make([][]byte, world)
					flatStreams := memRing(world)
					errs := onEveryRank(world, func(r int) error {
						flat[r] = make([]byte, len(inputs[r]))
						return AllReduce(context.Background(), flatStreams[r], r, world, inputs[r], flat[r], dt, op, opt, nil)
					})
					halves := make([][]byte, world)
					streams := memRing(world)
					errs2 := onEveryRank(world, func(r int) error {
						halves[r] = bytes.Clone(inputs[r])
						rs := opt
						rs.Quant = NoQuant
						if err := ReduceScatter(context.Background(), streams[r], r, world, halves[r], dt, op, rs); err != nil {
							return err
						}
						return AllGather(context.Background(), streams[r], r, world, halves[r], dt, opt)
					})
					for r := range world {
						if errs[r] != nil || errs2[r] != nil {
							t.Fatalf("W=%d %v %v %v: rank %d: %v, %v", world, dt, op, q, r, errs[r], errs2[r])
						}
						if !bytes.Equal(flat[r], halves[r]) {
							t.Fatalf("W=%d %v %v %v: rank %d: halves %x, AllReduce %x", world, dt, op, q, r, halves[r], flat[r])
						}
					}
				}
			}
		}
	}
}

// hierarchy describes sites of per ranks each; global rank g is rank g%per of site g/per.
type hierarchy struct{ sites, per int }

func (h hierarchy) world() int { return h.sites * h.per }

// rings returns the streams of each site's ring and of each cross-site ring (one per site rank).
func (h hierarchy) rings(mk func(int) []Stream) (site, cross [][]Stream) {
	for range h.sites {
		site = append(site, mk(h.per))
	}
	for range h.per {
		cross = append(cross, mk(h.sites))
	}
	return site, cross
}

// plan returns global rank g's three-phase hierarchical AllReduce of count elements: reduce-scatter in
// the site without finalizing, all-reduce of the owned shard across sites dividing by the total peer
// count (with quantization q), all-gather in the site.
func (h hierarchy) plan(g int, site, cross [][]Stream, dt DType, op Op, count, partBytes int, q Quant) Plan {
	s, l := g/h.per, g%h.per
	lo, hi := bytesOf(dt, Shard(count, l, h.per))
	n := count * dt.Size()
	return Plan{DType: dt, Op: op, PartBytes: partBytes, Phases: []Phase{
		{Kind: KindReduceScatter, Stream: site[s][l], Rank: l, World: h.per, Len: n, Divisor: NoFinalize},
		{Kind: KindAllReduce, Stream: cross[l][s], Rank: s, World: h.sites, Off: lo, Len: hi - lo, Divisor: Divisor(h.world()), Quant: q},
		{Kind: KindAllGather, Stream: site[s][l], Rank: l, World: h.per, Len: n},
	}}
}

// exactElements returns n values of dt whose sums and products over a few peers are exact in every
// order, with no negative zero: small multiples of 1/8 for Sum, Avg, Min and Max, powers of two for
// Prod; integers are random.
func exactElements(rng *rand.Rand, dt DType, op Op, n int) []byte {
	if !dt.isFloat() {
		return randomElements(rng, dt, n)
	}
	b := make([]byte, n*dt.Size())
	for i := range n {
		v := float64(rng.IntN(65)-32) / 8
		if op == Prod {
			v = []float64{0, 0.5, -0.5, 1, -1, 2, -2}[rng.IntN(7)]
		}
		storeBits(dt, b, i, refFromFloat(dt, v))
	}
	return b
}

// TestHierarchicalPlanEqualsFlatAllReduce runs the three-phase plan over in-process rings and compares
// it with a flat AllReduce over all peers: bit-identical for every op on inputs where the order of
// reduction does not matter, and for float Avg equal to the exact sum divided once.
func TestHierarchicalPlanEqualsFlatAllReduce(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 28))
	i := 0
	for _, h := range []hierarchy{{2, 3}, {3, 2}, {1, 4}, {4, 1}} {
		world := h.world()
		for _, dt := range allDTypes {
			for _, op := range allOps {
				count := []int{world - 1, 4*world + 5, 53}[i%3]
				partBytes := []int{dt.Size(), 3 * dt.Size(), 0}[i%3]
				i++
				inputs := make([][]byte, world)
				for g := range world {
					inputs[g] = exactElements(rng, dt, op, count)
				}
				flat := make([][]byte, world)
				flatStreams := memRing(world)
				errs := onEveryRank(world, func(g int) error {
					flat[g] = make([]byte, len(inputs[g]))
					return AllReduce(context.Background(), flatStreams[g], g, world, inputs[g], flat[g], dt, op, Options{}, nil)
				})
				site, cross := h.rings(memRing)
				hier := make([][]byte, world)
				commits := make([]int, world)
				errs2 := onEveryRank(world, func(g int) error {
					hier[g] = make([]byte, len(inputs[g]))
					commit := func() error { commits[g]++; return nil }
					return h.plan(g, site, cross, dt, op, count, partBytes, NoQuant).Execute(context.Background(), inputs[g], hier[g], commit)
				})
				var want []byte
				if dt.isFloat() && op == Avg {
					want = refFinalize6(dt, refReduced(dt, Sum, inputs, 0), world)
				}
				for g := range world {
					if errs[g] != nil || errs2[g] != nil {
						t.Fatalf("%v %v %v: rank %d: %v, %v", h, dt, op, g, errs[g], errs2[g])
					}
					if commits[g] != 1 {
						t.Fatalf("%v %v %v: rank %d committed %d times", h, dt, op, g, commits[g])
					}
					if !bytes.Equal(hier[g], flat[g]) {
						t.Fatalf("%v %v %v count=%d: rank %d: hierarchical %x, flat %x", h, dt, op, count, g, hier[g], flat[g])
					}
					if want != nil && !bytes.Equal(hier[g], want) {
						t.Fatalf("%v %v Avg: rank %d: %x, want the sum divided once %x", h, dt, g, hier[g], want)
					}
				}
			}
		}
	}
}

// refFinalize6 finalizes every element of a reduced Avg buffer.
func refFinalize6(dt DType, sum []byte, world int) []byte {
	out := make([]byte, len(sum))
	for i := range len(sum) / dt.Size() {
		storeBits(dt, out, i, refFinalize(dt, Avg, loadBits(dt, sum, i), world))
	}
	return out
}

// TestHierarchicalPlanIsDeterministic runs the plan on arbitrary bits, with the cross-site phase
// quantized, and checks that every peer holds the same bytes.
func TestHierarchicalPlanIsDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 30))
	h := hierarchy{2, 3}
	world := h.world()
	for _, c := range []struct {
		dt DType
		op Op
		q  Quant
	}{{F32, Sum, NoQuant}, {F16, Avg, NoQuant}, {BF16, Prod, NoQuant}, {F32, Avg, MinMaxU8}, {F64, Sum, MinMaxU16}} {
		const count = 61
		inputs := make([][]byte, world)
		for g := range world {
			if c.q == NoQuant {
				inputs[g] = randomElements(rng, c.dt, count)
			} else {
				inputs[g] = moderateElements(rng, c.dt, count)
			}
		}
		site, cross := h.rings(memRing)
		out := make([][]byte, world)
		errs := onEveryRank(world, func(g int) error {
			out[g] = bytes.Clone(inputs[g])
			return h.plan(g, site, cross, c.dt, c.op, count, 8, c.q).Execute(context.Background(), out[g], out[g], nil)
		})
		for g := range world {
			if errs[g] != nil {
				t.Fatalf("%v: rank %d: %v", c, g, errs[g])
			}
			if !bytes.Equal(out[g], out[0]) {
				t.Fatalf("%v: rank %d differs from rank 0", c, g)
			}
		}
	}
}

// hierRun is one execution of the hierarchical plan with fault injection.
type hierRun struct {
	errs                   []error
	sendBefore, recvBefore [][]byte
	send, recv             [][]byte
}

// runHierarchy executes h's plan on every rank with fresh memStreams; inject sees the site and cross
// streams (indexed as hierarchy.rings returns them) before the ranks start. The commits stand for the
// group's agreement: a rank commits only if every rank completed its phases and none is veto.
func runHierarchy(rng *rand.Rand, h hierarchy, dt DType, op Op, q Quant, count int, inPlace bool,
	inputs func(g int) []byte, inject func(site, cross [][]*memStream), ctx func(g int) context.Context, veto int) hierRun {
	world := h.world()
	run := hierRun{
		errs: make([]error, world), send: make([][]byte, world), recv: make([][]byte, world),
		sendBefore: make([][]byte, world), recvBefore: make([][]byte, world),
	}
	for g := range world {
		run.send[g] = inputs(g)
		run.recv[g] = run.send[g]
		if !inPlace {
			run.recv[g] = randomElements(rng, dt, count)
		}
		run.sendBefore[g] = bytes.Clone(run.send[g])
		run.recvBefore[g] = bytes.Clone(run.recv[g])
	}
	var siteMem, crossMem [][]*memStream
	site, cross := h.rings(func(n int) []Stream {
		ms := newRing(n)
		if len(siteMem) < h.sites {
			siteMem = append(siteMem, ms)
		} else {
			crossMem = append(crossMem, ms)
		}
		streams := make([]Stream, n)
		for i, s := range ms {
			streams[i] = s
		}
		return streams
	})
	if inject != nil {
		inject(siteMem, crossMem)
	}
	vote := newBallot(world)
	run.errs = onEveryRank(world, func(g int) error {
		c := context.Background()
		if ctx != nil {
			c = ctx(g)
		}
		voted := false
		commit := func() error {
			voted = true
			vote.vote(g != veto)
			return vote.result()
		}
		err := h.plan(g, site, cross, dt, op, count, 4*dt.Size(), q).Execute(c, run.send[g], run.recv[g], commit)
		if !voted {
			vote.vote(false)
		}
		return err
	})
	return run
}

func (run hierRun) checkAborted(t *testing.T, what string) {
	t.Helper()
	for g := range run.errs {
		if !errors.Is(run.errs[g], ErrAborted) {
			t.Fatalf("%s: rank %d: error %v, want ErrAborted", what, g, run.errs[g])
		}
		if !bytes.Equal(run.send[g], run.sendBefore[g]) || !bytes.Equal(run.recv[g], run.recvBefore[g]) {
			t.Fatalf("%s: rank %d buffers modified by a failed plan", what, g)
		}
	}
}

// TestPlanAbortInEachPhase fails a link in each phase of the hierarchical plan (site ring frames for
// phases 1 and 3, cross-site frames for phase 2), cancels a context, vetoes the commit, and makes the
// quantized phase meet a NaN: every peer fails with ErrAborted and every buffer stays as it was.
func TestPlanAbortInEachPhase(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	h := hierarchy{2, 3}
	const dt, op, count = F32, Sum, 48 // 16 elements per site chunk, 4 per part: 4 parts
	siteFrames := (h.per - 1) * 4      // frames per site rank in each of phases 1 and 3
	inputs := func(int) []byte { return moderateElements(rng, dt, count) }
	for _, inPlace := range []bool{false, true} {
		for _, c := range []struct {
			name   string
			inject func(site, cross [][]*memStream)
		}{
			{"phase 1 send", func(site, _ [][]*memStream) { site[0][1].failSendAt = 2 }},
			{"phase 1 recv", func(site, _ [][]*memStream) { site[1][2].failRecvAt = siteFrames }},
			{"phase 2 send", func(_, cross [][]*memStream) { cross[1][0].failSendAt = 1 }},
			{"phase 2 recv", func(_, cross [][]*memStream) { cross[2][1].failRecvAt = 2 }},
			{"phase 3 send", func(site, _ [][]*memStream) { site[1][0].failSendAt = siteFrames + 1 }},
			{"phase 3 recv", func(site, _ [][]*memStream) { site[0][2].failRecvAt = 2 * siteFrames }},
		} {
			what := fmt.Sprintf("%s inPlace=%v", c.name, inPlace)
			run := runHierarchy(rng, h, dt, op, NoQuant, count, inPlace, inputs, c.inject, nil, -1)
			run.checkAborted(t, what)
			injected := 0
			for _, err := range run.errs {
				if errors.Is(err, errInjected) {
					injected++
				}
			}
			if injected != 1 {
				t.Fatalf("%s: %d ranks report the injected failure, want 1", what, injected)
			}
		}

		// A context canceled during the cross-site phase, when the victim receives its first frame.
		ctx, cancel := context.WithCancel(context.Background())
		const victim = 4 // site 1, site rank 1
		run := runHierarchy(rng, h, dt, op, NoQuant, count, inPlace, inputs, func(_, cross [][]*memStream) {
			cross[victim%h.per][victim/h.per].onRecv = func(s *memStream, n int) error {
				cancel()
				<-s.abort
				return s.aborted()
			}
		}, func(g int) context.Context {
			if g == victim {
				return ctx
			}
			return context.Background()
		}, -1)
		cancel()
		run.checkAborted(t, "cancel")
		if !errors.Is(run.errs[victim], context.Canceled) {
			t.Fatalf("cancel: victim error %v", run.errs[victim])
		}

		// A commit vetoed after every phase completed.
		run = runHierarchy(rng, h, dt, op, NoQuant, count, inPlace, inputs, nil, nil, 2)
		run.checkAborted(t, "veto")
		for g, err := range run.errs {
			if !errors.Is(err, errVetoed) {
				t.Fatalf("veto: rank %d: %v", g, err)
			}
		}

		// A NaN reaches the quantized cross-site phase.
		nan := func(g int) []byte {
			b := moderateElements(rng, dt, count)
			if g == 5 {
				storeBits(dt, b, 7, 0x7fc00000)
			}
			return b
		}
		run = runHierarchy(rng, h, dt, op, MinMaxU8, count, inPlace, nan, nil, nil, -1)
		run.checkAborted(t, "non-finite")
		nonFinite := 0
		for _, err := range run.errs {
			if errors.Is(err, ErrNonFinite) {
				nonFinite++
			}
		}
		if nonFinite == 0 {
			t.Fatal("non-finite: no rank reports ErrNonFinite")
		}
	}
	goleak.VerifyNone(t)
}

func TestPlanRejectsBadPhases(t *testing.T) {
	s := newRing(2)[0]
	ok := Phase{Kind: KindAllReduce, Stream: s, Rank: 0, World: 2, Len: 16}
	b16 := make([]byte, 16)
	cases := []struct {
		name string
		mod  func(p *Plan)
	}{
		{"no phases", func(p *Plan) { p.Phases = nil }},
		{"bad kind", func(p *Plan) { p.Phases[0].Kind = 0 }},
		{"no stream", func(p *Plan) { p.Phases[0].Stream = nil }},
		{"external without runner", func(p *Plan) { p.Phases[0].Kind, p.Phases[0].Stream = KindExternal, nil }},
		{"external past the end", func(p *Plan) { p.Phases[0].Kind, p.Phases[0].Runner, p.Phases[0].Off = KindExternal, &scaleRunner{}, 4 }},
		{"region past the end", func(p *Plan) { p.Phases[0].Off = 4 }},
		{"negative offset", func(p *Plan) { p.Phases[0].Off, p.Phases[0].Len = -4, 4 }},
		{"partial element", func(p *Plan) { p.Phases[0].Len = 6 }},
		{"bad divisor", func(p *Plan) { p.Phases[0].Divisor = -2 }},
		{"all-gather with divisor", func(p *Plan) { p.Phases[0].Kind, p.Phases[0].Divisor = KindAllGather, 3 }},
		{"quantized reduce-scatter", func(p *Plan) { p.Phases[0].Kind, p.Phases[0].Quant = KindReduceScatter, MinMaxU8 }},
		{"quantized integers", func(p *Plan) { p.DType, p.Phases[0].Quant = I32, MinMaxU8 }},
		{"rank outside", func(p *Plan) { p.Phases[0].Rank = 2 }},
		{"negative part size", func(p *Plan) { p.PartBytes = -1 }},
		{"bad op", func(p *Plan) { p.Op = 0 }},
		{"second phase bad", func(p *Plan) { p.Phases = append(p.Phases, Phase{Kind: KindAllGather, Stream: s, World: 0}) }},
	}
	for _, c := range cases {
		p := Plan{DType: F32, Op: Sum, Phases: []Phase{ok}}
		c.mod(&p)
		if err := p.Execute(context.Background(), b16, b16, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: error %v, want ErrInvalid", c.name, err)
		}
	}
	if s.sends != 0 || s.recvs != 0 {
		t.Error("stream used by an invalid plan")
	}
	if err := ReduceScatter(context.Background(), s, 0, 2, b16, F32, Sum, Options{Quant: MinMaxU8}); !errors.Is(err, ErrInvalid) {
		t.Errorf("quantized ReduceScatter: %v", err)
	}
	if err := AllGather(context.Background(), s, 0, 2, b16, F32, Options{Divisor: NoFinalize}); !errors.Is(err, ErrInvalid) {
		t.Errorf("AllGather with a divisor: %v", err)
	}
	for _, k := range []Kind{KindReduceScatter, KindAllGather, KindAllReduce, KindExternal, 0, 9} {
		if k.Valid() == (k.String() == fmt.Sprintf("kind(%d)", uint8(k))) {
			t.Errorf("kind %d: Valid %v, String %q", uint8(k), k.Valid(), k.String())
		}
	}
}

// TestPlanFirstPhaseOnPartOfTheBuffer checks the staging buffer's start: the bytes outside the first
// phase's region are send's, for each kind of first phase.
func TestPlanFirstPhaseOnPartOfTheBuffer(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	const world, dt, count = 3, I16, 20
	const off, n = 3, 13 // elements
	lo, hi := off*dt.Size(), (off+n)*dt.Size()
	for _, k := range []Kind{KindAllReduce, KindReduceScatter, KindAllGather} {
		inputs := make([][]byte, world)
		for r := range world {
			inputs[r] = randomElements(rng, dt, count)
		}
		streams := memRing(world)
		out := make([][]byte, world)
		errs := onEveryRank(world, func(r int) error {
			out[r] = make([]byte, len(inputs[r]))
			p := Plan{DType: dt, Op: Max, PartBytes: 4, Phases: []Phase{{Kind: k, Stream: streams[r], Rank: r, World: world, Off: lo, Len: hi - lo}}}
			return p.Execute(context.Background(), inputs[r], out[r], nil)
		})
		region := make([][]byte, world)
		for r := range world {
			region[r] = inputs[r][lo:hi]
		}
		reduced := refReduced(dt, Max, region, world)
		for r := range world {
			if errs[r] != nil {
				t.Fatalf("%v: rank %d: %v", k, r, errs[r])
			}
			if !bytes.Equal(out[r][:lo], inputs[r][:lo]) || !bytes.Equal(out[r][hi:], inputs[r][hi:]) {
				t.Fatalf("%v: rank %d: bytes outside the region differ from send", k, r)
			}
			got := out[r][lo:hi]
			switch k {
			case KindAllReduce:
				if !bytes.Equal(got, reduced) {
					t.Fatalf("%v: rank %d: %x, want %x", k, r, got, reduced)
				}
			case KindReduceScatter:
				// The owned chunk is reduced; the rank's own chunk, never received, is its input.
				for c, want := range map[int][]byte{OwnedChunk(r, world): reduced, r: region[r]} {
					clo, chi := bytesOf(dt, Partition(n, world)[c])
					if !bytes.Equal(got[clo:chi], want[clo:chi]) {
						t.Fatalf("%v: rank %d chunk %d: %x, want %x", k, r, c, got[clo:chi], want[clo:chi])
					}
				}
			case KindAllGather:
				for c := range world {
					owner := mod(c-1, world)
					clo, chi := bytesOf(dt, Partition(n, world)[c])
					if !bytes.Equal(got[clo:chi], region[owner][clo:chi]) {
						t.Fatalf("%v: rank %d chunk %d differs from its owner's", k, r, c)
					}
				}
			}
		}
	}
}

// scaleRunner is an external phase that writes its input times two (F32), or fails with err.
type scaleRunner struct {
	err     error
	ran     bool
	aborted atomic.Bool
}

func (s *scaleRunner) Run(ctx context.Context, in, out []byte) error {
	s.ran = true
	if s.err != nil {
		return s.err
	}
	for i := 0; i < len(in); i += 4 {
		v := math.Float32frombits(binary.LittleEndian.Uint32(in[i:]))
		binary.LittleEndian.PutUint32(out[i:], math.Float32bits(2*v))
	}
	return nil
}

func (s *scaleRunner) Abort(error) { s.aborted.Store(true) }

// TestPlanExternalPhases runs an external phase between ring phases: its output feeds the next phase,
// and a failure in it, or in a ring phase after it, aborts the plan with recv untouched and the runner
// told.
func TestPlanExternalPhases(t *testing.T) {
	const world, count = 3, 10
	input := func(r int) []byte {
		b := make([]byte, 4*count)
		for i := range count {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(r*100+i)))
		}
		return b
	}
	streams := memRing(world)
	out := make([][]byte, world)
	errs := onEveryRank(world, func(r int) error {
		out[r] = make([]byte, 4*count)
		p := Plan{DType: F32, Op: Sum, Phases: []Phase{
			{Kind: KindExternal, Runner: &scaleRunner{}, Rank: r, World: world, Len: 4 * count},
			{Kind: KindAllReduce, Stream: streams[r], Rank: r, World: world, Len: 4 * count},
		}}
		return p.Execute(context.Background(), input(r), out[r], nil)
	})
	for r := range world {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		for i := range count {
			want := float32(2 * (0*100 + 1*100 + 2*100 + 3*i))
			if got := math.Float32frombits(binary.LittleEndian.Uint32(out[r][4*i:])); got != want {
				t.Fatalf("rank %d element %d: %v, want %v", r, i, got, want)
			}
		}
	}

	cause := errors.New("the other tier failed")
	failing := &scaleRunner{err: cause}
	recv := bytes.Repeat([]byte{7}, 4*count)
	p := Plan{DType: F32, Op: Sum, Phases: []Phase{
		{Kind: KindExternal, Runner: &scaleRunner{}, World: 1, Len: 4 * count},
		{Kind: KindExternal, Runner: failing, World: 1, Len: 4 * count},
	}}
	err := p.Execute(context.Background(), input(0), recv, nil)
	if !errors.Is(err, ErrAborted) || !errors.Is(err, cause) {
		t.Fatalf("failing runner: %v, want ErrAborted and the cause", err)
	}
	if !bytes.Equal(recv, bytes.Repeat([]byte{7}, 4*count)) {
		t.Fatal("recv written by a failed plan")
	}
	if !failing.aborted.Load() {
		t.Fatal("the failing runner was not aborted")
	}

	// A ring phase that fails after an external one: the runner hears of it.
	first := &scaleRunner{}
	broken := memRing(2)
	broken[0].Abort(errors.New("gone"))
	p = Plan{DType: F32, Op: Sum, Phases: []Phase{
		{Kind: KindExternal, Runner: first, World: 2, Len: 4 * count},
		{Kind: KindAllReduce, Stream: broken[0], World: 2, Len: 4 * count},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Execute(ctx, input(0), recv, nil); !errors.Is(err, ErrAborted) {
		t.Fatalf("broken ring after an external phase: %v", err)
	}
	if !first.ran || !first.aborted.Load() {
		t.Fatalf("first runner: ran %v, aborted %v", first.ran, first.aborted.Load())
	}
}
