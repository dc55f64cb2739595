package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// ErrExited is returned for an operation on a child that has already terminated, and by [Proc.Next]
// once a child's stdout has ended.
var ErrExited = errors.New("cluster: process has exited")

// sendTimeout bounds one Send: a child that does not read its stdin for this long fails the Send.
const sendTimeout = 5 * time.Second

// Proc is one child process started by a [Cluster]. Its methods may be called from any goroutine.
type Proc struct {
	name, role string
	pid        int
	cmd        *exec.Cmd
	lines      *feed[Line]
	done       chan struct{} // closed once the child has been reaped
	readers    sync.WaitGroup
	stdout     *os.File // read by the stdout goroutine; closed by it or by Cluster.Close
	stderr     *os.File // read by the stderr goroutine; closed by it or by Cluster.Close

	sendMu sync.Mutex
	stdin  *os.File // guarded by sendMu; nil once closed

	mu     sync.Mutex
	exited bool             // guarded by mu: the child has terminated; its group is no longer signalled
	state  *os.ProcessState // guarded by mu: set once reaped
}

// Name returns the name the child was spawned with.
func (p *Proc) Name() string { return p.name }

// Role returns the role the child runs.
func (p *Proc) Role() string { return p.role }

// Pid returns the child's process id, which is also its process group id.
func (p *Proc) Pid() int { return p.pid }

// Lines returns the channel of the lines the child prints on stdout, in order. It is closed after the
// child's stdout has ended (the child exited) and every line has been delivered, or when the cluster
// is closed. Lines queue without bound, so not reading them never blocks the child. Every line is
// also delivered on [Cluster.Lines]; a program reads whichever it prefers.
func (p *Proc) Lines() <-chan Line { return p.lines.out }

// Next returns the child's next line. It fails with ErrExited once the child's stdout has ended and
// every line has been read, and with the context's error when ctx is done first.
func (p *Proc) Next(ctx context.Context) (Line, error) {
	select {
	case l, ok := <-p.lines.out:
		if !ok {
			return Line{}, fmt.Errorf("cluster: %s: %w", p.name, ErrExited)
		}
		return l, nil
	case <-ctx.Done():
		return Line{}, fmt.Errorf("cluster: %s: waiting for a line: %w", p.name, ctx.Err())
	}
}

// Await reads the child's lines until one whose event field equals event, and returns it. Lines read
// before it are dropped. It fails like [Proc.Next]; a failure names the last line that was read.
func (p *Proc) Await(ctx context.Context, event string) (Line, error) {
	var last Line
	for {
		l, err := p.Next(ctx)
		if err != nil {
			if last.Raw != nil {
				return Line{}, fmt.Errorf("%w (waiting for event %q; last line %q)", err, event, last.Raw)
			}
			return Line{}, fmt.Errorf("%w (waiting for event %q)", err, event)
		}
		if l.Event == event {
			return l, nil
		}
		last = l
	}
}

// Send writes v as one JSON line to the child's stdin, where the child reads it from [Inbox]. It fails
// if the child has exited or does not read for several seconds.
func (p *Proc) Send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("cluster: %s: send: %w", p.name, err)
	}
	b = append(b, '\n')
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if p.stdin == nil {
		return fmt.Errorf("cluster: %s: send: %w", p.name, ErrExited)
	}
	if err := p.stdin.SetWriteDeadline(time.Now().Add(sendTimeout)); err != nil {
		return fmt.Errorf("cluster: %s: send: %w", p.name, err)
	}
	if _, err := p.stdin.Write(b); err != nil {
		return fmt.Errorf("cluster: %s: send: %w", p.name, err)
	}
	return nil
}

// closeStdin closes the child's stdin; a child running [Main] then exits.
func (p *Proc) closeStdin() {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
}

// Kill sends SIGKILL to the child's process group. It returns an error wrapping ErrExited if the child
// has already terminated.
func (p *Proc) Kill() error { return p.Signal(syscall.SIGKILL) }

// Stop sends SIGSTOP to the child's process group: the child freezes, its sockets stay open.
func (p *Proc) Stop() error { return p.Signal(syscall.SIGSTOP) }

// Continue sends SIGCONT to the child's process group, resuming a stopped child.
func (p *Proc) Continue() error { return p.Signal(syscall.SIGCONT) }

// Signal sends sig to the child's process group. It never signals after the child has terminated, so
// a reused process id is never hit; it then returns an error wrapping ErrExited.
func (p *Proc) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return fmt.Errorf("cluster: %s: signal %v: %w", p.name, sig, ErrExited)
	}
	if err := syscall.Kill(-p.pid, sig); err != nil {
		return fmt.Errorf("cluster: %s: signal %v: %w", p.name, sig, err)
	}
	return nil
}

// Done returns a channel that is closed once the child has terminated and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Wait waits until the child has terminated and returns its exit status: the exit code, or -1 if a
// signal ended it. It fails with the context's error when ctx is done first.
func (p *Proc) Wait(ctx context.Context) (int, error) {
	select {
	case <-p.done:
		return p.ExitCode(), nil
	case <-ctx.Done():
		return 0, fmt.Errorf("cluster: %s: waiting for exit: %w", p.name, ctx.Err())
	}
}

// ExitCode returns the child's exit code, -1 if a signal ended it, or -2 while it has not been reaped.
func (p *Proc) ExitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == nil {
		return -2
	}
	return p.state.ExitCode()
}

// State returns the child's process state once it has been reaped, else nil.
func (p *Proc) State() *os.ProcessState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// reap runs in its own goroutine for the child's lifetime: it marks the child exited before reaping
// it (so no signal can reach a reused pid), reaps it, closes its stdin and closes done.
func (p *Proc) reap() {
	if awaitExit(p.pid) == nil {
		p.mu.Lock()
		p.exited = true
		p.mu.Unlock()
	}
	p.cmd.Wait() // the exit status is kept in p.cmd.ProcessState
	p.mu.Lock()
	p.exited = true
	p.state = p.cmd.ProcessState
	p.mu.Unlock()
	p.closeStdin()
	close(p.done)
}
