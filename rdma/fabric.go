package rdma

import (
	"errors"
	"fmt"
	"time"
)

// NodeID names a node (one process with several NICs) of a fabric. IDs are chosen by whoever builds the
// group; providers only compare them.
type NodeID uint32

// NICID names one NIC of a node: the index of that NIC in the node's [Endpoint.NICs] list.
type NICID uint16

// Health is what a node knows about one of its own NICs (its port state), or what the group concluded
// about any NIC after localizing a failure.
type Health uint8

const (
	// Healthy means the port is up and nothing is known against it.
	Healthy Health = iota
	// Suspect means an operation on the NIC failed or stalled and localization has not finished.
	Suspect
	// Down means the port is down, or probes localized a failure to this NIC.
	Down
)

// String returns "healthy", "suspect" or "down".
func (h Health) String() string {
	switch h {
	case Healthy:
		return "healthy"
	case Suspect:
		return "suspect"
	case Down:
		return "down"
	}
	return fmt.Sprintf("health(%d)", uint8(h))
}

// NIC describes one network interface of a node. The description is static; its health changes and is
// read with [Endpoint.Health] and reported by [PortChanged] events.
type NIC struct {
	// ID is the NIC's index in the node's NIC list.
	ID NICID
	// Name is the provider's name for the NIC (an interface name such as "eth2", or "nic2" in sim).
	Name string
	// Bandwidth is the NIC's line rate in bytes per second, in each direction.
	Bandwidth float64
	// Distance is the NUMA/PCIe distance from the process (or its accelerator) to the NIC: 0 is the
	// nearest, larger is farther, equal values are equally far. Backup chains are ordered by it.
	Distance int
	// NUMANode is the NUMA node the NIC is attached to, or -1 when unknown.
	NUMANode int
}

// Region is memory registered on every NIC of an endpoint at once, so that any NIC, primary or backup,
// can send from it and nothing has to be registered on the recovery path. A Region is created by
// [Endpoint.Register] and stays valid until [Endpoint.Deregister] or Close.
type Region struct {
	// Key identifies the registration within its endpoint (a provider-chosen, non-zero value).
	Key uint64
	// Bytes is the registered memory. The caller keeps owning it; a provider reads it only between a
	// Send that names a slice of it and that chunk's completion.
	Bytes []byte
}

// Class says what a connection is for. Providers keep classes apart so that one class never waits
// behind another: a probe or a control message is never queued behind bulk data.
type Class uint8

const (
	// DataClass connections carry the chunks of collectives.
	DataClass Class = iota
	// ControlClass connections carry small out-of-band control messages (failure notices, failover
	// handshakes, verdicts). They are typically opened on a NIC other than the data path's.
	ControlClass
	// ProbeClass connections carry only zero-byte probes ([Conn.Probe]).
	ProbeClass
)

