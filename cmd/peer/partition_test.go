package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/hosts"
)

// A run on a test bed for the partition tests: the master on host 0, `peer run` with --json on the
// others, all in the README's form.
type hostRun struct {
	t      *testing.T
	bed    *hosts.Bed
	master *proc
	peers  []*proc
	held   []func() // starts a peer held back (hostRunOpts.hold), in order
}

// heartbeatTimeout is the master's on the LAN preset, the unit of the partition tests' cuts.
const heartbeatTimeout = 1500 * time.Millisecond

func newHostRun(t *testing.T, ctx context.Context, bin string, peers int) *hostRun {
	return newHostRunWith(t, ctx, bin, peers, nil)
}

// newHostRunWith is newHostRun with extra arguments for peer i's command line.
func newHostRunWith(t *testing.T, ctx context.Context, bin string, peers int, extra func(i int) []string) *hostRun {
	return newHostRunOpts(t, ctx, bin, hostRunOpts{peers: peers, extra: extra})
}

// hostRunOpts describes a run on a test bed: peers peers on hosts 1..peers, the master on host 0.
type hostRunOpts struct {
	peers     int
	nat       []int                // peers (0-based) behind a NAT of their own
	transport string               // --transport of every process; "" is the default (tls)
	command   []string             // the peers' command and its arguments; nil is peer run
	extra     func(i int) []string // more arguments for peer i
	hold      int                  // the last hold peers are started by startHeld, not at once
}

func newHostRunOpts(t *testing.T, ctx context.Context, bin string, o hostRunOpts) *hostRun {
	t.Helper()
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "run.secret"), []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := hosts.Config{Hosts: 1 + o.peers}
	for _, i := range o.nat {
		cfg.NAT = append(cfg.NAT, i+1)
	}
	bed, err := hosts.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &hostRun{t: t, bed: bed}
	t.Cleanup(func() { bed.Close() })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("master:\n%s", r.master.out.String())
			for i, p := range r.peers {
				t.Logf("peer %d:\n%s", i, strings.ReplaceAll(p.out.String(), "\r", "\n"))
			}
		}
	})
	master := "master --listen :48148 --token run-42 --secret-file run.secret"
	command := "run"
	if o.command != nil {
		command = strings.Join(o.command, " ")
	}
	line := fmt.Sprintf("peer %s --master %s:48148 --token run-42 --secret-file run.secret --json", command, bed.Host(0).Addr())
	if o.transport != "" {
		master += " --transport " + o.transport
		line += " --transport " + o.transport
	}
	r.master = start(t, ctx, bed.Host(0), bin, work, strings.Fields(master), nil)
	t.Cleanup(r.master.stop)
	for i := range o.peers {
		args := strings.Fields(line)
		if o.extra != nil {
			args = append(args, o.extra(i)...)
		}
		launch := func() {
			p := start(t, ctx, bed.Host(i+1), bin, work, args, []string{"CONCORD_STEPS=100000000", "CONCORD_SIZE=65536", "CONCORD_LOG_LEVEL=info"})
			r.peers = append(r.peers, p)
			t.Cleanup(p.stop)
		}
		if i < o.peers-o.hold {
			launch()
		} else {
			r.held = append(r.held, launch)
		}
	}
	return r
}

// startHeld starts the next peer held back by hostRunOpts.hold.
func (r *hostRun) startHeld() {
	r.held[0]()
	r.held = r.held[1:]
}

// lastInRing returns the host of the last peer of the ring the master wired most recently, from the
// master's log (its ring and joined notes).
func (r *hostRun) lastInRing() int {
	r.t.Helper()
	out := r.master.out.String()
	ringRe := regexp.MustCompile(`msg=ring .*ring \[([0-9 ]+)\]`)
	rings := ringRe.FindAllStringSubmatch(out, -1)
	if len(rings) == 0 {
		r.t.Fatalf("no ring in the master's log:\n%s", out)
	}
	ids := strings.Fields(rings[len(rings)-1][1])
	last := ids[len(ids)-1]
	joined := regexp.MustCompile(`msg=joined peer=` + last + ` .*addr \[?([0-9a-f.:]+?)\]?:[0-9]+`).FindStringSubmatch(out)
	if joined == nil {
		r.t.Fatalf("peer %s has no joined note in the master's log:\n%s", last, out)
	}
	for i := 1; i <= len(r.peers)+len(r.held); i++ {
		if r.bed.Host(i).Addr().String() == joined[1] {
			return i
		}
	}
	r.t.Fatalf("peer %s advertises %s, the address of no host", last, joined[1])
	return 0
}

