package main

import (
	"bytes"
	"context"
	"runtime/pprof"
	"sync"
	"testing"
)

// work burns CPU in proportion to n.
func work(n int) int {
	x := 0
	for i := range n * 1_000_000 {
		x += i ^ (i >> 3)
	}
	return x
}

// TestLabelledCPUCountsOnlyTheLabel: a goroutine labelled busy does three times the work of one
// labelled other, under one CPU profile; the busy one gets the larger share, and a label that no
// goroutine carries gets nothing.
func TestLabelledCPUCountsOnlyTheLabel(t *testing.T) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		t.Skipf("no CPU profile: %v", err)
	}
	var wg sync.WaitGroup
	var sink [2]int
	wg.Go(func() {
		pprof.Do(context.Background(), pprof.Labels("role", "busy"), func(context.Context) { sink[0] = work(600) })
	})
	wg.Go(func() {
		pprof.Do(context.Background(), pprof.Labels("role", "other"), func(context.Context) { sink[1] = work(200) })
	})
	wg.Wait()
	pprof.StopCPUProfile()
	busy, err := labelledCPU(buf.Bytes(), "role", "busy")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := labelledCPU(buf.Bytes(), "role", "other")
	none, _ := labelledCPU(buf.Bytes(), "role", "nobody")
	if busy <= other || other <= 0 || none != 0 {
		t.Fatalf("busy %.3f s, other %.3f s, nobody %.3f s: want busy > other > 0 and nobody 0 (%v)", busy, other, none, sink)
	}
	t.Logf("busy %.3f s, other %.3f s of CPU", busy, other)
}
