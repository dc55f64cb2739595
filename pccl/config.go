package pccl

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/concord-ccl/concord/pccl/internal/links"
	"github.com/concord-ccl/concord/rings"
)

// Config configures a Communicator. Only Master is required; every other zero field takes the
// default given in its comment.
type Config struct {
	// Master is the master's address, host:port. Required.
	Master string
	// Token is the run token; the master refuses peers with another one. Default empty.
	Token string
	// ListenAddr is where this peer accepts links from its ring predecessor (host:port; port 0 picks
	// one). Default: the local address of the route to the master, any port (loopback when the master
	// is on this host). A wildcard such as "0.0.0.0:7000" or "[::]:7000" listens on every interface.
	ListenAddr string
	// AdvertiseAddr is the address neighbours dial to reach ListenAddr. A host without a port takes the
	// listener's port. Default: the listener's address, or for a wildcard listener the local address
	// of the route to the master with the listener's port. Behind NAT with a forwarded port, set it to
	// the public address.
	AdvertiseAddr string
	// Site names the datacenter or region this peer runs in, for the status page and topology. When
	// the ring holds several sites of at least two peers each, AllReduce runs hierarchically: inside
	// each site, then across sites on WAN rings of one peer per site.
	Site string
	// NICs lists the local network interfaces (names such as "eth2", or their IPv4 addresses) this
	// peer uses for traffic inside its site, in rail order: NIC i of one peer talks to NIC i of the
	// others. Entries must be non-empty and distinct. With a Site, Connect opens a port on each and
	// announces the listen addresses; when every peer of every site lists as many NICs as the others of
	// its site, the reduce-scatter and all-gather inside the sites run on the intra-site tier (rdma,
	// with hot repair: a NIC that fails mid-operation costs bandwidth, not the operation) whenever the
	// master runs the AllReduce alone, and over the peers' links from ListenAddr otherwise. Without a
	// Site they are only announced.
	// Default: none.
	NICs []string
	// NICNetNS is the network namespace the NICs are in (a path such as /var/run/netns/site0-a), for
	// test beds that run several peers in one process. Default: the process's own.
	NICNetNS string
	// SiteHotRepairOnly keeps the intra-site fabric on hot repair when it is degraded, instead of the
	// planner's schedules (siteplan.go); for comparisons. One peer of a site with it keeps the whole
	// site on hot repair. Default false.
	SiteHotRepairOnly bool
	// Group is the peer group this peer joins (a 32-bit id, as in PCCL): shared state and collectives
	// span one group, and each group has its own ring and epochs under the one master. Default 0.
	Group uint32
	// ID is the identity this peer asks for. A peer that keeps its ID across a reconnection is known
	// again by the master; two live peers cannot hold the same ID. Default 0: a random ID is drawn at
	// Connect.
	ID uint64
	// PoolSize is the number of connections to the ring successor. The frames of every collective are
	// striped over all of them, each frame to the connection expected to deliver it first by its
	// measured rate, so one operation fills a long fat pipe that routers share per flow and a slow
	// connection gets less. Default 1 (LAN preset); the WAN preset uses 4; at most 64.
	PoolSize int
	// EvenStriping sends part p of a collective on connection (seq+p) mod PoolSize, an even split,
	// instead of by measured rate. It is there to compare the two; default false (adaptive).
	EvenStriping bool
	// PartBytes is the pipelining granularity of collectives in bytes: the payload of one data frame.
	// Every peer of a run must use the same: it travels in each operation's descriptor, and peers
	// that differ get ErrDescriptorMismatch. Default 1 MiB (rings.DefaultPartBytes) and in the WAN
	// preset, where a part crosses a slow link in tens of milliseconds and smaller parts fill the
	// pipeline sooner; the LAN preset uses 4 MiB, which moves the same bytes in fewer frames, system
	// calls and wake-ups. At most 64 MiB.
	PartBytes int
	// DialTimeout bounds opening one link to a neighbour. Default 5s.
	DialTimeout time.Duration
	// ProgressTimeout is the least time a data frame of a collective may take on a link before the
	// link counts as silent and the operation fails with ErrPeerLeft; frames larger than the measured
	// send rate moves in a fraction of it get proportionally more (8x the expected time). The failure
	// names the link to the master, which wires the next ring around it (master.Config.LinkCutTimeout)
	// while both ends stay in the run. Default 10s.
	ProgressTimeout time.Duration
	// MasterTimeout is how long the master may stay unreachable before this peer gives up on it: calls
	// then fail with ErrMasterLost and the Communicator dies. Meanwhile the peer resumes its session
	// with the master on a new connection whenever one answers (a cut link, a flapping route, a paused
	// or partitioned master cost nothing but the wait), or rejoins a restarted master with its state
	// (see reconnect.go). Default 60s; the WAN preset waits 5 minutes.
	MasterTimeout time.Duration
	// ContributionStats makes every AllReduce of F32 or F64 data compute the norm and the finiteness
	// of this peer's contribution (one pass over the send buffer) and send them in its vote, for a
	// master that runs a contribution guard (master.GuardPolicy). Default false.
	ContributionStats bool
	// Logger receives diagnostics. Default: discard.
	Logger *slog.Logger
	// Transport opens connections. Default: TCP with no delay.
	Transport Transport
	// GossipJoin is the address of the master's gossip member (master.Server.GossipAddr). When set,
	// the peer runs a gossip member (real UDP and TCP sockets, tuned by Gossip) that the master uses to
	// declare it dead if it hangs. Default empty: no gossip. Off by default because under the LAN
	// timing the heartbeat rule removes a hung peer as fast at half the CPU and bytes; it pays off
	// with long heartbeat timeouts such as the pccl preset's (docs/results/gossip.md).
	GossipJoin string
	// Gossip tunes this peer's gossip member when GossipJoin is set. Default: the LAN preset on a free
	// loopback port.
	Gossip GossipConfig

	// siteProvider, set by tests, opens the intra-site fabric instead of rdma/tcp on NICs (which then
	// only count the NICs).
	siteProvider siteProvider
}

