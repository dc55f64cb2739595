//go:build linux || darwin || freebsd || netbsd || openbsd

package sim

import (
	"time"

	"golang.org/x/sys/unix"
)

// Wall reads the machine's monotonic clock. Inside a synctest bubble time.Now is the bubble's
// virtual clock; this is not, so a run can report how long it really took.
func Wall() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Time{}
	}
	return time.Unix(0, ts.Nano())
}
