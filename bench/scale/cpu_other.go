//go:build !linux

package main

import "time"

// processCPU is not available on this platform: the measurements fall back to wall time.
func processCPU() (time.Duration, bool) { return 0, false }
