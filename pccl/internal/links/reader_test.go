package links

import (
	"bytes"
	"net"
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
	ic := &inConn{conn: near, from: 2}
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
	far.Close()
	<-read
}
