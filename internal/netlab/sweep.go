package netlab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Sweep deletes the named namespaces that start with prefix and belong to a process that no longer
// exists (the process id follows the prefix), and returns how many it deleted. Namespaces of live
// processes, such as a test binary running in parallel, are left alone. Deleting a node's namespace
// also removes its veth pairs; nothing of a lab lives outside its namespaces.
func Sweep(prefix string) (int, error) {
	if prefix == "" {
		return 0, errors.New("netlab: Sweep needs a prefix")
	}
	entries, err := os.ReadDir(nsDir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("netlab: sweep: %w", err)
	}
	removed := 0
	var errs []error
	for _, e := range entries {
		pid, ok := ownerPID(e.Name(), prefix)
		if !ok || alive(pid) {
			continue
		}
		if err := deleteNamed(e.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("netlab: sweep %s: %w", e.Name(), err))
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

// deleteNamed unmounts and removes the named namespace. Where another tool bind-mounted the namespace
// directory over itself (as container runtimes do, to share it) after the namespace was named, the
// name has mounts at more than one layer: they are detached one by one until the file can go.
func deleteNamed(name string) error {
	err := netns.DeleteNamed(name)
	if err == nil || errors.Is(err, os.ErrNotExist) {
		return err
	}
	p := filepath.Join(nsDir, name)
	for range 8 {
		if unix.Unmount(p, unix.MNT_DETACH) != nil {
			break
		}
	}
	if rerr := os.Remove(p); rerr == nil || errors.Is(rerr, os.ErrNotExist) {
		return nil
	}
	return err
}

// ownerPID parses the process id out of a namespace name "<prefix><pid>-...".
func ownerPID(name, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	digits, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(digits)
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, true
}

// alive reports whether process pid exists. A zombie counts as alive: it still holds its id.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
