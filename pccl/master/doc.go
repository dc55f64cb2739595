// Package master is the Concord master: the coordinator that peers register with, which runs the
// micro-consensus of membership, ring topology, shared-state syncs and collectives, and detects
// failed peers.
//
// The protocol logic is a pure state machine, Machine: Step takes one input (a message received on a
// connection, a closed connection, a clock tick, a ring solver's answer) and the current time, and
// returns the actions to carry out (send a message, close a connection, note an event, solve a ring).
// It owns no sockets, goroutines or clocks, so every path is tested by the scripted scenarios in
// testdata/. Server does the I/O around one Machine. The status page and metrics live in the status
// sub-package, which reads only Snapshots.
//
// The Machine is split by concern: membership.go (Hello, ids, kicks, departures), heartbeat.go,
// group.go (groups and epochs), wiring.go (UpdateTopology, wiring rounds, ArePeersPending),
// collective.go (collectives per tag), sync.go (shared-state sync), topology.go
// (OptimizeTopology: bandwidth measurement, ring solve, placement of newcomers) and diagnosis.go (the
// link timings of every completed collective fed into the group's delay matrix, whose syndromes, in
// package diagnosis, become events, a higher cost for slow links in the ring solve, and optionally
// the eviction of chronic stragglers), reorder.go (a clear slow link gets the ring re-ordered around
// it by the master on its own, rate-limited, with no application call), cuts.go (links that went silent on the data path, or could
// not be dialled, between two peers that still reach the master: rings avoid them for a while) and
// address.go (the NAT warning and the one-line report of an advertised address nobody can dial).
//
// # Groups
//
// A peer names its group in its Hello (0 by default). Membership is global: one peer table, one
// heartbeat deadline, ids unique across groups. Everything else is per group: the ring, the epoch
// counter, the collectives (one per tag at a time), the shared-state sync and its last accepted
// state, OptimizeTopology, the ArePeersPending answer, and the rule of one major operation (wiring,
// optimization, sync) at a time. Votes are counted among the group's accepted peers only, and a
// departure aborts and re-wires only its own group.
//
// Every Topology message carries the run's size over all groups (accepted peers, groups with one, the
// largest group), counted when it is sent: a peer learns of another group's change at its own group's
// next Topology, never in between.
//
// # Identity and epochs
//
// A peer may choose its id in Hello (Peer, nonzero), so that it keeps it when it reconnects, to this
// master or to a restarted one; a Hello choosing the id of a live peer is refused with a Kick that says
// so. A peer that chooses none gets its connection number, or the next free id when a chosen id holds
// that number. Peers that choose should pick random 64-bit ids, far from the small assigned ones.
//
// Every membership or ring change of a group hands out a new epoch, and every data frame carries its
// epoch, so frames of an aborted attempt are dropped, never mixed in. An epoch is the master's
// incarnation in the high 32 bits and the group's counter in the low 32 bits. The incarnation is
// Config.Incarnation, which the server draws at random (nonzero, below 2^32) at every start and sends
// in Welcome; a restarted master therefore never hands out an epoch that a peer may still hold from the
// master before it (two draws collide with probability 2^-32). A departure costs its group exactly one
// epoch: the ring is spliced under the epoch in force, on which no collective can start any more, and
// the wiring round that repairs the ring hands out the next one.
//
// # Message flow
//
//	peer                                master
//	Hello (token, addr, site, id, group) ->
//	     <------------------------------- Welcome (id, heartbeat timing, incarnation)  or Kick
//	     <------------------------------- Connect (epoch, ring)     a wiring round
//	LinksReady (epoch, ok | failed) ----->
//	     <------------------------------- Topology (epoch, ring)    ring in force; newcomers accepted
//	VoteTopology (rewire, no admit) ----->                          UpdateTopology, Rewire
//	VotePending ------------------------->                          ArePeersPending
//	     <------------------------------- Pending (answer)          same answer for the whole group
//	Initiate (tag, descriptor) ---------->
//	     <------------------------------- Commence (tag, seq, epoch)  or Outcome (mismatch, too few, ...)
//	Done (tag, seq, code, link timing) -->
//	     <------------------------------- Outcome (tag, seq, code)  exactly one per peer and operation
//	VoteSync (strategy, digest) --------->
//	     <------------------------------- SyncPlan (revision, what to fetch from whom)
//	SyncDone (ok) ----------------------->
//	     <------------------------------- SyncComplete (revision, resume step)
//	VoteOptimize ------------------------>
//	     <------------------------------- MeasureRound (target)     n-1 rounds
//	MeasureReport (bandwidth, latency) -->
//	     <------------------------------- Connect ... Topology      the solved ring, or Topology unchanged
//	Heartbeat --------------------------->
//	     <------------------------------- HeartbeatAck
//	     <------------------------------- Notice (one line for the operator: NAT, unreachable address)
//	Bye --------------------------------->
//
// Every message after the Hello travels in a control session (session.go, wire/session.go) that
// outlives its connection: a peer whose connection breaks or goes silent dials again and resumes the
// session, and each side sends again what the other missed. The Machine never sees a resumption.
//
// # The master's own stalls
//
// The server ticks the Machine every HeartbeatInterval/4 and measures the time between two ticks.
// When a tick comes later than twice its interval, the master itself did not run (a GC pause, a
// SIGSTOP, a VM migration, a starved CPU): the server first feeds the Machine what its connection
// readers had already received, then sends Stalled instead of Tick, which pushes every heartbeat
// deadline back by the stall (stall.go). A pause of the master therefore costs the peers nothing but
// the pause, as long as it is shorter than their MasterTimeout.
//
// # A master that suspects itself
//
// Silence alone cannot tell a dead peer from a master cut off from it, so the heartbeat deadline
// (heartbeat.go) judges each group's silent peers against what the master still hears of the group:
//
//	hears half of the group or more:   a silent peer is kicked after HeartbeatTimeout
//	hears some, but fewer than half:   after PartitionTimeout (5 × HeartbeatTimeout by default)
//	hears none of the group:           nobody is kicked for silence
//
// A master whose own link is cut (testdata/partition_master_cut) therefore kicks nobody, and when the
// link heals its peers resume their sessions and lose nothing, not even the collective in flight. A
// silent minority is kicked as before (partition_minority). Halves of a group, or the master left with
// fewer than half (partition_majority_silent), go on on the master's side once the silent ones are
// kicked, after HeartbeatTimeout or PartitionTimeout; the others rejoin as newcomers when the partition
// heals and fetch the state (partition_halves). Groups are judged apart (partition_groups). The rule
// cannot split the brain: only this master accepts revisions and commences collectives, so a side
// without it cannot advance at all. A peer that comes back with a Resume report of this very
// incarnation, after the master removed it, is refused in one line and joins again as a newcomer.
//
// # Restarts, limits and the contribution guard
//
// A restarted master rebuilds its view from the Resume reports in its peers' Hellos (resume.go). The
// machine bounds the peers it admits and the collectives a peer may have in flight, and the server
// the frame size and the rate of new connections per source address (limits.go). An optional
// contribution guard checks the finiteness and norm each peer reported in its Initiate vote before a
// collective commences, and excludes the offender or fails the collective for all (guard.go).
//
// Any message a peer may not send in its state gets it kicked: a Kick with the reason, then the
// connection is closed.
//
// # A peer's states
//
//	             Hello: token, address and id good
//	connected ---------------------------------------> registered
//	    |                                                  |  a wiring round of its group that
//	    | Hello refused (token, no address, id taken)      |  includes it completes (Topology)
//	    v                                                  v
//	  (Kick, closed)                                    accepted  (in the group's ring; votes)
//
//	registered or accepted --- connection closed, Bye, heartbeat timeout, kick ---> gone
//
// A registered peer waits: it is wired in when the accepted peers of its group call UpdateTopology
// (or at once when its group has no accepted peer). A round in which any accepted peer voted with
// NoAdmit (the repair after a failed collective, as PCCL's retry re-establishes its links) re-wires
// the accepted peers only, and the newcomers keep waiting for a round where every vote admits. If its links fail, it is kicked and the round is
// retried without it: the accepted peers never wait on a newcomer. When an accepted peer goes, every
// collective of its group is aborted with CodePeerLeft, its sync and optimization are repaired or
// abandoned, and collectives are refused with CodePeerLeft until an UpdateTopology re-wires the ring.
//
// # A wiring round
//
//	UpdateTopology votes of every accepted peer, with newcomers (none if a vote said NoAdmit), a
//	dirty ring or rewire asked
//	   -> round (epoch E): Connect to every member of the new ring
//	   -> every member answers LinksReady(E)
//	        all ok:  Topology(E) to all; newcomers accepted
//	        some failed between accepted peers, and a ring without those links exists: the links
//	                 are cut; round retried at E+1 on that ring
//	        some failed otherwise: the unreachable peers (newcomers first) are kicked; round retried at E+1
//	   a member goes meanwhile: round retried at E+1 without it
//
// A collective that failed on a silent link (Done.Silent) cuts that link and marks the ring dirty, so
// the next round wires a ring around it. Such a cut is inferred and may name the wrong link; when a
// dial then fails and the cuts leave no ring, the inferred ones in the way are given up once before
// anyone is kicked (cuts.go). Without newcomers, a dirty ring or a rewire request,
// UpdateTopology answers Topology(unchanged) at once. OptimizeTopology ends the same way when its solved ring differs from the ring in force.
//
// # An operation's states (one collective on one tag of a group)
//
//	(none) --first Initiate--> voting --every accepted peer voted, same descriptor--> commenced
//	                             |                                                        |
//	   descriptor mismatch, a    |                                   every member Done ok |
//	   withdrawal (Done seq 0),  v                                                        v
//	   a peer left, ring dirty  failed: Outcome to each voter;        Outcome ok to every member
//	                            retired once every accepted peer      -> (none)
//	                            has voted and heard it -> (none)
//
//	commenced --a member Done with an error, or a member gone--> failed: Outcome with the code to
//	every member at once; retired when every remaining member has sent its Done -> (none)
//
// A peer that has finished its part of an operation may already vote for the next one on the tag;
// the vote is queued and counted once the running operation retires. Collectives on different tags run at once; each group numbers its
// operations with its own sequence.
package master
