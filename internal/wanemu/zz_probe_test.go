package wanemu

import (
	"testing"
	"time"
)

func TestZZProbeRing(t *testing.T) {
	for _, k := range []int{1, 4, 16} {
		tb := startTestbed(t, Config{Sites: 4, MTU: 9000, Link: Link{Delay: 50 * time.Millisecond, CapacityMbit: 1000, FlowMbit: 100}})
		var runs []*tcpRun
		for i := 0; i < 4; i++ {
			runs = append(runs, startTCP(t, tb, i, (i+1)%4, k, 0))
		}
		done := make(chan []float64, 4)
		for _, r := range runs {
			go func() { done <- r.measure(3*time.Second, 3*time.Second) }()
		}
		for range runs {
			t.Logf("k=%d site total %.0f Mbit/s", k, sum(<-done))
		}
		tb.Close()
	}
}
