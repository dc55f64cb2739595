package pccl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// Communicator is one peer's membership in a run. Create it with Connect; Close it when done.
//
// Goroutines: a reader of the master connection (dispatches messages), a heartbeat sender, the link
// acceptor, the wiring loop (answers Connect) and one reader per incoming link. Fields under mu are
// shared between them and the callers' goroutines.
type Communicator struct {
	cfg Config
	log *slog.Logger
	id  uint64

	master net.Conn
	wmu    sync.Mutex // serialises writes to master
	wbuf   []byte     // guarded by wmu

	links *links

	connects  chan *wire.Connect      // reader -> wiring loop, latest wins
	topoCh    chan *wire.Topology     // reader -> UpdateTopology/Connect waiter
	pendCh    chan *wire.Pending      // reader -> ArePeersPending waiter
	syncCh    chan wire.Message       // reader -> SyncSharedState waiter (SyncPlan, SyncComplete)
	measureCh chan *wire.MeasureRound // reader -> OptimizeTopology caller
	done      chan struct{}           // closed when the communicator dies (Close, kick, master lost)
	hbEvery   time.Duration

	majorMu sync.Mutex // one UpdateTopology at a time
	pendMu  sync.Mutex // one ArePeersPending at a time

	mu              sync.Mutex
	fatal           error               // why done was closed
	epoch           uint64              // epoch of the ring in force
	ring            []uint64            // ring in force
	ops             map[uint64]*op      // collectives in flight by tag
	topoOutstanding bool                // a VoteTopology awaits its Topology
	pendOutstanding bool                // a VotePending awaits its Pending
	lastHeard       time.Time           // last message from the master
	serving         *State              // state donors read during a sync, nil otherwise
	servingHashes   map[string]uint64   // its hashes at vote time
	servingLeaves   map[string][]uint64 // and the leaves of their hash trees
	syncActive      bool                // a SyncSharedState call waits for the master
	lastOptimize    OptimizeStats
	serveConns      map[net.Conn]bool // connections serving a state range now
	serveWG         sync.WaitGroup    // one per range being served

	closeOnce sync.Once
	wg        sync.WaitGroup
}

// Connect joins the run: it registers with the master, waits until the accepted peers admit it (at
// their next UpdateTopology; at once if it is the first peer) and returns with the ring wired.
func Connect(ctx context.Context, cfg Config) (*Communicator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Communicator{
		cfg:       cfg,
		log:       cfg.Logger,
		connects:  make(chan *wire.Connect, 1),
		topoCh:    make(chan *wire.Topology, 1),
		pendCh:    make(chan *wire.Pending, 1),
		syncCh:    make(chan wire.Message, 1),
		measureCh: make(chan *wire.MeasureRound, 1),
		done:      make(chan struct{}),
		ops:       map[uint64]*op{},
	}
	ln, err := cfg.Transport.Listen(cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("pccl: listen for links on %s: %w", cfg.ListenAddr, err)
	}
	adv := cfg.AdvertiseAddr
	if adv == "" {
		adv = ln.Addr().String()
	}
	dctx, cancel := context.WithTimeout(ctx, cfg.MasterTimeout)
	mc, err := cfg.Transport.Dial(dctx, cfg.Master)
	cancel()
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("pccl: dial master %s: %w: %w", cfg.Master, ErrMasterLost, err)
	}
	c.master = mc
	welcome, err := c.hello(ctx, adv)
	if err != nil {
		ln.Close()
		mc.Close()
		return nil, err
	}
	c.id = welcome.Peer
	c.hbEvery = time.Duration(welcome.HeartbeatInterval)
	c.lastHeard = time.Now()
	c.links = newLinks(c, ln)
	c.log = c.log.With("peer", c.id)

	c.wg.Add(4)
	go c.readMaster()
	go c.heartbeat()
	go c.links.accept()
	go c.wiring()

	select {
	case <-c.topoCh:
		return c, nil
	case <-c.done:
		err := c.err()
		c.Close()
		return nil, err
	case <-ctx.Done():
		c.Close()
		return nil, fmt.Errorf("pccl: waiting to be accepted: %w", ctx.Err())
	}
}

