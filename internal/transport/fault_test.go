package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// writeFrames writes three 1000-byte frames on w and returns them, with what the third Write reported.
func writeFrames(t *testing.T, w io.Writer) (frames [][]byte, n int, err error) {
	t.Helper()
	for i := range 3 {
		frames = append(frames, randomBytes(uint64(30+i), 1000))
		n, err = w.Write(frames[i])
		if i < 2 && (n != 1000 || err != nil) {
			t.Fatalf("frame %d: Write = %d, %v", i, n, err)
		}
	}
	return frames, n, err
}

// TestFailAtReset resets a connection in the middle of its second frame.
func TestFailAtReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		n.OnWrite("a", "b", FailAt(1500, FaultReset))
		c, s := memPair(t, n, "a", "b")
		for i := range 2 {
			f := randomBytes(uint64(40+i), 1000)
			k, err := c.Write(f)
			if i == 0 {
				if err != nil {
					t.Fatalf("first frame: %v", err)
				}
				if got, err := readN(s, 1000); err != nil {
					t.Fatalf("read: %v", err)
				} else {
					equalBytes(t, got, f)
				}
				continue
			}
			if k != 500 || !errors.Is(err, ErrReset) {
				t.Fatalf("second frame: Write = %d, %v; want 500, ErrReset", k, err)
			}
		}
		// A reset discards what is in flight, the kept half frame included.
		if _, err := s.Read(make([]byte, 1)); !errors.Is(err, ErrReset) {
			t.Fatalf("peer Read: %v, want ErrReset", err)
		}
		if _, err := s.Write([]byte("x")); !errors.Is(err, ErrReset) {
			t.Fatalf("peer Write: %v, want ErrReset", err)
		}
		// The hook fires once: a new connection is fine.
		c2, s2 := memPair(t, n, "a", "b")
		crosses(t, c2, s2, "ok", "on a new connection")
	})
}

// TestFailAtClose ends a connection cleanly after a frame and a half.
func TestFailAtClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		n.SetLink("a", "b", LinkConfig{Latency: time.Millisecond})
		n.OnWrite("a", "b", FailAt(1500, FaultClose))
		c, s := memPair(t, n, "a", "b")
		frames := [][]byte{randomBytes(50, 1000), randomBytes(51, 1000)}
		if _, err := c.Write(frames[0]); err != nil {
			t.Fatalf("first frame: %v", err)
		}
		if k, err := c.Write(frames[1]); k != 500 || !errors.Is(err, ErrBrokenPipe) {
			t.Fatalf("second frame: Write = %d, %v; want 500, ErrBrokenPipe", k, err)
		}
		if _, err := c.Write([]byte("x")); !errors.Is(err, ErrBrokenPipe) {
			t.Fatalf("Write after the cut: %v, want ErrBrokenPipe", err)
		}
		got, err := io.ReadAll(s)
		if err != nil {
			t.Fatalf("ReadAll: %v", err)
		}
		equalBytes(t, got, append(append([]byte(nil), frames[0]...), frames[1][:500]...))
		// The other direction still works.
		crosses(t, s, c, "back", "b->a")
	})
}

// TestFailAtBlackHole black-holes a link in the middle of a frame.
func TestFailAtBlackHole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		n.OnWrite("a", "b", FailAt(1500, FaultBlackHole))
		c, s := memPair(t, n, "a", "b")
		frames, k, err := writeFrames(t, c)
		if k != 1000 || err != nil {
			t.Fatalf("third frame: Write = %d, %v; want 1000, nil (a black hole is silent)", k, err)
		}
		got, err := readN(s, 1500)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		equalBytes(t, got, append(bytes.Clone(frames[0]), frames[1][:500]...))
		s.SetReadDeadline(time.Now().Add(time.Second))
		if k, err := s.Read(make([]byte, 1)); k != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read past the black hole = %d, %v; want 0, os.ErrDeadlineExceeded", k, err)
		}
	})
}

