package measure

import (
	"fmt"
	"runtime"
	"strconv"
)

// ProcsUsage is the help text of the --gomaxprocs flag that ParseProcs reads.
const ProcsUsage = "GOMAXPROCS of every child process: auto (cores / peers, at least 1), a number, or 0 for Go's default (one per core)"

// ParseProcs reads a --gomaxprocs value for a run of peers processes on this machine: "auto" gives
// each its share of the cores (at least one), as one deploys N peers on one machine (with Go's
// default every process runs a scheduler thread per core, and N processes then fight over them); a
// number is taken as it is, 0 meaning Go's default.
func ParseProcs(value string, peers int) (int, error) {
	if value == "auto" {
		return max(1, runtime.NumCPU()/max(peers, 1)), nil
	}
	n, err := strconv.Atoi(value)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("--gomaxprocs %q: want auto or a number >= 0", value)
	}
	return n, nil
}

// ProcsEnv returns the environment entries that set GOMAXPROCS to n in a child; none for 0.
func ProcsEnv(n int) []string {
	if n == 0 {
		return nil
	}
	return []string{"GOMAXPROCS=" + strconv.Itoa(n)}
}
