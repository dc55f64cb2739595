package master

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// tick kicks the peers that have been silent for longer than the heartbeat timeout, by the rule of
// the master that suspects itself. Any message counts as a sign of life, not only heartbeats.
//
// Silence alone cannot tell a dead peer from a master cut off from it. A master whose own port or
// uplink fails hears nobody while every peer is fine, and a partition leaves it hearing only its own
// side. So it judges each group's silence against what it still hears of that group (its accepted
// and registered peers):
//
//   - hearing from half of the group or more, it kicks each silent peer after HeartbeatTimeout: a
//     dead, hung or cut-off minority must not hold the others up;
//   - hearing from some of the group but fewer than half, it waits PartitionTimeout before it kicks
//     them: a short cut of the master's own link heals without costing anyone, a long partition lets
//     the master's side go on;
//   - hearing from none of the group, it kicks nobody for silence: there is no one to go on with, and
//     when the network heals the peers resume their sessions and nothing is lost.
//
// Only the master accepts shared-state revisions and commences collectives, so whatever it waits for,
// no two sides of a partition ever advance apart. Peers that were kicked join again as newcomers.
//
// It looks only at the peers whose last sign of life is old enough, through the heap of last-seen
// times: a tick costs O(k log n) for the k silent peers, not a scan of all n peers. The silent peers
// are kicked in the order of their ids.
func (m *Machine) tick() {
	var silent []*peer
	for len(m.silence) > 0 {
		w := m.silence[0]
		if m.now.Sub(w.seen) <= m.cfg.HeartbeatTimeout {
			break
		}
		m.silence.pop()
		p := w.p
		switch {
		case m.peers[p.id] != p:
			// Gone (possibly replaced by a new peer under the same id, which has its own entry).
		case m.now.Sub(p.lastSeen) > m.cfg.HeartbeatTimeout:
			silent = append(silent, p)
		default:
			// Heard from since this entry was made: watch it from its last sign of life.
			m.silence.push(watched{seen: p.lastSeen, p: p})
		}
	}
	slices.SortFunc(silent, func(a, b *peer) int { return cmp.Compare(a.id, b.id) })
	quiet := map[*group]int{}
	for _, p := range silent {
		quiet[p.group]++
	}
	// What the master hears of a group with silent peers: those heard within hearWindow. A peer that
	// has not quite reached the timeout does not count as heard: when the master's own link fails,
	// its peers fall silent together, a heartbeat apart.
	heard := map[*group]int{}
	for g := range quiet {
		for _, ids := range [][]PeerID{g.acc, g.reg} {
			for _, id := range ids {
				if m.hearsSilent || m.now.Sub(m.peers[id].lastSeen) <= m.hearWindow() {
					heard[g]++
				}
			}
		}
	}
	for _, gid := range m.gids {
		g := m.groups[gid]
		if n := quiet[g]; n > 0 {
			m.suspect(g, heard[g])
			continue
		}
		g.blind = false
		if g.isolated != nil {
			if g.size() > 0 {
				m.gnote(g, "healed", 0, "hearing from every peer of the group again after %v",
					m.now.Sub(*g.isolated).Round(time.Millisecond))
			}
			g.isolated = nil
		}
	}
	// Judge every group on what the master heard before this tick's kicks.
	limit := map[*group]time.Duration{}
	for g, n := range quiet {
		heard := heard[g]
		if heard > 0 && (g.blind || (2*heard >= g.size() && g.isolated != nil)) {
			// The master hears more of the group than it did: its own link healed, at least in part.
			// The ones still silent were silent through the master's isolation, which is not theirs to
			// answer for: they get a fresh deadline from now to resume their sessions.
			m.gnote(g, "healed", 0, "hearing from %d of the group's %d peers again after %v; the %d still silent are judged from now",
				heard, g.size(), m.now.Sub(*g.isolated).Round(time.Millisecond), n)
			g.blind, g.forgiven = false, m.now
			if 2*heard >= g.size() {
				g.isolated = nil
			}
			limit[g] = -1
			continue
		}
		switch {
		case 2*heard >= g.size():
			limit[g] = m.cfg.HeartbeatTimeout
		case heard > 0:
			limit[g] = m.cfg.PartitionTimeout
		default:
			g.blind = true
			limit[g] = -1 // nobody heard: nobody kicked for silence
		}
	}
	for _, p := range silent {
		if m.peers[p.id] != p {
			continue // removed meanwhile by the kick of another
		}
		g := p.group
		silence, since := m.now.Sub(p.lastSeen), ""
		if f := g.forgiven; f.After(p.lastSeen) {
			silence, since = m.now.Sub(f), " since the master's own link healed" // silent through the isolation
		}
		if l := limit[g]; l < 0 || silence <= l {
			m.silence.push(watched{seen: p.lastSeen, p: p}) // waited for; judged again at the next tick
			continue
		}
		if g.isolated != nil && limit[g] == m.cfg.PartitionTimeout {
			m.gnote(g, "partition", 0, "the silent peers are removed after %v; the group goes on with the peers the master hears",
				m.now.Sub(*g.isolated).Round(time.Millisecond))
			g.isolated = nil
		}
		m.counters.Timeouts++
		reason := fmt.Sprintf("no heartbeat for %v%s", silence.Round(time.Millisecond), since)
		m.gnote(g, "timeout", p.id, "%s", reason)
		m.kick(p.id, reason)
	}
}

