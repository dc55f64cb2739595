// Package nodeproc runs a benchmark's node processes inside the nodes of a netlab test bed: one
// process per node (the benchmark's own binary, re-executed inside the node's namespace), JSON
// commands on its stdin, and one JSON report per line on its stdout.
package nodeproc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"os"
	"os/exec"
	"time"

	"github.com/concord-ccl/concord/internal/netlab"
)

// Meta is what the group reads of every report: its event, the label of the command it answers, the
// node that sent it and, for a failure, what went wrong.
type Meta struct {
	Event, Label string
	Node         int
	Err          string
}

// Report is a benchmark's report type.
type Report interface{ Meta() Meta }

// Group is the node processes of one test bed. Its methods are called from one goroutine; one reader
// goroutine per process forwards the reports.
type Group[R Report] struct {
	procs   []*proc
	reports chan R
	// fail builds the report that stands for a line that does not parse ("fatal") or the end of a
	// node's output ("exit").
	fail func(event string, node int, detail string) R
}

type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// Start starts one process per node of lab: this program with args(i), inside node i. On an error the
// returned group holds the processes already started, and Close must still be called.
func Start[R Report](lab *netlab.Lab, nodes int, args func(i int) []string, fail func(event string, node int, detail string) R) (*Group[R], error) {
	g := &Group[R]{reports: make(chan R, 16*nodes), fail: fail}
	self, err := os.Executable()
	if err != nil {
		return g, err
	}
	for i := range nodes {
		cmd := exec.Command(self, args(i)...)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return g, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return g, err
		}
		if err := lab.Node(i).Start(cmd); err != nil {
			return g, fmt.Errorf("node %d: %w", i, err)
		}
		g.procs = append(g.procs, &proc{cmd: cmd, stdin: stdin})
		go g.read(i, stdout)
	}
	return g, nil
}

// read forwards node i's report lines; a line that is not a report ends the node's reports.
func (g *Group[R]) read(i int, r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var rep R
		if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
			rep = g.fail("fatal", i, fmt.Sprintf("bad line %q", sc.Text()))
		}
		g.reports <- rep
	}
	g.reports <- g.fail("exit", i, "")
}

// Reports delivers every node's reports in the order they arrive.
func (g *Group[R]) Reports() <-chan R { return g.reports }

// Broadcast sends cmd, as one JSON line, to every node.
func (g *Group[R]) Broadcast(cmd any) error {
	line, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	for i, p := range g.procs {
		if _, err := p.stdin.Write(append(line, '\n')); err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
	}
	return nil
}

// Collect waits for one report of the given event and label from every node, indexed by node. A
// node's failure or exit ends the wait with an error.
func (g *Group[R]) Collect(ctx context.Context, event, label string) ([]R, error) {
	n := len(g.procs)
	got := make([]R, n)
	have := make([]bool, n)
	seen := 0
	for seen < n {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %q from every node (%d of %d): %w", event, seen, n, ctx.Err())
		case r := <-g.reports:
			m := r.Meta()
			switch {
			case m.Event == "fatal" || m.Event == "exit":
				return nil, fmt.Errorf("node %d: %s %s", m.Node, m.Event, m.Err)
			case m.Event == event && m.Label == label && m.Node >= 0 && m.Node < n && !have[m.Node]:
				got[m.Node], have[m.Node] = r, true
				seen++
			}
		}
	}
	return got, nil
}

// Close asks every node to quit with the command quit (or kills them at once when ctx has ended),
// and kills those that have not exited 5 seconds later.
func (g *Group[R]) Close(ctx context.Context, quit any) {
	line, _ := json.Marshal(quit)
	for _, p := range g.procs {
		if ctx.Err() != nil {
			p.cmd.Process.Kill()
		} else {
			p.stdin.Write(append(line, '\n'))
		}
		p.stdin.Close()
	}
	grace := time.After(5 * time.Second)
	for _, p := range g.procs {
		exited := make(chan struct{})
		go func() { p.cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-grace:
			p.cmd.Process.Kill()
			<-exited
		}
	}
}

// Commands reads a node process's commands, one JSON object per line of r (its stdin), each into a
// fresh C. It yields a line that does not decode with its error, and ends there or at the end of r.
func Commands[C any](r io.Reader) iter.Seq2[C, error] {
	return func(yield func(C, error) bool) {
		in := bufio.NewScanner(r)
		for in.Scan() {
			var cmd C
			if err := json.Unmarshal(in.Bytes(), &cmd); err != nil {
				yield(cmd, fmt.Errorf("bad command %q: %w", in.Text(), err))
				return
			}
			if !yield(cmd, nil) {
				return
			}
		}
	}
}
