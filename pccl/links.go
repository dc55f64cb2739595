package pccl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/rings"
)

// maxPayload bounds a data frame's payload; PartBytes larger than this is refused by receivers.
const maxPayload = 64 << 20

// links owns the peer-to-peer connections of one Communicator: a pool of outgoing connections to the
// ring successor and the pools of incoming connections from predecessors, each incoming connection
// with a reader goroutine that routes frames to the collective they belong to.
//
// Every field below mu is guarded by mu. Each outConn has a writer goroutine that writes the frames
// queued to it in order; loadMu guards the load model of every outConn.
// Aborting one collective never closes a connection: frames are always written whole, and readers
// drop the frames of operations that are over, so other tags keep their links. A connection is closed
// only when it fails or stays silent past its progress deadline.
type links struct {
	c  *Communicator
	ln net.Listener

	opened   atomic.Uint64 // data connections dialled to successors
	accepted atomic.Uint64 // data connections admitted from predecessors

	rateMu sync.Mutex
	rate   float64 // smoothed bytes per second of recent sends, 0 until measured

	loadMu sync.Mutex

	mu       sync.Mutex
	next     uint64     // successor's id, 0 if none
	out      []*outConn // pool to next
	in       map[uint64][]*inConn
	inboxes  map[inboxKey]*inbox
	dead     map[uint64]bool // sequence numbers whose frames are dropped
	maxDead  uint64
	changed  chan struct{} // closed and replaced when inboxes or dead change
	isDirty  bool          // a link failed; ask for a re-wire
	outBroke bool          // a connection of the pool to next failed: re-dial it
	isClosed bool
	hier     hierLinks // sub-ring pools of the hierarchical AllReduce
	wg       sync.WaitGroup
}

type inboxKey struct{ tag, seq uint64 }

// outConn is one connection of a pool to a successor. Sends queue their frames to it and return;
// its writer goroutine writes them whole, in order, so that one collective keeps every connection of
// the pool busy at once, and a slow connection holds up only the frames given to it.
type outConn struct {
	conn net.Conn
	l    *links

	qmu    sync.Mutex
	queue  []*outFrame
	wake   chan struct{} // holds a token when the queue may have grown
	closed bool          // no frame is taken any more; set by close or a failed write
	quit   chan struct{} // closed by close

	wmu sync.Mutex
	cur *outFrame // the frame being written, nil between frames; the write deadline is set under wmu

	// The load model, guarded by links.loadMu: pending is the bytes queued to the connection and not
	// yet written; cost is the smoothed seconds per byte of the writes that blocked (0 until one did).
	pending float64
	cost    float64
}

// outFrame is one frame queued to an outConn: the payload stays the caller's, read until done.
type outFrame struct {
	s       *stream
	oc      *outConn // the connection it went to
	id      rings.ChunkID
	payload []byte
	queued  time.Time
	done    chan struct{} // closed once the frame is written or given up
	err     error         // set before done is closed
}

// newOutConn starts the writer of conn, which runs until close.
func (l *links) newOutConn(conn net.Conn) *outConn {
	oc := &outConn{conn: conn, l: l, wake: make(chan struct{}, 1), quit: make(chan struct{})}
	l.wg.Add(1)
	go oc.write()
	return oc
}

// close closes the connection and stops its writer; frames still queued fail. It may be called more
// than once.
func (oc *outConn) close() {
	oc.conn.Close()
	oc.qmu.Lock()
	if !oc.closed {
		oc.closed = true
		close(oc.quit)
	}
	oc.qmu.Unlock()
}

// enqueue hands f to the writer, or reports false if the connection no longer takes frames.
func (oc *outConn) enqueue(f *outFrame) bool {
	oc.qmu.Lock()
	defer oc.qmu.Unlock()
	if oc.closed {
		return false
	}
	oc.queue = append(oc.queue, f)
	select {
	case oc.wake <- struct{}{}:
	default:
	}
	return true
}

// next returns the next queued frame, waiting for one, or nil once the connection is closed; frames
// left in the queue then are given back in rest.
func (oc *outConn) next() (f *outFrame, rest []*outFrame) {
	for {
		oc.qmu.Lock()
		if oc.closed {
			rest, oc.queue = oc.queue, nil
			oc.qmu.Unlock()
			return nil, rest
		}
		if len(oc.queue) > 0 {
			f = oc.queue[0]
			oc.queue[0] = nil
			oc.queue = oc.queue[1:]
			oc.qmu.Unlock()
			return f, nil
		}
		oc.qmu.Unlock()
		select {
		case <-oc.wake:
		case <-oc.quit:
		}
	}
}

