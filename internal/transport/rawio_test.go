package transport

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// connPair is two connected ends of one kind of connection.
type connPair struct {
	name string
	a, b net.Conn
}

// rawIOPairs returns a connected pair of every kind ReadFull and WriteBuffers treat differently:
// loopback TCP, a unix socket (on Linux, where the local path exists) and net.Pipe.
func rawIOPairs(t *testing.T) []connPair {
	t.Helper()
	var pairs []connPair
	dial := func(name string, tr Transport) {
		ln, err := tr.Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			c, _ := ln.Accept()
			accepted <- c
		}()
		a, err := tr.Dial(t.Context(), ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		b := <-accepted
		if b == nil {
			t.Fatal("accept failed")
		}
		t.Cleanup(func() { a.Close(); b.Close() })
		pairs = append(pairs, connPair{name, a, b})
	}
	dial("tcp", NewTCP(TCPConfig{DisableLocal: true}))
	if localSupported {
		dial("unix", NewTCP(TCPConfig{}))
		if _, ok := pairs[len(pairs)-1].a.(*net.UnixConn); !ok {
			t.Fatalf("the local path gave a %T, want *net.UnixConn", pairs[len(pairs)-1].a)
		}
	}
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return append(pairs, connPair{"pipe", a, b})
}

// pattern returns n bytes that differ from their neighbours and from a shifted copy.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+i>>11) ^ seed
	}
	return b
}

// TestReadFullWriteBuffers moves a frame larger than a socket's buffers and than one raw call
// (rawMax) as three buffers, and reads it back in pieces of several sizes: every byte arrives in
// order, the counts add up and the buffers are consumed.
func TestReadFullWriteBuffers(t *testing.T) {
	for _, p := range rawIOPairs(t) {
		t.Run(p.name, func(t *testing.T) {
			head, body, tail := pattern(24, 1), pattern(rawMax+3<<20+5, 2), pattern(7, 3)
			want := bytes.Join([][]byte{head, body, tail}, nil)
			bufs := net.Buffers{head, nil, body, tail}
			type result struct {
				n   int64
				err error
			}
			done := make(chan result, 1)
			go func() {
				n, err := WriteBuffers(p.a, &bufs)
				done <- result{n, err}
			}()
			got := make([]byte, len(want))
			off := 0
			for _, k := range []int{1, 23, 1 << 20, rawMax + 1, len(want)} {
				k = min(k, len(want)-off)
				n, err := ReadFull(p.b, got[off:off+k])
				if err != nil || n != k {
					t.Fatalf("ReadFull of %d bytes at %d: %d, %v", k, off, n, err)
				}
				off += k
			}
			r := <-done
			if r.err != nil || r.n != int64(len(want)) {
				t.Fatalf("WriteBuffers: %d, %v; want %d bytes", r.n, r.err, len(want))
			}
			if len(bufs) != 0 {
				t.Errorf("WriteBuffers left %d buffers", len(bufs))
			}
			if i := firstDiff(got, want); i >= 0 {
				t.Fatalf("byte %d is %d, want %d", i, got[i], want[i])
			}
		})
	}
}

// firstDiff returns the first index where a and b differ, or -1.
func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestReadFullEnds checks the ends of a stream: what arrived before the peer closed is read whole,
// a read that gets nothing more fails with io.EOF, and one cut short with io.ErrUnexpectedEOF.
func TestReadFullEnds(t *testing.T) {
	for _, p := range rawIOPairs(t) {
		t.Run(p.name, func(t *testing.T) {
			go func() {
				bufs := net.Buffers{[]byte("0123456789")}
				WriteBuffers(p.a, &bufs)
				p.a.Close()
			}()
			b := make([]byte, 4)
			if n, err := ReadFull(p.b, b); n != 4 || err != nil || string(b) != "0123" {
				t.Fatalf("first read: %d %q, %v", n, b[:n], err)
			}
			b = make([]byte, 10)
			if n, err := ReadFull(p.b, b); n != 6 || !errors.Is(err, io.ErrUnexpectedEOF) || string(b[:n]) != "456789" {
				t.Fatalf("read past the end: %d %q, %v; want 6 bytes and io.ErrUnexpectedEOF", n, b[:n], err)
			}
			if n, err := ReadFull(p.b, b); n != 0 || err != io.EOF {
				t.Fatalf("read at the end: %d, %v; want io.EOF", n, err)
			}
		})
	}
}

