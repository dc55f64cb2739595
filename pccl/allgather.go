package pccl

import (
	"context"
	"fmt"
	"slices"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/rings"
)

// AllGather gathers every peer's send into recv, in the order of the ring: recv holds one slot of
// len(send) bytes per peer of the ring (len(Ring()) slots), and slot r ends up holding the send of
// the peer at rank r of Ring(), bit for bit the same on every peer. d gives the tag and what send
// holds (Count elements of DType); its Op and Quant must be zero. All peers must call it with the same
// d. Like AllReduce it is one collective that the master commences and commits, on a tag of its own:
// on any error recv is unchanged, and the errors are AllReduce's.
//
// On the flat ring it runs the all-gather half of the ring alone: each peer sends (world−1)/world of
// recv and receives as much, half what an AllReduce of recv moves. On a hierarchical ring or a
// one-site group on the intra-site fabric it runs as that AllReduce: every payload in its slot, zeros
// elsewhere, summed byte by byte.
func (c *Communicator) AllGather(ctx context.Context, send, recv []byte, d Desc) error {
	return cleanError(c.allGather(ctx, send, recv, d))
}

func (c *Communicator) allGather(ctx context.Context, send, recv []byte, d Desc) error {
	world := len(c.Ring())
	switch {
	case !d.DType.Valid():
		return fmt.Errorf("pccl: allgather tag %d: %w: dtype %v", d.Tag, ErrInvalid, d.DType)
	case d.Op != 0 || d.Quant != NoQuant:
		return fmt.Errorf("pccl: allgather tag %d: %w: an all-gather takes no op (%v) and no quantization (%v)", d.Tag, ErrInvalid, d.Op, d.Quant)
	case d.Count < 0 || len(send) != d.Count*d.DType.Size():
		return fmt.Errorf("pccl: allgather tag %d: %w: send has %d bytes, %d %v elements need %d", d.Tag, ErrInvalid, len(send), d.Count, d.DType, d.Count*d.DType.Size())
	case world == 0:
		return fmt.Errorf("pccl: allgather tag %d: %w: this peer is in no ring", d.Tag, ErrInvalid)
	case len(recv) != world*len(send):
		return fmt.Errorf("pccl: allgather tag %d: %w: recv has %d bytes, %d peers' slots of %d bytes need %d", d.Tag, ErrInvalid, len(recv), world, len(send), world*len(send))
	}
	return c.collect(ctx, &collective{send: send, recv: recv, d: d, gather: true}, wire.OpGather, nil, "allgather")
}

// runGather moves the data of commenced AllGather op on a buffer of its own, laid out as the byte sum
// would have it (this peer's send in the slot of its rank, zeros elsewhere), and copies it into the
// caller's recv once the master committed it.
func (c *Communicator) runGather(ctx context.Context, op *collective) error {
	st, out := op.st, op.recv
	world, n := len(st.ring), len(op.send)
	if len(out) != world*n {
		// The ring changed between the call and the commencement (an UpdateTopology on another
		// goroutine): the slots no longer fit.
		err := fmt.Errorf("%w: recv has %d bytes, the %d peers of the ring it commenced on need %d", ErrInvalid, len(out), world, world*n)
		c.report(op, &wire.Done{Code: wire.CodeLocalFailure, Detail: err.Error()})
		return fmt.Errorf("%s: %w", op.what, err)
	}
	rank := slices.Index(st.ring, c.id)
	buf := make([]byte, world*n)
	copy(buf[rank*n:], op.send)
	op.send, op.recv = buf, buf
	op.d = Desc{Tag: op.d.Tag, Count: len(buf), DType: U8, Op: Sum}
	if err := c.runOp(ctx, op); err != nil {
		return err
	}
	copy(out, buf)
	return nil
}

// gatherParts is how many parts at least a slot of a gather is cut into, down to minGatherPart bytes
// a part: a slot of a few MiB in one or two parts would cross a WAN on as many of the pool's
// connections, each in slow start after the idle time between two syncs, and the next hop would wait
// for the whole slot.
const (
	gatherParts   = 8
	minGatherPart = 64 << 10
)

// gatherPart is the part size of a gather of slots of n bytes when the collectives' part size is
// partBytes (0: rings.DefaultPartBytes). Every peer computes the same from the same Desc.
func gatherPart(partBytes, n int) int {
	if partBytes <= 0 {
		partBytes = rings.DefaultPartBytes
	}
	return min(partBytes, max(minGatherPart, (n+gatherParts-1)/gatherParts))
}

// gatherOnRing runs the all-gather of buf (world slots, this peer's payload in the slot of rank) on
// the flat ring s. The ring spreads the chunk each rank owns (rings.OwnedChunk: the slot after its
// own), so the payload moves there first and every slot back by one after.
func gatherOnRing(ctx context.Context, s rings.Stream, rank, world int, buf []byte, opt rings.Options, commit func() error) error {
	n := len(buf) / world
	own := rings.OwnedChunk(rank, world)
	copy(buf[own*n:(own+1)*n], buf[rank*n:(rank+1)*n])
	p := rings.Plan{DType: rings.U8, Op: rings.Sum, PartBytes: gatherPart(opt.PartBytes, n), Pool: opt.Pool, OnFail: opt.OnFail,
		Phases: []rings.Phase{{Kind: rings.KindAllGather, Stream: s, Rank: rank, World: world, Len: len(buf)}}}
	if err := p.Execute(ctx, buf, buf, commit); err != nil {
		return err
	}
	// Slot k holds the payload of rank k−1 (mod world).
	first := slices.Clone(buf[:n])
	copy(buf, buf[n:])
	copy(buf[(world-1)*n:], first)
	return nil
}
