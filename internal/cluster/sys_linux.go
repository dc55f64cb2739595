package cluster

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// sysProcAttr puts a child in a process group of its own and asks the kernel to kill it if the thread
// that started it dies, a second guard next to the end of file on the child's stdin.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// awaitExit blocks until the process pid has terminated, without reaping it: its pid (and so its
// process group id) cannot be reused until the caller reaps it.
func awaitExit(pid int) error {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return err
		}
	}
}
