package master

import (
	"fmt"
	"slices"
	"time"
)

// tick kicks every peer that has been silent for longer than the heartbeat timeout. Any message counts
// as a sign of life, not only heartbeats.
func (m *Machine) tick() {
	for _, id := range slices.Clone(m.ids) {
		p := m.peers[id]
		if p == nil {
			continue
		}
		if silent := m.now.Sub(p.lastSeen); silent > m.cfg.HeartbeatTimeout {
			m.counters.Timeouts++
			reason := fmt.Sprintf("no heartbeat for %v", silent.Round(time.Millisecond))
			m.gnote(p.group, "timeout", id, "%s", reason)
			m.kick(id, reason)
		}
	}
}
