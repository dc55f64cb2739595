package rdma

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/concord-ccl/concord/rdma/plan"
	"github.com/concord-ccl/concord/rings"
)

// Executing planned AllReduce schedules.
//
// A [plan.Plan] names, for every node index i (the node at position i of the Node's ring), how the
// message is split into parts, which ring of nodes reduces each part and which nodes outside that ring
// receive its result by broadcast, and how each node's channels map onto its NICs. The Node runs a plan
// as one operation whose paths all start together, held back only where they must wait:
//
//	gather     every node outside a part's ring sends its input for the part to its host, the first
//	           ring node after it in the global ring order; the host folds it into its own input
//	           before its ring paths of that part start (a gate);
//	reduce     every part's ring AllReduce (reduce-scatter then all-gather), each channel of each ring
//	           on its own paths; the global ring runs while the faster rings gather and reduce;
//	broadcast  each part's result goes down a pipelined chain from the host of the first outside node
//	           through the outside nodes in the plan's dependency order, once the head has the whole
//	           part (a gate).
//
// Routes: a ring channel's blocks are cut into pieces at the route boundaries of every ring node for
// that channel, so a piece is carried by one NIC at each node; a path between two nodes uses the NIC of
// the end whose route is not the channel's own NIC (Balance spreads only a degraded node's bytes; its
// neighbours receive them on the same rail). Hot repair plans route a failed NIC's channel to its
// backup at the degraded node only.
//
// Reduction order: within a ring every element is reduced by the ring reduce-scatter in ring order
// starting at the node whose block holds it, and finalized by one node that the others copy, so every
// node gets the same bits. Pieces cut every block of a channel rather than the channel's span, so an
// element keeps the block, hence the reduction order, it has in the standard ring: the standard ring,
// hot repair and Balance give bit-identical results whatever their routes (as long as the plan keeps
// the Node's ring order, that is, bridge re-ranking did not reorder it). A part's channels and blocks
// are split equally like the standard ring's, not by the plan's Owners, except in the weighted rings'
// plan ([plan.Weighted]), whose blocks are its Owners' shares: there an element's reduction starts at
// another node than in the standard ring, so floating-point sums may round differently from it (all
// nodes still agree bit for bit). R²CCL-AllReduce and the recursive schedule reduce a part on a
// smaller ring with the outside nodes' inputs folded in first, so floating-point sums may round
// differently from the standard ring's (exact for integer types and for floating-point values whose
// sums are exact); all nodes still agree bit for bit.

// planExecutor turns a plan into this node's channel plans (the paths the operation engine runs) and
// prices a plan on this node's NICs (railLoads). It lives for one call, in the event context.
type planExecutor struct {
	n    *Node
	p    plan.Plan
	topo plan.Topology
	esz  int
	me   int         // this node's index
	ch   int         // the next channel number: every node numbers every path of the plan alike
	cuts [][][]piece // partPieces, computed once
}

