package pccl_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// startSites connects sites*per peers, peer i in site i%sites, and admits them in one UpdateTopology.
func (g *group) startSites(ctx context.Context, sites, per int) ([]*pccl.Communicator, []string) {
	g.t.Helper()
	return g.startSitesWith(ctx, sites, per, nil)
}

// startSitesWith is startSites with peer i's Config passed through edit (if not nil) first.
func (g *group) startSitesWith(ctx context.Context, sites, per int, edit func(i int, cfg *pccl.Config)) ([]*pccl.Communicator, []string) {
	g.t.Helper()
	hosts := make([]string, sites*per)
	for i := range hosts {
		hosts[i] = g.host()
	}
	comms := g.admit(ctx, hosts, func(i int, cfg *pccl.Config) {
		cfg.Site = fmt.Sprintf("site%d", i%sites)
		if edit != nil {
			edit(i, cfg)
		}
	})
	return comms, hosts
}

// requireHierarchical checks that every peer runs its next AllReduce hierarchically, with a site ring
// of per peers and a WAN ring of sites peers.
func requireHierarchical(t *testing.T, comms []*pccl.Communicator, sites, per int) {
	t.Helper()
	for i, c := range comms {
		site, wan, ok := pccl.HierarchyForTest(c)
		if !ok || len(site) != per || len(wan) != sites || !slices.Contains(site, c.ID()) || !slices.Contains(wan, c.ID()) {
			t.Fatalf("peer %d: hierarchical %v, site ring %v, WAN ring %v", i, ok, site, wan)
		}
	}
}

func TestHierarchicalAllReduce(t *testing.T) {
	bubbled(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		const sites, per = 2, 3
		comms, hosts := g.startSites(ctx, sites, per)
		defer closeAll(comms)
		requireHierarchical(t, comms, sites, per)
		// The master knows every peer's site as announced at join.
		byID := map[uint64]master.PeerInfo{}
		for _, p := range g.srv.Snapshot().Peers {
			byID[uint64(p.ID)] = p
		}
		for i, c := range comms {
			if p := byID[c.ID()]; p.Site != fmt.Sprintf("site%d", i%sites) {
				t.Fatalf("peer %d: master has site %q", i, p.Site)
			}
		}

		// Counts that do not divide evenly among the site's peers, and one smaller than the site.
		for k, count := range []int{1, 2, 1000, 33331} {
			part(t, fmt.Sprintf("f32 sum %d", count), func(t *testing.T) { sumOnEvery(ctx, t, comms, 3, count, k) })
		}

		avgAndIntegerOps(ctx, t, comms)

		// Every peer sent data to its successor in its WAN ring, in the other site.
		for i, c := range comms {
			_, wan, _ := pccl.HierarchyForTest(c)
			next := wan[(slices.Index(wan, c.ID())+1)%len(wan)]
			j := slices.IndexFunc(comms, func(d *pccl.Communicator) bool { return d.ID() == next })
			if g.net.Stats(hosts[i], hosts[j]) == 0 {
				t.Fatalf("peer %d sent nothing to its WAN successor %d", i, j)
			}
		}
	})
}