// hello runs the handshake and returns the master's Welcome.
func (c *Communicator) hello(ctx context.Context, adv string) (*wire.Welcome, error) {
	deadline := time.Now().Add(c.cfg.MasterTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.master.SetDeadline(deadline)
	defer c.master.SetDeadline(time.Time{})
	if err := wire.Exchange(c.master, wire.KindControl); err != nil {
		return nil, fmt.Errorf("pccl: master handshake: %w", err)
	}
	if _, err := c.master.Write(wire.AppendFrame(nil, &wire.Hello{Token: c.cfg.Token, Addr: adv, Site: c.cfg.Site})); err != nil {
		return nil, fmt.Errorf("pccl: send hello: %w: %w", ErrMasterLost, err)
	}
	msg, _, err := wire.ReadFrame(c.master, 0, nil)
	if err != nil {
		return nil, fmt.Errorf("pccl: waiting for welcome: %w: %w", ErrMasterLost, err)
	}
	switch m := msg.(type) {
	case *wire.Welcome:
		return m, nil
	case *wire.Kick:
		return nil, fmt.Errorf("pccl: %w: %s", ErrKicked, m.Reason)
	default:
		return nil, fmt.Errorf("pccl: master answered hello with %T", msg)
	}
}

// Logger returns the communicator's logger (Config.Logger, tagged with the peer id).
func (c *Communicator) Logger() *slog.Logger { return c.log }

// ID returns this peer's id, assigned by the master.
func (c *Communicator) ID() uint64 { return c.id }

// Rank returns this peer's position in the ring in force.
func (c *Communicator) Rank() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Index(c.ring, c.id)
}

// WorldSize returns the number of peers in the ring in force.
func (c *Communicator) WorldSize() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ring)
}

// Epoch returns the epoch of the ring in force; it changes with every membership or ring change.
func (c *Communicator) Epoch() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// Ring returns the peer ids of the ring in force, in ring order.
func (c *Communicator) Ring() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.ring)
}

func (c *Communicator) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fatal
}

// die records why the communicator cannot go on and wakes every waiter.
func (c *Communicator) die(err error) {
	c.mu.Lock()
	if c.fatal == nil {
		c.fatal = err
		close(c.done)
	}
	c.mu.Unlock()
}

// send writes one message to the master.
func (c *Communicator) send(m wire.Message) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbuf = wire.AppendFrame(c.wbuf[:0], m)
	c.master.SetWriteDeadline(time.Now().Add(c.cfg.MasterTimeout))
	if _, err := c.master.Write(c.wbuf); err != nil {
		// The master may have closed the connection after telling us why (a Kick): let the reader
		// drain what it sent, and take its verdict.
		c.master.SetReadDeadline(time.Now().Add(time.Second))
		select {
		case <-c.done:
		case <-time.After(2 * time.Second):
			c.die(fmt.Errorf("pccl: write to master: %w: %w", ErrMasterLost, err))
		}
		return c.err()
	}
	return nil
}

// readMaster dispatches the master's messages until the connection ends.
func (c *Communicator) readMaster() {
	defer c.wg.Done()
	var buf []byte
	for {
		msg, b, err := wire.ReadFrame(c.master, 0, buf)
		buf = b
		if err != nil {
			select {
			case <-c.done:
			default:
				c.die(fmt.Errorf("pccl: master connection: %w: %w", ErrMasterLost, err))
			}
			return
		}
		c.mu.Lock()
		c.lastHeard = time.Now()
		c.mu.Unlock()
		switch m := msg.(type) {
		case *wire.HeartbeatAck:
		case *wire.Connect:
			select {
			case <-c.connects: // a newer round replaces one not yet started
			default:
			}
			c.connects <- m
		case *wire.Topology:
			c.mu.Lock()
			c.epoch, c.ring = m.Epoch, m.Ring
			c.topoOutstanding = false
			c.mu.Unlock()
			c.links.retire(m.Ring)
			replace(c.topoCh, m)
		case *wire.Pending:
			c.mu.Lock()
			c.pendOutstanding = false
			c.mu.Unlock()
			replace(c.pendCh, m)
		case *wire.Commence:
			c.mu.Lock()
			o := c.ops[m.Tag]
			c.mu.Unlock()
			if o == nil || !o.commence(m) {
				// Nobody waits for it (the vote was withdrawn): drop its frames.
				c.links.tombstone(m.Seq)
			}
		case *wire.Outcome:
			c.mu.Lock()
			o := c.ops[m.Tag]
			c.mu.Unlock()
			if o != nil {
				o.finish(m)
			}
		case *wire.MeasureRound:
			replace(c.measureCh, m)
		case *wire.SyncPlan, *wire.SyncComplete:
			c.syncMessage(m)
		case *wire.Kick:
			c.log.Warn("kicked by the master", "reason", m.Reason)
			c.die(fmt.Errorf("pccl: %w: %s", ErrKicked, m.Reason))
			return
		default:
			c.die(fmt.Errorf("pccl: master sent unexpected %T", msg))
			return
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

// heartbeat keeps the master informed that we are alive and notices when it is not.
func (c *Communicator) heartbeat() {
	defer c.wg.Done()
	t := time.NewTicker(c.hbEvery)
	defer t.Stop()
	var seq uint64
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		c.mu.Lock()
		silent := time.Since(c.lastHeard)
		c.mu.Unlock()
		if silent > c.cfg.MasterTimeout {
			c.die(fmt.Errorf("pccl: %w: no answer for %v", ErrMasterLost, silent.Round(time.Millisecond)))
			c.master.Close()
			return
		}
		seq++
		if c.send(&wire.Heartbeat{Seq: seq}) != nil {
			return
		}
	}
}

// wiring answers the master's Connect requests: open the links of the new ring, then report.
func (c *Communicator) wiring() {
	defer c.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case m := <-c.connects:
			failed, err := c.links.wire(m)
			rep := &wire.LinksReady{Epoch: m.Epoch, OK: err == nil}
			if err != nil {
				c.log.Warn("wiring failed", "epoch", m.Epoch, "err", err)
				rep.Failed, rep.Detail = failed, err.Error()
			}
			if c.send(rep) != nil {
				return
			}
		}
	}
}

