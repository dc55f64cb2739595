package links

import (
	"math"

	"github.com/concord-ccl/concord/rings"
)

// pick returns the connection that frame id of n bytes goes on, and queues its bytes there at once,
// so that concurrent collectives see each other's load. With an even split it is (seq+part) mod K.
// Otherwise it is the connection expected to have written the frame first: its pending bytes plus n,
// at its measured cost per byte (a connection not measured yet is taken to cost what the measured
// ones cost on average). Before anything is measured that is the connection with the fewest bytes
// pending, ties going to the connections in turn from (seq+part) mod K. A frame id sent again (a
// later phase of a plan) takes the connection of its previous send, so that the receiver, which
// matches frames by id, gets the two in order.
func (s *Stream) pick(id rings.ChunkID, n int) *outConn {
	k := len(s.outs)
	first := int((s.key.seq + uint64(id.Part)) % uint64(k))
	oc := s.outs[first]
	s.fmu.Lock()
	prev := s.frames[id]
	s.fmu.Unlock()
	if prev != nil {
		oc = prev.oc
	} else if !s.l.cfg.EvenStriping && k > 1 {
		oc = s.outs[s.l.quickest(s.outs, first, n)]
	}
	s.l.loadMu.Lock()
	oc.pending += float64(n)
	s.l.loadMu.Unlock()
	return oc
}

// quickest returns the index in outs of the connection expected to write n more bytes first,
// looking from first on.
func (l *Links) quickest(outs []*outConn, first, n int) int {
	l.loadMu.Lock()
	defer l.loadMu.Unlock()
	var sum float64
	var measured int
	for _, oc := range outs {
		if oc.cost > 0 {
			sum += oc.cost
			measured++
		}
	}
	mean := 1.0
	if measured > 0 {
		mean = sum / float64(measured)
	}
	k := len(outs)
	best, bestETA := first, math.Inf(1)
	for j := range k {
		i := (first + j) % k
		oc := outs[i]
		c := mean
		if oc.cost > 0 {
			c = oc.cost
		}
		if eta := (oc.pending + float64(n)) * c; eta < bestETA {
			best, bestETA = i, eta
		}
	}
	return best
}
