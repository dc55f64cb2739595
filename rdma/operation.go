package rdma

import (
	"fmt"

	"github.com/concord-ccl/concord/rings"
)

// operation is a running collective at one node.
type operation struct {
	n      *Node
	work   []byte
	region *Region
	dt     rings.DType
	rop    rings.Op
	world  int
	out    map[PathID]*outStream
	in     map[PathID]*inStream
	outs   []*outStream
	open   int // paths of the operation (zero: nothing to move)
	done   func(error)
	over   bool
	commit func()
	gates  map[int]*opGate
	// scratch says work is the node's scratch buffer. moved says some path resumed after posting
	// chunks: the connection they were posted on may still hold some that point into work.
	scratch bool
	moved   bool
	// src, when set, is the caller's input that work starts as a copy of. It is copied lazily, one
	// fillPage at a time just before a chunk first reads or writes that part of work (filled marks the
	// pages done), so the first chunks leave without waiting for a copy of the whole buffer and the
	// copy overlaps the transfer. A page that an arriving chunk covers whole is not copied at all: a
	// fold reads the input from src as it writes the page, and an all-gather chunk overwrites it.
	src    []byte
	filled []bool
	// sent, when set, runs once every outgoing path is acknowledged, before the incoming ones may
	// be complete: a calibration times its sends with it.
	sent func()
}

// fillPage is the unit of the lazy copy of an operation's input into its working buffer.
const fillPage = 64 << 10

// fill makes work[off:off+n] hold the input, copying the pages of it not copied yet.
func (o *operation) fill(off, n int) {
	if o.src == nil || n <= 0 {
		return
	}
	for p := off / fillPage; p <= (off+n-1)/fillPage; p++ {
		if !o.filled[p] {
			lo, hi := p*fillPage, min((p+1)*fillPage, len(o.work))
			copy(o.work[lo:hi], o.src[lo:hi])
			o.filled[p] = true
		}
	}
}

// cover prepares work[off:off+n] to be overwritten whole: a page of it not copied yet that the range
// covers whole needs no copy (it is marked done), and the pages it covers in part are filled.
func (o *operation) cover(off, n int) {
	o.eachPage(off, n, func(lo, hi int, whole bool) {
		if whole {
			o.filled[lo/fillPage] = true
		} else {
			o.fill(lo, hi-lo)
		}
	})
}

// fold stores in work[off:off+len(data)] the input folded with data (input op data). Where a page of
// the range was not copied yet and the range covers it whole, the fold reads the input straight from
// src and writes the page once (rings.AccumulateInto), instead of copying it and folding in place.
func (o *operation) fold(off int, data []byte) {
	if o.src == nil {
		rings.Accumulate(o.dt, o.rop, o.work[off:off+len(data)], data)
		return
	}
	o.eachPage(off, len(data), func(lo, hi int, whole bool) {
		in := data[lo-off : hi-off]
		if whole {
			rings.AccumulateInto(o.dt, o.rop, o.work[lo:hi], o.src[lo:hi], in)
			o.filled[lo/fillPage] = true
			return
		}
		o.fill(lo, hi-lo)
		rings.Accumulate(o.dt, o.rop, o.work[lo:hi], in)
	})
}

// eachPage calls f for each fillPage that work[off:off+n] overlaps, in order, with the overlap
// [lo, hi) and whether the page is not copied yet and lies wholly inside the range. Without a src it
// does nothing.
func (o *operation) eachPage(off, n int, f func(lo, hi int, whole bool)) {
	if o.src == nil {
		return
	}
	for lo, end := off, off+n; lo < end; {
		p := lo / fillPage
		pageEnd := min((p+1)*fillPage, len(o.work))
		hi := min(pageEnd, end)
		f(lo, hi, !o.filled[p] && lo == p*fillPage && hi == pageEnd)
		lo = hi
	}
}

// fillFrom makes the operation's input src, copied into work lazily. It must be called before the
// operation posts or applies anything.
func (o *operation) fillFrom(src []byte) {
	o.src = src
	o.filled = make([]bool, (len(src)+fillPage-1)/fillPage)
}

// opGate holds gated paths until every in path feeding it is complete; fold runs as it opens.
type opGate struct {
	need  int
	open  bool
	fold  func()
	outs  []*outStream
	ins   []*inStream
	feeds []*inStream
}

type outStream struct {
	op            uint64 // the path's operation number
	path          PathID
	plan          *outPlan
	dep           *inStream
	next          int // next frame to post
	acked         int // frames acknowledged
	high          int // one past the highest frame ever posted
	paused        bool
	local, remote NICID
	conn          Conn
	gate          *opGate
}

