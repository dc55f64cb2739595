package pccl

import (
	"errors"
	"fmt"

	"github.com/concord-ccl/concord/internal/wire"
)

// Sentinel errors. Errors returned by this package wrap one of them (test with errors.Is) and add
// context such as the tag, the sequence number and the master's explanation.
var (
	// ErrPeerLeft: a peer taking part left, died, hung or was kicked. Retry after UpdateTopology.
	ErrPeerLeft = errors.New("pccl: a peer left")
	// ErrAborted: the operation was aborted (a peer cancelled it). Retry after UpdateTopology.
	ErrAborted = errors.New("pccl: operation aborted")
	// ErrTooFewPeers: fewer accepted peers than the master's MinPeers. Wait for peers to join.
	ErrTooFewPeers = errors.New("pccl: too few peers")
	// ErrKicked: the master removed this peer; the Communicator is unusable.
	ErrKicked = errors.New("pccl: kicked by the master")
	// ErrClosed: the Communicator was closed.
	ErrClosed = errors.New("pccl: communicator closed")
	// ErrDescriptorMismatch: peers passed different descriptors for the same tag.
	ErrDescriptorMismatch = errors.New("pccl: collective descriptors differ between peers")
	// ErrMasterLost: the master stopped answering.
	ErrMasterLost = errors.New("pccl: master lost")
	// ErrBusy: the call needs this peer to have no collective in flight.
	ErrBusy = errors.New("pccl: collectives in flight")
	// ErrInvalid: invalid arguments.
	ErrInvalid = errors.New("pccl: invalid argument")
)

// outcomeError maps the master's verdict on an operation to an error.
func outcomeError(what string, o *wire.Outcome) error {
	var base error
	switch o.Code {
	case wire.CodeOK:
		return nil
	case wire.CodePeerLeft:
		base = ErrPeerLeft
	case wire.CodeAborted:
		base = ErrAborted
	case wire.CodeMismatch:
		base = ErrDescriptorMismatch
	case wire.CodeTooFewPeers:
		base = ErrTooFewPeers
	default:
		base = ErrAborted
	}
	if o.Detail == "" {
		return fmt.Errorf("%s: %w", what, base)
	}
	return fmt.Errorf("%s: %w: %s", what, base, o.Detail)
}
