package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/concord-ccl/concord/pccl"
)

// A run of the commands on loopback: the master and `peer run` processes with --json, each started
// with extra flags.
type localRun struct {
	t      *testing.T
	ctx    context.Context
	bin    string
	dir    string
	master *proc
	addr   string // where the master listens
	peers  []*proc
}

// startLocal starts args (whose first word is a binary in bin) on this host in directory dir.
func startLocal(t *testing.T, ctx context.Context, bin, dir string, args, env []string) *proc {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, args[0]), args[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &proc{cmd: cmd, stdout: &syncBuffer{}, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = io.MultiWriter(p.stdout, p.out), p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", args, err)
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

// newLocalRun starts a master on loopback with the extra flags and waits until it listens; logs is
// what the master printed that the test may look for (its JSON log lines).
func newLocalRun(t *testing.T, ctx context.Context, bin string, extra ...string) *localRun {
	t.Helper()
	r := &localRun{t: t, ctx: ctx, bin: bin, dir: t.TempDir()}
	args := append([]string{"master", "--listen", "127.0.0.1:0", "--http", "", "--log-format", "json"}, extra...)
	r.master = startLocal(t, ctx, bin, r.dir, args, nil)
	t.Cleanup(r.master.stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("master:\n%s", r.master.out.String())
			for i, p := range r.peers {
				t.Logf("peer %d:\n%s", i, strings.ReplaceAll(p.out.String(), "\r", "\n"))
			}
		}
	})
	r.addr = r.masterLog("master listening", "addr")
	return r
}

