package pccl

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/internal/gossip"
	"github.com/concord-ccl/concord/internal/simhook"
	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl/internal/links"
)

// Communicator is one peer's membership in a run. Create it with Connect; Close it when done.
//
// Ownership. The protocol state (epoch, ring, votes, collectives by tag, master liveness, fatal
// error) lives in a machine owned by the run goroutine (runtime.go); API calls and I/O goroutines talk
// to it only through the reqs channel, and it answers each call on the call's own reply channel.
// Goroutines:
//   - run: owns the machine, the calls and the table of dialled connections; writes every message to
//     the master (wbuf); on death sets fatal, then closes done.
//   - readMaster: reads the master connection and posts each message to run (control.go).
//   - wiring: opens the links of the master's Connect rounds and posts the result to run.
//   - the links' own goroutines (pccl/internal/links: an acceptor, a reader per incoming link, a
//     writer per outgoing one); one goroutine per bandwidth test of an OptimizeTopology and per
//     redial of the master (each posts its result to run), and one per rendezvous answered.
//   - callers: a collective's data path runs on its caller's goroutine, which reads view and owns its
//     streams.
//
// view is published by run after every step (atomic). serveMu guards the donor side of a sync.
type Communicator struct {
	cfg Config
	log *slog.Logger
	id  uint64

	masterMu sync.Mutex // guards master: run replaces it on reconnection, Close closes it
	master   net.Conn
	gen      uint64 // owned by run: the master connection's generation, bumped at each reconnection
	adv      string // the advertised link address, sent in every Hello
	wbuf     []byte // owned by run
	ctl      ctlSession
	held     atomic.Pointer[heldState]

	ln    net.Listener // where links and other peers' connections arrive; owned by links
	links *links.Links // the data plane
	rv    rendezvous   // reaching peers behind NAT (rendezvous.go)
	site  *siteTier    // the intra-site tier, nil without Site and NICs (sitetier.go)

	reqs     chan request       // callers and I/O goroutines -> run
	connects chan *wire.Connect // run -> wiring, latest wins
	done     chan struct{}      // closed by run when the communicator dies (Close, kick, master lost)
	stop     chan struct{}      // closed by Close: run returns
	fatal    error              // why done was closed; written by run before closing done
	life     context.Context    // ends when the communicator dies: bounds background I/O
	endLife  context.CancelFunc
	nextCall atomic.Uint64
	view     atomic.Pointer[view]
	calls    map[uint64]*callEntry // owned by run
	conns    map[connID]net.Conn   // owned by run: connections the machine's inputs name (redialedIn)
	nextConn atomic.Uint64         // the last connID drawn

	serveMu       sync.Mutex
	serving       *State              // state donors read during a sync, nil otherwise
	servingHashes map[string]uint64   // its hashes at vote time
	servingLeaves map[string][]uint64 // and the leaves of their hash trees
	serveConns    map[net.Conn]bool   // connections serving a state range now
	serveWG       sync.WaitGroup      // one per range being served
	served        atomic.Int64        // entry bytes sent to fetchers, ever (SyncResult.ServedBytes)

	closeOnce sync.Once
	wg        sync.WaitGroup

	gossip *gossip.Member // the failure detector's member when Config.GossipJoin is set (gossip.go)

	// wallOffset, nil but in the simulator (internal/simhook), is this peer's wall-clock error,
	// added wherever it reads Unix time: a clock that jumps.
	wallOffset func() time.Duration
}

// view is what accessors read without asking run: the ring in force and optimization stats.
type view struct {
	epoch    uint64
	ring     []uint64
	run      wire.RunSize
	optimize OptimizeStats
}

// unixNano is t's Unix time in nanoseconds as this peer's wall clock reads it.
func (c *Communicator) unixNano(t time.Time) int64 {
	if c.wallOffset == nil {
		return t.UnixNano()
	}
	return t.UnixNano() + int64(c.wallOffset())
}

// Connect joins the run: it registers with the master, waits until the accepted peers admit it (at
// their next UpdateTopology; at once if it is the first peer) and returns with the ring wired.
func Connect(ctx context.Context, cfg Config) (*Communicator, error) {
	c, err := connect(ctx, cfg)
	return c, cleanError(err)
}

