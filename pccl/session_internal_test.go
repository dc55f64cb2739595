package pccl

import (
	"bytes"
	"net"
	"testing"

	"github.com/concord-ccl/concord/internal/wire"
)

// recorder is a net.Conn that keeps what is written to it.
type recorder struct {
	net.Conn
	buf bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) { return r.buf.Write(b) }

// frames decodes what was written to r.
func (r *recorder) frames(t *testing.T) []wire.Message {
	t.Helper()
	var out []wire.Message
	for r.buf.Len() > 0 {
		m, _, err := wire.ReadFrame(&r.buf, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// TestCtlSession numbers frames, forgets acknowledged ones, acknowledges the master's frames on the
// next frame sent, and on a resumption sends again exactly the frames the master lacks while skipping
// the master's frames that came twice.
func TestCtlSession(t *testing.T) {
	var s ctlSession
	s.start(wire.SessionID{7})
	for i := range 5 {
		if _, err := s.frame(nil, &wire.Heartbeat{Seq: uint64(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	s.ack(2)
	if s.sent != 5 || len(s.unacked) != 3 {
		t.Fatalf("sent %d, %d unacknowledged; want 5 and 3", s.sent, len(s.unacked))
	}
	// The Welcome and three more of the master's frames arrive; the next frame carries their
	// acknowledgement first.
	for range 3 {
		if !s.received() {
			t.Fatal("a first arrival was skipped")
		}
	}
	b, _ := s.frame(nil, &wire.Heartbeat{Seq: 6})
	var r recorder
	r.buf.Write(b)
	got := r.frames(t)
	if ack, ok := got[0].(*wire.SessionAck); !ok || ack.Recv != 4 || len(got) != 2 {
		t.Fatalf("frame after 4 arrivals: %+v, want SessionAck{4} then the heartbeat", got)
	}
	// The master had 3 of our 6 frames and sends its own again from 3: frames 3 and 4 came already.
	var conn recorder
	if err := s.resume(&conn, 3, 3); err != nil {
		t.Fatal(err)
	}
	sent := conn.frames(t)
	if len(sent) != 3 {
		t.Fatalf("resumption sent %d frames, want 3 (4, 5, 6)", len(sent))
	}
	for i, m := range sent {
		if hb, ok := m.(*wire.Heartbeat); !ok || hb.Seq != uint64(i+4) {
			t.Fatalf("frame %d sent again is %+v, want Heartbeat %d", i, m, i+4)
		}
	}
	if s.received() || s.received() || !s.received() {
		t.Fatal("the two frames that came twice were not skipped, or the next one was")
	}
	if s.recv.Load() != 5 {
		t.Fatalf("received %d, want 5", s.recv.Load())
	}
	// A resumption that would lose frames is refused.
	if err := s.resume(&recorder{}, 3, 9); err == nil {
		t.Fatal("resuming with the master's frames from 9 while 5 arrived: no error")
	}
	if err := s.resume(&recorder{}, 0, 1); err == nil {
		t.Fatal("resuming from our frame 1, long forgotten: no error")
	}
}
