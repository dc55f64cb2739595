package pccl

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/internal/wire"
)

// Reaching peers behind NAT.
//
// The master tells every peer, in each PeerInfo, whether others can dial that peer's advertised
// address (Inbound: false when its connection to the master came from another address and no address
// was published) and where its packets come from (Public). A connection to a peer that cannot be
// dialled is opened by rendezvous (wire/rendezvous.go), in the first way that works of:
//
//   - the same NAT: both peers come from one public address, so they share a network; dial the
//     advertised address as usual;
//   - reverse: this peer can be dialled, so the master asks the target to call back;
//   - punch (QUIC): both ends send datagrams from their listening sockets to each other's public
//     address, then this end dials the target's public address from its listening socket (this is why,
//     over QUIC, the master connection also leaves from the listening socket: the master then sees the
//     public address others must punch towards);
//   - relay: both ends dial the master, which joins the two connections.
//
// Whichever way, the caller gets a connection as if it had dialled, and goes on with the connection
// handshake of its kind; the target hands the connection to the code that serves its listener.

// punchRounds and punchEvery space the datagrams each end sends to open its NAT.
const (
	punchRounds = 10
	punchEvery  = 100 * time.Millisecond
)

// rendezvous holds the reverse rendezvous this peer waits for, and counts the links each way opened.
type rendezvous struct {
	mu      sync.Mutex
	waiting map[wire.RendezvousKey]chan net.Conn // guarded by mu

	inbound atomic.Bool                             // others can dial this peer (the master's last Welcome)
	public  atomic.Pointer[string]                  // where the master sees this peer come from
	direct  atomic.Uint64                           // connections to peers behind NAT dialled directly (same NAT)
	counts  [wire.RendezvousRelay + 1]atomic.Uint64 // connections opened by each mode
}

// welcomed records what the master's Welcome says of this peer's reachability.
func (r *rendezvous) welcomed(w *wire.Welcome) {
	r.inbound.Store(w.Inbound)
	pub := w.Public
	r.public.Store(&pub)
}

// expect registers a reverse rendezvous under key; the call arrives on the channel.
func (r *rendezvous) expect(key wire.RendezvousKey) chan net.Conn {
	ch := make(chan net.Conn, 1)
	r.mu.Lock()
	if r.waiting == nil {
		r.waiting = map[wire.RendezvousKey]chan net.Conn{}
	}
	r.waiting[key] = ch
	r.mu.Unlock()
	return ch
}

// forget drops the rendezvous under key; a call that arrived meanwhile is closed.
func (r *rendezvous) forget(key wire.RendezvousKey) {
	r.mu.Lock()
	ch := r.waiting[key]
	delete(r.waiting, key)
	r.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case c := <-ch:
		c.Close()
	default:
	}
}

// deliver hands a call back to the rendezvous waiting under key, or reports false.
func (r *rendezvous) deliver(key wire.RendezvousKey, c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := r.waiting[key]
	if ch == nil {
		return false
	}
	delete(r.waiting, key)
	ch <- c
	return true
}

// newKey draws a rendezvous key.
func newKey() wire.RendezvousKey {
	var k wire.RendezvousKey
	rand.Read(k[:])
	return k
}

// reachTimeout bounds opening a connection to peer to: Config.DialTimeout for one that can be
// dialled, and for one behind NAT as much for each way tried (call back, punch, relay).
func (c *Communicator) reachTimeout(to wire.PeerInfo) time.Duration {
	if to.Inbound {
		return c.cfg.DialTimeout
	}
	return 3 * c.cfg.DialTimeout
}

// dialLink is how the links dial (links.Config.Dial): dialPeer within reachTimeout.
func (c *Communicator) dialLink(to wire.PeerInfo) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.reachTimeout(to))
	defer cancel()
	return c.dialPeer(ctx, to)
}

