package pccl

import (
	"context"
	"errors"
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
)

// Communicator is one peer's membership in a run. Create it with Connect; Close it when done.
//
// Ownership. The protocol state (epoch, ring, votes, collectives by tag, master liveness, fatal
// error) lives in a machine owned by the run goroutine; API calls and I/O goroutines talk to it only
// through the reqs channel, and it answers each call on the call's own reply channel. Goroutines:
//   - run: owns the machine and calls; writes every message to the master (wbuf); on death sets
//     fatal, then closes done.
//   - readMaster: reads the master connection and posts each message to run.
//   - wiring: opens the links of the master's Connect rounds (the links struct owns them) and posts
//     the result to run.
//   - the link acceptor and one reader per incoming link (see links), and one goroutine per bandwidth
//     test of an OptimizeTopology (posts its result to run).
//   - callers: a collective's data path runs on its caller's goroutine, which reads view and owns its
//     opHandle's stream.
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

	links *links
	rv    rendezvous // reaching peers behind NAT (rendezvous.go)
	site  *siteTier  // the intra-site tier, nil without Site and NICs (sitetier.go)

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

// request is one input for the run goroutine. reply, when set, is registered for the input's call
// before the machine sees it; abort, for a collective, stops its data path.
type request struct {
	in    any
	reply chan reply
	abort func(error)
}

type callEntry struct {
	ch    chan reply // capacity 2: a collective gets a start and a final reply
	abort func(error)
}

