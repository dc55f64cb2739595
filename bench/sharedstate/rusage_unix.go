//go:build unix

package main

import "syscall"

// usage is what the process has used so far: CPU seconds in user and kernel mode, and minor page
// faults (a first touch of a fresh page).
type usage struct {
	UserSeconds float64 `json:"user_seconds"`
	SysSeconds  float64 `json:"sys_seconds"`
	MinorFaults int64   `json:"minor_faults"`
}

// selfUsage returns this process's usage so far, or the zero value if the system does not say.
func selfUsage() usage {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return usage{}
	}
	sec := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return usage{UserSeconds: sec(ru.Utime), SysSeconds: sec(ru.Stime), MinorFaults: int64(ru.Minflt)}
}

// cpu returns the CPU seconds in user and kernel mode together.
func (u usage) cpu() float64 { return u.UserSeconds + u.SysSeconds }
