package main

import (
	"context"
	"io"
	"maps"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/bench/internal/hostbed"
	"github.com/concord-ccl/concord/internal/cluster"
)

func TestMain(m *testing.M) {
	cluster.Main(testRoles())
	goleak.VerifyTestMain(m)
}

// roleCLI runs the command itself, with the child's arguments.
const roleCLI = "cli"

// testRoles are the program's roles and roleCLI.
func testRoles() map[string]func() int {
	r := maps.Clone(roles)
	r[roleCLI] = run
	return r
}

// TestHostsNeedRoot runs the command with --hosts as an unprivileged user: it must exit with status 2
// and say why, before it starts anything.
func TestHostsNeedRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs the command as another user, which needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, stderr, procs, err := hostbed.RunAsNobody(ctx, roleCLI, "--hosts", "--timeout", "30s")
	if err != nil {
		t.Fatalf("run the command as user 65534: %v", err)
	}
	if code != 2 || !strings.Contains(stderr, "--hosts runs every process in a network namespace of its own") {
		t.Fatalf("exit status %d, stderr %q; want 2 and why", code, stderr)
	}
	if procs != 1 {
		t.Fatalf("%d processes started, want only the command", procs)
	}
}

// TestBenchSmall runs the whole benchmark on a small buffer: every element of every peer's result
// must be right and the hashes equal.
func TestBenchSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := cluster.New(cluster.Config{Stderr: io.Discard})
	defer c.Close()
	p := params{Peers: 3, Bytes: 1<<20 + 12, Iters: 2, Warmup: 1, Part: 64 << 10}
	res, err := bench(ctx, c, nil, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Correct || !res.HashesEqual {
		t.Fatalf("result not correct: %+v", res)
	}
	if want := int64(3 * 3 * p.Bytes / 4); res.ElementsChecked != want {
		t.Fatalf("checked %d elements, want %d", res.ElementsChecked, want)
	}
	if len(res.Seconds) != 2 || !(res.SecondsMedian > 0) || !(res.LimitSeconds > 0) || !(res.LimitReduceSeconds > res.LimitSeconds) {
		t.Fatalf("figures missing: %+v", res)
	}
	for _, pr := range c.Procs() {
		if pr.Role() != roleMaster && pr.ExitCode() != 0 {
			t.Errorf("%s exited with %d", pr.Name(), pr.ExitCode())
		}
	}
}

// TestBenchTransports runs the benchmark over tls and quic on a small buffer: the master and every
// peer talk over the authenticated transport, and every element must be right.
func TestBenchTransports(t *testing.T) {
	for _, name := range []string{"tls", "quic"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c := cluster.New(cluster.Config{Stderr: io.Discard})
			defer c.Close()
			p := params{Peers: 2, Bytes: 256<<10 + 4, Iters: 1, Warmup: 1, Part: 64 << 10, Transport: name}
			res, err := bench(ctx, c, nil, p, 1)
			if err != nil {
				t.Fatal(err)
			}
			if res.Transport != name || !res.Correct || !res.HashesEqual {
				t.Fatalf("result not correct: %+v", res)
			}
			if want := int64(2 * 2 * p.Bytes / 4); res.ElementsChecked != want {
				t.Fatalf("checked %d elements, want %d", res.ElementsChecked, want)
			}
		})
	}
}