type inStream struct {
	op      uint64 // the path's operation number
	path    PathID
	plan    *inPlan
	got     int
	gate    *opGate
	feeds   *opGate
	pending []pendingChunk // accepted before its gate opened
	// wait, when set, is the incoming path whose frame plan.waitFor[i] must be applied before frame i
	// of this one; held keeps, in order, the accepted frames that wait. waiters are the paths that
	// wait on this one.
	wait    *inStream
	held    []pendingChunk
	waiters []*inStream
}

// waiting reports whether frame seq of in waits for a frame of in.wait not applied yet.
func (in *inStream) waiting(seq int) bool {
	if in.wait == nil || seq >= len(in.plan.waitFor) {
		return false
	}
	i := in.plan.waitFor[seq]
	return i >= 0 && i < len(in.wait.plan.frames) && in.wait.got <= i
}

// mustHold reports whether accepted frame seq of in has to wait before it is applied: it waits, or
// an earlier frame does (frames are applied in order).
func (in *inStream) mustHold(seq int) bool {
	return len(in.held) > 0 || in.waiting(seq)
}

type pendingChunk struct {
	seq  uint64
	data []byte
}

// start begins an operation with the given channel plans on working buffer work. commit runs on
// success before done.
func (n *Node) start(work []byte, dt rings.DType, op rings.Op, plans []channelPlan, commit func(), done func(error)) error {
	return n.startGated(work, dt, op, plans, nil, commit, done)
}

// startScratch is startFilled on a work buffer from scratchBuffer: the operation gives the buffer
// back when it ends, or at once when it does not start.
func (n *Node) startScratch(work, src []byte, dt rings.DType, op rings.Op, plans []channelPlan, folds map[int]func(), commit func(), done func(error)) error {
	if err := n.startFilled(work, src, dt, op, plans, folds, commit, done); err != nil {
		n.scratch, n.scratchFree = nil, false
		return err
	}
	if o := n.op; o != nil && !o.over {
		o.scratch = true
	} else {
		n.scratchFree = true // it finished inside start (nothing to move): nothing reads work
	}
	return nil
}

// startGated is start with gates: folds[g] runs when gate g opens (see channelPlan.gate).
func (n *Node) startGated(work []byte, dt rings.DType, op rings.Op, plans []channelPlan, folds map[int]func(), commit func(), done func(error)) error {
	return n.startFilled(work, nil, dt, op, plans, folds, commit, done)
}

// startFilled is startGated with work filled lazily from src (see operation.fillFrom); nil src means
// work is ready. Folds must not be used with a src.
func (n *Node) startFilled(work, src []byte, dt rings.DType, op rings.Op, plans []channelPlan, folds map[int]func(), commit func(), done func(error)) error {
	if n.op != nil {
		return ErrBusy
	}
	o := &operation{n: n, work: work, dt: dt, rop: op, world: len(n.ring), out: map[PathID]*outStream{},
		in: map[PathID]*inStream{}, done: done, commit: commit, gates: map[int]*opGate{}}
	if src != nil {
		o.fillFrom(src)
	}
	gate := func(g int) *opGate {
		if g == 0 {
			return nil
		}
		if o.gates[g] == nil {
			o.gates[g] = &opGate{fold: folds[g]}
		}
		return o.gates[g]
	}
	region, err := n.ep.Register(work)
	if err != nil {
		return err
	}
	o.region = region
	n.op = o
	var opens []Open
	for _, cp := range plans {
		outNIC, inNIC := NICID(cp.channel), NICID(cp.channel)
		if cp.routed {
			outNIC, inNIC = cp.outNIC, cp.inNIC
		}
		var in *inStream
		if cp.in != nil && len(cp.in.frames) > 0 {
			id := PathID{Src: cp.in.from, Dst: n.ep.Node(), Channel: cp.channel}
			n.pathOps[id]++
			in = &inStream{path: id, plan: cp.in, op: n.pathOps[id], gate: gate(cp.gate), feeds: gate(cp.feeds)}
			if in.gate != nil {
				in.gate.ins = append(in.gate.ins, in)
			}
			if in.feeds != nil {
				in.feeds.need++
				in.feeds.feeds = append(in.feeds.feeds, in)
			}
			o.in[id] = in
			o.open++
			opens = append(opens, Open{Path: id, Op: in.op, Primary: inNIC, Chunks: uint64(len(cp.in.frames))})
			n.ensurePeer(cp.in.from)
		}
		if cp.out != nil && len(cp.out.frames) > 0 {
			id := PathID{Src: n.ep.Node(), Dst: cp.out.to, Channel: cp.channel}
			n.pathOps[id]++
			s := &outStream{path: id, plan: cp.out, dep: in, paused: true, op: n.pathOps[id], gate: gate(cp.gate)}
			if s.gate != nil {
				s.gate.outs = append(s.gate.outs, s)
			}
			o.out[id] = s
			o.outs = append(o.outs, s)
			o.open++
			opens = append(opens, Open{Path: id, Op: s.op, Primary: outNIC, Chunks: uint64(len(cp.out.frames))})
			n.ensurePeer(cp.out.to)
		}
	}
	// Cross-path links: an out path whose frames depend on another channel's incoming path, and an
	// incoming path whose frames wait for another's.
	byChannel := map[uint16]*inStream{}
	for _, in := range o.in {
		byChannel[in.path.Channel] = in
	}
	unlinked := func(ch, other uint16) error {
		o.over, n.op = true, nil
		n.ep.Deregister(region)
		return fmt.Errorf("%w: channel %d is linked to channel %d, which has no incoming path here", ErrInvalid, ch, other)
	}
	for _, cp := range plans {
		if cp.out != nil && cp.out.depOn != nil && len(cp.out.frames) > 0 {
			s := o.out[PathID{Src: n.ep.Node(), Dst: cp.out.to, Channel: cp.channel}]
			if s.dep = byChannel[*cp.out.depOn]; s.dep == nil {
				return unlinked(cp.channel, *cp.out.depOn)
			}
		}
		if cp.in != nil && cp.in.waitOn != nil && len(cp.in.frames) > 0 {
			in := byChannel[cp.channel]
			if in.wait = byChannel[*cp.in.waitOn]; in.wait == nil {
				return unlinked(cp.channel, *cp.in.waitOn)
			}
			in.wait.waiters = append(in.wait.waiters, in)
		}
	}
	for _, g := range o.gates {
		g.open = g.need == 0
		if g.open && g.fold != nil {
			g.fold()
		}
	}
	for _, in := range opens {
		n.step(in)
	}
	// Replay chunks that arrived before the operation started here.
	for _, in := range o.in {
		k := earlyKey{in.path, uint32(in.op & 0xffff)}
		for _, e := range n.early[k] {
			if n.op == o {
				o.arrived(e.conn, tag(in.op, in.path.Channel), e.seq, e.data)
			}
			n.release(e.data) // arrived applied it or kept its own copy
		}
		delete(n.early, k)
	}
	if n.op == o && o.open == 0 {
		o.finish(nil)
	}
	return nil
}

