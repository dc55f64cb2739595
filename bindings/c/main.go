// Command c is libpccl.so: PCCL's C API (pccl.h, next to this file) implemented on Concord. Build it
// with
//
//	go build -buildmode=c-shared -o libpccl.so ./bindings/c
//
// Programs written for PCCL compile against pccl.h and link against the library unchanged; functions
// prefixed "concord" expose what PCCL lacks (transport, run token, site, presets, error messages).
//
// Memory rules. C never holds a Go pointer: a communicator or master handed to C is a block of C
// memory holding a cgo.Handle, released by the matching destroy function. Go holds C memory only as
// slices made with unsafe.Slice over the caller's buffers, for the duration the API contract gives it
// (a collective until it is awaited, shared state during the sync), so nothing is copied on the way in.
//
// Errors map to PCCL's result codes; concordGetLastError returns the Go error's message and
// concordGetLastErrorKind which of Concord's sentinel errors it wraps.
package main

/*
#include "impl.h"
*/
import "C"

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/concord-ccl/concord/pccl"
)

func main() {}

// initialized is set by pcclInit; every non-master function needs it.
var initialized atomic.Bool

// lastErrors holds the error of the most recent failed call of each calling thread, for
// concordGetLastError (per thread, as errno is, so that threads sharing the library do not read each
// other's errors). An exported function runs on the C thread that called it, so the thread id names
// the caller. At most maxLastErrors threads are remembered; past that an arbitrary one is forgotten.
var lastErrors struct {
	sync.Mutex
	m map[int]lastError
}

// lastError is one thread's most recent error.
type lastError struct {
	err  error
	msg  string
	kind C.concordErrorKind_t
}

const maxLastErrors = 4096

// fail records err as the calling thread's last error and returns code.
func fail(code C.pcclResult_t, err error) C.pcclResult_t {
	tid := syscall.Gettid()
	lastErrors.Lock()
	defer lastErrors.Unlock()
	if lastErrors.m == nil {
		lastErrors.m = map[int]lastError{}
	}
	if _, ok := lastErrors.m[tid]; !ok && len(lastErrors.m) >= maxLastErrors {
		for k := range lastErrors.m {
			delete(lastErrors.m, k)
			break
		}
	}
	lastErrors.m[tid] = lastError{err: err, msg: err.Error(), kind: kindOf(err)}
	return code
}

// myLastError returns the calling thread's last error (the zero value when none failed).
func myLastError() lastError {
	tid := syscall.Gettid()
	lastErrors.Lock()
	defer lastErrors.Unlock()
	return lastErrors.m[tid]
}

// errNotInitialized is the error of calls made before pcclInit.
var errNotInitialized = errors.New("pccl: pcclInit was not called")

// kinds lists Concord's sentinel errors with the kind concordGetLastErrorKind reports for them, most
// specific first.
var kinds = []struct {
	err  error
	kind C.concordErrorKind_t
}{
	{pccl.ErrNonFinite, C.CONCORD_ERR_NON_FINITE},
	{pccl.ErrLocalFailure, C.CONCORD_ERR_LOCAL_FAILURE},
	{pccl.ErrDescriptorMismatch, C.CONCORD_ERR_DESCRIPTOR_MISMATCH},
	{pccl.ErrRefused, C.CONCORD_ERR_REFUSED},
	{pccl.ErrKicked, C.CONCORD_ERR_KICKED},
	{pccl.ErrMasterLost, C.CONCORD_ERR_MASTER_LOST},
	{pccl.ErrClosed, C.CONCORD_ERR_CLOSED},
	{pccl.ErrInvalid, C.CONCORD_ERR_INVALID},
	{pccl.ErrBusy, C.CONCORD_ERR_BUSY},
	{pccl.ErrTooFewPeers, C.CONCORD_ERR_TOO_FEW_PEERS},
	{pccl.ErrPeerLeft, C.CONCORD_ERR_PEER_LEFT},
	{pccl.ErrAborted, C.CONCORD_ERR_ABORTED},
	{pccl.ErrSync, C.CONCORD_ERR_SYNC},
	{context.DeadlineExceeded, C.CONCORD_ERR_TIMEOUT},
}

// kindOf returns the kind of err.
func kindOf(err error) C.concordErrorKind_t {
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.kind
		}
	}
	return C.CONCORD_ERR_OTHER
}

// resultOf maps the error of a collective to PCCL's result code.
func resultOf(err error) C.pcclResult_t {
	switch {
	case err == nil:
		return C.pcclSuccess
	case pccl.Retryable(err) && !errors.Is(err, pccl.ErrTooFewPeers):
		return C.pcclRankConnectionLost
	case errors.Is(err, pccl.ErrTooFewPeers):
		return C.pcclTooFewPeers
	case errors.Is(err, pccl.ErrInvalid), errors.Is(err, pccl.ErrDescriptorMismatch):
		return C.pcclInvalidArgument
	case errors.Is(err, pccl.ErrBusy):
		return C.pcclPendingAsyncOps
	case errors.Is(err, pccl.ErrKicked), errors.Is(err, pccl.ErrMasterLost):
		return C.pcclMasterConnectionFailed
	case errors.Is(err, pccl.ErrClosed):
		return C.pcclInvalidUsage
	}
	return C.pcclInternalError
}

//export pcclInit
func pcclInit() C.pcclResult_t {
	initialized.Store(true)
	return C.pcclSuccess
}

//export pcclGetBuildInfo
func pcclGetBuildInfo(info *C.pcclBuildInfo_t) C.pcclResult_t {
	if info == nil {
		return fail(C.pcclInvalidArgument, errors.New("pccl: build info pointer is NULL"))
	}
	info.has_cuda_support = false
	return C.pcclSuccess
}

//export concordGetLastError
func concordGetLastError(buf *C.char, n C.size_t) C.size_t {
	msg := myLastError().msg
	if buf != nil && n > 0 {
		out := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
		k := copy(out[:len(out)-1], msg)
		out[k] = 0
	}
	return C.size_t(len(msg))
}

//export concordGetLastErrorKind
func concordGetLastErrorKind() C.concordErrorKind_t {
	e := myLastError()
	if e.msg == "" {
		return C.CONCORD_OK
	}
	return e.kind
}

//export concordRejoinable
func concordRejoinable() C.bool {
	return C.bool(pccl.Rejoinable(myLastError().err))
}
