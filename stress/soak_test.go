package main

import (
	"fmt"
	"slices"
	"testing"
)

// TestStderrWatchCondensesRaces: a child's race report reaches the failure report as its accesses,
// goroutine headers and the project's frames, prefix stripped.
func TestStderrWatchCondensesRaces(t *testing.T) {
	w := &stderrWatch{}
	for _, l := range []string{
		"peer-1: starting",
		"peer-1: ==================",
		"peer-1: WARNING: DATA RACE",
		"peer-1: Read at 0x00c001be1170 by goroutine 8142:",
		"peer-1:   runtime.mapaccess1_fast64()",
		"peer-1:       /usr/local/go/src/internal/runtime/maps/runtime_fast64.go:15 +0x0",
		"peer-1:   github.com/concord-ccl/concord/pccl.(*fetcher).servable()",
		"peer-1:       /w/pccl/fetch.go:475 +0x62d",
		"peer-1: ",
		"peer-1: Previous write at 0x00c001be1170 by goroutine 8140:",
		"peer-1:   github.com/concord-ccl/concord/pccl.(*Communicator).fetchAll()",
		"peer-1:       /w/pccl/fetch.go:182 +0x1a9c",
		"peer-1: Goroutine 8142 (running) created at:",
		"peer-1:   sync.(*WaitGroup).Go()",
		"peer-1:       /usr/local/go/src/sync/waitgroup.go:238 +0x72",
		"peer-1: ==================",
		"peer-1: after",
	} {
		fmt.Fprintln(w, l)
	}
	want := []string{
		"DATA RACE:",
		"  Read at 0x00c001be1170 by goroutine 8142:",
		"    github.com/concord-ccl/concord/pccl.(*fetcher).servable() /w/pccl/fetch.go:475 +0x62d",
		"  Previous write at 0x00c001be1170 by goroutine 8140:",
		"    github.com/concord-ccl/concord/pccl.(*Communicator).fetchAll() /w/pccl/fetch.go:182 +0x1a9c",
		"  Goroutine 8142 (running) created at:",
	}
	if !slices.Equal(w.races, want) {
		t.Fatalf("condensed race:\n%q\nwant\n%q", w.races, want)
	}
	if len(w.takeCrashes()) != 1 {
		t.Fatal("the race is not a crash")
	}
}
