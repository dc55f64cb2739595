package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// The local path. Two processes of one host that talk TCP over loopback pay for the whole TCP/IP stack
// twice per byte. A unix stream socket moves the same bytes with far less kernel work, and with socket
// buffers of a few MiB it carries a collective's chunks in fewer wake-ups. So, on Linux, every TCP
// listener also listens on a unix socket in the abstract namespace, named after its TCP address
// (localName), and Dial tries that socket before TCP. The abstract namespace belongs to the network
// namespace, as loopback does: a name exists only where its TCP address would be reached on this
// host, so the unix socket can only ever lead to the listener the TCP dial would have reached. A
// wildcard listener (0.0.0.0:P or [::]:P) is named "*:P" and is tried only for loopback and
// unspecified targets.
// Nothing else changes: the bytes, the framing, TLS on top and the errors (refused, reset, EOF) are
// those of TCP. TCPConfig.DisableLocal turns the path off.

// localBuffer is the send and receive buffer size of a local connection when TCPConfig sets none. The
// kernel caps it at net.core.wmem_max and net.core.rmem_max.
const localBuffer = 4 << 20

// localNames returns the abstract socket names Dial tries for addr, most specific first, or nil when
// addr cannot be local.
func localNames(addr string) []string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return nil
	case ip.IsUnspecified(): // a dial to 0.0.0.0 or [::] reaches this host
		return []string{localName(nil, port)}
	}
	names := []string{localName(ip, port)}
	if ip.IsLoopback() {
		names = append(names, localName(nil, port))
	}
	return names
}

// localName is the abstract socket name of a TCP listener on ip:port; a nil ip stands for a wildcard.
func localName(ip net.IP, port string) string {
	host := "*"
	if ip != nil {
		host = ip.String()
	}
	return "@concord/tcp/" + net.JoinHostPort(host, port)
}

// listenLocal opens the unix twin of the TCP listener l, or returns nil where there is none to open
// or cfg turns the local path off.
func listenLocal(l net.Listener, cfg TCPConfig) net.Listener {
	if !localSupported || cfg.DisableLocal {
		return nil
	}
	a, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return nil
	}
	ip := a.IP
	if ip.IsUnspecified() {
		ip = nil
	}
	ul, err := net.Listen("unix", localName(ip, strconv.Itoa(a.Port)))
	if err != nil {
		return nil // the local path is only a shortcut: TCP still serves every dialler
	}
	return ul
}

// dialLocal connects to the unix twin of addr's listener. It returns nil, nil when there is none.
func dialLocal(ctx context.Context, addr string, cfg TCPConfig) (net.Conn, error) {
	if !localSupported || cfg.DisableLocal {
		return nil, nil
	}
	var d net.Dialer
	for _, name := range localNames(addr) {
		c, err := d.DialContext(ctx, "unix", name)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			continue
		}
		if err := configureLocal(c, cfg); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	return nil, nil
}

// configureLocal sizes the socket buffers of a local connection.
func configureLocal(c net.Conn, cfg TCPConfig) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil
	}
	rb, wb := cfg.ReadBuffer, cfg.WriteBuffer
	if rb == 0 {
		rb = localBuffer
	}
	if wb == 0 {
		wb = localBuffer
	}
	if err := uc.SetReadBuffer(rb); err != nil {
		return fmt.Errorf("set SO_RCVBUF %d: %w", rb, err)
	}
	if err := uc.SetWriteBuffer(wb); err != nil {
		return fmt.Errorf("set SO_SNDBUF %d: %w", wb, err)
	}
	return nil
}

// dualListener serves a TCP listener and its unix twin as one listener with the TCP address. One
// goroutine per underlying listener accepts and hands connections over; Close stops both and waits
// for them.
type dualListener struct {
	tcp, local net.Listener
	cfg        TCPConfig

	accepted chan accepted
	done     chan struct{}
	wg       sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

// accepted is a connection or an error of the TCP listener's Accept, handed to dualListener.Accept.
type accepted struct {
	c   net.Conn
	err error
}

// twinRetry is the pause after a failed Accept of the twin (too many open files, say) before the
// next; the TCP listener's errors go to the caller instead, who decides.
const twinRetry = 10 * time.Millisecond

func newDualListener(tcp, local net.Listener, cfg TCPConfig) *dualListener {
	d := &dualListener{tcp: tcp, local: local, cfg: cfg, accepted: make(chan accepted), done: make(chan struct{})}
	d.wg.Add(2)
	go d.serve(tcp, true)
	go d.serve(local, false)
	return d
}

func (d *dualListener) serve(l net.Listener, primary bool) {
	defer d.wg.Done()
	for {
		c, err := l.Accept()
		switch {
		case errors.Is(err, net.ErrClosed):
			return // Close closed it
		case err != nil && !primary:
			select {
			case <-time.After(twinRetry):
				continue
			case <-d.done:
				return
			}
		case err == nil && !primary:
			if err := configureLocal(c, d.cfg); err != nil {
				c.Close()
				continue
			}
		}
		select {
		case d.accepted <- accepted{c, err}:
		case <-d.done:
			if c != nil {
				c.Close()
			}
			return
		}
	}
}

// Accept waits for the next connection from either listener, or the next error of the TCP
// listener's Accept. After Close it returns an error wrapping net.ErrClosed.
func (d *dualListener) Accept() (net.Conn, error) {
	select {
	case a := <-d.accepted:
		return a.c, a.err
	case <-d.done:
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: d.tcp.Addr(), Err: net.ErrClosed}
	}
}

// Close stops both listeners and waits for their goroutines. Calling it again returns the result of
// the first call.
func (d *dualListener) Close() error {
	d.closeOnce.Do(func() {
		close(d.done)
		d.closeErr = d.tcp.Close()
		d.local.Close()
		d.wg.Wait()
	})
	return d.closeErr
}

// Addr returns the TCP listener's address.
func (d *dualListener) Addr() net.Addr { return d.tcp.Addr() }
