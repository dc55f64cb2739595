package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// ErrClosed is returned by Spawn after Close.
var ErrClosed = errors.New("cluster: closed")

// Config configures a Cluster. The zero value works.
type Config struct {
	// Executable is the program to run as every child. Empty means the calling program itself
	// (os.Executable), which must call [Main] first thing in main.
	Executable string
	// Env holds extra "KEY=value" entries for every child's environment, after the parent's own.
	Env []string
	// Stderr receives every child's stderr, one line at a time, each prefixed with "name: ". Nil means
	// os.Stderr; io.Discard drops it.
	Stderr io.Writer
	// CloseTimeout bounds how long Close waits for killed children to be reaped and their output to
	// end. Zero means 5 seconds.
	CloseTimeout time.Duration
}

// Spec describes one child to start.
type Spec struct {
	// Role names the role function the child runs (see [Main]). Required.
	Role string
	// Name names the child in lines, logs and errors, and is passed to it as [EnvName]. Empty means the
	// role followed by a sequence number, e.g. "peer-3".
	Name string
	// Args are the child's command-line arguments (os.Args[1:] in the child).
	Args []string
	// Env holds extra "KEY=value" entries for this child, after Config.Env.
	Env []string
	// Start starts the prepared command (a test bed's host starts it inside its namespace). Nil
	// means cmd.Start.
	Start func(cmd *exec.Cmd) error
}

// Cluster starts and supervises child processes. Its methods may be called from any goroutine.
// Close kills and reaps every child it started.
type Cluster struct {
	cfg  Config
	stop chan struct{} // closed by Close: ends every feed

	mergedOnce sync.Once
	merged     *feed[Line]

	errMu sync.Mutex // serializes writes to cfg.Stderr

	mu     sync.Mutex
	procs  []*Proc // guarded by mu
	seq    int     // guarded by mu
	closed bool    // guarded by mu

	closeOnce sync.Once
	closeErr  error
}

// New returns a Cluster that has started nothing yet.
func New(cfg Config) *Cluster {
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = 5 * time.Second
	}
	return &Cluster{cfg: cfg, stop: make(chan struct{})}
}

func (c *Cluster) mergedFeed() *feed[Line] {
	c.mergedOnce.Do(func() { c.merged = newFeed[Line](c.stop) })
	return c.merged
}

// Lines returns the channel of the lines of every child, in the order the parent read them (the
// order of one child's lines is kept). It is closed by Close. Lines queue without bound.
func (c *Cluster) Lines() <-chan Line { return c.mergedFeed().out }

// Procs returns every child started so far, in start order, including those that have exited.
func (c *Cluster) Procs() []*Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Proc(nil), c.procs...)
}

