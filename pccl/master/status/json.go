package status

import (
	"math"
	"time"

	"github.com/concord-ccl/concord/pccl/master"
)

// statusJSON is the wire form of a Snapshot on /status.json. Its keys are part of the interface and
// stay stable when Snapshot's Go fields are renamed.
type statusJSON struct {
	Time        time.Time `json:"time"`
	Incarnation uint64    `json:"incarnation"`
	// Epoch, Ring and Ops describe the default group (0); Groups lists every group.
	Epoch    uint64           `json:"epoch"`
	MinPeers int              `json:"min_peers"`
	Peers    []statusPeerJSON `json:"peers"`
	Ring     []uint64         `json:"ring"`
	Ops      []statusOpJSON   `json:"ops"`
	Counters statusCountJSON  `json:"counters"`
	// Bandwidth and Delay are null while there is no data; non-finite entries are written as 0.
	Bandwidth [][]float64       `json:"bandwidth"`
	Delay     [][]float64       `json:"delay"`
	Events    []statusEventJSON `json:"events"`
	Groups    []statusGroupJSON `json:"groups"`
	Policy    statusPolicyJSON  `json:"policy"`
}

// statusPolicyJSON is what the master does on its own about slow links and slow peers.
type statusPolicyJSON struct {
	Reorder              bool    `json:"reorder"`
	ReorderMinConfidence float64 `json:"reorder_min_confidence"`
	ReorderMinRatio      float64 `json:"reorder_min_ratio"`
	ReorderInterval      float64 `json:"reorder_interval_seconds"`
	EvictAfter           int     `json:"evict_after_ops"`
}

type statusGroupJSON struct {
	ID    uint32         `json:"id"`
	Epoch uint64         `json:"epoch"`
	Ring  []uint64       `json:"ring"`
	Ops   []statusOpJSON `json:"ops"`
	// Delay is the group's delay matrix in ring order (seconds per MiB), null while there is none.
	Delay     [][]float64          `json:"delay"`
	Links     []statusLinkJSON     `json:"links"`
	Syndromes []statusSyndromeJSON `json:"syndromes"`
	Diagnosis statusDiagJSON       `json:"diagnosis"`
}

// statusLinkJSON is one link's estimates of the delay matrix.
type statusLinkJSON struct {
	From     uint64  `json:"from"`
	To       uint64  `json:"to"`
	Transfer float64 `json:"transfer_seconds_per_byte"`
	Stall    float64 `json:"stall_seconds_per_byte"`
	Wait     float64 `json:"wait_seconds"`
	Transit  float64 `json:"transit_seconds_per_byte"`
	Age      uint64  `json:"age_ops"`
}

type statusSyndromeJSON struct {
	Kind       string  `json:"kind"`
	Peer       uint64  `json:"peer"`
	From       uint64  `json:"from,omitempty"`
	To         uint64  `json:"to,omitempty"`
	Confidence float64 `json:"confidence"`
	Ratio      float64 `json:"ratio"`
	Ops        int     `json:"ops"`
	Evidence   string  `json:"evidence"`
}

type statusDiagJSON struct {
	Raised          map[string]uint64 `json:"raised"`
	Cleared         uint64            `json:"cleared"`
	Evicted         uint64            `json:"evicted"`
	Recoveries      uint64            `json:"recoveries"`
	RecoverySeconds float64           `json:"recovery_seconds"`
	LastRecovery    float64           `json:"last_recovery_seconds"`
	// Re-orderings of the ring around a slow link by the master's policy: installed, held back by
	// its rate limit, and kept (no better ring); LastReorder is null while there was none.
	Reorders         uint64     `json:"reorders"`
	ReordersDeferred uint64     `json:"reorders_deferred"`
	ReordersKept     uint64     `json:"reorders_kept"`
	LastReorder      *time.Time `json:"last_reorder"`
}

type statusPeerJSON struct {
	ID       uint64    `json:"id"`
	Group    uint32    `json:"group"`
	Addr     string    `json:"addr"`
	Site     string    `json:"site"`
	State    string    `json:"state"`
	Joined   time.Time `json:"joined"`
	LastSeen time.Time `json:"last_seen"`
	// Step is the training step the peer reported last; null while it reported none.
	Step        *uint64 `json:"step"`
	InOptimizer bool    `json:"in_optimizer,omitempty"`
	// SiteNICMbit is what each NIC of the peer carried over its last collective on the intra-site
	// fabric, in Mbit/s, by NIC index; absent before any.
	SiteNICMbit []float64 `json:"site_nic_mbit,omitempty"`
}

type statusOpJSON struct {
	Tag       uint64 `json:"tag"`
	Seq       uint64 `json:"seq"`
	Count     uint64 `json:"count"`
	Voted     int    `json:"voted"`
	Done      int    `json:"done"`
	Peers     int    `json:"peers"`
	Failed    bool   `json:"failed"`
	FailCause string `json:"fail_cause,omitempty"`
}

type statusCountJSON struct {
	Joined     uint64 `json:"joined"`
	Accepted   uint64 `json:"accepted"`
	Left       uint64 `json:"left"`
	Kicked     uint64 `json:"kicked"`
	Timeouts   uint64 `json:"timeouts"`
	OpsDone    uint64 `json:"ops_done"`
	OpsAborted uint64 `json:"ops_aborted"`
	Rounds     uint64 `json:"rounds"`
	LinksCut   uint64 `json:"links_cut"`
}

type statusEventJSON struct {
	Time   time.Time `json:"time"`
	Kind   string    `json:"kind"`
	Peer   uint64    `json:"peer"`
	Detail string    `json:"detail"`
}

