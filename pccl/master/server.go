package master

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/concord-ccl/concord/atsp"
	"github.com/concord-ccl/concord/internal/simhook"
	"github.com/concord-ccl/concord/internal/wire"
)

// ServerConfig configures a Server. The zero value works.
type ServerConfig struct {
	// Config is the protocol configuration (run token, MinPeers, heartbeat timing).
	Config Config
	// Logger receives one line per notable event. Nil discards.
	Logger *slog.Logger
	// MaxFrame limits the size of a control frame in bytes. Zero means wire.DefaultMaxFrame.
	MaxFrame int
	// SendQueue is how many messages may wait for a slow peer before it is dropped. Zero means 1024.
	SendQueue int
	// HandshakeRate is how many new connections per second one source address (IP) may open; beyond
	// it (after a burst of HandshakeBurst) connections are closed at once. Zero means 50.
	HandshakeRate float64
	// HandshakeBurst is the burst of HandshakeRate. Zero means 200.
	HandshakeBurst int
	// OnEvent, if set, is called (on the server's event loop) for every event the machine notes.
	OnEvent func(Event)
	// Gossip, if set, runs a gossip failure detector with the peers (they join it at GossipAddr): a
	// peer it declares dead is kicked at once, even while its control connection stays open. Nil: off.
	Gossip *GossipConfig
}

// Server runs the master: it accepts peer connections, feeds their messages to a Machine from one
// goroutine, and carries out the Machine's actions.
//
// Goroutines: one event loop owns the Machine and the connection table; each connection has a reader
// (frames -> event loop) and a writer (queue -> socket). Nothing else touches the Machine.
type Server struct {
	cfg ServerConfig
	log *slog.Logger

	in    chan Input
	snaps chan chan Snapshot

	improveStop map[GroupID]context.CancelFunc // owned by the event loop: stop each group's background ring search

	mu    sync.Mutex // guards conns and next (the accept loop adds, the event loop removes)
	conns map[ConnID]*peerConn
	next  ConnID
	wg    sync.WaitGroup

	gossipReady chan struct{} // closed once Serve started the gossip member (or did not)
	gossipAddr  string        // written before gossipReady is closed
}

type peerConn struct {
	id   ConnID
	conn net.Conn
	out  chan wire.Message // nil message: close after what is queued
	once sync.Once
}

// Validate reports the first invalid field, the protocol configuration's included.
func (c ServerConfig) Validate() error {
	switch {
	case c.MaxFrame < 0 || c.MaxFrame > maxFrameLimit:
		return fmt.Errorf("master: ServerConfig.MaxFrame is %d, must be in [0, %d]", c.MaxFrame, maxFrameLimit)
	case c.SendQueue < 0:
		return fmt.Errorf("master: ServerConfig.SendQueue is %d, must be >= 0", c.SendQueue)
	case c.HandshakeRate < 0:
		return fmt.Errorf("master: ServerConfig.HandshakeRate is %v, must be >= 0", c.HandshakeRate)
	case c.HandshakeBurst < 0:
		return fmt.Errorf("master: ServerConfig.HandshakeBurst is %d, must be >= 0", c.HandshakeBurst)
	}
	return c.Config.Validate()
}

// maxFrameLimit bounds ServerConfig.MaxFrame: one control frame may not hold more than this.
const maxFrameLimit = 1 << 30

// firstFrameTimeout bounds the wait for a connection's handshake and first message (its Hello).
const firstFrameTimeout = 10 * time.Second

// NewServer returns a server; Serve starts it.
func NewServer(cfg ServerConfig) *Server {
	if cfg.SendQueue == 0 {
		cfg.SendQueue = 1024
	}
	if cfg.HandshakeRate == 0 {
		cfg.HandshakeRate = defaultHandshakeRate
	}
	if cfg.HandshakeBurst == 0 {
		cfg.HandshakeBurst = defaultHandshakeBurst
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: log, in: make(chan Input, 1024), snaps: make(chan chan Snapshot),
		conns: map[ConnID]*peerConn{}, improveStop: map[GroupID]context.CancelFunc{},
		gossipReady: make(chan struct{})}
}

