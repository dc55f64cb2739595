package pccl

import (
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// Inputs of the machine.
type (
	// tickIn lets time pass: heartbeats, master silence, verdict deadlines.
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

// callOf returns the call id an input carries, 0 if none.
func callOf(in any) uint64 {
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