// StartAllReduceWithPlan runs an AllReduce of send into recv (same length) by plan p, made by package
// plan for topology t with node index i standing for the node at position i of the Node's ring, for a
// message of len(send) bytes split in multiples of the element size. Every node of the ring must start
// the same plan; it is the executor of a plan, and chooses nothing (a [Replanner] chooses). recv is
// written only on success unless Config.Direct is set, as with StartAllReduce; send is read until
// done and must not change before then. done is called in the event context. Call it in the event
// context.
func (n *Node) StartAllReduceWithPlan(t plan.Topology, p plan.Plan, send, recv []byte, dt rings.DType, op rings.Op, done func(error)) error {
	if err := checkBuffers(dt, op, send, recv); err != nil {
		return err
	}
	if len(send) != len(recv) || int64(len(send)) != p.Bytes {
		return fmt.Errorf("%w: send %d bytes, recv %d, plan %d", ErrInvalid, len(send), len(recv), p.Bytes)
	}
	if len(t.Nodes) != len(n.ring) || len(p.Routes) != len(n.ring) {
		return fmt.Errorf("%w: plan for %d nodes, ring has %d", ErrInvalid, len(t.Nodes), len(n.ring))
	}
	var sum int64
	for _, pt := range p.Parts {
		if len(pt.Leaves) > 0 && (len(pt.Ring) < 2 || len(pt.BroadcastTo) > 0) {
			return fmt.Errorf("%w: a plan part with leaves needs a ring of at least 2 nodes and no broadcast", ErrInvalid)
		}
		if pt.Offset != sum || pt.Bytes%int64(dt.Size()) != 0 {
			return fmt.Errorf("%w: plan part at %d of %d bytes does not tile the message in %v elements", ErrInvalid, pt.Offset, pt.Bytes, dt)
		}
		sum += pt.Bytes
	}
	if sum != p.Bytes {
		return fmt.Errorf("%w: plan parts sum to %d bytes, want %d", ErrInvalid, sum, p.Bytes)
	}
	if n.op != nil {
		return ErrBusy
	}
	x := &planExecutor{n: n, p: p, topo: t, esz: dt.Size(), me: n.rank}
	room := x.gatherRoom()
	if n.cfg.Direct {
		if err := checkDirect(send, recv); err != nil {
			return err
		}
	}
	if n.cfg.Direct && room == 0 {
		// Work in recv itself, filled from send lazily unless the call is in place.
		src := send
		if sameBytes(send, recv) {
			src = nil
		}
		if len(n.ring) == 1 {
			copy(recv, send)
			rings.Finalize(dt, op, recv, 1)
			return n.startFilled(recv, nil, dt, op, nil, nil, nil, done)
		}
		gplans, folds := x.gatherPlans(recv, len(send), dt, op)
		plans := append(gplans, x.reducePlans()...)
		plans = append(plans, x.broadcastPlans()...)
		if len(folds) > 0 {
			if src != nil {
				copy(recv, send) // folds read work as it is when their gate opens: fill it now
			}
			src = nil
		}
		return n.startFilled(recv, src, dt, op, plans, folds, nil, done)
	}
	// The working buffer is the node's scratch buffer (no fresh memory to fault in on every call),
	// with room after the message for the gathered inputs.
	work := n.scratchBuffer(len(send) + room)
	copy(work, send)
	if len(n.ring) == 1 {
		rings.Finalize(dt, op, work[:len(send)], 1)
		return n.startScratch(work, nil, dt, op, nil, nil, func() { copy(recv, work[:len(recv)]) }, done)
	}
	gplans, folds := x.gatherPlans(work, len(send), dt, op)
	plans := append(gplans, x.reducePlans()...)
	plans = append(plans, x.broadcastPlans()...)
	return n.startScratch(work, nil, dt, op, plans, folds, func() { copy(recv, work[:len(recv)]) }, done)
}

// gatherRoom returns the bytes this node needs after the message for the gather: a copy of its own
// input for every part it sends to a host, and room for every input it hosts.
func (x *planExecutor) gatherRoom() int {
	room := 0
	for _, pt := range x.p.Parts {
		for _, b := range pt.BroadcastTo {
			if x.me == b || x.me == x.host(pt, b) {
				room += int(pt.Bytes)
			}
		}
	}
	return room
}

// Gates of part k: ringGate(k) holds a host's ring paths of the part until the inputs it hosts have
// arrived and are folded in; bcastGate(k) holds the broadcast from the chain's head until its ring
// has finished the part (or, for a ring of one node, until the hosted inputs are folded in).
func ringGate(k int) int  { return 2*k + 1 }
func bcastGate(k int) int { return 2*k + 2 }

// host returns the ring node of part pt that folds in outside node b's input: the first node of the
// part's ring after b in the global ring order.
func (x *planExecutor) host(pt plan.Part, b int) int {
	g := x.p.Parts[0].Ring
	i := slices.Index(g, b)
	for k := 1; k <= len(g); k++ {
		if v := g[(i+k)%len(g)]; slices.Contains(pt.Ring, v) {
			return v
		}
	}
	return pt.Ring[0]
}

// commonNICs returns the NICs healthy at every node of nodes, with their smallest bandwidth as weight;
// all NICs when none is common (the runtime's hot repair then finds a way).
func (x *planExecutor) commonNICs(nodes ...int) []float64 {
	nics := len(x.topo.Nodes[0].NICs)
	w := make([]float64, nics)
	any := false
	for j := range nics {
		w[j] = math.Inf(1)
		for _, u := range nodes {
			w[j] = min(w[j], x.topo.Nodes[u].NICs[j].Bandwidth())
		}
		any = any || w[j] > 0
	}
	if !any {
		for j := range w {
			w[j] = 1
		}
	}
	return w
}

// nicPieces splits n elements at element offset off over the NICs of weights w, each non-empty piece
// with its NIC.
func nicPieces(off, n int, w []float64) (spans []rings.Span, nics []NICID) {
	for j, sp := range splitChannels(n, w) {
		if sp.Len > 0 {
			spans = append(spans, rings.Span{Off: off + sp.Off, Len: sp.Len})
			nics = append(nics, NICID(j))
		}
	}
	return spans, nics
}

