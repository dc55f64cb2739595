package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/hosts"
)

// readmeCommands returns the master and peer command lines of the README's "Several machines"
// section, as written, and the master address they use.
func readmeCommands(t *testing.T) (master string, run, train []string, addr string) {
	t.Helper()
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Several machines\n")
	if !ok {
		t.Fatal(`README.md has no "## Several machines" section`)
	}
	_, block, _ := strings.Cut(section, "```sh\n")
	block, _, _ = strings.Cut(block, "```")
	for _, line := range strings.Split(block, "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		switch {
		case len(f) > 0 && f[0] == "master":
			master = strings.Join(f, " ")
		case len(f) > 1 && f[0] == "peer" && f[1] == "run":
			run = f
		case len(f) > 1 && f[0] == "peer" && f[1] == "train":
			train = f
		}
	}
	if master == "" || run == nil || train == nil {
		t.Fatalf("the README's block lacks a master, peer run or peer train line:\n%s", block)
	}
	m := regexp.MustCompile(`--master (\S+):\d+`).FindStringSubmatch(strings.Join(run, " "))
	if m == nil {
		t.Fatal("the README's peer run line names no --master host:port")
	}
	return master, run, train, m[1]
}

// buildBinaries builds master and peer into a temporary directory.
func buildBinaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, pkg := range []string{"../master", "."} {
		name := filepath.Base(pkg)
		if pkg == "." {
			name = "peer"
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, name), pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return dir
}

// TestReadmeCommandsOnFourHosts runs the README's multi-machine commands exactly as written, on four
// hosts with their own addresses (network namespaces on one bridge): the master on one, three peers
// of `peer run` on the others, then three of `peer train`, over tls (the default with the run secret),
// tcp and quic. Only the master's address and, for tcp and quic, --transport are filled in; the
// peers' step counts and the master's MinPeers (so that every peer takes part from the first step)
// come from their environment twins. Every peer must finish with the same state.
func TestReadmeCommandsOnFourHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both commands and runs them on four hosts")
	}
	if raceBuild {
		t.Skip("runs the commands as separate binaries, built without the race detector: run without -race")
	}
	if err := hosts.Available(); err != nil {
		t.Skipf("runs on network namespaces, which need root: %v", err)
	}
	master, run, train, example := readmeCommands(t)
	bin := buildBinaries(t)
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "run.secret"), []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tr := range []string{"tls", "tcp", "quic"} {
		for _, job := range []struct {
			name string
			line []string
			env  []string
		}{
			{"run", run, []string{"CONCORD_STEPS=20", "CONCORD_SIZE=1048576"}},
			{"train", train, []string{"CONCORD_STEPS=3", "CONCORD_H=5"}},
		} {
			t.Run(tr+"/"+job.name, func(t *testing.T) {
				bed, err := hosts.New(hosts.Config{Hosts: 4})
				if err != nil {
					t.Fatal(err)
				}
				defer bed.Close()
				addr := bed.Host(0).Addr().String()
				args := func(line string) []string {
					f := strings.Fields(strings.ReplaceAll(line, example, addr))
					if tr != "tls" {
						f = append(f, "--transport", tr)
					}
					return f
				}
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				m := start(t, ctx, bed.Host(0), bin, work, args(master), []string{"CONCORD_MIN_PEERS=3"})
				defer m.stop()
				var wg sync.WaitGroup
				peers := make([]*proc, 3)
				for i := range peers {
					peers[i] = start(t, ctx, bed.Host(i+1), bin, work, args(strings.Join(job.line, " ")), job.env)
				}
				for _, p := range peers {
					wg.Go(func() { p.wait() })
				}
				wg.Wait()
				states := map[string]bool{}
				for i, p := range peers {
					if p.err != nil {
						t.Fatalf("peer %d on %s: %v\n%s\nmaster:\n%s", i+1, bed.Host(i+1).Addr(), p.err, p.out.String(), m.out.String())
					}
					st := regexp.MustCompile(`state ([0-9a-f]{16})`).FindStringSubmatch(p.out.String())
					if st == nil {
						t.Fatalf("peer %d printed no final state:\n%s", i+1, p.out.String())
					}
					states[st[1]] = true
				}
				if len(states) != 1 {
					t.Fatalf("the peers ended with %d different states: %v", len(states), states)
				}
			})
		}
	}
}

