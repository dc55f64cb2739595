package master

import "time"

// Stalled tells the machine that the master itself did not run for Gap: its event loop or its clock
// ran late (a GC pause, a SIGSTOP, a VM migration, a starved CPU). The server sends it, instead of a
// Tick, when the time between two ticks exceeds the tick interval by more than the interval, after it
// has fed the machine every message its readers had already received.
//
// The peers' silence during a stall is the master's fault, not theirs: every heartbeat deadline is
// pushed back by Gap (no further than now), so a peer is judged on the silence it showed while the
// master was running. No one is kicked by a Stalled input; the next Tick judges.
type Stalled struct {
	Gap time.Duration
}

func (Stalled) isInput() {}

// stallThreshold is the lateness of a tick beyond which the server tells the machine it stalled.
// Shorter delays are the ordinary jitter of a busy machine and cost no peer anything, since the
// heartbeat timeout spans several ticks.
func stallThreshold(tick time.Duration) time.Duration { return tick }

// stalled extends every peer's heartbeat deadline by the stall, so that no peer is blamed for the
// master's own pause.
func (m *Machine) stalled(gap time.Duration) {
	if gap <= 0 {
		return
	}
	m.note("stall", 0, "master did not run for %v; heartbeat deadlines extended by as much", gap.Round(time.Millisecond))
	for _, id := range m.ids {
		p := m.peers[id]
		if p == nil {
			continue
		}
		seen := p.lastSeen.Add(gap)
		if seen.After(m.now) {
			seen = m.now
		}
		p.lastSeen = seen
	}
}
