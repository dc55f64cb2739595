package pccl

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl/internal/links"
	"github.com/concord-ccl/concord/rings"
)

// Request is a collective started by AllReduceAsync.
type Request struct {
	done chan struct{}
	err  error
}

// Wait blocks until the collective is over and returns its error (see AllReduce).
func (r *Request) Wait() error {
	<-r.done
	return r.err // already cleaned by AllReduce
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
// for bit on every peer. On any error send and recv are unchanged. When the ring holds several sites
// of two or more peers (Config.Site), the reduction is hierarchical: inside each site, then across
// sites. When the ring is one site whose peers all listed NICs (Config.NICs), it runs whole on the
// intra-site fabric (siteplan.go).
//
// Errors: ErrPeerLeft, ErrAborted (retry after UpdateTopology), ErrTooFewPeers,
// ErrDescriptorMismatch, ErrInvalid, ErrKicked, ErrMasterLost, ErrClosed. If ctx ends before the
// collective commenced, the vote is withdrawn; if it ends while the collective runs, it is aborted for
// every peer. Either way AllReduce waits for the master's verdict (bounded by Config.MasterTimeout;
// CloseAfter bounds it for a caller that must go).
func (c *Communicator) AllReduce(ctx context.Context, send, recv []byte, d Desc) error {
	return cleanError(c.allReduce(ctx, send, recv, d))
}

func (c *Communicator) allReduce(ctx context.Context, send, recv []byte, d Desc) error {
	what := fmt.Sprintf("pccl: allreduce tag %d", d.Tag)
	if err := d.validate(send, recv); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var stats *wire.Contribution
	if c.cfg.ContributionStats {
		stats = contribution(send, d.DType)
	}
	return c.collect(ctx, &collective{send: send, recv: recv, d: d}, uint8(d.Op), stats, "allreduce")
}

// collect votes for collective op on its tag (its descriptor on the wire with op as the operation)
// and, once the master commences it, moves its data (runOp). kind names it in errors.
func (c *Communicator) collect(ctx context.Context, op *collective, wop uint8, stats *wire.Contribution, kind string) error {
	d := op.d
	what := fmt.Sprintf("pccl: %s tag %d", kind, d.Tag)
	call, ch := c.newCall()
	h := links.NewHandle()
	desc := wire.Desc{Count: uint64(d.Count), DType: uint8(d.DType), Op: wop, Quant: uint8(d.Quant), Part: uint32(c.cfg.PartBytes)}
	if err := c.submit(request{in: initiateCall{call: call, tag: d.Tag, desc: desc, stats: stats}, reply: ch, abort: h.Abort}); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	select {
	case r := <-ch:
		if r.start == nil {
			return r.err
		}
		op.call, op.ch, op.h, op.st = call, ch, h, r.start
		op.what = fmt.Sprintf("pccl: %s tag %d seq %d", kind, d.Tag, r.start.seq)
		if op.gather {
			return c.runGather(ctx, op)
		}
		return c.runOp(ctx, op)
	case <-c.done:
		return c.verdict(call, ch, what)
	case <-ctx.Done():
		// Withdraw; a start that crossed the withdrawal is ignored, and the verdict awaited.
		c.post(cancelCall{call: call, reason: ctx.Err()})
		return c.verdict(call, ch, what)
	}
}

// verdict waits for the final reply of collective call, which the machine always sends (bounded by
// its verdict deadline), or for death.
func (c *Communicator) verdict(call uint64, ch chan reply, what string) error {
	for {
		select {
		case r := <-ch:
			if r.start == nil {
				return r.err
			}
		case <-c.done:
			select {
			case r := <-ch:
				if r.start == nil {
					return r.err
				}
			default:
			}
			return fmt.Errorf("%s: %w", what, c.fatal)
		}
	}
}

// collective is one commenced collective of this peer: its call and the channel its replies come on,
// its abort switch, the master's start, the caller's buffers and descriptor, and the prefix of its
// errors.
type collective struct {
	call       uint64
	ch         chan reply
	h          *links.Handle
	st         *opStart
	send, recv []byte
	d          Desc
	what       string
	gather     bool // an AllGather (allgather.go), not an AllReduce
}

// report tells the machine how the data path of op ended and returns the verdict.
func (c *Communicator) report(op *collective, done *wire.Done) error {
	c.tell(op, done)
	return c.verdict(op.call, op.ch, op.what)
}

// tell tells the machine how the data path of op ended, without waiting for the verdict.
func (c *Communicator) tell(op *collective, done *wire.Done) {
	// If the communicator is dead, the machine has already answered the call.
	c.submit(request{in: reportCall{call: op.call, tag: op.d.Tag, done: done}})
}

// runOp moves the data of commenced collective op and reports it to the master.
func (c *Communicator) runOp(ctx context.Context, op *collective) error {
	st, d, h := op.st, op.d, op.h
	if hv, ok := c.links.HierarchyFor(st.ring); ok {
		// A buffer too small for the WAN rings the links were wired for runs on the flat ring.
		if segs, ok := hv.Segments(d.Count, d.DType.Size(), pipeMinBytes, fabricWanted(st, hv)); ok {
			return c.runHierarchical(ctx, op, hv, segs)
		}
	}
	if fab, err := c.wholeSiteFabric(st); err != nil || fab != nil {
		if err != nil {
			return c.report(op, &wire.Done{Code: codeOf(err), Detail: err.Error()})
		}
		return c.runOnSiteFabric(ctx, op, fab)
	}
	rank, world := slices.Index(st.ring, c.id), len(st.ring)
	var s rings.Stream = nopStream{}
	var ls *links.Stream
	if world > 1 {
		prev := st.ring[(rank+world-1)%world]
		var err error
		ls, err = c.links.Stream(links.Op{Tag: d.Tag, Seq: st.seq, Epoch: st.epoch, Handle: h}, prev)
		if err != nil {
			return c.report(op, &wire.Done{Code: wire.CodePeerLeft, Detail: err.Error()})
		}
		defer c.links.Release(ls)
		s = ls
	}
	// The caller giving up aborts the ring (and, through our Done, every peer's).
	stop := context.AfterFunc(ctx, func() { h.Abort(ctx.Err()) })
	defer stop()

	reported := false
	var verdict error
	commit := func() error {
		reported = true
		done := &wire.Done{Code: wire.CodeOK}
		if ls != nil {
			done.LinkBytes, done.LinkNanos = ls.Sent()
			done.Links = ls.Timings(st.ring[(rank+1)%world], st.ring[(rank+world-1)%world])
		}
		verdict = c.report(op, done)
		return verdict
	}
	// A failed ring is reported as soon as it stopped, before the buffer is put back, so that the
	// master's verdict reaches the other peers while this one restores.
	failed := false
	fail := func(err error) {
		failed = true
		code := codeOf(err)
		if ctx.Err() != nil {
			code = wire.CodeAborted
		}
		done := &wire.Done{Code: code, Detail: err.Error()}
		if ls != nil {
			done.Silent = ls.SilentLink(st.ring[(rank+world-1)%world], st.ring[(rank+1)%world])
		}
		c.tell(op, done)
	}
	opt := rings.Options{PartBytes: c.cfg.PartBytes, Quant: d.Quant, OnFail: fail}
	var err error
	if op.gather {
		err = gatherOnRing(ctx, s, rank, world, op.recv, opt, commit)
	} else {
		err = rings.AllReduce(ctx, s, rank, world, op.send, op.recv, d.DType, d.Op, opt, commit)
	}
	if err == nil {
		return nil
	}
	if reported {
		if verdict != nil {
			return verdict
		}
		return fmt.Errorf("%s: %w", op.what, err)
	}
	if !failed {
		fail(err)
	}
	if verr := c.verdict(op.call, op.ch, op.what); verr != nil {
		if ctx.Err() != nil {
			return errors.Join(verr, ctx.Err()) // the caller gave up: say so
		}
		return verr
	}
	return fmt.Errorf("%s: %w", op.what, err)
}

// nopStream serves a ring of one peer, which sends and receives nothing.
type nopStream struct{}

func (nopStream) Send(rings.ChunkID, []byte) error { return errors.New("pccl: send in a ring of one") }
func (nopStream) Recv(rings.ChunkID, []byte) error {
	return errors.New("pccl: receive in a ring of one")
}
func (nopStream) Abort(error) {}

// contribution returns the finiteness and Euclidean norm of a float contribution (F32 or F64), or nil
// for other types, which carry no stats.
func contribution(send []byte, dt DType) *wire.Contribution {
	st := &wire.Contribution{Finite: true}
	var sum float64
	add := func(x float64) {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			st.Finite = false
			return
		}
		sum += x * x
	}
	switch dt {
	case F32:
		for _, x := range rings.View[float32](send) {
			add(float64(x))
		}
	case F64:
		for _, x := range rings.View[float64](send) {
			add(x)
		}
	default:
		return nil
	}
	st.Norm = math.Sqrt(sum)
	return st
}
