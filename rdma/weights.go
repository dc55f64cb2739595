package rdma

import (
	"math"
	"slices"
)

// Channel weights. A ring part splits over the channels as the standard ring does (evenly, or by
// Config.ChannelWeights), except in a plan with leaves (OptCC) or weighted rings. In OptCC's, a leaf
// has only the rails of its healthy NICs, so all its traffic with the owners lands on those rails of
// the core nodes, on top of the rings, and a split by the channel weights alone leaves those rails the
// last to finish while the others idle. Every ring part's weights are levelled instead, on the seconds
// each NIC of each node sends and receives over the whole plan (railLoads), so that the busiest NIC
// carries as little as it can, as the cost model (which pools a node's NICs) assumes. Every node
// computes the same weights from the same plan.

// partWeights returns every part's channel weights.
func (x *planExecutor) partWeights() [][]float64 {
	for _, pt := range x.p.Parts {
		if len(pt.Leaves) > 0 || x.weighted() {
			w, _ := x.levelled()
			return w
		}
	}
	w := make([][]float64, len(x.p.Parts))
	for k := range w {
		w[k] = x.n.weights()
	}
	return w
}

// levelled returns the levelled channel weights of every ring part and the seconds of the busiest
// NIC direction with them.
func (x *planExecutor) levelled() ([][]float64, float64) {
	w := make([][]float64, len(x.p.Parts))
	for k := range w {
		w[k] = x.n.weights()
	}
	var best [][]float64
	bestLoad := math.Inf(1)
	for round := 0; ; round++ { // multiplicative steps towards equal costs; the best seen is kept
		load := x.railLoads(w)
		if m := busiest(load); m < bestLoad {
			best, bestLoad = cloneWeights(w), m
		}
		if round == weightRounds {
			return best, bestLoad
		}
		for k, pt := range x.p.Parts {
			if len(pt.Ring) < 2 {
				continue
			}
			// A channel's cost is the busiest NIC its ring paths use; channels costlier than
			// the weighted mean shrink, cheaper ones grow.
			cost := x.channelCosts(k, load)
			var mean, total float64
			for c, v := range w[k] {
				mean += v * cost[c]
				total += v
			}
			mean /= total
			for c := range w[k] {
				if w[k][c] > 0 && cost[c] > 0 {
					w[k][c] *= math.Sqrt(mean / cost[c])
				}
			}
		}
	}
}

// weightRounds bounds the levelling of channel weights.
const weightRounds = 40

func cloneWeights(w [][]float64) [][]float64 {
	out := make([][]float64, len(w))
	for i := range w {
		out[i] = slices.Clone(w[i])
	}
	return out
}

// railLoads returns, per node, NIC and direction (0 out, 1 in), the seconds of traffic the plan's
// rings and leaf exchanges put there with channel weights w.
func (x *planExecutor) railLoads(w [][]float64) [][][2]float64 {
	load := make([][][2]float64, len(x.topo.Nodes))
	for u := range load {
		load[u] = make([][2]float64, len(x.topo.Nodes[u].NICs))
	}
	add := func(u int, nic NICID, dir int, bytes float64) {
		if bw := x.topo.Nodes[u].NICs[nic].Bandwidth(); bw > 0 {
			load[u][nic][dir] += bytes / bw
		}
	}
	for k, pt := range x.p.Parts {
		world := len(pt.Ring)
		if world < 2 {
			continue
		}
		var total float64
		for _, v := range w[k] {
			total += v
		}
		own := x.ownerShares(pt)
		for c, v := range w[k] {
			ch := float64(pt.Bytes) * v / total
			for _, pc := range x.partPieces()[k][c] {
				b := ch * (pc.hi - pc.lo)
				for i, u := range pt.Ring {
					v := pt.Ring[(i+1)%world]
					nic := x.pathNIC(pc, c, u, v)
					ring := b * (2 - own[i] - own[(i+1)%world]) // every block but u's and v's
					add(u, nic, 0, ring)
					add(v, nic, 1, ring)
				}
				block := b / float64(world)
				for _, leaf := range pt.Leaves {
					for _, owner := range pt.Ring {
						nic := x.pathNIC(pc, c, leaf, owner)
						add(leaf, nic, 0, block)
						add(owner, nic, 1, block)
						add(owner, nic, 0, block)
						add(leaf, nic, 1, block)
					}
				}
			}
		}
	}
	return load
}

// busiest returns the seconds of the busiest NIC direction of load (railLoads).
func busiest(load [][][2]float64) float64 {
	m := 0.0
	for _, node := range load {
		for _, d := range node {
			m = max(m, d[0], d[1])
		}
	}
	return m
}

// channelCosts returns, for each channel of part k, the busiest NIC direction (by load) that one of
// its ring paths uses at any node. The leaves' paths do not count: the leaves send and receive the
// same bytes on the same NICs whatever the weights, as their traffic follows their own routes.
func (x *planExecutor) channelCosts(k int, load [][][2]float64) []float64 {
	pt := x.p.Parts[k]
	world := len(pt.Ring)
	cost := make([]float64, len(x.n.weights()))
	use := func(c, u int, nic NICID) {
		cost[c] = max(cost[c], load[u][nic][0], load[u][nic][1])
	}
	for c := range cost {
		for _, pc := range x.partPieces()[k][c] {
			for i, u := range pt.Ring {
				v := pt.Ring[(i+1)%world]
				nic := x.pathNIC(pc, c, u, v)
				use(c, u, nic)
				use(c, v, nic)
			}
		}
	}
	return cost
}
