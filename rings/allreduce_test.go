package rings

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// refRing computes the expected AllReduce result the way the ring defines it: chunk c starts as rank
// c's contribution and visits ranks c+1, c+2, ..., c+W-1 (mod W), each folding its own contribution in
// on the right; the last of them, rank c-1, owns the chunk and finalizes it.
func refRing(dt DType, op Op, inputs [][]byte) []byte {
	world := len(inputs)
	count := len(inputs[0]) / dt.Size()
	out := make([]byte, len(inputs[0]))
	for c, sp := range Partition(count, world) {
		for i := sp.Off; i < sp.Off+sp.Len; i++ {
			v := loadBits(dt, inputs[c], i)
			for k := 1; k < world; k++ {
				v = refCombine(dt, op, v, loadBits(dt, inputs[(c+k)%world], i))
			}
			storeBits(dt, out, i, refFinalize(dt, op, v, world))
		}
	}
	return out
}

// ringCase describes one in-process AllReduce over a ring of memStreams.
type ringCase struct {
	world   int
	dt      DType
	op      Op
	count   int
	inPlace bool
	opt     Options
	veto    int                        // rank whose commit votes no; -1 for none
	inject  func(streams []*memStream) // fault injection, before the ranks start
	ctx     func(rank int) context.Context
}

func (c ringCase) String() string {
	return fmt.Sprintf("W=%d %v %v count=%d inPlace=%v partBytes=%d", c.world, c.dt, c.op, c.count, c.inPlace, c.opt.PartBytes)
}

// ringRun is what a ringCase did: per rank, the error, the buffers before and after.
type ringRun struct {
	errs                   []error
	sendBefore, recvBefore [][]byte
	send, recv             [][]byte
	committed              []bool
}

func runRing(t *testing.T, rng *rand.Rand, c ringCase) ringRun {
	t.Helper()
	n := c.world
	run := ringRun{
		errs: make([]error, n), committed: make([]bool, n),
		sendBefore: make([][]byte, n), recvBefore: make([][]byte, n),
		send: make([][]byte, n), recv: make([][]byte, n),
	}
	for r := range n {
		run.send[r] = randomElements(rng, c.dt, c.count)
		run.recv[r] = run.send[r]
		if !c.inPlace {
			run.recv[r] = randomElements(rng, c.dt, c.count)
		}
		run.sendBefore[r] = bytes.Clone(run.send[r])
		run.recvBefore[r] = bytes.Clone(run.recv[r])
	}
	streams := newRing(n)
	if c.inject != nil {
		c.inject(streams)
	}
	vote := newBallot(n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ctx := context.Background()
			if c.ctx != nil {
				ctx = c.ctx(r)
			}
			commit := func() error {
				run.committed[r] = true
				vote.vote(r != c.veto)
				return vote.result()
			}
			run.errs[r] = AllReduce(ctx, streams[r], r, n, run.send[r], run.recv[r], c.dt, c.op, c.opt, commit)
			if !run.committed[r] {
				vote.vote(false)
			}
		})
	}
	wg.Wait()
	return run
}

// checkSuccess asserts that every rank succeeded with every element equal to the reference, and that
// all ranks hold the same bytes.
func checkSuccess(t *testing.T, c ringCase, run ringRun) {
	t.Helper()
	want := refRing(c.dt, c.op, run.sendBefore)
	for r := range c.world {
		if run.errs[r] != nil {
			t.Fatalf("%v: rank %d: %v", c, r, run.errs[r])
		}
		for i := range c.count {
			g, w := loadBits(c.dt, run.recv[r], i), loadBits(c.dt, want, i)
			if !refSame(c.dt, c.op, g, w) {
				t.Fatalf("%v: rank %d element %d = %#x, want %#x", c, r, i, g, w)
			}
		}
		if !bytes.Equal(run.recv[r], run.recv[0]) {
			t.Fatalf("%v: rank %d result differs from rank 0", c, r)
		}
		if !c.inPlace && !bytes.Equal(run.send[r], run.sendBefore[r]) {
			t.Fatalf("%v: rank %d send buffer modified", c, r)
		}
	}
}

