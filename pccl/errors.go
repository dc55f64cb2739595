package pccl

import (
	"context"
	"errors"
	"fmt"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl/internal/links"
	"github.com/concord-ccl/concord/rings"
)

// Sentinel errors. Errors returned by this package wrap one of them (test with errors.Is) and add
// context such as the tag, the sequence number and the master's explanation. Retryable tells which
// ones a group recovers from with UpdateTopology.
var (
	// ErrPeerLeft: a peer taking part left, died, hung or was kicked, or a link to it broke. Retry
	// after UpdateTopology.
	ErrPeerLeft = links.ErrPeerLeft
	// ErrAborted: the operation was aborted (a peer cancelled it, or a link failed during the ring).
	// Retry after UpdateTopology. It is the same value as rings.ErrAborted.
	ErrAborted = rings.ErrAborted
	// ErrTooFewPeers: fewer accepted peers than the master's MinPeers. Wait for peers to join.
	ErrTooFewPeers = errors.New("pccl: too few peers")
	// ErrLocalFailure: the operation failed because of a local problem of this or another peer that a
	// retry cannot fix, such as a quantized result that is not finite. Not retryable.
	ErrLocalFailure = errors.New("pccl: a peer failed locally")
	// ErrNonFinite: a value to be quantized is NaN or infinite (this peer's local failure). It is the
	// same value as rings.ErrNonFinite.
	ErrNonFinite = rings.ErrNonFinite
	// ErrKicked: the master removed this peer (it was silent, unreachable, or misbehaved); the
	// Communicator is unusable. Unless the error also wraps ErrRefused, the peer may connect again as
	// a newcomer (see Rejoinable).
	ErrKicked = errors.New("pccl: kicked by the master")
	// ErrRefused: the master refused this peer for a reason that connecting again cannot fix until the
	// configuration changes: a wrong run token, a protocol version of another release. It comes
	// wrapped together with ErrKicked.
	ErrRefused = errors.New("pccl: refused by the master")
	// ErrClosed: the Communicator was closed.
	ErrClosed = links.ErrClosed
	// ErrDescriptorMismatch: peers passed different descriptors for the same tag.
	ErrDescriptorMismatch = errors.New("pccl: collective descriptors differ between peers")
	// ErrMasterLost: the master stopped answering.
	ErrMasterLost = errors.New("pccl: master lost")
	// ErrBusy: the call needs this peer to have no collective in flight.
	ErrBusy = errors.New("pccl: collectives in flight")
	// ErrInvalid: invalid arguments. It is the same value as rings.ErrInvalid.
	ErrInvalid = rings.ErrInvalid
)

// Retryable reports whether the group recovers from err by calling UpdateTopology (after waiting for
// peers to join, for ErrTooFewPeers) and retrying: err wraps ErrPeerLeft, ErrAborted or ErrTooFewPeers,
// and none of the errors that a retry cannot fix (ErrLocalFailure, ErrNonFinite, ErrInvalid,
// ErrDescriptorMismatch, ErrKicked, ErrClosed, ErrMasterLost). It does not look at context errors: a
// caller whose own context ended stops on ctx.Err().
func Retryable(err error) bool {
	for _, e := range permanent {
		if errors.Is(err, e) {
			return false
		}
	}
	return errors.Is(err, ErrPeerLeft) || errors.Is(err, ErrAborted) || errors.Is(err, ErrTooFewPeers)
}

// Rejoinable reports whether a peer whose Communicator failed with err may come back by connecting
// again as a newcomer (a new Connect, then a sync that fetches the group's state): the master removed
// it (ErrKicked) or could not be reached for a while (ErrMasterLost), and not for a reason a retry
// cannot fix (ErrRefused, ErrInvalid, ErrClosed). Context errors are the caller's own and are not
// rejoinable.
func Rejoinable(err error) bool {
	switch {
	case err == nil, errors.Is(err, ErrRefused), errors.Is(err, ErrInvalid), errors.Is(err, ErrClosed),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	}
	return errors.Is(err, ErrKicked) || errors.Is(err, ErrMasterLost)
}

// permanent lists the errors that make an error not retryable, whatever else it wraps.
var permanent = []error{ErrLocalFailure, ErrNonFinite, ErrInvalid, ErrDescriptorMismatch, ErrKicked, ErrClosed, ErrMasterLost}

// codes is the one table between the errors of a failed operation and the wire codes peers and master
// exchange (wire.Done, wire.Outcome); the C ABI reuses it. A code decodes to err. An error encodes to the
// code of the first row whose err or also it wraps, with one exception for ErrAborted (see codeOf).
var codes = []struct {
	code wire.Code
	err  error
	also []error // other errors that encode to code
}{
	{wire.CodeLocalFailure, ErrLocalFailure, []error{ErrNonFinite, ErrInvalid}},
	{wire.CodeMismatch, ErrDescriptorMismatch, nil},
	{wire.CodeTooFewPeers, ErrTooFewPeers, nil},
	{wire.CodePeerLeft, ErrPeerLeft, nil},
	{wire.CodeAborted, ErrAborted, []error{context.Canceled, context.DeadlineExceeded}},
}

// errorOf returns the sentinel error of a failure code. A code outside the table (CodeRejected, a code
// from a newer master) counts as ErrAborted.
func errorOf(c wire.Code) error {
	for _, row := range codes {
		if row.code == c {
			return row.err
		}
	}
	return ErrAborted
}

// codeOf returns the code with which a peer reports err, the failure of its part of an operation
// (CodeOK for nil). A ring collective's error wraps ErrAborted together with its cause: a cause that
// the table knows decides the code (ErrNonFinite gives CodeLocalFailure, the caller's context
// CodeAborted), and an unclassified cause, an I/O failure on a link, gives CodePeerLeft, as does any
// other error outside the table. ErrAborted alone gives CodeAborted.
func codeOf(err error) wire.Code {
	if err == nil {
		return wire.CodeOK
	}
	for _, row := range codes {
		if errors.Is(err, row.err) && (row.err != ErrAborted || onlyAborted(err)) {
			return row.code
		}
		for _, e := range row.also {
			if errors.Is(err, e) {
				return row.code
			}
		}
	}
	return wire.CodePeerLeft
}

// onlyAborted reports whether ErrAborted is the only error at the leaves of err's tree: nothing else
// tells why the operation stopped.
func onlyAborted(err error) bool {
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if !onlyAborted(e) {
				return false
			}
		}
		return true
	case interface{ Unwrap() error }:
		return onlyAborted(u.Unwrap())
	}
	return err == ErrAborted
}

// outcomeError maps the master's verdict on an operation to an error (nil for CodeOK).
func outcomeError(what string, o *wire.Outcome) error {
	if o.Code == wire.CodeOK {
		return nil
	}
	base := errorOf(o.Code)
	if o.Detail == "" {
		return fmt.Errorf("%s: %w", what, base)
	}
	return fmt.Errorf("%s: %w: %s", what, base, o.Detail)
}
