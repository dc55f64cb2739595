package pccl_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// The planner on a degraded intra-site fabric (siteplan.go), on the sim provider: one NIC of one node
// goes down, and the site's collectives run by the planner's schedule rather than by hot repair.

// sumAndHash runs a Sum AllReduce of count elements on every peer twice: integer inputs, whose sums
// are exact in any order, checked element by element on every peer, then fractional ones, whose
// results must hash alike on every peer.
func sumAndHash(ctx context.Context, t *testing.T, comms []*pccl.Communicator, tag uint64, count, seed int) {
	t.Helper()
	sumOnEvery(ctx, t, comms, tag, count, seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 45))
	bufs := make([][]float32, len(comms))
	for i := range bufs {
		bufs[i] = make([]float32, count)
		for j := range bufs[i] {
			bufs[i][j] = rng.Float32()*2 - 1
		}
	}
	errs := each(comms, func(i int, c *pccl.Communicator) error {
		b := pccl.Bytes(bufs[i])
		return c.AllReduce(ctx, b, b, pccl.Desc{Tag: tag, Count: count, DType: pccl.F32, Op: pccl.Sum})
	})
	var h0 uint64
	for i, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", i, err)
		}
		h := xxh3.Hash(pccl.Bytes(bufs[i]))
		if i == 0 {
			h0 = h
		} else if h != h0 {
			t.Fatalf("peer %d: result hash %x, peer 0 %x", i, h, h0)
		}
	}
}

// requirePlanned checks that every peer of want planned its last call with a strategy other than hot
// repair, and that the other peers planned none.
func requirePlanned(t *testing.T, comms []*pccl.Communicator, want func(i int) bool) {
	t.Helper()
	for i, c := range comms {
		st, n := c.Stats().SitePlan, c.Stats().SitePlanned
		switch {
		case want(i) && (n == 0 || st == "" || st == "hot_repair" || st == "ring"):
			t.Fatalf("peer %d: %d planned calls, the last %q: want a schedule other than hot repair", i, n, st)
		case !want(i) && n != 0:
			t.Fatalf("peer %d: %d planned calls on a healthy fabric (last %q)", i, n, st)
		}
	}
}

// TestSiteSimDegradedHierarchical: a NIC of peer 0 goes down during a hierarchical AllReduce (hot
// repair absorbs it); the collectives after it run their site phases in peer 0's site by the
// planner, with every element right and the same bits on every peer, while the other site, healthy,
// keeps the standard ring. A peer killed mid-call then aborts the collective with ErrPeerLeft.
func TestSiteSimDegradedHierarchical(t *testing.T) {
	const sites, per, nics = 2, 3, 4
	ctx, s, g, comms, hosts := onSimSite(t, sites, per, nics, 1000)
	sumAndHash(ctx, t, comms, 1, 33331, 1)
	requirePlanned(t, comms, func(int) bool { return false })
	for i, r := range siteNICRates(t, g, comms) {
		if len(r) != nics {
			t.Fatalf("peer %d: figures of %d NICs, want %d", i, len(r), nics)
		}
	}

	if err := s.FailNIC(0, 1, 2); err != nil {
		t.Fatal(err)
	}
	sumOnEvery(ctx, t, comms, 2, 1<<20, 2)
	if s.Struck() != 1 {
		t.Fatal("the NIC did not go down during the collective")
	}
	for k, count := range []int{1 << 20, 33331, 5} {
		sumAndHash(ctx, t, comms, 3, count, 10+k)
	}
	requirePlanned(t, comms, func(i int) bool { return i%sites == 0 })
	for i, c := range comms {
		if n := c.Stats().SiteCalibrations; n != 1 {
			t.Fatalf("peer %d: %d calibrations of its site's fabric, want 1", i, n)
		}
	}

	killMidCollective(ctx, t, g, comms, hosts, 2, s.DownAll)
	// The victim's site calibrates its new ring; the other site, whose ring is the same in the new
	// generation, keeps its table.
	for i, c := range comms {
		want := uint64(1)
		if i%sites == 0 {
			want = 2
		}
		if n := c.Stats().SiteCalibrations; i != 2 && n != want {
			t.Fatalf("peer %d: %d calibrations of its site's fabric after the kill, want %d", i, n, want)
		}
	}
}

