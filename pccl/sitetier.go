package pccl

// The intra-site tier. A peer that names its site and lists NICs (Config.Site, Config.NICs) opens one
// port per NIC at Connect and announces the NICs' listen addresses to the master, which hands them to
// every peer in Connect. When every peer of a site announced as many NICs as this one, the hierarchical
// AllReduce runs its reduce-scatter and all-gather inside the site on the rdma fabric (rdma/tcp: one
// socket per NIC pair and connection class, multi-rail channels, hot repair of every path), so that a
// NIC or link failure inside the site costs bandwidth, not the operation.
//
// An rdma node serves one ring and one collective at a time, and a collective on it cannot be
// stopped: it runs until it completes or its endpoint closes. Hence:
//
//   - The fabric is used only by a collective the master commenced alone (wire.Commence.Alone): no
//     other collective of the group runs beside it, on any peer. The others run their site phases on
//     the site ring's TCP links.
//   - Fabrics come in generations, named by the epoch and the last collective of the epoch the master
//     aborted (opStart.siteGen): every member of a collective gets the same two, so every peer of a
//     site opens the same generation. A node's id hashes the peer id with the generation, so that a
//     socket of another generation is refused by the provider's hello.
//   - A collective that fails closes its fabric before it returns: once the endpoint is closed nothing
//     of the abandoned collective can touch the caller's buffers. The master aborts the collective on
//     every peer, so every peer of the site closes its fabric too, and the next collective opens the
//     next generation everywhere.
//   - After siteAbortLimit aborted collectives in one epoch the fabric is off until the next epoch
//     (opStart.siteOff), so that a fabric that cannot work (a peer's NICs all down while its links
//     and its master connection are fine) does not fail every retry.

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl/internal/links"
	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/tcp"
	"github.com/concord-ccl/concord/rings"
)

// siteRepair are the hot-repair deadlines of the intra-site tier. A peer shares its cores with the
// training and with the WAN tier, so a late acknowledgement or probe answer (a busy machine delays
// one by hundreds of milliseconds) must not look like a failure: a NIC that goes down is seen at once
// through its link state, and a silent one within about two seconds.
var siteRepair = rdma.RepairConfig{
	MinAckTimeout: 500 * time.Millisecond,
	MaxAckTimeout: 2 * time.Second,
	ProbeTimeout:  500 * time.Millisecond,
	StallTimeout:  time.Second,
}

// siteProvider opens the endpoint and the rdma node of each generation of a peer's fabric. Outside
// tests it is tcpSite, the peer's NICs on rdma/tcp.
type siteProvider interface {
	// addrs returns what the peer announces: each NIC's listen address, ip:port, in NIC order.
	addrs() []string
	// open starts node on the site ring, whose other nodes listen on peers; the node connects to its
	// neighbours in the background.
	open(node rdma.NodeID, ring []rdma.NodeID, peers map[rdma.NodeID][]netip.AddrPort, cfg rdma.Config) (*rdma.Node, fabricEndpoint, error)
}

// fabricEndpoint is what the tier needs of an open endpoint besides its node.
type fabricEndpoint interface {
	// Post runs a function in the endpoint's event context.
	Post(func())
	// Close closes the endpoint; once it returns no event of the endpoint runs, so nothing of a
	// collective touches the caller's buffers.
	Close() error
	// ReceivedBytes counts the chunk data received so far.
	ReceivedBytes() int64
}

// tcpSite is the provider of the peer's NICs: rdma/tcp, one socket per NIC pair and connection class.
type tcpSite struct {
	nics  []tcp.NICConfig // Port reserved at openSiteTier
	netns string
}

func (p *tcpSite) addrs() []string {
	var out []string
	for _, n := range p.nics {
		out = append(out, netip.AddrPortFrom(n.Addr, n.Port).String())
	}
	return out
}

func (p *tcpSite) open(node rdma.NodeID, ring []rdma.NodeID, peers map[rdma.NodeID][]netip.AddrPort, cfg rdma.Config) (*rdma.Node, fabricEndpoint, error) {
	ep, err := tcp.Listen(tcp.Config{Node: node, NICs: p.nics, Peers: peers, NetNS: p.netns})
	if err != nil {
		return nil, nil, fmt.Errorf("pccl: open the intra-site fabric: %w", err)
	}
	n, err := rdma.NewNode(ep, ring, cfg)
	if err != nil {
		ep.Close()
		return nil, nil, fmt.Errorf("pccl: start the intra-site node: %w", err)
	}
	return n, ep, nil
}

