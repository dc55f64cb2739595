package links

import (
	"io"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/internal/wire"
)

// inConn is one connection of a pool from a predecessor, owned by its reader goroutine.
type inConn struct {
	conn  net.Conn
	from  uint64
	index int
	last  *atomic.Int64 // wall-clock UnixNano of the last frame header read or payload handed over on the slot's connections
	own   atomic.Int64  // the same, on this connection alone
	stage []byte        // the buffer of a staged frame, owned by the reader; kept for the next one
}

// read routes the frames of one incoming connection into the inboxes of their collectives.
func (l *Links) read(ic *inConn) {
	defer l.forget(ic)
	var hb [wire.DataHeaderSize]byte
	for {
		if _, err := transport.ReadFull(ic.conn, hb[:]); err != nil {
			l.broken(ic.conn)
			return
		}
		ic.seen(l.cfg.WallNanos(time.Now()))
		h, err := wire.DecodeDataHeader(hb[:], MaxPayload)
		if err != nil {
			l.cfg.Logger.Warn("bad data frame, closing link", "from", ic.from, "err", err)
			l.broken(ic.conn)
			return
		}
		ib, ok := l.waitInbox(inboxKey{h.Tag, h.Seq})
		if !ok {
			if _, err := io.CopyN(io.Discard, ic.conn, int64(h.Len)); err != nil {
				l.broken(ic.conn)
				return
			}
			continue
		}
		if err := ib.deliver(ic, h); err != nil {
			l.broken(ic.conn)
			return
		}
	}
}

// seen records activity on ic at wall-clock time now.
func (ic *inConn) seen(now int64) {
	ic.last.Store(now)
	ic.own.Store(now)
}

// maxSpare bounds the displaced connections kept per predecessor.
const maxSpare = 4

// place puts ic, just admitted, into its pool slot (l.mu held). A connection already there is not
// closed but kept as a spare and still read: a hello replayed by someone holding the run token must
// not cut a live link, and frames are matched to their collective by tag and sequence, whichever
// connection brings them. The slot's connections share one activity clock, so a silent newcomer does
// not make a live link look idle. Beyond maxSpare, the spare heard from least recently is closed.
func (l *Links) place(ic *inConn) {
	pool := l.in[ic.from]
	for len(pool) <= ic.index {
		pool = append(pool, nil)
	}
	if old := pool[ic.index]; old != nil {
		ic.last = old.last
		spares := append(l.spare[ic.from], old)
		if len(spares) > maxSpare {
			i := 0
			for j, sp := range spares {
				if sp.own.Load() < spares[i].own.Load() {
					i = j
				}
			}
			spares[i].conn.Close()
			spares = slices.Delete(spares, i, i+1)
		}
		l.spare[ic.from] = spares
	}
	pool[ic.index] = ic
	l.in[ic.from] = pool
}

// forget closes an incoming connection whose reader stopped and takes it out of its pool, so that
// new collectives see the gap at once instead of waiting on a connection nobody reads. A spare of the
// same slot, the one heard from last, takes its place.
func (l *Links) forget(ic *inConn) {
	ic.conn.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	spares := l.spare[ic.from]
	if i := slices.Index(spares, ic); i >= 0 {
		l.spare[ic.from] = slices.Delete(spares, i, i+1)
		return
	}
	pool := l.in[ic.from]
	if ic.index >= len(pool) || pool[ic.index] != ic {
		return
	}
	pool[ic.index] = nil
	best := -1
	for j, sp := range spares {
		if sp.index == ic.index && (best < 0 || sp.own.Load() > spares[best].own.Load()) {
			best = j
		}
	}
	if best >= 0 {
		pool[ic.index] = spares[best]
		l.spare[ic.from] = slices.Delete(spares, best, best+1)
	}
}

// predecessors lists the peers with a pool or spares here (l.mu held).
func (l *Links) predecessors() []uint64 {
	var out []uint64
	for from := range l.in {
		out = append(out, from)
	}
	for from := range l.spare {
		if _, ok := l.in[from]; !ok {
			out = append(out, from)
		}
	}
	return out
}

// dropPool closes every connection from predecessor from and forgets its pool (l.mu held).
func (l *Links) dropPool(from uint64) {
	for _, ic := range l.in[from] {
		if ic != nil {
			ic.conn.Close()
		}
	}
	for _, ic := range l.spare[from] {
		ic.conn.Close()
	}
	delete(l.in, from)
	delete(l.spare, from)
}

// waitInbox returns the inbox of key once its collective has commenced here, or false if the frames
// are to be dropped (the operation is over, or the links are closing).
func (l *Links) waitInbox(key inboxKey) (*inbox, bool) {
	for {
		l.mu.Lock()
		ib, dead, closed, ch := l.inboxes[key], l.dead[key.seq], l.isClosed, l.changed
		l.mu.Unlock()
		switch {
		case ib != nil:
			return ib, true
		case dead || closed:
			return nil, false
		}
		<-ch
	}
}
