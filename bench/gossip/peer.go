package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/pccl"
)

// Environment of the peer role.
const (
	rolePeer  = "peer"
	envParams = "CONCORD_BENCH_GOSSIP_PEER"
)

// peerParams is what the bench tells every peer, as JSON in envParams.
type peerParams struct {
	Master     string        `json:"master"`
	Host       string        `json:"host"`        // this peer's host address: its listener and gossip member bind there
	GossipJoin string        `json:"gossip_join"` // the master's gossip member; empty: no gossip
	WAN        bool          `json:"wan"`         // the WAN presets of the communicator and of gossip
	Lifetime   time.Duration `json:"lifetime"`
}

// peerEvent is every line a peer prints.
type peerEvent struct {
	Event  string `json:"event"` // "ready", "removed", "error"
	ID     uint64 `json:"id,omitempty"`
	World  int    `json:"world,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// peerMain is the peer role: it joins the group, lets the peers that wait in Connect in (a consensus
// every second, ArePeersPending), and otherwise stays idle, so that what it sends is its heartbeats,
// that consensus and, with gossip, the gossip member's probes.
func peerMain() int {
	var p peerParams
	if err := json.Unmarshal([]byte(os.Getenv(envParams)), &p); err != nil {
		cluster.Emit(peerEvent{Event: "error", Detail: fmt.Sprintf("%s: %v", envParams, err)})
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.Lifetime)
	defer cancel()
	cfg := pccl.LAN()
	gcfg := pccl.GossipLAN()
	if p.WAN {
		cfg, gcfg = pccl.WAN(), pccl.GossipWAN()
	}
	cfg.Master, cfg.Logger = p.Master, cluster.Logger()
	cfg.ListenAddr = net.JoinHostPort(p.Host, "0")
	if p.GossipJoin != "" {
		cfg.GossipJoin = p.GossipJoin
		cfg.Gossip = gcfg
		cfg.Gossip.BindAddr = net.JoinHostPort(p.Host, "0")
	}
	comm, err := pccl.Connect(ctx, cfg)
	if err != nil {
		cluster.Emit(peerEvent{Event: "error", Detail: err.Error()})
		return 1
	}
	defer comm.Close()
	world := 0
	for ctx.Err() == nil {
		if comm.WorldSize() != world {
			world = comm.WorldSize()
			cluster.Emit(peerEvent{Event: "ready", ID: comm.ID(), World: world})
		}
		var err error
		if world < 2 {
			err = comm.UpdateTopology(ctx) // alone: admit whoever waits
		} else {
			var pending bool
			pending, err = comm.ArePeersPending(ctx)
			if (err == nil && pending) || pccl.Retryable(err) {
				err = comm.UpdateTopology(ctx)
			}
		}
		if err != nil && !pccl.Retryable(err) {
			cluster.Emit(peerEvent{Event: "removed", ID: comm.ID(), Detail: err.Error()})
			return 0
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
	return 0
}