// TestIPv6RunWithMasterByName runs the README's master and `peer run` lines on four hosts that have
// IPv6 addresses only, the peers naming the master by a DNS name (resolved through their /etc/hosts).
func TestIPv6RunWithMasterByName(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both commands and runs them on four hosts")
	}
	if raceBuild {
		t.Skip("runs the commands as separate binaries, built without the race detector: run without -race")
	}
	if err := hosts.Available(); err != nil {
		t.Skipf("runs on network namespaces, which need root: %v", err)
	}
	master, run, _, example := readmeCommands(t)
	bin := buildBinaries(t)
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "run.secret"), []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bed, err := hosts.New(hosts.Config{Hosts: 4, IPv6: true, Names: map[string]int{"master.run.test": 0}})
	if err != nil {
		t.Fatal(err)
	}
	defer bed.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m := start(t, ctx, bed.Host(0), bin, work, strings.Fields(master), []string{"CONCORD_MIN_PEERS=3"})
	defer m.stop()
	line := strings.Fields(strings.ReplaceAll(strings.Join(run, " "), example, "master.run.test"))
	peers := make([]*proc, 3)
	for i := range peers {
		peers[i] = start(t, ctx, bed.Host(i+1), bin, work, line, []string{"CONCORD_STEPS=10", "CONCORD_SIZE=262144"})
	}
	states := map[string]bool{}
	for i, p := range peers {
		p.wait()
		if p.err != nil {
			t.Fatalf("peer %d: %v\n%s\nmaster:\n%s", i+1, p.err, p.out.String(), m.out.String())
		}
		st := regexp.MustCompile(`state ([0-9a-f]{16})`).FindStringSubmatch(p.out.String())
		if st == nil {
			t.Fatalf("peer %d printed no final state:\n%s", i+1, p.out.String())
		}
		states[st[1]] = true
	}
	if len(states) != 1 {
		t.Fatalf("the peers ended with %d different states: %v", len(states), states)
	}
	for i := 1; i < 4; i++ {
		if want := bed.Host(i).Addr().String(); !strings.Contains(m.out.String(), "addr ["+want+"]:") {
			t.Errorf("the master's log names no peer advertising [%s]:port:\n%s", want, m.out.String())
		}
	}
}

// proc is a command started on a host, its output kept: stdout alone, and both streams together.
type proc struct {
	cmd    *exec.Cmd
	stdout *syncBuffer
	out    *syncBuffer
	err    error
	done   chan struct{}
}

// start starts args (whose first word is a binary in bin) on host h in directory dir.
func start(t *testing.T, ctx context.Context, h *hosts.Host, bin, dir string, args, env []string) *proc {
	t.Helper()
	cmd := h.Command(filepath.Join(bin, args[0]), args[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	p := &proc{cmd: cmd, stdout: &syncBuffer{}, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = io.MultiWriter(p.stdout, p.out), p.out
	if err := h.Start(cmd); err != nil {
		t.Fatalf("start %v on %s: %v", args, h.Addr(), err)
	}
	go func() {
		defer close(p.done)
		p.err = cmd.Wait()
	}()
	go func() {
		select {
		case <-ctx.Done():
			cmd.Process.Kill()
		case <-p.done:
		}
	}()
	return p
}

func (p *proc) wait() { <-p.done }

// stop ends a process that runs until stopped (the master) and waits for it.
func (p *proc) stop() {
	p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// syncBuffer is a bytes.Buffer that a process's output and a reader may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
