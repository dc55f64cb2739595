package sim

import (
	"fmt"
	"time"

	"github.com/concord-ccl/concord/internal/transport"
)

// Topology places the hosts of a simulated cluster in sites and gives every directed link between two
// hosts the latency and bandwidth between their sites. The zero value is one site of perfect links.
type Topology struct {
	// Sites names the sites. Peers are placed in them in turn. Empty: one site.
	Sites []string
	// RTT[i][j] is the round-trip time between a host of site i and one of site j; RTT[i][i] is the
	// round trip inside site i. Nil: no latency.
	RTT [][]time.Duration
	// Bandwidth is the rate of every link, in bytes per second, each direction on its own (a peer's
	// upload to one neighbour). 0 means unlimited.
	Bandwidth float64
	// MasterSite is the index of the master's site.
	MasterSite int
}

// WAN returns the wide-area topology the scale benchmark and the soak use: three sites 50, 100 and
// 150 ms apart (round trip), 1 ms inside a site, 1 Gbit/s per link.
func WAN() Topology {
	ms := time.Millisecond
	return Topology{
		Sites: []string{"eu", "us", "ap"},
		RTT: [][]time.Duration{
			{1 * ms, 50 * ms, 150 * ms},
			{50 * ms, 1 * ms, 100 * ms},
			{150 * ms, 100 * ms, 1 * ms},
		},
		Bandwidth: 125e6,
	}
}

// Validate reports the first field that holds an impossible value.
func (t Topology) Validate() error {
	n := max(len(t.Sites), 1)
	switch {
	case t.Bandwidth < 0:
		return fmt.Errorf("sim: Topology.Bandwidth %v: must not be negative", t.Bandwidth)
	case t.MasterSite < 0 || t.MasterSite >= n:
		return fmt.Errorf("sim: Topology.MasterSite %d: want a site index below %d", t.MasterSite, n)
	case t.RTT != nil && len(t.RTT) != n:
		return fmt.Errorf("sim: Topology.RTT has %d rows for %d sites", len(t.RTT), n)
	}
	for i, row := range t.RTT {
		if len(row) != n {
			return fmt.Errorf("sim: Topology.RTT row %d has %d entries for %d sites", i, len(row), n)
		}
		for j, d := range row {
			if d < 0 {
				return fmt.Errorf("sim: Topology.RTT[%d][%d] %v: must not be negative", i, j, d)
			}
		}
	}
	return nil
}

// NumSites returns the number of sites (one for an empty Sites).
func (t Topology) NumSites() int { return max(len(t.Sites), 1) }

// SiteName returns the name of site i ("" for the single unnamed site).
func (t Topology) SiteName(i int) string {
	if i < len(t.Sites) {
		return t.Sites[i]
	}
	return ""
}

// Link returns the config of a directed link from a host of site a to one of site b.
func (t Topology) Link(a, b int) transport.LinkConfig {
	var rtt time.Duration
	if t.RTT != nil {
		rtt = t.RTT[a][b]
	}
	return transport.LinkConfig{Latency: rtt / 2, Bandwidth: t.Bandwidth}
}