// siteTier is one peer's intra-site tier: its NICs, and the fabric of the current generation.
type siteTier struct {
	prov  siteProvider
	nnics int
	addrs []string // announced, in NIC order
	log   *slog.Logger

	mu     sync.Mutex // held by the collective that uses the fabric, for its whole run
	fab    *siteFabric
	closed bool
	cur    atomic.Pointer[siteFabric] // fab, for progress reads that must not wait for mu

	// Counters for Communicator.Stats.
	collectives, generations, failovers atomic.Uint64
	retiredBytes                        atomic.Int64 // received by the fabrics already closed
	plans                               sitePlans    // the planner's use of the fabric (siteplan.go)
	// cal is the last calibration of the fabric and the site ring it measured (siteplan.go); the
	// collective that holds mu uses it.
	cal struct {
		site  []uint64
		table rdma.Calibration
	}
}

// fabricGen names one generation of a site's fabric (see the comment at the top of this file).
type fabricGen struct{ epoch, seq uint64 }

// siteFabric is one generation of the fabric: an endpoint on the peer's NICs and an rdma node on the
// ring of the site's peers.
type siteFabric struct {
	gen  fabricGen
	site []uint64 // the site ring, peer ids
	ep   fabricEndpoint
	node *rdma.Node
	rank int
	// Scratch for counts that the site's peers do not divide: rdma blocks are equal, so the buffer is
	// padded to a whole number of blocks. blk holds this peer's block for the all-gather.
	padIn, padOut, blk []byte
	failovers          int          // the node's Failovers when last counted
	planner            *sitePlanner // made at the first call that checks the health (siteplan.go)
}

