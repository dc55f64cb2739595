package plan

import (
	"slices"
)

// Rerank applies bridge-based logical re-ranking (Algorithm 1 of the R²CCL paper, Appendix D) to a
// ring of nodes. rails[v] is node v's set of healthy rails. Let B be the smallest rail count of any
// ring member. Every adjacent pair (u, v) whose rail overlap |S_u ∩ S_v| is below B is a candidate;
// candidates are handled from the largest gap down (ties in ring order). For each, the first node w
// (in the current ring order, neither u nor v) whose overlaps with u and with v are both at least B,
// and whose removal leaves its own neighbours x, y with |S_x ∩ S_y| at least B, is moved between u
// and v. Only the problematic edges change; the rest of the ring, and so most connections, stay.
// The input is not modified; the result is deterministic.
func Rerank(ring []int, rails [][]int) []int {
	out := slices.Clone(ring)
	n := len(out)
	if n < 4 {
		return out
	}
	b := -1
	for _, v := range ring {
		if b < 0 || len(rails[v]) < b {
			b = len(rails[v])
		}
	}
	type cand struct{ u, v, gap int }
	var cands []cand
	for i, u := range ring {
		v := ring[(i+1)%n]
		if o := overlap(rails[u], rails[v]); o < b {
			cands = append(cands, cand{u, v, b - o})
		}
	}
	slices.SortStableFunc(cands, func(x, y cand) int { return y.gap - x.gap })
	for _, c := range cands {
		iu := slices.Index(out, c.u)
		if out[(iu+1)%n] != c.v {
			continue // an earlier bridge already separated them
		}
		for iw, w := range out {
			if w == c.u || w == c.v {
				continue
			}
			x, y := out[(iw+n-1)%n], out[(iw+1)%n]
			newCap := min(overlap(rails[c.u], rails[w]), overlap(rails[w], rails[c.v]))
			if newCap >= b && overlap(rails[x], rails[y]) >= b {
				out = slices.Delete(out, iw, iw+1)
				iu = slices.Index(out, c.u)
				out = slices.Insert(out, iu+1, w)
				break
			}
		}
	}
	return out
}

// overlap returns |a ∩ b| for two sorted sets.
func overlap(a, b []int) int {
	k := 0
	for i, j := 0, 0; i < len(a) && j < len(b); {
		switch {
		case a[i] == b[j]:
			k++
			i++
			j++
		case a[i] < b[j]:
			i++
		default:
			j++
		}
	}
	return k
}

// railSets returns every node's healthy rail set.
func (t Topology) railSets() [][]int {
	s := make([][]int, len(t.Nodes))
	for i := range s {
		s[i] = t.Rails(i)
	}
	return s
}
