package master

import (
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/concord-ccl/concord/internal/wire"
)

// GuardPolicy is the contribution guard: an optional check, before a collective commences, of the
// contributions its peers reported in their Initiate votes (wire.Contribution: finiteness and norm;
// peers send them when their pccl.Config.ContributionStats is set). The zero value checks nothing.
type GuardPolicy struct {
	// RejectNonFinite rejects a contribution that holds a NaN or an infinity.
	RejectNonFinite bool
	// NormFactor, when above 1, rejects a contribution whose norm exceeds NormFactor times the median
	// norm of the other peers' contributions. Zero disables the check.
	NormFactor float64
	// Exclude chooses what happens to a rejected contribution: true kicks its peer with the reason
	// (the others' call fails with ErrPeerLeft, and they retry without it after UpdateTopology); false
	// fails the collective for everyone with a local failure naming the offender (not retryable).
	Exclude bool
}

// enabled reports whether the guard checks anything.
func (g GuardPolicy) enabled() bool { return g.RejectNonFinite || g.NormFactor > 1 }

// contributions are the stats the voters of one collective reported.
type contributions struct {
	op    *op
	stats map[PeerID]*wire.Contribution
}

// noteContribution records the stats peer id reported in its vote for o.
func (m *Machine) noteContribution(g *group, o *op, id PeerID, st *wire.Contribution) {
	if !m.cfg.Guard.enabled() {
		return
	}
	k := guardKey{g.id, o.tag}
	c := m.contrib[k]
	if c == nil || c.op != o {
		c = &contributions{op: o, stats: map[PeerID]*wire.Contribution{}}
		m.contrib[k] = c
	}
	if st != nil {
		c.stats[id] = st
	}
}

type guardKey struct {
	group GroupID
	tag   uint64
}

// guard checks the contributions of o, which every voter has voted for, before it commences. It
// reports whether it stopped o: by kicking the offenders (Exclude), or by failing o for everyone.
func (m *Machine) guard(g *group, o *op) bool {
	if !m.cfg.Guard.enabled() {
		return false
	}
	k := guardKey{g.id, o.tag}
	c := m.contrib[k]
	delete(m.contrib, k)
	if c == nil || c.op != o {
		return false
	}
	reasons := map[PeerID]string{}
	var offenders []PeerID
	for _, id := range slices.Sorted(maps.Keys(c.stats)) {
		st := c.stats[id]
		reason := ""
		switch {
		case !st.Finite || math.IsNaN(st.Norm) || math.IsInf(st.Norm, 0):
			if m.cfg.Guard.RejectNonFinite {
				reason = fmt.Sprintf("peer %d's contribution to tag %d holds NaN or infinite values", id, o.tag)
			}
		case m.cfg.Guard.NormFactor > 1:
			var others []float64
			for q, s := range c.stats {
				if q != id && s.Finite && !math.IsNaN(s.Norm) && !math.IsInf(s.Norm, 0) {
					others = append(others, s.Norm)
				}
			}
			if med := median(others); len(others) > 0 && med > 0 && st.Norm > m.cfg.Guard.NormFactor*med {
				reason = fmt.Sprintf("peer %d's contribution to tag %d has norm %.3g, %.1f times the median %.3g of the others (GuardPolicy.NormFactor %.1f)",
					id, o.tag, st.Norm, st.Norm/med, med, m.cfg.Guard.NormFactor)
			}
		}
		if reason != "" {
			reasons[id] = reason
			offenders = append(offenders, id)
		}
	}
	if len(offenders) == 0 {
		return false
	}
	if m.cfg.Guard.Exclude {
		for _, id := range offenders {
			m.gnote(g, "guard", id, "%s: excluded", reasons[id])
			m.kick(id, "contribution guard: "+reasons[id]+"; this peer is excluded from the run")
		}
		return true
	}
	detail := "contribution guard: " + reasons[offenders[0]]
	if len(offenders) > 1 {
		detail += fmt.Sprintf(" (and %d more)", len(offenders)-1)
	}
	m.gnote(g, "guard", offenders[0], "%s", detail)
	m.fail(g, o, wire.CodeLocalFailure, detail)
	m.checkOp(g, o)
	return true
}

// median returns the median of xs (the mean of the two middle ones for an even count), 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
