// Package sim runs Concord's whole system in virtual time: a master and peers, their real code (the
// master's Server, pccl's Communicator), on the in-memory network of internal/transport inside one
// testing/synctest bubble. Every link takes the latency and bandwidth of a topology (sites, the round
// trips between them, a rate per link); hours pass in minutes, and a thousand peers fit in one
// process. The benchmarks of recovery and joins in virtual time (bench/scale --virtual,
// bench/sharedstate --virtual) build on its Cluster.
//
// # The simulated soak
//
//	go test ./stress/sim -run TestSimulatedSoak -v -sim.duration 8h
//
// Run is the real soak (package stress) moved into the bubble: the same training-like loop on every
// peer (pending check, shared-state sync, three concurrent AllReduces on three tags checked element by
// element against the exact reduction over the ring that ran them, the state update, an
// OptimizeTopology every 64 revisions), the same checker (stress/invariant), and faults dealt from a
// seed, every 3 to 6 seconds of virtual time: every class of the real soak and those no test bed of
// processes can stage.
//
//   - kill: the peer's host crashes (every connection reset at once, as a SIGKILL's sockets are);
//     nothing its goroutines open afterwards reaches anyone, and its communicator is closed.
//   - stop: the host is held for 2 to 4 s (Network.Hold): nothing it sends or is sent arrives before
//     the end, as for a SIGSTOPped process. Its own goroutines go on running, unlike a stopped
//     process's; what they do meanwhile reaches nobody until it resumes.
//   - spawn, join (a newcomer started while collectives are in flight), leave (a clean Close).
//   - blackhole, slow: the peer's link to the master loses everything, or gains 20 to 100 ms each
//     way, for 2 to 4 s.
//   - master-stall: the master's event loop is paused for 2 to 8 s (simhook's Gate), as a SIGSTOP
//     pauses it: it takes no input and runs no timer, and finds its tick late when it resumes.
//   - master-restart: the master's host crashes and a new master, of a new incarnation, starts on
//     its address.
//   - junk: 40 connections to the master that a stranger or a broken client would open.
//   - link-blackhole, link-slow: a ring link between two peers loses everything (both ways, 4 to 6 s)
//     or is slowed one way, while both reach everyone else.
//   - partition: the network is cut in two for 5 to 15 s, healing afterwards: two halves, a minority
//     cut off, or the master with a minority only; the master's side always keeps two peers that
//     hold the state.
//   - clock-jump: a peer's wall clock jumps 1 s to 1 h forward or back (within 2 h of true time).
//     Durations measured with the monotonic clock are not affected, as in a real process; what the
//     peer reads as Unix time is (simhook's wall offset).
//   - asym: a peer's link to the master loses everything one way only (the master hears nothing,
//     the peer hears the master), or one direction of a ring link becomes twenty times slower with
//     100 to 300 ms more latency while the other is as it was.
//   - restart: a peer crashes and is started again at once on its host with the same identity and
//     no state, while the master may still hold the old session.
//
// Faults are dealt as in the real soak: a peer that holds the state is only hit while three such
// peers are healthy; one freeze (stop, black hole, partition, master stall, ring-link black hole) at
// a time, two seconds apart and not before the group completed a collective since the last; no peer
// is frozen, removed or added within 5 s of a master restart (a peer that comes to the new master
// before the group reports is wired alone, and the group then joins it one peer at a time, skipping
// revisions: documented behaviour the revision invariants would misread).
//
// The invariants are the real soak's: exact AllReduce elements; a failed AllReduce leaves its buffer
// unchanged; one state hash per accepted revision; revisions advance by one per sync in every
// session and none is skipped by the group; a peer that held the state never fetches it, but once at
// the first sync after a master restart (the dead master's outcome of the step in flight reached
// some peers only); no 20 s without a completed collective while two healthy peers are in the group
// (the real soak's 10 s, doubled for the WAN's round trips); a master that hears fewer than half of
// the group when a partition cuts it kicks none of the other side for silence before
// PartitionTimeout (the soak asks the master which peers the group holds at the cut and keeps that
// up to date from the master's events, so that each kick is judged on the group as it was then: a
// master that has since removed dead peers and hears half of the rest rightly kicks after
// HeartbeatTimeout); a leaving peer exits within 10 s; no
// goroutine of a session is left 3 s after its Close (counted by the pprof label every goroutine of
// the session inherits), and none of the cluster after the run; no unexpected error; no panic (it
// ends the test binary, after the seed was printed). The run stops at the first violation and
// prints the seed, the violations and the last 100 events, the master's notes among them.
//
// -sim.seed replays a seed's fault schedule. Goroutine scheduling is not replayed: which of two
// goroutines runs first, and so the order of events at one virtual instant, may differ between two
// runs of one seed, and a failure that depends on it may not come again.
//
// # Planted bugs
//
// Options.Break plants a bug (plantedBugs): "stale-update" makes every peer apply the state update
// of a failed step, as the real soak's --break stale-update does; "hears-silent" makes the master
// count silent peers as heard when it judges a group's silence (simhook.HearsSilent), so that on
// the minority side of a partition it kicks the majority after HeartbeatTimeout instead of waiting
// PartitionTimeout for the cut to heal. TestPlantedBugCaught shows each is caught within 10 minutes
// of virtual time (-sim.bugseeds 10 runs ten fresh seeds); hears-silent's runs deal partitions, kills,
// leaves, clock jumps and junk only, since only a partition shows it. A bug of the master's is
// planted through simhook.Planted, which the master's code reads from the context of Serve.
//
// # What it does not cover
//
// The kernel's sockets (TCP's windows, retransmission and resets, the local path's unix sockets),
// TLS and QUIC, real scheduling (CPU work takes no virtual time, so a slow peer is slow only on the
// network), memory pressure, and processes (a stopped peer's own goroutines keep running). The
// real-process soak in stress covers those; neither replaces the other.
package sim
