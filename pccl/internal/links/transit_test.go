package links

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/rings"
)

// TestTransitTimesTheLinkNotThePace: a stream's transit time (Timings, link in) counts how long its
// frames took to arrive, not how long the collective waited for them. Frames sent back to back on a
// slow link arrive slowly; frames sent with long pauses in between, as a sender paced by a slow
// upstream peer sends them, cross a fast link fast however long the receiver waits between them.
// The in-memory network runs on the bubble's fake clock, so transfers take exactly their emulated
// time.
func TestTransitTimesTheLinkNotThePace(t *testing.T) {
	const frames, size = 4, 256 << 10
	run := func(bandwidth float64, pause time.Duration) wire.LinkTiming {
		var got wire.LinkTiming
		synctest.Test(t, func(t *testing.T) {
			netw := transport.NewNetwork()
			netw.SetLink("a", "b", transport.LinkConfig{Bandwidth: bandwidth, Latency: time.Millisecond})
			ln, err := netw.Host("b").Listen("b:1")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					close(accepted)
					return
				}
				accepted <- c
			}()
			far, err := netw.Host("a").Dial(context.Background(), "b:1")
			if err != nil {
				t.Fatal(err)
			}
			defer far.Close()
			near := <-accepted
			if near == nil {
				t.Fatal("no connection accepted")
			}
			defer near.Close()

			l := New(Config{}, nil)
			const epoch = 3
			s := &Stream{l: l, key: inboxKey{5, 1}, epoch: epoch, aborted: make(chan struct{}), t0: time.Now()}
			s.box = &inbox{s: s, n: 1, posted: map[rings.ChunkID]*recvReq{}, wake: make(chan struct{})}
			l.inboxes[s.key] = s.box
			ic := &inConn{conn: near, from: 2, last: new(atomic.Int64)}
			read := make(chan struct{})
			go func() {
				l.read(ic)
				close(read)
			}()
			go func() {
				payload := make([]byte, size)
				for i := range frames {
					time.Sleep(pause)
					var hb [wire.DataHeaderSize]byte
					wire.PutDataHeader(hb[:], wire.DataHeader{Len: size, Epoch: epoch, Tag: 5, Seq: 1, Step: uint32(i)})
					if _, err := far.Write(append(hb[:], payload...)); err != nil {
						return
					}
				}
			}()
			for i := range frames {
				req := &recvReq{id: rings.ChunkID{Step: uint32(i)}, dst: make([]byte, size), done: make(chan error, 1)}
				posted := time.Now()
				s.box.post(req)
				if err := <-req.done; err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				s.in.add(s.t0, posted, time.Now(), size)
			}
			got = s.Timings(9, 2)[1]
			near.Close()
			<-read
		})
		return got
	}
	perByte := func(lt wire.LinkTiming) float64 { return float64(lt.Transit) / float64(lt.Bytes) }
	slow := run(1e6, 0)                      // a slow link: each frame takes about 0.26 s to cross
	paced := run(16e6, 500*time.Millisecond) // a fast link whose sender pauses longer than that
	if slow.Dir != wire.LinkIn || slow.Peer != 2 || slow.Bytes != frames*size || paced.Bytes != frames*size {
		t.Fatalf("timings %+v, %+v: want %d bytes in from peer 2", slow, paced, frames*size)
	}
	// The collective waited longer for the paced frames than for the slow link's...
	if paced.Wait <= slow.Wait {
		t.Fatalf("waited %v for the paced frames, %v on the slow link: the test does not pace them", time.Duration(paced.Wait), time.Duration(slow.Wait))
	}
	// ...but their transit shows the link's rate: the slow link's is about 16 times the fast one's.
	if slow.Transit == 0 || paced.Transit == 0 || perByte(slow) < 8*perByte(paced) {
		t.Fatalf("transit per byte: slow link %.3g s, fast link paced upstream %.3g s; want the slow one at least 8 times the other",
			perByte(slow), perByte(paced))
	}
	// Transit never exceeds the time the frames were being received.
	for _, lt := range []wire.LinkTiming{slow, paced} {
		if lt.Transit > lt.End-lt.Start {
			t.Fatalf("transit %v beyond the span %v", time.Duration(lt.Transit), time.Duration(lt.End-lt.Start))
		}
	}
}
