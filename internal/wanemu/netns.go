package wanemu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// netnsDir is where named network namespaces are bound, as iproute2 does, so that
// `ip netns exec NAME ...` can look inside a running testbed.
const netnsDir = "/run/netns"

// Netns is a named network namespace that this process created. Its methods may be called from any
// goroutine, concurrently, until the testbed that owns it is closed.
type Netns struct {
	name string
	path string
	fd   int // an open handle on the namespace, for setns
}

// Name returns the namespace's name, as `ip netns list` shows it.
func (ns *Netns) Name() string { return ns.name }

// Path returns the file the namespace is bound to, for tools such as `nsenter --net=PATH`.
func (ns *Netns) Path() string { return ns.path }

// Do runs fn on an OS thread that has entered the namespace, and returns fn's error. Sockets that fn
// creates belong to the namespace and may be used from any goroutine afterwards. Goroutines that fn
// starts do not run in the namespace. The thread is locked for fn's whole run and never unlocked, so
// the runtime ends it when fn returns rather than reuse it for other goroutines.
func (ns *Netns) Do(fn func() error) error {
	host, err := hostNetns()
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer leaveNetns(host)
		if err := unix.Setns(ns.fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("wanemu: enter namespace %s: %w", ns.name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// leaveNetns moves the calling thread, which is locked and stays locked, back to the process's own
// namespace. The runtime ends such a thread when its goroutine returns, except the process's main
// thread, which it parks for good instead; moving back keeps that one from holding a testbed's
// namespace alive, and from making /proc/self/ns/net name it.
func leaveNetns(host int) {
	unix.Setns(host, unix.CLONE_NEWNET)
}

var host struct {
	once sync.Once
	fd   int
	err  error
}

// hostNetns returns a descriptor of the network namespace the process started in, opened once on
// first use and kept open.
func hostNetns() (int, error) {
	host.once.Do(func() {
		host.fd, host.err = unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if host.err != nil {
			host.err = fmt.Errorf("wanemu: open the process's network namespace: %w", host.err)
		}
	})
	return host.fd, host.err
}

// Start starts cmd as a process inside the namespace: the process is forked from a thread that has
// entered the namespace, so it and all its threads live there. The caller waits for it with
// cmd.Wait as usual.
func (ns *Netns) Start(cmd *exec.Cmd) error {
	return ns.Do(cmd.Start)
}

// Listen announces on a local address inside the namespace, as [net.Listen] does.
func (ns *Netns) Listen(network, address string) (net.Listener, error) {
	return ns.ListenConfig(context.Background(), &net.ListenConfig{}, network, address)
}

// ListenConfig announces on a local address inside the namespace with lc's options (for example a
// Control function that sets socket buffer sizes).
func (ns *Netns) ListenConfig(ctx context.Context, lc *net.ListenConfig, network, address string) (net.Listener, error) {
	var l net.Listener
	err := ns.Do(func() (err error) {
		l, err = lc.Listen(ctx, network, address)
		return err
	})
	return l, err
}

// ListenPacket opens a packet socket inside the namespace, as [net.ListenPacket] does.
func (ns *Netns) ListenPacket(network, address string) (net.PacketConn, error) {
	var c net.PacketConn
	err := ns.Do(func() (err error) {
		c, err = net.ListenPacket(network, address)
		return err
	})
	return c, err
}

// Dial connects from inside the namespace with d's options, as [net.Dialer.DialContext] does. The
// address must be numeric: name resolution may run on threads outside the namespace.
func (ns *Netns) Dial(ctx context.Context, d *net.Dialer, network, address string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) {
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// createNetns creates a network namespace, binds it to netnsDir/name and returns it. Nothing of it
// is left behind on failure.
func createNetns(name string) (ns *Netns, err error) {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return nil, fmt.Errorf("wanemu: create namespace %s: %w", name, err)
	}
	p := filepath.Join(netnsDir, name)
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("wanemu: create namespace %s: %w", name, err)
	}
	f.Close()
	hostFd, err := hostNetns()
	if err != nil {
		os.Remove(p)
		return nil, err
	}
	errc := make(chan error, 1)
	go func() {
		// This thread leaves the process's namespace for a new one and is never unlocked, so the
		// runtime ends it when the goroutine returns.
		runtime.LockOSThread()
		defer leaveNetns(hostFd)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- unix.Mount("/proc/thread-self/ns/net", p, "none", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		os.Remove(p)
		return nil, fmt.Errorf("wanemu: create namespace %s: %w", name, err)
	}
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		removeNetns(p)
		return nil, fmt.Errorf("wanemu: open namespace %s: %w", name, err)
	}
	return &Netns{name: name, path: p, fd: fd}, nil
}

// close releases the namespace: the kernel destroys it, with its devices and sockets, once no
// process, thread or open socket still refers to it.
func (ns *Netns) close() error {
	unix.Close(ns.fd)
	return removeNetns(ns.path)
}

func removeNetns(p string) error {
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("wanemu: unmount %s: %w", p, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("wanemu: remove %s: %w", p, err)
	}
	return nil
}

// Sweep removes the namespaces named "prefix-PID-..." whose process PID no longer runs: those that
// a testbed of a crashed or killed process left behind. Namespaces of running processes, this one
// included, are left alone. It returns the names it removed.
func Sweep(prefix string) ([]string, error) {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("wanemu: sweep: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix+"-")
		if !ok {
			continue
		}
		pidText, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || pid <= 0 || processRuns(pid) {
			continue
		}
		if err := removeNetns(filepath.Join(netnsDir, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}

func processRuns(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
