package transport

import (
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// conn is one end of a connection on a Network. Its two pipes are shared with the other end: c.out is
// the peer's in and the other way round.
//
// Read, Write, Close and the deadline setters may be called from any goroutine. Writes are serialised
// by writeLock, a channel rather than a mutex so that a goroutine waiting for it counts as durably
// blocked inside a testing/synctest bubble. Each pipe guards its own state.
type conn struct {
	n             *Network
	local, remote memAddr
	peer          *conn // set once by newConnPair
	in, out       *pipe

	rd, wd    deadline
	writeLock chan struct{} // holds a token while a Write is in progress
	written   int64         // guarded by writeLock; bytes passed to Write so far, for write hooks
	closed    chan struct{} // closed by Close
	closeOnce sync.Once
}

// newConnPair builds both ends of a connection from client to server carried by the directed links
// up (client -> server) and down (server -> client).
func newConnPair(n *Network, client, server memAddr, up, down *link) (c, s *conn) {
	upPipe, downPipe := newPipe(up), newPipe(down)
	c = newConn(n, client, server, downPipe, upPipe)
	s = newConn(n, server, client, upPipe, downPipe)
	c.peer, s.peer = s, c
	return c, s
}

func newConn(n *Network, local, remote memAddr, in, out *pipe) *conn {
	return &conn{
		n: n, local: local, remote: remote, in: in, out: out,
		rd:        newDeadline(),
		wd:        newDeadline(),
		writeLock: make(chan struct{}, 1),
		closed:    make(chan struct{}),
	}
}

func (c *conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "mem", Source: c.local, Addr: c.remote, Err: err}
}

func (c *conn) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// Read reads bytes that have arrived, in order. It blocks until at least one byte is due, the peer's
// close has arrived (io.EOF), the read deadline passes (os.ErrDeadlineExceeded), the connection is
// closed locally (net.ErrClosed) or reset (ErrReset).
func (c *conn) Read(b []byte) (int, error) {
	for {
		if c.isClosed() {
			return 0, c.opError("read", net.ErrClosed)
		}
		if expired(c.rd.done()) {
			return 0, c.opError("read", os.ErrDeadlineExceeded)
		}
		if len(b) == 0 {
			return 0, nil
		}
		n, due, changed, err := c.in.read(b, time.Now())
		if n > 0 {
			return n, nil
		}
		if err == io.EOF {
			return 0, io.EOF
		}
		if err != nil {
			return 0, c.opError("read", err)
		}
		fire, stop := timerAt(due)
		select {
		case <-changed:
		case <-fire:
		case <-c.rd.done():
		case <-c.closed:
		}
		stop()
	}
}

// Write copies b into the connection and returns once all of it is in flight, which it may not be
// while the in-flight limit is reached. It returns early with an error when the write deadline passes
// (os.ErrDeadlineExceeded), the connection is closed locally (net.ErrClosed), the peer has closed it
// (ErrBrokenPipe) or it is reset (ErrReset); n then counts the bytes already in flight. The caller
// may reuse b as soon as Write returns. A write hook set with Network.OnWrite sees every non-empty
// Write before any of it is in flight, and may fail it (see Fault).
func (c *conn) Write(b []byte) (int, error) {
	if err := c.lockWrite(); err != nil {
		return 0, err
	}
	defer c.unlockWrite()
	if len(b) == 0 {
		return c.writeLocked(b)
	}
	f := c.out.link.cross(c.written, len(b), false)
	c.written += int64(len(b))
	if f.Kind == FaultNone {
		return c.writeLocked(b)
	}
	keep := min(max(f.Keep, 0), len(b))
	n, err := c.writeLocked(b[:keep])
	if err != nil {
		return n, err
	}
	switch f.Kind {
	case FaultReset:
		c.reset()
		c.n.forget(c)
		c.n.forget(c.peer)
		return n, c.opError("write", ErrReset)
	case FaultClose:
		c.out.cut(time.Now())
		return n, c.opError("write", ErrBrokenPipe)
	case FaultBlackHole:
		c.out.link.blackHole()
	case FaultPartition:
		c.n.Partition(c.local.host, c.remote.host)
	}
	m, err := c.writeLocked(b[keep:])
	return n + m, err
}

// writeFraming writes bytes of the session machinery: like Write, but unseen by write hooks and not
// counted in their offsets.
func (c *conn) writeFraming(b []byte) (int, error) {
	if err := c.lockWrite(); err != nil {
		return 0, err
	}
	defer c.unlockWrite()
	return c.writeLocked(b)
}

