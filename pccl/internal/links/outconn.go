package links

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/rings"
)

// outConn is one connection of a pool to a successor. Sends queue their frames to it and return;
// its writer goroutine writes them whole, in order, so that one collective keeps every connection of
// the pool busy at once, and a slow connection holds up only the frames given to it.
type outConn struct {
	conn net.Conn
	l    *Links

	qmu    sync.Mutex
	queue  []*outFrame
	wake   chan struct{} // holds a token when the queue may have grown
	closed bool          // no frame is taken any more; set by close or a failed write
	quit   chan struct{} // closed by close

	wmu sync.Mutex
	cur *outFrame // the frame being written, nil between frames; the write deadline is set under wmu

	// The load model, guarded by Links.loadMu: pending is the bytes queued to the connection and not
	// yet written; cost is the smoothed seconds per byte of the writes that blocked (0 until one did).
	pending float64
	cost    float64
}

// outFrame is one frame queued to an outConn: the payload stays the caller's, read until done.
type outFrame struct {
	s       *Stream
	oc      *outConn // the connection it went to
	id      rings.ChunkID
	payload []byte
	queued  time.Time
	done    chan struct{} // closed once the frame is written or given up
	err     error         // set before done is closed
}

// newOutConn starts the writer of conn, which runs until close.
func (l *Links) newOutConn(conn net.Conn) *outConn {
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
			f.finish(s.h.Err())
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
				err = s.h.Err()
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

func isAborted(s *Stream) bool {
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
