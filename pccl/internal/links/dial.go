package links

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// maxPoolIndex bounds the pool index a LinkHello may name: the flat ring's pool, then the sub-rings'.
const maxPoolIndex = hierIndexBase + int(numSubRings)*hierPoolMax

// dialPool opens n links to peer to at once, with pool indices base to base+n−1, and returns them in
// index order: each dial takes a round trip or more (a handshake over TLS or QUIC), and across a WAN
// one after the other they would add up to the re-wiring after every membership change. On failure it
// closes the links it opened and returns the index of the first that failed, with its error.
func (l *Links) dialPool(to wire.PeerInfo, base, n int) ([]net.Conn, int, error) {
	conns := make([]net.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() { conns[k], errs[k] = l.dial(to, base+k) })
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
			return nil, k, err
		}
	}
	return conns, 0, nil
}

// dial opens the link of pool index index to peer to: a connection by Config.Dial, the data kind's
// handshake, a LinkHello and its LinkAck.
func (l *Links) dial(to wire.PeerInfo, index int) (net.Conn, error) {
	conn, err := l.cfg.Dial(to)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(l.cfg.DialTimeout))
	err = wire.Exchange(conn, wire.KindData)
	if err == nil {
		_, err = conn.Write(wire.AppendFrame(nil, &wire.LinkHello{Token: l.cfg.Token, From: l.cfg.Self, To: to.ID, Index: uint16(index)}))
	}
	var msg wire.Message
	if err == nil {
		msg, _, err = wire.ReadFrame(conn, 1<<16, nil)
	}
	if err == nil {
		if ack, ok := msg.(*wire.LinkAck); !ok {
			err = fmt.Errorf("link answer is %T", msg)
		} else if !ack.OK {
			err = fmt.Errorf("link refused: %s", ack.Reason)
		}
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	l.opened.Add(1)
	return conn, nil
}

// accept is the acceptor: it admits every connection the listener takes, each on a goroutine of its
// own, until Close.
func (l *Links) accept() {
	defer l.wg.Done()
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.wg.Add(1)
		go l.admit(conn)
	}
}

// Admit serves conn as if the listener had accepted it (a connection a rendezvous opened towards this
// peer). It returns once the connection is over; after Close it closes conn at once.
func (l *Links) Admit(conn net.Conn) {
	l.mu.Lock()
	if l.isClosed {
		l.mu.Unlock()
		conn.Close()
		return
	}
	l.wg.Add(1)
	l.mu.Unlock()
	l.admit(conn)
}

// admit runs the handshake of an accepted connection: a link from a predecessor is checked, added to
// its pool and read until it ends; another kind goes to Config.Serve.
func (l *Links) admit(conn net.Conn) {
	defer l.wg.Done()
	cfg := l.cfg
	conn.SetDeadline(time.Now().Add(cfg.DialTimeout))
	kinds := []uint8{wire.KindData}
	for k := range cfg.Serve {
		kinds = append(kinds, k)
	}
	kind, err := wire.Accept(conn, kinds...)
	if err != nil {
		conn.Close()
		return
	}
	if serve := cfg.Serve[kind]; serve != nil && kind != wire.KindData {
		serve(conn)
		return
	}
	msg, _, err := wire.ReadFrame(conn, 1<<16, nil)
	if err != nil {
		conn.Close()
		return
	}
	h, ok := msg.(*wire.LinkHello)
	reason := ""
	switch {
	case !ok:
		reason = fmt.Sprintf("first message is %T, want LinkHello", msg)
	case h.Token != cfg.Token:
		reason = "run token mismatch"
	case h.To != cfg.Self:
		reason = fmt.Sprintf("this is peer %d, not %d", cfg.Self, h.To)
	case int(h.Index) >= maxPoolIndex:
		reason = fmt.Sprintf("pool index %d out of range", h.Index)
	}
	if reason != "" {
		conn.Write(wire.AppendFrame(nil, &wire.LinkAck{OK: false, Reason: reason}))
		conn.Close()
		return
	}
	ic := &inConn{conn: conn, from: h.From, index: int(h.Index), last: new(atomic.Int64)}
	l.mu.Lock()
	if l.isClosed {
		l.mu.Unlock()
		conn.Close()
		return
	}
	l.place(ic)
	ic.seen(cfg.WallNanos(time.Now()))
	l.mu.Unlock()
	if _, err := conn.Write(wire.AppendFrame(nil, &wire.LinkAck{OK: true})); err != nil {
		conn.Close()
		return
	}
	conn.SetDeadline(time.Time{})
	l.accepted.Add(1)
	l.read(ic)
}