// String returns "data", "control" or "probe".
func (c Class) String() string {
	switch c {
	case DataClass:
		return "data"
	case ControlClass:
		return "control"
	case ProbeClass:
		return "probe"
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// ConnSpec names a connection between two nodes. Both ends call [Endpoint.Connect] with mirrored
// specs: Local and Remote swapped, the same Class and Index. The provider pairs the two calls by
// (the two nodes, the two NICs, Class, Index), so one NIC pair may carry several connections of a class
// told apart by Index.
type ConnSpec struct {
	// Peer is the node at the other end.
	Peer NodeID
	// Local is this node's NIC; the connection's traffic leaves and enters through it only.
	Local NICID
	// Remote is the peer's NIC.
	Remote NICID
	// Class is what the connection carries.
	Class Class
	// Index tells apart several connections with the same peer, NICs and class (0 for the first).
	Index uint32
}

// String returns "peer P nicL->nicR class#index".
func (s ConnSpec) String() string {
	return fmt.Sprintf("peer %d nic%d->nic%d %v#%d", s.Peer, s.Local, s.Remote, s.Class, s.Index)
}

// Chunk is one numbered unit of data sent on a connection.
type Chunk struct {
	// Tag tells apart the streams that share a connection (for example several channels failed over to
	// one NIC). The provider carries it unchanged.
	Tag uint32
	// Seq numbers the chunk within its stream. The provider carries it unchanged and does not require
	// it to be contiguous or unique; it only echoes it in the chunk's completion.
	Seq uint64
	// Data is the payload. On a DataClass connection it should lie inside a Region registered on the
	// endpoint (a provider backed by real RDMA may reject other memory with ErrNotRegistered). It may be
	// empty. The provider may read Data until the chunk's Completed event or the connection's ConnDown
	// event; the caller must not modify it before then.
	Data []byte
}

// Conn is one connection between a local NIC and a remote NIC. It is full duplex: each end sends its
// own chunks and receives the other end's.
//
// Ordering: the chunks that one end sends arrive at the other end in the order they were sent, each at
// most once, and the sender gets one Completed event per arrived chunk, in the same order. A chunk lost
// to a failure produces neither an Arrived nor a Completed event; every chunk still unacknowledged when
// a connection fails is lost as far as the caller is concerned (it may have arrived: the receiver is
// the authority on that).
//
// A connection that failed stays failed: after its ConnDown event nothing more arrives on it and it
// completes nothing more. To use the NIC pair again, Connect anew (with another Index, or after Close).
//
// Methods are safe for concurrent use and never block (Close included: it only starts the teardown).
type Conn interface {
	// Spec returns the spec the connection was opened with, from this end's point of view.
	Spec() ConnSpec
	// Send posts one chunk. It returns at once; the outcome is a later Completed event, or ConnDown.
	// It returns an error only when the chunk was not posted: ErrClosed after Close or ConnDown, or
	// ErrWrongClass on a ProbeClass connection. Chunks posted before ConnUp are queued.
	Send(c Chunk) error
	// Probe posts a zero-byte probe with a caller-chosen id on a ProbeClass connection. The outcome is a
	// ProbeDone event: Err nil when the remote NIC answered, ErrNICDown at once when the local NIC is
	// down, or another error the provider detected. A probe that is silently lost gets no ProbeDone (or
	// a late one): callers keep their own deadline. It returns ErrWrongClass on other classes and
	// ErrClosed after Close.
	Probe(id uint64) error
	// Close tears the connection down and frees its resources. Pending chunks are dropped without
	// events. It is idempotent.
	Close() error
}

// Event is something a provider reports to the runtime: one of [ConnUp], [ConnDown], [Arrived],
// [Completed], [ProbeDone] or [PortChanged].
type Event interface{ event() }

// ConnUp reports that a connection is established at both ends.
type ConnUp struct{ Conn Conn }

// ConnDown reports that a connection failed: a socket or transport error, the local NIC going down,
// or the peer closing it. It is delivered at most once per connection and not after Close.
type ConnDown struct {
	Conn Conn
	// Err says why. It wraps ErrNICDown when the local NIC's port went down.
	Err error
}

// Arrived delivers one chunk from the other end of a connection.
type Arrived struct {
	Conn Conn
	// Tag and Seq are the sender's Chunk fields.
	Tag uint32
	Seq uint64
	// Data is lent to the handler for the duration of the call only: the provider reuses it afterwards.
	Data []byte
}

// Completed reports that the remote end received a chunk: the whole chunk is in the remote endpoint's
// memory and its Arrived event is queued there, ahead of anything the remote end receives afterwards on
// any connection (the way an RDMA write completes once the data is placed in the responder's memory,
// before the responder's software has looked at it). The chunk's Data belongs to the sender again.
//
// The handler may not have run yet: a sender must not take a completion as proof that the receiver
// acted on the chunk. What the receiver consumed is the receiver's to say (hot repair asks it), and a
// completion only frees the sender's buffer and its window: the chunks not yet completed are those
// still on the wire or in transport buffers, which is what a failure can lose.
type Completed struct {
	Conn Conn
	Tag  uint32
	Seq  uint64
}

// ProbeDone reports the outcome of [Conn.Probe].
type ProbeDone struct {
	Conn Conn
	ID   uint64
	// RTT is the measured round trip (zero when Err is not nil).
	RTT time.Duration
	// Err is nil when the remote NIC answered. It wraps ErrNICDown when the local NIC is down.
	Err error
}

// PortChanged reports a change of a local NIC's port state (a link-state event: the analogue of an
// RDMA port error or port active event). The runtime also learns about remote NICs through its own
// control messages, never through this event.
type PortChanged struct {
	NIC    NICID
	Health Health
}

func (ConnUp) event()      {}
func (ConnDown) event()    {}
func (Arrived) event()     {}
func (Completed) event()   {}
func (ProbeDone) event()   {}
func (PortChanged) event() {}

// Timer is a pending callback of [Endpoint.AfterFunc].
type Timer interface {
	// Stop cancels the callback. It reports whether it did; false means the callback already ran or
	// was already stopped.
	Stop() bool
}

// Endpoint is one node's access to a fabric: its NICs, its registered memory and its connections.
//
// # Event context
//
// A provider delivers events by calling the handler given to Start, and runs the callbacks of AfterFunc
// and Post, one at a time: never two concurrently for one endpoint, in a provider-chosen goroutine (in
// the sim provider: the scheduler's caller; in a socket provider: one event goroutine per endpoint).
// This is the endpoint's event context; a runtime that keeps all its state there needs no locks. The
// handler must not block: everything it may call on the endpoint and its connections returns at once,
// and the events that those calls cause are delivered later, never from inside the call.
//
// # Time
//
// Now and AfterFunc are the endpoint's clock: real time in socket providers, virtual time in sim.
// Runtimes take all their time from here, so the same code runs on both.
//
// Methods are safe for concurrent use. None blocks except Close.
type Endpoint interface {
	// Node returns this endpoint's node id.
	Node() NodeID
	// NICs returns the node's NICs, indexed by NICID. The slice must not be modified.
	NICs() []NIC
	// Health returns the current port state of a local NIC.
	Health(nic NICID) Health
	// Register registers buf on every NIC of the endpoint. The caller keeps owning buf.
	Register(buf []byte) (*Region, error)
	// Deregister undoes Register. Chunks in flight from the region must have completed.
	Deregister(r *Region) error
	// Connect opens the local end of a connection; the peer must call Connect with the mirrored spec.
	// It returns at once; a ConnUp event follows when both ends are connected, or ConnDown if that
	// failed. It returns an error only for an invalid spec (unknown NIC, the endpoint's own node) or
	// after Close.
	Connect(spec ConnSpec) (Conn, error)
	// Start begins delivering events to h. It may be called once; events that happened earlier
	// (connections established before Start) are delivered after it.
	Start(h func(Event)) error
	// Now returns the endpoint's current time.
	Now() time.Time
	// AfterFunc runs f in the event context once d has passed on the endpoint's clock.
	AfterFunc(d time.Duration, f func()) Timer
	// Post runs f in the event context as soon as possible, after the events already queued. It is how
	// another goroutine hands work to the runtime.
	Post(f func())
	// Close closes every connection and stops delivering events. It waits until the last handler call
	// and callback has returned, and is idempotent. It must not be called from the event context.
	Close() error
}

// Errors reported by providers. Callers branch on them with errors.Is.
var (
	// ErrClosed is returned by calls on a closed endpoint or connection, or a failed connection.
	ErrClosed = errors.New("rdma: closed")
	// ErrNICDown reports that the local NIC of an operation is down.
	ErrNICDown = errors.New("rdma: local NIC down")
	// ErrWrongClass reports a Send on a probe connection or a Probe on another class.
	ErrWrongClass = errors.New("rdma: operation not valid for this connection class")
	// ErrNotRegistered reports data outside any registered Region where a provider requires one.
	ErrNotRegistered = errors.New("rdma: memory not registered")
	// ErrInvalid reports an invalid argument, such as an unknown NIC or peer.
	ErrInvalid = errors.New("rdma: invalid argument")
)