// Spawn starts one child running spec.Role and returns once it has been started.
func (c *Cluster) Spawn(spec Spec) (*Proc, error) {
	if spec.Role == "" {
		return nil, errors.New("cluster: Spec.Role is empty")
	}
	exe := c.cfg.Executable
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("cluster: spawn %s: %w", spec.Role, err)
		}
	}
	merged := c.mergedFeed()

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("cluster: spawn %s: %w", spec.Role, ErrClosed)
	}
	c.seq++
	name := spec.Name
	if name == "" {
		name = fmt.Sprintf("%s-%d", spec.Role, c.seq)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("cluster: spawn %s: %w", name, err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll(inR, inW)
		return nil, fmt.Errorf("cluster: spawn %s: %w", name, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(inR, inW, outR, outW)
		return nil, fmt.Errorf("cluster: spawn %s: %w", name, err)
	}
	cmd := exec.Command(exe, spec.Args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	cmd.Env = append(os.Environ(), c.cfg.Env...)
	cmd.Env = append(cmd.Env, spec.Env...)
	cmd.Env = append(cmd.Env, EnvRole+"="+spec.Role, EnvName+"="+name)
	cmd.SysProcAttr = sysProcAttr()
	start := spec.Start
	if start == nil {
		start = (*exec.Cmd).Start
	}
	if err := start(cmd); err != nil {
		closeAll(inR, inW, outR, outW, errR, errW)
		return nil, fmt.Errorf("cluster: spawn %s: %w", name, err)
	}
	closeAll(inR, outW, errW) // the child holds its own copies

	p := &Proc{
		name: name, role: spec.Role, pid: cmd.Process.Pid, cmd: cmd,
		lines: newFeed[Line](c.stop), done: make(chan struct{}),
		stdout: outR, stderr: errR, stdin: inW,
	}
	c.procs = append(c.procs, p)
	p.readers.Add(2)
	go c.readStdout(p, merged)
	go c.copyStderr(p)
	go p.reap()
	return p, nil
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// maxLine bounds one stdout line; a longer line is cut there (the rest starts a new line).
const maxLine = 4 << 20

// readStdout owns p.stdout: it turns every line into a Line on p's feed and the merged feed.
func (c *Cluster) readStdout(p *Proc, merged *feed[Line]) {
	defer p.readers.Done()
	defer p.lines.close()
	defer p.stdout.Close()
	r := bufio.NewReaderSize(p.stdout, 64<<10)
	for {
		raw, err := readLine(r)
		if len(raw) > 0 {
			l := newLine(p, time.Now(), raw)
			p.lines.push(l)
			merged.push(l)
		}
		if err != nil {
			return
		}
	}
}

// readLine returns the next line of r without its newline (a copy owned by the caller), cut at maxLine.
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if err == bufio.ErrBufferFull && len(line) < maxLine {
			continue
		}
		line = bytes.TrimRight(line, "\r\n")
		if err == bufio.ErrBufferFull {
			err = nil
		}
		return line, err
	}
}

// copyStderr owns p.stderr: it copies every line to Config.Stderr with the child's name in front.
func (c *Cluster) copyStderr(p *Proc) {
	defer p.readers.Done()
	defer p.stderr.Close()
	r := bufio.NewReaderSize(p.stderr, 64<<10)
	for {
		raw, err := readLine(r)
		if len(raw) > 0 || err == nil {
			var b strings.Builder
			b.WriteString(p.name)
			b.WriteString(": ")
			b.Write(raw)
			b.WriteByte('\n')
			c.errMu.Lock()
			io.WriteString(c.cfg.Stderr, b.String())
			c.errMu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// Close kills the process group of every child that is still running (SIGKILL), closes every child's
// stdin, and waits, at most Config.CloseTimeout, until every child has been reaped and its output has
// ended. It then closes Lines and every Proc's Lines. It reports the children that could not be
// reaped in time. Close is idempotent: later calls return the first call's result.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.close() })
	return c.closeErr
}

func (c *Cluster) close() error {
	c.mu.Lock()
	c.closed = true
	procs := append([]*Proc(nil), c.procs...)
	c.mu.Unlock()

	for _, p := range procs {
		p.Kill() // ErrExited for children that are already gone
		p.closeStdin()
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CloseTimeout)
	defer cancel()
	var stuck []string
	for _, p := range procs {
		readers := make(chan struct{})
		go func() { p.readers.Wait(); close(readers) }()
		select {
		case <-p.done:
		case <-ctx.Done():
		}
		select {
		case <-readers:
		case <-ctx.Done():
			// Output still open after the leader died: a process outside our group holds the pipe.
			// Closing our ends releases the reader goroutines.
			p.stdout.Close()
			p.stderr.Close()
			<-readers
		}
		select {
		case <-p.done:
		default:
			stuck = append(stuck, fmt.Sprintf("%s (pid %d)", p.name, p.pid))
		}
	}
	close(c.stop)
	<-c.mergedFeed().done
	for _, p := range procs {
		<-p.lines.done
	}
	if len(stuck) > 0 {
		return fmt.Errorf("cluster: close: not reaped within %v: %s", c.cfg.CloseTimeout, strings.Join(stuck, ", "))
	}
	return nil
}