// TestFailAtPartition partitions two hosts at a chosen write, and checks the Write event's counters.
func TestFailAtPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		var mu sync.Mutex
		var seen []Write
		n.OnWrite("a", "b", func(w Write) Fault {
			mu.Lock()
			seen = append(seen, w)
			mu.Unlock()
			if w.LinkWrites == 2 {
				return Fault{Kind: FaultPartition}
			}
			return Fault{}
		})
		c, s := memPair(t, n, "a", "b")
		frames, k, err := writeFrames(t, c)
		if k != 1000 || err != nil {
			t.Fatalf("third frame: Write = %d, %v; want 1000, nil", k, err)
		}
		got, err := readN(s, 2000)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		equalBytes(t, got, append(bytes.Clone(frames[0]), frames[1]...))
		s.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := s.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read across the partition: %v, want os.ErrDeadlineExceeded", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := n.Host("b").Dial(ctx, "a:1"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Dial b->a across the partition: %v, want context.DeadlineExceeded", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != 3 {
			t.Fatalf("hook saw %d writes, want 3", len(seen))
		}
		for i, w := range seen {
			want := Write{From: "a", To: "b", Size: 1000, Offset: int64(i) * 1000, LinkBytes: int64(i) * 1000, LinkWrites: int64(i)}
			if w != want {
				t.Errorf("write %d: hook saw %+v, want %+v", i, w, want)
			}
		}
	})
}

// TestWriteHookOnSessions checks that a session's own bytes are invisible to write hooks, that stream
// offsets start at the application's first byte, and that datagrams are seen and dropped by a fault.
func TestWriteHookOnSessions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		var mu sync.Mutex
		var seen []Write
		n.OnWrite("a", "b", func(w Write) Fault {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, w)
			if w.Datagram && w.Offset > 0 {
				return Fault{Kind: FaultReset}
			}
			return Fault{}
		})
		cs, ss, _ := memSessionPair(t, n, "a", "b")
		st, err := cs.OpenStream(context.Background())
		if err != nil {
			t.Fatalf("OpenStream: %v", err)
		}
		defer st.Close()
		for _, msg := range []string{"one", "three"} {
			if _, err := st.Write([]byte(msg)); err != nil {
				t.Fatalf("Write: %v", err)
			}
		}
		for _, msg := range []string{"first", "dropped"} {
			if err := cs.SendDatagram([]byte(msg)); err != nil {
				t.Fatalf("SendDatagram: %v", err)
			}
		}
		if got, err := ss.ReceiveDatagram(context.Background()); err != nil || string(got) != "first" {
			t.Fatalf("ReceiveDatagram = %q, %v; want first", got, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if got, err := ss.ReceiveDatagram(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("ReceiveDatagram = %q, %v; want the second datagram dropped", got, err)
		}
		ps, err := ss.AcceptStream(context.Background())
		if err != nil {
			t.Fatalf("AcceptStream: %v", err)
		}
		defer ps.Close()
		if got, err := readN(ps, 8); err != nil || string(got) != "onethree" {
			t.Fatalf("read %q, %v", got, err)
		}
		mu.Lock()
		defer mu.Unlock()
		want := []Write{
			{From: "a", To: "b", Size: 3, Offset: 0, LinkBytes: 0, LinkWrites: 0},
			{From: "a", To: "b", Size: 5, Offset: 3, LinkBytes: 3, LinkWrites: 1},
			{From: "a", To: "b", Size: 5, Offset: 0, LinkBytes: 8, LinkWrites: 2, Datagram: true},
			{From: "a", To: "b", Size: 7, Offset: 5, LinkBytes: 13, LinkWrites: 3, Datagram: true},
		}
		if len(seen) != len(want) {
			t.Fatalf("hook saw %d writes, want %d: %+v", len(seen), len(want), seen)
		}
		for i := range want {
			if seen[i] != want[i] {
				t.Errorf("write %d: hook saw %+v, want %+v", i, seen[i], want[i])
			}
		}
	})
}

func TestFaultKindString(t *testing.T) {
	for k, want := range map[FaultKind]string{
		FaultNone: "none", FaultClose: "close", FaultReset: "reset", FaultBlackHole: "black hole",
		FaultPartition: "partition", FaultKind(9): "FaultKind(9)",
	} {
		if got := k.String(); got != want {
			t.Errorf("FaultKind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}
