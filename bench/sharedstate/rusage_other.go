//go:build !unix

package main

// usage is what the process has used so far; this system does not report it.
type usage struct {
	UserSeconds float64 `json:"user_seconds"`
	SysSeconds  float64 `json:"sys_seconds"`
	MinorFaults int64   `json:"minor_faults"`
}

// selfUsage returns the zero value: the system does not report usage here.
func selfUsage() usage { return usage{} }

// cpu returns the CPU seconds in user and kernel mode together.
func (u usage) cpu() float64 { return u.UserSeconds + u.SysSeconds }