// openSiteTier resolves cfg.NICs (names or addresses, in cfg.NICNetNS) and reserves a port on each.
func openSiteTier(cfg Config, log *slog.Logger) (*siteTier, error) {
	if p := cfg.siteProvider; p != nil {
		t := &siteTier{prov: p, nnics: len(cfg.NICs), addrs: p.addrs(), log: log}
		t.plans.hotRepairOnly = cfg.SiteHotRepairOnly
		return t, nil
	}
	var nics []tcp.NICConfig
	err := tcp.InNetNS(cfg.NICNetNS, func() error {
		var err error
		nics, err = tcp.HostNICs(cfg.NICs...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%w: Config.NICs: %w", ErrInvalid, err)
	}
	if len(nics) != len(cfg.NICs) {
		return nil, fmt.Errorf("%w: Config.NICs: %d of %q have an IPv4 address", ErrInvalid, len(nics), cfg.NICs)
	}
	if err := tcp.ReservePorts(cfg.NICNetNS, nics); err != nil {
		return nil, fmt.Errorf("pccl: intra-site NICs: %w", err)
	}
	p := &tcpSite{nics: nics, netns: cfg.NICNetNS}
	t := &siteTier{prov: p, nnics: len(nics), addrs: p.addrs(), log: log}
	t.plans.hotRepairOnly = cfg.SiteHotRepairOnly
	return t, nil
}

// usable reports whether the site's peers can run on the fabric: each announced as many NICs as this
// peer, every one an ip:port. Every peer decides alike from the same Connect.
func (t *siteTier) usable(site []uint64, nics map[uint64][]string) bool {
	return len(site) > 0 && len(nics[site[0]]) == t.nnics && links.FabricReady(site, nics)
}

// fabricWired is what the links do for the fabric when they wire a ring (links.Config.OnWire): a
// fabric of an earlier epoch serves no collective of this one, so its sockets close now rather than at
// the next hierarchical collective, which may never come; when this epoch's collectives may run their
// site phases on the fabric (nics set), its first generation opens now.
func (c *Communicator) fabricWired(epoch uint64, site []uint64, nics map[uint64][]string) {
	c.site.retireBefore(epoch)
	if nics != nil {
		c.site.prepare(fabricGen{epoch, 0}, site, nics, c.id)
	}
}

// siteNodeID is the rdma node id of peer in generation gen.
func siteNodeID(peer uint64, gen fabricGen) rdma.NodeID {
	var b [24]byte
	binary.LittleEndian.PutUint64(b[0:], peer)
	binary.LittleEndian.PutUint64(b[8:], gen.epoch)
	binary.LittleEndian.PutUint64(b[16:], gen.seq)
	return rdma.NodeID(xxh3.Hash(b[:]))
}

// acquire locks the tier for one collective and returns the fabric of generation gen for the site
// ring site (this peer is me), opening it if the current one is of another generation or ring. The
// caller calls release when the collective is over, after retire if it failed.
func (t *siteTier) acquire(gen fabricGen, site []uint64, nics map[uint64][]string, me uint64) (*siteFabric, error) {
	t.mu.Lock()
	if err := t.ensure(gen, site, nics, me); err != nil {
		t.mu.Unlock()
		return nil, err
	}
	t.fab.startCollective()
	return t.fab, nil
}

// prepare opens the fabric of generation gen for the site ring site ahead of the collective that
// uses it, when an epoch is wired: its listeners are up and its connections on their way before the
// first collective of the epoch, which would otherwise wait for them, as the survivors' first
// collective after a death would. It does nothing while a collective holds the tier.
func (t *siteTier) prepare(gen fabricGen, site []uint64, nics map[uint64][]string, me uint64) {
	if t == nil || !t.mu.TryLock() {
		return
	}
	defer t.mu.Unlock()
	if err := t.ensure(gen, site, nics, me); err != nil {
		t.log.Debug("intra-site fabric not opened ahead", "epoch", gen.epoch, "err", err)
	}
}

// ensure makes the fabric of generation gen for site the open one (the tier is locked by the caller).
func (t *siteTier) ensure(gen fabricGen, site []uint64, nics map[uint64][]string, me uint64) error {
	if t.closed {
		return ErrClosed
	}
	if t.fab != nil && (t.fab.gen != gen || !slices.Equal(t.fab.site, site)) {
		t.retire()
	}
	if t.fab == nil {
		f, err := t.open(gen, site, nics, me)
		if err != nil {
			return err
		}
		t.fab = f
		t.cur.Store(f)
		t.generations.Add(1)
	}
	return nil
}

// release unlocks the tier after a collective.
func (t *siteTier) release() { t.mu.Unlock() }

// retire closes the current fabric, if any (the tier is locked by the caller): its collective failed,
// or its generation or its site ring is past.
func (t *siteTier) retire() {
	if t.fab != nil {
		t.fab.close()
		t.retiredBytes.Add(t.fab.ep.ReceivedBytes())
		t.fab = nil
		t.cur.Store(nil)
	}
}

// retireBefore closes the current fabric if it belongs to an epoch before epoch, unless a collective
// holds the tier (that one retires it if it fails, and the next collective replaces it anyway).
func (t *siteTier) retireBefore(epoch uint64) {
	if t == nil || !t.mu.TryLock() {
		return
	}
	defer t.mu.Unlock()
	if t.fab != nil && t.fab.gen.epoch < epoch {
		t.retire()
	}
}

// account counts a collective that ran on fabric f, and the failovers of f's node so far if f is still
// open (the tier is locked by the caller).
func (t *siteTier) account(f *siteFabric) {
	t.collectives.Add(1)
	if t.fab != f {
		return
	}
	if n := f.stats().Failovers; n > f.failovers {
		t.failovers.Add(uint64(n - f.failovers))
		f.failovers = n
	}
}

// peek returns the open fabric without locking the tier (nil if none); only its endpoint's counters
// may be read.
func (t *siteTier) peek() *siteFabric { return t.cur.Load() }

// close closes the tier for good; it waits for a collective that holds it.
func (t *siteTier) close() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.retire()
	t.closed = true
}

// open listens on the tier's NICs as the node of generation gen and starts the rdma node of the site
// ring; the node connects to its neighbours in the background.
func (t *siteTier) open(gen fabricGen, site []uint64, nics map[uint64][]string, me uint64) (*siteFabric, error) {
	ring := make([]rdma.NodeID, len(site))
	peers := map[rdma.NodeID][]netip.AddrPort{}
	for i, id := range site {
		ring[i] = siteNodeID(id, gen)
		if slices.Contains(ring[:i], ring[i]) {
			return nil, fmt.Errorf("%w: intra-site node ids collide in generation %v; the next one differs", ErrPeerLeft, gen)
		}
		if id == me {
			continue
		}
		for _, a := range nics[id] {
			ap, err := netip.ParseAddrPort(a)
			if err != nil {
				return nil, fmt.Errorf("%w: peer %d announced NIC %q: %w", ErrInvalid, id, a, err)
			}
			peers[ring[i]] = append(peers[ring[i]], ap)
		}
	}
	rank := slices.Index(site, me)
	node, ep, err := t.prov.open(ring[rank], ring, peers, rdma.Config{Direct: true, Repair: siteRepair})
	if err != nil {
		return nil, err
	}
	t.log.Debug("intra-site fabric open", "epoch", gen.epoch, "gen", gen.seq, "site", site, "nics", t.nnics)
	return &siteFabric{gen: gen, site: slices.Clone(site), ep: ep, node: node, rank: rank}, nil
}

// close closes the endpoint and waits for its goroutines: no operation of the node runs afterwards.
func (f *siteFabric) close() { f.ep.Close() }

// stats returns the node's hot-repair counters.
func (f *siteFabric) stats() rdma.Stats { return onEvents(f, f.node.Stats) }

// onEvents returns what fn returns in f's event context, or T's zero value if the context does not
// run it within a second.
func onEvents[T any](f *siteFabric, fn func() T) T {
	ch := make(chan T, 1)
	f.ep.Post(func() { ch <- fn() })
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Second):
		var zero T
		return zero
	}
}