// write is the writer goroutine: it writes every queued frame whole, unless its collective was
// aborted before its turn came. A failed write gives the connection up and fails the frames behind it.
func (oc *outConn) write() {
	defer oc.l.wg.Done()
	var hdr [wire.DataHeaderSize]byte
	var bufs net.Buffers
	for {
		f, rest := oc.next()
		if f == nil {
			for _, f := range rest {
				oc.unload(f)
				f.finish(fmt.Errorf("%w: send %v: connection closed", ErrPeerLeft, f.id))
			}
			return
		}
		s := f.s
		select {
		case <-s.aborted:
			oc.unload(f)
			f.finish(s.h.cause)
			continue
		default:
		}
		wire.PutDataHeader(hdr[:], wire.DataHeader{Len: uint32(len(f.payload)), Epoch: s.epoch, Tag: s.key.tag,
			Seq: s.key.seq, Step: f.id.Step, Part: f.id.Part})
		bufs = append(bufs[:0], hdr[:], f.payload)
		w := bufs
		t0 := time.Now()
		// A frame is written whole or the connection is given up: a write that makes no progress
		// for its deadline means the link is silent.
		oc.wmu.Lock()
		oc.cur = f
		oc.conn.SetWriteDeadline(t0.Add(oc.l.deadline(len(f.payload))))
		oc.wmu.Unlock()
		s.watch.Do(func() { go s.giveUpStuckWrites() })
		s.writing(t0)
		_, err := transport.WriteBuffers(oc.conn, &w)
		oc.wmu.Lock()
		oc.cur = nil // before the next frame's deadline, so a late give-up never hits it
		oc.wmu.Unlock()
		t1 := time.Now()
		took := t1.Sub(t0)
		s.wrote(f, t1, err == nil)
		oc.unload(f)
		if err != nil {
			oc.l.broken(oc.conn)
			oc.close()
			switch {
			case isAborted(s):
				err = s.h.cause
			case errors.Is(err, os.ErrDeadlineExceeded):
				s.silent.CompareAndSwap(0, 1+int32(wire.LinkOut))
				err = fmt.Errorf("%w: send %v: %w after %v", ErrPeerLeft, f.id, errSilentLink, took.Round(time.Millisecond))
			default:
				err = fmt.Errorf("%w: send %v: %w", ErrPeerLeft, f.id, err)
			}
			f.finish(err)
			continue // fails what is queued behind it
		}
		oc.measure(len(f.payload), took)
		oc.l.observe(len(f.payload), took)
		f.finish(nil)
	}
}

func isAborted(s *stream) bool {
	select {
	case <-s.aborted:
		return true
	default:
		return false
	}
}

func (f *outFrame) finish(err error) {
	f.err = err
	if err != nil {
		f.s.failed.CompareAndSwap(nil, &err)
	}
	close(f.done)
}

type inConn struct {
	conn  net.Conn
	from  uint64
	index int
	last  atomic.Int64 // UnixNano of the last frame header read or payload handed over
	stage []byte       // the buffer of a staged frame, owned by the reader; kept for the next one
}

// maxPoolIndex bounds the pool index a LinkHello may name: the flat ring's pool, then the sub-rings'.
const maxPoolIndex = hierIndexBase + int(numSubRings)*hierPoolMax

func newLinks(c *Communicator, ln net.Listener) *links {
	return &links{c: c, ln: ln, in: map[uint64][]*inConn{}, inboxes: map[inboxKey]*inbox{},
		dead: map[uint64]bool{}, changed: make(chan struct{})}
}

func (l *links) dirty() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.isDirty
}

func (l *links) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// close shuts the listener and every link and waits for the readers.
func (l *links) close() {
	l.mu.Lock()
	l.isClosed = true
	l.ln.Close()
	l.hier.closeAll()
	for _, oc := range l.out {
		oc.close()
	}
	for _, pool := range l.in {
		for _, ic := range pool {
			if ic != nil {
				ic.conn.Close()
			}
		}
	}
	l.notify()
	l.mu.Unlock()
	l.wg.Wait()
}

// wire opens the links of the ring in m: PoolSize connections to the successor (kept if they already
// lead there and are healthy), and drops incoming pools from peers that are no longer the predecessor.
// On failure it returns the peers it could not reach.
func (l *links) wire(m *wire.Connect) ([]uint64, error) {
	if failed, err := l.wireHier(m); err != nil {
		return failed, err
	}
	me := l.c.id
	i := slices.IndexFunc(m.Ring, func(p wire.PeerInfo) bool { return p.ID == me })
	if i < 0 {
		return nil, fmt.Errorf("ring of epoch %d does not contain peer %d", m.Epoch, me)
	}
	n := len(m.Ring)
	var next, prev wire.PeerInfo
	if n > 1 {
		next, prev = m.Ring[(i+1)%n], m.Ring[(i+n-1)%n]
	}
	l.mu.Lock()
	// Survivors whose successor did not change keep their pool: only the links next to a change are
	// dialled again.
	keep := n > 1 && l.next == next.ID && !l.outBroke && len(l.out) == l.c.cfg.PoolSize
	var stale []*outConn
	if !keep {
		stale, l.out, l.next = l.out, nil, 0
	}
	for from, pool := range l.in {
		if from != prev.ID && !l.hier.expects(from) {
			for _, ic := range pool {
				if ic != nil {
					ic.conn.Close()
				}
			}
			delete(l.in, from)
		}
	}
	l.mu.Unlock()
	for _, oc := range stale {
		oc.close()
	}
	if n == 1 || keep {
		l.mu.Lock()
		l.isDirty, l.outBroke = false, false
		l.mu.Unlock()
		return nil, nil
	}
	conns, k, err := l.dialPool(next, 0, l.c.cfg.PoolSize)
	if err != nil {
		return []uint64{next.ID}, fmt.Errorf("link %d to peer %d at %s: %w", k, next.ID, next.Addr, err)
	}
	pool := make([]*outConn, 0, len(conns))
	for _, conn := range conns {
		pool = append(pool, l.newOutConn(conn))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isClosed {
		for _, oc := range pool {
			oc.close()
		}
		return nil, ErrClosed
	}
	l.out, l.next, l.isDirty, l.outBroke = pool, next.ID, false, false
	return nil, nil
}

// dialPool opens n links to peer to at once, with pool indices base to base+n−1, and returns them in
// index order: each dial takes a round trip or more (a handshake over TLS or QUIC), and across a WAN
// one after the other they would add up to the re-wiring after every membership change. On failure it
// closes the links it opened and returns the index of the first that failed, with its error.
func (l *links) dialPool(to wire.PeerInfo, base, n int) ([]net.Conn, int, error) {
	conns := make([]net.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() { conns[k], errs[k] = l.dial(to, base+k) })
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
			return nil, k, err
		}
	}
	return conns, 0, nil
}