// lockWrite waits for this end's turn to write, or fails when the write deadline passes or the
// connection is closed first.
func (c *conn) lockWrite() error {
	select {
	case c.writeLock <- struct{}{}:
		return nil
	case <-c.wd.done():
		return c.opError("write", os.ErrDeadlineExceeded)
	case <-c.closed:
		return c.opError("write", net.ErrClosed)
	}
}

func (c *conn) unlockWrite() { <-c.writeLock }

// writeLocked is Write without the hook, for the holder of writeLock.
func (c *conn) writeLocked(b []byte) (int, error) {
	total := 0
	for {
		if c.isClosed() {
			return total, c.opError("write", net.ErrClosed)
		}
		if expired(c.wd.done()) {
			return total, c.opError("write", os.ErrDeadlineExceeded)
		}
		if total == len(b) {
			return total, nil
		}
		n, changed, err := c.out.write(b[total:], time.Now())
		total += n
		if err != nil {
			return total, c.opError("write", err)
		}
		if n == 0 {
			select {
			case <-changed:
			case <-c.wd.done():
			case <-c.closed:
			}
		}
	}
}

// Close closes the connection. Data already written is still delivered, followed by io.EOF at the
// peer; data that arrived and was not read is discarded, and the peer's later writes fail with
// ErrBrokenPipe. Blocked Read and Write calls return net.ErrClosed. Close is idempotent and returns
// nil.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.out.closeWrite(time.Now())
		c.in.closeRead()
		c.rd.set(time.Time{})
		c.wd.set(time.Time{})
		c.n.forget(c)
	})
	return nil
}

// CloseWrite shuts down the sending direction only, like TCP's half-close: the peer reads the data
// already written and then io.EOF, while this end can still read. Later writes fail with net.ErrClosed.
func (c *conn) CloseWrite() error {
	if c.isClosed() {
		return c.opError("close", net.ErrClosed)
	}
	c.out.closeWrite(time.Now())
	return nil
}

// reset fails both directions of the connection at once, for both ends.
func (c *conn) reset() {
	c.in.reset()
	c.out.reset()
}

// LocalAddr returns this end's "host:port".
func (c *conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the other end's "host:port".
func (c *conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets both the read and the write deadline.
func (c *conn) SetDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opError("set deadline", net.ErrClosed)
	}
	c.rd.set(t)
	c.wd.set(t)
	return nil
}

// SetReadDeadline sets the read deadline. A time in the past makes blocked and future Reads fail at
// once; the zero time removes the deadline.
func (c *conn) SetReadDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opError("set deadline", net.ErrClosed)
	}
	c.rd.set(t)
	return nil
}

// SetWriteDeadline sets the write deadline. A time in the past makes blocked and future Writes fail
// at once; the zero time removes the deadline.
func (c *conn) SetWriteDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opError("set deadline", net.ErrClosed)
	}
	c.wd.set(t)
	return nil
}

func expired(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// segment is a piece of written data and the moment it reaches the reader.
type segment struct {
	data []byte
	at   time.Time
}

// pipe is one direction of a connection: a bounded queue of timed segments from the writing end to
// the reading end. All fields but link are guarded by mu.
type pipe struct {
	link *link

	mu       sync.Mutex
	segs     []segment // in order of delivery time
	inFlight int       // bytes written and not yet read, lost ones included
	lastAt   time.Time // delivery time of the latest segment; later ones never arrive earlier
	stalled  bool      // a segment was black-holed: nothing after it is ever delivered
	finSent  bool      // the writer closed; the reader sees io.EOF from finAt on
	finAt    time.Time
	readGone bool          // the reader closed; writes fail with ErrBrokenPipe
	broken   bool          // a FaultClose cut the pipe: writes fail with ErrBrokenPipe
	err      error         // ErrReset once the connection is reset
	changed  chan struct{} // closed and replaced on every change that may unblock a waiter
}

func newPipe(l *link) *pipe {
	return &pipe{link: l, changed: make(chan struct{})}
}

// signalLocked wakes every goroutine waiting on the pipe.
func (p *pipe) signalLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// read copies segments due at now into b. With nothing to copy it returns io.EOF once the writer's
// close is due, or the pipe's error, or else a channel that signals a change and, when data or the
// close is on its way, the moment it becomes due.
func (p *pipe) read(b []byte, now time.Time) (n int, due time.Time, changed <-chan struct{}, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return 0, time.Time{}, nil, p.err
	}
	for n < len(b) && len(p.segs) > 0 && !p.segs[0].at.After(now) {
		s := &p.segs[0]
		k := copy(b[n:], s.data)
		n += k
		s.data = s.data[k:]
		if len(s.data) == 0 {
			p.segs[0] = segment{}
			p.segs = p.segs[1:]
		}
	}
	if n > 0 {
		p.inFlight -= n
		p.link.delivered.Add(int64(n))
		p.signalLocked()
		return n, time.Time{}, nil, nil
	}
	if len(p.segs) > 0 {
		return 0, p.segs[0].at, p.changed, nil
	}
	if p.finSent && !p.stalled {
		if !p.finAt.After(now) {
			return 0, time.Time{}, nil, io.EOF
		}
		return 0, p.finAt, p.changed, nil
	}
	return 0, time.Time{}, p.changed, nil
}