// gatherPlans builds the gather paths: every node outside a part's ring sends a copy of its input
// for the part to its host, which receives it into room after the message (work holds the message's
// msg bytes, then gatherRoom bytes). It returns the plans and per gate the fold that adds the hosted
// inputs to the part, in the order of the part's BroadcastTo (so the result does not depend on
// arrival order).
func (x *planExecutor) gatherPlans(work []byte, msg int, dt rings.DType, op rings.Op) ([]channelPlan, map[int]func()) {
	var plans []channelPlan
	folds := map[int]func(){}
	next := msg // where the next copy or hosted input goes
	for k, pt := range x.p.Parts {
		lo, hi := int(pt.Offset), int(pt.Offset+pt.Bytes)
		g := ringGate(k)
		if len(pt.Ring) < 2 {
			g = bcastGate(k)
		}
		var hosted []int // offsets of the hosted inputs in work
		for _, b := range pt.BroadcastTo {
			h := x.host(pt, b)
			spans, nics := nicPieces(0, (hi-lo)/x.esz, x.commonNICs(b, h))
			base := next
			switch x.me {
			case b:
				copy(work[base:base+hi-lo], work[lo:hi])
				next += hi - lo
			case h:
				hosted = append(hosted, base)
				next += hi - lo
			}
			for i, sp := range spans {
				id := uint16(x.ch)
				x.ch++
				if x.me != b && x.me != h {
					continue
				}
				cp := planPointToPoint(x.me == b, x.n.ring[h], []rings.Span{{Off: base/x.esz + sp.Off, Len: sp.Len}}, x.esz, x.n.cfg.ChunkBytes)[0]
				if x.me == h {
					cp.in.from = x.n.ring[b]
					cp.feeds = g
				}
				cp.channel, cp.routed, cp.outNIC, cp.inNIC = id, true, nics[i], nics[i]
				plans = append(plans, cp)
			}
		}
		single := len(pt.Ring) < 2
		if len(hosted) > 0 || single {
			folds[g] = func() {
				for _, off := range hosted {
					rings.Accumulate(dt, op, work[lo:hi], work[off:off+hi-lo])
				}
				if single {
					rings.Finalize(dt, op, work[lo:hi], len(x.n.ring))
				}
			}
		}
	}
	return plans, folds
}

// reducePlans builds the reduce operation: every part's ring AllReduce, channel by channel and piece
// by piece. Channels split each part by partWeights (as the standard ring splits the message, by
// nominal NIC bandwidth, unless the plan has leaves), and blocks as the standard ring's.
func (x *planExecutor) reducePlans() []channelPlan {
	var plans []channelPlan
	weights := x.partWeights()
	for k, pt := range x.p.Parts {
		ring := pt.Ring
		world := len(ring)
		head := -1 // the head of the part's broadcast chain
		if len(pt.BroadcastTo) > 0 {
			head = x.host(pt, pt.BroadcastTo[0])
		}
		rank := slices.Index(ring, x.me)
		loops := 1
		switch {
		case len(pt.Leaves) > 0:
			loops = leafLoops
		case x.weighted():
			loops = weightedLoops
		}
		count := int(pt.Bytes) / x.esz
		base := int(pt.Offset) / x.esz
		for c, sp := range splitChannels(count, weights[k]) {
			blocks := x.blocks(pt, sp.Len)
			for _, pc := range x.partPieces()[k][c] {
				id := uint16(x.ch)
				x.ch++
				// Leaf paths of this piece: leafIn[l][p] carries leaf l's input for the block that
				// ring position p owns, leafOut[l][p] that block's result back.
				leafIn, leafOut := make([][]uint16, len(pt.Leaves)), make([][]uint16, len(pt.Leaves))
				for l := range pt.Leaves {
					for range world {
						leafIn[l] = append(leafIn[l], uint16(x.ch))
						leafOut[l] = append(leafOut[l], uint16(x.ch+1))
						x.ch += 2
					}
				}
				if world < 2 {
					continue
				}
				boff := func(b int) int {
					bl := blocks[mod(b, world)]
					lo, _ := pc.cut(bl.Len)
					return (base + sp.Off + bl.Off + lo) * x.esz
				}
				blen := func(b int) int {
					lo, hi := pc.cut(blocks[mod(b, world)].Len)
					return (hi - lo) * x.esz
				}
				if rank < 0 {
					if l := slices.Index(pt.Leaves, x.me); l >= 0 {
						plans = append(plans, x.leafPlans(pc, c, ring, loops, leafIn[l], leafOut[l], boff, blen)...)
					}
					continue
				}
				succ, pred := ring[(rank+1)%world], ring[(rank+world-1)%world]
				out, in := allReduceRing(rank, world, loops, boff, blen, x.n.cfg.ChunkBytes, x.esz)
				cp := channelPlan{channel: id, routed: true, gate: ringGate(k),
					out:    &outPlan{to: x.n.ring[succ], frames: out},
					in:     &inPlan{from: x.n.ring[pred], frames: in},
					outNIC: x.pathNIC(pc, c, x.me, succ), inNIC: x.pathNIC(pc, c, pred, x.me)}
				if x.me == head {
					cp.feeds = bcastGate(k)
				}
				if len(pt.Leaves) > 0 {
					plans = append(plans, x.ownerPlans(&cp, pc, c, pt.Leaves, rank, loops, leafIn, leafOut, boff, blen)...)
				}
				plans = append(plans, cp)
			}
		}
	}
	return plans
}