// checkAborted asserts that every rank failed with ErrAborted and left both buffers untouched.
func checkAborted(t *testing.T, c ringCase, run ringRun) {
	t.Helper()
	for r := range c.world {
		if !errors.Is(run.errs[r], ErrAborted) {
			t.Fatalf("%v: rank %d: error %v, want ErrAborted", c, r, run.errs[r])
		}
		if !bytes.Equal(run.send[r], run.sendBefore[r]) || !bytes.Equal(run.recv[r], run.recvBefore[r]) {
			t.Fatalf("%v: rank %d buffers modified by a failed operation", c, r)
		}
	}
}

func TestAllReduceMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	worlds := []int{1, 2, 3, 4, 5, 8}
	i := 0
	for _, w := range worlds {
		counts := []int{0, 1, w - 1, w + 1, 2*w + 3, 97}
		for _, dt := range allDTypes {
			for _, op := range allOps {
				for _, count := range counts {
					// Rotate through part sizes: one element, a few elements, a size that is not a
					// whole number of elements, and the default.
					parts := []int{1, 3 * dt.Size(), 7, 0}
					c := ringCase{
						world: w, dt: dt, op: op, count: count, veto: -1,
						inPlace: i%2 == 0,
						opt:     Options{PartBytes: parts[i%len(parts)]},
					}
					i++
					checkSuccess(t, c, runRing(t, rng, c))
				}
			}
		}
	}
}

func TestAllReduceLargeF32(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, inPlace := range []bool{false, true} {
		c := ringCase{world: 4, dt: F32, op: Avg, count: 100_003, inPlace: inPlace, veto: -1, opt: Options{PartBytes: 4096}}
		checkSuccess(t, c, runRing(t, rng, c))
	}
}

// framesPerRank returns how many frames each rank sends (and receives) for a case: 2W-2 steps, each
// carrying one chunk. With count divisible by W and by the part size, every rank sends the same number.
func framesPerRank(world, count, partElems int) int {
	return (2*world - 2) * ((count/world + partElems - 1) / partElems)
}

func TestAllReduceAbortOnLinkFailure(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	const world, count, partElems = 4, 80, 5
	total := framesPerRank(world, count, partElems) // 6 steps x 4 parts = 24
	rsFrames := total / 2                           // the all-gather starts after this many frames
	// Every frame in place (the buffer is the working buffer there, restored part by part); the
	// frames around the phase boundary out of place.
	for k := 1; k <= total; k++ {
		edge := slices.Contains([]int{1, 2, rsFrames - 1, rsFrames, rsFrames + 1, total - 1, total}, k)
		for _, onSend := range []bool{true, false} {
			for _, failing := range []int{0, 2} {
				for _, inPlace := range []bool{false, true} {
					if !inPlace && !edge {
						continue
					}
					c := ringCase{
						world: world, dt: F32, op: Sum, count: count, inPlace: inPlace, veto: -1,
						opt: Options{PartBytes: 4 * partElems},
						inject: func(s []*memStream) {
							if onSend {
								s[failing].failSendAt = k
							} else {
								s[failing].failRecvAt = k
							}
						},
					}
					run := runRing(t, rng, c)
					checkAborted(t, c, run)
					if !errors.Is(run.errs[failing], errInjected) {
						t.Fatalf("%v k=%d send=%v: failing rank error %v does not wrap the cause", c, k, onSend, run.errs[failing])
					}
				}
			}
		}
	}
	goleak.VerifyNone(t)
}

