package master

import (
	"context"
	"fmt"
	"time"

	"github.com/concord-ccl/concord/internal/gossip"
)

// GossipConfig tunes the gossip failure detector the server runs with the peers (see
// ServerConfig.Gossip): bind address, probe timing, suspicion. Its zero value is the LAN preset on a
// free loopback port.
type GossipConfig = gossip.Config

// GossipLAN returns the gossip preset for one network: a hung peer is declared dead within
// GossipConfig.Bound(n), 5.5s for 3 members and under 10s + 8s for fewer than 10.
func GossipLAN() GossipConfig { return gossip.LAN() }

// GossipWAN returns the gossip preset for peers across the internet, with longer probe and suspicion
// timeouts.
func GossipWAN() GossipConfig { return gossip.WAN() }

// Dead reports that the gossip group declared peer Peer dead (or saw it leave). Since is when the
// server learned that the gossip member named for the peer joined: the verdict concerns the peer's
// registration only if that registration is not younger, so a peer that reconnected with the same id
// is not struck for its previous incarnation. The machine kicks the peer and aborts its operations at
// once, even if its control connection is still open (a hung process keeps its sockets).
type Dead struct {
	Peer   PeerID
	Since  time.Time
	Reason string
}

func (Dead) isInput() {}

// dead applies a Dead input.
func (m *Machine) dead(d Dead) {
	p := m.peers[d.Peer]
	if p == nil || p.joined.After(d.Since) {
		return
	}
	m.kick(d.Peer, "declared dead by gossip: "+d.Reason)
}

// startGossip starts the server's gossip member when ServerConfig.Gossip is set; the member's events
// feed Dead inputs until ctx ends. It returns nil when gossip is off.
func (s *Server) startGossip(ctx context.Context, incarnation uint64) (*gossip.Member, error) {
	defer close(s.gossipReady)
	if s.cfg.Gossip == nil {
		return nil, nil
	}
	joined := map[string]time.Time{} // owned by the member's event goroutine
	notify := func(e gossip.Event) {
		id, ok := gossip.ParsePeer(e.Name)
		if !ok {
			return
		}
		switch e.Kind {
		case gossip.Joined:
			joined[e.Name] = e.Time
		case gossip.Gone:
			since, ok := joined[e.Name]
			delete(joined, e.Name)
			if !ok {
				return
			}
			select {
			case s.in <- Dead{Peer: id, Since: since, Reason: e.Name + " unreachable or left"}:
			case <-ctx.Done():
			}
		}
	}
	g, err := gossip.Start(*s.cfg.Gossip, fmt.Sprintf("master-%x", incarnation), notify, s.log)
	if err != nil {
		return nil, fmt.Errorf("master: %w", err)
	}
	s.gossipAddr = g.Addr()
	return g, nil
}

// GossipAddr returns the address peers join the server's gossip member at (pccl Config.GossipJoin),
// once Serve has started it; "" when gossip is off or Serve failed to start it. It waits for Serve
// to get that far, or for ctx.
func (s *Server) GossipAddr(ctx context.Context) (string, error) {
	select {
	case <-s.gossipReady:
		return s.gossipAddr, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}
