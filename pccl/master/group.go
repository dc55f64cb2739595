package master

import (
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/sharedstate"
)

// GroupID names a peer group. A peer gives it in its Hello; 0 is the default group.
type GroupID = uint32

// group is one peer group: the peers that share a ring, an epoch space, collectives and shared-state
// syncs. Each group runs one major operation (wiring, OptimizeTopology, sync) at a time, independently
// of the others; collectives run per tag. A group exists from the first Hello that names it, and is
// kept when its last peer leaves, so that its epoch counter never restarts and its last accepted
// shared state is remembered for peers that come back.
type group struct {
	id GroupID

	ring      []PeerID // ring in force, all accepted peers of the group in ring order
	epoch     uint64   // epoch of the ring in force or being wired; see epochOf
	counter   uint32   // epochs handed out by this group in this incarnation
	ringDirty bool     // a ring member left since the ring was wired
	wiring    *round   // the wiring round in progress, or nil

	acc []PeerID // accepted peers, sorted by id
	reg []PeerID // registered peers, sorted by id

	// Votes cast in the current round of each group-wide vote, so that a vote costs O(1) to count
	// instead of a scan of the group.
	topoVotes    int // accepted peers with voteTopo set
	pendingVotes int // accepted peers with votePending set
	syncVotes    int // accepted peers with a voteSync

	seq uint64         // last collective sequence number handed out; starts at incarnation<<32 (see group)
	ops map[uint64]*op // collectives by tag

	sync  *syncRound         // the shared-state sync in progress, or nil
	prior *sharedstate.Prior // the last accepted shared state; kept when every peer leaves
	// reported is a later shared state than prior that a peer of an earlier incarnation reported after
	// this incarnation had wired the group (lateReport); the next election starts from it.
	reported *sharedstate.Prior

	opt      *optRound     // OptimizeTopology in progress, or nil
	proposal []PeerID      // better ring found in the background, applied at the next OptimizeTopology
	forced   []PeerID      // ring installed by the next OptimizeTopology (ForceRing)
	reorder  *reorderState // a re-ordering around a slow link on its way (reorder.go), or nil

	diag *groupDiag // delay matrix, syndromes and slow-link penalties (diagnosis.go); nil until used

	// isolated is when the master began to hear from fewer than half of the group's peers (it
	// suspects a partition on its side, heartbeat.go), nil while it hears from half or more.
	isolated *time.Time
	// blind says that the master heard none of the group at its last judgement; forgiven is when it
	// last heard more of the group than before (an isolation healing): silence before it does not
	// count against the peers.
	blind    bool
	forgiven time.Time
}

// size is the number of live peers of the group, accepted and registered.
func (g *group) size() int { return len(g.acc) + len(g.reg) }

// group returns the group id, creating it if it does not exist yet.
func (m *Machine) group(id GroupID) *group {
	if g := m.groups[id]; g != nil {
		return g
	}
	// Sequence numbers, like epochs, carry the incarnation in their high 32 bits: peers drop the
	// frames of sequence numbers they have finished, so a restarted master must not hand them out again.
	g := &group{id: id, ops: map[uint64]*op{}, seq: m.cfg.Incarnation << 32}
	m.groups[id] = g
	i, _ := slices.BinarySearch(m.gids, id)
	m.gids = slices.Insert(m.gids, i, id)
	return g
}

// epochOf returns the n-th epoch of a master incarnation: the incarnation in the high 32 bits and n in
// the low 32 bits. Epochs of two incarnations never collide, so a peer that still holds an epoch of a
// master that restarted never mistakes it for one of the new master's. Incarnation 0 (tests, or a
// master that never restarts) yields the plain counter.
func epochOf(incarnation uint64, n uint32) uint64 { return incarnation<<32 | uint64(n) }

// bump hands out the group's next epoch.
func (m *Machine) bump(g *group) uint64 {
	g.counter++
	g.epoch = epochOf(m.cfg.Incarnation, g.counter)
	return g.epoch
}

// accepted returns the ids of g's accepted peers, sorted. The slice is g's own: callers read it and
// must not keep it across a change of membership.
func (m *Machine) accepted(g *group) []PeerID { return g.acc }

// registered returns the ids of g's registered peers, sorted, under the same rule as accepted.
func (m *Machine) registered(g *group) []PeerID { return g.reg }

// insertSorted returns ids with id inserted in order.
func insertSorted(ids []PeerID, id PeerID) []PeerID {
	i, _ := slices.BinarySearch(ids, id)
	return slices.Insert(ids, i, id)
}

// deleteSorted returns ids without id.
func deleteSorted(ids []PeerID, id PeerID) []PeerID {
	if i, ok := slices.BinarySearch(ids, id); ok {
		return slices.Delete(ids, i, i+1)
	}
	return ids
}

// admit moves g's registered peers that a wiring round accepted into g.acc.
func (g *group) admit(ids []PeerID) {
	if len(ids) == 0 {
		return
	}
	in := make(map[PeerID]bool, len(ids))
	for _, id := range ids {
		in[id] = true
	}
	g.reg = slices.DeleteFunc(g.reg, func(id PeerID) bool { return in[id] })
	g.acc = append(g.acc, ids...)
	slices.Sort(g.acc)
}

func (g *group) tags() []uint64 {
	tags := make([]uint64, 0, len(g.ops))
	for t := range g.ops {
		tags = append(tags, t)
	}
	slices.Sort(tags)
	return tags
}

// runSize counts the accepted peers of the whole run, for the Topology messages that carry it: every
// peer learns of another group's change at its own group's next Topology message.
func (m *Machine) runSize() wire.RunSize {
	var s wire.RunSize
	for _, id := range m.gids {
		n := uint32(len(m.groups[id].acc))
		if n == 0 {
			continue
		}
		s.Peers += n
		s.Groups++
		s.Largest = max(s.Largest, n)
	}
	return s
}
