package main

import (
	"math"
	"reflect"
	"testing"

	"github.com/concord-ccl/concord/bench/internal/measure"
	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/plan"
)

func TestRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--nodes", "2"},
		{"--nics", "2"},
		{"--size", "6"},
		{"--reps", "0"},
		{"--nic-mbit", "0"},
		{"--gso", "4000"},
		{"--gso", "600000"},
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

// TestCalibrationReports: the parent takes the nodes' table only when every node reported the same
// one, and prints it in Mbit/s and µs with unmeasured NICs as 0.
func TestCalibrationReports(t *testing.T) {
	cal := rdma.Calibration{Alpha: [][]float64{{1e-4, 0}, {2.5e-4, 3e-4}}, Beta: [][]float64{{8 / 400e6, 0}, {8 / 395e6, 8 / 401e6}}}
	other := rdma.Calibration{Alpha: [][]float64{{1e-4, 0}, {2.5e-4, 3e-4}}, Beta: [][]float64{{8 / 400e6, 0}, {8 / 395e6, 8 / 402e6}}}
	got, err := sameCalibration([]report{{Node: 0, Calibration: &cal}, {Node: 1, Calibration: &cal}})
	if err != nil || !reflect.DeepEqual(got, cal) {
		t.Fatalf("the same table twice: %+v, %v", got, err)
	}
	if _, err := sameCalibration([]report{{Node: 0, Calibration: &cal}, {Node: 1, Calibration: &other}}); err == nil {
		t.Error("two different tables: no error")
	}
	if _, err := sameCalibration([]report{{Node: 0, Calibration: &cal}, {Node: 1}}); err == nil {
		t.Error("a node without a table: no error")
	}
	c := calibrationOf(cal)
	if want := [][]float64{{400, 0}, {395, 401}}; !reflect.DeepEqual(c.Mbit, want) {
		t.Errorf("Mbit %v, want %v", c.Mbit, want)
	}
	if want := [][]float64{{100, 0}, {250, 300}}; !reflect.DeepEqual(c.AlphaMicros, want) {
		t.Errorf("alpha %v, want %v", c.AlphaMicros, want)
	}
	mlo, mhi := span(c.Mbit)
	alo, ahi := span(c.AlphaMicros)
	if mlo != 395 || mhi != 401 || alo != 100 || ahi != 300 {
		t.Errorf("spans %v %v %v %v, want 395 401 100 300 (zeros left out)", mlo, mhi, alo, ahi)
	}
}

// TestWithDown sets exactly the given NICs down on a copy.
func TestWithDown(t *testing.T) {
	base := topology(4, 4, 400, [][2]int{{0, 0}})
	got := withDown(base, [][2]int{{1, 2}, {3, 0}})
	for i := range 4 {
		for j := range 4 {
			want := i == 1 && j == 2 || i == 3 && j == 0
			if got.Nodes[i].NICs[j].Down != want {
				t.Errorf("node %d NIC %d: down %v, want %v", i, j, got.Nodes[i].NICs[j].Down, want)
			}
		}
	}
	if !base.Nodes[0].NICs[0].Down || base.Nodes[1].NICs[2].Down {
		t.Error("withDown changed its argument")
	}
}

// TestCPUBusy: a measurement's cpu_busy is over all its calls' CPU time together, and an interval
// that went backwards is left out.
func TestCPUBusy(t *testing.T) {
	m := newMeasured()
	m.addCPU(measure.CPUTimes{Busy: 10, Total: 100}, measure.CPUTimes{Busy: 100, Total: 200}) // 0.9
	m.addCPU(measure.CPUTimes{Busy: 0, Total: 0}, measure.CPUTimes{Busy: 150, Total: 300})    // 0.5
	if want := 240.0 / 400; m.CPUBusy != want {
		t.Errorf("cpu_busy %v after two calls, want %v", m.CPUBusy, want)
	}
	m.addCPU(measure.CPUTimes{Busy: 50, Total: 500}, measure.CPUTimes{Busy: 60, Total: 400})
	if want := 240.0 / 400; m.CPUBusy != want {
		t.Errorf("cpu_busy %v after an interval that went backwards, want %v", m.CPUBusy, want)
	}
}