// unixNano is t's Unix time in nanoseconds as this peer's wall clock reads it. It may be called on
// a nil Communicator (the links of unit tests have none): that clock is exact.
func (c *Communicator) unixNano(t time.Time) int64 {
	if c == nil || c.wallOffset == nil {
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
	c.links = newLinks(c, ln)
	c.log = c.log.With("peer", c.id)
	c.life, c.endLife = context.WithCancel(context.Background())
	m := newMachine(c.id, time.Duration(welcome.HeartbeatInterval), cfg.MasterTimeout, time.Now())
	m.incarnation = welcome.Incarnation

	c.wg.Add(4)
	go c.run(m)
	go c.readMaster(mc, 0)
	go c.links.accept()
	go c.wiring()

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

// hello runs the handshake on conn and introduces this peer (introduce).
func (c *Communicator) hello(ctx context.Context, conn net.Conn, resume *wire.Resume) (*wire.Welcome, wire.SessionID, error) {
	if err := c.handshake(ctx, conn); err != nil {
		return nil, wire.SessionID{}, err
	}
	return c.introduce(ctx, conn, resume)
}

// handshake runs the connection handshake with the master on conn.
func (c *Communicator) handshake(ctx context.Context, conn net.Conn) error {
	conn.SetDeadline(c.deadline(ctx))
	defer conn.SetDeadline(time.Time{})
	if err := wire.Exchange(conn, wire.KindControl); err != nil {
		if errors.Is(err, wire.ErrVersion) {
			return fmt.Errorf("pccl: master handshake: %w: %w: %w (peer and master come from different releases)", ErrKicked, ErrRefused, err)
		}
		return fmt.Errorf("pccl: master handshake: %w", err)
	}
	return nil
}

// deadline bounds one exchange with the master: MasterTimeout, or ctx's deadline if sooner.
func (c *Communicator) deadline(ctx context.Context) time.Time {
	deadline := time.Now().Add(c.cfg.MasterTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return deadline
}

// introduce sends this peer's Hello on conn, after the handshake, and returns the master's Welcome
// and the session it opens. resume, if set, reports what this peer holds to a master it reconnects to.
func (c *Communicator) introduce(ctx context.Context, conn net.Conn, resume *wire.Resume) (*wire.Welcome, wire.SessionID, error) {
	var sid wire.SessionID
	conn.SetDeadline(c.deadline(ctx))
	defer conn.SetDeadline(time.Time{})
	nics := c.cfg.NICs
	if c.site != nil {
		nics = c.site.addrs
	}
	h := &wire.Hello{Token: c.cfg.Token, Addr: c.adv, Site: c.cfg.Site, Peer: c.cfg.ID, Group: c.cfg.Group, NICs: nics, Resume: resume,
		Published: c.cfg.AdvertiseAddr != ""}
	if _, err := conn.Write(wire.AppendFrame(nil, h)); err != nil {
		return nil, sid, fmt.Errorf("pccl: send hello: %w: %w", ErrMasterLost, err)
	}
	for {
		msg, _, err := wire.ReadFrame(conn, 0, nil)
		if err != nil {
			return nil, sid, fmt.Errorf("pccl: waiting for welcome: %w: %w", ErrMasterLost, err)
		}
		switch m := msg.(type) {
		case *wire.SessionStart:
			sid = m.ID
		case *wire.Welcome:
			return m, sid, nil
		case *wire.Kick:
			return nil, sid, kickError(m)
		default:
			return nil, sid, fmt.Errorf("pccl: master answered hello with %T", msg)
		}
	}
}

// resumeSession asks the master on conn, after the handshake, to move this peer's session to it, and
// returns the master's answer.
func (c *Communicator) resumeSession(ctx context.Context, conn net.Conn, id wire.SessionID) (*wire.SessionResumed, error) {
	conn.SetDeadline(c.deadline(ctx))
	defer conn.SetDeadline(time.Time{})
	req := &wire.SessionResume{Token: c.cfg.Token, Peer: c.id, ID: id, Recv: c.ctl.recv.Load()}
	if _, err := conn.Write(wire.AppendFrame(nil, req)); err != nil {
		return nil, err
	}
	msg, _, err := wire.ReadFrame(conn, 0, nil)
	if err != nil {
		return nil, err
	}
	r, ok := msg.(*wire.SessionResumed)
	if !ok {
		return nil, fmt.Errorf("pccl: master answered a session resumption with %T", msg)
	}
	return r, nil
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
	// LinksSameNAT, LinksReversed, LinksPunched and LinksRelayed count the connections this peer
	// opened to peers behind NAT (rendezvous.go): dialled directly behind the same NAT, called back,
	// over a punched QUIC path, and through the master's relay.
	LinksSameNAT, LinksReversed, LinksPunched, LinksRelayed uint64
}

// Stats returns the communicator's counters. It may be called from any goroutine.
func (c *Communicator) Stats() Stats {
	s := Stats{LinksOpened: c.links.opened.Load(), LinksAccepted: c.links.accepted.Load(),
		LinksSameNAT: c.rv.direct.Load(), LinksReversed: c.rv.counts[wire.RendezvousReverse].Load(),
		LinksPunched: c.rv.counts[wire.RendezvousPunch].Load(), LinksRelayed: c.rv.counts[wire.RendezvousRelay].Load()}
	if t := c.site; t != nil {
		s.SiteCollectives, s.SiteGenerations, s.SiteFailovers = t.collectives.Load(), t.generations.Load(), t.failovers.Load()
		s.SiteBytes = t.retiredBytes.Load()
		s.SitePlanned, s.SitePlan = t.plans.stats()
		if f := t.peek(); f != nil {
			s.SiteBytes += f.ep.ReceivedBytes()
		}
	}
	return s
}

// newCall returns a fresh call id and the channel its replies arrive on.
func (c *Communicator) newCall() (uint64, chan reply) {
	return c.nextCall.Add(1), make(chan reply, 2)
}

// submit hands r to the run goroutine, or returns why the communicator is dead.
func (c *Communicator) submit(r request) error {
	select {
	case c.reqs <- r:
		return nil
	case <-c.done:
		return c.fatal
	}
}

// post hands an input without a reply to the run goroutine; it is dropped once the communicator is
// closed.
func (c *Communicator) post(in any) {
	select {
	case c.reqs <- request{in: in}:
	case <-c.stop:
	}
}

// await waits for the final reply to call. If ctx ends first the call is cancelled and ctx's error
// returned; if the communicator dies, its fatal error.
func (c *Communicator) await(ctx context.Context, call uint64, ch chan reply) (reply, error) {
	for {
		select {
		case r := <-ch:
			if r.start != nil {
				continue
			}
			return r, nil
		case <-c.done:
			select {
			case r := <-ch:
				if r.start == nil {
					return r, nil
				}
			default:
			}
			return reply{}, c.fatal
		case <-ctx.Done():
			c.post(cancelCall{call: call, reason: ctx.Err()})
			return reply{}, ctx.Err()
		}
	}
}

// ask submits in, registered for call, and waits for its final reply; the reply's error if any.
func (c *Communicator) ask(ctx context.Context, what string, call uint64, ch chan reply, in any) (reply, error) {
	if err := c.submit(request{in: in, reply: ch}); err != nil {
		return reply{}, err
	}
	r, err := c.await(ctx, call, ch)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return r, fmt.Errorf("pccl: %s: %w", what, err)
		}
		return r, err
	}
	return r, r.err
}

// run owns the machine: it feeds it every input in order and carries out its actions.
func (c *Communicator) run(m *machine) {
	defer c.wg.Done()
	every := max(m.hbEvery/4, time.Millisecond)
	if every > 50*time.Millisecond {
		every = 50 * time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		var in any
		select {
		case r := <-c.reqs:
			if r.reply != nil {
				if call := callOf(r.in); call != 0 {
					c.calls[call] = &callEntry{ch: r.reply, abort: r.abort}
				}
			}
			in = r.in
			if f, ok := in.(fromConn); ok {
				if f.gen != c.gen {
					continue // from a master connection that was replaced
				}
				if _, ok := f.in.(masterIn); ok && !c.ctl.received() {
					continue // arrived on the connection before, then again on this one
				}
				in = f.in
			}
		case <-tick.C:
			in = tickIn{}
		case <-c.stop:
			return
		}
		now := time.Now()
		acts := m.step(now, in)
		c.publish(m) // before the replies: a call that returns sees the ring it brought about
		c.apply(m, now, acts)
		if cc, ok := in.(cancelCall); ok && !m.hasOp(cc.call) {
			delete(c.calls, cc.call) // nobody waits for its answer any more
		}
		c.publish(m)
	}
}

// publish stores the view accessors read when the machine's ring, epoch or stats changed.
func (c *Communicator) publish(m *machine) {
	if v := c.view.Load(); v.epoch != m.epoch || !slices.Equal(v.ring, m.ring) || v.run != m.run || v.optimize != m.opt.stats {
		c.view.Store(&view{epoch: m.epoch, ring: slices.Clone(m.ring), run: m.run, optimize: m.opt.stats})
	}
}

// apply carries out the machine's actions in order.
func (c *Communicator) apply(m *machine, now time.Time, acts []any) {
	for len(acts) > 0 {
		a := acts[0]
		acts = acts[1:]
		switch a := a.(type) {
		case sendAct:
			if err := c.write(now, a.msg); err != nil {
				acts = append(acts, m.step(now, writeFailed{err})...)
			}
		case replyAct:
			e := c.calls[a.r.call]
			if e == nil {
				continue
			}
			select {
			case e.ch <- a.r:
			default:
				c.log.Error("reply dropped: the call's channel is full", "call", a.r.call)
			}
			if a.r.start == nil {
				delete(c.calls, a.r.call)
			}
		case wireAct:
			replace(c.connects, a.m)
		case retireAct:
			c.links.retire(a.ring)
		case abortAct:
			if e := c.calls[a.call]; e != nil && e.abort != nil {
				e.abort(a.err)
			}
		case tombstoneAct:
			c.links.tombstone(a.seq)
		case measureAct:
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				rate, lat := c.measure(c.life, a.r)
				c.post(measuredIn{round: a.r.Round, to: a.r.Target.ID, rate: rate, latency: lat})
			}()
		case dieAct:
			if a.err != ErrClosed {
				c.log.Warn("communicator failed", "err", a.err)
			}
			c.fatal = a.err
			close(c.done)
			c.endLife()
			c.masterConn().Close()
		case redialAct:
			c.wg.Add(1)
			go c.redial(a.resume)
		case adoptAct:
			var err error
			if a.resumed {
				err = c.ctl.resume(a.conn, a.masterRecv, a.masterNext)
				c.log.Info("resumed the session with the master on a new connection")
			} else {
				c.ctl.start(a.session)
				c.log.Warn("the master restarted; reconnected with this peer's state")
			}
			c.masterMu.Lock()
			old := c.master
			c.master = a.conn
			c.masterMu.Unlock()
			old.Close()
			c.gen++
			if err != nil {
				acts = append(acts, m.step(now, writeFailed{err})...)
			}
			c.wg.Add(1)
			go c.readMaster(a.conn, c.gen)
		case callAct:
			c.wg.Add(1)
			go c.answer(a.call)
		case noticeAct:
			c.log.Warn("the master says: " + a.text)
		case dropConnAct:
			if a.conn != nil {
				a.conn.Close()
			}
		}
	}
}

