package hostbed

import (
	"context"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/cluster"
)

func TestMain(m *testing.M) {
	cluster.Main(map[string]func() int{"probe": probe})
	goleak.VerifyTestMain(m)
}

// probe reports the network namespace it runs in, then waits to be killed.
func probe() int {
	netns, _ := Netns()
	cluster.Emit(map[string]string{"event": "here", "netns": netns})
	select {}
}

// netnsOf waits for p's report and returns its network namespace.
func netnsOf(t *testing.T, ctx context.Context, p *cluster.Proc) string {
	t.Helper()
	l, err := p.Await(ctx, "here")
	if err != nil {
		t.Fatal(err)
	}
	ns, _ := l.Fields["netns"].(string)
	if ns == "" {
		t.Fatalf("%s reported no network namespace: %s", p.Name(), l.Raw)
	}
	return ns
}

// TestSpawnPlacesOnFreeHosts spawns a process on each of two peer hosts: each runs in a network
// namespace of its own, a third finds no free host, and once one exits its host takes the next.
func TestSpawnPlacesOnFreeHosts(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("runs on network namespaces, which need root: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bed, err := New(2)
	if err != nil {
		t.Fatal(err)
	}
	defer bed.Close()
	c := cluster.New(cluster.Config{Stderr: io.Discard})
	defer c.Close()

	own, err := Netns()
	if err != nil {
		t.Fatal(err)
	}
	a, ia, err := bed.Spawn(c, cluster.Spec{Role: "probe"})
	if err != nil {
		t.Fatal(err)
	}
	b, ib, err := bed.Spawn(c, cluster.Spec{Role: "probe"})
	if err != nil {
		t.Fatal(err)
	}
	nsA, nsB := netnsOf(t, ctx, a), netnsOf(t, ctx, b)
	if ia == ib || nsA == nsB || nsA == own || nsB == own {
		t.Fatalf("hosts %d and %d, namespaces %s and %s (the test's %s): want two hosts of their own", ia, ib, nsA, nsB, own)
	}
	if _, _, err := bed.Spawn(c, cluster.Spec{Role: "probe"}); err == nil {
		t.Fatal("a third process found a host of two, both taken")
	}
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	r, ir, err := bed.Spawn(c, cluster.Spec{Role: "probe"})
	if err != nil {
		t.Fatal(err)
	}
	if nsR := netnsOf(t, ctx, r); ir != ia || nsR != nsA {
		t.Fatalf("the replacement runs on host %d (%s), want the freed host %d (%s)", ir, nsR, ia, nsA)
	}
}

// TestAddresses checks that the master and each peer host listen on addresses of their own, off
// loopback.
func TestAddresses(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("runs on network namespaces, which need root: %v", err)
	}
	bed, err := New(3)
	if err != nil {
		t.Fatal(err)
	}
	defer bed.Close()
	seen := map[string]bool{}
	listens := []string{bed.MasterListen()}
	for i := range 3 {
		l, start := bed.Peer(i)
		if start == nil {
			t.Fatalf("peer host %d has no Start", i)
		}
		listens = append(listens, l)
	}
	for _, l := range listens {
		host, port, err := net.SplitHostPort(l)
		if err != nil {
			t.Fatal(err)
		}
		ip := net.ParseIP(host)
		if ip == nil || ip.IsLoopback() || ip.IsUnspecified() || port != "0" || seen[host] {
			t.Fatalf("listen addresses %v: want one address per host, off loopback, any port", listens)
		}
		seen[host] = true
	}
	if _, err := New(0); err == nil {
		t.Fatal("a bed of no peer hosts: no error")
	}
}

// TestNATHosts checks which peer hosts go behind NAT: every other one first, so that two of four
// have reachable neighbours on both sides of a ring, then the rest; never the master's host 0.
func TestNATHosts(t *testing.T) {
	for _, c := range []struct {
		peers, nat int
		want       []int
	}{
		{4, 0, nil},
		{4, 1, []int{2}},
		{4, 2, []int{2, 4}},
		{4, 3, []int{2, 4, 1}},
		{4, 4, []int{2, 4, 1, 3}},
		{5, 2, []int{2, 4}},
		{1, 1, []int{1}},
	} {
		if got := NATHosts(c.peers, c.nat); !slices.Equal(got, c.want) {
			t.Errorf("NATHosts(%d, %d) = %v, want %v", c.peers, c.nat, got, c.want)
		}
	}
	if _, err := NewNAT(4, 5); err == nil {
		t.Error("NewNAT(4, 5) built a bed with more NAT hosts than peer hosts")
	}
}