func (l *links) dial(to wire.PeerInfo, index int) (net.Conn, error) {
	cfg := l.c.cfg
	ctx, cancel := context.WithTimeout(context.Background(), l.c.reachTimeout(to))
	defer cancel()
	conn, err := l.c.dialPeer(ctx, to)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(cfg.DialTimeout))
	err = wire.Exchange(conn, wire.KindData)
	if err == nil {
		_, err = conn.Write(wire.AppendFrame(nil, &wire.LinkHello{Token: cfg.Token, From: l.c.id, To: to.ID, Index: uint16(index)}))
	}
	var msg wire.Message
	if err == nil {
		msg, _, err = wire.ReadFrame(conn, 1<<16, nil)
	}
	if err == nil {
		if ack, ok := msg.(*wire.LinkAck); !ok {
			err = fmt.Errorf("link answer is %T", msg)
		} else if !ack.OK {
			err = fmt.Errorf("link refused: %s", ack.Reason)
		}
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	l.opened.Add(1)
	return conn, nil
}

// accept admits links from predecessors.
func (l *links) accept() {
	defer l.c.wg.Done()
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.wg.Add(1)
		go l.admit(conn)
	}
}

func (l *links) admit(conn net.Conn) {
	defer l.wg.Done()
	cfg := l.c.cfg
	conn.SetDeadline(time.Now().Add(cfg.DialTimeout))
	kind, err := wire.Accept(conn, wire.KindData, wire.KindState, wire.KindBench, wire.KindCall)
	if err != nil {
		conn.Close()
		return
	}
	switch kind {
	case wire.KindCall:
		l.c.takeCall(conn)
		return
	case wire.KindState:
		l.c.serveState(conn)
		return
	case wire.KindBench:
		l.c.serveBench(conn)
		return
	}
	msg, _, err := wire.ReadFrame(conn, 1<<16, nil)
	if err != nil {
		conn.Close()
		return
	}
	h, ok := msg.(*wire.LinkHello)
	reason := ""
	switch {
	case !ok:
		reason = fmt.Sprintf("first message is %T, want LinkHello", msg)
	case h.Token != cfg.Token:
		reason = "run token mismatch"
	case h.To != l.c.id:
		reason = fmt.Sprintf("this is peer %d, not %d", l.c.id, h.To)
	case int(h.Index) >= maxPoolIndex:
		reason = fmt.Sprintf("pool index %d out of range", h.Index)
	}
	if reason != "" {
		conn.Write(wire.AppendFrame(nil, &wire.LinkAck{OK: false, Reason: reason}))
		conn.Close()
		return
	}
	ic := &inConn{conn: conn, from: h.From, index: int(h.Index)}
	ic.last.Store(l.c.unixNano(time.Now()))
	l.mu.Lock()
	if l.isClosed {
		l.mu.Unlock()
		conn.Close()
		return
	}
	pool := l.in[h.From]
	for len(pool) <= ic.index {
		pool = append(pool, nil)
	}
	if old := pool[ic.index]; old != nil {
		old.conn.Close()
	}
	pool[ic.index] = ic
	l.in[h.From] = pool
	l.mu.Unlock()
	if _, err := conn.Write(wire.AppendFrame(nil, &wire.LinkAck{OK: true})); err != nil {
		conn.Close()
		return
	}
	conn.SetDeadline(time.Time{})
	l.accepted.Add(1)
	l.read(ic)
}

// retire drops incoming pools from peers that left the ring.
func (l *links) retire(ring []uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for from, pool := range l.in {
		if !slices.Contains(ring, from) {
			for _, ic := range pool {
				if ic != nil {
					ic.conn.Close()
				}
			}
			delete(l.in, from)
		}
	}
}

// tombstone marks seq so that its frames are read and dropped.
func (l *links) tombstone(seq uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dead[seq] = true
	if seq > l.maxDead {
		l.maxDead = seq
	}
	// Frames of long-finished operations cannot arrive any more: keep the set small.
	if len(l.dead) > 4096 {
		for s := range l.dead {
			if s+2048 < l.maxDead {
				delete(l.dead, s)
			}
		}
	}
	l.notify()
}

