// Package wanemu emulates wide-area links between sites on one Linux machine, at the packet level,
// for tests and benchmarks of Concord's WAN tier.
//
// Every site is a network namespace created by [Testbed.Start], with one address from [Prefix]
// (198.18.0.0/15) on a TUN device named wan0 that routes the whole prefix. Processes and sockets in a
// site reach the other sites by their addresses ([Testbed.Addr]) and see a real path: TCP and QUIC run
// end to end between the two kernels, so the sender's congestion and flow-control windows meet the
// full round-trip time, and loss and queueing show up as they would on a WAN. Nothing terminates or
// re-originates a connection, unlike a TCP relay such as toxiproxy, which would hide the RTT from the
// sender and cap each proxied connection on its own.
//
// # Packet path
//
// A packet that a socket in site A sends to site B's address goes:
//
//  1. out of A's TUN device, where the forwarder's reader for A reads it and classifies it by its
//     5-tuple (protocol, source and destination address and port) and destination site;
//  2. into the directed link A→B, which drops it at random with probability [Link.Loss] (from a
//     generator seeded by [Config.Seed], one stream per link);
//  3. through its flow's token bucket, when [Link.FlowMbit] caps each flow: the packet waits in its
//     flow's queue until the bucket allows it, or is dropped if that queue holds
//     [Link.FlowQueueBytes] already;
//  4. through the link's token bucket at [Link.CapacityMbit], shared by all flows in FIFO order, or
//     dropped if the link queue holds [Link.QueueBytes] already (drop-tail: TCP sees the same
//     congestion signal as at a real bottleneck);
//  5. after the one-way [Link.Delay], into B's TUN device, from which B's kernel receives it.
//
// Steps 2 to 5 run in one scheduler goroutine that owns every link. The token buckets are kept in
// virtual-time form, so each packet's departure and arrival times are computed exactly when it
// enters a stage; a single min-heap of due events, driven by one timer, releases packets when their
// time comes. No goroutine sleeps per packet, and a late timer delays a batch of packets without
// changing the rates: the long-run capacity and per-flow rates are exact, while individual packets
// may arrive up to the timer's slack (about a millisecond on a loaded machine) after their time.
// The readers and one writer per site do the system calls, off the scheduler.
//
// # Knobs
//
// A [Link] configures one direction of the path between two sites; [Config.Link] is the default for
// all, [Config.Links] overrides it per directed link, and [Testbed.SetLink] changes one while the
// testbed runs; [Testbed.CapFlow] caps a single flow at a rate of its own (a connection on a
// congested route, say). An RTT of R on a symmetric path is Delay R/2 both ways. The queue limits
// default to one bandwidth-delay product of their rate over 2·Delay, but at least 64 packets of the MTU.
// [Config.MTU] sets the devices' MTU (1500 by default); a larger MTU lowers the packet rate the
// forwarder must carry for a given throughput. [Testbed.Stats] counts each link's packets and drops.
//
// # Running code in a site
//
// [Netns.Do] runs a function on an OS thread inside a site's namespace, which is how sockets are
// made there ([Netns.Listen], [Netns.ListenPacket], [Netns.Dial] wrap it); the thread is locked and
// never handed back to other goroutines. [Netns.Start] starts a process inside a site: it is forked
// from such a thread, so it and all its threads live in the namespace. `ip netns exec NAME` works too
// while the testbed runs, since the namespaces are bound under /run/netns.
//
// # Limits
//
// The forwarder carries IPv4 only. It reads and writes one packet per system call, so its packet
// rate, not its bit rate, is what runs out, and a larger MTU carries several times more
// (docs/results/wan.md has the figures). When it falls behind, packets wait in the
// TUN devices' transmit queues (4096 packets), unaccounted, before the emulated links see them; size
// the MTU and the number of sites so that the aggregate rate stays well within its reach, or turn
// on [Config.Offload], which passes TCP (and, from Linux 6.2, UDP) segments of up to 64 KiB through
// the devices whole. quic-go sends its packets in UDP segmentation-offload batches (UDP_SEGMENT), so
// with offload a QUIC connection costs the forwarder one packet per batch rather than one per QUIC
// packet, as a TCP connection costs one per segment; the receiving kernel splits a batch back into
// datagrams. Timers fire late under load, which adds to the RTT but not to the rates.
//
// # Lifecycle and privileges
//
// Building a testbed needs root: [Available] says whether it can, and errors wrap [ErrNotPermitted]
// when it cannot, so tests skip. Namespaces are named NAMEPREFIX-PID-TESTBED-SITE; [Testbed.Start]
// first removes ([Sweep]) those a dead process left behind, and [Testbed.Close] removes the
// testbed's own, also after a failed start.
package wanemu
