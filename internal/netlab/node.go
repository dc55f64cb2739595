package netlab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"

	"github.com/vishvananda/netns"
)

// nsDir is where named network namespaces are bind-mounted, as by `ip netns add`.
const nsDir = "/var/run/netns"

// NIC is one network interface of a node.
type NIC struct {
	// Rail is the NIC's index on its node, and the bridge it is attached to.
	Rail int
	// Name is the interface name inside the node's namespace.
	Name string
	// Addr is the NIC's address, in the rail's subnet.
	Addr netip.Addr
}

// Node is one network namespace of a lab. Its methods may be called concurrently.
type Node struct {
	name  string
	index int // -1 for the hub
	ns    netns.NsHandle
	nics  []NIC

	// forker is a goroutine locked on a thread inside the namespace, which starts processes for Start,
	// so that a child's parent-death signal fires when the lab closes rather than when a short-lived
	// thread exits. Created on first use; mu guards it.
	mu     sync.Mutex
	forks  chan func()
	closed bool
	done   chan struct{}
}

// newNode creates the named namespace name. The thread that creates it enters it and is thrown away.
func newNode(name string, index int) (*Node, error) {
	type result struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends up in the new namespace
		ns, err := netns.NewNamed(name)
		ch <- result{ns, err}
	}()
	res := <-ch
	if res.err != nil {
		return nil, fmt.Errorf("netlab: namespace %s: %w", name, res.err)
	}
	return &Node{name: name, index: index, ns: res.ns}, nil
}

// Name is the node's namespace name (as `ip netns` lists it).
func (n *Node) Name() string { return n.name }

// Index is the node's index in the lab, -1 for the hub.
func (n *Node) Index() int { return n.index }

// Path is the file that names the node's namespace, for setns or a library taking a path.
func (n *Node) Path() string { return filepath.Join(nsDir, n.name) }

// NICs returns the node's NICs in rail order. The slice is the caller's.
func (n *Node) NICs() []NIC { return append([]NIC(nil), n.nics...) }

// Do runs fn on a fresh OS thread inside the node's namespace and returns its error. The thread is
// never unlocked, so the Go runtime discards it when fn returns; goroutines fn starts run in the
// process's namespace, not the node's. A socket fn creates belongs to the node's namespace for its
// whole life and may be used from any goroutine.
func (n *Node) Do(fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is discarded with its namespace
		if err := netns.Set(n.ns); err != nil {
			ch <- fmt.Errorf("netlab: enter %s: %w", n.name, err)
			return
		}
		ch <- fn()
	}()
	return <-ch
}

// Listen is net.ListenConfig.Listen inside the node's namespace.
func (n *Node) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	var ln net.Listener
	err := n.Do(func() error {
		var err error
		ln, err = (&net.ListenConfig{}).Listen(ctx, network, address)
		return err
	})
	return ln, err
}

// Dial is d.DialContext inside the node's namespace (a nil d is the zero Dialer).
func (n *Node) Dial(ctx context.Context, d *net.Dialer, network, address string) (net.Conn, error) {
	if d == nil {
		d = &net.Dialer{}
	}
	var c net.Conn
	err := n.Do(func() error {
		var err error
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// ErrClosed is returned by Start after the lab has been closed.
var ErrClosed = errors.New("netlab: lab closed")

// Start starts cmd inside the node's namespace: it forks from a thread that has entered the namespace,
// and a child inherits the namespace of the thread that forks it, so the whole process runs in the
// node from its first instruction. Unless cmd.SysProcAttr is set, the child gets SIGKILL when the lab
// is closed or this process dies. The caller waits for cmd as usual.
func (n *Node) Start(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	}
	ch := make(chan error, 1)
	n.mu.Lock()
	forks, err := n.forker()
	if err == nil {
		forks <- func() { ch <- cmd.Start() } // under mu, so close cannot close forks meanwhile
	}
	n.mu.Unlock()
	if err != nil {
		return err
	}
	return <-ch
}

// forker returns the channel of the node's forking thread, starting it on first use. The caller
// holds mu.
func (n *Node) forker() (chan<- func(), error) {
	if n.closed {
		return nil, ErrClosed
	}
	if n.forks != nil {
		return n.forks, nil
	}
	forks := make(chan func())
	done := make(chan struct{})
	entered := make(chan error, 1)
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with the lab
		if err := netns.Set(n.ns); err != nil {
			entered <- fmt.Errorf("netlab: enter %s: %w", n.name, err)
			return
		}
		entered <- nil
		for fn := range forks {
			fn()
		}
	}()
	if err := <-entered; err != nil {
		<-done
		return nil, err
	}
	n.forks, n.done = forks, done
	return forks, nil
}

// close stops the forking thread (killing children started with the default SysProcAttr), then
// deletes the namespace.
func (n *Node) close() error {
	n.mu.Lock()
	n.closed = true
	forks, done := n.forks, n.done
	n.forks = nil
	n.mu.Unlock()
	if forks != nil {
		close(forks)
		<-done
	}
	err := deleteNamed(n.name)
	if cerr := n.ns.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("netlab: delete %s: %w", n.name, err)
	}
	return nil
}
