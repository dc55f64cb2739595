// Package rdma is Concord's intra-site tier: collectives over nodes that each have several NICs, kept
// running losslessly when a NIC, cable or port fails mid-operation.
//
// # Fabric
//
// A provider implements [Endpoint] and [Conn] (sub-packages: rdma/sim, a deterministic discrete-event
// simulator, and rdma/tcp, real sockets bound to interfaces). Everything is posted without blocking and
// every outcome comes back as an [Event] in the endpoint's single event context, the way RDMA verbs post
// work requests and poll completions:
//
//   - a [NIC] has an id, a bandwidth, a NUMA/PCIe distance and a port state ([Health]);
//   - a [Region] is registered on every NIC at once, so nothing is registered on the recovery path;
//   - a [Conn] joins one local NIC to one remote NIC and carries numbered [Chunk]s one way and the
//     other; each arrived chunk is acknowledged by a [Completed] event at its sender;
//   - zero-byte probes travel on [ProbeClass] connections and control messages on [ControlClass]
//     connections, never queued behind bulk data;
//   - port up/down events ([PortChanged]) and connection errors ([ConnDown]) reach the runtime.
//
// # Multi-rail collectives
//
// A [Node] splits every collective into channels, one per NIC, evenly or by Config.ChannelWeights
// (the same split on every node, whatever bandwidths its NICs declare), and runs each channel as its
// own ring (AllReduce as reduce-scatter then all-gather with the rings package's kernels; AllGather;
// ReduceScatter; a pipelined Broadcast chain) or point-to-point transfer (Send/Recv). A channel's
// chunks from one node to the next form a path ([PathID]). A healthy node keeps all its NICs busy.
// Each element's final value is computed by one node in a fixed order and copied by the others, so
// results are bit-identical everywhere and do not depend on failures.
//
// # Planned schedules
//
// Three parts, each with its own name: package rdma/plan's [plan.Planner] prices every strategy on a
// topology and picks one, a [plan.Plan] says what every node does for one call (the standard ring,
// hot repair, Balance (a degraded node's bytes spread over its healthy NICs by bandwidth),
// R²CCL-AllReduce, the recursive schedule, OptCC's schedule or the weighted rings), and the executor,
// [Node.StartAllReduceWithPlan], runs a plan as one operation whose dependent paths wait behind
// gates. A [Replanner] joins them on a Node: it asks the planner for each call's plan from the
// message size and the NIC health the runtime has seen, so it re-plans when a NIC fails or heals. The
// planner's per-NIC α and β come from [Node.Calibrate]: every node times sends over each NIC alone and
// the nodes share one table, which [Calibration.Apply] puts into the planner's topology.
//
// A plan of one ring over every node (the standard ring, hot repair, Balance, each possibly on a
// bridge re-ranked ring: [PhaseStrategies]) also runs as a reduce-scatter or an all-gather with the
// same routes ([Node.StartReduceScatterWithPlan], [Node.StartAllGatherWithPlan]), node r owning block
// r whatever the ring order; [Replanner.PhasePlan] picks the cheapest of them. The other schedules
// leave no node with a fixed block of the sum.
//
// # Hot repair
//
// At start a node opens data, control and probe connections to its ring neighbours on every NIC: the
// backups of every path exist before anything fails. The protocol is a pure state machine, [Repair],
// driven by the Node (inputs: provider events, chunk progress, control messages, time; outputs: what to
// send, probe, pause and resume). Per path:
//
//	detect      sender: connection error, local port down, or no completion before a deadline that
//	            adapts to the measured round trip, confirmed by a probe;
//	            receiver: connection error, local port down, or a stall confirmed by a failed probe.
//	tell        the receiver sends Notice(path, epoch, pair) to the sender over a control connection on
//	            another NIC (bilateral awareness); a local port event becomes a Verdict at once.
//	fail over   the sender pauses the path, bumps its epoch, picks the next healthy NIC pair of the
//	            channel's chain (ordered by distance from the channel's NIC) and sends
//	            FailReq(path, epoch, new pair, first unacknowledged chunk).
//	roll back   the sender resumes at once on the new pair from its first unacknowledged chunk, without
//	            waiting for an answer: the receiver takes chunks in sequence from any pair it has not
//	            retired and drops duplicates. The receiver retires the old pair (late chunks from it
//	            are dropped) and answers FailAck(path, epoch, next chunk it expects); the sender rewinds
//	            to that chunk only if it is behind the one it resumed from (a chunk completed on the
//	            old pair and then dropped). At most the window per path is sent again, since
//	            providers complete a chunk once it is in the receiver's memory, so the window holds
//	            only what is in flight.
//	localize    the sender probes the peer's NIC and asks a third node to probe both NICs
//	            (ProbeAsk/ProbeReport): peer unreachable but both NICs reachable from the third node is
//	            the link, one NIC unreachable is that NIC. The Verdict goes around the group, and every
//	            node moves its own paths off the failed element.
//	heal        the node that concluded a verdict re-probes the element with doubling backoff; when it
//	            answers, a healthy Verdict goes around, connections on it are renewed and the next
//	            operation starts on the primary NIC again.
//
// Messages of an older epoch or operation are ignored; a second failure during or after a failover
// moves the path to the next NIC of the chain; when no pair is left the operation fails with
// [ErrNoPath]. Scripted scenarios of the machine live in testdata/ with golden transcripts.
package rdma
