package plan

import (
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
)

func TestApportionExactAndProportional(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for it := 0; it < 2000; it++ {
		n := 1 + r.IntN(9)
		w := make([]float64, n)
		sum := 0.0
		for i := range w {
			if r.IntN(4) > 0 {
				w[i] = r.Float64() * 10
			}
			sum += w[i]
		}
		total := r.Int64N(1 << 40)
		align := []int64{1, 2, 4, 8, 4096}[r.IntN(5)]
		got := Apportion(total, w, align)
		var s int64
		tail := total % align
		for i, g := range got {
			s += g
			if g < 0 {
				t.Fatalf("negative share %d", g)
			}
			exact := float64(total) / float64(n)
			if sum > 0 {
				exact = float64(total) * w[i] / sum
			}
			if math.Abs(float64(g)-exact) > float64(align+tail)+1e-6*float64(total) {
				t.Fatalf("share %d = %d, exact %.1f, align %d", i, g, exact, align)
			}
			if sum > 0 && w[i] == 0 && g != 0 {
				t.Fatalf("zero weight got %d bytes", g)
			}
		}
		if s != total {
			t.Fatalf("shares %v sum to %d, want %d", got, s, total)
		}
		if again := Apportion(total, w, align); !reflect.DeepEqual(got, again) {
			t.Fatalf("not deterministic: %v vs %v", got, again)
		}
	}
	if got := Apportion(10, []float64{1, 1, 1}, 1); !reflect.DeepEqual(got, []int64{4, 3, 3}) {
		t.Errorf("ties: got %v, want [4 3 3] (lower index first)", got)
	}
}

func FuzzApportion(f *testing.F) {
	f.Add(int64(1000), 1.0, 2.0, 3.0, int64(4))
	f.Fuzz(func(t *testing.T, total int64, a, b, c float64, align int64) {
		if total < 0 || total > 1<<50 || align > 1<<20 {
			return
		}
		got := Apportion(total, []float64{a, b, c}, align)
		var s int64
		for _, g := range got {
			if g < 0 {
				t.Fatalf("negative share in %v", got)
			}
			s += g
		}
		if s != total {
			t.Fatalf("Apportion(%d, %v,%v,%v, %d) = %v sums to %d", total, a, b, c, align, got, s)
		}
	})
}

func TestBalanceRoutesProportionalAndNearFirst(t *testing.T) {
	tp := Uniform(2, 8, 2, 0, 50e9) // NICs 0-3 in NUMA 0, 4-7 in NUMA 1
	n := tp.Nodes[0]
	n.NICs[1].Down = true
	n.NICs[6].Beta *= 2 // half speed
	const bytes = 1 << 30
	routes := BalanceRoutes(n, 8, bytes, 4)
	perNIC := make([]int64, 8)
	var sum int64
	for _, r := range routes {
		perNIC[r.NIC] += r.Bytes
		sum += r.Bytes
		if r.Bytes%4 != 0 {
			t.Errorf("route %+v not aligned to 4", r)
		}
	}
	if sum != bytes {
		t.Fatalf("routes sum to %d, want %d", sum, bytes)
	}
	bw := make([]float64, 8)
	for j, nic := range n.NICs {
		bw[j] = nic.Bandwidth()
	}
	if want := Apportion(bytes, bw, 4); !reflect.DeepEqual(perNIC, want) {
		t.Errorf("per-NIC bytes %v, want proportional to bandwidth %v", perNIC, want)
	}
	// Channel 1 (failed NIC, NUMA 0) goes first to NUMA-0 NICs, then across the CPU link.
	sawCross := false
	for _, r := range routes {
		if r.Channel != 1 {
			continue
		}
		switch {
		case r.NIC < 4 && r.Path != NUMALocal:
			t.Errorf("route %+v: same NUMA NIC should be numa path", r)
		case r.NIC >= 4 && r.Path != CPULink:
			t.Errorf("route %+v: other NUMA NIC should be cpu_link path", r)
		case r.NIC >= 4:
			sawCross = true
		case sawCross:
			t.Errorf("route %+v to the local NUMA domain after a cross-NUMA route", r)
		}
	}
	if again := BalanceRoutes(n, 8, bytes, 4); !reflect.DeepEqual(routes, again) {
		t.Error("BalanceRoutes not deterministic")
	}
}

func TestBuildSplitsExactly(t *testing.T) {
	tp := Uniform(8, 8, 2, 2e-6, 25e9)
	tp.Nodes[2].NICs[0].Down = true
	tp.Nodes[2].NICs[5].Down = true
	tp.Nodes[2].NICs[7].Down = true
	tp.Nodes[6].NICs[3].Down = true
	for _, s := range AllStrategies {
		if s == Ring {
			continue
		}
		for _, bytes := range []int64{1000003, 1 << 32} {
			e := mustCost(t, tp, s, float64(bytes), Model{})
			p, err := Build(tp, e, bytes, 8, Model{})
			if err != nil {
				t.Fatal(err)
			}
			var off int64
			for k, part := range p.Parts {
				if part.Offset != off {
					t.Errorf("%v part %d offset %d, want %d", s, k, part.Offset, off)
				}
				off += part.Bytes
				var o int64
				for _, b := range part.Owners {
					o += b
				}
				if o != part.Bytes || len(part.Owners) != len(part.Ring) {
					t.Errorf("%v part %d: owners %v for %d bytes on %d nodes", s, k, part.Owners, part.Bytes, len(part.Ring))
				}
				if k > 0 && len(part.Leaves)+len(part.BroadcastTo) != len(tp.Nodes)-len(part.Ring) {
					t.Errorf("%v part %d: ring %v, leaves %v, broadcast %v do not cover the nodes", s, k, part.Ring, part.Leaves, part.BroadcastTo)
				}
				for i := 1; i < len(part.BroadcastTo); i++ {
					if tp.NodeBandwidth(part.BroadcastTo[i]) > tp.NodeBandwidth(part.BroadcastTo[i-1]) {
						t.Errorf("%v part %d: broadcast order %v not fastest first", s, k, part.BroadcastTo)
					}
				}
			}
			if off != bytes {
				t.Errorf("%v: parts sum to %d, want %d", s, off, bytes)
			}
			for u, rs := range p.Routes {
				var sum int64
				for _, r := range rs {
					sum += r.Bytes
					if tp.Nodes[u].NICs[r.NIC].Down && r.Bytes > 0 {
						t.Errorf("%v node %d: %d bytes routed to a failed NIC", s, u, r.Bytes)
					}
				}
				if sum != bytes {
					t.Errorf("%v node %d: routes sum to %d, want %d", s, u, sum, bytes)
				}
			}
			again, _ := Build(tp, e, bytes, 8, Model{})
			if !reflect.DeepEqual(p, again) {
				t.Errorf("%v: Build not deterministic", s)
			}
		}
	}
}
