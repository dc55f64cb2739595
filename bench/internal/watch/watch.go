// Package watch wraps a Transport so that a benchmark's peer learns when the far end of one of its
// connections went away: the first read that ends with end of file or a reset, or write that ends
// with a broken pipe or a reset, after the last [Transport.Reset]. A benchmark uses it to tell the
// time the kernel tore a killed process's sockets down from the time Concord reported the failure.
//
// Errors of the peer's own doing (closing a connection itself, a deadline passing) are not
// observations. A wrapped socket is a transport.SocketWrapper: the peer's bulk reads and writes of
// data frames run on the socket itself, as they do unwatched, and their errors are observed too.
// Frames the standard library writes with writev on a socket go around the wrapper's Write, so a
// broken pipe may be missed there; the reader on the other side of a dead peer sees its end of file.
package watch

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/concord-ccl/concord/pccl"
)

// Transport is a pccl.Transport whose connections report the far end going away. It is safe for
// concurrent use by any number of goroutines, as the Transport it wraps.
type Transport struct {
	pccl.Transport
	first atomic.Int64 // Unix nanoseconds of the first observation since Reset; 0 if none
}

// New wraps inner.
func New(inner pccl.Transport) *Transport { return &Transport{Transport: inner} }

// Reset forgets the last observation.
func (t *Transport) Reset() { t.first.Store(0) }

// Gone returns the wall-clock time, in Unix nanoseconds, of the first far-end close observed since
// the last Reset, or 0 if none was.
func (t *Transport) Gone() int64 { return t.first.Load() }

// Observe records err if it says the far end went away; it reports whether it did.
func (t *Transport) Observe(err error) bool {
	if !FarEnd(err) {
		return false
	}
	t.first.CompareAndSwap(0, time.Now().UnixNano())
	return true
}

// FarEnd reports whether err means the other end of a connection closed it or vanished.
func FarEnd(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// observed passes a read's or write's result through, observing its error.
func (t *Transport) observed(n int, err error) (int, error) {
	if err != nil {
		t.Observe(err)
	}
	return n, err
}

// Listen is the wrapped Transport's Listen; the connections it accepts are watched.
func (t *Transport) Listen(addr string) (net.Listener, error) {
	ln, err := t.Transport.Listen(addr)
	if err != nil {
		return nil, err
	}
	return &listener{Listener: ln, t: t}, nil
}

// Dial is the wrapped Transport's Dial; the connection it returns is watched.
func (t *Transport) Dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := t.Transport.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	return t.wrap(c), nil
}

func (t *Transport) wrap(c net.Conn) net.Conn {
	// Embedding the socket keeps its writev and splice paths.
	switch sc := c.(type) {
	case *net.TCPConn:
		return &tcpConn{TCPConn: sc, t: t}
	case *net.UnixConn: // the TCP transport's local path
		return &unixConn{UnixConn: sc, t: t}
	}
	return &conn{Conn: c, t: t}
}

type listener struct {
	net.Listener
	t *Transport
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.t.wrap(c), nil
}

type tcpConn struct {
	*net.TCPConn
	t *Transport
}

func (c *tcpConn) Read(p []byte) (int, error) { return c.t.observed(c.TCPConn.Read(p)) }

func (c *tcpConn) Write(p []byte) (int, error) { return c.t.observed(c.TCPConn.Write(p)) }

// Socket and SocketError make c a transport.SocketWrapper.
func (c *tcpConn) Socket() net.Conn { return c.TCPConn }

func (c *tcpConn) SocketError(err error) { c.t.Observe(err) }

type unixConn struct {
	*net.UnixConn
	t *Transport
}

func (c *unixConn) Read(p []byte) (int, error) { return c.t.observed(c.UnixConn.Read(p)) }

func (c *unixConn) Write(p []byte) (int, error) { return c.t.observed(c.UnixConn.Write(p)) }

// Socket and SocketError make c a transport.SocketWrapper.
func (c *unixConn) Socket() net.Conn { return c.UnixConn }

func (c *unixConn) SocketError(err error) { c.t.Observe(err) }

type conn struct {
	net.Conn
	t *Transport
}

func (c *conn) Read(p []byte) (int, error) { return c.t.observed(c.Conn.Read(p)) }

func (c *conn) Write(p []byte) (int, error) { return c.t.observed(c.Conn.Write(p)) }
