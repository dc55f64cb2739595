package virtual

import (
	"testing"
	"time"
)

// TestRunSleepsInVirtualTime: an hour of sleep inside Run takes an hour of virtual time and next to
// no real time, and a failing function makes Run fail.
func TestRunSleepsInVirtualTime(t *testing.T) {
	start := time.Now()
	var slept time.Duration
	if err := Run(func(t *testing.T) {
		s := time.Now()
		time.Sleep(time.Hour)
		slept = time.Since(s)
	}); err != nil {
		t.Fatal(err)
	}
	if slept != time.Hour {
		t.Fatalf("slept %v of virtual time, want 1h", slept)
	}
	if time.Since(start) > time.Minute {
		t.Fatalf("an hour of virtual sleep took %v of real time", time.Since(start))
	}
	if err := Run(func(t *testing.T) { t.Error("planted failure") }); err == nil {
		t.Fatal("Run returned no error for a failing function")
	}
}
