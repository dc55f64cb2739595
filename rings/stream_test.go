package rings

import (
	"errors"
	"fmt"
	"sync"
)

// This file holds an in-memory Stream for tests: rank r's stream sends on link r and receives on link
// r-1 (mod W). Frames are copied on Send, so the payload contract holds by construction.

var (
	errInjected   = errors.New("injected link failure")
	errLinkClosed = errors.New("link closed by the other end")
)

type frame struct {
	id   ChunkID
	data []byte
}

// link is one direction of a ring edge.
type link struct {
	frames chan frame
	free   chan []byte // recycled frame buffers, so long runs do not churn the heap
	closed chan struct{}
	once   sync.Once
}

func newLink() *link {
	return &link{frames: make(chan frame, 2), free: make(chan []byte, 4), closed: make(chan struct{})}
}

func (l *link) close() { l.once.Do(func() { close(l.closed) }) }

// memStream is one rank's Stream. sends is owned by the sending goroutine and recvs by the receiving
// goroutine; abortErr is written once before abort is closed.
type memStream struct {
	out, in  *link
	abort    chan struct{}
	once     sync.Once
	abortErr error

	failSendAt int // the n-th Send (from 1) fails with errInjected; 0 = never
	failRecvAt int // the n-th Recv (from 1) fails with errInjected; 0 = never
	// onRecv, if set, runs after the n-th Recv (from 1) filled dst; an error it returns is Recv's.
	onRecv func(s *memStream, n int) error

	sends, recvs int
}

// newRing returns the streams of a ring of world ranks.
func newRing(world int) []*memStream {
	links := make([]*link, world)
	for i := range links {
		links[i] = newLink()
	}
	streams := make([]*memStream, world)
	for r := range streams {
		streams[r] = &memStream{out: links[r], in: links[(r+world-1)%world], abort: make(chan struct{})}
	}
	return streams
}

func (s *memStream) aborted() error { return fmt.Errorf("stream aborted: %w", s.abortErr) }

func (s *memStream) Send(id ChunkID, payload []byte) error {
	s.sends++
	if s.sends == s.failSendAt {
		return errInjected
	}
	var buf []byte
	select {
	case buf = <-s.out.free:
	default:
	}
	if cap(buf) < len(payload) {
		buf = make([]byte, len(payload))
	}
	buf = buf[:len(payload)]
	copy(buf, payload)
	select {
	case s.out.frames <- frame{id, buf}:
		return nil
	case <-s.out.closed:
		return errLinkClosed
	case <-s.abort:
		return s.aborted()
	}
}

func (s *memStream) Recv(id ChunkID, dst []byte) error {
	s.recvs++
	if s.recvs == s.failRecvAt {
		return errInjected
	}
	var f frame
	select {
	case f = <-s.in.frames:
	case <-s.in.closed:
		return errLinkClosed
	case <-s.abort:
		return s.aborted()
	}
	if f.id != id || len(f.data) != len(dst) {
		return fmt.Errorf("got frame %v of %d bytes, want %v of %d bytes", f.id, len(f.data), id, len(dst))
	}
	copy(dst, f.data)
	select {
	case s.in.free <- f.data:
	default:
	}
	if s.onRecv != nil {
		return s.onRecv(s, s.recvs)
	}
	return nil
}

func (s *memStream) Abort(err error) {
	s.once.Do(func() {
		s.abortErr = err
		close(s.abort)
		s.out.close()
		s.in.close()
	})
}

// ballot stands in for the group's agreement on whether an operation committed: every rank votes
// once, and commit succeeds only if all voted yes.
type ballot struct {
	mu    sync.Mutex
	votes int
	world int
	ok    bool
	done  chan struct{}
}

var errVetoed = errors.New("a peer did not commit")

func newBallot(world int) *ballot { return &ballot{world: world, ok: true, done: make(chan struct{})} }

func (b *ballot) vote(ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ok = b.ok && ok
	b.votes++
	if b.votes == b.world {
		close(b.done)
	}
}

func (b *ballot) result() error {
	<-b.done
	if !b.ok {
		return errVetoed
	}
	return nil
}
