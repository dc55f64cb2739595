package transport

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
)

// TestRawPathTaken checks which connections take the raw path: the net package's TCP and unix
// sockets and SocketWrappers around them, in builds without the race detector; never a connection
// of another kind.
func TestRawPathTaken(t *testing.T) {
	for _, p := range rawIOPairs(t) {
		want := p.name != "pipe" && !raceEnabled
		for _, c := range []net.Conn{p.a, &watched{Conn: p.a}} {
			sock, _, got := rawConn(c)
			if got != want || (got && sock != p.a) {
				t.Errorf("%s (%T): raw path %v on %T, want %v on %T", p.name, c, got, sock, want, p.a)
			}
		}
	}
}

// TestRawCalls runs the raw write and read on a TCP and a unix socket directly, so that builds with
// the race detector, where ReadFull and WriteBuffers do not take them, test them too: a frame larger
// than the socket's buffers and than one call arrives whole, and the end of the stream reads as
// io.EOF.
func TestRawCalls(t *testing.T) {
	for _, p := range rawIOPairs(t) {
		if p.name == "pipe" {
			continue
		}
		t.Run(p.name, func(t *testing.T) {
			ra, err := p.a.(syscall.Conn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			rb, err := p.b.(syscall.Conn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			head, body := pattern(24, 4), pattern(rawMax+1<<20+3, 5)
			bufs := net.Buffers{head, body}
			done := make(chan error, 1)
			go func() {
				n, err := rawWriteBuffers(p.a, ra, &bufs)
				if err == nil && n != int64(len(head)+len(body)) {
					err = errors.New("short write")
				}
				p.a.Close()
				done <- err
			}()
			got := make([]byte, len(head)+len(body))
			if n, err := rawReadFull(p.b, rb, got); n != len(got) || err != nil {
				t.Fatalf("raw read: %d, %v; want %d bytes", n, err, len(got))
			}
			if err := <-done; err != nil {
				t.Fatalf("raw write: %v", err)
			}
			if i := firstDiff(got, bytes.Join([][]byte{head, body}, nil)); i >= 0 {
				t.Fatalf("byte %d differs", i)
			}
			if n, err := rawReadFull(p.b, rb, got[:1]); n != 0 || err != io.EOF {
				t.Fatalf("raw read at the end: %d, %v; want io.EOF", n, err)
			}
		})
	}
}