// read routes the frames of one incoming connection into the inboxes of their collectives.
func (l *links) read(ic *inConn) {
	defer l.forget(ic)
	var hb [wire.DataHeaderSize]byte
	for {
		if _, err := transport.ReadFull(ic.conn, hb[:]); err != nil {
			l.broken(ic.conn)
			return
		}
		ic.last.Store(l.c.unixNano(time.Now()))
		h, err := wire.DecodeDataHeader(hb[:], maxPayload)
		if err != nil {
			l.c.log.Warn("bad data frame, closing link", "from", ic.from, "err", err)
			l.broken(ic.conn)
			return
		}
		ib, ok := l.waitInbox(inboxKey{h.Tag, h.Seq})
		if !ok {
			if _, err := io.CopyN(io.Discard, ic.conn, int64(h.Len)); err != nil {
				l.broken(ic.conn)
				return
			}
			continue
		}
		if err := ib.deliver(ic, h); err != nil {
			l.broken(ic.conn)
			return
		}
	}
}

// forget closes an incoming connection whose reader stopped and takes it out of its pool, so that
// new collectives see the gap at once instead of waiting on a connection nobody reads.
func (l *links) forget(ic *inConn) {
	ic.conn.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	if pool := l.in[ic.from]; ic.index < len(pool) && pool[ic.index] == ic {
		pool[ic.index] = nil
	}
}

// waitInbox returns the inbox of key once its collective has commenced here, or false if the frames
// are to be dropped (the operation is over, or the links are closing).
func (l *links) waitInbox(key inboxKey) (*inbox, bool) {
	for {
		l.mu.Lock()
		ib, dead, closed, ch := l.inboxes[key], l.dead[key.seq], l.isClosed, l.changed
		l.mu.Unlock()
		switch {
		case ib != nil:
			return ib, true
		case dead || closed:
			return nil, false
		}
		<-ch
	}
}

// broken closes a failed connection and remembers to ask for a re-wire.
func (l *links) broken(conn net.Conn) {
	conn.Close()
	l.mu.Lock()
	l.isDirty = true
	for _, oc := range l.out {
		if oc.conn == conn {
			l.outBroke = true
		}
	}
	l.mu.Unlock()
}

// Progress deadlines: a frame may take at most progressFactor times what the measured send rate
// predicts, and never less than Config.ProgressTimeout.
const progressFactor = 8

// deadline returns how long n bytes may take to move before their link counts as silent.
func (l *links) deadline(n int) time.Duration {
	floor := l.c.cfg.ProgressTimeout
	l.rateMu.Lock()
	rate := l.rate
	l.rateMu.Unlock()
	if rate <= 0 {
		return floor
	}
	return max(floor, time.Duration(progressFactor*float64(n)/rate*float64(time.Second)))
}

// observe folds one send of n bytes that took d into the rate estimate. Small sends say more about
// latency than bandwidth and are left out.
func (l *links) observe(n int, d time.Duration) {
	if n < 64<<10 || d <= 0 {
		return
	}
	r := float64(n) / d.Seconds()
	l.rateMu.Lock()
	if l.rate == 0 {
		l.rate = r
	} else {
		l.rate = 0.8*l.rate + 0.2*r
	}
	l.rateMu.Unlock()
}

// stream returns the rings.Stream of collective (tag, seq) on epoch. Its frames are striped over every
// connection of the pool, so one collective fills a long fat pipe: each frame goes to the connection
// expected to deliver it first (see pick), and the receiver matches frames to its receives by the
// (step, part) in their header, whichever connection of the pool they came on.
func (l *links) stream(tag, seq, epoch uint64, prev uint64, h *opHandle) (*stream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.out) == 0 {
		l.isDirty = true
		return nil, fmt.Errorf("%w: no link to the successor", ErrPeerLeft)
	}
	// The pool from prev is as long as prev's pool; past hierIndexBase it also holds sub-ring links,
	// and peers that use sub-rings have pools of the same size.
	n := len(l.in[prev])
	if n > hierIndexBase {
		n = l.c.cfg.PoolSize
	}
	return l.openStream(inboxKey{tag, seq}, epoch, l.out, prev, 0, n, h), nil
}

// openStream registers the stream of key over outs and the n incoming connections from prev that
// start at pool index base (l.mu held).
func (l *links) openStream(key inboxKey, epoch uint64, outs []*outConn, prev uint64, base, n int, h *opHandle) *stream {
	s := &stream{l: l, key: key, epoch: epoch, h: h, aborted: h.aborted, t0: time.Now()}
	s.outs = slices.Clone(outs)
	pool := l.in[prev]
	for k := base; k < base+n; k++ {
		var ic *inConn
		if k < len(pool) {
			ic = pool[k]
		}
		s.ins = append(s.ins, ic)
	}
	s.box = &inbox{s: s, base: base, n: n, posted: map[rings.ChunkID]*recvReq{}, wake: make(chan struct{})}
	l.inboxes[s.key] = s.box
	l.notify()
	return s
}

// release forgets a stream's inbox; late frames of its operation are dropped.
func (l *links) release(s *stream) {
	s.h.abort(errReleased) // readers waiting for the stream's receives drop its frames
	l.mu.Lock()
	delete(l.inboxes, s.key)
	l.mu.Unlock()
	l.tombstone(s.key.seq)
}

