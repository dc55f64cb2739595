package links

import (
	"bytes"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/rings"
)

// TestReaderDoesNotHoldOtherTagsBack: two collectives share one connection, and the frame of the one
// whose receive is not posted comes first. The reader must hand the second collective its frame
// anyway (a reader waiting for the first receive would hold it back; with collectives that wait on
// each other elsewhere, as two hierarchical AllReduces can, nothing moves until a progress deadline),
// and the first collective's receive, posted later, gets its frame from the buffer it was read into.
// A frame of the same id that comes twice before its receives (a later phase sending it again) is
// handed over in arrival order.
func TestReaderDoesNotHoldOtherTagsBack(t *testing.T) {
	l := New(Config{}, nil)
	const epoch = 7
	box := func(tag uint64) *inbox {
		s := &Stream{l: l, key: inboxKey{tag, 1}, epoch: epoch, aborted: make(chan struct{})}
		s.box = &inbox{s: s, n: 1, posted: map[rings.ChunkID]*recvReq{}, wake: make(chan struct{})}
		l.inboxes[s.key] = s.box
		return s.box
	}
	a, b := box(10), box(11)

	near, far := net.Pipe()
	defer near.Close()
	defer far.Close()
	ic := &inConn{conn: near, from: 2, last: new(atomic.Int64)}
	read := make(chan struct{})
	go func() {
		l.read(ic)
		close(read)
	}()
	payloads := map[uint64][][]byte{10: {[]byte("first of tag 10"), []byte("again, tag 10!!")}, 11: {[]byte("tag 11")}}
	go func() {
		for _, f := range []struct {
			tag uint64
			i   int
		}{{10, 0}, {10, 1}, {11, 0}} {
			p := payloads[f.tag][f.i]
			var hb [wire.DataHeaderSize]byte
			wire.PutDataHeader(hb[:], wire.DataHeader{Len: uint32(len(p)), Epoch: epoch, Tag: f.tag, Seq: 1, Step: 3, Part: 0})
			if _, err := far.Write(append(hb[:], p...)); err != nil {
				return
			}
		}
	}()

	recv := func(ib *inbox, n int) (*recvReq, []byte) {
		req := &recvReq{id: rings.ChunkID{Step: 3, Part: 0}, dst: make([]byte, n), done: make(chan error, 1)}
		ib.post(req)
		return req, req.dst
	}
	wait := func(what string, req *recvReq) {
		t.Helper()
		select {
		case err := <-req.done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(10 * time.Second): // a hang detector, not a timing assertion
			t.Fatalf("%s: no frame: the reader holds it back behind another collective's", what)
		}
	}
	rb, got := recv(b, len(payloads[11][0]))
	wait("tag 11", rb)
	if !bytes.Equal(got, payloads[11][0]) {
		t.Fatalf("tag 11: got %q", got)
	}
	for i, p := range payloads[10] {
		ra, got := recv(a, len(p))
		wait("tag 10", ra)
		if !bytes.Equal(got, p) {
			t.Fatalf("tag 10, frame %d: got %q, want %q", i, got, p)
		}
	}
	a.mu.Lock()
	left := a.earlyBytes
	a.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d bytes still buffered after every receive", left)
	}
	// Tag 10's frames waited in buffers of their own; taken, those went back to be reused.
	if l.stages.Idle() == 0 {
		t.Fatal("the buffers of the frames that waited for their receive were not recycled")
	}
	far.Close()
	<-read
}

// TestReplayedHelloKeepsLiveLink: a second hello for a pool slot (a replay by someone holding the run
// token, or the predecessor dialling again) must not close the connection in the slot: it becomes a
// spare that is still read and takes the slot back when the newcomer's reader ends. The slot's
// activity clock is shared; beyond maxSpare the spare heard from least recently is closed.
func TestReplayedHelloKeepsLiveLink(t *testing.T) {
	l := New(Config{}, nil)
	conn := func() (*inConn, net.Conn) {
		near, far := net.Pipe()
		t.Cleanup(func() { near.Close(); far.Close() })
		return &inConn{conn: near, from: 7, index: 0, last: new(atomic.Int64)}, far
	}
	live, liveFar := conn()
	l.mu.Lock()
	l.place(live)
	live.seen(100)
	replay, _ := conn()
	l.place(replay)
	l.mu.Unlock()
	if l.in[7][0] != replay || len(l.spare[7]) != 1 || l.spare[7][0] != live {
		t.Fatalf("slot %p, spares %v: want the replay in the slot and the live connection spare", l.in[7][0], l.spare[7])
	}
	if replay.last != live.last || replay.last.Load() != 100 {
		t.Fatalf("the slot's activity clock is not shared: %d", replay.last.Load())
	}
	// The live connection is still open.
	go liveFar.Write([]byte{1})
	var b [1]byte
	if _, err := live.conn.Read(b[:]); err != nil {
		t.Fatalf("the live connection was closed by the replay: %v", err)
	}
	// The replay's reader ends: the live connection takes the slot back.
	l.forget(replay)
	if l.in[7][0] != live || len(l.spare[7]) != 0 {
		t.Fatalf("after the replay ended: slot %p, spares %v; want the live connection back alone", l.in[7][0], l.spare[7])
	}
	// maxSpare+1 more hellos: the spare heard from least recently is closed, the live one (heard at
	// 100, the others never) is kept.
	var extra []*inConn
	for range maxSpare + 1 {
		c, _ := conn()
		extra = append(extra, c)
		l.mu.Lock()
		l.place(c)
		l.mu.Unlock()
	}
	if len(l.spare[7]) != maxSpare {
		t.Fatalf("%d spares, want %d", len(l.spare[7]), maxSpare)
	}
	for _, sp := range l.spare[7] {
		if sp == live {
			return
		}
	}
	t.Fatal("the live connection, the one heard from last, was evicted from the spares")
}
