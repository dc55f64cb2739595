package main

import (
	"time"

	"golang.org/x/sys/unix"
)

// processCPU returns the CPU time this process has used, every thread included (the garbage
// collector's workers too), and whether the platform can tell. Unlike wall time it does not count the
// time the process waited for a CPU on a loaded machine.
func processCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
