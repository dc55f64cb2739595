package pccl

import "context"

// UpdateTopology is the membership step of a training loop. Every accepted peer calls it; together
// they admit the registered newcomers and re-wire the ring after failures. It returns once the new ring
// is in force (Rank and WorldSize may have changed). It needs no collective of this peer in flight
// (else ErrBusy). If ctx ends first, the vote stays cast and the next call waits for its answer.
func (c *Communicator) UpdateTopology(ctx context.Context) error {
	call, ch := c.newCall()
	_, err := c.ask(ctx, "update topology", call, ch, topologyCall{call: call, rewire: c.links.Dirty()})
	return cleanError(err)
}

// Rewire is UpdateTopology without admission: it re-wires the ring of the accepted peers (without the
// peers that left) and keeps peers waiting in Connect waiting, as PCCL's repair after a failed
// collective does. Every accepted peer must call Rewire or UpdateTopology; a round in which any peer
// called Rewire admits nobody, so newcomers join only at an UpdateTopology of every peer. It needs no
// collective of this peer in flight (else ErrBusy).
func (c *Communicator) Rewire(ctx context.Context) error {
	call, ch := c.newCall()
	_, err := c.ask(ctx, "rewire", call, ch, topologyCall{call: call, rewire: c.links.Dirty(), noAdmit: true})
	return cleanError(err)
}

// ArePeersPending asks whether peers wait to be accepted. Every accepted peer must call it; all get
// the same answer. It may overlap running collectives.
func (c *Communicator) ArePeersPending(ctx context.Context) (bool, error) {
	call, ch := c.newCall()
	r, err := c.ask(ctx, "are peers pending", call, ch, pendingCall{call: call})
	return r.answer, cleanError(err)
}

// Leave leaves the group gracefully at its safe point, in place of this peer's ArePeersPending: the
// master answers every other peer's ArePeersPending true and removes this one, so the others re-wire
// at their UpdateTopology without aborting a collective (a departure at a spot instance's
// preemption notice, say). Every other accepted peer must be in ArePeersPending too, as in a training
// loop's membership step; if a collective of the group is under way instead, the peer leaves at once,
// as Close would make it. Leave then closes the Communicator; it returns ctx's error if the master did
// not answer in time (the Communicator is closed all the same).
func (c *Communicator) Leave(ctx context.Context) error {
	call, ch := c.newCall()
	_, err := c.ask(ctx, "leave", call, ch, pendingCall{call: call, leave: true})
	c.Close()
	return cleanError(err)
}
