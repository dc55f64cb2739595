package pccl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/rings"
)

// op is one collective in flight on this peer. The master reader delivers its Commence and Outcome.
type op struct {
	tag       uint64
	commenced chan *wire.Commence // capacity 1

	mu        sync.Mutex
	withdrawn bool          // we withdrew our vote; a Commence that crosses it is ignored
	outcome   *wire.Outcome // set once
	over      chan struct{} // closed when outcome is set
}

// commence hands the op its Commence; false if nobody will run it.
func (o *op) commence(m *wire.Commence) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.withdrawn || o.outcome != nil {
		return false
	}
	select {
	case o.commenced <- m:
		return true
	default:
		return false
	}
}

func (o *op) finish(m *wire.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.outcome == nil {
		o.outcome = m
		close(o.over)
	}
}

// Request is a collective started by AllReduceAsync.
type Request struct {
	done chan struct{}
	err  error
}

// Wait blocks until the collective is over and returns its error (see AllReduce).
func (r *Request) Wait() error {
	<-r.done
	return r.err
}

// Done is closed when the collective is over.
func (r *Request) Done() <-chan struct{} { return r.done }

// AllReduceAsync starts AllReduce in the background. send and recv belong to Concord until Wait
// returns.
func (c *Communicator) AllReduceAsync(ctx context.Context, send, recv []byte, d Desc) *Request {
	r := &Request{done: make(chan struct{})}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(r.done)
		r.err = c.AllReduce(ctx, send, recv, d)
	}()
	return r
}

// AllReduce reduces send element-wise over every peer of the ring with d.Op and writes the result to
// recv (which may be send itself). All peers must call it with the same d. The result is identical bit
// for bit on every peer. On any error send and recv are unchanged.
//
// Errors: ErrPeerLeft, ErrAborted (retry after UpdateTopology), ErrTooFewPeers,
// ErrDescriptorMismatch, ErrInvalid, ErrKicked, ErrMasterLost, ErrClosed. If ctx ends before the
// collective commenced, the vote is withdrawn; if it ends while the collective runs, it is aborted for
// every peer. Either way AllReduce waits for the master's verdict (bounded by Config.MasterTimeout).
func (c *Communicator) AllReduce(ctx context.Context, send, recv []byte, d Desc) error {
	what := fmt.Sprintf("pccl: allreduce tag %d", d.Tag)
	if err := d.validate(send, recv); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	o := &op{tag: d.Tag, commenced: make(chan *wire.Commence, 1), over: make(chan struct{})}
	c.mu.Lock()
	if c.fatal != nil {
		c.mu.Unlock()
		return fmt.Errorf("%s: %w", what, c.fatal)
	}
	if c.ops[d.Tag] != nil {
		c.mu.Unlock()
		return fmt.Errorf("%s: %w: tag already in flight on this peer", what, ErrInvalid)
	}
	c.ops[d.Tag] = o
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.ops, d.Tag)
		c.mu.Unlock()
	}()

	desc := wire.Desc{Count: uint64(d.Count), DType: uint8(d.DType), Op: uint8(d.Op), Quant: uint8(d.Quant)}
	if err := c.send(&wire.Initiate{Tag: d.Tag, Desc: desc}); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	for {
		select {
		case m := <-o.commenced:
			return c.run(ctx, o, m, send, recv, d)
		case <-o.over:
			// A Commence may have arrived just before the verdict (both were ready): the master then
			// counts us as a participant and waits for our Done.
			select {
			case m := <-o.commenced:
				c.links.tombstone(m.Seq)
				c.send(&wire.Done{Tag: d.Tag, Seq: m.Seq, Code: wire.CodeAborted, Detail: "aborted before it started here"})
			default:
			}
			return outcomeError(what, o.outcome)
		case <-c.done:
			return fmt.Errorf("%s: %w", what, c.err())
		case <-ctx.Done():
			o.mu.Lock()
			o.withdrawn = true
			o.mu.Unlock()
			// A Commence may already be queued: then run nothing, but tell the master we are out.
			select {
			case m := <-o.commenced:
				c.links.tombstone(m.Seq)
				c.send(&wire.Done{Tag: d.Tag, Seq: m.Seq, Code: wire.CodeAborted, Detail: ctx.Err().Error()})
			default:
				c.send(&wire.Done{Tag: d.Tag, Seq: 0, Code: wire.CodeAborted, Detail: ctx.Err().Error()})
			}
			if err := c.awaitOutcome(o); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			return errors.Join(outcomeError(what, o.outcome), ctx.Err())
		}
	}
}

