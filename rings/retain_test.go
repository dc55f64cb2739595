package rings

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// This file holds a Stream that keeps every payload until the receiver acknowledges it, as a stream
// that retransmits without copies does, and checks the Retainer contract from the stream's side: a
// payload is unchanged from Send until its acknowledgement, and every sent frame is awaited.

var retainSeed = maphash.MakeSeed()

// retained is one frame in flight: the caller's payload itself, and its hash at Send. withdrawn
// (guarded by the link's mu) marks a frame whose AwaitAcked gave up after an abort: like a real
// transport skipping the frames of an aborted operation, the link no longer reads its payload.
type retained struct {
	id        ChunkID
	payload   []byte
	sum       uint64
	withdrawn bool
}

// retainLink is one direction of a ring edge. Acknowledgements are held back and given in a shuffled
// order: in batches of batch frames, or at once when the sender waits for one.
type retainLink struct {
	frames chan *retained
	closed chan struct{}
	once   sync.Once
	batch  int

	mu         sync.Mutex
	rng        *rand.Rand            // guarded by mu
	pending    []*retained           // received, not yet acknowledged; guarded by mu
	unacked    map[ChunkID]*retained // sent, not yet acknowledged; guarded by mu
	waiting    int                   // AwaitAcked calls waiting; guarded by mu
	changed    chan struct{}         // closed when acknowledgements were given; guarded by mu
	violations []string              // guarded by mu
}

func newRetainLink(seed uint64, batch int) *retainLink {
	return &retainLink{
		frames: make(chan *retained, 3), closed: make(chan struct{}), batch: batch,
		rng: rand.New(rand.NewPCG(seed, 1)), unacked: map[ChunkID]*retained{}, changed: make(chan struct{}),
	}
}

func (l *retainLink) close() { l.once.Do(func() { close(l.closed) }) }

// ackAll acknowledges every pending frame in a random order, checking first that its payload is the
// one sent. l.mu is held.
func (l *retainLink) ackAll() {
	l.rng.Shuffle(len(l.pending), func(i, j int) { l.pending[i], l.pending[j] = l.pending[j], l.pending[i] })
	for _, f := range l.pending {
		if maphash.Bytes(retainSeed, f.payload) != f.sum {
			l.violations = append(l.violations, fmt.Sprintf("frame %v modified before its acknowledgement", f.id))
		}
		if l.unacked[f.id] == f {
			delete(l.unacked, f.id)
		}
	}
	l.pending = l.pending[:0]
	close(l.changed)
	l.changed = make(chan struct{})
}

// retainStream is one rank's Stream; unawaited (guarded by mu) holds the frames sent and not yet
// passed to AwaitAcked.
type retainStream struct {
	out, in  *retainLink
	abort    chan struct{}
	once     sync.Once
	abortErr error

	mu        sync.Mutex
	unawaited map[ChunkID]bool

	failSendAt int // the n-th Send (from 1) fails with errInjected; 0 = never
	sends      int // owned by the sending goroutine
}

// newRetainRing returns the streams of a ring of world ranks whose acknowledgements come in batches.
func newRetainRing(world, batch int, seed uint64) []*retainStream {
	links := make([]*retainLink, world)
	for i := range links {
		links[i] = newRetainLink(seed+uint64(i), batch)
	}
	streams := make([]*retainStream, world)
	for r := range streams {
		streams[r] = &retainStream{out: links[r], in: links[(r+world-1)%world], abort: make(chan struct{}), unawaited: map[ChunkID]bool{}}
	}
	return streams
}

func (s *retainStream) aborted() error { return fmt.Errorf("stream aborted: %w", s.abortErr) }

func (s *retainStream) Send(id ChunkID, payload []byte) error {
	s.sends++
	if s.sends == s.failSendAt {
		return errInjected
	}
	f := &retained{id: id, payload: payload, sum: maphash.Bytes(retainSeed, payload)}
	l := s.out
	l.mu.Lock()
	l.unacked[id] = f
	l.mu.Unlock()
	forget := func() {
		l.mu.Lock()
		if l.unacked[id] == f {
			delete(l.unacked, id)
		}
		l.mu.Unlock()
	}
	select {
	case l.frames <- f:
		s.mu.Lock()
		s.unawaited[id] = true
		s.mu.Unlock()
		return nil
	case <-l.closed:
		forget()
		return errLinkClosed
	case <-s.abort:
		forget()
		return s.aborted()
	}
}