// hearWindow is how recently the master must have heard a peer for it to count as heard when the
// silence of others is judged: half the heartbeat timeout. Peers that fall silent together (the
// master's link failed) stopped within a heartbeat interval of each other, so when the first of them
// reaches the timeout, none of them counts as heard.
func (m *Machine) hearWindow() time.Duration { return m.cfg.HeartbeatTimeout / 2 }

// suspect notes, once per episode, that the master hears only heard peers of group g.
func (m *Machine) suspect(g *group, heard int) {
	n := g.size() - heard
	if 2*heard >= g.size() || g.isolated != nil {
		return
	}
	now := m.now
	g.isolated = &now
	if heard == 0 {
		m.gnote(g, "isolated", 0, "hearing from none of the group's %d peers: the master's own link is the likelier cause; nobody is kicked for silence until it heals", g.size())
		return
	}
	m.gnote(g, "isolated", 0, "hearing from %d of the group's %d peers: a partition is likelier than %d deaths; the silent ones are kicked after %v",
		heard, g.size(), n, m.cfg.PartitionTimeout)
}

// watch starts watching a new peer's heartbeats.
func (m *Machine) watch(p *peer) { m.silence.push(watched{seen: p.lastSeen, p: p}) }

// watched is a peer in the silence heap, with the last sign of life it had when the entry was made.
type watched struct {
	seen time.Time
	p    *peer
}

// silenceHeap orders peers by their last sign of life, oldest first. It is updated lazily: a message
// only sets the peer's lastSeen (O(1)); an entry whose time has come is checked against lastSeen and
// pushed back with it when the peer was heard from since. Every live peer has exactly one entry; the
// entry of a gone peer is dropped when it reaches the top.
type silenceHeap []watched

func (h silenceHeap) less(i, j int) bool {
	if !h[i].seen.Equal(h[j].seen) {
		return h[i].seen.Before(h[j].seen)
	}
	return h[i].p.id < h[j].p.id
}

// push adds w in O(log n).
func (h *silenceHeap) push(w watched) {
	*h = append(*h, w)
	s := *h
	for i := len(s) - 1; i > 0; {
		parent := (i - 1) / 2
		if !s.less(i, parent) {
			break
		}
		s[i], s[parent] = s[parent], s[i]
		i = parent
	}
}

// pop removes and returns the oldest entry in O(log n). The heap must not be empty.
func (h *silenceHeap) pop() watched {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s[last] = watched{}
	s = s[:last]
	for i := 0; ; {
		small, l, r := i, 2*i+1, 2*i+2
		if l < len(s) && s.less(l, small) {
			small = l
		}
		if r < len(s) && s.less(r, small) {
			small = r
		}
		if small == i {
			break
		}
		s[i], s[small] = s[small], s[i]
		i = small
	}
	*h = s
	return top
}
