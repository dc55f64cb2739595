package main

import (
	"math"
	"testing"

	"github.com/concord-ccl/concord/rdma/plan"
)

func TestRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--nodes", "2"},
		{"--nics", "2"},
		{"--size", "6"},
		{"--reps", "0"},
		{"--nic-mbit", "0"},
	} {
		if got := run(args); got != 2 {
			t.Errorf("%v: exit %d, want 2", args, got)
		}
	}
}

func TestStrategyNames(t *testing.T) {
	for _, st := range plan.AllStrategies {
		got, ok := strategyByName(st.String())
		if !ok || got != st {
			t.Errorf("%v: got %v %v", st, got, ok)
		}
	}
	if _, ok := strategyByName("planner"); ok {
		t.Error("planner is not a strategy")
	}
}

// TestScenarios checks the cases' degraded topologies: the lost fractions the benchmark names and
// that every strategy it measures applies there.
func TestScenarios(t *testing.T) {
	wantX := map[string]float64{"healthy": 0, "one_nic_x25": 0.25, "two_nics_x50": 0.5, "two_nodes_two_rails": 0.25}
	for _, sc := range scenarios() {
		topo := topology(4, 4, 400, sc.down)
		x := 0.0
		for i := range topo.Nodes {
			x = max(x, 1-topo.NodeBandwidth(i)/(4*400e6/8))
		}
		if math.Abs(x-wantX[sc.name]) > 1e-9 {
			t.Errorf("%s: lost fraction %v, want %v", sc.name, x, wantX[sc.name])
		}
		for _, st := range sc.strategies {
			e, err := plan.Cost(topo, st, 256<<20, plan.Model{})
			if err != nil || math.IsInf(e.Seconds, 1) {
				t.Errorf("%s: %v does not apply (%v)", sc.name, st, err)
			}
		}
	}
}