// dialPeer opens a connection to peer to, within ctx, by the first way that reaches it (see above);
// each way but the last may take Config.DialTimeout.
func (c *Communicator) dialPeer(ctx context.Context, to wire.PeerInfo) (net.Conn, error) {
	if to.Inbound || sameHost(to.Public, c.rv.publicAddr()) {
		conn, err := c.cfg.Transport.Dial(ctx, to.Addr)
		if err == nil && !to.Inbound {
			c.rv.direct.Add(1)
		}
		return conn, err
	}
	var errs []error
	if c.rv.inbound.Load() {
		conn, err := c.callBack(ctx, to)
		if err == nil {
			return conn, nil
		}
		c.log.Info("no call back from a peer behind NAT; trying the next way", "to", to.ID, "err", err)
		errs = append(errs, err)
	}
	if p, ok := c.ln.(transport.Puncher); ok && to.Public != "" && ctx.Err() == nil {
		conn, err := c.punch(ctx, p, to)
		if err == nil {
			return conn, nil
		}
		c.log.Info("no punched path to a peer behind NAT; trying the relay", "to", to.ID, "public", to.Public, "err", err)
		errs = append(errs, err)
	}
	if ctx.Err() == nil {
		conn, err := c.viaRelay(ctx, to)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("pccl: reach peer %d behind NAT (public address %s): %w", to.ID, to.Public, errors.Join(errs...))
}

// publicAddr is where the master last saw this peer come from, "" before it said.
func (r *rendezvous) publicAddr() string {
	if p := r.public.Load(); p != nil {
		return *p
	}
	return ""
}

// sameHost reports whether addresses a and b (host:port) have the same IP address.
func sameHost(a, b string) bool {
	pa, err1 := netip.ParseAddrPort(a)
	pb, err2 := netip.ParseAddrPort(b)
	return err1 == nil && err2 == nil && pa.Addr().Unmap() == pb.Addr().Unmap()
}

// requestRendezvous sends a rendezvous request to the master.
func (c *Communicator) requestRendezvous(mode uint8, key wire.RendezvousKey, to uint64) {
	c.post(rendezvousOut{&wire.Rendezvous{Mode: mode, Key: key, Peer: to}})
}

// callBack has the target dial this peer back.
func (c *Communicator) callBack(ctx context.Context, to wire.PeerInfo) (net.Conn, error) {
	key := newKey()
	ch := c.rv.expect(key)
	defer c.rv.forget(key)
	c.requestRendezvous(wire.RendezvousReverse, key, to.ID)
	t := time.NewTimer(c.cfg.DialTimeout)
	defer t.Stop()
	select {
	case conn := <-ch:
		c.rv.counts[wire.RendezvousReverse].Add(1)
		return conn, nil
	case <-t.C:
		return nil, fmt.Errorf("no call back within %v (Config.DialTimeout)", c.cfg.DialTimeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.done:
		return nil, ErrClosed
	}
}

// punch opens a path through both NATs and dials the target's public address over it.
func (c *Communicator) punch(ctx context.Context, p transport.Puncher, to wire.PeerInfo) (net.Conn, error) {
	c.requestRendezvous(wire.RendezvousPunch, newKey(), to.ID)
	// Our first datagrams open this end's NAT; the handshake's retransmissions get through once the
	// target's have opened its own.
	punchFor(p, to.Public, 3, 0)
	pctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	conn, err := p.DialFrom(pctx, to.Public)
	if err != nil {
		return nil, fmt.Errorf("punch: %w", err)
	}
	c.rv.counts[wire.RendezvousPunch].Add(1)
	return conn, nil
}

// punchFor sends rounds datagrams from p to addr, every apart.
func punchFor(p transport.Puncher, addr string, rounds int, every time.Duration) {
	for i := range rounds {
		if i > 0 {
			time.Sleep(every)
		}
		if p.Punch(addr) != nil {
			return
		}
	}
}

// viaRelay joins this peer's connection to the target's at the master.
func (c *Communicator) viaRelay(ctx context.Context, to wire.PeerInfo) (net.Conn, error) {
	key := newKey()
	c.requestRendezvous(wire.RendezvousRelay, key, to.ID)
	conn, err := c.openRelay(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	c.rv.counts[wire.RendezvousRelay].Add(1)
	c.log.Info("link to a peer behind NAT goes through the master's relay", "to", to.ID)
	return conn, nil
}

// openRelay dials the master's relay and presents key.
func (c *Communicator) openRelay(ctx context.Context, key wire.RendezvousKey) (net.Conn, error) {
	conn, err := c.cfg.Transport.Dial(ctx, c.cfg.Master)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(c.cfg.DialTimeout))
	err = wire.Exchange(conn, wire.KindRelay)
	if err == nil {
		_, err = conn.Write(wire.AppendFrame(nil, &wire.CallHello{Token: c.cfg.Token, Key: key}))
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return conn, nil
}

// answer carries out the master's RendezvousCall: another peer must reach this one. It runs on a
// goroutine of its own; the connection it opens is served as if the listener had accepted it.
func (c *Communicator) answer(call *wire.RendezvousCall) {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(c.life, c.cfg.DialTimeout)
	defer cancel()
	var conn net.Conn
	var err error
	switch call.Mode {
	case wire.RendezvousReverse:
		conn, err = c.cfg.Transport.Dial(ctx, call.Addr)
		if err == nil {
			conn.SetDeadline(time.Now().Add(c.cfg.DialTimeout))
			err = wire.Exchange(conn, wire.KindCall)
			if err == nil {
				_, err = conn.Write(wire.AppendFrame(nil, &wire.CallHello{Token: c.cfg.Token, Key: call.Key}))
			}
			if err != nil {
				conn.Close()
			}
		}
	case wire.RendezvousPunch:
		if p, ok := c.ln.(transport.Puncher); ok && call.Public != "" {
			punchFor(p, call.Public, punchRounds, punchEvery)
		}
		return // the asker dials
	case wire.RendezvousRelay:
		conn, err = c.openRelay(ctx, call.Key)
	}
	if err != nil {
		c.log.Warn("rendezvous failed", "peer", call.Peer, "mode", call.Mode, "err", err)
		return
	}
	c.links.Admit(conn)
}

// takeCall serves a call back that arrived at the listener (KindCall): its CallHello names the
// rendezvous waiting for it.
func (c *Communicator) takeCall(conn net.Conn) {
	msg, _, err := wire.ReadFrame(conn, 1<<10, nil)
	h, ok := msg.(*wire.CallHello)
	if err != nil || !ok || h.Token != c.cfg.Token || !c.rv.deliver(h.Key, conn) {
		conn.Close()
		return
	}
	conn.SetDeadline(time.Time{})
}

// dialMaster opens a connection to the master: over QUIC from the listening socket (so that the
// master sees the public address others punch towards), otherwise as any dial.
func (c *Communicator) dialMaster(ctx context.Context, ln net.Listener) (net.Conn, error) {
	if p, ok := ln.(transport.Puncher); ok {
		return p.DialFrom(ctx, c.cfg.Master)
	}
	return c.cfg.Transport.Dial(ctx, c.cfg.Master)
}