// TestHierarchicalPeerDies kills a peer in the middle of a hierarchical AllReduce, on two sites of
// three peers and on sites of four and three (the WAN phase on pieces): every survivor gets
// ErrPeerLeft with its buffer untouched, and the retry after UpdateTopology, hierarchical on the
// sites that remain (two and three; four and two), is correct.
func TestHierarchicalPeerDies(t *testing.T) {
	for _, tc := range []struct {
		name          string
		peers, victim int   // peer i is in site i%2
		after         []int // the sites' sizes after the death
	}{
		{"two sites of three", 6, 4, []int{2, 3}},
		{"sites of four and three", 7, 5, []int{4, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bubbled(t, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				g := newGroup(t, master.Config{})
				site := func(i int) int { return i % 2 }
				comms, hosts := g.startSitesWith(ctx, tc.peers, 1, func(i int, cfg *pccl.Config) { cfg.Site = fmt.Sprintf("site%d", site(i)) })
				defer closeAll(comms)
				requireSites(t, comms, site, []int{(tc.peers + 1) / 2, tc.peers / 2})
				const count = 1 << 18
				victim := tc.victim
				bufs := make([][]float32, len(comms))
				orig := make([][]byte, len(comms))
				for i := range comms {
					bufs[i] = fill(count, uint64(i+11))
					orig[i] = bytes.Clone(pccl.Bytes(bufs[i]))
				}
				var wg sync.WaitGroup
				errs := make([]error, len(comms))
				for i, c := range comms {
					wg.Add(1)
					go func() {
						defer wg.Done()
						b := pccl.Bytes(bufs[i])
						errs[i] = c.AllReduce(ctx, b, b, pccl.Desc{Tag: 9, Count: count, DType: pccl.F32, Op: pccl.Sum})
					}()
				}
				crashOnceMoving(t, g, hosts, victim)
				wg.Wait()
				comms[victim].Close()
				survivors, sbufs, want := survivorsAborted(t, comms, errs, bufs, orig, victim)
				errs = each(survivors, func(i int, c *pccl.Communicator) error {
					if err := c.UpdateTopology(ctx); err != nil {
						return err
					}
					orig := i // the survivor's index in comms
					if i >= victim {
						orig++
					}
					if ring, _, ok := pccl.HierarchyForTest(c); !ok || len(ring) != tc.after[site(orig)] {
						return fmt.Errorf("hierarchical %v with site ring %v after the crash, want sites of %v peers", ok, ring, tc.after)
					}
					b := pccl.Bytes(sbufs[i])
					return c.AllReduce(ctx, b, b, pccl.Desc{Tag: 9, Count: count, DType: pccl.F32, Op: pccl.Sum})
				})
				for i, c := range survivors {
					if errs[i] != nil {
						t.Fatalf("survivor %d retry: %v", i, errs[i])
					}
					if c.WorldSize() != len(survivors) {
						t.Fatalf("world size %d after the crash, want %d", c.WorldSize(), len(survivors))
					}
					for j := range want {
						if sbufs[i][j] != want[j] {
							t.Fatalf("survivor %d element %d: %v, want %v", i, j, sbufs[i][j], want[j])
						}
					}
				}
			})
		})
	}
}

// requireSites checks that every peer runs its next AllReduce hierarchically, peer i in site
// site(i), whose size is sizes[site(i)].
func requireSites(t *testing.T, comms []*pccl.Communicator, site func(i int) int, sizes []int) {
	t.Helper()
	for i, c := range comms {
		ring, _, ok := pccl.HierarchyForTest(c)
		if !ok || len(ring) != sizes[site(i)] || !slices.Contains(ring, c.ID()) {
			t.Fatalf("peer %d: hierarchical %v, site ring %v, want %d peers", i, ok, ring, sizes[site(i)])
		}
	}
}

// TestHierarchicalUnequalSites runs sites of four and two peers: the WAN phase all-reduces the pieces
// the two sites' blocks cut the buffer into, each on the ring of its owners, and every result is
// right and bit-identical, for every op and for buffers smaller than a site (on the flat ring).
func TestHierarchicalUnequalSites(t *testing.T) {
	bubbled(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		// Peer i is in site i%2, but for peer 5, in site0: site0 has peers 0, 2, 4, 5.
		site := func(i int) int {
			if i == 5 {
				return 0
			}
			return i % 2
		}
		comms, _ := g.startSitesWith(ctx, 2, 3, func(i int, cfg *pccl.Config) { cfg.Site = fmt.Sprintf("site%d", site(i)) })
		defer closeAll(comms)
		requireSites(t, comms, site, []int{4, 2})
		for k, count := range []int{1, 3, 64, 1000, 33331, 1 << 18} {
			sumOnEvery(ctx, t, comms, 1, count, k)
		}
		avgAndIntegerOps(ctx, t, comms)
		part(t, "f32 quantized bit-identical", func(t *testing.T) { quantizedSum(ctx, t, comms) })
	})
}

