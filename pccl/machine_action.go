package pccl

import "github.com/concord-ccl/concord/internal/wire"

// action is an action of the peer machine for the runtime to carry out, in order (the list is in
// machine's doc). The marker method seals the set.
type action interface{ isAction() }

// The actions.
type (
	// sendAct: write msg to the master.
	sendAct struct{ msg wire.Message }
	// replyAct answers an API call.
	replyAct struct{ r reply }
	// wireAct: open the links of the ring in m, then input wiredIn.
	wireAct struct{ m *wire.Connect }
	// retireAct: drop incoming links from peers that left ring.
	retireAct struct{ ring []uint64 }
	// abortAct: abort the data path of the collective of call (the master's verdict, or death).
	abortAct struct {
		call uint64
		err  error
	}
	// tombstoneAct: frames of seq are to be read and dropped: nobody here runs it.
	tombstoneAct struct{ seq uint64 }
	// measureAct: run the bandwidth test of round r, then input measuredIn.
	measureAct struct{ r *wire.MeasureRound }
	// dieAct: the communicator is dead for err; wake everyone, close the master connection.
	dieAct struct{ err error }
	// noticeAct: log the master's warning text for the operator.
	noticeAct struct{ text string }
	// callAct: another peer asks to reach this one by rendezvous; open the connection it asks for.
	callAct struct{ call *wire.RendezvousCall }
	// redialAct: dial the master and resume the session; if the master does not know it, send a Hello
	// with this report (the runtime adds the shared-state revision and digest). Then input redialedIn.
	redialAct struct{ resume *wire.Resume }
	// adoptAct: connection conn (of a redialedIn) is the master connection from now on; start reading
	// it. With resumed, the session moved to it: send again this peer's frames after masterRecv, and
	// drop those of the master's frames, sent again from masterNext, that this peer had already
	// received.
	adoptAct struct {
		conn       connID
		session    wire.SessionID // the session a Welcome opened, when not resumed
		resumed    bool
		masterRecv uint64
		masterNext uint64
	}
	// dropConnAct: close connection conn (of a redialedIn), which nobody needs any more.
	dropConnAct struct{ conn connID }
)

func (sendAct) isAction()      {}
func (replyAct) isAction()     {}
func (wireAct) isAction()      {}
func (retireAct) isAction()    {}
func (abortAct) isAction()     {}
func (tombstoneAct) isAction() {}
func (measureAct) isAction()   {}
func (dieAct) isAction()       {}
func (noticeAct) isAction()    {}
func (callAct) isAction()      {}
func (redialAct) isAction()    {}
func (adoptAct) isAction()     {}
func (dropConnAct) isAction()  {}

// reply is the answer to an API call. start is set on the first reply to a collective that commenced;
// every other reply is final.
type reply struct {
	call   uint64
	err    error
	answer bool         // ArePeersPending's answer
	msg    wire.Message // SyncPlan or SyncComplete for a sync
	start  *opStart
}

// opStart tells a collective's caller to move the data of seq on the ring of epoch.
type opStart struct {
	seq   uint64
	epoch uint64
	ring  []uint64
	// alone is the master's word that no other collective of the group runs beside this one
	// (wire.Commence.Alone); siteGen is the sequence number of the last collective of this epoch
	// that the master aborted before this one commenced, 0 if none. Every member gets the same two,
	// so they name the same generation of the intra-site fabric (sitetier.go).
	alone   bool
	siteGen uint64
	// siteOff says that the master aborted siteAbortLimit collectives of this epoch already: the
	// site phases leave the intra-site fabric for the site ring's links until the next epoch, so
	// that a fabric that keeps failing (a peer whose NICs are all down while its links work) costs
	// two attempts, not every one.
	siteOff bool
}

// siteAbortLimit is how many aborted collectives of one epoch turn the intra-site fabric off for the
// rest of the epoch (opStart.siteOff).
const siteAbortLimit = 2
