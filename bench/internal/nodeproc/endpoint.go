package nodeproc

import (
	"net/netip"
	"time"

	"github.com/concord-ccl/concord/internal/netlab"
	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/tcp"
)

// TCPNode is one node's rdma/tcp endpoint on a netlab test bed: node Index of Nodes, each with NICs
// NICs shaped to Mbit Mbit/s, every NIC listening on Port.
type TCPNode struct {
	Index, Nodes, NICs int
	Mbit, Port         int
	// UserTimeout is the connections' TCP_USER_TIMEOUT (tcp.Config.UserTimeout).
	UserTimeout time.Duration
}

// Listen opens the node's endpoint on the NICs netlab names in its namespace, with every other
// node's NICs as its peers and the shaped rate as every NIC's bandwidth, and returns it with the ring
// of every node in index order. Call it inside the node's namespace; the caller closes the endpoint.
func (n TCPNode) Listen() (*tcp.Endpoint, []rdma.NodeID, error) {
	names := make([]string, n.NICs)
	for r := range names {
		names[r] = netlab.NICName(r)
	}
	nics, err := tcp.HostNICs(names...)
	if err != nil {
		return nil, nil, err
	}
	cfg := tcp.Config{Node: rdma.NodeID(n.Index), NICs: nics, Peers: map[rdma.NodeID][]netip.AddrPort{},
		UserTimeout: n.UserTimeout}
	for r := range cfg.NICs {
		cfg.NICs[r].Port = uint16(n.Port)
		cfg.NICs[r].Bandwidth = float64(n.Mbit) * 1e6 / 8
	}
	ring := make([]rdma.NodeID, n.Nodes)
	for i := range n.Nodes {
		ring[i] = rdma.NodeID(i)
		if i == n.Index {
			continue
		}
		addrs := make([]netip.AddrPort, n.NICs)
		for r := range addrs {
			addrs[r] = netip.AddrPortFrom(netlab.Addr(i, r), uint16(n.Port))
		}
		cfg.Peers[rdma.NodeID(i)] = addrs
	}
	ep, err := tcp.Listen(cfg)
	if err != nil {
		return nil, nil, err
	}
	return ep, ring, nil
}
