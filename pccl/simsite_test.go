package pccl_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// The intra-site tier on the sim provider: the master, the WAN rings and the site rings' links on the
// in-memory network, every peer's fabric a node of one simulated network (pccl.SimSite). No root, no
// namespaces; the faults strike at a chosen chunk of a collective on the fabric.

// onSimSite starts sites*per peers with nics simulated NICs of mbit Mbit/s each and admits them;
// everything is torn down when the test ends. The context bounds the test.
func onSimSite(t *testing.T, sites, per, nics int, mbit float64) (context.Context, *pccl.SimSite, *group, []*pccl.Communicator, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	s := pccl.NewSimSite(t, nics, mbit)
	g := newGroup(t, master.Config{})
	comms, hosts := g.startSitesWith(ctx, sites, per, pccl.OnSimSite(s))
	t.Cleanup(func() { closeAll(comms) })
	requireHierarchical(t, comms, sites, per)
	return ctx, s, g, comms, hosts
}

// TestSiteSimLinkFaults takes a NIC down, then cuts a link, each while a hierarchical AllReduce moves
// data on the simulated fabric: hot repair moves the paths to the other NIC, and every collective
// completes with the right result on every peer, without an error and on the same generation.
func TestSiteSimLinkFaults(t *testing.T) {
	bubbled(t, func(t *testing.T) {
		const sites, per, nics = 2, 3, 2
		ctx, s, _, comms, _ := onSimSite(t, sites, per, nics, 1000)
		for k, count := range []int{1, 5, 33331} {
			sumOnEvery(ctx, t, comms, 1, count, k)
		}
		_, gen0 := requireFabric(t, comms)
		avgAndIntegerOps(ctx, t, comms)

		const count = 1 << 20
		for k, fault := range []struct {
			name   string
			strike func() error
		}{
			// Peer i is in site i%sites: the cut is in the other site, so that each site keeps a NIC pair
			// between every two neighbours.
			{"NIC down", func() error { return s.FailNIC(0, 1, 2) }},
			{"link cut", func() error { return s.CutLink(3, 0, 2) }},
		} {
			part(t, fault.name, func(t *testing.T) {
				before := failovers(comms)
				struck := s.Struck()
				if err := fault.strike(); err != nil {
					t.Fatal(err)
				}
				sumOnEvery(ctx, t, comms, 2, count, 10+k)
				if s.Struck() != struck+1 {
					t.Fatal("the fault did not strike during the collective")
				}
				if failovers(comms) == before {
					t.Fatal("no path failed over")
				}
				if _, gen := requireFabric(t, comms); gen != gen0 {
					t.Fatalf("the fabric changed generation (%d to %d) for a fault hot repair absorbs", gen0, gen)
				}
				// The next collective runs with the fault still in place.
				sumOnEvery(ctx, t, comms, 3, count+7, 20+k)
			})
		}
	})
}

// failovers sums the failovers of every peer's open fabric.
func failovers(comms []*pccl.Communicator) int {
	n := 0
	for _, c := range comms {
		_, _, _, _, f := pccl.SiteFabricForTest(c)
		n += f
	}
	return n
}

// TestSiteSimPeerDies kills a peer (its simulated NICs and its in-memory host) while a hierarchical
// AllReduce moves data on the fabric: every survivor gets ErrPeerLeft with its buffer untouched, and
// the retry after UpdateTopology is correct.
func TestSiteSimPeerDies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const sites, per, nics = 2, 2, 2
		ctx, s, g, comms, hosts := onSimSite(t, sites, per, nics, 100)
		sumOnEvery(ctx, t, comms, 1, 1000, 1)
		requireFabric(t, comms)

		killMidCollective(ctx, t, g, comms, hosts, 2, s.DownAll)
	})
}

// TestSiteSimOneSiteOnFabric runs a hierarchical AllReduce where only one site's peers have the
// intra-site tier: the other site's peers announce no NICs. Both sites must shard the buffer alike for
// the WAN rings, so neither runs its site phases on the fabric, and every result is right.
func TestSiteSimOneSiteOnFabric(t *testing.T) {
	bubbled(t, func(t *testing.T) {
		const sites, per, nics = 2, 3, 2
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		s := pccl.NewSimSite(t, nics, 1000)
		g := newGroup(t, master.Config{})
		onSim := pccl.OnSimSite(s)
		comms, _ := g.startSitesWith(ctx, sites, per, func(i int, cfg *pccl.Config) {
			if i%sites == 0 {
				onSim(i, cfg)
			}
		})
		defer closeAll(comms)
		requireHierarchical(t, comms, sites, per)
		for k, count := range []int{1, 5, 1000, 33331} {
			sumOnEvery(ctx, t, comms, 1, count, k)
		}
		avgAndIntegerOps(ctx, t, comms)
		for i, c := range comms {
			if _, _, _, received, _ := pccl.SiteFabricForTest(c); received != 0 {
				t.Fatalf("peer %d: %d bytes received on the fabric while the other site has none", i, received)
			}
		}
	})
}

// TestSiteSimUnequalSites runs the site phases of sites of three and two peers on the simulated
// fabric: the WAN pieces follow the fabric's blocks, and every result is right.
func TestSiteSimUnequalSites(t *testing.T) {
	bubbled(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		s := pccl.NewSimSite(t, 2, 1000)
		g := newGroup(t, master.Config{})
		onSim := pccl.OnSimSite(s)
		// Five peers, peer i in site i%2.
		site := func(i int) int { return i % 2 }
		comms, _ := g.startSitesWith(ctx, 5, 1, func(i int, cfg *pccl.Config) {
			onSim(i, cfg)
			cfg.Site = fmt.Sprintf("site%d", site(i))
		})
		defer closeAll(comms)
		requireSites(t, comms, site, []int{3, 2})
		for k, count := range []int{1, 5, 1000, 33331} {
			sumOnEvery(ctx, t, comms, 1, count, k)
		}
		requireFabric(t, comms)
		avgAndIntegerOps(ctx, t, comms)
	})
}