// write sends one message to the master, numbered in the session. A failure is the connection's:
// the session keeps the frame for the next one.
func (c *Communicator) write(now time.Time, msg wire.Message) error {
	b, err := c.ctl.frame(c.wbuf[:0], msg)
	c.wbuf = b
	if err != nil {
		return err
	}
	mc := c.masterConn()
	mc.SetWriteDeadline(now.Add(c.cfg.MasterTimeout))
	_, err = mc.Write(b)
	return err
}

// masterConn returns the master connection in use.
func (c *Communicator) masterConn() net.Conn {
	c.masterMu.Lock()
	defer c.masterMu.Unlock()
	return c.master
}

// fromConn is an input from the reader of master connection generation gen; run drops it once that
// connection has been replaced.
type fromConn struct {
	gen uint64
	in  any
}

// readMaster posts the messages of master connection mc (generation gen) to run until it ends.
func (c *Communicator) readMaster(mc net.Conn, gen uint64) {
	defer c.wg.Done()
	var buf []byte
	for {
		msg, b, err := wire.ReadFrame(mc, 0, buf)
		buf = b
		if err != nil {
			c.post(fromConn{gen, masterLost{err}})
			return
		}
		if a, ok := msg.(*wire.SessionAck); ok {
			c.ctl.ack(a.Recv)
			continue
		}
		c.post(fromConn{gen, masterIn{msg}})
	}
}

