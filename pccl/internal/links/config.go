package links

import (
	"errors"
	"log/slog"
	"net"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// MaxPayload bounds a data frame's payload; a frame larger than this is refused by receivers.
const MaxPayload = 64 << 20

// Sentinel errors of the data plane. pccl exports the same values (pccl.ErrPeerLeft, pccl.ErrClosed).
var (
	// ErrPeerLeft wraps every failure of a link: the peer at its other end left, died or hung, or the
	// link broke or went silent.
	ErrPeerLeft = errors.New("pccl: a peer left")
	// ErrClosed: the links were closed.
	ErrClosed = errors.New("pccl: communicator closed")
)

var (
	errNoPredecessor = errors.New("no link from the predecessor")
	errSilentLink    = errors.New("link silent past its progress deadline")
	errReleased      = errors.New("operation over")
)

// Config is what the links need of the peer that owns them. Dial is required; every other zero field
// takes the default given in its comment.
type Config struct {
	// Self is this peer's id, as the master assigned it.
	Self uint64
	// Token is the run token, sent in every LinkHello and required of every one received.
	Token string
	// PoolSize is the number of connections to the ring successor. Default 1.
	PoolSize int
	// EvenStriping sends part p of a collective on connection (seq+p) mod PoolSize instead of the
	// connection expected to deliver it first.
	EvenStriping bool
	// DialTimeout bounds the hello exchange of a link, on both ends. Default 5 s.
	DialTimeout time.Duration
	// ProgressTimeout is the least time a frame may take before its link counts as silent. Default
	// 10 s.
	ProgressTimeout time.Duration
	// Logger receives the links' diagnostics. Default: discard.
	Logger *slog.Logger

	// Dial opens a connection to peer to, within the time the way to it allows. It is the only way
	// the links dial, called concurrently from the goroutine that runs Wire. Required.
	Dial func(to wire.PeerInfo) (net.Conn, error)
	// Serve takes the connections of other kinds than data that arrive at the listener, by kind, once
	// their kind handshake is done and their deadline (DialTimeout) set; each function owns its
	// connection and runs on that connection's goroutine, which Close waits for. Default: none, and
	// the listener refuses other kinds.
	Serve map[uint8]func(net.Conn)
	// WallNanos returns t's Unix time in nanoseconds as this peer's wall clock reads it, for the
	// last-frame times of incoming connections. Default: t.UnixNano().
	WallNanos func(t time.Time) int64
	// OnWire is called by Wire for every ring it wires, before it dials the sub-ring pools, with the
	// ring's epoch and, when the hierarchy's site phases may run on an intra-site fabric
	// (EverySiteReady), this peer's site ring and the NICs its peers announced (nil otherwise). It
	// runs on Wire's goroutine. Default: nothing.
	OnWire func(epoch uint64, site []uint64, nics map[uint64][]string)
	// Dying is closed when the owner dies, which ends the links' background waits early. Default:
	// never.
	Dying <-chan struct{}
}

func (c Config) withDefaults() Config {
	if c.PoolSize == 0 {
		c.PoolSize = 1
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.ProgressTimeout == 0 {
		c.ProgressTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.WallNanos == nil {
		c.WallNanos = func(t time.Time) int64 { return t.UnixNano() }
	}
	if c.OnWire == nil {
		c.OnWire = func(uint64, []uint64, map[uint64][]string) {}
	}
	return c
}
