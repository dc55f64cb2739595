package pccl

// HierarchyForTest returns the site ring and the WAN ring c would use for its next AllReduce on the
// ring in force, and whether that AllReduce is hierarchical.
func HierarchyForTest(c *Communicator) (site, wan []uint64, ok bool) {
	ring := c.Ring()
	h, ok := c.links.hierarchyFor(ring)
	return h.site, h.wan, ok
}