// Serve accepts peers on ln until ctx is done, then closes ln and every connection and returns once all
// its goroutines have finished. It returns nil after ctx ends, or the listener's error.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if err := s.cfg.Validate(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg := s.cfg.Config
	for cfg.Incarnation == 0 {
		// A restarted master must not hand out the epochs of the one before: draw a fresh incarnation.
		cfg.Incarnation = uint64(rand.Uint32())
	}
	m := New(cfg)
	g, err := s.startGossip(ctx, cfg.Incarnation)
	if err != nil {
		ln.Close()
		return err
	}
	if g != nil {
		defer g.Close()
	}
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		s.loop(ctx, m, simhook.GateOf(ctx))
	}()
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	limit := newRateLimiter(s.cfg.HandshakeRate, s.cfg.HandshakeBurst)
	for {
		c, aerr := ln.Accept()
		if aerr != nil {
			if ctx.Err() == nil {
				err = fmt.Errorf("master: accept: %w", aerr)
			}
			break
		}
		if src := sourceOf(c.RemoteAddr()); !limit.allow(src, time.Now()) {
			s.log.Debug("connection refused: handshake rate", "source", src)
			c.Close()
			continue
		}
		s.wg.Add(1)
		go s.handle(ctx, c)
	}
	cancel()
	<-loopDone
	s.mu.Lock()
	for _, pc := range s.conns {
		pc.conn.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// Snapshot returns the current state. It blocks until the event loop answers; after Serve returned it
// returns an empty Snapshot.
func (s *Server) Snapshot() Snapshot {
	ch := make(chan Snapshot, 1)
	select {
	case s.snaps <- ch:
		return <-ch
	case <-time.After(5 * time.Second):
		return Snapshot{Time: time.Now()}
	}
}

// loop is the event loop. gate, nil but in the simulator, pauses it as a SIGSTOP would.
func (s *Server) loop(ctx context.Context, m *Machine, gate *simhook.Gate) {
	cfg := m.cfg
	interval := cfg.HeartbeatInterval / 4
	tick := time.NewTicker(interval)
	defer tick.Stop()
	lastTick := time.Now()
	for {
		var in Input
		var paused <-chan struct{}
		if gate != nil {
			paused = gate.Shutting()
		}
		select {
		case <-ctx.Done():
			return
		case <-paused:
			gate.Wait(ctx)
			continue
		case ch := <-s.snaps:
			ch <- m.Snapshot(time.Now())
			continue
		case <-tick.C:
			in = Tick{}
			now := time.Now()
			if late := now.Sub(lastTick) - interval; late > stallThreshold(interval) {
				// The master itself did not run: read what the peers sent meanwhile, then extend
				// their deadlines by the stall before anyone is judged.
				s.drain(ctx, m)
				in = Stalled{Gap: late}
			}
			lastTick = now
		case in = <-s.in:
		}
		for _, a := range m.Step(time.Now(), in) {
			s.act(ctx, a)
		}
	}
}

// drain feeds the machine every input the connection readers have already queued, without waiting
// for more.
func (s *Server) drain(ctx context.Context, m *Machine) {
	for {
		select {
		case in := <-s.in:
			for _, a := range m.Step(time.Now(), in) {
				s.act(ctx, a)
			}
		default:
			return
		}
	}
}

// solve runs a ring solve off the event loop and feeds the result back, then keeps improving in the
// background until ctx ends, the budget runs out or a newer solve of the same group starts.
func (s *Server) solve(ctx context.Context, req Solve) {
	if stop := s.improveStop[req.Group]; stop != nil {
		stop()
	}
	ictx, stop := context.WithTimeout(ctx, req.Budget+req.ImproveBudget)
	s.improveStop[req.Group] = stop
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer stop()
		ring := func(t atsp.Tour) []PeerID {
			out := make([]PeerID, len(t))
			for i, k := range t {
				out[i] = req.Nodes[k]
			}
			return out
		}
		// Level one: the best bottleneck. Level two: the shortest fill time among rings whose
		// bottleneck is within the tolerance of it.
		tour, sc, err := atsp.Solve(req.Cost, atsp.Options{Objective: atsp.Bottleneck, Budget: req.Budget / 2, Seed: int64(req.ID)})
		restricted := req.Hop
		if err == nil {
			restricted = Restrict(req.Cost, req.Hop, sc.Bottleneck, req.Tol)
			if t2, _, err2 := atsp.Solve(restricted, atsp.Options{Objective: atsp.Total, Budget: req.Budget / 2, Seed: int64(req.ID)}); err2 == nil {
				tour = t2
			}
		}
		var solved []PeerID
		if err == nil {
			solved = ring(tour)
		} else {
			tour = atsp.Tour(req.Start)
			s.log.Warn("ring solve failed", "err", err)
		}
		select {
		case s.in <- Solved{ID: req.ID, Ring: solved}:
		case <-ctx.Done():
			return
		}
		for r := range atsp.Improve(ictx, restricted, tour, atsp.Options{Objective: atsp.Total, Seed: int64(req.ID) + 1}) {
			select {
			case s.in <- Improved{Group: req.Group, Ring: ring(r.Tour)}:
			case <-ictx.Done():
			}
		}
	}()
}