func connect(ctx context.Context, cfg Config) (*Communicator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Communicator{
		cfg:      cfg,
		log:      cfg.Logger,
		reqs:     make(chan request),
		connects: make(chan *wire.Connect, 1),
		done:     make(chan struct{}),
		stop:     make(chan struct{}),
		calls:    map[uint64]*callEntry{},
		conns:    map[connID]net.Conn{},

		wallOffset: simhook.WallOffset(ctx),
	}
	c.view.Store(&view{})
	if cfg.Site != "" && len(cfg.NICs) > 0 {
		t, err := openSiteTier(cfg, cfg.Logger)
		if err != nil {
			return nil, err
		}
		c.site = t
	}
	ln, err := cfg.Transport.Listen(cfg.ListenAddr)
	if err != nil {
		c.site.close()
		return nil, fmt.Errorf("pccl: listen for links on %s: %w", cfg.ListenAddr, err)
	}
	adv, err := advertised(cfg.AdvertiseAddr, ln.Addr(), cfg.Master)
	if err != nil {
		ln.Close()
		c.site.close()
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, cfg.MasterTimeout)
	mc, err := c.dialMaster(dctx, ln)
	cancel()
	if err != nil {
		ln.Close()
		c.site.close()
		return nil, fmt.Errorf("pccl: dial master %s: %w: %w", cfg.Master, ErrMasterLost, err)
	}
	c.master, c.adv = mc, adv
	welcome, sid, err := c.hello(ctx, mc, nil)
	if err == nil {
		c.ctl.start(sid)
	}
	if err != nil {
		ln.Close()
		mc.Close()
		c.site.close()
		return nil, err
	}
	c.id = welcome.Peer
	c.rv.welcomed(welcome)
	if err := c.startGossip(); err != nil {
		ln.Close()
		mc.Close()
		c.site.close()
		return nil, err
	}
	c.log = c.log.With("peer", c.id)
	c.ln = ln
	c.links = links.New(links.Config{Self: c.id, Token: cfg.Token, PoolSize: cfg.PoolSize, EvenStriping: cfg.EvenStriping,
		DialTimeout: cfg.DialTimeout, ProgressTimeout: cfg.ProgressTimeout, Logger: c.log, Dial: c.dialLink,
		Serve:     map[uint8]func(net.Conn){wire.KindState: c.serveState, wire.KindBench: c.serveBench, wire.KindCall: c.takeCall},
		WallNanos: c.unixNano, OnWire: c.fabricWired, Dying: c.done}, ln)
	c.life, c.endLife = context.WithCancel(context.Background())
	m := newMachine(c.id, time.Duration(welcome.HeartbeatInterval), cfg.MasterTimeout, time.Now())
	m.incarnation = welcome.Incarnation

	c.wg.Add(3)
	go c.run(m)
	go c.readMaster(mc, 0)
	go c.wiring()
	c.links.Start()

	call, ch := c.newCall()
	if err := c.submit(request{in: connectCall{call}, reply: ch}); err != nil {
		c.Close()
		return nil, err
	}
	r, err := c.await(ctx, call, ch)
	if err == nil {
		err = r.err
	}
	if err != nil {
		c.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("pccl: waiting to be accepted: %w", ctx.Err())
		}
		return nil, err
	}
	return c, nil
}

// Logger returns the communicator's logger (Config.Logger, tagged with the peer id).
func (c *Communicator) Logger() *slog.Logger { return c.log }

// ID returns this peer's id, assigned by the master.
func (c *Communicator) ID() uint64 { return c.id }

// Rank returns this peer's position in the ring in force.
func (c *Communicator) Rank() int { return slices.Index(c.view.Load().ring, c.id) }

// WorldSize returns the number of peers in the ring in force.
func (c *Communicator) WorldSize() int { return len(c.view.Load().ring) }

// GroupInfo describes this peer's group and the whole run. The group's figures follow the ring in
// force; the run-wide ones are the master's count when it last sent this peer's group a topology
// (Connect, UpdateTopology, OptimizeTopology), so another group's change shows at this group's next
// one.
type GroupInfo struct {
	Group           uint32 // this peer's group (Config.Group)
	GroupWorldSize  int    // peers in this group's ring in force
	GlobalWorldSize int    // accepted peers over all groups
	Groups          int    // groups with at least one accepted peer
	LargestGroup    int    // accepted peers of the largest group
}

// GroupInfo returns this peer's group and the run-wide sizes; see GroupInfo.
func (c *Communicator) GroupInfo() GroupInfo {
	v := c.view.Load()
	return GroupInfo{Group: c.cfg.Group, GroupWorldSize: len(v.ring), GlobalWorldSize: int(v.run.Peers),
		Groups: int(v.run.Groups), LargestGroup: int(v.run.Largest)}
}