// TestRawIOFailures checks the errors callers branch on: an expired read or write deadline, a
// Close from another goroutine during a read, and a write to a peer that has closed.
func TestRawIOFailures(t *testing.T) {
	for _, p := range rawIOPairs(t) {
		t.Run(p.name, func(t *testing.T) {
			p.b.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			if _, err := ReadFull(p.b, make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read past its deadline: %v, want os.ErrDeadlineExceeded", err)
			}
			p.b.SetReadDeadline(time.Time{})

			// Nobody reads p.b: the write fills the socket's buffers and then waits.
			p.a.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
			big := net.Buffers{make([]byte, 64<<20)}
			if n, err := WriteBuffers(p.a, &big); !errors.Is(err, os.ErrDeadlineExceeded) || n >= 64<<20 {
				t.Fatalf("write past its deadline: %d bytes, %v; want fewer than all and os.ErrDeadlineExceeded", n, err)
			}

			done := make(chan error, 1)
			go func() {
				_, err := ReadFull(p.a, make([]byte, 8))
				done <- err
			}()
			time.Sleep(10 * time.Millisecond) // let the read start waiting (it fails the same way if not)
			p.a.Close()
			closed := net.ErrClosed
			if p.name == "pipe" {
				closed = io.ErrClosedPipe // net.Pipe's own error for a closed end
			}
			if err := <-done; !errors.Is(err, closed) {
				t.Fatalf("read on a connection closed meanwhile: %v, want %v", err, closed)
			}

			// p.a is closed: writes on p.b fail once the close is seen.
			var err error
			for range 100 {
				bufs := net.Buffers{make([]byte, 1<<20)}
				if _, err = WriteBuffers(p.b, &bufs); err != nil {
					break
				}
			}
			switch {
			case p.name == "pipe":
				if !errors.Is(err, io.ErrClosedPipe) {
					t.Fatalf("write to a closed pipe: %v, want io.ErrClosedPipe", err)
				}
			case !errors.Is(err, ErrBrokenPipe) && !errors.Is(err, ErrReset):
				t.Fatalf("write to a closed peer: %v, want ErrBrokenPipe or ErrReset", err)
			}
		})
	}
}

// watched wraps a socket as a benchmark's watcher does: it sees the errors of its own reads and,
// as a SocketWrapper, those of the bulk I/O done on the socket beneath it.
type watched struct {
	net.Conn
	errs []error
}

func (w *watched) Socket() net.Conn      { return w.Conn }
func (w *watched) SocketError(err error) { w.errs = append(w.errs, err) }

func (w *watched) Read(p []byte) (int, error) {
	n, err := w.Conn.Read(p)
	if err != nil {
		w.SocketError(err)
	}
	return n, err
}

// TestSocketWrapper checks that a SocketWrapper's bytes arrive as its socket's and that its
// SocketError is told how the stream ended, whichever path the I/O took.
func TestSocketWrapper(t *testing.T) {
	for _, p := range rawIOPairs(t) {
		if p.name == "pipe" {
			continue
		}
		t.Run(p.name, func(t *testing.T) {
			a, b := &watched{Conn: p.a}, &watched{Conn: p.b}
			frame := pattern(3<<20+1, 6)
			go func() {
				bufs := net.Buffers{frame}
				WriteBuffers(a, &bufs)
				a.Close()
			}()
			got := make([]byte, len(frame))
			if n, err := ReadFull(b, got); n != len(got) || err != nil {
				t.Fatalf("read through the wrapper: %d, %v", n, err)
			}
			if i := firstDiff(got, frame); i >= 0 {
				t.Fatalf("byte %d differs", i)
			}
			if _, err := ReadFull(b, got[:1]); err != io.EOF {
				t.Fatalf("read at the end: %v, want io.EOF", err)
			}
			if len(b.errs) != 1 || b.errs[0] != io.EOF {
				t.Fatalf("the wrapper was told %v, want [EOF]", b.errs)
			}
		})
	}
}