// TestHierarchicalQuantized runs three sites of two peers with an all-gather encoding, which the WAN
// phase applies: results are bit-identical on every peer and close to the exact sum.
func TestHierarchicalQuantized(t *testing.T) {
	bubbled(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		const sites, per = 3, 2
		comms, _ := g.startSites(ctx, sites, per)
		defer closeAll(comms)
		requireHierarchical(t, comms, sites, per)
		quantizedSum(ctx, t, comms)
	})
}

// TestHierarchicalAfterReplacement loses a peer of two sites of two, runs the retry on the flat ring,
// then admits a replacement in the same site: the next AllReduce is hierarchical again and correct.
func TestHierarchicalAfterReplacement(t *testing.T) {
	bubbled(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, hosts := g.startSites(ctx, 2, 2)
		defer closeAll(comms)
		requireHierarchical(t, comms, 2, 2)
		const victim = 3 // in site1
		g.net.Crash(hosts[victim])
		comms[victim].Close()
		survivors := comms[:victim]
		sum := func(cs []*pccl.Communicator) error {
			want := float32(0)
			for i := range cs {
				want += float32(i + 1)
			}
			errs := each(cs, func(i int, c *pccl.Communicator) error {
				v := make([]float32, 999)
				for j := range v {
					v[j] = float32(i + 1)
				}
				if err := c.AllReduce(ctx, pccl.Bytes(v), pccl.Bytes(v), pccl.Desc{Tag: 7, Count: len(v), DType: pccl.F32, Op: pccl.Sum}); err != nil {
					return err
				}
				for j := range v {
					if v[j] != want {
						return fmt.Errorf("element %d: %v, want %v", j, v[j], want)
					}
				}
				return nil
			})
			return errors.Join(errs...)
		}
		// The first AllReduce may find the crash (ErrPeerLeft) or the master may have dropped the peer
		// already (the collective then runs on the survivors); either way the retry after
		// UpdateTopology works.
		for attempt := 0; ; attempt++ {
			errs := each(survivors, func(_ int, c *pccl.Communicator) error { return c.UpdateTopology(ctx) })
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			if survivors[0].WorldSize() == len(survivors) {
				break
			}
			if attempt > 100 {
				t.Fatal("the crashed peer never left the ring")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := sum(survivors); err != nil {
			t.Fatal(err)
		}
		h := g.host()
		var newcomer *pccl.Communicator
		joined := make(chan error, 1)
		go func() {
			var err error
			newcomer, err = pccl.Connect(ctx, pccl.Config{Master: g.addr, ListenAddr: h + ":9000", Transport: g.net.Host(h),
				PartBytes: 4096, Site: "site1"})
			joined <- err
		}()
		for deadline := time.Now().Add(10 * time.Second); len(g.srv.Snapshot().Peers) != 4; {
			if time.Now().After(deadline) {
				t.Fatal("the newcomer did not register")
			}
			time.Sleep(2 * time.Millisecond)
		}
		errs := each(survivors, func(_ int, c *pccl.Communicator) error { return c.UpdateTopology(ctx) })
		if err := errors.Join(append(errs, <-joined)...); err != nil {
			t.Fatal(err)
		}
		defer newcomer.Close()
		all := append(slices.Clone(survivors), newcomer)
		requireHierarchical(t, all, 2, 2)
		if err := sum(all); err != nil {
			t.Fatal(err)
		}
	})
}

// avgAndIntegerOps runs, on every peer, an f64 Avg whose results must be bit-identical and close to the
// mean, and an i64 AllReduce of every op whose results must be exact (tags 4 and 5).
func avgAndIntegerOps(ctx context.Context, t *testing.T, comms []*pccl.Communicator) {
	t.Helper()
	n := len(comms)
	part(t, "f64 avg bit-identical", func(t *testing.T) {
		const count = 5001
		bufs := make([][]float64, n)
		want := make([]float64, count)
		for i := range bufs {
			bufs[i] = make([]float64, count)
			for j := range bufs[i] {
				bufs[i][j] = math.Sin(float64(i*count+j)) * 1e3
				want[j] += bufs[i][j]
			}
		}
		recv := make([][]float64, n)
		errs := each(comms, func(i int, c *pccl.Communicator) error {
			recv[i] = make([]float64, count)
			return c.AllReduce(ctx, pccl.Bytes(bufs[i]), pccl.Bytes(recv[i]), pccl.Desc{Tag: 4, Count: count, DType: pccl.F64, Op: pccl.Avg})
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d: %v", i, err)
			}
			if !bytes.Equal(pccl.Bytes(recv[i]), pccl.Bytes(recv[0])) {
				t.Fatalf("peer %d: result differs from peer 0's", i)
			}
			for j := range want {
				if w := want[j] / float64(n); math.Abs(recv[i][j]-w) > 1e-9*math.Max(1, math.Abs(w)) {
					t.Fatalf("peer %d element %d: %v, want %v", i, j, recv[i][j], w)
				}
			}
		}
	})

	for _, op := range []pccl.Op{pccl.Sum, pccl.Avg, pccl.Max, pccl.Min, pccl.Prod} {
		part(t, fmt.Sprintf("i64 %v", op), func(t *testing.T) {
			const count = 777
			bufs := make([][]int64, n)
			for i := range bufs {
				bufs[i] = make([]int64, count)
				for j := range bufs[i] {
					bufs[i][j] = int64((i*31+j*7)%13 + 1)
				}
			}
			want := make([]int64, count)
			for j := range want {
				acc := bufs[0][j]
				for i := 1; i < n; i++ {
					switch op {
					case pccl.Sum, pccl.Avg:
						acc += bufs[i][j]
					case pccl.Max:
						acc = max(acc, bufs[i][j])
					case pccl.Min:
						acc = min(acc, bufs[i][j])
					case pccl.Prod:
						acc *= bufs[i][j]
					}
				}
				if op == pccl.Avg {
					acc /= int64(n)
				}
				want[j] = acc
			}
			errs := each(comms, func(i int, c *pccl.Communicator) error {
				b := pccl.Bytes(bufs[i])
				return c.AllReduce(ctx, b, b, pccl.Desc{Tag: 5, Count: count, DType: pccl.I64, Op: op})
			})
			for i, err := range errs {
				if err != nil {
					t.Fatalf("peer %d: %v", i, err)
				}
				for j := range want {
					if bufs[i][j] != want[j] {
						t.Fatalf("peer %d element %d: %d, want %d", i, j, bufs[i][j], want[j])
					}
				}
			}
		})
	}
}

// quantizedSum runs an f32 Sum with an all-gather encoding (tag 6) on every peer: the results are
// bit-identical on every peer and close to the exact sum.
func quantizedSum(ctx context.Context, t *testing.T, comms []*pccl.Communicator) {
	t.Helper()
	const count = 10007
	n := len(comms)
	bufs := make([][]float32, n)
	want := make([]float32, count)
	for i := range bufs {
		bufs[i] = fill(count, uint64(i+5))
		for j, v := range bufs[i] {
			want[j] += v
		}
	}
	errs := each(comms, func(i int, c *pccl.Communicator) error {
		b := pccl.Bytes(bufs[i])
		return c.AllReduce(ctx, b, b, pccl.Desc{Tag: 6, Count: count, DType: pccl.F32, Op: pccl.Sum, Quant: pccl.MinMaxU8})
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("peer %d: %v", i, err)
		}
		if !bytes.Equal(pccl.Bytes(bufs[i]), pccl.Bytes(bufs[0])) {
			t.Fatalf("peer %d: result differs from peer 0's", i)
		}
		for j := range want {
			// One 8-bit encoding of a range of at most 2*n*100 loses at most that range / 255.
			if d := math.Abs(float64(bufs[i][j] - want[j])); d > 2*float64(n)*100/255+1 {
				t.Fatalf("peer %d element %d: %v, want %v", i, j, bufs[i][j], want[j])
			}
		}
	}
}