// Epoch returns the epoch of the ring in force; it changes with every membership or ring change.
func (c *Communicator) Epoch() uint64 { return c.view.Load().epoch }

// Ring returns the peer ids of the ring in force, in ring order.
func (c *Communicator) Ring() []uint64 { return slices.Clone(c.view.Load().ring) }

// Stats counts this peer's link activity since Connect.
type Stats struct {
	// LinksOpened is the number of data connections this peer opened to ring successors.
	LinksOpened uint64
	// LinksAccepted is the number of data connections it accepted from ring predecessors.
	LinksAccepted uint64
	// SiteCollectives is the number of hierarchical AllReduces whose site phases ran on the
	// intra-site fabric (Config.NICs), and of AllReduces of a one-site group that ran whole on it,
	// completed or not.
	SiteCollectives uint64
	// SiteGenerations is the number of intra-site fabrics this peer opened: one per ring change of
	// its site and one after each collective that failed on it.
	SiteGenerations uint64
	// SiteBytes is the number of data bytes this peer received on the intra-site fabric.
	SiteBytes int64
	// SiteFailovers is the number of paths that hot repair moved to another NIC pair, with this peer
	// sending, counted when a collective completes on the fabric.
	SiteFailovers uint64
	// SitePlanned is the number of calls on a degraded intra-site fabric that ran by the planner's
	// schedule (siteplan.go), and SitePlan the strategy of the last of them ("" if none; "balance
	// re-ranked" when bridge re-ranking reordered the ring).
	SitePlanned uint64
	SitePlan    string
	// SiteCalibrations is the number of times the site's nodes measured their fabric's NICs for the
	// planner (siteplan.go): once per site ring, again when a node lacks the last table.
	SiteCalibrations uint64
	// LinksSameNAT, LinksReversed, LinksPunched and LinksRelayed count the connections this peer
	// opened to peers behind NAT (rendezvous.go): dialled directly behind the same NAT, called back,
	// over a punched QUIC path, and through the master's relay.
	LinksSameNAT, LinksReversed, LinksPunched, LinksRelayed uint64
}

// Stats returns the communicator's counters. It may be called from any goroutine.
func (c *Communicator) Stats() Stats {
	s := Stats{LinksOpened: c.links.Opened(), LinksAccepted: c.links.Accepted(),
		LinksSameNAT: c.rv.direct.Load(), LinksReversed: c.rv.counts[wire.RendezvousReverse].Load(),
		LinksPunched: c.rv.counts[wire.RendezvousPunch].Load(), LinksRelayed: c.rv.counts[wire.RendezvousRelay].Load()}
	if t := c.site; t != nil {
		s.SiteCollectives, s.SiteGenerations, s.SiteFailovers = t.collectives.Load(), t.generations.Load(), t.failovers.Load()
		s.SiteBytes = t.retiredBytes.Load()
		s.SitePlanned, s.SitePlan = t.plans.stats()
		s.SiteCalibrations = t.plans.calibrations.Load()
		if f := t.peek(); f != nil {
			s.SiteBytes += f.ep.ReceivedBytes()
		}
	}
	return s
}

// CloseAfter closes c once grace has passed after ctx ended, unless the returned stop was called
// first; call stop when the work ctx bounds is over. A collective whose context ends waits for the
// master's verdict, up to Config.MasterTimeout: a caller that must go even while the master cannot be
// reached uses CloseAfter, and Close fails the calls still in flight at once.
func (c *Communicator) CloseAfter(ctx context.Context, grace time.Duration) (stop func()) {
	return afterEnd(ctx, grace, func() { c.Close() })
}

// afterEnd calls f once grace has passed after ctx ended, unless stop was called first.
func afterEnd(ctx context.Context, grace time.Duration, f func()) (stop func()) {
	over := make(chan struct{})
	go func() {
		select {
		case <-over:
			return
		case <-ctx.Done():
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-over:
		case <-t.C:
			f()
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(over) }) }
}

// Close leaves the run: it tells the master, closes every connection and waits for the
// communicator's goroutines. Collectives in flight fail with ErrClosed. Close is idempotent.
func (c *Communicator) Close() error {
	c.closeOnce.Do(func() {
		if c.submit(request{in: closeCall{}}) == nil {
			<-c.done
		}
		close(c.stop)
		c.masterConn().Close()
		c.links.Close()
		c.wg.Wait()
		c.site.close()
		c.stopGossip()
	})
	return nil
}
