// Package hostbed runs a benchmark's processes across hosts instead of on loopback: the master on a
// host of its own, every peer on another, each host a network namespace with an address of its own
// on one bridge (internal/hosts), so that the peers' bytes cross veth pairs and a switch, over TCP,
// as between machines. The unix sockets of the TCP transport's local path live in one network
// namespace, so no byte between two hosts ever takes them.
//
// Host 0 is the master's; hosts 1 and on are the peers'. A peer is spawned on a peer host that no
// running process of the bed holds, so a replacement takes the host of one that exited. Building a
// bed needs root (see Available); Close tears it down, killing what still runs on it.
package hostbed

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sync"

	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/internal/hosts"
)

// Available reports whether this process can build a bed (it needs root), and if not, why.
func Available() error { return hosts.Available() }

// Bed is the master's host and the peers' hosts. Its methods may be called concurrently.
type Bed struct {
	bed    *hosts.Bed
	master *hosts.Host
	peers  []*hosts.Host

	mu sync.Mutex
	on map[*hosts.Host]*cluster.Proc // the process last spawned on each peer host
}

// New builds a bed with a master's host and peers peer hosts.
func New(peers int) (*Bed, error) { return NewNAT(peers, 0) }

// NewNAT builds a bed like New with nat of the peer hosts each behind a NAT router of its own
// (internal/hosts): they reach the others, and nothing reaches them that they did not start. They are
// spread among the peer hosts (the second, the fourth, ...; then the others), so that as many as can
// have a reachable host on each side.
func NewNAT(peers, nat int) (*Bed, error) {
	if peers < 1 {
		return nil, fmt.Errorf("hostbed: %d peer hosts, want at least 1", peers)
	}
	if nat < 0 || nat > peers {
		return nil, fmt.Errorf("hostbed: %d of %d peer hosts behind NAT", nat, peers)
	}
	bed, err := hosts.New(hosts.Config{Hosts: peers + 1, NAT: NATHosts(peers, nat)})
	if err != nil {
		return nil, err
	}
	b := &Bed{bed: bed, master: bed.Host(0), on: map[*hosts.Host]*cluster.Proc{}}
	for i := range peers {
		b.peers = append(b.peers, bed.Host(i+1))
	}
	return b, nil
}

// NATHosts lists the bed hosts (peer host i is bed host i+1) that NewNAT puts behind NAT.
func NATHosts(peers, nat int) []int {
	var out []int
	for _, start := range []int{1, 0} {
		for i := start; i < peers && len(out) < nat; i += 2 {
			out = append(out, i+1)
		}
	}
	return out
}

// Close kills what still runs on the hosts and deletes them. It is idempotent.
func (b *Bed) Close() error { return b.bed.Close() }

// MasterListen is where the master listens: its host's address, any port.
func (b *Bed) MasterListen() string { return listenOn(b.master) }

// MasterStart starts a process on the master's host (see cluster.Spec.Start).
func (b *Bed) MasterStart(cmd *exec.Cmd) error { return b.master.Start(cmd) }

// Peer places on peer host i (0-based): the address to listen on (the host's, any port) and the
// Start of a process there. It fits measure.Placement, for the ring of the limit.
func (b *Bed) Peer(i int) (listen string, start func(*exec.Cmd) error) {
	h := b.peers[i%len(b.peers)]
	return listenOn(h), h.Start
}

// Spawn starts spec in c on a peer host that no running process of the bed holds, and returns the
// process and the host's index among the peer hosts.
func (b *Bed) Spawn(c *cluster.Cluster, spec cluster.Spec) (*cluster.Proc, int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, h := range b.peers {
		if p := b.on[h]; p != nil {
			select {
			case <-p.Done():
			default:
				continue
			}
		}
		spec.Start = h.Start
		p, err := c.Spawn(spec)
		if err != nil {
			return nil, 0, err
		}
		b.on[h] = p
		return p, i, nil
	}
	return nil, 0, errors.New("hostbed: every peer host runs a process")
}

// Netns names the network namespace the calling goroutine runs in ("net:[inode]"), which tells the
// hosts of a bed apart. It reads the calling thread's: in a process that builds a bed, the threads
// that start processes on its hosts stay inside their hosts, and one may be the main thread, whose
// namespace /proc/self shows.
func Netns() (string, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return os.Readlink("/proc/thread-self/ns/net")
}

func listenOn(h *hosts.Host) string { return net.JoinHostPort(h.Addr().String(), "0") }