func (s *retainStream) Recv(id ChunkID, dst []byte) error {
	var f *retained
	select {
	case f = <-s.in.frames:
	case <-s.in.closed:
		return errLinkClosed
	case <-s.abort:
		return s.aborted()
	}
	if f.id != id || len(f.payload) != len(dst) {
		return fmt.Errorf("got frame %v of %d bytes, want %v of %d bytes", f.id, len(f.payload), id, len(dst))
	}
	l := s.in
	l.mu.Lock()
	defer l.mu.Unlock()
	if f.withdrawn {
		return fmt.Errorf("frame %v withdrawn by its aborted sender", f.id)
	}
	if maphash.Bytes(retainSeed, f.payload) != f.sum {
		l.violations = append(l.violations, fmt.Sprintf("frame %v modified before it was received", f.id))
	}
	copy(dst, f.payload)
	l.pending = append(l.pending, f)
	if len(l.pending) >= l.batch || l.waiting > 0 {
		l.ackAll()
	}
	return nil
}

func (s *retainStream) AwaitAcked(id ChunkID) error {
	defer func() {
		s.mu.Lock()
		delete(s.unawaited, id)
		s.mu.Unlock()
	}()
	l := s.out
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		if l.unacked[id] == nil {
			return nil
		}
		if len(l.pending) > 0 {
			l.ackAll()
			continue
		}
		l.waiting++
		changed := l.changed
		l.mu.Unlock()
		var err error
		select {
		case <-changed:
		case <-l.closed:
			err = errLinkClosed
		case <-s.abort:
			err = s.aborted()
		}
		l.mu.Lock()
		l.waiting--
		if f := l.unacked[id]; err != nil && f != nil {
			// The stream reads the payload only until AwaitAcked returns: withdraw the frame.
			f.withdrawn = true
			delete(l.unacked, id)
			return err
		}
	}
}

func (s *retainStream) Abort(err error) {
	s.once.Do(func() {
		s.abortErr = err
		close(s.abort)
		s.out.close()
		s.in.close()
	})
}

// check fails the test if a link saw a modified payload, or a frame sent on s was never awaited.
func (s *retainStream) check(t *testing.T, what string, rank int) {
	t.Helper()
	s.out.mu.Lock()
	v := s.out.violations
	s.out.mu.Unlock()
	if len(v) > 0 {
		t.Fatalf("%s: rank %d's outgoing link: %v", what, rank, v)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.unawaited) > 0 {
		t.Fatalf("%s: rank %d returned with %d frames never awaited", what, rank, len(s.unawaited))
	}
}

// retainRing adapts newRetainRing to the Stream constructors of the plan tests, recording the streams.
func retainRing(batch int, seed *uint64, all *[]*retainStream) func(int) []Stream {
	return func(world int) []Stream {
		*seed++
		rs := newRetainRing(world, batch, *seed)
		*all = append(*all, rs...)
		streams := make([]Stream, world)
		for r, s := range rs {
			streams[r] = s
		}
		return streams
	}
}

// TestRetainerPayloadsUntouchedUntilAcked runs AllReduce (with and without quantization, in place or
// not), ReduceScatter then AllGather, and the hierarchical plan over streams that keep every payload
// until a delayed, reordered acknowledgement, and checks the results against in-memory runs.
func TestRetainerPayloadsUntouchedUntilAcked(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	var seed uint64
	for _, batch := range []int{1, 3, 1 << 30} {
		for _, world := range []int{2, 3, 4} {
			for _, q := range []Quant{NoQuant, MinMaxU8} {
				for _, inPlace := range []bool{false, true} {
					what := fmt.Sprintf("batch %d W=%d %v inPlace=%v", batch, world, q, inPlace)
					const dt, count = F32, 45
					opt := Options{PartBytes: 8, Quant: q}
					inputs := make([][]byte, world)
					for r := range world {
						inputs[r] = moderateElements(rng, dt, count)
					}
					want := make([][]byte, world)
					mem := memRing(world)
					onEveryRank(world, func(r int) error {
						want[r] = make([]byte, len(inputs[r]))
						return AllReduce(context.Background(), mem[r], r, world, inputs[r], want[r], dt, Avg, opt, nil)
					})

					seed++
					streams := newRetainRing(world, batch, seed)
					got := make([][]byte, world)
					errs := onEveryRank(world, func(r int) error {
						send := bytes.Clone(inputs[r])
						got[r] = send
						if !inPlace {
							got[r] = make([]byte, len(send))
						}
						return AllReduce(context.Background(), streams[r], r, world, send, got[r], dt, Avg, opt, nil)
					})
					for r := range world {
						if errs[r] != nil {
							t.Fatalf("%s: rank %d: %v", what, r, errs[r])
						}
						streams[r].check(t, what, r)
						if !bytes.Equal(got[r], want[r]) {
							t.Fatalf("%s: rank %d: result differs from the copying stream's", what, r)
						}
					}

					seed++
					streams = newRetainRing(world, batch, seed)
					errs = onEveryRank(world, func(r int) error {
						got[r] = bytes.Clone(inputs[r])
						rs := opt
						rs.Quant = NoQuant
						if err := ReduceScatter(context.Background(), streams[r], r, world, got[r], dt, Avg, rs); err != nil {
							return err
						}
						return AllGather(context.Background(), streams[r], r, world, got[r], dt, opt)
					})
					for r := range world {
						if errs[r] != nil {
							t.Fatalf("%s halves: rank %d: %v", what, r, errs[r])
						}
						streams[r].check(t, what+" halves", r)
						if !bytes.Equal(got[r], want[r]) {
							t.Fatalf("%s halves: rank %d: result differs from AllReduce", what, r)
						}
					}
				}
			}
		}
		// The hierarchical plan, every phase over retaining streams.
		h := hierarchy{2, 3}
		const dt, count = I32, 70
		inputs := make([][]byte, h.world())
		for g := range inputs {
			inputs[g] = randomElements(rng, dt, count)
		}
		var all []*retainStream
		site, cross := h.rings(retainRing(batch, &seed, &all))
		got := make([][]byte, h.world())
		errs := onEveryRank(h.world(), func(g int) error {
			got[g] = bytes.Clone(inputs[g])
			return h.plan(g, site, cross, dt, Sum, count, 8, NoQuant).Execute(context.Background(), got[g], got[g], nil)
		})
		want := refReduced(dt, Sum, inputs, 0)
		for g := range got {
			if errs[g] != nil || !bytes.Equal(got[g], want) {
				t.Fatalf("batch %d hierarchical: rank %d: %v", batch, g, errs[g])
			}
		}
		for i, s := range all {
			s.check(t, fmt.Sprintf("batch %d hierarchical", batch), i)
		}
	}
	goleak.VerifyNone(t)
}

