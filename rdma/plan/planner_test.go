package plan

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestPlannerChoosesTheArgmin(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for it := 0; it < 25; it++ {
		n := 2 + r.IntN(8)
		tp := Uniform(n, 8, 2, 1e-6*(1+r.Float64()), 25e9)
		for k := r.IntN(6); k > 0; k-- {
			u, j := r.IntN(n), r.IntN(8)
			if tp.NodeBandwidth(u) > tp.Nodes[u].NICs[j].Bandwidth() {
				tp.Nodes[u].NICs[j].Down = true
			}
		}
		for i := range tp.Nodes { // measured β differs a little per NIC
			for j := range tp.Nodes[i].NICs {
				tp.Nodes[i].NICs[j].Beta *= 1 + 0.2*r.Float64()
			}
		}
		for _, bytes := range []int64{4 << 10, 1 << 20, 64 << 20, 4 << 30} {
			for _, cfg := range []Config{{}, {Strategies: R2CCLStrategies}, {Model: Model{BroadcastAtDegraded: true}}} {
				p, err := Choose(tp, bytes, cfg)
				if err != nil {
					t.Fatal(err)
				}
				es, err := Estimates(tp, bytes, cfg)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range es {
					if e.Seconds < p.Seconds {
						t.Errorf("it %d, %d bytes: chose %v at %.6g s but %v takes %.6g s", it, bytes, p.Strategy, p.Seconds, e.Strategy, e.Seconds)
					}
				}
				if p.Seconds < p.IdealSeconds*(1-1e-12) {
					t.Errorf("it %d: %v plan %.6g s below ideal %.6g s: %+v", it, p.Strategy, p.Seconds, p.IdealSeconds, p.Estimate)
				}
			}
		}
	}
}

func TestPlannerReplansOnFailureAndHeal(t *testing.T) {
	tp := Uniform(4, 4, 2, 0, 25e9)
	p, err := NewPlanner(tp, Config{Strategies: R2CCLStrategies})
	if err != nil {
		t.Fatal(err)
	}
	const big = 1 << 32
	want := func(s Strategy, version uint64) {
		t.Helper()
		pl, err := p.Plan(big)
		if err != nil {
			t.Fatal(err)
		}
		if pl.Strategy != s || pl.Version != version {
			t.Fatalf("plan %v at version %d, want %v at version %d", pl.Strategy, pl.Version, s, version)
		}
	}
	want(Ring, 0)
	// One NIC of four down: X = 0.25 < ng/(3ng−2) = 16/46, so the standard ring under Balance.
	if ch, err := p.SetNICDown(2, 1, true); err != nil || !ch {
		t.Fatalf("SetNICDown: %v %v", ch, err)
	}
	want(Balance, 1)
	// Two of four: X = 0.5, above the crossover: R²CCL-AllReduce.
	if _, err := p.SetNICDown(2, 3, true); err != nil {
		t.Fatal(err)
	}
	want(R2CCL, 2)
	if ch, _ := p.SetNICDown(2, 3, true); ch {
		t.Error("marking a down NIC down again reported a change")
	}
	if _, err := p.SetNICDown(2, 1, false); err != nil {
		t.Fatal(err)
	}
	if _, err := p.SetNICDown(2, 3, false); err != nil {
		t.Fatal(err)
	}
	want(Ring, 4)
	if _, err := p.SetNICDown(9, 0, true); err == nil {
		t.Error("SetNICDown on a missing node succeeded")
	}
	if est, err := p.Estimates(big); err != nil || len(est) != len(R2CCLStrategies) || math.IsInf(est[0].Seconds, 1) {
		t.Errorf("Estimates: %v %v", est, err)
	}
}
