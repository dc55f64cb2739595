// Package links is a peer's data plane: the connections that carry collectives' frames between ring
// neighbours, and the streams (rings.Stream) that collectives send and receive on.
//
// A Links value belongs to one peer (pccl.Communicator). It owns:
//
//   - the pool to the ring successor: Config.PoolSize connections, each with a writer goroutine that
//     writes the frames queued to it whole and in order (outconn.go); a collective's frames are
//     striped over the pool, each to the connection expected to deliver it first (stripe.go);
//   - the pools from predecessors, each connection with a reader goroutine that routes frames to the
//     inbox of the collective they belong to, by tag and sequence number (reader.go, inbox.go);
//   - the sub-ring pools of the hierarchical AllReduce: to the successor in this peer's site ring and
//     to its partners in the next site (subring.go), derived from the master's Connect by the pure
//     maths of hierarchy.go;
//   - progress deadlines: a frame that makes no progress for its deadline gives its link up
//     (deadline.go, stream.go).
//
// Messages. A link opens with the data kind's handshake (wire.Exchange), a LinkHello from the dialler
// (run token, both ids, pool index) and a LinkAck from the listener; then only data frames
// (wire.DataHeader and payload) flow, one way. The listener also takes the other kinds a peer serves
// (state transfers, bandwidth tests, rendezvous calls) and hands them to Config.Serve.
//
// Goroutines. Wire runs on the owner's wiring goroutine; Stream, SubStream, Release and a stream's Send
// and Recv on the goroutine of the collective's caller; the acceptor, one reader per incoming
// connection and one writer per outgoing one are the package's own, and Close waits for all of them.
// Aborting one collective never closes a connection: frames are written whole, and readers drop the
// frames of operations that are over, so other tags keep their links. A connection is closed only when
// it fails or stays silent past its progress deadline, and the owner is then asked (Dirty) to have the
// ring wired again.
//
// The package dials only through Config.Dial, the owner's way to reach a peer (directly, or by
// rendezvous behind NAT), and holds no reference to its owner.
package links