// TestSiteSimDegradedOneSite: a group whose peers are all of one site with NICs runs its AllReduce
// whole on the fabric; with a NIC of one node down, by the planner's choice among every schedule,
// every element right and the same bits on every peer. A peer killed mid-call aborts it with
// ErrPeerLeft, and the survivors' retry is right.
func TestSiteSimDegradedOneSite(t *testing.T) {
	const per, nics = 4, 4
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	// Slower NICs than the hierarchical tests': the whole AllReduce on the fabric must still be moving
	// when the peer is killed.
	s := pccl.NewSimSite(t, nics, 200)
	g := newGroup(t, master.Config{})
	comms, hosts := g.startSitesWith(ctx, 1, per, pccl.OnSimSite(s))
	t.Cleanup(func() { closeAll(comms) })
	sumAndHash(ctx, t, comms, 1, 33331, 1)
	requireFabric(t, comms)
	requirePlanned(t, comms, func(int) bool { return false })
	for i, c := range comms {
		if st := c.Stats(); st.SiteCollectives != 2 {
			t.Fatalf("peer %d: %d collectives on the fabric, want 2", i, st.SiteCollectives)
		}
	}
	requireCalibrated(t, comms, nics, 200e6/8)
	// Every NIC of every peer carried its share, and the master holds the figures.
	for i, r := range siteNICRates(t, g, comms) {
		for j, v := range r {
			if v <= 0 {
				t.Fatalf("peer %d NIC %d carried %g B/s on the healthy fabric", i, j, v)
			}
		}
	}

	if err := s.FailNIC(1, 2, 2); err != nil {
		t.Fatal(err)
	}
	sumOnEvery(ctx, t, comms, 2, 1<<20, 2)
	if s.Struck() != 1 {
		t.Fatal("the NIC did not go down during the collective")
	}
	for k, count := range []int{1 << 20, 4099, 3} {
		sumAndHash(ctx, t, comms, 3, count, 10+k)
	}
	requirePlanned(t, comms, func(int) bool { return true })
	for i, c := range comms {
		if st := c.Stats().SitePlan; i > 0 {
			if st0 := comms[0].Stats().SitePlan; st != st0 {
				t.Fatalf("peer %d planned %s, peer 0 %s", i, st, st0)
			}
		}
	}
	t.Logf("planned %s", comms[0].Stats().SitePlan)
	requireCalibrated(t, comms, nics, 200e6/8) // the same table: no calibration with a NIC down
	// The planned schedule leaves the down NIC out: peer 1's NIC 2 carries nothing, its others do.
	sumOnEvery(ctx, t, comms, 4, 1<<20, 20)
	r := siteNICRates(t, g, comms)[1]
	if r[2] != 0 || r[0]+r[1]+r[3] <= 0 {
		t.Fatalf("peer 1's NICs carried %v B/s with NIC 2 down", r)
	}

	killMidCollective(ctx, t, g, comms, hosts, 3, s.DownAll)
}

// siteNICRates returns, per peer of comms, the per-NIC rates the master holds of its last collective
// on the intra-site fabric; it fails the test when a peer has none.
func siteNICRates(t *testing.T, g *group, comms []*pccl.Communicator) [][]float64 {
	t.Helper()
	byID := map[uint64][]float64{}
	for _, p := range g.srv.Snapshot().Peers {
		byID[p.ID] = p.SiteNICRates
	}
	out := make([][]float64, len(comms))
	for i, c := range comms {
		if out[i] = byID[c.ID()]; len(out[i]) == 0 {
			t.Fatalf("peer %d: the master holds no per-NIC figures", i)
		}
	}
	return out
}

// requireCalibrated checks that every peer calibrated its site's fabric once and holds the same
// table, which puts every NIC of every node within a quarter of rate bytes per second (the sim's
// NICs have no other cost than their rate and a few microseconds of latency).
func requireCalibrated(t *testing.T, comms []*pccl.Communicator, nics int, rate float64) {
	t.Helper()
	want := pccl.SiteCalibrationForTest(comms[0])
	for i, c := range comms {
		if n := c.Stats().SiteCalibrations; n != 1 {
			t.Fatalf("peer %d: %d calibrations of the fabric, want 1", i, n)
		}
		got := pccl.SiteCalibrationForTest(c)
		if len(got) != len(comms) {
			t.Fatalf("peer %d: a table of %d nodes, want %d", i, len(got), len(comms))
		}
		for u, row := range got {
			if len(row) != nics {
				t.Fatalf("peer %d: node %d has %d NICs in the table, want %d", i, u, len(row), nics)
			}
			for j, bw := range row {
				if bw != want[u][j] {
					t.Fatalf("peer %d: node %d NIC %d at %.4g B/s, peer 0 holds %.4g", i, u, j, bw, want[u][j])
				}
				if bw < 0.75*rate || bw > 1.25*rate {
					t.Fatalf("peer %d: node %d NIC %d calibrated at %.4g B/s, the sim runs it at %.4g", i, u, j, bw, rate)
				}
			}
		}
	}
}

