// Command stress is Concord's churn soak: a master and a pool of peer processes on loopback run a
// training-like loop while faults hit them at random, and every result and every shared-state
// revision is checked.
//
//	go run ./stress --duration 3m --seed 1
//	go run ./stress --duration 3m --hosts      # every process on a host of its own (root)
//
// Each peer (this program, re-executed) loops about every 100 ms: if ArePeersPending, UpdateTopology;
// SyncSharedState of a 64 KiB state; three concurrent AllReduces on different tags (F32 sum, I64 sum,
// I32 max, 16 KiB each) on data derived from (revision, peer id); every element is compared with the
// exact reduction over the ring the collective ran on (Communicator.Ring); then a deterministic
// update of the state from the results. Every 64th revision the group runs OptimizeTopology. A failed
// collective must leave its buffer unchanged; the peer re-wires with UpdateTopology and starts the
// step again from its sync. A peer that is kicked or loses the master closes its communicator, checks
// that its goroutines come back to their count before Connect, and joins again as a new peer.
//
// Faults, one every --fault-min to --fault-max (0.5 to 1 s) chosen with --seed, each class counted:
//
//   - kill: SIGKILL of a peer process (a replacement is spawned to keep --peers).
//   - stop: SIGSTOP for 2 to 4 s, then SIGCONT; the master declares the peer gone, which then rejoins.
//   - spawn: a new peer process.
//   - join: a new peer process started while collectives are in flight (at the next "started" line).
//   - blackhole: the peer's connection to the master, which runs through a relay in this process,
//     forwards nothing for 2 to 4 s; the master declares the peer gone, which then rejoins.
//   - slow: that connection delays every byte by 20 to 100 ms each way for 2 to 4 s.
//   - leave: the peer is told to close its communicator and exit (it must, within 10 s, with no
//     goroutine leak).
//   - master-stall: the master process is SIGSTOPped for 2 to 8 s (at most every 20 s), then
//     continued. Its stall must cost nothing but the pause: nobody is kicked; recovery counts from
//     its return.
//   - master-restart: the master is SIGKILLed and a new one started on its address (at most every
//     60 s). The peers reconnect and report what they hold, the new master rebuilds the ring, and the
//     run goes on from the majority's revision; recovery counts from the new master's start.
//   - junk: 40 connections to the master that a stranger or a broken client would open (bytes without
//     a handshake, frames that do not decode, oversized frames, no Hello, another run token, silence),
//     and 40 to the healthy peers' own ports, where they take ring links, state transfers,
//     bandwidth tests and rendezvous calls (bytes without a handshake, another protocol version,
//     frames that do not decode and oversized frames on the link, state, call and bench kinds, a
//     first message that is not a LinkHello, LinkHellos with another run token, silence). They must
//     disturb nobody. The summary counts the connections to peers (junk_peer_conns). One case
//     replays the LinkHello a peer's ring predecessor sent it, with the run's token, as an
//     eavesdropper on a plaintext link would send it again: the live link must survive it.
//   - link-blackhole: one ring link, from a peer to its successor, forwards nothing for 4 to 6 s while
//     both peers still reach the master and everyone else (every peer's connections to other peers
//     run through a relay in this process that knows each connection's destination). The peers give a
//     link up after 3 s of silence (ProgressTimeout), so the collective fails on it, the master cuts
//     the link and the next ring avoids it: nobody is evicted while a ring without it exists. Dealt
//     only while four healthy peers are in the ring; an eviction as unreachable that it causes anyway
//     (the group shrank meanwhile) is counted in link_hole_evictions, not as a violation.
//   - link-slow: one ring link delays every byte by 20 to 100 ms for 2 to 4 s.
//   - partition (--hosts only): for 2 to 15 s, the master's port goes down (nobody may be kicked; the
//     stall check waits), or one peer's port (it is kicked and comes back by itself), or the switch
//     splits the peers in halves with the master on one side (the other side is kicked and comes back).
//     The summary counts the peers that came back by themselves after a kick (kicked_rejoined).
//
// With --hosts the master, every peer and a stranger that sends the junk each run on a host of their
// own (internal/hosts: network namespaces with their own addresses on one bridge), and the relays
// that stage black holes and slow links run on the hosts whose routes they stand for.
//
// With --gossip the master runs its gossip failure detector (the LAN preset) and every peer joins
// it: a stopped peer may then be removed by the gossip verdict as well as by the heartbeat rule,
// and a healthy peer it removes is a violation.
//
// With --transport quic the master and every peer talk QUIC, with a run secret drawn for the run; each
// peer reaches the master through a UDP relay (for black hole and slow), its ring links go straight,
// and junk is UDP and QUIC, to the master and to peers' ports (the payloads above over QUIC connections
// with the run secret). The ring-link classes are not dealt over QUIC.
//
// While the master is paused the stall check is suspended (nobody can make progress). Faults that
// remove a peer that holds the state are only dealt while at least three such peers are
// healthy, so that the state always survives (the soak tests churn, not the loss of the whole run),
// and one freeze (stop or blackhole) runs at a time, 2 s apart: each blocks the group until the master declares
// the peer gone (1.5 s), and a chain of them would stall the group by the schedule, not by a bug. A
// healthy peer kicked by the master for anything but a missed heartbeat is a violation.
//
// Invariants, checked as lines arrive: each revision is accepted with one state hash across all
// peers; each peer's revisions advance by exactly one from sync to sync (a newcomer's first sync may
// jump; a rejoining peer is a new one), and the group skips none; a peer that held the state never has
// to fetch it (its content never loses the election); no wrong AllReduce element; no changed buffer
// after a failed AllReduce; no 10 s without a completed collective while at least MinPeers (2) healthy
// peers are in the group; no peer hangs on exit; no goroutine leak; no panic, fatal error or race
// report; no unexpected error in a peer. The first violation ends the run: it prints the seed, the
// last 100 events and the offending revision, and exits 1.
//
// A status line goes to stderr; the last line on stdout is the JSON summary: duration, iterations
// (revisions whose step completed), ops completed (successful AllReduce calls, all peers), aborts,
// faults by class, ops completed per 10 s window, and the recovery time per class: from the fault to
// the first collective completed by another peer that started after the fault (p50, p90, p99, max; ms;
// nearest rank).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/concord-ccl/concord/internal/cluster"
)

