// Package gossip detects dead peers with SWIM-style gossip (hashicorp/memberlist), independently of
// the master's own heartbeat over its control connection.
//
// The master runs one Member and every peer runs one, joined to the master's. Each member probes one
// other member per ProbeInterval: a direct ping that must be answered within ProbeTimeout, then
// IndirectChecks other members ping on its behalf. A member that answers none is suspected; the
// suspicion is gossiped, the suspected member refutes it if it is alive (it raises its incarnation),
// and otherwise it is declared dead when the suspicion timeout ends. The master's Member reports that
// verdict (Event with Gone) and the master aborts the operations of that peer at once, even if the
// peer's control connection is still open (a hung process keeps its sockets).
//
// # Detection bound
//
// Config.Bound(n) states the longest time from a member hanging to its death being known, in a group
// of n members (the master included), when the other members are healthy:
//
//	first failed probe   <= 2n * ProbeInterval   (every member walks a shuffled list of the others)
//	suspicion timeout    = SuspicionMult * max(1, log10 n) * ProbeInterval       (fewer than SuspicionMult
//	                        members besides the two involved: no confirmations are expected)
//	                     <= SuspicionMaxTimeoutMult times that (otherwise; each confirmation shortens it)
//	gossip of the verdict <= one ProbeInterval
//
// With the LAN preset and n < 10 this is at most 2n*0.5s + 2s (n <= 3) or 8s (n >= 4), plus 0.5s.
//
// # False positives
//
// A member starved of CPU (a peer busy in a kernel, a loaded host) answers late. Three things keep it
// from being declared dead while it still runs: the suspicion timeout (LAN: 2s at least) is longer
// than the master's LAN heartbeat timeout (1.5s), so a starvation long enough to kill it by gossip
// would already have killed it by heartbeat; a suspected member that gets the CPU back refutes the
// suspicion; and Lifeguard's awareness (AwarenessMaxMultiplier) makes a member that itself misses
// acks (the starved one) probe more slowly and wait longer, so it does not accuse healthy members.
// ProbeTimeout is chosen above the p99 round trip under bulk load; gossip uses its own UDP and TCP
// sockets, never the data links.
//
// Gossip cannot see a link black-holed between two members that others still reach (the indirect
// probes succeed); the data path's progress deadline reports such links.
package gossip