// TestSiteSimSlowRail: NIC 3 of every node runs at a quarter of the others' rate, and no NIC is down.
// The calibration finds the slow rail, so the site's collectives run by the planner, which gives the
// slow NICs less, with every element right and the same bits on every peer; the master's per-NIC
// figures show the slow rail carrying less than each other.
func TestSiteSimSlowRail(t *testing.T) {
	const per, nics = 4, 4
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	s := pccl.NewSimSite(t, nics, 400)
	s.SlowRail(3, 100)
	g := newGroup(t, master.Config{})
	comms, _ := g.startSitesWith(ctx, 1, per, pccl.OnSimSite(s))
	t.Cleanup(func() { closeAll(comms) })
	for k, count := range []int{1 << 20, 33331} {
		sumAndHash(ctx, t, comms, 1, count, 30+k)
	}
	requireFabric(t, comms)
	requirePlanned(t, comms, func(int) bool { return true })
	for i, r := range siteNICRates(t, g, comms) {
		if r[3] <= 0 || r[3] >= min(r[0], r[1], r[2]) {
			t.Fatalf("peer %d's NICs carried %v B/s: the slow rail should carry less than each other NIC", i, r)
		}
	}
	t.Logf("planned %s", comms[0].Stats().SitePlan)
}

// TestSiteSimHotRepairOnlyOnOnePeer: one peer of a one-site group keeps to hot repair
// (Config.SiteHotRepairOnly). With a NIC down, the whole site stays on hot repair, since every peer
// must run the same collectives, and every result is right.
func TestSiteSimHotRepairOnlyOnOnePeer(t *testing.T) {
	const per, nics = 3, 4
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	s := pccl.NewSimSite(t, nics, 1000)
	g := newGroup(t, master.Config{})
	onSim := pccl.OnSimSite(s)
	comms, _ := g.startSitesWith(ctx, 1, per, func(i int, cfg *pccl.Config) {
		onSim(i, cfg)
		cfg.SiteHotRepairOnly = i == 2
	})
	t.Cleanup(func() { closeAll(comms) })
	sumOnEvery(ctx, t, comms, 1, 4099, 1)
	if err := s.FailNIC(0, 3, 2); err != nil {
		t.Fatal(err)
	}
	for k, count := range []int{1 << 20, 1 << 20, 33331} {
		sumAndHash(ctx, t, comms, 2, count, 10+k)
	}
	if s.Struck() != 1 {
		t.Fatal("the NIC did not go down")
	}
	requireFabric(t, comms)
	requirePlanned(t, comms, func(int) bool { return false })
}

// TestSiteSimReranked: two neighbours of a site ring of four lose NICs of different rails, so that
// the link between them has two rails of four while every node keeps three. The site phases run by
// Balance on a bridge re-ranked ring, with every element right and the same bits on every peer.
func TestSiteSimReranked(t *testing.T) {
	const sites, per, nics = 2, 4, 4
	ctx, s, _, comms, _ := onSimSite(t, sites, per, nics, 1000)
	sumOnEvery(ctx, t, comms, 1, 4099, 1)
	site, _, _ := pccl.HierarchyForTest(comms[0])
	index := map[uint64]int{}
	for i, c := range comms {
		index[c.ID()] = i
	}
	a, b := index[site[0]], index[site[1]]
	if err := s.FailNIC(a, 1, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.FailNIC(b, 2, 2); err != nil {
		t.Fatal(err)
	}
	sumOnEvery(ctx, t, comms, 2, 1<<20, 2)
	if s.Struck() != 2 {
		t.Fatalf("%d of the 2 NIC faults struck", s.Struck())
	}
	for k, count := range []int{1 << 20, 33331} {
		sumAndHash(ctx, t, comms, 3, count, 10+k)
	}
	for _, id := range site {
		if st := comms[index[id]].Stats().SitePlan; st != "balance re-ranked" {
			t.Fatalf("peer %d planned %q, want balance re-ranked", index[id], st)
		}
	}
	requirePlanned(t, comms, func(i int) bool { return i%sites == a%sites })
}
