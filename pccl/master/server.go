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

	mu       sync.Mutex // guards conns, sessions and next (the readers add, the event loop removes)
	conns    map[ConnID]*session
	sessions map[wire.SessionID]*session
	next     ConnID
	wg       sync.WaitGroup

	relays relay // joins the connections of relayed links (relay.go)

	gossipReady chan struct{} // closed once Serve started the gossip member (or did not)
	gossipAddr  string        // written before gossipReady is closed
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
		conns: map[ConnID]*session{}, sessions: map[wire.SessionID]*session{}, improveStop: map[GroupID]context.CancelFunc{},
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
	m.hearsSilent = simhook.Planted(ctx, simhook.HearsSilent)
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
	for _, sess := range s.conns {
		sess.end()
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
		snap := <-ch
		snap.Relay = s.relays.stats()
		return snap
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
		sess := s.conns[a.To]
		s.mu.Unlock()
		if sess == nil {
			return
		}
		select {
		case sess.out <- a.Msg:
		default:
			// The peer does not read: drop it rather than stall the master.
			s.log.Warn("peer send queue full, closing", "conn", a.To)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.ended(ctx, sess, "send queue full")
			}()
		}
	case Drop:
		s.mu.Lock()
		sess := s.conns[a.Conn]
		s.mu.Unlock()
		if sess != nil {
			s.forget(sess)
			sess.closeAfterQueue()
		}
	case Note:
		e := a.Event
		level := slog.LevelInfo
		if warnKinds[e.Kind] {
			level = slog.LevelWarn
		}
		s.log.Log(ctx, level, e.Kind, "peer", e.Peer, "group", e.Group, "detail", e.Detail)
		if s.cfg.OnEvent != nil {
			s.cfg.OnEvent(e)
		}
	}
}

// warnKinds are the kinds of event the server logs as warnings: an operator should look at them.
var warnKinds = map[string]bool{"nat": true, "isolated": true, "timeout": true, "link-cut": true}

// remoteOf returns the address conn's packets come from, or "" where the transport has none (a unix
// socket of the local path).
func remoteOf(c net.Conn) string {
	a := c.RemoteAddr()
	if a == nil {
		return ""
	}
	switch a.(type) {
	case *net.TCPAddr, *net.UDPAddr:
		return a.String()
	}
	return ""
}

// handle serves one connection: a new peer's (its first frame a Hello), or one that resumes a session
// (SessionResume). It reads the connection until it ends.
func (s *Server) handle(ctx context.Context, c net.Conn) {
	defer s.wg.Done()
	c.SetDeadline(time.Now().Add(firstFrameTimeout))
	kind, err := wire.Accept(c, wire.KindControl, wire.KindRelay)
	if err != nil {
		s.log.Debug("handshake failed", "remote", c.RemoteAddr(), "err", err)
		c.Close()
		return
	}
	c.SetWriteDeadline(time.Time{}) // the read deadline stays until the first message
	if kind == wire.KindRelay {
		s.relay(ctx, c)
		return
	}
	first, buf, err := wire.ReadFrame(c, s.cfg.MaxFrame, nil)
	if r, ok := first.(*wire.SessionResume); ok && err == nil {
		if sess := s.resumed(r); sess != nil && sess.moveTo(c, r.Recv) {
			s.log.Info("session resumed on a new connection", "conn", sess.id, "remote", c.RemoteAddr())
			c.SetReadDeadline(time.Time{})
			s.read(ctx, sess, c, buf)
			return
		}
		// No such session (this master restarted, or removed the peer): the peer sends a Hello next.
		c.Write(wire.AppendFrame(nil, &wire.SessionResumed{Detail: "no such session at this master"}))
		first, buf, err = wire.ReadFrame(c, s.cfg.MaxFrame, buf)
	}
	if err != nil {
		s.log.Debug("no first message", "remote", c.RemoteAddr(), "err", err)
		if errors.Is(err, wire.ErrMalformed) || errors.Is(err, wire.ErrTooLarge) {
			c.SetWriteDeadline(time.Now().Add(time.Second))
			c.Write(wire.AppendFrame(nil, &wire.Kick{Reason: "malformed message: " + err.Error(), Final: true}))
		}
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	sess := s.newSession(c)
	if _, ok := first.(*wire.Hello); ok {
		// The session's first frame, before anything the Machine sends. The Hello itself is not
		// numbered: the peer's frames count from the next.
		c.SetWriteDeadline(time.Now().Add(firstFrameTimeout))
		if _, err := c.Write(wire.AppendFrame(nil, &wire.SessionStart{ID: sess.key})); err != nil {
			s.forget(sess)
			c.Close()
			return
		}
		c.SetWriteDeadline(time.Time{})
		sess.mu.Lock()
		sess.started = true
		sess.mu.Unlock()
	}
	s.wg.Add(1)
	go s.write(ctx, sess)
	select {
	case s.in <- Opened{Conn: sess.id, Remote: remoteOf(c)}:
	case <-ctx.Done():
		return
	}
	// The Machine judges the first message: anything but a Hello is refused.
	select {
	case s.in <- Received{Conn: sess.id, Msg: first}:
	case <-ctx.Done():
		return
	}
	s.read(ctx, sess, c, buf)
}

// read feeds the Machine the frames of connection c of session sess until c ends.
func (s *Server) read(ctx context.Context, sess *session, c net.Conn, buf []byte) {
	for {
		msg, b, err := wire.ReadFrame(c, s.cfg.MaxFrame, buf)
		buf = b
		if err != nil {
			if !sess.failed(c, err) {
				c.Close() // replaced by a resumption, or silent: the session waits for the peer
				if silence(err) {
					s.log.Info("control connection went silent; the session waits for the peer to resume it", "conn", sess.id, "err", err)
				}
				return
			}
			reason := err.Error()
			if errors.Is(err, io.EOF) {
				reason = "EOF"
			}
			if errors.Is(err, wire.ErrMalformed) || errors.Is(err, wire.ErrTooLarge) {
				// Tell the peer why before closing; the machine forgets it on Closed.
				select {
				case sess.out <- &wire.Kick{Reason: "malformed message: " + err.Error()}:
				default:
				}
				sess.closeAfterQueue()
				s.forget(sess)
				select {
				case s.in <- Closed{Conn: sess.id, Err: reason}:
				case <-ctx.Done():
				}
				return
			}
			s.ended(ctx, sess, reason)
			return
		}
		if a, ok := msg.(*wire.SessionAck); ok {
			sess.ack(a.Recv)
			continue
		}
		if !sess.received(c) {
			c.Close()
			return
		}
		select {
		case s.in <- Received{Conn: sess.id, Msg: msg}:
		case <-ctx.Done():
			return
		}
	}
}
