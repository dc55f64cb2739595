package transport

import (
	"fmt"
	"sync/atomic"
)

// FaultKind names what a write hook does to a link or connection.
type FaultKind int

const (
	// FaultNone lets the write through.
	FaultNone FaultKind = iota
	// FaultClose ends the connection's direction cleanly at the fault: the reader gets the bytes written
	// before it, then io.EOF; the failing Write and every later one return ErrBrokenPipe.
	FaultClose
	// FaultReset resets the connection at the fault, as a TCP RST does: both ends fail with ErrReset at
	// once and data still in flight, including the kept bytes, is discarded.
	FaultReset
	// FaultBlackHole sets LinkConfig.BlackHole on the link at the fault: the rest of the write and
	// everything after it is silently lost (see LinkConfig.BlackHole), until Heal or SetLink.
	FaultBlackHole
	// FaultPartition partitions the two hosts at the fault, as Network.Partition does.
	FaultPartition
)

// String returns the kind's name.
func (k FaultKind) String() string {
	switch k {
	case FaultNone:
		return "none"
	case FaultClose:
		return "close"
	case FaultReset:
		return "reset"
	case FaultBlackHole:
		return "black hole"
	case FaultPartition:
		return "partition"
	}
	return fmt.Sprintf("FaultKind(%d)", int(k))
}

// Fault is a write hook's verdict on one write.
type Fault struct {
	// Kind is what happens.
	Kind FaultKind
	// Keep is the number of bytes at the start of the write that cross the link normally before the
	// fault hits; it is clamped to the write's size. 0 means the fault hits before the first byte. It is
	// ignored for datagrams, which a fault of any kind drops whole.
	Keep int
}

// Write describes one write handed to a link, as a write hook sees it. Only the application's bytes
// count: a session's preambles and control frames are neither seen nor counted.
type Write struct {
	// From and To name the hosts at the ends of the link.
	From, To string
	// Size is the write's length in bytes.
	Size int
	// Offset is the number of bytes written before this write on the same connection in the same
	// direction, or, for a datagram, sent before it as datagrams by the same session end.
	Offset int64
	// LinkBytes is the number of bytes handed to the link before this write, over all its connections
	// and datagrams.
	LinkBytes int64
	// LinkWrites is the number of writes handed to the link before this one (0 for the first).
	LinkWrites int64
	// Datagram is true for a datagram, false for a connection's Write.
	Datagram bool
}

// OnWrite makes the network call hook for every non-empty Write on a connection, and every datagram,
// from host from to host to, before any byte of it is in flight; nil removes the hook. The hook's verdict
// can fail the link or the connection at that write (see Fault), so a test can break a link at a chosen
// frame, byte or write. Counters in Write start with the link, not with the hook.
//
// Hooks of one link are called one at a time, from the writing goroutine while it holds the
// connection's write turn; hooks of different links may run concurrently. A hook may call the
// Network's other methods, but not OnWrite for its own link and not a blocking Write on it.
func (n *Network) OnWrite(from, to string, hook func(Write) Fault) {
	l := n.link(from, to)
	l.hookMu.Lock()
	l.hook = hook
	l.hookMu.Unlock()
}

// FailAt returns a write hook that applies kind once, when the link has carried exactly offset bytes:
// the write that would cross that point keeps the bytes before it, and the fault hits there. A datagram
// crossing the point is dropped instead. For example, to reset a connection in the middle of its third
// 1 KiB frame:
//
//	n.OnWrite("a", "b", transport.FailAt(2*1024+512, transport.FaultReset))
func FailAt(offset int64, kind FaultKind) func(Write) Fault {
	var fired atomic.Bool
	return func(w Write) Fault {
		if w.LinkBytes+int64(w.Size) <= offset || fired.Load() {
			return Fault{}
		}
		fired.Store(true)
		return Fault{Kind: kind, Keep: int(max(offset-w.LinkBytes, 0))}
	}
}

// cross counts a write of size bytes handed to the link, whose offset on its connection or session end
// is offset, and returns the hook's verdict on it.
func (l *link) cross(offset int64, size int, datagram bool) Fault {
	l.hookMu.Lock()
	defer l.hookMu.Unlock()
	w := Write{
		From: l.from, To: l.to, Size: size, Offset: offset,
		LinkBytes: l.bytes, LinkWrites: l.writes, Datagram: datagram,
	}
	l.bytes += int64(size)
	l.writes++
	if l.hook == nil {
		return Fault{}
	}
	return l.hook(w)
}

// blackHole sets BlackHole on the link.
func (l *link) blackHole() {
	l.mu.Lock()
	l.cfg.BlackHole = true
	l.mu.Unlock()
}
