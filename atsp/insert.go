package atsp

// InsertCheapest returns a new tour with node inserted between the two
// consecutive nodes of t where it makes the resulting tour best under obj,
// so that a joining peer does not reshuffle the ring. t may hold any subset
// of the nodes of cost; it is not modified. The result is rotated so that
// its smallest node comes first. If node is already in t, a normalised copy
// of t is returned. Ties go to the earliest position in t.
func InsertCheapest(cost [][]float64, t Tour, node int, obj Objective) Tour {
	out := make(Tour, 0, len(t)+1)
	for _, v := range t {
		if v == node {
			out = append(out, t...)
			return normalise(out)
		}
	}
	if len(t) == 0 {
		return append(out, node)
	}
	// The bottleneck of t without one edge is its largest edge unless that
	// edge is the only one at the maximum.
	k := len(t)
	edge := func(i int) float64 { return cost[t[i]][t[(i+1)%k]] }
	top, second, topCount := 0.0, 0.0, 0
	total := 0.0
	if k > 1 {
		for i := 0; i < k; i++ {
			c := edge(i)
			total += c
			switch {
			case topCount == 0 || c > top:
				second, top, topCount = top, c, 1
			case c == top:
				topCount++
			case c > second:
				second = c
			}
		}
		if topCount > 1 {
			second = top
		}
	}
	bestAt := -1
	var best Score
	for i := 0; i < k; i++ {
		u, v := t[i], t[(i+1)%k]
		var s Score
		if k == 1 {
			s = Score{Bottleneck: max(cost[u][node], cost[node][u]), Total: cost[u][node] + cost[node][u]}
		} else {
			c := edge(i)
			rest := top
			if c == top && topCount == 1 {
				rest = second
			}
			s.Bottleneck = max(rest, cost[u][node], cost[node][v])
			s.Total = total - c + cost[u][node] + cost[node][v]
		}
		if bestAt < 0 || s.Better(best, obj) {
			bestAt, best = i, s
		}
	}
	out = append(out, t[:bestAt+1]...)
	out = append(out, node)
	out = append(out, t[bestAt+1:]...)
	return normalise(out)
}

// Remove returns a new tour with node spliced out of t, keeping the cyclic
// order of the others and rotating the result so that its smallest node
// comes first. t is not modified; if node is not in t a normalised copy is
// returned.
func Remove(t Tour, node int) Tour {
	out := make(Tour, 0, len(t))
	for _, v := range t {
		if v != node {
			out = append(out, v)
		}
	}
	return normalise(out)
}