// TestAllReduceOnFailBeforeRestore checks that a failed in-place AllReduce calls Options.OnFail once,
// with the error it returns, while its buffer still holds what the ring wrote there, and that the
// buffer is restored when the call returns; a commit error and a success do not call it.
func TestAllReduceOnFailBeforeRestore(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	const world, count, partElems = 4, 80, 5
	total := framesPerRank(world, count, partElems)
	streams := newRing(world)
	streams[2].failRecvAt = total/2 + 1 // the first all-gather frame: the reduce-scatter wrote the buffer
	bufs, before := make([][]byte, world), make([][]byte, world)
	for r := range world {
		bufs[r] = randomElements(rng, F32, count)
		before[r] = bytes.Clone(bufs[r])
	}
	calls, errs, written := make([]int, world), make([]error, world), make([]bool, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			opt := Options{PartBytes: 4 * partElems, OnFail: func(err error) {
				calls[r]++
				errs[r] = err
				written[r] = !bytes.Equal(bufs[r], before[r])
			}}
			// A rank whose ring completed before the abort reached it succeeds, without OnFail.
			err := AllReduce(context.Background(), streams[r], r, world, bufs[r], bufs[r], F32, Sum, opt, nil)
			if err != errs[r] || (err != nil && !errors.Is(err, ErrAborted)) {
				t.Errorf("rank %d: returned %v, OnFail saw %v; want the same error, ErrAborted", r, err, errs[r])
			}
		})
	}
	wg.Wait()
	for r := range world {
		if want := btoi(errs[r] != nil); calls[r] != want {
			t.Fatalf("rank %d: OnFail called %d times, want %d", r, calls[r], want)
		}
		if errs[r] != nil && !bytes.Equal(bufs[r], before[r]) {
			t.Fatalf("rank %d: buffer not restored after the failure", r)
		}
	}
	if calls[2] != 1 || !written[2] {
		t.Fatalf("failing rank: OnFail called %d times, buffer written when it ran %v; want once, before the restore", calls[2], written[2])
	}

	for _, veto := range []int{-1, 1} {
		n := 0
		c := ringCase{world: 3, dt: F32, op: Sum, count: 40, inPlace: true, veto: veto,
			opt: Options{PartBytes: 16, OnFail: func(error) { n++ }}}
		run := runRing(t, rng, c)
		if veto < 0 {
			checkSuccess(t, c, run)
		} else {
			checkAborted(t, c, run)
		}
		if n != 0 {
			t.Fatalf("veto %d: OnFail called %d times, want 0", veto, n)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestAllReduceAbortWhenCommitFails(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, w := range []int{1, 3, 5} {
		for _, inPlace := range []bool{false, true} {
			c := ringCase{world: w, dt: BF16, op: Avg, count: 33, inPlace: inPlace, veto: w - 1, opt: Options{PartBytes: 8}}
			run := runRing(t, rng, c)
			checkAborted(t, c, run)
			for r := range w {
				if !run.committed[r] || !errors.Is(run.errs[r], errVetoed) {
					t.Fatalf("%v: rank %d committed=%v err=%v", c, r, run.committed[r], run.errs[r])
				}
			}
		}
	}
}

func TestAllReduceContextCanceled(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	const world, count, partElems = 3, 60, 4
	total := framesPerRank(world, count, partElems)
	for _, k := range []int{1, total / 2, total - 1} {
		ctx, cancel := context.WithCancel(context.Background())
		const victim = 1
		c := ringCase{
			world: world, dt: I32, op: Max, count: count, veto: -1,
			opt: Options{PartBytes: 4 * partElems},
			ctx: func(r int) context.Context {
				if r == victim {
					return ctx
				}
				return context.Background()
			},
			inject: func(s []*memStream) {
				// After its k-th frame the victim's context is canceled, and its link stalls until
				// AllReduce notices the cancellation and aborts the stream.
				s[victim].onRecv = func(s *memStream, n int) error {
					if n != k {
						return nil
					}
					cancel()
					<-s.abort
					return s.aborted()
				}
			},
		}
		run := runRing(t, rng, c)
		cancel()
		checkAborted(t, c, run)
		if !errors.Is(run.errs[victim], context.Canceled) {
			t.Fatalf("k=%d: victim error %v does not wrap context.Canceled", k, run.errs[victim])
		}
	}
	goleak.VerifyNone(t)
}

func TestAllReduceContextDoneBeforeStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := newRing(2)[0]
	send := make([]byte, 16)
	err := AllReduce(ctx, s, 0, 2, send, send, F32, Sum, Options{}, func() error {
		t.Error("commit called")
		return nil
	})
	if !errors.Is(err, ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v", err)
	}
	select {
	case <-s.abort:
	default:
		t.Fatal("stream not aborted")
	}
}

func TestAllReduceRejectsBadArguments(t *testing.T) {
	b8, b12 := make([]byte, 8), make([]byte, 12)
	cases := []struct {
		name        string
		rank, world int
		send, recv  []byte
		dt          DType
		op          Op
		opt         Options
	}{
		{"rank too large", 2, 2, b8, b8, F32, Sum, Options{}},
		{"negative rank", -1, 2, b8, b8, F32, Sum, Options{}},
		{"zero world", 0, 0, b8, b8, F32, Sum, Options{}},
		{"length mismatch", 0, 2, b8, b12, F32, Sum, Options{}},
		{"partial element", 0, 2, b12, b12, F64, Sum, Options{}},
		{"bad dtype", 0, 2, b8, b8, 0, Sum, Options{}},
		{"bad op", 0, 2, b8, b8, F32, 0, Options{}},
		{"negative part size", 0, 2, b8, b8, F32, Sum, Options{PartBytes: -1}},
	}
	for _, c := range cases {
		s := newRing(2)[0]
		err := AllReduce(context.Background(), s, c.rank, c.world, c.send, c.recv, c.dt, c.op, c.opt, nil)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: error %v, want ErrInvalid", c.name, err)
		}
		if s.sends != 0 || s.recvs != 0 {
			t.Errorf("%s: stream used", c.name)
		}
	}
}

