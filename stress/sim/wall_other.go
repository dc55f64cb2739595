//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package sim

import "time"

// Wall returns the zero time where the machine's monotonic clock cannot be read from inside a
// synctest bubble: no wall time is reported there.
func Wall() time.Time { return time.Time{} }