// TestRetainerAwaitsOnFailure aborts AllReduce over retaining streams at every frame and checks that
// each rank awaited every frame it sent before returning, buffers untouched. (A rank that completed
// its own schedule fails at the commit, which stands for the group's agreement.)
func TestRetainerAwaitsOnFailure(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 44))
	const dt = F64
	// In a ring of 5 the reduce-scatter's first two hops fold in the backup, the third in the buffer.
	for _, world := range []int{3, 5} {
		count := 8 * world
		total := framesPerRank(world, count, 2)
		for k := 1; k <= total; k++ {
			retainerFailAt(t, rng, world, dt, count, k)
		}
	}
	goleak.VerifyNone(t)
}

// retainerFailAt runs one case of TestRetainerAwaitsOnFailure: rank 1's k-th Send fails.
func retainerFailAt(t *testing.T, rng *rand.Rand, world int, dt DType, count, k int) {
	t.Helper()
	streams := newRetainRing(world, 1<<30, uint64(k))
	streams[1].failSendAt = k
	send := make([][]byte, world)
	before := make([][]byte, world)
	for r := range world {
		send[r] = randomElements(rng, dt, count)
		before[r] = bytes.Clone(send[r])
	}
	vote := newBallot(world)
	errs := onEveryRank(world, func(r int) error {
		voted := false
		commit := func() error {
			voted = true
			vote.vote(true)
			return vote.result()
		}
		err := AllReduce(context.Background(), streams[r], r, world, send[r], send[r], dt, Sum, Options{PartBytes: 16}, commit)
		if !voted {
			vote.vote(false)
		}
		return err
	})
	for r := range world {
		if !errors.Is(errs[r], ErrAborted) {
			t.Fatalf("W=%d k=%d: rank %d: %v", world, k, r, errs[r])
		}
		if !bytes.Equal(send[r], before[r]) {
			t.Fatalf("W=%d k=%d: rank %d: buffer modified", world, k, r)
		}
		streams[r].check(t, fmt.Sprintf("W=%d k=%d", world, k), r)
	}
}

// TestRetainStreamDetectsModification checks the checker: a payload changed after Send and before its
// acknowledgement is reported.
func TestRetainStreamDetectsModification(t *testing.T) {
	streams := newRetainRing(2, 1<<30, 1)
	payload := []byte{1, 2, 3, 4}
	if err := streams[0].Send(ChunkID{}, payload); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 4)
	if err := streams[1].Recv(ChunkID{}, dst); err != nil {
		t.Fatal(err)
	}
	payload[0] = 9 // too early: not acknowledged yet
	if err := streams[0].AwaitAcked(ChunkID{}); err != nil {
		t.Fatal(err)
	}
	if v := streams[0].out.violations; len(v) != 1 {
		t.Fatalf("violations %v, want one", v)
	}
	if err := streams[0].AwaitAcked(ChunkID{}); err != nil {
		t.Fatalf("second AwaitAcked of an acknowledged frame: %v", err)
	}
}
