//go:build unix && !linux

package cluster

import (
	"errors"
	"syscall"
)

// sysProcAttr puts a child in a process group of its own.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// awaitExit is not available here: the supervisor learns of an exit only when it reaps the child.
func awaitExit(int) error { return errors.ErrUnsupported }
