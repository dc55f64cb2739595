package pccl

// HierarchyForTest returns the site ring and the WAN ring c would use for its next AllReduce on the
// ring in force, and whether that AllReduce is hierarchical.
func HierarchyForTest(c *Communicator) (site, wan []uint64, ok bool) {
	ring := c.Ring()
	h, ok := c.links.HierarchyFor(ring)
	return h.Site, h.WAN, ok
}

// SiteFabricForTest describes c's intra-site fabric: whether one is open, its generation (epoch and
// last aborted sequence number), the chunk bytes its endpoint received, and its node's failovers.
func SiteFabricForTest(c *Communicator) (open bool, epoch, gen uint64, received int64, failovers int) {
	t := c.site
	if t == nil {
		return false, 0, 0, 0, 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fab == nil {
		return false, 0, 0, 0, 0
	}
	return true, t.fab.gen.epoch, t.fab.gen.seq, t.fab.ep.ReceivedBytes(), t.fab.stats().Failovers
}
