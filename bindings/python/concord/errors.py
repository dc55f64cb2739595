"""Exceptions of the concord package; they mirror the sentinel errors of Concord's Go API."""

from __future__ import annotations

from . import _lib


class ConcordError(Exception):
    """A failed Concord call. ``code`` is PCCL's result code, ``retryable`` tells whether the group
    recovers by retrying the operation (the library has already re-wired the ring), ``rejoinable``
    whether this peer gets back into the run by Communicator.rejoin (the master removed it, or was
    out of reach too long, and not for a reason a new connection cannot fix)."""

    retryable = False

    def __init__(self, message: str, code: int = _lib.INTERNAL_ERROR, rejoinable: bool = False):
        super().__init__(message)
        self.code = code
        self.rejoinable = rejoinable


class PeerLeftError(ConcordError):
    """A peer taking part left, died, hung or was kicked; retry the operation."""

    retryable = True


class AbortedError(ConcordError):
    """The operation was aborted (a peer cancelled it or a link failed); retry it."""

    retryable = True


class TooFewPeersError(ConcordError):
    """Fewer peers than the operation needs; wait for peers to join."""

    retryable = True


class LocalFailureError(ConcordError):
    """A peer failed for a reason of its own that a retry cannot fix."""


class NonFiniteError(LocalFailureError):
    """A value to be quantized is NaN or infinite."""


class KickedError(ConcordError):
    """The master removed this peer; the communicator is unusable."""


class RefusedError(KickedError):
    """The master refused this peer for good: a wrong run token or secret, or another release. A
    rejoin cannot fix it."""


class ClosedError(ConcordError):
    """The communicator was closed."""


class DescriptorMismatchError(ConcordError):
    """Peers passed different descriptors for the same tag."""


class MasterLostError(ConcordError):
    """The master stopped answering or could not be reached."""


class BusyError(ConcordError):
    """The call needs every asynchronous all-reduce of this peer awaited first."""


class InvalidError(ConcordError, ValueError):
    """Invalid arguments."""


class SyncError(ConcordError):
    """A shared-state sync failed (revision rule, entry-set mismatch, lost election, transfer)."""


class NotConnectedError(ConcordError):
    """The communicator is not connected yet."""


# concordErrorKind_t -> exception class
_BY_KIND = {
    2: PeerLeftError,
    3: AbortedError,
    4: TooFewPeersError,
    5: LocalFailureError,
    6: NonFiniteError,
    7: KickedError,
    8: ClosedError,
    9: DescriptorMismatchError,
    10: MasterLostError,
    11: BusyError,
    12: InvalidError,
    13: SyncError,
    15: RefusedError,
}

# pcclResult_t -> exception class, for errors that wrap none of the sentinels
_BY_CODE = {
    _lib.INVALID_ARGUMENT: InvalidError,
    _lib.INVALID_USAGE: NotConnectedError,
    _lib.TOO_FEW_PEERS: TooFewPeersError,
    _lib.MASTER_CONNECTION_FAILED: MasterLostError,
    _lib.RANK_CONNECTION_LOST: PeerLeftError,
    _lib.PENDING_ASYNC_OPS: BusyError,
}


def check(code: int, what: str) -> None:
    """Raises the exception for a failed call's result code."""
    if code == _lib.SUCCESS:
        return
    kind, msg, rejoinable = _lib.last_error()
    cls = _BY_KIND.get(kind) or _BY_CODE.get(code, ConcordError)
    raise cls(f"{what}: {msg or 'result code %d' % code}", code, rejoinable)