// awaitOutcome waits for the master's verdict on o, for at most MasterTimeout.
func (c *Communicator) awaitOutcome(o *op) error {
	t := time.NewTimer(c.cfg.MasterTimeout)
	defer t.Stop()
	select {
	case <-o.over:
		return nil
	case <-c.done:
		return c.err()
	case <-t.C:
		err := fmt.Errorf("%w: no verdict on tag %d after %v", ErrMasterLost, o.tag, c.cfg.MasterTimeout)
		c.die(err)
		return err
	}
}

// run executes a commenced collective and reports it to the master.
func (c *Communicator) run(ctx context.Context, o *op, m *wire.Commence, send, recv []byte, d Desc) error {
	what := fmt.Sprintf("pccl: allreduce tag %d seq %d", d.Tag, m.Seq)
	c.mu.Lock()
	ring := slices.Clone(c.ring)
	epoch := c.epoch
	c.mu.Unlock()
	rank := slices.Index(ring, c.id)
	if epoch != m.Epoch || rank < 0 {
		// The master commenced on a ring this peer has not seen: report failure, take the verdict.
		c.send(&wire.Done{Tag: d.Tag, Seq: m.Seq, Code: wire.CodePeerLeft, Detail: "ring epoch mismatch"})
		if err := c.awaitOutcome(o); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return outcomeError(what, o.outcome)
	}
	world := len(ring)
	prev := ring[(rank+world-1)%world]
	var s rings.Stream = nopStream{}
	var st *stream
	if world > 1 {
		var err error
		st, err = c.links.stream(d.Tag, m.Seq, epoch, prev)
		if err != nil {
			c.send(&wire.Done{Tag: d.Tag, Seq: m.Seq, Code: wire.CodePeerLeft, Detail: err.Error()})
			if err := c.awaitOutcome(o); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			return outcomeError(what, o.outcome)
		}
		defer c.links.release(st)
		s = st
	}

	// The watcher aborts the ring when the master says the operation failed, the caller gives up, or
	// the communicator dies.
	ringDone := make(chan struct{})
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		select {
		case <-ringDone:
		case <-o.over:
			if o.outcome.Code != wire.CodeOK {
				s.Abort(outcomeError(what, o.outcome))
			}
		case <-ctx.Done():
			s.Abort(ctx.Err())
		case <-c.done:
			s.Abort(c.err())
		}
	}()

	reported := false
	commit := func() error {
		reported = true
		done := &wire.Done{Tag: d.Tag, Seq: m.Seq, Code: wire.CodeOK}
		if st != nil {
			done.LinkBytes, done.LinkNanos = st.sentBytes, st.sentNanos
		}
		if err := c.send(done); err != nil {
			return err
		}
		if err := c.awaitOutcome(o); err != nil {
			return err
		}
		return outcomeError(what, o.outcome)
	}
	opt := rings.Options{PartBytes: c.cfg.PartBytes, Quant: d.Quant}
	err := rings.AllReduce(ctx, s, rank, world, send, recv, d.DType, d.Op, opt, commit)
	close(ringDone)
	watch.Wait()
	if err == nil {
		return nil
	}
	if !reported {
		code, detail := wire.CodePeerLeft, err.Error()
		if ctx.Err() != nil {
			code = wire.CodeAborted
		}
		c.send(&wire.Done{Tag: d.Tag, Seq: m.Seq, Code: code, Detail: detail})
		if err := c.awaitOutcome(o); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if o.outcome != nil && o.outcome.Code != wire.CodeOK {
		return outcomeError(what, o.outcome)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// nopStream serves a ring of one peer, which sends and receives nothing.
type nopStream struct{}

func (nopStream) Send(rings.ChunkID, []byte) error { return errors.New("pccl: send in a ring of one") }
func (nopStream) Recv(rings.ChunkID, []byte) error {
	return errors.New("pccl: receive in a ring of one")
}
func (nopStream) Abort(error) {}