// UpdateTopology is the membership step of a training loop. Every accepted peer calls it; together
// they admit the registered newcomers and re-wire the ring after failures. It returns once the new ring
// is in force (Rank and WorldSize may have changed). It needs no collective of this peer in flight
// (else ErrBusy). If ctx ends first, the vote stays cast and the next call waits for its answer.
func (c *Communicator) UpdateTopology(ctx context.Context) error {
	c.majorMu.Lock()
	defer c.majorMu.Unlock()
	c.mu.Lock()
	if err := c.idle("update topology"); err != nil {
		c.mu.Unlock()
		return err
	}
	vote := !c.topoOutstanding
	if vote {
		c.topoOutstanding = true
		select {
		case <-c.topoCh:
		default:
		}
	}
	c.mu.Unlock()
	if vote {
		if err := c.send(&wire.VoteTopology{Rewire: c.links.dirty()}); err != nil {
			return err
		}
	}
	select {
	case <-c.topoCh:
		return nil
	case <-c.done:
		return c.err()
	case <-ctx.Done():
		return fmt.Errorf("pccl: update topology: %w", ctx.Err())
	}
}

// idle returns why a major operation (UpdateTopology, OptimizeTopology, SyncSharedState) cannot
// start: the communicator is dead, or collectives of this peer are in flight. c.mu must be held.
func (c *Communicator) idle(what string) error {
	if c.fatal != nil {
		return c.fatal
	}
	if n := len(c.ops); n > 0 {
		return fmt.Errorf("pccl: %s: %w: %d", what, ErrBusy, n)
	}
	return nil
}

// ArePeersPending asks whether peers wait to be accepted. Every accepted peer must call it; all get
// the same answer. It may overlap running collectives.
func (c *Communicator) ArePeersPending(ctx context.Context) (bool, error) {
	c.pendMu.Lock()
	defer c.pendMu.Unlock()
	c.mu.Lock()
	if c.fatal != nil {
		c.mu.Unlock()
		return false, c.fatal
	}
	vote := !c.pendOutstanding
	if vote {
		c.pendOutstanding = true
		select {
		case <-c.pendCh:
		default:
		}
	}
	c.mu.Unlock()
	if vote {
		if err := c.send(&wire.VotePending{}); err != nil {
			return false, err
		}
	}
	select {
	case p := <-c.pendCh:
		return p.Answer, nil
	case <-c.done:
		return false, c.err()
	case <-ctx.Done():
		return false, fmt.Errorf("pccl: are peers pending: %w", ctx.Err())
	}
}

// Close leaves the run: it tells the master, closes every connection and waits for the
// communicator's goroutines. Collectives in flight fail with ErrClosed. Close is idempotent.
func (c *Communicator) Close() error {
	c.closeOnce.Do(func() {
		select {
		case <-c.done:
		default:
			c.send(&wire.Bye{})
		}
		c.die(ErrClosed)
		c.master.Close()
		c.links.close()
		c.wg.Wait()
	})
	return nil
}

func isClosedErr(err error) bool {
	return errors.Is(err, net.ErrClosed)
}