// heldState is the shared state this peer holds after its last successful sync, for Resume reports.
type heldState struct {
	revision uint64
	digest   []byte // sharedstate.EncodeDigest
}

// redial dials the master once and resumes the session on the new connection; if the master does not
// know the session, it sends a Hello reporting resume and the shared state held. It posts the result
// to run. A connection that run no longer takes is closed.
func (c *Communicator) redial(resume *wire.Resume) {
	defer c.wg.Done()
	if h := c.held.Load(); h != nil {
		resume.Revision, resume.Digest = h.revision, h.digest
	}
	ctx, cancel := context.WithTimeout(c.life, c.cfg.DialTimeout)
	defer cancel()
	var res redialedIn
	conn, err := c.dialMaster(ctx, c.links.ln)
	if err == nil {
		err = c.handshake(ctx, conn)
	}
	if err == nil {
		res.conn = conn
		if id, ok := c.ctl.ident(); ok {
			// The answer may take longer than a dial: a master that is paused answers when it runs
			// again, and once it has read the request it has moved the session here.
			var r *wire.SessionResumed
			r, err = c.resumeSession(c.life, conn, id)
			if err == nil && r.OK {
				res.resumed, res.masterRecv, res.masterNext = true, r.Recv, r.Next
			}
		}
		if err == nil && !res.resumed {
			res.welcome, res.session, err = c.introduce(ctx, conn, resume)
			if err == nil {
				c.rv.welcomed(res.welcome)
			}
		}
	}
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		res.conn = nil
	}
	res.err, res.kicked = err, errors.Is(err, ErrKicked)
	select {
	case c.reqs <- request{in: res}:
	case <-c.stop:
		if res.conn != nil {
			res.conn.Close()
		}
	}
}