// nicMark is a fabric's per-NIC sent bytes at the start of a collective, and when it started.
type nicMark struct {
	bytes []int64
	t     time.Time
}

// mark notes f's per-NIC counters at the start of a collective.
func (f *siteFabric) mark() nicMark {
	return nicMark{bytes: onEvents(f, f.node.NICBytes), t: time.Now()}
}

// figures returns the per-NIC figures of a collective on f that started at m, for its Done: the
// bytes this peer posted on each NIC since m, and the time since m. Both are zero when the counters
// could not be read.
func (f *siteFabric) figures(m nicMark) ([]uint64, uint64) {
	now := onEvents(f, f.node.NICBytes)
	if len(now) == 0 || len(now) != len(m.bytes) || len(now) > wire.MaxSiteNICs {
		return nil, 0
	}
	out := make([]uint64, len(now))
	for i := range now {
		out[i] = uint64(max(now[i]-m.bytes[i], 0))
	}
	return out, uint64(max(time.Since(m.t), 1))
}

// grow returns b resized to n bytes, reallocated only if it is too small.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// sitePhase runs the reduce-scatter (gather false) or the all-gather of a hierarchical AllReduce on
// the fabric, as a rings.Runner over the whole buffer. Block b of the buffer, b*blk elements on, is
// owned by the site peer at position b; the WAN phase reduces this peer's block (links.SiteShard).
type sitePhase struct {
	t      *siteTier
	f      *siteFabric
	gather bool
	dt     rings.DType
	op     rings.Op
	count  int
}

func (p *sitePhase) Run(ctx context.Context, in, out []byte) error {
	f, size := p.f, p.dt.Size()
	world := len(f.site)
	blk := (p.count + world - 1) / world
	padded := blk * world * size
	own := links.SiteShard(p.count, f.rank, world)
	lo, hi := own.Off*size, (own.Off+own.Len)*size
	f.blk = grow(f.blk, blk*size)
	var err error
	if !p.gather {
		src := in
		if padded != len(in) {
			f.padIn = grow(f.padIn, padded)
			copy(f.padIn, in)
			clear(f.padIn[len(in):])
			src = f.padIn
		}
		if err = p.t.reduceScatter(ctx, f, src, f.blk, p.dt, p.op); err == nil {
			copy(out[lo:hi], f.blk)
		}
	} else {
		clear(f.blk[copy(f.blk, in[lo:hi]):])
		dst := out
		if padded != len(out) {
			f.padOut = grow(f.padOut, padded)
			dst = f.padOut
		}
		if err = p.t.allGather(ctx, f, f.blk, dst, p.dt); err == nil && padded != len(out) {
			copy(out, dst)
		}
	}
	if err != nil {
		// Nothing of the collective may touch in or out once Run returns.
		p.t.retire()
		what := "reduce-scatter"
		if p.gather {
			what = "all-gather"
		}
		if ctx.Err() != nil {
			// Stopped from outside: the cause says why (the caller, the master's verdict, or the
			// failure of another phase, such as a WAN ring that lost a peer).
			return fmt.Errorf("intra-site %s on the rdma fabric: %w", what, context.Cause(ctx))
		}
		return fmt.Errorf("%w: intra-site %s on the rdma fabric: %w", ErrPeerLeft, what, err)
	}
	return nil
}

// Abort does nothing: the fabric is retired when the collective fails (runHierarchical), and the
// site's peers stop when the master aborts the collective everywhere.
func (p *sitePhase) Abort(error) {}
