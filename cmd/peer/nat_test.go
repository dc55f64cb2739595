package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/hosts"
)

// TestNATOnHosts runs `peer run` on four hosts, some of them behind NATs of their own (nftables
// masquerade on a router, no port forwarded: nothing can dial them), with the master on a fifth:
//
//   - two behind NAT, over tls and quic: the master places them apart in the ring, and the peers
//     that must dial one have it call back (reversed links);
//   - three behind NAT, so that the ring must join two of them: over quic the link is a punched
//     path, never the relay; over tcp, which cannot punch, it goes through the master's relay.
//
// Every step's result is checked element by element by the peers themselves, every step must have
// one result across peers, and every revision one state.
func TestNATOnHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real processes on five hosts")
	}
	if raceBuild {
		t.Skip("runs the commands as separate binaries, built without the race detector: run without -race")
	}
	if err := hosts.Available(); err != nil {
		t.Skipf("runs on network namespaces, which need root: %v", err)
	}
	bin := buildBinaries(t)
	for _, tc := range []struct {
		name      string
		transport string
		nat       []int
		want      func(reversed, punched, relayed uint64) bool
		wants     string
	}{
		{"two/tls", "tls", []int{1, 2}, func(rv, p, rl uint64) bool { return rv > 0 && p == 0 }, "reversed links, none punched"},
		{"two/quic", "quic", []int{1, 2}, func(rv, p, rl uint64) bool { return rv > 0 }, "reversed links"},
		{"three/quic", "quic", []int{1, 2, 3}, func(rv, p, rl uint64) bool { return p > 0 && rl == 0 }, "punched links, none relayed"},
		{"three/tcp", "tcp", []int{1, 2, 3}, func(rv, p, rl uint64) bool { return rl > 0 && p == 0 }, "relayed links, none punched"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			r := newHostRunOpts(t, ctx, bin, hostRunOpts{peers: 4, nat: tc.nat, transport: tc.transport})
			r.settled(time.Minute)
			r.progress([]int{0, 1, 2, 3}, 20, time.Minute)
			var rv, p, rl uint64
			for i := range r.peers {
				e := r.last(i)
				rv, p, rl = rv+e.Reversed, p+e.Punched, rl+e.Relayed
			}
			if !tc.want(rv, p, rl) {
				t.Errorf("links to peers behind NAT: %d reversed, %d punched, %d relayed; want %s", rv, p, rl, tc.wants)
			}
			r.check()
			results := map[[2]uint64]string{} // (step, world) -> result hash
			for i := range r.peers {
				for _, e := range r.events(i) {
					k := [2]uint64{e.Step, uint64(e.World)}
					if s, ok := results[k]; ok && s != e.State {
						t.Errorf("step %d (world %d): result %s on peer %d, %s on another", e.Step, e.World, e.State, i, s)
					}
					results[k] = e.State
				}
			}
			out := r.master.out.String()
			if !strings.Contains(out, "msg=nat") {
				t.Errorf("the master did not report the peers behind NAT:\n%s", out)
			}
			if strings.Contains(out, "msg=kicked") {
				t.Errorf("the master kicked a peer:\n%s", out)
			}
		})
	}
}
