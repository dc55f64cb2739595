package gossip

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Kind says what happened to a member.
type Kind int

// The kinds of Event.
const (
	// Joined: a member became known (or alive again).
	Joined Kind = iota + 1
	// Gone: the group declared a member dead (it answered no probe during the suspicion timeout), or
	// it left on purpose (Close). memberlist's callback does not tell the two apart reliably (the
	// node's state it passes is not updated), and for Concord both mean the peer takes no further part.
	Gone
)

// Event reports a change of one member, as this member learned it.
type Event struct {
	Kind Kind
	// Name is the member's name (see PeerName).
	Name string
	// Time is when this member learned it.
	Time time.Time
}

// Member is one node of the gossip group. Start creates it; Close stops it.
//
// Goroutines: memberlist's own, one forwarder each for packets and streams (see pausable), and one
// that hands events to the notify callback in order. Every method is safe for concurrent use.
type Member struct {
	ml *memberlist.Memberlist
	tr *pausable

	mu     sync.Mutex // guards queue
	queue  []Event
	wake   chan struct{} // capacity 1: the queue has events
	stop   chan struct{}
	done   chan struct{}
	closed sync.Once
}

// Start creates a member named name (unique in the group; see PeerName), binds its sockets and starts
// probing. notify, if not nil, is called for every event, in order, from one goroutine the member owns;
// it may block, but must not call Close. logger receives memberlist's lines at debug level; nil
// discards.
func Start(cfg Config, name string, notify func(Event), logger *slog.Logger) (*Member, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	host, portStr, err := net.SplitHostPort(cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("gossip: Config.BindAddr %q: %w", cfg.BindAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("gossip: Config.BindAddr %q: bad port", cfg.BindAddr)
	}
	var out io.Writer = io.Discard
	if logger != nil {
		out = logWriter{logger}
	}
	mlog := log.New(out, "", 0)
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: port, Logger: mlog})
	if err != nil {
		return nil, fmt.Errorf("gossip: bind %s: %w", cfg.BindAddr, err)
	}
	m := &Member{tr: newPausable(nt), wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}

	mc := memberlist.DefaultLANConfig()
	mc.Name = name
	mc.Transport = m.tr
	mc.Logger = mlog
	mc.Events = delegate{m}
	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeTimeout
	mc.SuspicionMult = cfg.SuspicionMult
	mc.SuspicionMaxTimeoutMult = cfg.SuspicionMaxTimeoutMult
	mc.IndirectChecks = cfg.IndirectChecks
	mc.AwarenessMaxMultiplier = cfg.AwarenessMaxMultiplier
	mc.GossipInterval = cfg.GossipInterval
	mc.Label = cfg.Label
	mc.AdvertiseAddr, mc.AdvertisePort = host, nt.GetAutoBindPort()
	if cfg.AdvertiseAddr != "" {
		ah, ap, err := net.SplitHostPort(cfg.AdvertiseAddr)
		if err != nil {
			nt.Shutdown()
			return nil, fmt.Errorf("gossip: Config.AdvertiseAddr %q: %w", cfg.AdvertiseAddr, err)
		}
		mc.AdvertiseAddr = ah
		if mc.AdvertisePort, err = strconv.Atoi(ap); err != nil {
			nt.Shutdown()
			return nil, fmt.Errorf("gossip: Config.AdvertiseAddr %q: bad port", cfg.AdvertiseAddr)
		}
	}
	go m.dispatch(notify)
	ml, err := memberlist.Create(mc)
	if err != nil {
		m.tr.Shutdown()
		close(m.stop)
		<-m.done
		return nil, fmt.Errorf("gossip: start member %s: %w", name, err)
	}
	m.ml = ml
	return m, nil
}

// Addr returns the host:port other members join this one at.
func (m *Member) Addr() string {
	n := m.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Join contacts the members at addrs (host:port) and merges their view of the group. It fails only
// if none answers.
func (m *Member) Join(addrs ...string) error {
	if _, err := m.ml.Join(addrs); err != nil {
		return fmt.Errorf("gossip: join %v: %w", addrs, err)
	}
	return nil
}

// Pause makes the member deaf and mute while on is true, as a hung process: packets in and out are
// dropped and streams refused. It is meant for tests of failure detection.
func (m *Member) Pause(on bool) { m.tr.paused.Store(on) }

// Close leaves the group (telling the others, for up to a second), then stops the member and waits
// for its event goroutine. It is idempotent. memberlist does not wait for a probe in flight: that
// goroutine ends by itself within a probe interval (stretched by awareness), its sockets closed.
func (m *Member) Close() error {
	m.closed.Do(func() {
		if !m.tr.paused.Load() {
			m.ml.Leave(time.Second)
		}
		m.ml.Shutdown()
		close(m.stop)
		<-m.done
	})
	return nil
}

func (m *Member) push(k Kind, n *memberlist.Node) {
	m.mu.Lock()
	m.queue = append(m.queue, Event{Kind: k, Name: n.Name, Time: time.Now()})
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// dispatch hands queued events to notify until stop; memberlist's callbacks only queue, so a slow
// notify never stalls the protocol.
func (m *Member) dispatch(notify func(Event)) {
	defer close(m.done)
	for {
		select {
		case <-m.stop:
			return
		case <-m.wake:
		}
		m.mu.Lock()
		q := m.queue
		m.queue = nil
		m.mu.Unlock()
		for _, e := range q {
			if notify != nil {
				notify(e)
			}
		}
	}
}

// delegate queues memberlist's membership callbacks (called under its locks).
type delegate struct{ m *Member }

func (d delegate) NotifyJoin(n *memberlist.Node)  { d.m.push(Joined, n) }
func (d delegate) NotifyLeave(n *memberlist.Node) { d.m.push(Gone, n) }
func (d delegate) NotifyUpdate(*memberlist.Node)  {}

// PeerName returns the member name of peer id; nonce tells apart the members of successive
// connections of the same peer.
func PeerName(id, nonce uint64) string { return fmt.Sprintf("peer-%d-%x", id, nonce) }

// ParsePeer returns the peer id in a name made by PeerName.
func ParsePeer(name string) (id uint64, ok bool) {
	rest, found := strings.CutPrefix(name, "peer-")
	if !found {
		return 0, false
	}
	ids, _, found := strings.Cut(rest, "-")
	if !found {
		return 0, false
	}
	id, err := strconv.ParseUint(ids, 10, 64)
	return id, err == nil
}

// logWriter turns memberlist's log lines into debug records.
type logWriter struct{ l *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.l.Debug(strings.TrimSpace(string(p)), "component", "gossip")
	return len(p), nil
}
