package sim

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/stress/invariant"
)

// TestPartitionKickJudgedOnGroupAtKick scripts the master's events after a cut and checks which kicks
// of a cut-off peer the partition check calls violations: each is judged on the group as it was at
// that kick, by the soak's account of who is on which side.
func TestPartitionKickJudgedOnGroupAtKick(t *testing.T) {
	cut := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return cut.Add(time.Duration(ms) * time.Millisecond) }
	timeout := func(id, ms int) master.Event {
		return master.Event{Kind: "timeout", Peer: master.PeerID(id), Time: at(ms), Detail: "no heartbeat"}
	}
	kicked := func(id, ms int) master.Event {
		return master.Event{Kind: "kicked", Peer: master.PeerID(id), Time: at(ms)}
	}
	// The group at the cut: 1 and 2 heard, 3 killed before the cut, 4 and 5 cut off. The master hears
	// 2 of 5, and must wait PartitionTimeout before it kicks 4 or 5.
	group := func() map[uint64]*member {
		return map[uint64]*member{1: {side: heardSide}, 2: {side: heardSide}, 3: {side: silentSide}, 4: {side: farSide}, 5: {side: farSide}}
	}
	cases := []struct {
		name   string
		events []master.Event
		lost   bool // an event was dropped after the cut
		want   []string
	}{
		{name: "far peer kicked after HeartbeatTimeout",
			events: []master.Event{timeout(4, 1400), kicked(4, 1400)}, want: []string{"4"}},
		{name: "dead peer kicked in the same tick",
			// Judged on the group before the tick's kicks: 2 of 5 heard.
			events: []master.Event{timeout(3, 1400), kicked(3, 1400), timeout(4, 1400), kicked(4, 1400)}, want: []string{"4"}},
		{name: "dead peer removed before",
			// The master removed 3 at 300 ms: it hears 2 of 4, half, and kicks after HeartbeatTimeout.
			events: []master.Event{timeout(3, 300), kicked(3, 300), timeout(4, 1400), kicked(4, 1400), timeout(5, 1400)}},
		{name: "far peer left",
			events: []master.Event{{Kind: "left", Peer: 5, Time: at(200)}, timeout(4, 1400)}},
		{name: "newcomer joined",
			// A peer that joined reached the master: 3 of 6.
			events: []master.Event{{Kind: "joined", Peer: 9, Time: at(900)}, timeout(4, 1400)}},
		{name: "kick within the far side's hear window",
			// A cut-off peer heard just before the cut still counts as heard this soon after it, for
			// hearWindow (750 ms) after its last message reached the master (up to 175 ms late).
			events: []master.Event{timeout(4, 700), timeout(5, 950)}},
		{name: "kick after PartitionTimeout",
			events: []master.Event{timeout(4, 7000), timeout(5, 7500)}},
		{name: "near peer kicked",
			events: []master.Event{timeout(1, 1400)}},
		{name: "event lost", lost: true,
			events: []master.Event{timeout(4, 1400)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &soak{mcfg: master.LAN(), check: invariant.New(0, 2), lostEvents: new(atomic.Int64)}
			s.mcfg.PartitionTimeout = 5 * s.mcfg.HeartbeatTimeout
			s.part = &partition{kind: "test", holdKicks: true, members: group(), cutAt: cut, farDelay: 175 * time.Millisecond}
			if c.lost {
				s.lostEvents.Add(1)
			}
			for _, e := range c.events {
				s.masterEvent(e)
			}
			var got []string
			for _, v := range s.check.Violations() {
				if v.Kind != invariant.PartitionKick {
					t.Fatalf("violation of kind %q, want %q: %v", v.Kind, invariant.PartitionKick, v)
				}
				got = append(got, v.Peer)
			}
			if len(got) != len(c.want) || (len(got) > 0 && got[0] != c.want[0]) {
				t.Fatalf("violations for peers %v, want %v: %v", got, c.want, s.check.Violations())
			}
		})
	}
}