func opJSON(o master.OpInfo) statusOpJSON {
	return statusOpJSON{Tag: o.Tag, Seq: o.Seq, Count: o.Count, Voted: o.Voted, Done: o.Done, Peers: o.Peers,
		Failed: o.Failed, FailCause: o.FailCause}
}

// newStatusJSON converts s. Empty lists become [] rather than null, so clients need not tell the two
// apart; nil matrices stay null, which means "no data yet".
func newStatusJSON(s master.Snapshot) statusJSON {
	j := statusJSON{
		Time:        s.Time,
		Incarnation: s.Incarnation,
		Epoch:       s.Epoch,
		MinPeers:    s.MinPeers,
		Peers:       make([]statusPeerJSON, 0, len(s.Peers)),
		Ring:        make([]uint64, 0, len(s.Ring)),
		Ops:         make([]statusOpJSON, 0, len(s.Ops)),
		Counters: statusCountJSON{
			Joined: s.Counters.Joined, Accepted: s.Counters.Accepted, Left: s.Counters.Left,
			Kicked: s.Counters.Kicked, Timeouts: s.Counters.Timeouts, OpsDone: s.Counters.OpsDone,
			OpsAborted: s.Counters.OpsAborted, Rounds: s.Counters.Rounds, LinksCut: s.Counters.LinksCut,
		},
		Bandwidth: finiteMatrix(s.Bandwidth),
		Delay:     finiteMatrix(s.Delay),
		Events:    make([]statusEventJSON, 0, len(s.Events)),
		Groups:    make([]statusGroupJSON, 0, len(s.Groups)),
		Policy: statusPolicyJSON{Reorder: s.Policy.Reorder, ReorderMinConfidence: finite(s.Policy.ReorderMinConfidence),
			ReorderMinRatio: finite(s.Policy.ReorderMinRatio), ReorderInterval: s.Policy.ReorderInterval.Seconds(),
			EvictAfter: s.Policy.EvictAfter},
	}
	for _, g := range s.Groups {
		gj := statusGroupJSON{ID: g.ID, Epoch: g.Epoch, Ring: append(make([]uint64, 0, len(g.Ring)), g.Ring...),
			Ops: make([]statusOpJSON, 0, len(g.Ops)), Delay: finiteMatrix(g.Delay),
			Syndromes: make([]statusSyndromeJSON, 0, len(g.Syndromes)), Links: make([]statusLinkJSON, 0, len(g.Links)),
			Diagnosis: statusDiagJSON{Raised: map[string]uint64{}, Cleared: g.Diagnosis.Cleared, Evicted: g.Diagnosis.Evicted,
				Recoveries: g.Diagnosis.Recoveries, RecoverySeconds: g.Diagnosis.RecoverySeconds,
				LastRecovery: g.Diagnosis.LastRecovery.Seconds(), Reorders: g.Diagnosis.Reorders,
				ReordersDeferred: g.Diagnosis.ReordersDeferred, ReordersKept: g.Diagnosis.ReordersKept}}
		if t := g.Diagnosis.LastReorder; !t.IsZero() {
			gj.Diagnosis.LastReorder = &t
		}
		for _, o := range g.Ops {
			gj.Ops = append(gj.Ops, opJSON(o))
		}
		for k, v := range g.Diagnosis.Raised {
			gj.Diagnosis.Raised[k] = v
		}
		for _, l := range g.Links {
			gj.Links = append(gj.Links, statusLinkJSON{From: l.From, To: l.To, Transfer: finite(l.Transfer), Stall: finite(l.Stall),
				Wait: finite(l.Wait), Transit: finite(l.Transit), Age: l.Age})
		}
		for _, sy := range g.Syndromes {
			gj.Syndromes = append(gj.Syndromes, statusSyndromeJSON{Kind: sy.Kind, Peer: sy.Peer, From: sy.From, To: sy.To,
				Confidence: finite(sy.Confidence), Ratio: finite(sy.Ratio), Ops: sy.Ops, Evidence: sy.Evidence})
		}
		j.Groups = append(j.Groups, gj)
	}
	for _, p := range s.Peers {
		pj := statusPeerJSON{ID: p.ID, Group: p.Group, Addr: p.Addr, Site: p.Site, State: p.State.String(),
			Joined: p.Joined, LastSeen: p.LastSeen, InOptimizer: p.InOptimizer}
		if p.HasStep {
			step := p.Step
			pj.Step = &step
		}
		for _, r := range p.SiteNICRates {
			pj.SiteNICMbit = append(pj.SiteNICMbit, r*8/1e6)
		}
		j.Peers = append(j.Peers, pj)
	}
	j.Ring = append(j.Ring, s.Ring...)
	for _, o := range s.Ops {
		j.Ops = append(j.Ops, opJSON(o))
	}
	for _, e := range s.Events {
		j.Events = append(j.Events, statusEventJSON{Time: e.Time, Kind: e.Kind, Peer: e.Peer, Detail: e.Detail})
	}
	return j
}

// finite returns v, or 0 for NaN and ±Inf, which JSON cannot carry.
func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// finiteMatrix copies m with NaN and ±Inf replaced by 0 (unknown), which JSON cannot carry.
func finiteMatrix(m [][]float64) [][]float64 {
	if m == nil {
		return nil
	}
	out := make([][]float64, len(m))
	for i, row := range m {
		out[i] = make([]float64, len(row))
		for k, v := range row {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				out[i][k] = v
			}
		}
	}
	return out
}