// write puts up to one segment of b in flight at now. It returns how many bytes it took; with none
// taken and no error, changed signals when to try again.
func (p *pipe) write(b []byte, now time.Time) (n int, changed <-chan struct{}, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.err != nil:
		return 0, nil, p.err
	case p.readGone, p.broken:
		return 0, nil, ErrBrokenPipe
	case p.finSent:
		return 0, nil, net.ErrClosed
	}
	n = min(len(b), inFlightLimit-p.inFlight, segmentSize)
	if n <= 0 {
		return 0, p.changed, nil
	}
	p.inFlight += n
	if p.stalled {
		return n, nil, nil
	}
	at, dropped := p.link.schedule(n, now, false)
	if dropped {
		p.stalled = true
		return n, nil, nil
	}
	if at.Before(p.lastAt) {
		at = p.lastAt
	}
	p.lastAt = at
	p.segs = append(p.segs, segment{data: append([]byte(nil), b[:n]...), at: at})
	p.signalLocked()
	return n, nil, nil
}

// closeWrite queues the writer's close behind the data already in flight.
func (p *pipe) closeWrite(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finSent || p.err != nil {
		return
	}
	p.finSent = true
	if p.readGone || p.stalled {
		p.signalLocked()
		return
	}
	at, dropped := p.link.schedule(0, now, false)
	if dropped {
		p.stalled = true
	} else if at.Before(p.lastAt) {
		at = p.lastAt
	}
	p.finAt = at
	p.signalLocked()
}

// cut ends the pipe as a FaultClose does: the reader gets what was written so far, then io.EOF, and
// later writes fail with ErrBrokenPipe.
func (p *pipe) cut(now time.Time) {
	p.mu.Lock()
	p.broken = true
	p.mu.Unlock()
	p.closeWrite(now)
}

// closeRead records that the reader has gone and discards what it did not read.
func (p *pipe) closeRead() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.readGone = true
	p.segs = nil
	p.inFlight = 0
	p.signalLocked()
}

// reset fails the pipe for both of its ends and discards its data.
func (p *pipe) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return
	}
	p.err = ErrReset
	p.segs = nil
	p.signalLocked()
}

// deadline turns a point in time into a channel that is closed once the time has passed. Safe for
// concurrent use.
type deadline struct {
	mu      sync.Mutex
	gen     uint64        // guarded by mu; counts set calls, so a stale timer can tell it is stale
	timer   *time.Timer   // guarded by mu
	expired chan struct{} // guarded by mu
}

func newDeadline() deadline {
	return deadline{expired: make(chan struct{})}
}

// set moves the deadline to t; the zero time removes it.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gen++
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	if expired(d.expired) {
		d.expired = make(chan struct{})
	}
	if t.IsZero() {
		return
	}
	wait := time.Until(t)
	if wait <= 0 {
		close(d.expired)
		return
	}
	gen, ch := d.gen, d.expired
	d.timer = time.AfterFunc(wait, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.gen == gen {
			close(ch)
		}
	})
}

// done returns a channel that is closed once the current deadline has passed.
func (d *deadline) done() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.expired
}

// timerAt returns a channel that receives at due (nil, which never receives, for a zero due) and the
// function that releases its timer: the wait of a reader whose data is due later.
func timerAt(due time.Time) (<-chan time.Time, func()) {
	if due.IsZero() {
		return nil, func() {}
	}
	t := time.NewTimer(time.Until(due))
	return t.C, func() { t.Stop() }
}