// stream implements rings.Stream for one collective.
type stream struct {
	l       *links
	key     inboxKey
	epoch   uint64
	outs    []*outConn // the pool to the successor
	ins     []*inConn  // the pool from the predecessor, by index; an entry may be nil (not connected)
	box     *inbox
	h       *opHandle
	aborted chan struct{} // h.aborted

	fmu    sync.Mutex
	frames map[rings.ChunkID]*outFrame // the latest frame sent as each id
	failed atomic.Pointer[error]       // the first frame's error
	watch  sync.Once                   // starts giveUpStuckWrites at the first write

	silent atomic.Int32 // 1 + the wire.LinkDir of the first link that went silent; 0: none

	// Send telemetry, kept in out under tmu while the writers run: active frames being written, since
	// busySince; out.wait is the time during which at least one frame was being written.
	tmu       sync.Mutex
	active    int
	busySince time.Time

	// Telemetry for the master's delay matrix, as offsets from t0 (the stream's start, right after the
	// master's Commence): out is kept by the writers (above), in by the receiver goroutine; both are
	// read after the collective.
	t0      time.Time
	out, in linkSpan
}

// linkSpan times one direction of a collective's link: the bytes it carried, the offsets of its first
// and last frame, and the time the collective was stalled on it.
type linkSpan struct {
	bytes, start, end, wait uint64
}

// add records a frame of n bytes that the collective waited for from t until done.
func (ls *linkSpan) add(t0, t, done time.Time, n int) {
	if ls.bytes == 0 {
		ls.start = uint64(t.Sub(t0))
	}
	ls.bytes += uint64(n)
	ls.end = uint64(done.Sub(t0))
	ls.wait += uint64(done.Sub(t))
}

// timings returns the stream's telemetry for a Done: its link to next and from prev.
func (s *stream) timings(next, prev uint64) []wire.LinkTiming {
	return []wire.LinkTiming{
		{Peer: next, Dir: wire.LinkOut, Bytes: s.out.bytes, Start: s.out.start, End: s.out.end, Wait: s.out.wait},
		{Peer: prev, Dir: wire.LinkIn, Bytes: s.in.bytes, Start: s.in.start, End: s.in.end, Wait: s.in.wait},
	}
}

type recvReq struct {
	id   rings.ChunkID
	dst  []byte
	done chan error
	from *inConn // the connection whose reader took the request; set under inbox.mu
}

// inbox is where readers hand a collective its frames: a receive posts its request under the frame's
// id, and the reader that holds the frame with that (step, part) takes it, whatever its connection.
// A connection carries its frames in the order they were sent, and a collective receives its frames
// in the order its predecessor sends them, so within one collective a reader waiting for the receive
// of its frame gets it. But collectives of other tags share the connection, and a reader that waits
// holds their frames back: a hierarchical AllReduce whose all-gather frames reach a peer still in its
// WAN phase would hold back another tag's site frames, which that WAN phase may wait for at another
// peer. So a reader that finds its frame's receive not posted within earlyWait (on a pool of several
// connections: not posted when the frame is read, then not within stripedWait) leaves the frame in a
// buffer of its own (early) and goes on; the receive takes it from there when it is posted. At most
// earlyMax bytes per collective wait so; past that the reader waits for the receive.
type inbox struct {
	s       *stream
	base, n int // the collective's connections are pool indices [base, base+n)

	mu         sync.Mutex
	posted     map[rings.ChunkID]*recvReq
	wake       chan struct{}              // closed and replaced when a request is posted
	early      map[rings.ChunkID][][]byte // frames read before their receive, in arrival order
	earlyBytes int
}

// earlyWait is how long a reader waits for the receive of its frame before reading the frame into a
// buffer of its own; earlyMax bounds the bytes so buffered per collective. A receive usually comes
// soon, and the frame then lands in place without a copy: with 8 peers on 2 cores
// (bench/allreduce), waiting 2 ms instead of 50 made the AllReduce about 5% slower. Every frame
// waits (not only the first of a collective that fell behind): buffering every frame once one had
// to be made the survivors' first 256 MiB AllReduce after a kill (bench/recovery) about 120 ms
// slower, the sender no longer held back by the receiver's window.
//
// A striped pool's frames come out of order across its connections, and a receive may lag a frame
// for much longer: its reader waits stripedWait, holding its connection's window closed, so that
// the sender's striping, which balances on how fast each connection's frames are taken, moves work
// off that connection. Waiting only earlyWait there cost bench/wan about a quarter of its TCP
// throughput at K = 16 over a 100 ms path.
const (
	stripedWait = time.Second
	earlyWait   = 50 * time.Millisecond
	earlyMax    = 256 << 20
)

// post offers req to the readers, or answers it at once with a frame that arrived before it.
func (ib *inbox) post(req *recvReq) {
	ib.mu.Lock()
	if q := ib.early[req.id]; len(q) > 0 {
		buf := q[0]
		if len(q) == 1 {
			delete(ib.early, req.id)
		} else {
			ib.early[req.id] = q[1:]
		}
		ib.earlyBytes -= len(buf)
		ib.mu.Unlock()
		var err error
		if len(buf) != len(req.dst) {
			err = fmt.Errorf("frame step %d part %d of %d bytes, expected %d bytes", req.id.Step, req.id.Part, len(buf), len(req.dst))
		} else {
			copy(req.dst, buf)
		}
		req.done <- err
		return
	}
	defer ib.mu.Unlock()
	ib.posted[req.id] = req
	close(ib.wake)
	ib.wake = make(chan struct{})
}

