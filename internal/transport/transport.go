package transport

import (
	"context"
	"net"
	"syscall"
)

// Transport opens byte-stream connections. Implementations are safe for concurrent use by any number
// of goroutines.
type Transport interface {
	// Name returns the short name of the implementation: "tcp", "tls", "quic" or "mem".
	Name() string
	// Listen starts accepting connections on addr, given as "host:port"; port 0 picks a free port,
	// which the listener's Addr reports. The caller owns the listener and must close it.
	Listen(addr string) (net.Listener, error)
	// Dial connects to addr, given as "host:port". It returns early with an error wrapping ctx.Err()
	// when ctx is cancelled or its deadline passes first. The caller owns the connection and must
	// close it. Closing a connection twice returns nil for the in-memory Network but an error
	// wrapping net.ErrClosed for TCP, whose connections are the standard library's own.
	Dial(ctx context.Context, addr string) (net.Conn, error)
	// ListenSession starts accepting sessions on addr, given as for Listen. The caller owns the
	// listener and must close it.
	ListenSession(addr string) (SessionListener, error)
	// DialSession opens a session to addr, where a session listener listens. It returns once the
	// listener has accepted the session, or with an error wrapping ErrRefused when nobody listens there
	// or the listener refused, or wrapping ctx.Err() when ctx ends first. The caller owns the session
	// and must close it.
	DialSession(ctx context.Context, addr string) (Session, error)
}

// Errors that callers may test for with errors.Is. They are the operating system's own error numbers,
// so the same test works for TCP connections, whose errors come from the kernel, and for the in-memory
// Network, which reports the same conditions with the same values.
var (
	// ErrRefused means nobody listens on the dialled address.
	ErrRefused error = syscall.ECONNREFUSED
	// ErrReset means the connection was torn down abruptly, for example because the peer's host
	// crashed.
	ErrReset error = syscall.ECONNRESET
	// ErrBrokenPipe means a write went to a connection whose peer has already closed it.
	ErrBrokenPipe error = syscall.EPIPE
	// ErrAddrInUse means a listener already holds the requested address.
	ErrAddrInUse error = syscall.EADDRINUSE
	// ErrAddrNotAvail means the address does not belong to the host that tried to listen on it.
	ErrAddrNotAvail error = syscall.EADDRNOTAVAIL
)
