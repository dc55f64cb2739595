package links

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/rings"
)

// recvReq is one receive a collective posted: the frame id it waits for and the buffer the frame goes
// to.
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
	s       *Stream
	base, n int // the collective's connections are pool indices [base, base+n)

	mu         sync.Mutex
	posted     map[rings.ChunkID]*recvReq
	wake       chan struct{}              // closed and replaced when a request is posted
	early      map[rings.ChunkID][][]byte // frames read before their receive, in arrival order
	earlyBytes int
}

// earlyWait is how long a reader waits for the receive of its frame before reading the frame into a
// buffer of its own; earlyMax bounds the bytes so buffered per collective. A receive usually comes
// soon, and the frame then lands in place without a copy. Every frame waits, not only the first of a
// collective that fell behind, so that a receiver that falls behind still holds its sender back by
// its window (docs/results/allreduce.md and recovery.md measure the choice).
//
// A striped pool's frames come out of order across its connections, and a receive may lag a frame
// for much longer: its reader waits stripedWait, holding its connection's window closed, so that
// the sender's striping, which balances on how fast each connection's frames are taken, moves work
// off that connection (docs/results/wan.md).
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
		ib.s.l.stages.Put(buf)
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
	ic.seen(ib.s.l.cfg.WallNanos(time.Now()))
	if err := ib.check(h, req); err != nil {
		return err
	}
	err := ib.s.readPayload(ic, req.dst)
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
		ib.s.l.stages.Put(ic.stage)
		ic.stage = ib.s.l.stages.Get(int(h.Len))
	}
	buf := ic.stage[:h.Len]
	if err := ib.s.readPayload(ic, buf); err != nil {
		return err
	}
	ic.seen(ib.s.l.cfg.WallNanos(time.Now()))
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
