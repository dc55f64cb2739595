package sim

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

var (
	flagDuration = flag.Duration("sim.duration", 90*time.Second, "TestSimulatedSoak: virtual time to run (CI: 8h)")
	flagSeed     = flag.Uint64("sim.seed", 0, "TestSimulatedSoak: the seed of the fault schedule (0: a fresh one, printed)")
	flagBreak    = flag.String("sim.break", "", "TestSimulatedSoak: plant a bug (stale-update in every peer, hears-silent in the master)")
	flagPeers    = flag.Int("sim.peers", 5, "TestSimulatedSoak: peer processes kept running")
	flagStall    = flag.Duration("sim.stall", 0, "TestSimulatedSoak: the stall limit (0: 20s)")
	flagClasses  = flag.String("sim.classes", "", "TestSimulatedSoak: comma-separated fault classes to deal (empty: all)")
)

// freshSeed draws a seed from the system's randomness.
func freshSeed() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

// runSoak runs one simulated soak in a bubble of its own and returns its summary.
func runSoak(t *testing.T, o Options) Summary {
	t.Helper()
	var (
		sum Summary
		err error
	)
	synctest.Test(t, func(t *testing.T) { sum, err = Run(o) })
	if err != nil {
		t.Fatalf("seed %d: %v", o.Seed, err)
	}
	return sum
}

// TestSimulatedSoak runs the whole system (a master and peers, their real code) on the in-memory
// network in virtual time, with faults from a seed, and checks every invariant of the soak. Its
// length is -sim.duration of virtual time (short by default; CI runs 8h).
func TestSimulatedSoak(t *testing.T) {
	seed := *flagSeed
	if seed == 0 {
		seed = freshSeed()
	}
	// Printed first and at once, so that even a crash of the binary leaves the seed behind.
	fmt.Fprintf(os.Stderr, "sim: seed %d, %v of virtual time, %d peers (replay: go test ./stress/sim -run TestSimulatedSoak -sim.seed %d -sim.duration %v)\n",
		seed, *flagDuration, *flagPeers, seed, *flagDuration)
	sum := runSoak(t, Options{Duration: *flagDuration, Seed: seed, Peers: *flagPeers, Break: *flagBreak, Log: os.Stderr, Wall: Wall,
		StatusEvery: statusEvery(*flagDuration), Classes: classes(*flagClasses), StallLimit: *flagStall})
	js, _ := json.Marshal(sum)
	fmt.Println(string(js))
	t.Logf("seed %d: %.0f s virtual in %.1f s wall, %d faults (fewest in a class: %d), %d ops, %d syncs, %d sessions, %d violations",
		seed, sum.VirtualS, sum.WallS, sum.FaultsTotal, sum.MinFaultClass, sum.OpsCompleted, sum.Syncs, sum.Sessions, sum.Violations)
	if sum.Violations > 0 {
		t.Fatalf("seed %d: %d violations, the first at %.1f s: %v", seed, sum.Violations, sum.FirstViolationS, sum.ViolationList[0])
	}
	if sum.OpsCompleted == 0 || sum.Syncs == 0 {
		t.Fatalf("seed %d: nothing ran: %d ops, %d syncs", seed, sum.OpsCompleted, sum.Syncs)
	}
	if *flagDuration >= 8*time.Hour && sum.MinFaultClass < 50 {
		t.Fatalf("seed %d: a fault class was dealt %d times in %v, want at least 50: %v", seed, sum.MinFaultClass, *flagDuration, sum.Faults)
	}
}

// statusEvery spaces the status lines: about forty per run.
func statusEvery(d time.Duration) time.Duration { return max(d/40, 10*time.Second) }

func classes(list string) []string {
	if list == "" {
		return nil
	}
	return strings.Split(list, ",")
}

var flagBugSeeds = flag.Int("sim.bugseeds", 1, "TestPlantedBugCaught: seeds to run (10 shows it in 10 of 10)")

// TestPlantedBugCaught plants each bug of plantedBugs (Options.Break) and runs the soak until its
// first violation: every seed must catch it within 10 minutes of virtual time, as one of the bug's
// caughtAs. stale-update, in every peer, shows as a divergence of the state (a peer that applied a
// failed step loses the election) or two hashes for one revision; hears-silent, in the master, as a
// master that kicks the cut-off side of a partition in which it hears fewer than half of the group
// before PartitionTimeout; its runs deal partitions, with kills, leaves, clock jumps and junk
// around them. -sim.bugseeds sets how many seeds run per bug (fresh ones, printed).
func TestPlantedBugCaught(t *testing.T) {
	const within = 10 * time.Minute
	for _, b := range slices.Sorted(maps.Keys(plantedBugs)) {
		brk := string(b)
		for i := range *flagBugSeeds {
			seed := freshSeed()
			if i == 0 && *flagSeed != 0 {
				seed = *flagSeed
			}
			sum := runSoak(t, Options{Duration: within, Seed: seed, Break: brk, Wall: Wall, Classes: plantedBugs[b].classes})
			if sum.Violations == 0 {
				t.Fatalf("break %s, seed %d: no violation in %v of virtual time (%d aborts)", brk, seed, within, sum.Aborts)
			}
			v, want := sum.ViolationList[0], plantedBugs[b].caughtAs
			if !slices.Contains(want, v.Kind) {
				t.Fatalf("break %s, seed %d: the first violation is %s, want one of %v", brk, seed, v, want)
			}
			t.Logf("break %s, seed %d: caught after %.1f s of virtual time (%.2f s wall): %s", brk, seed, sum.FirstViolationS, sum.WallS, v)
		}
	}
}