// withdraw takes req back if no reader has taken it, and reports whether it did. Otherwise the reader
// owns req.dst until it answers on req.done.
func (ib *inbox) withdraw(req *recvReq) bool {
	ib.mu.Lock()
	defer ib.mu.Unlock()
	if ib.posted[req.id] == req {
		delete(ib.posted, req.id)
		return true
	}
	return false
}

// take waits until the receive of id is posted and returns it, or returns nil once the collective is
// aborted.
func (ib *inbox) take(ic *inConn, id rings.ChunkID) *recvReq {
	req, _ := ib.takeWithin(ic, id, 0)
	return req
}

// takeWithin is take that also gives up after wait (0: never), reporting timeout.
func (ib *inbox) takeWithin(ic *inConn, id rings.ChunkID, wait time.Duration) (req *recvReq, timeout bool) {
	var expired <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		expired = t.C
	}
	for {
		ib.mu.Lock()
		req, wake := ib.posted[id], ib.wake
		if req != nil {
			delete(ib.posted, id)
			req.from = ic
		}
		ib.mu.Unlock()
		if req != nil {
			return req, false
		}
		select {
		case <-wake:
		case <-ib.s.aborted:
			return nil, false
		case <-expired:
			return nil, true
		}
	}
}

// deliver reads the payload of the frame with header h from ic into the buffer the collective posted
// for its (step, part). It is called by the reader goroutine of the connection.
func (ib *inbox) deliver(ic *inConn, h wire.DataHeader) error {
	if ic.index < ib.base || ic.index >= ib.base+ib.n {
		return fmt.Errorf("frame on pool connection %d, the collective uses %d from %d", ic.index, ib.n, ib.base)
	}
	id := rings.ChunkID{Step: h.Step, Part: h.Part}
	var req *recvReq
	if h.Epoch == ib.s.epoch && !ib.posting(id) {
		if ib.n > 1 {
			return ib.stage(ic, h, id, stripedWait)
		}
		var timeout bool
		if req, timeout = ib.takeWithin(ic, id, earlyWait); timeout {
			return ib.stage(ic, h, id, 0)
		}
	} else {
		req = ib.take(ic, id)
	}
	if req == nil { // the collective is over
		_, err := io.CopyN(io.Discard, ic.conn, int64(h.Len))
		return err
	}
	ic.last.Store(ib.s.l.c.unixNano(time.Now()))
	if err := ib.check(h, req); err != nil {
		return err
	}
	_, err := transport.ReadFull(ic.conn, req.dst)
	req.done <- err
	return err
}

// check fails req if the frame with header h cannot be its answer.
func (ib *inbox) check(h wire.DataHeader, req *recvReq) error {
	var err error
	switch {
	case h.Epoch != ib.s.epoch:
		err = fmt.Errorf("frame of epoch %d in an operation of epoch %d", h.Epoch, ib.s.epoch)
	case int(h.Len) != len(req.dst):
		err = fmt.Errorf("frame step %d part %d of %d bytes, expected %d bytes", h.Step, h.Part, h.Len, len(req.dst))
	}
	if err != nil {
		req.done <- err
	}
	return err
}

// posting reports whether the receive of id is posted.
func (ib *inbox) posting(id rings.ChunkID) bool {
	ib.mu.Lock()
	defer ib.mu.Unlock()
	return ib.posted[id] != nil
}

// stage reads the payload of a frame whose receive is not posted yet into a buffer of its own, so
// that the kernel's receive window stays open, and hands it to the receive once it is posted,
// waiting up to wait for it. A receive that has not come by then takes the frame from the inbox
// when it does (see inbox), and the reader goes on with the connection's other collectives; past
// earlyMax bytes waiting in the collective, the reader waits for the receive instead. While the
// reader waits, the connection's window closes as it did before frames could wait in the inbox, so
// that the sender's striping still sees a connection whose frames are not taken as a slow one.
func (ib *inbox) stage(ic *inConn, h wire.DataHeader, id rings.ChunkID, wait time.Duration) error {
	if cap(ic.stage) < int(h.Len) {
		ic.stage = make([]byte, h.Len)
	}
	buf := ic.stage[:h.Len]
	if _, err := transport.ReadFull(ic.conn, buf); err != nil {
		return err
	}
	ic.last.Store(ib.s.l.c.unixNano(time.Now()))
	var req *recvReq
	if wait > 0 {
		var timeout bool
		req, timeout = ib.takeWithin(ic, id, wait)
		if req == nil && !timeout {
			return nil // the collective is over; the frame was read whole
		}
	}
	if req == nil {
		ib.mu.Lock()
		if req = ib.posted[id]; req != nil {
			delete(ib.posted, id)
			req.from = ic
		} else if ib.earlyBytes+len(buf) <= earlyMax {
			if ib.early == nil {
				ib.early = map[rings.ChunkID][][]byte{}
			}
			ib.early[id] = append(ib.early[id], buf)
			ib.earlyBytes += len(buf)
			ic.stage = nil // the inbox owns buf now
			ib.mu.Unlock()
			return nil
		}
		ib.mu.Unlock()
	}
	if req == nil {
		if req = ib.take(ic, id); req == nil {
			return nil // the collective is over; the frame was read whole
		}
	}
	if err := ib.check(h, req); err != nil {
		return err
	}
	copy(req.dst, buf)
	req.done <- nil
	return nil
}

