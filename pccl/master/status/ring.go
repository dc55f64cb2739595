package status

import (
	"fmt"
	"math"

	"github.com/concord-ccl/concord/pccl/master"
)

// Ring drawing geometry, in SVG user units.
const (
	ringSize   = 360
	ringRadius = 130.0
	// ringLabelRoom is the extra width on each side for peer ids written beside the nodes: room for
	// the 15 digits of a 48-bit id.
	ringLabelRoom = 100
)

// buildStatusRing places the ring members on a circle, clockwise from the top in ring order, and
// joins each to its successor with an arc of the circle.
func buildStatusRing(ring []master.PeerID, peers []master.PeerInfo) statusRing {
	r := statusRing{Size: ringSize, Width: ringSize + 2*ringLabelRoom, Center: f1(ringSize / 2), Radius: f1(ringRadius),
		ViewBox: fmt.Sprintf("%d 0 %d %d", -ringLabelRoom, ringSize+2*ringLabelRoom, ringSize)}
	n := len(ring)
	if n == 0 {
		return r
	}
	byID := make(map[master.PeerID]master.PeerInfo, len(peers))
	for _, p := range peers {
		byID[p.ID] = p
	}
	// Node radius: at most 18, and small enough that neighbours do not overlap.
	nodeR := math.Min(18, 0.8*math.Pi*ringRadius/float64(n))
	font := math.Max(7, math.Min(12, nodeR))
	c := float64(ringSize) / 2
	angle := func(i int) float64 { return -math.Pi/2 + 2*math.Pi*float64(i)/float64(n) }
	for i, id := range ring {
		a := angle(i)
		x, y := c+ringRadius*math.Cos(a), c+ringRadius*math.Sin(a)
		lr := ringRadius + nodeR + font
		lx, ly := c+lr*math.Cos(a), c+lr*math.Sin(a)+font/3
		anchor := "middle"
		if math.Cos(a) > 0.3 {
			anchor = "start"
		} else if math.Cos(a) < -0.3 {
			anchor = "end"
		}
		p, ok := byID[id]
		title := fmt.Sprintf("rank %d: peer %d", i, id)
		if ok {
			title += fmt.Sprintf(" at %s, site %s, %s", p.Addr, siteLabel(p.Site), p.State)
		} else {
			title += " (not in the peer list)"
		}
		r.Nodes = append(r.Nodes, statusRingNode{
			ID: id, X: f1(x), Y: f1(y), R: f1(nodeR), LX: f1(lx), LY: f1(ly), Color: siteColor(p.Site),
			Title: title, FontSize: f1(font), NotInPeers: !ok, Rank: i, LabelAnchor: anchor,
		})
	}
	if n < 2 {
		return r
	}
	// Each arc leaves its node's circle and stops short of the next one, where the arrowhead sits.
	gap := (nodeR + 3) / ringRadius
	for i := range n {
		a0, a1 := angle(i)+gap, angle(i+1)-gap
		x0, y0 := c+ringRadius*math.Cos(a0), c+ringRadius*math.Sin(a0)
		x1, y1 := c+ringRadius*math.Cos(a1), c+ringRadius*math.Sin(a1)
		r.Arcs = append(r.Arcs, fmt.Sprintf("M %s %s A %s %s 0 0 1 %s %s",
			f1(x0), f1(y0), f1(ringRadius), f1(ringRadius), f1(x1), f1(y1)))
	}
	return r
}
