package rdma

import (
	"context"
	"fmt"
	"slices"
	"unsafe"

	"github.com/concord-ccl/concord/rings"
)

// weights returns a copy of the channels' shares (Config.ChannelWeights, even by default): planned
// AllReduces level their copy in place.
func (n *Node) weights() []float64 { return slices.Clone(n.cfg.ChannelWeights) }

func (n *Node) neighbours() (succ, pred NodeID) {
	w := len(n.ring)
	return n.ring[(n.rank+1)%w], n.ring[(n.rank+w-1)%w]
}

func checkBuffers(dt rings.DType, op rings.Op, bufs ...[]byte) error {
	if !dt.Valid() || !op.Valid() {
		return fmt.Errorf("%w: dtype %v op %v", ErrInvalid, dt, op)
	}
	for _, b := range bufs {
		if len(b)%dt.Size() != 0 {
			return fmt.Errorf("%w: %d bytes is not a whole number of %v elements", ErrInvalid, len(b), dt)
		}
	}
	return nil
}

// StartAllReduce starts a ring AllReduce of send into recv (same length) split over one channel per
// NIC (evenly, or by Config.ChannelWeights), and calls done in the event context when it ends. recv is
// written only on success, unless Config.Direct is set. send is read until done (it is copied into
// the working buffer piece by piece as the transfer reaches each piece), must not change before then,
// and is not retained after. Call it in the event context.
func (n *Node) StartAllReduce(send, recv []byte, dt rings.DType, op rings.Op, done func(error)) error {
	if err := checkBuffers(dt, op, send, recv); err != nil {
		return err
	}
	if len(send) != len(recv) {
		return fmt.Errorf("%w: send has %d bytes, recv %d", ErrInvalid, len(send), len(recv))
	}
	if n.op != nil {
		return ErrBusy
	}
	world := len(n.ring)
	var plans []channelPlan
	if world > 1 {
		succ, pred := n.neighbours()
		plans = planAllReduce(n.rank, world, splitChannels(len(send)/dt.Size(), n.weights()), dt.Size(), n.cfg.ChunkBytes, succ, pred)
	}
	if n.cfg.Direct {
		if err := checkDirect(send, recv); err != nil {
			return err
		}
		src := send
		if sameBytes(send, recv) {
			src = nil // in place: recv already holds the input
		}
		if world == 1 {
			copy(recv, send)
			rings.Finalize(dt, op, recv, 1)
			src = nil
		}
		return n.startFilled(recv, src, dt, op, plans, nil, nil, done)
	}
	work := n.scratchBuffer(len(send))
	if world == 1 {
		copy(work, send)
		rings.Finalize(dt, op, work, 1)
		send = nil
	}
	return n.startScratch(work, send, dt, op, plans, nil, func() { copy(recv, work) }, done)
}

// checkDirect refuses, for a direct operation (Config.Direct), an input and a result that overlap
// without being the same slice: the lazy copy of the input would read bytes already overwritten.
func checkDirect(send, recv []byte) error {
	if len(send) == 0 || len(recv) == 0 || sameBytes(send, recv) {
		return nil
	}
	s0, r0 := uintptr(unsafe.Pointer(unsafe.SliceData(send))), uintptr(unsafe.Pointer(unsafe.SliceData(recv)))
	if s0 < r0+uintptr(len(recv)) && r0 < s0+uintptr(len(send)) {
		return fmt.Errorf("%w: with Config.Direct, send and recv must be the same slice or not overlap", ErrInvalid)
	}
	return nil
}

// sameBytes reports whether a and b are the same non-empty slice (same start and length).
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && len(a) > 0 && &a[0] == &b[0]
}

// StartReduceScatter reduces send (world blocks of len(recv) bytes) so that this node's recv holds the
// reduction of block rank. send is read until done and must not change before then; recv is written
// only on success, whatever Config.Direct says. Call it in the event context.
func (n *Node) StartReduceScatter(send, recv []byte, dt rings.DType, op rings.Op, done func(error)) error {
	if err := checkBuffers(dt, op, send, recv); err != nil {
		return err
	}
	world := len(n.ring)
	if len(send) != world*len(recv) {
		return fmt.Errorf("%w: send has %d bytes, want %d × %d", ErrInvalid, len(send), world, len(recv))
	}
	if n.op != nil {
		return ErrBusy
	}
	work := n.scratchBuffer(len(send))
	count := len(recv) / dt.Size()
	var plans []channelPlan
	if world == 1 {
		copy(work, send)
		rings.Finalize(dt, op, work, 1)
		send = nil
	} else {
		succ, pred := n.neighbours()
		plans = planReduceScatter(n.rank, world, splitChannels(count, n.weights()), count, dt.Size(), n.cfg.ChunkBytes, succ, pred)
	}
	own := n.rank * len(recv)
	return n.startScratch(work, send, dt, op, plans, nil, func() { copy(recv, work[own:own+len(recv)]) }, done)
}