// TestBenchHosts runs the benchmark with every process on a host of its own: every element must be
// right, the master, the peers and the limit's ring must each have run in another network namespace
// with an address of its own, and the limit must have crossed the hosts over TCP.
func TestBenchHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a test bed of network namespaces")
	}
	if err := hostbed.Available(); err != nil {
		t.Skipf("runs on network namespaces, which need root: %v", err)
	}
	for _, name := range []string{"tcp", "quic"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			bed, err := hostbed.New(3)
			if err != nil {
				t.Fatal(err)
			}
			defer bed.Close()
			c := cluster.New(cluster.Config{Stderr: io.Discard})
			defer c.Close()
			p := params{Peers: 3, Bytes: 1<<20 + 12, Iters: 2, Warmup: 1, Part: 64 << 10, Transport: name}
			res, err := bench(ctx, c, bed, p, 1)
			if err != nil {
				t.Fatal(err)
			}
			if !res.Hosts || res.Local || res.LimitNetwork != "tcp" || res.TCPRingAggregateGBps != 0 {
				t.Fatalf("hosts %v, local %v, limit over %q, tcp ring %v: want true, false, tcp, none",
					res.Hosts, res.Local, res.LimitNetwork, res.TCPRingAggregateGBps)
			}
			if !res.Correct || !res.HashesEqual || !(res.LimitSeconds > 0) || len(res.RingSeconds) != 2 {
				t.Fatalf("result not correct: %+v", res)
			}
			if want := int64(3 * 3 * p.Bytes / 4); res.ElementsChecked != want {
				t.Fatalf("checked %d elements, want %d", res.ElementsChecked, want)
			}
			own, err := hostbed.Netns()
			if err != nil {
				t.Fatal(err)
			}
			// Every child's lines wait on the cluster's merged feed until Close: the peers' joined
			// lines name their network namespaces, the listening lines of the master and the ring's
			// processes their addresses.
			netns := map[string]bool{own: true}
			ringHosts := map[string]bool{}
			joined, rings := 0, 0
			for joined < 3 || rings < 6 {
				var l cluster.Line
				select {
				case l = <-c.Lines():
				case <-ctx.Done():
					t.Fatalf("saw %d peers join and %d ring processes listen, want 3 and 6", joined, rings)
				}
				switch l.Event {
				case "joined":
					joined++
					ns, _ := l.Fields["netns"].(string)
					if ns == "" || netns[ns] {
						t.Errorf("%s ran in network namespace %q, that of another process or of the test", l.Proc.Name(), ns)
					}
					netns[ns] = true
				case "listening":
					addr, _ := l.Fields["addr"].(string)
					host, _, _ := net.SplitHostPort(addr)
					if ip := net.ParseIP(host); ip == nil || ip.IsLoopback() || ip.IsUnspecified() {
						t.Errorf("%s listened on %q, not on an address of its host", l.Proc.Name(), addr)
					}
					if strings.HasPrefix(l.Proc.Name(), "ring-") {
						rings++
						ringHosts[l.Proc.Name()+" "+host] = true
					}
				}
			}
			// Two rings, before and after the all-reduce; process i of each on the same host, a
			// host of its own.
			hostsSeen := map[string]bool{}
			for k := range ringHosts {
				hostsSeen[strings.Fields(k)[1]] = true
			}
			if len(ringHosts) != 3 || len(hostsSeen) != 3 {
				t.Errorf("ring processes and their hosts: %v; want ring-0..2 each on a host of its own", ringHosts)
			}
		})
	}
}

// TestBenchNAT runs the benchmark across hosts, then again with two of four peers behind NATs of
// their own (--nat 2): both runs must be right to the element, every connection to a peer behind NAT
// must have been called back (the master orders the ring so that no two NAT'd peers are neighbours,
// so nothing is relayed), and nat_efficiency must be the ratio of the two medians.
func TestBenchNAT(t *testing.T) {
	if testing.Short() {
		t.Skip("builds test beds of network namespaces")
	}
	if err := hostbed.Available(); err != nil {
		t.Skipf("runs on network namespaces, which need root: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bed, err := hostbed.New(4)
	if err != nil {
		t.Fatal(err)
	}
	defer bed.Close()
	c := cluster.New(cluster.Config{Stderr: io.Discard})
	defer c.Close()
	p := params{Peers: 4, Bytes: 1<<20 + 12, Iters: 2, Warmup: 1, Part: 64 << 10}
	res, err := bench(ctx, c, bed, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := natRun(ctx, c, &res, p, 2); err != nil {
		t.Fatal(err)
	}
	if !res.Correct || !res.NATCorrect || res.NAT != 2 {
		t.Fatalf("result not correct: %+v", res)
	}
	if want := int64(4 * 3 * p.Bytes / 4); res.ElementsChecked != want {
		t.Fatalf("checked %d elements in the run without NAT, want %d", res.ElementsChecked, want)
	}
	if res.LinksRelayed == nil || res.RelayBytes == nil || res.LinksReversed < 2 {
		t.Fatalf("connections by rendezvous: %d called back, %d punched, %v relayed: want at least two called back and the relay's figures",
			res.LinksReversed, res.LinksPunched, res.LinksRelayed)
	}
	t.Logf("by rendezvous: %d called back, %d punched, %d relayed carrying %d bytes", res.LinksReversed, res.LinksPunched, *res.LinksRelayed, *res.RelayBytes)
	if want := res.SecondsMedian / res.NATSecondsMedian; res.NATEfficiency != want || !(want > 0) {
		t.Fatalf("nat_efficiency %v, want %v", res.NATEfficiency, want)
	}
}
