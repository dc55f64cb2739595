package rings

import "errors"

// The sentinel errors of the package. Package pccl re-exports these very values (pccl.ErrAborted is
// rings.ErrAborted), so errors.Is works across both packages and a message never names two packages;
// that is why their text starts with "pccl:".
var (
	// ErrAborted is returned (wrapped, together with the cause) by an operation that did not complete.
	ErrAborted = errors.New("pccl: operation aborted")
	// ErrInvalid is returned (wrapped) when an operation is called with arguments that can never work,
	// such as an unknown data type or buffers of different lengths.
	ErrInvalid = errors.New("pccl: invalid argument")
	// ErrNonFinite is returned (wrapped) when a value that must be quantized is NaN or infinite.
	ErrNonFinite = errors.New("pccl: non-finite value cannot be quantized")
)
