package pccl

import (
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// input is an input of the peer machine (the list is in machine's doc). The marker method seals the
// set: only the types of this package are inputs.
type input interface{ isInput() }

// connID names a connection the runtime holds for the machine: the machine's inputs and actions carry
// it where they would carry the connection, and the runtime keeps the table from id to connection.
type connID uint64

// Inputs from the runtime and its I/O goroutines.
type (
	// tickIn lets time pass: heartbeats, master silence, verdict deadlines, redials.
	tickIn struct{}
	// masterIn is a message from the master.
	masterIn struct{ msg wire.Message }
	// masterLost: the master connection ended (read error or EOF).
	masterLost struct{ err error }
	// writeFailed: a write to the master failed; the reader may still hold the master's reason.
	writeFailed struct{ err error }
	// wiredIn: the links of a Connect round are open, or failed.
	wiredIn struct {
		epoch  uint64
		failed []uint64
		err    error
	}
	// rendezvousOut: a connection to a peer behind NAT needs the master's rendezvous (rendezvous.go).
	rendezvousOut struct{ msg *wire.Rendezvous }
	// measuredIn: one bandwidth test of an OptimizeTopology is over.
	measuredIn struct {
		round   uint32
		to      uint64
		rate    float64
		latency time.Duration
	}
	// redialedIn: a dial of the master ended. Resumed: the master took the session over (masterRecv
	// of this peer's session frames had arrived; it sends its own again from number masterNext).
	// Otherwise, on success, conn is a new connection after its Welcome; kicked says the master
	// refused the Hello with a Kick (err holds its reason). A conn other than 0 is adopted
	// (adoptAct) or dropped (dropConnAct) by the step that takes the input.
	redialedIn struct {
		conn       connID
		welcome    *wire.Welcome
		session    wire.SessionID // the new session of a Welcome
		err        error
		kicked     bool
		resumed    bool
		masterRecv uint64
		masterNext uint64
	}
)

// Inputs from API calls. Each carries the call id its replies go to (callOf), except stepCall and
// closeCall, which wait for none.
type (
	// connectCall waits for this peer's admission (the first Topology).
	connectCall struct{ call uint64 }
	// topologyCall is UpdateTopology; rewire asks for new links because one broke, and noAdmit keeps
	// registered peers waiting (Rewire).
	topologyCall struct {
		call    uint64
		rewire  bool
		noAdmit bool
	}
	// pendingCall is ArePeersPending; with leave it is Leave (the peer's last vote).
	pendingCall struct {
		call  uint64
		leave bool
	}
	// optimizeCall is OptimizeTopology.
	optimizeCall struct{ call uint64 }
	// initiateCall starts a collective on tag.
	initiateCall struct {
		call  uint64
		tag   uint64
		desc  wire.Desc
		stats *wire.Contribution // for the master's contribution guard, nil if not computed
	}
	// reportCall: the data path of the collective on tag ended here with done; the call of the
	// initiateCall waits for the verdict.
	reportCall struct {
		call uint64
		tag  uint64
		done *wire.Done
	}
	// syncCall is SyncSharedState's vote.
	syncCall struct {
		call uint64
		vote *wire.VoteSync
	}
	// syncDoneCall: the transfer of the sync voted by call prev is over; call waits for SyncComplete.
	syncDoneCall struct {
		call uint64
		prev uint64
		done *wire.SyncDone
	}
	// stepCall is ReportStep.
	stepCall struct{ report *wire.StepReport }
	// cancelCall: the caller of call gave up (its context ended) for reason.
	cancelCall struct {
		call   uint64
		reason error
	}
	// closeCall is Close.
	closeCall struct{}
)

func (tickIn) isInput()        {}
func (masterIn) isInput()      {}
func (masterLost) isInput()    {}
func (writeFailed) isInput()   {}
func (wiredIn) isInput()       {}
func (rendezvousOut) isInput() {}
func (measuredIn) isInput()    {}
func (redialedIn) isInput()    {}
func (connectCall) isInput()   {}
func (topologyCall) isInput()  {}
func (pendingCall) isInput()   {}
func (optimizeCall) isInput()  {}
func (initiateCall) isInput()  {}
func (reportCall) isInput()    {}
func (syncCall) isInput()      {}
func (syncDoneCall) isInput()  {}
func (stepCall) isInput()      {}
func (cancelCall) isInput()    {}
func (closeCall) isInput()     {}

// callOf returns the call id an input carries, 0 if none.
func callOf(in input) uint64 {
	switch in := in.(type) {
	case connectCall:
		return in.call
	case topologyCall:
		return in.call
	case pendingCall:
		return in.call
	case optimizeCall:
		return in.call
	case initiateCall:
		return in.call
	case reportCall:
		return in.call
	case syncCall:
		return in.call
	case syncDoneCall:
		return in.call
	}
	return 0
}