// StartAllGather gathers every node's send (same length everywhere) into recv, block r from the node
// at ring position r. send is copied before it returns. recv is written only on success, unless
// Config.Direct is set (then during the call). Call it in the event context.
func (n *Node) StartAllGather(send, recv []byte, dt rings.DType, done func(error)) error {
	if err := checkBuffers(dt, rings.Sum, send, recv); err != nil {
		return err
	}
	world := len(n.ring)
	if len(recv) != world*len(send) {
		return fmt.Errorf("%w: recv has %d bytes, want %d × %d", ErrInvalid, len(recv), world, len(send))
	}
	if n.cfg.Direct {
		if err := checkDirect(send, recv); err != nil {
			return err
		}
	}
	work, commit := recv, func() {}
	if !n.cfg.Direct {
		work = make([]byte, len(recv))
		commit = func() { copy(recv, work) }
	}
	copy(work[n.rank*len(send):], send)
	count := len(send) / dt.Size()
	var plans []channelPlan
	if world > 1 {
		succ, pred := n.neighbours()
		plans = planAllGather(n.rank, world, splitChannels(count, n.weights()), count, dt.Size(), n.cfg.ChunkBytes, succ, pred)
	}
	return n.start(work, dt, rings.Sum, plans, commit, done)
}

// StartBroadcast copies the root's buf into every node's buf. buf is read before it returns and
// written only on success, unless Config.Direct is set (then buf is the working buffer until done).
// Call it in the event context.
func (n *Node) StartBroadcast(buf []byte, dt rings.DType, root NodeID, done func(error)) error {
	if err := checkBuffers(dt, rings.Sum, buf); err != nil {
		return err
	}
	r := slices.Index(n.ring, root)
	if r < 0 {
		return fmt.Errorf("%w: root %d not in ring", ErrInvalid, root)
	}
	world := len(n.ring)
	q := mod(n.rank-r, world)
	work, commit := buf, func() {}
	if !n.cfg.Direct {
		work = slices.Clone(buf)
		commit = func() { copy(buf, work) }
	}
	succ, pred := n.neighbours()
	plans := planBroadcast(q, world, splitChannels(len(buf)/dt.Size(), n.weights()), dt.Size(), n.cfg.ChunkBytes, succ, pred)
	return n.start(work, dt, rings.Sum, plans, commit, done)
}

// StartSend sends buf to node to, over every NIC; the receiver calls StartRecv with a buffer of the
// same length. buf is copied before it returns, unless Config.Direct is set (then it is read until
// done and must not change before then). Call it in the event context.
func (n *Node) StartSend(buf []byte, to NodeID, done func(error)) error {
	plans := planPointToPoint(true, to, splitChannels(len(buf), n.weights()), 1, n.cfg.ChunkBytes)
	work := buf // read only; without Direct a copy, so that the caller may reuse buf at once on failure
	if !n.cfg.Direct {
		work = slices.Clone(buf)
	}
	return n.start(work, rings.U8, rings.Sum, plans, nil, done)
}

// StartRecv receives into buf what node from sends with StartSend. buf is written only on success,
// unless Config.Direct is set (then during the call). Call it in the event context.
func (n *Node) StartRecv(buf []byte, from NodeID, done func(error)) error {
	work, commit := buf, func() {}
	if !n.cfg.Direct {
		work = make([]byte, len(buf))
		commit = func() { copy(buf, work) }
	}
	plans := planPointToPoint(false, from, splitChannels(len(buf), n.weights()), 1, n.cfg.ChunkBytes)
	return n.start(work, rings.U8, rings.Sum, plans, commit, done)
}

// run posts start to the event context and waits for its completion or ctx.
func (n *Node) run(ctx context.Context, start func(done func(error)) error) error {
	ch := make(chan error, 1)
	n.ep.Post(func() {
		if err := start(func(err error) { ch <- err }); err != nil {
			ch <- err
		}
	})
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// AllReduce is the blocking form of StartAllReduce, for providers whose event context is a goroutine
// of their own. If ctx ends first it returns ctx.Err(); the operation keeps running to its end and may
// still write recv, so the caller must not reuse recv before a later operation has returned.
func (n *Node) AllReduce(ctx context.Context, send, recv []byte, dt rings.DType, op rings.Op) error {
	return n.run(ctx, func(done func(error)) error { return n.StartAllReduce(send, recv, dt, op, done) })
}

// ReduceScatter is the blocking form of StartReduceScatter (see AllReduce for the rules).
func (n *Node) ReduceScatter(ctx context.Context, send, recv []byte, dt rings.DType, op rings.Op) error {
	return n.run(ctx, func(done func(error)) error { return n.StartReduceScatter(send, recv, dt, op, done) })
}

// AllGather is the blocking form of StartAllGather (see AllReduce for the rules).
func (n *Node) AllGather(ctx context.Context, send, recv []byte, dt rings.DType) error {
	return n.run(ctx, func(done func(error)) error { return n.StartAllGather(send, recv, dt, done) })
}

// Broadcast is the blocking form of StartBroadcast (see AllReduce for the rules).
func (n *Node) Broadcast(ctx context.Context, buf []byte, dt rings.DType, root NodeID) error {
	return n.run(ctx, func(done func(error)) error { return n.StartBroadcast(buf, dt, root, done) })
}

// Send is the blocking form of StartSend (see AllReduce for the rules).
func (n *Node) Send(ctx context.Context, buf []byte, to NodeID) error {
	return n.run(ctx, func(done func(error)) error { return n.StartSend(buf, to, done) })
}

// Recv is the blocking form of StartRecv (see AllReduce for the rules).
func (n *Node) Recv(ctx context.Context, buf []byte, from NodeID) error {
	return n.run(ctx, func(done func(error)) error { return n.StartRecv(buf, from, done) })
}

// Do runs f in the Node's event context and waits for it: the way to call a Replanner's methods (and
// read the Node's state) from another goroutine. It must not be called from the event context, which
// it would wait on forever.
func (n *Node) Do(f func()) {
	ch := make(chan struct{})
	n.ep.Post(func() { f(); close(ch) })
	<-ch
}