// replace puts v in a one-slot channel, dropping a stale value.
func replace[T any](ch chan T, v T) {
	for {
		select {
		case ch <- v:
			return
		default:
			select {
			case <-ch:
			default:
			}
		}
	}
}

// wiring answers the master's Connect requests: open the links of the new ring, then report.
func (c *Communicator) wiring() {
	defer c.wg.Done()
	for {
		select {
		case <-c.stop:
			return
		case m := <-c.connects:
			failed, err := c.links.wire(m)
			if err != nil {
				c.log.Warn("wiring failed", "epoch", m.Epoch, "err", err)
			}
			c.post(wiredIn{epoch: m.Epoch, failed: failed, err: err})
		}
	}
}

// UpdateTopology is the membership step of a training loop. Every accepted peer calls it; together
// they admit the registered newcomers and re-wire the ring after failures. It returns once the new ring
// is in force (Rank and WorldSize may have changed). It needs no collective of this peer in flight
// (else ErrBusy). If ctx ends first, the vote stays cast and the next call waits for its answer.
func (c *Communicator) UpdateTopology(ctx context.Context) error {
	call, ch := c.newCall()
	_, err := c.ask(ctx, "update topology", call, ch, topologyCall{call: call, rewire: c.links.dirty()})
	return cleanError(err)
}

// Rewire is UpdateTopology without admission: it re-wires the ring of the accepted peers (without the
// peers that left) and keeps peers waiting in Connect waiting, as PCCL's repair after a failed
// collective does. Every accepted peer must call Rewire or UpdateTopology; a round in which any peer
// called Rewire admits nobody, so newcomers join only at an UpdateTopology of every peer. It needs no
// collective of this peer in flight (else ErrBusy).
func (c *Communicator) Rewire(ctx context.Context) error {
	call, ch := c.newCall()
	_, err := c.ask(ctx, "rewire", call, ch, topologyCall{call: call, rewire: c.links.dirty(), noAdmit: true})
	return cleanError(err)
}

// ArePeersPending asks whether peers wait to be accepted. Every accepted peer must call it; all get
// the same answer. It may overlap running collectives.
func (c *Communicator) ArePeersPending(ctx context.Context) (bool, error) {
	call, ch := c.newCall()
	r, err := c.ask(ctx, "are peers pending", call, ch, pendingCall{call: call})
	return r.answer, cleanError(err)
}

// Leave leaves the group gracefully at its safe point, in place of this peer's ArePeersPending: the
// master answers every other peer's ArePeersPending true and removes this one, so the others re-wire
// at their UpdateTopology without aborting a collective (a departure at a spot instance's
// preemption notice, say). Every other accepted peer must be in ArePeersPending too, as in a training
// loop's membership step; if a collective of the group is under way instead, the peer leaves at once,
// as Close would make it. Leave then closes the Communicator; it returns ctx's error if the master did
// not answer in time (the Communicator is closed all the same).
func (c *Communicator) Leave(ctx context.Context) error {
	call, ch := c.newCall()
	_, err := c.ask(ctx, "leave", call, ch, pendingCall{call: call, leave: true})
	c.Close()
	return cleanError(err)
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
		c.links.close()
		c.wg.Wait()
		c.site.close()
		c.stopGossip()
	})
	return nil
}
