package pccl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/rings"
)

// maxPayload bounds a data frame's payload; PartBytes larger than this is refused by receivers.
const maxPayload = 64 << 20

// links owns the peer-to-peer connections of one Communicator: a pool of outgoing connections to the
// ring successor and the pools of incoming connections from predecessors, each incoming connection
// with a reader goroutine that routes frames to the collective they belong to.
//
// Every field below mu is guarded by mu. outConn.mu serialises frames written on one connection.
type links struct {
	c  *Communicator
	ln net.Listener

	mu       sync.Mutex
	next     uint64     // successor's id, 0 if none
	out      []*outConn // pool to next
	in       map[uint64][]*inConn
	inboxes  map[inboxKey]*inbox
	dead     map[uint64]bool // sequence numbers whose frames are dropped
	maxDead  uint64
	changed  chan struct{} // closed and replaced when inboxes or dead change
	isDirty  bool          // a link was closed by an abort or failed; ask for a re-wire
	isClosed bool
	wg       sync.WaitGroup
}

type inboxKey struct{ tag, seq uint64 }

type outConn struct {
	mu   sync.Mutex // held while writing one frame
	conn net.Conn
	hdr  [wire.DataHeaderSize]byte
	bufs net.Buffers
}

type inConn struct {
	conn  net.Conn
	from  uint64
	index int
}

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
	for _, oc := range l.out {
		oc.conn.Close()
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
	keep := n > 1 && l.next == next.ID && !l.isDirty && len(l.out) == l.c.cfg.PoolSize
	var stale []*outConn
	if !keep {
		stale, l.out, l.next = l.out, nil, 0
	}
	for from, pool := range l.in {
		if from != prev.ID {
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
		oc.conn.Close()
	}
	if n == 1 || keep {
		l.mu.Lock()
		l.isDirty = false
		l.mu.Unlock()
		return nil, nil
	}
	pool := make([]*outConn, 0, l.c.cfg.PoolSize)
	for k := 0; k < l.c.cfg.PoolSize; k++ {
		conn, err := l.dial(next, k)
		if err != nil {
			for _, oc := range pool {
				oc.conn.Close()
			}
			return []uint64{next.ID}, fmt.Errorf("link %d to peer %d at %s: %w", k, next.ID, next.Addr, err)
		}
		pool = append(pool, &outConn{conn: conn})
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isClosed {
		for _, oc := range pool {
			oc.conn.Close()
		}
		return nil, ErrClosed
	}
	l.out, l.next, l.isDirty = pool, next.ID, false
	return nil, nil
}

func (l *links) dial(to wire.PeerInfo, index int) (net.Conn, error) {
	cfg := l.c.cfg
	ctx, cancel := context.WithTimeout(context.Background(), cfg.DialTimeout)
	defer cancel()
	conn, err := cfg.Transport.Dial(ctx, to.Addr)
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
	kind, err := wire.Accept(conn, wire.KindData, wire.KindState, wire.KindBench)
	if err != nil {
		conn.Close()
		return
	}
	switch kind {
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
	case int(h.Index) >= 64:
		reason = fmt.Sprintf("pool index %d out of range", h.Index)
	}
	if reason != "" {
		conn.Write(wire.AppendFrame(nil, &wire.LinkAck{OK: false, Reason: reason}))
		conn.Close()
		return
	}
	ic := &inConn{conn: conn, from: h.From, index: int(h.Index)}
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
	defer ic.conn.Close()
	var hb [wire.DataHeaderSize]byte
	for {
		if _, err := io.ReadFull(ic.conn, hb[:]); err != nil {
			l.broken(ic.conn)
			return
		}
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
		if err := ib.deliver(ic.conn, ic.index, h); err != nil {
			l.broken(ic.conn)
			return
		}
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

func (l *links) broken(conn net.Conn) {
	conn.Close()
	l.mu.Lock()
	l.isDirty = true
	l.mu.Unlock()
}

// stream returns the rings.Stream of collective (tag, seq) on epoch. Its frames are striped over every
// connection of the pool, so one collective fills a long fat pipe: part p of the schedule travels on
// connection (seq+p) mod poolsize, on both ends, so concurrent collectives start on different ones.
func (l *links) stream(tag, seq, epoch uint64, prev uint64) (*stream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := &stream{l: l, key: inboxKey{tag, seq}, epoch: epoch, aborted: make(chan struct{})}
	if len(l.out) == 0 {
		l.isDirty = true
		return nil, fmt.Errorf("%w: no link to the successor", ErrPeerLeft)
	}
	s.outs = slices.Clone(l.out)
	for _, ic := range l.in[prev] {
		var conn net.Conn
		if ic != nil {
			conn = ic.conn
		}
		s.ins = append(s.ins, conn)
	}
	s.box = &inbox{s: s, reqs: make([]chan *recvReq, max(len(s.ins), 1))}
	for i := range s.box.reqs {
		s.box.reqs[i] = make(chan *recvReq)
	}
	l.inboxes[s.key] = s.box
	l.notify()
	return s, nil
}

// release forgets a stream's inbox; late frames of its operation are dropped.
func (l *links) release(s *stream) {
	l.mu.Lock()
	delete(l.inboxes, s.key)
	l.mu.Unlock()
	l.tombstone(s.key.seq)
}

// stream implements rings.Stream for one collective.
type stream struct {
	l     *links
	key   inboxKey
	epoch uint64
	outs  []*outConn // the pool to the successor
	ins   []net.Conn // the pool from the predecessor, by index; an entry may be nil (not connected)
	box   *inbox

	abortOnce sync.Once
	aborted   chan struct{}
	cause     error // written once before aborted is closed

	sentBytes uint64 // owned by the sender goroutine; read after the collective
	sentNanos uint64 // time blocked in sends
}

type recvReq struct {
	id   rings.ChunkID
	dst  []byte
	done chan error
}

// inbox is where readers hand a collective its frames: reqs[k] carries the receive requests for
// frames that travel on pool connection k.
type inbox struct {
	s    *stream
	reqs []chan *recvReq
}

// deliver reads the payload of the frame with header h from conn, the pool connection with the given
// index, into the buffer the collective posted. It is called by the reader goroutine of the connection.
func (ib *inbox) deliver(conn net.Conn, index int, h wire.DataHeader) error {
	if index >= len(ib.reqs) {
		return fmt.Errorf("frame on pool connection %d, the collective uses %d", index, len(ib.reqs))
	}
	var req *recvReq
	select {
	case req = <-ib.reqs[index]:
	case <-ib.s.aborted:
		_, err := io.CopyN(io.Discard, conn, int64(h.Len))
		return err
	}
	want := req.id
	switch {
	case h.Epoch != ib.s.epoch:
		err := fmt.Errorf("frame of epoch %d in an operation of epoch %d", h.Epoch, ib.s.epoch)
		req.done <- err
		return err
	case h.Step != want.Step || h.Part != want.Part || int(h.Len) != len(req.dst):
		err := fmt.Errorf("frame step %d part %d of %d bytes, expected %v of %d bytes", h.Step, h.Part, h.Len, want, len(req.dst))
		req.done <- err
		return err
	}
	_, err := io.ReadFull(conn, req.dst)
	req.done <- err
	return err
}

func (s *stream) Send(id rings.ChunkID, payload []byte) error {
	select {
	case <-s.aborted:
		return s.cause
	default:
	}
	oc := s.outs[(s.key.seq+uint64(id.Part))%uint64(len(s.outs))]
	oc.mu.Lock()
	defer oc.mu.Unlock()
	wire.PutDataHeader(oc.hdr[:], wire.DataHeader{Len: uint32(len(payload)), Epoch: s.epoch, Tag: s.key.tag,
		Seq: s.key.seq, Step: id.Step, Part: id.Part})
	oc.bufs = append(oc.bufs[:0], oc.hdr[:], payload)
	bufs := oc.bufs
	t0 := time.Now()
	_, err := bufs.WriteTo(oc.conn)
	s.sentNanos += uint64(time.Since(t0))
	s.sentBytes += uint64(len(payload))
	if err != nil {
		s.l.broken(oc.conn)
		select {
		case <-s.aborted:
			return s.cause
		default:
		}
		return fmt.Errorf("%w: send %v: %w", ErrPeerLeft, id, err)
	}
	return nil
}

func (s *stream) Recv(id rings.ChunkID, dst []byte) error {
	k := int((s.key.seq + uint64(id.Part)) % uint64(max(len(s.ins), 1)))
	if k >= len(s.ins) || s.ins[k] == nil {
		return fmt.Errorf("%w: receive %v: %w", ErrPeerLeft, id, errNoPredecessor)
	}
	req := &recvReq{id: id, dst: dst, done: make(chan error, 1)}
	select {
	case s.box.reqs[k] <- req:
	case <-s.aborted:
		return s.cause
	}
	// The reader owns dst until it answers; Abort closes the connection so that it answers promptly.
	if err := <-req.done; err != nil {
		select {
		case <-s.aborted:
			return s.cause
		default:
		}
		return fmt.Errorf("%w: receive %v: %w", ErrPeerLeft, id, err)
	}
	return nil
}

// Abort stops the stream. Its connections may be mid-frame, so they are closed; the ring is re-wired
// at the next UpdateTopology.
func (s *stream) Abort(err error) {
	s.abortOnce.Do(func() {
		s.cause = err
		close(s.aborted)
		for _, oc := range s.outs {
			s.l.broken(oc.conn)
		}
		for _, conn := range s.ins {
			if conn != nil {
				s.l.broken(conn)
			}
		}
	})
}

var errNoPredecessor = errors.New("no link from the predecessor")