func TestAllReduceNilCommit(t *testing.T) {
	streams := newRing(2)
	in := [][]float64{{1, 2, 3}, {10, 20, 30}}
	out := [][]float64{make([]float64, 3), make([]float64, 3)}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Go(func() {
			errs[r] = AllReduce(context.Background(), streams[r], r, 2, Bytes(in[r]), Bytes(out[r]), F64, Sum, Options{}, nil)
		})
	}
	wg.Wait()
	for r := range 2 {
		if errs[r] != nil || out[r][0] != 11 || out[r][1] != 22 || out[r][2] != 33 {
			t.Fatalf("rank %d: %v %v", r, out[r], errs[r])
		}
	}
}

// BenchmarkAllReduceRing runs a W=4 in-process ring over 64 MiB of f32 per rank. GB/s is the
// algorithm bandwidth (buffer bytes per second); busGB/s multiplies it by 2(W-1)/W, the share of the
// buffer each rank actually sends.
func BenchmarkAllReduceRing(b *testing.B) { benchmarkRing(b, NoQuant) }

// BenchmarkAllReduceRingQuantized is BenchmarkAllReduceRing with the all-gather encoded as MinMaxU8.
func BenchmarkAllReduceRingQuantized(b *testing.B) { benchmarkRing(b, MinMaxU8) }

func benchmarkRing(b *testing.B, q Quant) {
	const world, size = 4, 64 << 20
	bufs := make([][]byte, world)
	for r := range bufs {
		bufs[r] = make([]byte, size)
	}
	var pool BufferPool
	b.SetBytes(size)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		streams := newRing(world)
		var wg sync.WaitGroup
		for r := range world {
			wg.Go(func() {
				err := AllReduce(context.Background(), streams[r], r, world, bufs[r], bufs[r], F32, Avg, Options{Pool: &pool, Quant: q}, nil)
				if err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
	}
	gbps := float64(b.N) * size / time.Since(start).Seconds() / 1e9
	b.ReportMetric(gbps, "GB/s")
	b.ReportMetric(gbps*2*(world-1)/world, "busGB/s")
}

// TestAllReduceAllocationsDoNotGrowWithParts checks that the pipeline allocates per call, not per part.
func TestAllReduceAllocationsDoNotGrowWithParts(t *testing.T) {
	var pool BufferPool
	allocs := func(partBytes int) float64 {
		in := [][]byte{make([]byte, 4096), make([]byte, 4096)}
		return testing.AllocsPerRun(20, func() {
			streams := newRing(2)
			done := make(chan error, 1)
			go func() {
				done <- AllReduce(context.Background(), streams[1], 1, 2, in[1], in[1], F32, Sum, Options{PartBytes: partBytes, Pool: &pool}, nil)
			}()
			if err := AllReduce(context.Background(), streams[0], 0, 2, in[0], in[0], F32, Sum, Options{PartBytes: partBytes, Pool: &pool}, nil); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
	few, many := allocs(4096), allocs(8) // 1 part per chunk versus 256
	t.Logf("allocations per call: %v with 1 part per chunk, %v with 256", few, many)
	if many > few+16 {
		t.Fatalf("%v allocations with 256 parts per chunk, %v with 1: allocation per part", many, few)
	}
}