// tag names a path's operation on the wire: the low 16 bits of its number, and the channel.
func tag(op uint64, channel uint16) uint32 { return uint32(op&0xffff)<<16 | uint32(channel) }

func (o *operation) resume(a Resume) {
	s := o.out[a.Path]
	if s == nil {
		return
	}
	conn := o.n.conns[connKey{a.Path.Dst, a.Local, DataClass}]
	if s.high > 0 {
		o.moved = true // chunks posted before the pause may still be queued where they were posted
	}
	s.local, s.remote = a.Local, a.Remote
	s.conn = conn
	s.next = int(a.From)
	s.acked = int(a.From) // the receiver's word: chunks from there on are sent and acknowledged anew
	s.paused = false
	if a.Epoch > 0 && a.From > 0 || s.high > int(a.From) {
		o.n.stats.Notes = append(o.n.stats.Notes, fmt.Sprintf("resume %v epoch %d from %d", a.Path, a.Epoch, a.From))
	}
	o.pump(s)
	o.check()
}

// pump posts the ready frames of s within the window.
func (o *operation) pump(s *outStream) {
	n := o.n
	for !s.paused && !o.over && (s.gate == nil || s.gate.open) && s.next < len(s.plan.frames) && s.next-s.acked < n.cfg.Window {
		f := s.plan.frames[s.next]
		if f.dep >= 0 && (s.dep == nil || s.dep.got <= f.dep) {
			return
		}
		if !n.alive(s.conn) {
			// The pair's connection failed earlier (perhaps while no path used it): that is a failure
			// of this path too.
			n.step(LinkFailed{Peer: s.path.Dst, Local: s.local, Remote: s.remote, Err: ErrClosed})
			return
		}
		o.fill(f.off, f.n)
		if err := s.conn.Send(Chunk{Tag: tag(s.op, s.path.Channel), Seq: uint64(s.next), Data: o.work[f.off : f.off+f.n]}); err != nil {
			return
		}
		if s.next < s.high {
			n.stats.RetransmittedBytes += int64(f.n)
		}
		if int(s.local) < len(n.stats.NICBytes) {
			n.stats.NICBytes[s.local] += int64(f.n)
		}
		seq := s.next
		s.next++
		s.high = max(s.high, s.next)
		n.step(Posted{Path: s.path, Seq: uint64(seq), Local: s.local, Remote: s.remote})
	}
}

func (o *operation) completed(ev Completed) {
	sp := ev.Conn.Spec()
	id := PathID{Src: o.n.ep.Node(), Dst: sp.Peer, Channel: uint16(ev.Tag & 0xffff)}
	s := o.out[id]
	if s == nil || ev.Tag>>16 != uint32(s.op&0xffff) || s.paused || sp.Local != s.local || int(ev.Seq) < s.acked {
		return // a completion of a pair this path has left
	}
	s.acked = int(ev.Seq) + 1
	o.n.step(Acked{Path: id, Seq: ev.Seq, Local: sp.Local, Remote: sp.Remote})
	o.pump(s)
	o.check()
}

