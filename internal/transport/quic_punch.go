package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
)

// Puncher is implemented by listeners that can dial from their own socket (QUIC's). A connection
// dialled that way leaves from the listening port, so a NAT in front of this end maps it to the same
// public address as every other packet of the listener; Punch sends a datagram from that socket,
// which opens such a NAT to packets from addr. Two ends behind NATs that keep one mapping per socket
// (most home and cloud NATs) reach each other this way: each punches the other's public address, then
// one dials it (wire/rendezvous.go).
type Puncher interface {
	DialFrom(ctx context.Context, addr string) (net.Conn, error)
	Punch(addr string) error
}

// punchDatagram is what Punch sends: its first byte has the two high bits clear, so QUIC stacks
// (quic-go's included) take it for something else and drop it.
var punchDatagram = []byte{0, 'c', 'o', 'n', 'c', 'o', 'r', 'd'}

// DialFrom opens a QUIC connection to addr from the listener's socket, authenticates it and returns
// its one stream, as Dial does. The connection keeps the socket open until it closes, as an accepted
// one does.
func (sl streamListener) DialFrom(ctx context.Context, addr string) (net.Conn, error) {
	l := sl.l
	fail := func(err error) (net.Conn, error) {
		return nil, fmt.Errorf("quic dial %s from %s: %w", addr, l.Addr(), err)
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return fail(net.ErrClosed)
	}
	ra, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return fail(err)
	}
	hctx, cancel := context.WithTimeout(ctx, l.t.cfg.HandshakeTimeout)
	defer cancel()
	conn, err := l.tr.Dial(hctx, ra, l.t.stream.client, l.t.qconf)
	if err != nil {
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		return fail(quicConnError(err))
	}
	s, err := l.t.authenticate(hctx, conn, true)
	if err != nil {
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		return fail(err)
	}
	s.ln = l
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		conn.CloseWithError(codeRefused, "listener closed")
		return fail(net.ErrClosed)
	}
	l.sessions[s] = struct{}{}
	l.mu.Unlock()
	s.start()
	st, err := s.OpenStream(ctx)
	if err != nil {
		s.closeWith(false)
		return fail(errors.Unwrap(err))
	}
	qs := st.(*quicStream)
	qs.ownsSession = true
	return qs, nil
}

// Punch sends one datagram from the listener's socket to addr.
func (sl streamListener) Punch(addr string) error {
	ra, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return fmt.Errorf("quic punch %s: %w", addr, err)
	}
	if _, err := sl.l.tr.WriteTo(punchDatagram, ra); err != nil {
		return fmt.Errorf("quic punch %s: %w", addr, err)
	}
	return nil
}
