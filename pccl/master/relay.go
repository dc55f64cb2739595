package master

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// The relay joins the two connections of a rendezvous of mode relay (wire/rendezvous.go), byte for
// byte: the last way for a peer behind NAT to reach another behind NAT when no punched path opens.
// Both ends dial the master (KindRelay) and send a CallHello with the run token and the key of their
// rendezvous; the first to come waits up to relayWait for the second, then the two are spliced until
// either ends. Every byte crosses the master twice, which is why the ring solve prices such links
// high (Machine.reachPenalty) and the counters below are exported.

// relayWait bounds how long one end of a relayed link waits for the other.
const relayWait = 10 * time.Second

// maxRelayWaiting bounds the ends waiting at once; beyond it new ones are refused.
const maxRelayWaiting = 1024

// RelayStats counts the relay's work since the server started.
type RelayStats struct {
	Links   uint64 // connection pairs joined
	Bytes   uint64 // bytes carried, both ways
	Active  int    // pairs joined and not ended
	Refused uint64 // ends refused: bad token, duplicate key, too many waiting, or no partner in time
}

type relay struct {
	mu      sync.Mutex
	waiting map[wire.RendezvousKey]*relayEnd // guarded by mu
	active  int                              // guarded by mu

	links, bytes, refused atomic.Uint64
}

// relayEnd is a connection waiting for its partner; the partner's goroutine takes it from the map
// and closes paired, after which it owns conn.
type relayEnd struct {
	conn   net.Conn
	paired chan struct{}
}

func (r *relay) stats() RelayStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return RelayStats{Links: r.links.Load(), Bytes: r.bytes.Load(), Active: r.active, Refused: r.refused.Load()}
}

// relay serves a connection that opened with the relay handshake: it reads its CallHello, then
// waits for its partner or splices the two.
func (s *Server) relay(ctx context.Context, c net.Conn) {
	r := &s.relays
	c.SetReadDeadline(time.Now().Add(firstFrameTimeout))
	msg, _, err := wire.ReadFrame(c, 1<<10, nil)
	h, ok := msg.(*wire.CallHello)
	if err != nil || !ok || h.Token != s.cfg.Config.Token {
		s.log.Debug("relay connection refused", "remote", c.RemoteAddr(), "err", err, "type", msg)
		r.refused.Add(1)
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	r.mu.Lock()
	if r.waiting == nil {
		r.waiting = map[wire.RendezvousKey]*relayEnd{}
	}
	other := r.waiting[h.Key]
	if other == nil {
		if len(r.waiting) >= maxRelayWaiting {
			r.mu.Unlock()
			r.refused.Add(1)
			c.Close()
			return
		}
		me := &relayEnd{conn: c, paired: make(chan struct{})}
		r.waiting[h.Key] = me
		r.mu.Unlock()
		t := time.NewTimer(relayWait)
		defer t.Stop()
		select {
		case <-me.paired:
			return // the partner's goroutine carries both
		case <-t.C:
		case <-ctx.Done():
		}
		r.mu.Lock()
		if r.waiting[h.Key] != me {
			r.mu.Unlock()
			<-me.paired // taken just now
			return
		}
		delete(r.waiting, h.Key)
		r.mu.Unlock()
		r.refused.Add(1)
		c.Close()
		return
	}
	delete(r.waiting, h.Key)
	r.active++
	r.mu.Unlock()
	close(other.paired)
	r.links.Add(1)
	s.log.Debug("relaying", "a", other.conn.RemoteAddr(), "b", c.RemoteAddr())
	r.splice(ctx, other.conn, c)
	r.mu.Lock()
	r.active--
	r.mu.Unlock()
}

// splice copies a to b and b to a until both directions end, or one fails, or ctx ends; then it
// closes both. A direction that ends cleanly (EOF) half-closes the other connection where it can, so
// that the last bytes written before a Close arrive.
func (r *relay) splice(ctx context.Context, a, b net.Conn) {
	stop := context.AfterFunc(ctx, func() {
		a.Close()
		b.Close()
	})
	defer stop()
	var wg sync.WaitGroup
	one := func(dst, src net.Conn) {
		defer wg.Done()
		n, err := io.Copy(dst, src)
		r.bytes.Add(uint64(n))
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == nil {
			cw.CloseWrite()
			return
		}
		a.Close()
		b.Close()
	}
	wg.Add(2)
	go one(a, b)
	go one(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}