func (o *operation) arrived(c Conn, tag uint32, seq uint64, data []byte) {
	n := o.n
	sp := c.Spec()
	id := PathID{Src: sp.Peer, Dst: n.ep.Node(), Channel: uint16(tag & 0xffff)}
	in := o.in[id]
	if in == nil {
		return
	}
	accept := false
	for _, a := range n.step(Received{Path: id, Seq: seq, Local: sp.Local, Remote: sp.Remote}) {
		if _, ok := a.(Accept); ok {
			accept = true
		}
	}
	if !accept || o.over || int(seq) >= len(in.plan.frames) {
		return
	}
	if in.gate != nil && !in.gate.open {
		in.pending = append(in.pending, pendingChunk{seq, o.n.hold(data)})
		return
	}
	o.deliver(in, seq, data)
}

// deliver applies an accepted chunk of in, or keeps a copy of it while it must wait for another path.
func (o *operation) deliver(in *inStream, seq uint64, data []byte) {
	if in.mustHold(int(seq)) {
		in.held = append(in.held, pendingChunk{seq, o.n.hold(data)})
		return
	}
	o.apply(in, seq, data)
}

// releaseWaiters applies the held chunks of the paths waiting on in that no longer have to wait.
func (o *operation) releaseWaiters(in *inStream) {
	for _, w := range in.waiters {
		for len(w.held) > 0 && !o.over {
			pc := w.held[0]
			if w.waiting(int(pc.seq)) {
				break
			}
			w.held = w.held[1:]
			o.apply(w, pc.seq, pc.data)
			o.n.release(pc.data)
		}
	}
}

// apply applies an accepted chunk of in to the working buffer and moves what waited for it.
func (o *operation) apply(in *inStream, seq uint64, data []byte) {
	f := in.plan.frames[seq]
	if len(data) != f.n {
		o.finish(fmt.Errorf("%w: path %v chunk %d has %d bytes, want %d", ErrInvalid, in.path, seq, len(data), f.n))
		return
	}
	dst := o.work[f.off : f.off+f.n]
	switch f.mode {
	case recvCopy:
		o.cover(f.off, f.n)
		copy(dst, data)
	case recvReduce:
		o.fold(f.off, data)
	case recvReduceLast:
		o.fold(f.off, data)
		rings.Finalize(o.dt, o.rop, dst, o.world)
	}
	in.got++
	if len(in.waiters) > 0 {
		o.releaseWaiters(in)
	}
	for _, s := range o.outs {
		if s.dep == in {
			o.pump(s)
		}
	}
	if g := in.feeds; g != nil && in.got == len(in.plan.frames) && !g.open {
		g.need--
		if g.need == 0 {
			o.openGate(g)
		}
	}
	o.check()
}

// openGate runs the gate's fold, applies the chunks its in paths held back and starts its out paths.
func (o *operation) openGate(g *opGate) {
	g.open = true
	if g.fold != nil {
		g.fold()
	}
	for _, in := range g.ins {
		pend := in.pending
		in.pending = nil
		for _, pc := range pend {
			if o.over {
				return
			}
			o.deliver(in, pc.seq, pc.data)
			o.n.release(pc.data)
		}
	}
	for _, s := range g.outs {
		o.pump(s)
	}
}

// check finishes the operation when every path is complete.
func (o *operation) check() {
	if o.over {
		return
	}
	for _, s := range o.out {
		if s.acked < len(s.plan.frames) {
			return
		}
	}
	if f := o.sent; f != nil {
		o.sent = nil
		f()
	}
	for _, in := range o.in {
		if in.got < len(in.plan.frames) {
			return
		}
	}
	o.finish(nil)
}

func (o *operation) finish(err error) {
	if o.over {
		return
	}
	o.over = true
	n := o.n
	if n.op == o {
		n.op = nil
	}
	n.ep.Deregister(o.region)
	if err == nil {
		o.fill(0, len(o.work)) // a direct operation's commit is a no-op: work is the result
		if o.commit != nil {
			o.commit()
		}
	}
	o.src = nil
	if o.scratch {
		// After a success with no path moved, every chunk posted from work was completed, so no
		// provider reads it any more and the next operation may reuse it. Otherwise a connection
		// left behind may still send from it: it stays with that connection and the next operation
		// gets a fresh buffer.
		if err == nil && !o.moved {
			n.scratchFree = true
		} else {
			n.scratch, n.scratchFree = nil, false
		}
	}
	if o.done != nil {
		o.done(err)
	}
}