// masterLog waits for the master's JSON log line with message msg and returns its field key.
func (r *localRun) masterLog(msg, key string) string {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(r.master.out.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
				if v, ok := rec[key].(string); ok {
					return v
				}
			}
		}
		select {
		case <-r.master.done:
			r.t.Fatalf("the master exited: %v\n%s", r.master.err, r.master.out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	r.t.Fatalf("the master logged no %q with %q:\n%s", msg, key, r.master.out.String())
	return ""
}

// peer starts `peer run --json` against the master with the extra flags.
func (r *localRun) peer(extra ...string) *proc {
	args := append([]string{"peer", "run", "--master", r.addr, "--json", "--size", "65536", "--steps", "100000000"}, extra...)
	p := startLocal(r.t, r.ctx, r.bin, r.dir, args, []string{"CONCORD_LOG_LEVEL=info"})
	r.peers = append(r.peers, p)
	r.t.Cleanup(p.stop)
	return p
}

// steps returns the step events p printed so far.
func steps(p *proc) []event {
	var out []event
	for _, line := range strings.Split(p.stdout.String(), "\n") {
		var e event
		if json.Unmarshal([]byte(line), &e) == nil && e.Event == "step" {
			out = append(out, e)
		}
	}
	return out
}

func lastStep(p *proc) event {
	ev := steps(p)
	if len(ev) == 0 {
		return event{}
	}
	return ev[len(ev)-1]
}

// waitFor polls cond every 50 ms until it holds, or fails the test after limit with what. The
// processes in live must not exit meanwhile.
func (r *localRun) waitFor(limit time.Duration, what string, live []*proc, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		for i, p := range live {
			select {
			case <-p.done:
				r.t.Fatalf("peer %d exited while waiting for %s: %v\n%s", i, what, p.err, p.out.String())
			default:
			}
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no %s within %v", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// progress waits until every peer in ps has taken n more steps than it had at the call, in a ring of
// world peers.
func (r *localRun) progress(ps []*proc, world int, n uint64, limit time.Duration) {
	r.t.Helper()
	from := make([]uint64, len(ps))
	for i, p := range ps {
		from[i] = lastStep(p).Step
	}
	r.waitFor(limit, fmt.Sprintf("%d more steps in rings of %d", n, world), ps, func() bool {
		for i, p := range ps {
			if e := lastStep(p); e.Step < from[i]+n || e.World != world {
				return false
			}
		}
		return true
	})
}

// TestSwitchesByCommand runs the commands as users do, on loopback, with each optional part switched
// on by its flag:
//   - gossip: the master's --gossip and the peers' --gossip-join, with a heartbeat timeout of a
//     minute: a peer stopped with SIGSTOP is kicked by the gossip verdict alone, the others go on,
//     and once continued it comes back by itself as a newcomer;
//   - group: two groups of two on one master (--group) run rings of two, each on its own;
//   - quant: --quant minmax-u8-both on every peer: every step's result is within the encoding's
//     bound (the peers check) and bit-identical across peers; peers that disagree fail with a
//     descriptor mismatch;
//   - guard: the master's --guard-non-finite, --guard-norm-factor and --guard-exclude with peers that
//     report their contributions (--contribution-stats): a peer whose contribution is NaN, then one
//     whose norm is a thousand times the others', is kicked, and the others go on.
func TestSwitchesByCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both commands and runs them")
	}
	if raceBuild {
		t.Skip("runs the commands as separate binaries, built without the race detector: run without -race")
	}
	bin := buildBinaries(t)
	t.Run("gossip", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		r := newLocalRun(t, ctx, bin, "--gossip", "127.0.0.1:0", "--heartbeat-timeout", "1m", "--log-level", "info")
		gossip := r.masterLog("gossip listening: peers join with --gossip-join", "gossip")
		var ps []*proc
		for range 3 {
			ps = append(ps, r.peer("--gossip-join", gossip))
		}
		r.progress(ps, 3, 5, time.Minute)
		victim := ps[2]
		victim.cmd.Process.Signal(syscall.SIGSTOP)
		stopped := time.Now()
		// With heartbeats a minute apart, only the gossip verdict can let the others go on.
		r.progress(ps[:2], 2, 5, 40*time.Second)
		t.Logf("the others went on in a ring of two %v after the SIGSTOP", time.Since(stopped).Round(time.Millisecond))
		if out := r.master.out.String(); !strings.Contains(out, "declared dead by gossip") {
			t.Fatalf("the master kicked the stopped peer for another reason:\n%s", out)
		}
		victim.cmd.Process.Signal(syscall.SIGCONT)
		r.waitFor(time.Minute, "the stopped peer back in the ring", ps, func() bool {
			e := lastStep(victim)
			return e.Rejoins > 0 && e.World == 3
		})
		r.progress(ps, 3, 5, time.Minute)
	})
	t.Run("group", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		r := newLocalRun(t, ctx, bin)
		a := []*proc{r.peer("--group", "1"), r.peer("--group", "1")}
		b := []*proc{r.peer("--group", "4000000000"), r.peer("--group", "4000000000")}
		r.progress(a, 2, 10, time.Minute)
		r.progress(b, 2, 10, time.Minute)
		for i, p := range append(a, b...) {
			for _, e := range steps(p) {
				if e.World != 2 {
					t.Fatalf("peer %d ran a step in a ring of %d, want its group's 2", i, e.World)
				}
			}
		}
		bad := startLocal(t, ctx, bin, r.dir, []string{"peer", "run", "--master", r.addr, "--group", "4294967296"}, nil)
		bad.wait()
		if ee := new(exec.ExitError); !errors.As(bad.err, &ee) || ee.ExitCode() != 2 || !strings.Contains(bad.out.String(), "32-bit") {
			t.Fatalf("--group 4294967296: %v, want exit status 2 naming the 32 bits:\n%s", bad.err, bad.out.String())
		}
	})
	t.Run("quant", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		r := newLocalRun(t, ctx, bin, "--min-peers", "3")
		var ps []*proc
		for range 3 {
			ps = append(ps, r.peer("--quant", "minmax-u8-both", "--steps", "20"))
		}
		byStep := map[uint64]map[string]bool{}
		for i, p := range ps {
			p.wait()
			if p.err != nil {
				t.Fatalf("peer %d: %v", i, p.err)
			}
			for _, e := range steps(p) {
				if byStep[e.Step] == nil {
					byStep[e.Step] = map[string]bool{}
				}
				byStep[e.Step][e.State] = true
			}
		}
		if len(byStep) < 20 {
			t.Fatalf("%d steps reported, want 20", len(byStep))
		}
		for s, states := range byStep {
			if len(states) != 1 {
				t.Fatalf("step %d: %d different results across peers: %v", s, len(states), states)
			}
		}
		// Peers that disagree on the encoding fail with a descriptor mismatch.
		r2 := newLocalRun(t, ctx, bin, "--min-peers", "2")
		x, y := r2.peer("--quant", "minmax-u16-both"), r2.peer("--quant", "none")
		for _, p := range []*proc{x, y} {
			p.wait()
			if p.err == nil || !strings.Contains(p.out.String(), "descriptors differ") {
				t.Fatalf("a peer of a run with two encodings: %v, want a descriptor mismatch:\n%s", p.err, p.out.String())
			}
		}
		bad := startLocal(t, ctx, bin, r.dir, []string{"peer", "run", "--master", r.addr, "--quant", "minmax-u3"}, nil)
		bad.wait()
		if ee := new(exec.ExitError); !errors.As(bad.err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("--quant minmax-u3: %v, want exit status 2:\n%s", bad.err, bad.out.String())
		}
	})
	t.Run("guard", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		r := newLocalRun(t, ctx, bin, "--guard-non-finite", "--guard-norm-factor", "4", "--guard-exclude", "--log-level", "info")
		ps := []*proc{r.peer("--contribution-stats"), r.peer("--contribution-stats")}
		r.progress(ps, 2, 5, time.Minute)
		for _, bad := range []struct {
			name string
			f    func(id, s uint64, i int) float32
			want string
		}{
			{"NaN", func(id, s uint64, i int) float32 { return float32(math.NaN()) }, "NaN"},
			{"a thousand times the norm", func(id, s uint64, i int) float32 { return 1000 * checkedContribution(id, s, i) }, "median"},
		} {
			cfg := pccl.LAN() // as the commands' default preset: every peer must use the same part size
			cfg.Master, cfg.ContributionStats = r.addr, true
			comm, err := pccl.Connect(ctx, cfg)
			if err != nil {
				t.Fatalf("%s: connect: %v", bad.name, err)
			}
			lc := loopConfig{size: 65536, stopAt: func() uint64 { return math.MaxUint64 }, contribution: bad.f}
			err = allreduceLoop(ctx, comm, lc, func(event) {}, comm.Logger())
			comm.Close()
			if !errors.Is(err, pccl.ErrKicked) || !strings.Contains(err.Error(), "contribution guard") || !strings.Contains(err.Error(), bad.want) {
				t.Fatalf("%s: the offender's loop ended with %v, want a kick by the contribution guard naming %q", bad.name, err, bad.want)
			}
			r.progress(ps, 2, 5, time.Minute)
		}
	})
}
