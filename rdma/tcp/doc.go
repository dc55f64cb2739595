// Package tcp is the socket provider of the rdma fabric: every NIC is a network interface with its own
// address, and every connection is one TCP socket bound to that interface at both ends.
//
// # NICs and failures
//
// A NIC is described by a NICConfig (from HostNICs, which reads the interfaces of the current namespace
// and their NUMA node from sysfs, or written by hand). Each NIC listens on its address, and each socket
// is bound to the NIC's address and, with SO_BINDTODEVICE, to its interface, so its traffic never
// leaves through another NIC. A NIC is healthy while its interface is up and has a carrier. The
// endpoint watches link state through a netlink subscription, the analogue of an RDMA port event: when
// a NIC's interface goes down, a PortChanged event is delivered and every data and control connection
// of that NIC fails at once with rdma.ErrNICDown. The far end learns from its socket: a veth taken
// down resets nothing, so sockets set TCP_USER_TIMEOUT (Config.UserTimeout) and keepalives, and fail
// once their data stays unacknowledged that long. Runtimes keep their own, shorter deadlines and tell
// the far end out of band.
//
// # Message flow
//
// A connection is two sockets, its lanes: each carries one end's requests (chunks, probes) and, the
// other way, the other end's answers (acks, probe replies). An ack thus never waits in a socket buffer
// behind chunks its sender sends the other way, as an RDMA completion never waits behind data; on a
// link loaded both ways a single socket would delay acks by a whole send buffer and idle the far end's
// window. Of the two nodes, the one with the smaller id dials both lanes to the peer NIC's listen
// address, one after the other, each with a hello (its node, the target node, both NICs, class, index
// and lane); the acceptor pairs each socket with its own Connect of the mirrored spec (parking it until
// that call comes) and answers helloAck. Both ends report ConnUp once both lanes are paired. Chunk
// frames carry (tag, seq, data); the receiver reads each whole into one of a few buffers of the
// connection, queues it for its handler as an Arrived event and sends an ack at once, which the sender
// reports as Completed: the ack means the chunk is in the receiver's memory, as an RDMA completion
// does, not that the handler ran. When every buffer waits for the handler, the reader stops and TCP
// flow control holds the sender back. Probe connections carry probe and probeReply frames only. Each
// lane has a writer goroutine (on the request lane probes go before queued chunks) and a reader
// goroutine; a frame on the wrong lane fails the connection. Events go through the endpoint's one
// event goroutine. The frame layout is in wire.go.
//
// # Namespaces
//
// Config.NetNS puts an endpoint into a network namespace other than the process's: its sockets are
// created on an OS thread locked into that namespace (and discarded afterwards), and its link watch
// subscribes there. Tests use this to run several nodes of an internal/netlab testbed in one process.
package tcp
