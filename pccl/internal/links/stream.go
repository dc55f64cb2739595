package links

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/rings"
)

// Stream is the rings.Stream (and rings.Retainer) of one collective on one ring: it sends on the pool
// to the successor and receives from the pool from the predecessor. Send, Recv and AwaitAcked are
// called by the collective's goroutines; the telemetry (Sent, Timings, SilentLink) is read after the
// collective.
type Stream struct {
	l       *Links
	key     inboxKey
	epoch   uint64
	outs    []*outConn // the pool to the successor
	ins     []*inConn  // the pool from the predecessor, by index; an entry may be nil (not connected)
	box     *inbox
	h       *Handle
	aborted <-chan struct{} // h.Done()

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
	// transit is the nanoseconds the frames from the predecessor spent arriving, summed per frame
	// from the read of its first payload byte to the read of its last; kept by the readers of the
	// pool's connections.
	transit atomic.Uint64
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

// Sent returns the bytes the stream wrote and the nanoseconds during which at least one of its frames
// was being written. Read it after the collective.
func (s *Stream) Sent() (bytes, busy uint64) { return s.out.bytes, s.out.wait }

// Start returns the time the stream opened, which Timings' offsets count from.
func (s *Stream) Start() time.Time { return s.t0 }

// Timings returns the stream's telemetry for a Done: its link to next and from prev. Read it after
// the collective.
func (s *Stream) Timings(next, prev uint64) []wire.LinkTiming {
	return []wire.LinkTiming{
		{Peer: next, Dir: wire.LinkOut, Bytes: s.out.bytes, Start: s.out.start, End: s.out.end, Wait: s.out.wait},
		{Peer: prev, Dir: wire.LinkIn, Bytes: s.in.bytes, Start: s.in.start, End: s.in.end, Wait: s.in.wait,
			Transit: s.transit.Load()},
	}
}

// readPayload reads a frame's payload from ic into dst and adds the time its bytes took to arrive
// to the stream's transit time. It is called by the reader goroutine of the connection.
func (s *Stream) readPayload(ic *inConn, dst []byte) error {
	t := time.Now()
	_, err := transport.ReadFull(ic.conn, dst)
	if err == nil {
		s.transit.Add(uint64(time.Since(t)))
	}
	return err
}

// Send queues the frame to the connection picked for it and returns; the frame's payload is read
// until AwaitAcked(id) returns. An error of an earlier frame of the collective is returned at once.
func (s *Stream) Send(id rings.ChunkID, payload []byte) error {
	if isAborted(s) {
		return s.h.Err()
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
func (s *Stream) AwaitAcked(id rings.ChunkID) error {
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
func (s *Stream) writing(t time.Time) {
	s.tmu.Lock()
	defer s.tmu.Unlock()
	if s.active == 0 {
		s.busySince = t
	}
	s.active++
}

func (s *Stream) wrote(f *outFrame, t time.Time, ok bool) {
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

// Recv waits for the frame id from the predecessor and reads it into dst. A frame that does not start
// to arrive within its progress deadline fails the receive with ErrPeerLeft and gives up the
// connections that stayed silent.
func (s *Stream) Recv(id rings.ChunkID, dst []byte) error {
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
			return s.h.Err()
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
		if isAborted(s) {
			return s.h.Err()
		}
		return fmt.Errorf("%w: receive %v: %w", ErrPeerLeft, id, err)
	}
	s.in.add(s.t0, posted, time.Now(), len(dst))
	return nil
}

// breakIdle closes the connections from the predecessor that read nothing for limit, and asks for a
// re-wire in any case.
func (s *Stream) breakIdle(limit time.Duration) {
	now := s.l.cfg.WallNanos(time.Now())
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

// giveUpStuckWrites runs once per stream that writes, until the stream is aborted (Release aborts
// every stream). A frame of the stream that is still being written then, and still after abortGrace,
// has its write made to fail, which gives its connection up. The deadline is set under the
// connection's wmu while that frame is current, so it never reaches another frame's write. It ends as
// soon as the owner dies or the links close, whose connections all close, even during the grace.
func (s *Stream) giveUpStuckWrites() {
	select {
	case <-s.aborted:
	case <-s.l.cfg.Dying:
		return
	case <-s.l.closing:
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
	case <-s.l.cfg.Dying:
		return
	case <-s.l.closing:
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

// SilentLink names the link of s that went silent past its progress deadline, if one did, given the
// ring neighbours the stream runs between: for a Done, which makes the master avoid that edge.
func (s *Stream) SilentLink(prev, next uint64) wire.LinkRef {
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
func (s *Stream) Abort(err error) { s.h.Abort(err) }
