package rdma

import (
	"fmt"
	"math"
)

// Config tunes a Node. The zero value works.
type Config struct {
	// ChunkBytes is the size of one numbered chunk on a channel (the unit of acknowledgement and of
	// retransmission after a failover). Zero means 256 KiB.
	ChunkBytes int
	// Window is how many chunks of one path may be in flight unacknowledged. It bounds what a failover
	// resends: at most Window chunks per affected path. Zero means 2.
	//
	// Providers complete a chunk when it reaches the receiver's memory, before the receiver's handler
	// reduces it (see [Completed]), so the unacknowledged chunks are those on the wire and in transport
	// buffers: what a failure can lose, and what any lossless transport must send again. A path keeps
	// its NIC busy only if Window × ChunkBytes covers the NIC's rate times the time from a chunk leaving
	// to the next being posted: the round trip plus the sender's delay in handling the completion.
	// Raising ChunkBytes rather than Window keeps the bound at Window chunks; raising Window keeps the
	// chunk small (a shorter pipeline fill) and resends more chunks, though no more bytes than are in
	// flight.
	Window int
	// Direct makes collectives work in the caller's result buffer instead of the node's scratch
	// buffer, as NCCL does: the input is not copied into a working buffer, nor the result out of one,
	// which saves two passes over the message per call. The price is the failure guarantee. recv is
	// written during the call, and after an error it holds undefined bytes (send is never written
	// when it is a different slice; send and recv must then not overlap). After an error, or after a
	// call in which a path failed over, a connection the call left behind may still read recv for a
	// while; the receiver drops what it sends. Off by default: recv is written only on success. A
	// caller that stages its buffers itself (pccl's hierarchical plans) loses nothing by turning it
	// on. Planned AllReduces that gather inputs need room beyond the message, so they keep the
	// scratch buffer and its copies.
	Direct bool
	// Repair tunes failure detection and hot repair.
	Repair RepairConfig
	// ChannelWeights, one per NIC in NIC order, sets each channel's share of the plain collectives
	// (AllReduce, ReduceScatter, AllGather, Broadcast, Send/Recv), in proportion to the weights. Every
	// node of the ring must pass the same weights, since each cuts the message alone. Nil splits
	// evenly, which every node does alike whatever its NICs declare: a NIC that came up at a lower
	// speed on one node does not make the nodes cut differently. Give the NICs' bandwidths here when
	// a node's NICs differ by design and every node's do alike. Planned AllReduces start from the
	// same weights, and plans with leaves or weighted rings level them on the plan's topology.
	ChannelWeights []float64
}

// Validate names the first invalid field.
func (c Config) Validate() error {
	if c.ChunkBytes < 0 {
		return fmt.Errorf("%w: Config.ChunkBytes is %d, must be >= 0", ErrInvalid, c.ChunkBytes)
	}
	if c.Window < 0 {
		return fmt.Errorf("%w: Config.Window is %d, must be >= 0", ErrInvalid, c.Window)
	}
	total := 0.0
	for i, w := range c.ChannelWeights {
		if !(w >= 0) || math.IsInf(w, 1) {
			return fmt.Errorf("%w: Config.ChannelWeights[%d] is %v, must be finite and >= 0", ErrInvalid, i, w)
		}
		total += w
	}
	if c.ChannelWeights != nil && !(total > 0 && !math.IsInf(total, 1)) {
		return fmt.Errorf("%w: Config.ChannelWeights %v must have a positive, finite sum", ErrInvalid, c.ChannelWeights)
	}
	return c.Repair.Validate()
}

func (c Config) withDefaults() Config {
	if c.ChunkBytes == 0 {
		c.ChunkBytes = 256 << 10
	}
	if c.Window == 0 {
		c.Window = 2
	}
	return c
}
