package pccl

import (
	"fmt"
	"math/rand/v2"

	"github.com/concord-ccl/concord/internal/gossip"
)

// GossipConfig tunes the gossip failure detector a peer runs with the master and the other peers
// (see Config.GossipJoin). Its zero value is the LAN preset on a free loopback port; set BindAddr to
// an address the others reach across machines.
type GossipConfig = gossip.Config

// GossipLAN returns the gossip preset for one network. A hung peer is declared dead within
// GossipConfig.Bound(n) of n members (master included): 5.5s for 3.
func GossipLAN() GossipConfig { return gossip.LAN() }

// GossipWAN returns the gossip preset for peers across the internet.
func GossipWAN() GossipConfig { return gossip.WAN() }

// startGossip joins the master's gossip group when Config.GossipJoin is set. It runs once in
// Connect, after the Welcome named the peer.
func (c *Communicator) startGossip() error {
	if c.cfg.GossipJoin == "" {
		return nil
	}
	g, err := gossip.Start(c.cfg.Gossip, gossip.PeerName(c.id, rand.Uint64()), nil, c.log)
	if err != nil {
		return fmt.Errorf("pccl: %w", err)
	}
	if err := g.Join(c.cfg.GossipJoin); err != nil {
		g.Close()
		return fmt.Errorf("pccl: %w", err)
	}
	c.gossip = g
	return nil
}

// stopGossip leaves the gossip group; Close calls it.
func (c *Communicator) stopGossip() {
	if c.gossip != nil {
		c.gossip.Close()
	}
}
