package master

import "time"

// PeerID identifies a peer. A peer may choose its id in its Hello, so that it keeps it across
// reconnections and master restarts; otherwise the master assigns one. No two live peers share an id.
type PeerID = uint64

// PeerState is where a peer is in its lifecycle.
type PeerState uint8

// Peer states.
const (
	Registered PeerState = iota + 1 // connected, waiting to be accepted at the next UpdateTopology
	Accepted                        // member of the ring
)

func (s PeerState) String() string {
	switch s {
	case Registered:
		return "registered"
	case Accepted:
		return "accepted"
	}
	return "unknown"
}

// PeerInfo describes one peer in a Snapshot.
type PeerInfo struct {
	ID       PeerID
	Group    GroupID
	Addr     string
	Site     string
	NICs     []string // the interfaces the peer announced for traffic inside its site
	State    PeerState
	Joined   time.Time
	LastSeen time.Time
	// Step is the training step the peer reported last (StepReport), InOptimizer whether it was
	// inside the optimizer step; HasStep is false while it reported none.
	Step        uint64
	InOptimizer bool
	HasStep     bool
	// SiteNICRates is what each of the peer's NICs (by index) carried, in bytes per second, over the
	// last collective whose site phases ran on the intra-site fabric: the data it posted over the
	// collective's time on the peer. A NIC that is down carries 0. Nil before any.
	SiteNICRates []float64
}

// GroupInfo describes one peer group in a Snapshot.
type GroupInfo struct {
	ID    GroupID
	Epoch uint64   // epoch of the ring in force or being wired
	Ring  []PeerID // ring order in force
	Ops   []OpInfo // sorted by tag
	// Bandwidth[i][j] is the measured bandwidth in bytes/s from Ring[i] to Ring[j] (0 = unknown); nil
	// while nothing was measured, or when the ring has more than MaxMatrixPeers peers.
	Bandwidth [][]float64
	// Delay[i][j] is the delay matrix: the recent time in seconds the link from Ring[i] to Ring[j]
	// held its sender back per MiB (0 = not observed recently); nil while no collective reported link
	// timings.
	Delay [][]float64
	// Links are the delay matrix's recent estimates per directed link, sorted by link.
	Links []LinkDelay
	// Syndromes are the slow links and slow peers diagnosed and not cleared, sorted.
	Syndromes []Syndrome
	// Diagnosis holds the group's diagnosis totals.
	Diagnosis DiagnosisStats
}

// MaxMatrixPeers is the largest ring whose bandwidth matrix a Snapshot carries: the matrix grows with
// the square of the ring (a ring of 10,000 peers would need 800 MB), and a heat map of more cells than
// this is no longer readable.
const MaxMatrixPeers = 256

// OpInfo describes one collective in a Snapshot.
type OpInfo struct {
	Tag       uint64
	Seq       uint64 // 0 while peers are still voting
	Count     uint64
	Voted     int // votes so far (before it commenced)
	Done      int // participants that reported done (after it commenced)
	Peers     int // participants
	Failed    bool
	FailCause string
}

// Counters are totals since the master started.
type Counters struct {
	Joined     uint64 // peers registered
	Accepted   uint64 // peers accepted into the ring
	Left       uint64 // peers gone: connection closed, Bye, heartbeat timeout or kick
	Kicked     uint64
	Timeouts   uint64 // peers declared gone for missed heartbeats
	OpsDone    uint64 // collectives completed
	OpsAborted uint64 // collectives aborted
	Rounds     uint64 // ring wiring rounds started
	Syncs      uint64 // shared-state syncs completed
	LinksCut   uint64 // links between two reachable peers taken out of the rings (cuts.go)
	Rendezvous uint64 // requests to reach a peer that cannot be dialled, passed on (address.go)
}

// Event is one notable thing that happened, for logs and the status page.
type Event struct {
	Time   time.Time
	Kind   string  // "joined", "accepted", "left", "kicked", "timeout", "aborted", "ring", "mismatch", "link-cut", a syndrome ("slow-link", "slow-sender", "slow-receiver", "slow-compute"), "cleared", "probe" or "reorder"
	Peer   PeerID  // 0 if not about one peer
	Group  GroupID // the group it happened in (0 for events of the default group or of no group)
	Detail string
}

// Snapshot is a consistent copy of the master's state for observers (status page, metrics, tests).
// It shares no memory with the master. Epoch, Ring, Ops, Bandwidth and Delay describe the default
// group (0); Groups describes every group, the default one included.
type Snapshot struct {
	Time        time.Time
	Incarnation uint64 // the master's incarnation (see Config.Incarnation)
	Epoch       uint64
	MinPeers    int
	Peers       []PeerInfo  // sorted by ID
	Ring        []PeerID    // ring order in force
	Ops         []OpInfo    // sorted by tag
	Groups      []GroupInfo // sorted by ID
	Counters    Counters
	// Bandwidth[i][j] is the measured bandwidth in bytes/s from Ring[i] to Ring[j] (0 = unknown).
	// Nil until topology measurement exists.
	Bandwidth [][]float64
	// Delay is the default group's delay matrix (see GroupInfo.Delay).
	Delay [][]float64
	// Events are the most recent events, oldest first.
	Events []Event
	// Relay counts the links the master relays between peers behind NAT (relay.go); the server
	// fills it in.
	Relay RelayStats
	// Policy says what the master does on its own about slow links and slow peers.
	Policy PolicyInfo
}

// PolicyInfo describes the master's automatic policies in a Snapshot (Config.Diagnosis), with the
// defaults filled in.
type PolicyInfo struct {
	Reorder              bool          // the ring is re-ordered around a clear slow link (ReorderPolicy)
	ReorderMinConfidence float64       // the least confidence of the slow-link syndrome
	ReorderMinRatio      float64       // the least ratio of its stall to the group median
	ReorderInterval      time.Duration // the least time between two re-orderings of a group
	EvictAfter           int           // operations a straggler's syndrome holds before it is kicked; 0: never
}