// ForceRing makes the next OptimizeTopology of the default group install ring (a permutation of the
// ring in force) without measuring. It is meant for operators and benchmarks.
func (s *Server) ForceRing(ring []PeerID) {
	s.in <- ForceRing{Ring: ring}
}

func (s *Server) act(ctx context.Context, a Action) {
	switch a := a.(type) {
	case Solve:
		s.solve(ctx, a)
	case Send:
		s.mu.Lock()
		pc := s.conns[a.To]
		s.mu.Unlock()
		if pc == nil {
			return
		}
		select {
		case pc.out <- a.Msg:
		default:
			// The peer does not read: drop it rather than stall the master.
			s.log.Warn("peer send queue full, closing", "conn", a.To)
			pc.conn.Close()
		}
	case Drop:
		s.mu.Lock()
		pc := s.conns[a.Conn]
		delete(s.conns, a.Conn)
		s.mu.Unlock()
		if pc != nil {
			pc.closeAfterQueue()
		}
	case Note:
		e := a.Event
		s.log.Info(e.Kind, "peer", e.Peer, "group", e.Group, "detail", e.Detail)
		if s.cfg.OnEvent != nil {
			s.cfg.OnEvent(e)
		}
	}
}

func (pc *peerConn) closeAfterQueue() {
	pc.once.Do(func() {
		select {
		case pc.out <- nil:
		default:
			pc.conn.Close()
		}
	})
}

func (s *Server) handle(ctx context.Context, c net.Conn) {
	defer s.wg.Done()
	c.SetDeadline(time.Now().Add(firstFrameTimeout))
	if err := wire.Exchange(c, wire.KindControl); err != nil {
		s.log.Debug("handshake failed", "remote", c.RemoteAddr(), "err", err)
		c.Close()
		return
	}
	c.SetWriteDeadline(time.Time{}) // the read deadline stays until the first message
	s.mu.Lock()
	s.next++
	pc := &peerConn{id: s.next, conn: c, out: make(chan wire.Message, s.cfg.SendQueue)}
	s.conns[pc.id] = pc
	s.mu.Unlock()

	s.wg.Add(1)
	go s.write(ctx, pc)
	var buf []byte
	for first := true; ; first = false {
		msg, b, err := wire.ReadFrame(c, s.cfg.MaxFrame, buf)
		buf = b
		if first && err == nil {
			c.SetReadDeadline(time.Time{})
		}
		if err != nil {
			reason := err.Error()
			if errors.Is(err, io.EOF) {
				reason = "EOF"
			}
			if errors.Is(err, wire.ErrMalformed) || errors.Is(err, wire.ErrTooLarge) {
				// Tell the peer why before closing; the machine forgets it on Closed.
				select {
				case pc.out <- &wire.Kick{Reason: "malformed message: " + err.Error()}:
				default:
				}
			}
			pc.closeAfterQueue()
			select {
			case s.in <- Closed{Conn: pc.id, Err: reason}:
			case <-ctx.Done():
			}
			s.mu.Lock()
			delete(s.conns, pc.id)
			s.mu.Unlock()
			return
		}
		select {
		case s.in <- Received{Conn: pc.id, Msg: msg}:
		case <-ctx.Done():
			return
		}
	}
}

func (s *Server) write(ctx context.Context, pc *peerConn) {
	defer s.wg.Done()
	defer pc.conn.Close()
	var buf []byte
	for {
		var msg wire.Message
		select {
		case msg = <-pc.out:
		case <-ctx.Done():
			return
		}
		if msg == nil {
			return
		}
		buf = wire.AppendFrame(buf[:0], msg)
		pc.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := pc.conn.Write(buf); err != nil {
			return
		}
	}
}