// events returns the events of a kind ("step", "sync") peer i printed so far.
func (r *hostRun) eventsOf(i int, kind string) []event {
	var out []event
	for _, line := range strings.Split(r.peers[i].stdout.String(), "\n") {
		var e event
		if json.Unmarshal([]byte(line), &e) == nil && e.Event == kind {
			out = append(out, e)
		}
	}
	return out
}

// events returns the step events peer i printed so far.
func (r *hostRun) events(i int) []event { return r.eventsOf(i, "step") }

// waitFor polls cond every 50 ms until it holds, or fails the test after limit with what.
func (r *hostRun) waitFor(limit time.Duration, what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		for i, p := range r.peers {
			select {
			case <-p.done:
				r.t.Fatalf("peer %d exited while waiting for %s: %v\n%s\nmaster:\n%s", i, what, p.err, p.out.String(), r.master.out.String())
			default:
			}
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no %s within %v\nmaster:\n%s", what, limit, r.master.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// steps returns the last step peer i reported, and the world size then.
func (r *hostRun) last(i int) event {
	ev := r.events(i)
	if len(ev) == 0 {
		return event{}
	}
	return ev[len(ev)-1]
}

// settled waits until every peer runs in a ring of all of them.
func (r *hostRun) settled(limit time.Duration) {
	r.waitFor(limit, "ring of every peer", func() bool {
		for i := range r.peers {
			if e := r.last(i); e.World != len(r.peers) {
				return false
			}
		}
		return true
	})
}

// progress waits until every peer in which has taken n more steps than it had at the call.
func (r *hostRun) progress(which []int, n uint64, limit time.Duration) {
	r.t.Helper()
	from := map[int]uint64{}
	for _, i := range which {
		from[i] = r.last(i).Step
	}
	r.waitFor(limit, fmt.Sprintf("%d more steps on peers %v", n, which), func() bool {
		for _, i := range which {
			if r.last(i).Step < from[i]+n {
				return false
			}
		}
		return true
	})
}

// check stops the peers and checks what they printed: the revisions a peer accepts advance by exactly
// one per sync (a peer that rejoined picks up the group's), every revision has one state across peers,
// and no peer ended before it was stopped.
func (r *hostRun) check() {
	r.t.Helper()
	for i, p := range r.peers {
		select {
		case <-p.done:
			r.t.Errorf("peer %d ended on its own: %v\n%s", i, p.err, p.out.String())
		default:
		}
		p.stop()
	}
	state := map[uint64]string{}
	for i := range r.peers {
		var prev event
		for k, e := range r.eventsOf(i, "sync") {
			if k > 0 && e.Rejoins == prev.Rejoins && e.Rev != prev.Rev+1 {
				r.t.Errorf("peer %d: revision %d after %d, want %d", i, e.Rev, prev.Rev, prev.Rev+1)
			}
			if k > 0 && e.Rev <= prev.Rev {
				r.t.Errorf("peer %d: revision %d after %d went back", i, e.Rev, prev.Rev)
			}
			if s, ok := state[e.Rev]; ok && s != e.State {
				r.t.Errorf("revision %d: state %s on peer %d, %s on another", e.Rev, e.State, i, s)
			}
			state[e.Rev] = e.State
			prev = e
		}
	}
}

// TestPartitionsOnHosts cuts a real run on five hosts (the master and four peers, in the README's
// form, on the bridge) the ways networks fail, with the hosts' ports taken down and the switch
// split:
//   - the master's port for 2×, 5× and 10× the heartbeat timeout: nobody is kicked, every peer stays
//     alive and the checked loop goes on after the heal with consecutive revisions;
//   - one peer's port for the same times: the others go on throughout, the cut one is kicked and back
//     in the ring by itself within 5 s of the heal;
//   - the network split into halves of two peers, with the master on either side: the master's side
//     goes on, the other joins again after the heal;
//   - one way only: the master's packets to a peer (kicked, back after), and one peer's to its ring
//     neighbour (the ring goes around the link; nobody is kicked);
//   - a newcomer that the last peer of the ring cannot reach: it is placed after another peer and
//     admitted, not kicked.
//
// Every step's result is checked by the peers themselves (peer run), and every revision must have one
// state across all peers.
func TestPartitionsOnHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real processes on five hosts for minutes")
	}
	if raceBuild {
		t.Skip("runs the commands as separate binaries, built without the race detector: run without -race")
	}
	if err := hosts.Available(); err != nil {
		t.Skipf("runs on network namespaces, which need root: %v", err)
	}
	bin := buildBinaries(t)
	for _, mult := range []time.Duration{2, 5, 10} {
		cut := mult * heartbeatTimeout
		t.Run(fmt.Sprintf("master cut %v", cut), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			r := newHostRun(t, ctx, bin, 4)
			r.settled(time.Minute)
			r.progress([]int{0, 1, 2, 3}, 5, time.Minute)
			if err := r.bed.Host(0).Cut(true); err != nil {
				t.Fatal(err)
			}
			time.Sleep(cut) // the length of the fault
			if err := r.bed.Host(0).Cut(false); err != nil {
				t.Fatal(err)
			}
			r.progress([]int{0, 1, 2, 3}, 10, time.Minute)
			for i := range r.peers {
				if e := r.last(i); e.Rejoins != 0 || e.World != 4 {
					t.Errorf("peer %d after the master's cut: %d rejoins, world %d; want none and 4", i, e.Rejoins, e.World)
				}
			}
			r.check()
			if out := r.master.out.String(); strings.Contains(out, "msg=kicked") || strings.Contains(out, "msg=timeout") {
				t.Errorf("the master kicked a peer over its own cut:\n%s", out)
			}
		})
		t.Run(fmt.Sprintf("peer cut %v", cut), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			r := newHostRun(t, ctx, bin, 4)
			r.settled(time.Minute)
			r.progress([]int{0, 1, 2, 3}, 5, time.Minute)
			const victim = 3
			if err := r.bed.Host(victim + 1).Cut(true); err != nil {
				t.Fatal(err)
			}
			// The others go on without it while it is cut.
			r.progress([]int{0, 1, 2}, 5, time.Minute)
			time.Sleep(time.Until(time.Now().Add(cut))) // the rest of the fault's length
			healed := time.Now()
			if err := r.bed.Host(victim + 1).Cut(false); err != nil {
				t.Fatal(err)
			}
			var back time.Time
			r.waitFor(time.Minute, "the cut peer back in the ring", func() bool {
				for _, e := range r.events(victim) {
					if e.Rejoins > 0 && e.World == 4 {
						back = time.Unix(0, e.Time)
						return true
					}
				}
				return false
			})
			if d := back.Sub(healed); d > 5*time.Second {
				t.Errorf("the cut peer was back in the ring %v after the heal, want within 5s", d.Round(time.Millisecond))
			} else {
				t.Logf("the cut peer was back in the ring %v after the heal", d.Round(time.Millisecond))
			}
			r.progress([]int{0, 1, 2, 3}, 5, time.Minute)
			r.check()
		})
	}
	t.Run("one way from the master to a peer", func(t *testing.T) {
		// The master's packets to host 4 are dropped, the other direction passes: TCP needs both, so
		// the peer is cut off from the master while its heartbeats may still arrive for a while. It is
		// kicked once they stop, the others go on, and it comes back when the block is lifted.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		r := newHostRun(t, ctx, bin, 4)
		r.settled(time.Minute)
		r.progress([]int{0, 1, 2, 3}, 5, time.Minute)
		if err := r.bed.Block([]int{0}, []int{4}); err != nil {
			t.Fatal(err)
		}
		r.progress([]int{0, 1, 2}, 5, time.Minute)
		time.Sleep(2 * heartbeatTimeout)
		if err := r.bed.Unblock(); err != nil {
			t.Fatal(err)
		}
		r.settled(time.Minute)
		r.progress([]int{0, 1, 2, 3}, 5, time.Minute)
		r.check()
	})
	t.Run("one way between two peers", func(t *testing.T) {
		// The packets of host 2 to host 3 are dropped while both reach the master: the ring link
		// between them goes silent; the master wires the ring around it and nobody is kicked.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		r := newHostRun(t, ctx, bin, 4)
		r.settled(time.Minute)
		r.progress([]int{0, 1, 2, 3}, 5, time.Minute)
		if err := r.bed.Block([]int{2}, []int{3}); err != nil {
			t.Fatal(err)
		}
		r.progress([]int{0, 1, 2, 3}, 10, 2*time.Minute)
		for i := range r.peers {
			if e := r.last(i); e.Rejoins != 0 || e.World != 4 {
				t.Errorf("peer %d: %d rejoins, world %d; want none and 4", i, e.Rejoins, e.World)
			}
		}
		if err := r.bed.Unblock(); err != nil {
			t.Fatal(err)
		}
		r.check()
	})
	t.Run("newcomer one peer cannot dial", func(t *testing.T) {
		// Host 4's peer joins a ring of three whose last peer, its first predecessor, cannot reach it
		// (that host's packets to host 4 are dropped): the master wires the ring again with the
		// newcomer after another peer, and it is admitted without being kicked.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		r := newHostRunOpts(t, ctx, bin, hostRunOpts{peers: 4, hold: 1})
		r.settled(time.Minute)
		r.progress([]int{0, 1, 2}, 3, time.Minute)
		last := r.lastInRing()
		if err := r.bed.Block([]int{last}, []int{4}); err != nil {
			t.Fatal(err)
		}
		r.startHeld()
		r.settled(time.Minute)
		r.progress([]int{0, 1, 2, 3}, 5, time.Minute)
		for i := range r.peers {
			if e := r.last(i); e.Rejoins != 0 || e.World != 4 {
				t.Errorf("peer %d: %d rejoins, world %d; want none and 4", i, e.Rejoins, e.World)
			}
		}
		out := r.master.out.String()
		if strings.Contains(out, "msg=kicked") {
			t.Errorf("the master kicked a peer:\n%s", out)
		}
		if !strings.Contains(out, "could not reach") {
			t.Errorf("host %d's peer reached the newcomer although its packets to it were dropped:\n%s", last, out)
		}
		if err := r.bed.Unblock(); err != nil {
			t.Fatal(err)
		}
		r.check()
	})
	for _, side := range [][2][]int{{{1, 2}, {3, 4}}, {{3, 4}, {1, 2}}} {
		with, without := side[0], side[1]
		t.Run(fmt.Sprintf("halves, master with %v", with), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			r := newHostRun(t, ctx, bin, 4)
			r.settled(time.Minute)
			r.progress([]int{0, 1, 2, 3}, 5, time.Minute)
			if err := r.bed.Split(append([]int{0}, with...), without); err != nil {
				t.Fatal(err)
			}
			peersOf := func(hs []int) []int {
				var out []int
				for _, h := range hs {
					out = append(out, h-1)
				}
				return out
			}
			r.progress(peersOf(with), 5, time.Minute)
			time.Sleep(3 * heartbeatTimeout)
			if err := r.bed.Unblock(); err != nil {
				t.Fatal(err)
			}
			r.settled(time.Minute)
			r.progress([]int{0, 1, 2, 3}, 5, time.Minute)
			for _, i := range peersOf(without) {
				if e := r.last(i); e.Rejoins == 0 {
					t.Errorf("peer %d on the side without the master: no rejoin", i)
				}
			}
			r.check()
		})
	}
}
