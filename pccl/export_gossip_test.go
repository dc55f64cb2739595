package pccl

// PauseGossipForTest makes the peer's gossip member deaf and mute (on) or normal again, as if the
// process hung; it does nothing without gossip.
func (c *Communicator) PauseGossipForTest(on bool) {
	if c.gossip != nil {
		c.gossip.Pause(on)
	}
}
