package transport

import (
	"io"
	"net"
)

// Bulk socket I/O without the scheduler's system-call hand-off.
//
// A read or write of a few MiB on a socket spends a millisecond or more copying inside the kernel.
// Through the net package such a call enters the Go scheduler's system-call state; once it has lasted
// 20 µs the runtime's monitor thread takes the goroutine's P away and wakes another thread to look for
// work, and when the call returns the goroutine has to win a P back. With GOMAXPROCS 1, as each of
// several peer processes sharing a host's cores runs, every bulk call pays those wake-ups and context
// switches, and the monitor, seeing them, keeps polling every 20 µs: a large share of an AllReduce's
// CPU time in bench/allreduce (docs/results/allreduce.md).
//
// ReadFull and WriteBuffers make the same read and writev calls as raw system calls on the
// connection's non-blocking descriptor, which leave the P where it is, and wait for readiness through
// the runtime's poller exactly as the net package does: deadlines, Close from another goroutine and
// the errors callers branch on behave as before. In exchange the P is held for the duration of one
// call, which moves at most rawMax bytes. They do so for *net.TCPConn and *net.UnixConn on Linux;
// any other connection (TLS, QUIC, the in-memory network) goes through its own Read and Write, unless
// it is a [SocketWrapper] around one of those sockets. Under the race detector, which sees memory
// written by the net package's calls but not by raw ones, they go through Read and Write too.

// rawMax bounds the bytes one raw system call moves: the pause it holds a P for stays within a
// millisecond or two, and it covers a whole frame of the LAN preset (4 MiB and a header) in one call.
const rawMax = 8 << 20

// SocketWrapper is a connection that wraps one of the net package's TCP or unix sockets, to watch it
// for instance, and lets ReadFull and WriteBuffers move bulk bytes on the socket itself: they call
// the socket's descriptor directly and hand every error they get to SocketError before returning it.
type SocketWrapper interface {
	net.Conn
	// Socket returns the wrapped socket.
	Socket() net.Conn
	// SocketError is told every error of the bulk reads and writes done on the socket.
	SocketError(err error)
}

// ReadFull reads exactly len(b) bytes from c into b, as io.ReadFull does, with the same errors:
// io.EOF if nothing was read before the end of the stream, io.ErrUnexpectedEOF if it ended part way,
// and otherwise the connection's error (os.ErrDeadlineExceeded, net.ErrClosed, a reset, ...) with the
// number of bytes read before it.
func ReadFull(c net.Conn, b []byte) (int, error) {
	if sc, fd, ok := rawConn(c); ok {
		n, err := rawReadFull(sc, fd, b)
		observe(c, err)
		return n, err
	}
	return io.ReadFull(c, b)
}

// WriteBuffers writes every byte of *bufs to c, as bufs.WriteTo(c) does (one writev per call where
// the connection allows it), and consumes *bufs as it goes. It returns the number of bytes written
// and the first error.
func WriteBuffers(c net.Conn, bufs *net.Buffers) (int64, error) {
	if sc, fd, ok := rawConn(c); ok {
		n, err := rawWriteBuffers(sc, fd, bufs)
		observe(c, err)
		return n, err
	}
	return bufs.WriteTo(c)
}

// observe hands err, if any, to c when c is a SocketWrapper.
func observe(c net.Conn, err error) {
	if w, ok := c.(SocketWrapper); ok && err != nil {
		w.SocketError(err)
	}
}