// pick returns the connection that frame id of n bytes goes on, and queues its bytes there at once,
// so that concurrent collectives see each other's load. With an even split it is (seq+part) mod K.
// Otherwise it is the connection expected to have written the frame first: its pending bytes plus n,
// at its measured cost per byte (a connection not measured yet is taken to cost what the measured
// ones cost on average). Before anything is measured that is the connection with the fewest bytes
// pending, ties going to the connections in turn from (seq+part) mod K. A frame id sent again (a
// later phase of a plan) takes the connection of its previous send, so that the receiver, which
// matches frames by id, gets the two in order.
func (s *stream) pick(id rings.ChunkID, n int) *outConn {
	k := len(s.outs)
	first := int((s.key.seq + uint64(id.Part)) % uint64(k))
	oc := s.outs[first]
	s.fmu.Lock()
	prev := s.frames[id]
	s.fmu.Unlock()
	if prev != nil {
		oc = prev.oc
	} else if !s.l.c.cfg.EvenStriping && k > 1 {
		oc = s.outs[s.l.quickest(s.outs, first, n)]
	}
	s.l.loadMu.Lock()
	oc.pending += float64(n)
	s.l.loadMu.Unlock()
	return oc
}

// quickest returns the index in outs of the connection expected to write n more bytes first,
// looking from first on.
func (l *links) quickest(outs []*outConn, first, n int) int {
	l.loadMu.Lock()
	defer l.loadMu.Unlock()
	var sum float64
	var measured int
	for _, oc := range outs {
		if oc.cost > 0 {
			sum += oc.cost
			measured++
		}
	}
	mean := 1.0
	if measured > 0 {
		mean = sum / float64(measured)
	}
	k := len(outs)
	best, bestETA := first, math.Inf(1)
	for j := range k {
		i := (first + j) % k
		oc := outs[i]
		c := mean
		if oc.cost > 0 {
			c = oc.cost
		}
		if eta := (oc.pending + float64(n)) * c; eta < bestETA {
			best, bestETA = i, eta
		}
	}
	return best
}

// unload takes a frame that was written or given up off the connection's pending bytes.
func (oc *outConn) unload(f *outFrame) {
	oc.l.loadMu.Lock()
	oc.pending = max(0, oc.pending-float64(len(f.payload)))
	oc.l.loadMu.Unlock()
}

// blockedWrite is how long a write must take to count as blocked, and costWeight the weight of a
// new sample in a connection's cost.
const (
	blockedWrite = time.Millisecond
	costWeight   = 0.2
)

// measure folds one write of n bytes that took d into the connection's cost. A write returns once its
// bytes fit the connection's send buffer, so only a write that blocked tells how fast the connection
// drains: it had to wait until n bytes had left. A write that did not block says only that the
// connection has room, which its pending bytes already show.
func (oc *outConn) measure(n int, d time.Duration) {
	if d < blockedWrite || n == 0 {
		return
	}
	c := d.Seconds() / float64(n)
	oc.l.loadMu.Lock()
	defer oc.l.loadMu.Unlock()
	if oc.cost == 0 {
		oc.cost = c
	} else {
		oc.cost = (1-costWeight)*oc.cost + costWeight*c
	}
}

// Send queues the frame to the connection picked for it and returns; the frame's payload is read
// until AwaitAcked(id) returns. An error of an earlier frame of the collective is returned at once.
func (s *stream) Send(id rings.ChunkID, payload []byte) error {
	if isAborted(s) {
		return s.h.cause
	}
	if err := s.failed.Load(); err != nil {
		return *err
	}
	oc := s.pick(id, len(payload))
	f := &outFrame{s: s, oc: oc, id: id, payload: payload, queued: time.Now(), done: make(chan struct{})}
	s.fmu.Lock()
	if s.frames == nil {
		s.frames = map[rings.ChunkID]*outFrame{}
	}
	s.frames[id] = f
	s.fmu.Unlock()
	if !oc.enqueue(f) {
		oc.unload(f)
		f.finish(fmt.Errorf("%w: send %v: connection closed", ErrPeerLeft, id))
		return f.err
	}
	return nil
}

// AwaitAcked waits until the latest frame sent as id is written (or given up), so that the collective
// may reuse its region: the stream reads a payload only until then. It returns the frame's error.
func (s *stream) AwaitAcked(id rings.ChunkID) error {
	s.fmu.Lock()
	f := s.frames[id]
	s.fmu.Unlock()
	if f == nil {
		return nil
	}
	<-f.done // a writer finishes every frame: written, skipped after an abort, or failed
	return f.err
}

// writing and wrote keep the stream's send telemetry over the frames its writers move concurrently:
// the bytes written, and the time during which at least one frame was being written.
func (s *stream) writing(t time.Time) {
	s.tmu.Lock()
	defer s.tmu.Unlock()
	if s.active == 0 {
		s.busySince = t
	}
	s.active++
}