// weighted reports whether the plan's rings have blocks sized by their owners ([plan.Weighted]).
func (x *planExecutor) weighted() bool { return x.p.Strategy == plan.Weighted }

// blocks splits a channel's count elements of part pt into the ring's blocks: equally, as the
// standard ring does, or for a weighted plan in proportion to the part's Owners. Position r owns block
// r+1 (allReduceRing), so block b is sized by the owner at position b−1.
func (x *planExecutor) blocks(pt plan.Part, count int) []rings.Span {
	world := len(pt.Ring)
	if !x.weighted() || len(pt.Owners) != world {
		return rings.Partition(count, world)
	}
	w := make([]float64, world)
	for b := range w {
		w[b] = float64(pt.Owners[mod(b-1, world)])
	}
	return splitChannels(count, w)
}

// ownerShares returns the fraction of part pt each ring position owns (equal unless weighted).
func (x *planExecutor) ownerShares(pt plan.Part) []float64 {
	world := len(pt.Ring)
	f := make([]float64, world)
	for p := range f {
		f[p] = 1 / float64(world)
	}
	if x.weighted() && len(pt.Owners) == world && pt.Bytes > 0 {
		for p, o := range pt.Owners {
			f[p] = float64(o) / float64(pt.Bytes)
		}
	}
	return f
}

// weightedLoops is the number of slices a weighted ring loops over. Its steps carry blocks of
// different sizes, so a ring taking its steps one after the other would wait, at every step, for its
// largest block on its slowest link; looped in a wavefront, every link carries slices of every block
// at once and runs at the pace of its total. 8 ran best on bench/schedules, against 4 and 16 (more,
// smaller frames); docs/results/schedules.md has the figures.
const weightedLoops = 8

// broadcastPlans builds the broadcast operation: each part's result goes down the chain host, then
// its outside nodes in dependency order, split over the NICs healthy along the whole chain.
func (x *planExecutor) broadcastPlans() []channelPlan {
	var plans []channelPlan
	for k, pt := range x.p.Parts {
		if len(pt.BroadcastTo) == 0 {
			continue
		}
		chain := append([]int{x.host(pt, pt.BroadcastTo[0])}, pt.BroadcastTo...)
		q := slices.Index(chain, x.me)
		spans, nics := nicPieces(int(pt.Offset)/x.esz, int(pt.Bytes)/x.esz, x.commonNICs(chain...))
		for i, sp := range spans {
			id := uint16(x.ch)
			x.ch++
			if q < 0 {
				continue
			}
			var succ, pred NodeID
			if q+1 < len(chain) {
				succ = x.n.ring[chain[q+1]]
			}
			if q > 0 {
				pred = x.n.ring[chain[q-1]]
			}
			cp := planBroadcast(q, len(chain), []rings.Span{sp}, x.esz, x.n.cfg.ChunkBytes, succ, pred)[0]
			cp.channel, cp.routed, cp.outNIC, cp.inNIC = id, true, nics[i], nics[i]
			if q == 0 {
				cp.gate = bcastGate(k)
			}
			plans = append(plans, cp)
		}
	}
	return plans
}

// AllReduceWithPlan is the blocking form of StartAllReduceWithPlan (see [Node.AllReduce] for the
// rules).
func (n *Node) AllReduceWithPlan(ctx context.Context, t plan.Topology, p plan.Plan, send, recv []byte, dt rings.DType, op rings.Op) error {
	return n.run(ctx, func(done func(error)) error { return n.StartAllReduceWithPlan(t, p, send, recv, dt, op, done) })
}
