package links

import (
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/rings"
)

// Links owns the peer-to-peer connections of one peer: a pool of outgoing connections to the ring
// successor and the pools of incoming connections from predecessors, each incoming connection with a
// reader goroutine that routes frames to the collective they belong to.
//
// Every field below mu is guarded by mu. Each outConn has a writer goroutine that writes the frames
// queued to it in order; loadMu guards the load model of every outConn; rateMu the send rate of the
// progress deadlines. The methods may be called from any goroutine.
type Links struct {
	cfg Config
	ln  net.Listener

	// stages recycles the buffers that frames read before their receive was posted wait in (inbox):
	// on a striped pool most frames arrive so, and a buffer per frame left to the garbage collector
	// would be allocated and faulted in again for the next.
	stages rings.BufferPool

	opened   atomic.Uint64 // data connections dialled to successors
	accepted atomic.Uint64 // data connections admitted from predecessors

	rateMu sync.Mutex
	rate   float64 // smoothed bytes per second of recent sends, 0 until measured

	loadMu sync.Mutex

	mu       sync.Mutex
	next     uint64     // successor's id, 0 if none
	out      []*outConn // pool to next
	in       map[uint64][]*inConn
	spare    map[uint64][]*inConn // connections a later hello displaced from their pool slot, still read (reader.go)
	inboxes  map[inboxKey]*inbox
	dead     map[uint64]bool // sequence numbers whose frames are dropped
	maxDead  uint64
	changed  chan struct{} // closed and replaced when inboxes or dead change
	isDirty  bool          // a link failed; ask for a re-wire
	outBroke bool          // a connection of the pool to next failed: re-dial it
	isClosed bool
	closing  chan struct{} // closed by Close
	hier     hierLinks     // sub-ring pools of the hierarchical AllReduce
	wg       sync.WaitGroup
}

type inboxKey struct{ tag, seq uint64 }

// New returns the links of a peer that accepts them on ln, which they own from now on. It starts
// nothing: Start starts the acceptor.
func New(cfg Config, ln net.Listener) *Links {
	return &Links{cfg: cfg.withDefaults(), ln: ln, in: map[uint64][]*inConn{}, spare: map[uint64][]*inConn{},
		inboxes: map[inboxKey]*inbox{}, dead: map[uint64]bool{}, changed: make(chan struct{}), closing: make(chan struct{})}
}

// Start starts the acceptor, which admits links from predecessors and hands other kinds of
// connection to Config.Serve until Close.
func (l *Links) Start() {
	l.wg.Add(1)
	go l.accept()
}

// Opened returns the number of data connections dialled to successors, ever.
func (l *Links) Opened() uint64 { return l.opened.Load() }

// Accepted returns the number of data connections admitted from predecessors, ever.
func (l *Links) Accepted() uint64 { return l.accepted.Load() }

// Dirty reports whether a link failed since the last Wire: the next membership round should wire the
// ring again.
func (l *Links) Dirty() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.isDirty
}

func (l *Links) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Close shuts the listener and every link and waits for every goroutine of the links. Streams in use
// fail; Close may be called more than once.
func (l *Links) Close() {
	l.mu.Lock()
	if !l.isClosed {
		l.isClosed = true
		close(l.closing)
		l.ln.Close()
		l.hier.closeAll()
		for _, oc := range l.out {
			oc.close()
		}
		for from := range l.in {
			l.dropPool(from)
		}
		for from := range l.spare {
			l.dropPool(from)
		}
		l.notify()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// Wire opens the links of the ring in m: PoolSize connections to the successor (kept if they already
// lead there and are healthy), and drops incoming pools from peers that are no longer the predecessor.
// On failure it returns the peers it could not reach. The owner calls it from one goroutine at a time.
func (l *Links) Wire(m *wire.Connect) ([]uint64, error) {
	if failed, err := l.wireHier(m); err != nil {
		return failed, err
	}
	me := l.cfg.Self
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
	keep := n > 1 && l.next == next.ID && !l.outBroke && len(l.out) == l.cfg.PoolSize
	var stale []*outConn
	if !keep {
		stale, l.out, l.next = l.out, nil, 0
	}
	for _, from := range l.predecessors() {
		if from != prev.ID && !l.hier.expects(from) {
			l.dropPool(from)
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
	conns, k, err := l.dialPool(next, 0, l.cfg.PoolSize)
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

// Retire drops incoming pools from peers that left ring.
func (l *Links) Retire(ring []uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, from := range l.predecessors() {
		if !slices.Contains(ring, from) {
			l.dropPool(from)
		}
	}
}

// Tombstone marks seq so that its frames are read and dropped: nobody here runs that operation.
func (l *Links) Tombstone(seq uint64) {
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

// broken closes a failed connection and remembers to ask for a re-wire.
func (l *Links) broken(conn net.Conn) {
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

// Stream returns the rings.Stream of collective op on the flat ring, from predecessor prev. Its frames
// are striped over every connection of the pool, so one collective fills a long fat pipe: each frame
// goes to the connection expected to deliver it first (see pick), and the receiver matches frames to
// its receives by the (step, part) in their header, whichever connection of the pool they came on.
// The caller releases the stream when the collective is over.
func (l *Links) Stream(op Op, prev uint64) (*Stream, error) {
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
		n = l.cfg.PoolSize
	}
	return l.openStream(op, l.out, prev, 0, n), nil
}

// openStream registers the stream of op over outs and the n incoming connections from prev that
// start at pool index base (l.mu held).
func (l *Links) openStream(op Op, outs []*outConn, prev uint64, base, n int) *Stream {
	s := &Stream{l: l, key: inboxKey{op.Tag, op.Seq}, epoch: op.Epoch, h: op.Handle, aborted: op.Handle.Done(), t0: time.Now()}
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

// Release forgets a stream's inbox once its collective is over; late frames of its operation are
// dropped.
func (l *Links) Release(s *Stream) {
	s.h.Abort(errReleased) // readers waiting for the stream's receives drop its frames
	l.mu.Lock()
	delete(l.inboxes, s.key)
	l.mu.Unlock()
	l.Tombstone(s.key.seq)
}
