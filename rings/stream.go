package rings

import "fmt"

// ChunkID names one frame of a ring collective: the step of the ring schedule (reduce-scatter steps are
// 0..W-2, all-gather steps W-1..2W-3, whether the halves run alone or as one AllReduce) and the part
// index within that step's chunk.
type ChunkID struct{ Step, Part uint32 }

// String returns "step S part P".
func (id ChunkID) String() string { return fmt.Sprintf("step %d part %d", id.Step, id.Part) }

// Stream carries one operation's frames to the next peer in the ring and from the previous one.
//
// Send and Recv are called concurrently (one goroutine each); each of them is called sequentially.
// Abort may be called at any time from any goroutine, more than once. The phases of a Plan that share
// a Stream use it one after the other, so the same ChunkID may be sent again by a later phase.
type Stream interface {
	// Send writes one frame to the next peer. payload belongs to the caller. Unless the Stream is a
	// Retainer, Send must have copied or fully transmitted payload before it returns, and must not
	// touch it afterwards: the collectives overwrite regions of their working buffer that earlier
	// steps sent.
	Send(id ChunkID, payload []byte) error
	// Recv reads the next frame from the previous peer into dst. The frame must carry id and exactly
	// len(dst) bytes, else Recv returns an error. dst is not retained after Recv returns.
	Recv(id ChunkID, dst []byte) error
	// Abort makes every pending and later Send and Recv return promptly with an error wrapping err.
	Abort(err error)
}

// Retainer is implemented by a Stream whose Send may keep a reference to payload after it returns,
// until the receiver has acknowledged that frame (so a lost frame can be retransmitted, for example on
// a backup NIC, without a copy).
//
// The collectives of this package, given a Stream that is a Retainer, never modify a region of their
// working buffer (or the caller's send buffer) that was passed to Send as frame id until
// AwaitAcked(id) returned nil, and call AwaitAcked for every frame they sent before they return, on
// success and on failure; after a failure, once every such call has returned, an in-place all-reduce
// puts the caller's original bytes back (see [Plan.Execute]). In return the Stream reads payload only
// until AwaitAcked(id) returns, whatever it returns. A Send that returned an error keeps no reference
// to its payload. Sending an id again (a later phase of a Plan on the same Stream) starts a new frame:
// AwaitAcked then refers to the latest Send of that id.
//
// AwaitAcked is called from the goroutines that call Send and Recv, concurrently with both.
type Retainer interface {
	// AwaitAcked blocks until the frame id, passed to Send earlier, has been acknowledged by the
	// receiver, or returns an error when the stream is aborted. Calling it for an id already
	// acknowledged returns nil at once.
	AwaitAcked(id ChunkID) error
}
