package master

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// tick kicks every peer that has been silent for longer than the heartbeat timeout. Any message counts
// as a sign of life, not only heartbeats.
//
// It looks only at the peers whose last sign of life is old enough, through the heap of last-seen
// times: a tick costs O(k log n) for the k peers it examines, not a scan of all n peers. The silent
// peers are kicked in the order of their ids.
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
	for _, p := range silent {
		if m.peers[p.id] != p {
			continue // removed meanwhile by the kick of another
		}
		m.counters.Timeouts++
		reason := fmt.Sprintf("no heartbeat for %v", m.now.Sub(p.lastSeen).Round(time.Millisecond))
		m.gnote(p.group, "timeout", p.id, "%s", reason)
		m.kick(p.id, reason)
	}
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
