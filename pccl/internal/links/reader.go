package links

import (
	"io"
	"net"
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
	last  atomic.Int64 // wall-clock UnixNano of the last frame header read or payload handed over
	stage []byte       // the buffer of a staged frame, owned by the reader; kept for the next one
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
		ic.last.Store(l.cfg.WallNanos(time.Now()))
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

// forget closes an incoming connection whose reader stopped and takes it out of its pool, so that
// new collectives see the gap at once instead of waiting on a connection nobody reads.
func (l *Links) forget(ic *inConn) {
	ic.conn.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	if pool := l.in[ic.from]; ic.index < len(pool) && pool[ic.index] == ic {
		pool[ic.index] = nil
	}
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