// LAN returns the preset for peers on one network (fill in Master).
func LAN() Config { return Config{PoolSize: 1, PartBytes: lanPartBytes} }

// lanPartBytes is the LAN preset's PartBytes: parts large enough that a frame's fixed costs vanish
// on a local network, small enough to pipeline a ring step (docs/results/allreduce.md compares sizes).
const lanPartBytes = 4 << 20

// WAN returns the preset for peers across the internet (fill in Master): four connections per
// neighbour for long fat pipes, and more patience with the master.
func WAN() Config {
	return Config{PoolSize: 4, PartBytes: rings.DefaultPartBytes, DialTimeout: 15 * time.Second, MasterTimeout: 5 * time.Minute}
}

func (c Config) withDefaults() Config {
	if c.ID == 0 {
		c.ID = randomID()
	}
	if c.ListenAddr == "" {
		c.ListenAddr = defaultListen(c.Master)
	}
	if c.PoolSize == 0 {
		c.PoolSize = 1
	}
	if c.PartBytes == 0 {
		c.PartBytes = rings.DefaultPartBytes
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.MasterTimeout == 0 {
		c.MasterTimeout = time.Minute
	}
	if c.ProgressTimeout == 0 {
		c.ProgressTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Transport == nil {
		c.Transport = NewTCP(TCPConfig{})
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Master == "":
		return fmt.Errorf("%w: Config.Master is empty", ErrInvalid)
	case c.PoolSize < 0 || c.PoolSize > 64:
		return fmt.Errorf("%w: Config.PoolSize is %d, must be in [0, 64]", ErrInvalid, c.PoolSize)
	case c.PartBytes < 0 || c.PartBytes > links.MaxPayload:
		return fmt.Errorf("%w: Config.PartBytes is %d, must be between 0 and %d", ErrInvalid, c.PartBytes, links.MaxPayload)
	case c.DialTimeout < 0:
		return fmt.Errorf("%w: Config.DialTimeout is %v, must be >= 0", ErrInvalid, c.DialTimeout)
	case c.ProgressTimeout < 0:
		return fmt.Errorf("%w: Config.ProgressTimeout is %v, must be >= 0", ErrInvalid, c.ProgressTimeout)
	case c.MasterTimeout < 0:
		return fmt.Errorf("%w: Config.MasterTimeout is %v, must be >= 0", ErrInvalid, c.MasterTimeout)
	}
	if c.AdvertiseAddr != "" {
		if _, _, err := splitAdvertise(c.AdvertiseAddr); err != nil {
			return fmt.Errorf("%w: Config.AdvertiseAddr %q: %v", ErrInvalid, c.AdvertiseAddr, err)
		}
	}
	for i, nic := range c.NICs {
		if nic == "" {
			return fmt.Errorf("%w: Config.NICs[%d] is empty", ErrInvalid, i)
		}
		if slices.Contains(c.NICs[:i], nic) {
			return fmt.Errorf("%w: Config.NICs lists %q twice", ErrInvalid, nic)
		}
	}
	if err := c.Gossip.Validate(); err != nil {
		return fmt.Errorf("%w: Config.Gossip: %w", ErrInvalid, err)
	}
	return nil
}

// randomID draws a peer identity: 48 random bits, never zero, so that it stays exact wherever it is
// handled as a float64 (the status page's JavaScript).
func randomID() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[2:]); err != nil {
			panic(fmt.Sprintf("pccl: no randomness for a peer id: %v", err))
		}
		if id := binary.BigEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}