// roles are the roles this program runs as a child.
var roles = map[string]func() int{rolePeer: peerMain}

func main() {
	cluster.Main(roles)
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// cli parses args, runs the soak and prints the summary; it returns the exit status.
func cli(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("stress", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := defaultOptions()
	fs.DurationVar(&o.Duration, "duration", o.Duration, "how long to run the soak (8h for the full soak)")
	seed := fs.Uint64("seed", 0, "seed of the fault schedule (0: from the clock, printed)")
	fs.IntVar(&o.Peers, "peers", o.Peers, "target number of peer processes")
	fs.DurationVar(&o.FaultMin, "fault-min", o.FaultMin, "shortest time between two faults")
	fs.DurationVar(&o.FaultMax, "fault-max", o.FaultMax, "longest time between two faults")
	fs.BoolVar(&o.Verbose, "v", false, "copy every peer's stderr and every event to stderr")
	fs.StringVar(&o.Transport, "transport", o.Transport, "what the master and the peers talk: tcp or quic (no ring-link faults over quic)")
	fs.StringVar(&o.Break, "break", "", "make every peer misbehave the way a bug would (stale-update), to show the soak fails")
	fs.BoolVar(&o.Hosts, "hosts", false, "run the master and every peer on a host of its own (network namespaces, root), and deal partitions")
	fs.BoolVar(&o.Gossip, "gossip", false, "run the master's gossip failure detector, which every peer joins (a healthy peer it kicks is a violation)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	o.Seed = *seed
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	if err := o.validate(); err != nil {
		fmt.Fprintln(stderr, "stress:", err)
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	fmt.Fprintf(stderr, "stress: seed %d, %v, %d peers\n", o.Seed, o.Duration, o.Peers)
	sum, err := run(ctx, o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "stress:", err)
	}
	js, jerr := json.Marshal(sum)
	if jerr != nil {
		fmt.Fprintln(stderr, "stress:", jerr)
		return 1
	}
	fmt.Fprintln(stdout, string(js))
	if err != nil || sum.Violations > 0 {
		return 1
	}
	return 0
}
