// Package pccl is Concord's public API: a Communicator that joins a run through the master, keeps a
// ring of peers wired, and runs abortable collectives over it.
//
// A peer calls Connect, which returns once the existing peers have accepted it (at their next
// UpdateTopology). Collectives are AllReduce, AllReduceAsync and AllGather; several may run at once on
// different tags. Every peer passes the same Desc for a tag; a disagreement is ErrDescriptorMismatch on every
// caller, never a hang. Results are bit-identical on every peer: each chunk's final value is computed
// by one owner in a fixed ring order and copied by everyone else.
//
// Failure is an ordinary path. When a peer dies, hangs or is kicked, every collective it takes part in
// fails on the survivors with ErrPeerLeft within about one round trip of the master learning of it (at
// once for a closed connection, after the heartbeat timeout for a hung peer). A link that goes silent
// while both its ends still reach the master is reported the same way once it makes no progress for
// Config.ProgressTimeout (longer for frames the measured link rate needs more time for). A failed call
// leaves its buffers exactly as they were, and aborting one collective never disturbs another tag's:
// connections are shared and stay open; after a death only the links next to the dead peer are dialled
// again (Stats counts them). The caller then re-wires the ring with UpdateTopology and retries:
//
//	for {
//		err := comm.AllReduce(ctx, grads, grads, desc)
//		if pccl.Retryable(err) {
//			if err := comm.UpdateTopology(ctx); err != nil {
//				return err
//			}
//			continue
//		}
//		break
//	}
//
// That UpdateTopology also admits peers waiting in Connect. Rewire re-wires the ring without admitting
// anyone (as PCCL's retry does), for loops that admit newcomers at one place only; a round in which
// any peer called Rewire admits nobody.
//
// Membership calls are collective: every accepted peer makes the same sequence of UpdateTopology,
// ArePeersPending, SyncSharedState, OptimizeTopology and collectives. A newcomer's first call after
// Connect must be the one the accepted peers make right after the UpdateTopology that admitted it; the
// simplest loop puts the sync there:
//
//	for step := ...; ; step++ {
//		if !justJoined {
//			if pending, _ := comm.ArePeersPending(ctx); pending {
//				comm.UpdateTopology(ctx) // admits the newcomers
//			}
//		}
//		state.Revision++
//		comm.SyncSharedState(ctx, state, opts) // newcomers enter here and adopt the state
//		... compute, AllReduce with retry; after a retry's UpdateTopology, go back to the sync ...
//	}
//
// A peer that the master removes (it was cut off by a partition, silent past the heartbeat timeout, or
// its advertised address could not be dialled) dies with ErrKicked; Rejoinable says it may connect
// again as a newcomer, and Rejoin runs a training loop that does so by itself, with backoff, giving up
// only on what a retry cannot fix (ErrRefused: a wrong token or protocol version). The master
// connection itself may break or go silent for up to Config.MasterTimeout: the peer resumes its
// session with the master on a new connection and nothing is lost.
//
// Which method returns which error:
//   - Connect: ErrKicked (unreachable; with ErrRefused for a wrong token or version), ErrMasterLost, ctx errors.
//   - UpdateTopology, Rewire: ErrBusy while collectives of this peer run, ErrKicked, ErrMasterLost,
//     ErrClosed.
//   - ArePeersPending: ErrKicked, ErrMasterLost, ErrClosed.
//   - AllReduce / Request.Wait / AllGather: ErrPeerLeft (retryable after UpdateTopology), ErrAborted (a peer
//     cancelled; retryable the same way), ErrTooFewPeers (fewer than MinPeers accepted: wait, then
//     UpdateTopology), ErrLocalFailure (a peer failed for a reason of its own, such as a non-finite
//     quantized result; not retryable), ErrDescriptorMismatch, ErrInvalid (bad arguments, tag in
//     use), ErrKicked, ErrMasterLost, ErrClosed. Retryable tells the first three from the others.
//
// Concurrency: AllReduce, AllReduceAsync and AllGather may be called from many goroutines at once on different
// tags. UpdateTopology and ArePeersPending are called by one goroutine at a time, like the training
// loop does. A buffer passed to a collective belongs to Concord until the call (or Wait) returns.
package pccl