func (s *stream) wrote(f *outFrame, t time.Time, ok bool) {
	s.tmu.Lock()
	defer s.tmu.Unlock()
	s.active--
	if s.active == 0 {
		s.out.wait += uint64(t.Sub(s.busySince))
	}
	if !ok {
		return
	}
	if s.out.bytes == 0 {
		s.out.start = uint64(f.queued.Sub(s.t0))
	}
	s.out.bytes += uint64(len(f.payload))
	s.out.end = uint64(t.Sub(s.t0))
}

func (s *stream) Recv(id rings.ChunkID, dst []byte) error {
	if len(s.ins) == 0 || slices.Contains(s.ins, nil) {
		return fmt.Errorf("%w: receive %v: %w", ErrPeerLeft, id, errNoPredecessor)
	}
	limit := s.l.deadline(len(dst))
	posted := time.Now()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	req := &recvReq{id: id, dst: dst, done: make(chan error, 1)}
	s.box.post(req)
	// Once a reader took req it owns dst until it answers. A frame in progress is finished even when
	// the operation is aborted (the connection is shared with other tags); only a frame that stalls
	// past the deadline costs the connection, which makes the reader answer at once.
	var err error
	select {
	case err = <-req.done:
	case <-timer.C:
		s.silent.CompareAndSwap(0, 1+int32(wire.LinkIn))
		if s.box.withdraw(req) {
			// The frame did not even start to arrive: the connections that read nothing for the
			// whole deadline are silent.
			s.breakIdle(limit)
			return fmt.Errorf("%w: receive %v: %w for %v", ErrPeerLeft, id, errSilentLink, limit)
		}
		if req.from != nil { // nil: answered at its post by a frame that came early
			s.l.broken(req.from.conn)
		}
		<-req.done
		err = fmt.Errorf("%w for %v", errSilentLink, limit)
	case <-s.aborted:
		if s.box.withdraw(req) {
			return s.h.cause
		}
		// A frame still arriving after the abort grace is coming from a peer that stopped (or a
		// link that went silent) mid-frame: give the connection up rather than wait for the deadline.
		grace := time.NewTimer(abortGrace)
		select {
		case err = <-req.done:
		case <-grace.C:
			if req.from != nil {
				s.l.broken(req.from.conn)
			}
			err = <-req.done
		}
		grace.Stop()
	}
	if err != nil {
		select {
		case <-s.aborted:
			return s.h.cause
		default:
		}
		return fmt.Errorf("%w: receive %v: %w", ErrPeerLeft, id, err)
	}
	s.in.add(s.t0, posted, time.Now(), len(dst))
	return nil
}

// breakIdle closes the connections from the predecessor that read nothing for limit, and asks for a
// re-wire in any case.
func (s *stream) breakIdle(limit time.Duration) {
	now := s.l.c.unixNano(time.Now())
	for _, ic := range s.ins {
		if now-ic.last.Load() >= int64(limit) {
			s.l.broken(ic.conn)
		}
	}
	s.l.mu.Lock()
	s.l.isDirty = true
	s.l.mu.Unlock()
}

// abortGrace is how long a frame whose operation was aborted may still take to finish crossing its
// connection. Frames are written and read whole, so a connection shared with other tags survives an
// abort; a frame still stuck after the grace is stuck on a peer that stopped or a link that went
// silent, and its connection is given up at once instead of at the progress deadline.
const abortGrace = 100 * time.Millisecond

// giveUpStuckWrites runs once per stream that writes, until the stream is aborted (release aborts
// every stream). A frame of the stream that is still being written then, and still after abortGrace,
// has its write made to fail, which gives its connection up. The deadline is set under the
// connection's wmu while that frame is current, so it never reaches another frame's write. It ends as
// soon as the communicator dies, whose connections all close, even during the grace.
func (s *stream) giveUpStuckWrites() {
	select {
	case <-s.aborted:
	case <-s.l.c.done:
		return
	}
	stuck := func() bool {
		for _, oc := range s.outs {
			oc.wmu.Lock()
			mine := oc.cur != nil && oc.cur.s == s
			oc.wmu.Unlock()
			if mine {
				return true
			}
		}
		return false
	}
	if !stuck() {
		return
	}
	grace := time.NewTimer(abortGrace)
	defer grace.Stop()
	select {
	case <-grace.C:
	case <-s.l.c.done:
		return
	}
	for _, oc := range s.outs {
		oc.wmu.Lock()
		if oc.cur != nil && oc.cur.s == s {
			oc.conn.SetWriteDeadline(time.Unix(1, 0))
		}
		oc.wmu.Unlock()
	}
}

// silentLink names the link of s that went silent past its progress deadline, if one did, given the
// ring neighbours the stream runs between: for a Done, which makes the master avoid that edge.
func (s *stream) silentLink(prev, next uint64) wire.LinkRef {
	switch s.silent.Load() {
	case 1 + int32(wire.LinkOut):
		return wire.LinkRef{Peer: next, Dir: wire.LinkOut}
	case 1 + int32(wire.LinkIn):
		return wire.LinkRef{Peer: prev, Dir: wire.LinkIn}
	}
	return wire.LinkRef{}
}

// Abort stops the stream: pending and later Sends and Receives return err. Its connections stay
// open for the other operations that share them.
func (s *stream) Abort(err error) { s.h.abort(err) }

var (
	errNoPredecessor = errors.New("no link from the predecessor")
	errSilentLink    = errors.New("link silent past its progress deadline")
	errReleased      = errors.New("operation over")
)
