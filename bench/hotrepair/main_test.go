package main

import (
	"context"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/netlab"
)

// TestMain runs the node processes that the end-to-end test starts: this test binary re-executed
// inside a namespace with the node flags.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "--node-index" {
		os.Exit(run(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

func TestSpanIsFromTheLastStartToTheLastEnd(t *testing.T) {
	rs := []report{{StartNs: 100, EndNs: 900}, {StartNs: 300, EndNs: 1300}, {StartNs: 200, EndNs: 1000}}
	if got := span(rs); got != 1000e-9 {
		t.Errorf("span = %v, want 1e-6", got)
	}
}

func TestMeasureRepairTakesTheWorstPath(t *testing.T) {
	b := &bench{faultNs: 1_000_000_000}
	ms := int64(time.Millisecond)
	healthy := []report{
		{Node: 0},
		{Node: 1, Stats: nodeStats{RetransmittedBytes: 10}},
		{Node: 2},
		{Node: 3, Stats: nodeStats{Failovers: 1, AffectedPaths: []string{"3->0/ch0"}}},
	}
	failed := []report{
		{Node: 0, Stats: nodeStats{ChunkBytes: 100, RetransmittedBytes: 150, Failovers: 1, FirstDetectNs: b.faultNs + 5*ms,
			FirstResumeNs: b.faultNs + 12*ms, AffectedPaths: []string{"0->1/ch1"}}},
		{Node: 1, Stats: nodeStats{RetransmittedBytes: 110, Failovers: 1, FirstDetectNs: b.faultNs + 1*ms,
			FirstResumeNs: b.faultNs + 4*ms, AffectedPaths: []string{"1->2/ch1"}}},
		{Node: 2, Stats: nodeStats{FirstDetectNs: b.faultNs + 3*ms}},
		// Node 3 raised a false alarm before the fault: its path is not new and its times are unknown.
		{Node: 3, Stats: nodeStats{Failovers: 1, FirstDetectNs: b.faultNs - 500*ms, FirstResumeNs: b.faultNs - 400*ms,
			AffectedPaths: []string{"3->0/ch0"}}},
	}
	res := result{ChunkBytes: 100}
	b.measureRepair(&res, healthy, failed)
	if res.AffectedChannels != 2 || !slices.Equal(res.AffectedPaths, []string{"0->1/ch1", "1->2/ch1"}) {
		t.Errorf("affected %d %v, want 0->1/ch1 and 1->2/ch1", res.AffectedChannels, res.AffectedPaths)
	}
	if res.RetransmittedBytes != 250 || res.RetransmittedLimit != 400 || res.Failovers != 2 || res.EarlyDetections != 1 {
		t.Errorf("retransmitted %d (limit %d), failovers %d, early %d, want 250 (400), 2, 1",
			res.RetransmittedBytes, res.RetransmittedLimit, res.Failovers, res.EarlyDetections)
	}
	// Path 0->1: both know at +5ms, resumed at +12ms. Path 1->2: both know at +3ms, resumed at +4ms.
	if math.Abs(res.DetectMs-5) > 1e-9 || math.Abs(res.RepairMs-7) > 1e-9 {
		t.Errorf("detect %vms repair %vms, want 5 and 7", res.DetectMs, res.RepairMs)
	}
}

// TestHotRepairEndToEnd runs a small bench: real node processes in namespaces, one NIC taken down in
// the middle of the second AllReduce. It checks the results and that the repair happened, never how
// long anything took; its deadlines are generous, so that a slow (race-instrumented, shared) machine
// raises no false alarm.
func TestHotRepairEndToEnd(t *testing.T) {
	if err := netlab.Available(); err != nil {
		t.Skipf("netns testbed unavailable: %v (run as root)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	b := &bench{nodes: 3, nics: 2, mbit: 200, size: 16 << 20, port: 7400, failNode: 1, failNIC: 1,
		timeout: 60 * time.Second, ackTimeout: time.Second, probeTimeout: 500 * time.Millisecond, faultAt: 0.2}
	res, err := b.run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Correct {
		t.Errorf("results not correct: %+v", res)
	}
	if !res.FaultDuringCall {
		t.Skipf("the NIC went down after the call had ended on a node (a slow machine): %+v", res)
	}
	if res.AffectedChannels == 0 || res.Failovers == 0 || res.DetectMs < 0 {
		t.Errorf("no repair seen: %+v", res)
	}
	if got := labLeft(t, b.lab.Name()); got != 0 {
		t.Errorf("%d namespaces left after the bench", got)
	}
}

func labLeft(t *testing.T, name string) int {
	entries, err := os.ReadDir("/var/run/netns")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if len(e.Name()) > len(name) && e.Name()[:len(name)+1] == name+"-" {
			n++
		}
	}
	return n
}
