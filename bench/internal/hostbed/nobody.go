package hostbed

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/concord-ccl/concord/internal/cluster"
)

// RunAsNobody runs role of the running executable (a cluster.Main program) as user 65534 with args,
// from a copy of the executable that user may run, and returns its exit status, its stderr and how
// many processes the run started. The benchmarks' tests use it to check that --hosts without root
// fails before starting anything. It needs root.
func RunAsNobody(ctx context.Context, role string, args ...string) (code int, stderr string, procs int, err error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, "", 0, err
	}
	bin, err := os.ReadFile(exe)
	if err != nil {
		return 0, "", 0, err
	}
	dir, err := os.MkdirTemp("", "hosts-need-root-")
	if err != nil {
		return 0, "", 0, err
	}
	defer os.RemoveAll(dir)
	exe = filepath.Join(dir, "cmd")
	if err := os.Chmod(dir, 0o755); err != nil {
		return 0, "", 0, err
	}
	if err := os.WriteFile(exe, bin, 0o755); err != nil {
		return 0, "", 0, err
	}
	var out bytes.Buffer
	c := cluster.New(cluster.Config{Executable: exe, Stderr: &out})
	defer c.Close()
	nobody := func(cmd *exec.Cmd) error {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 65534, Gid: 65534}
		return cmd.Start()
	}
	p, err := c.Spawn(cluster.Spec{Role: role, Args: args, Start: nobody})
	if err != nil {
		return 0, "", 0, err
	}
	if code, err = p.Wait(ctx); err != nil {
		return 0, "", 0, err
	}
	c.Close() // the child's stderr has been copied
	return code, out.String(), len(c.Procs()), nil
}
