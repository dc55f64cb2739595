"""concord: Python bindings of Concord, a fault-tolerant collective-communication runtime.

The package drives libpccl.so (Concord's implementation of PCCL's C API) through ctypes. numpy
arrays and torch CPU tensors are used in place: all-reduce reads and writes their memory directly,
and shared-state sync overwrites the tensors of a peer that is behind. Either library is optional.

    with concord.Master() as master, concord.Communicator(master.address) as comm:
        comm.all_reduce(grads)                # in place, sum over the peer group
        handle = comm.all_reduce_async(grads, op=concord.ReduceOp.AVG, tag=1)
        info = handle.wait()

Failures raise exceptions that mirror Concord's Go sentinel errors (PeerLeftError, TooFewPeersError,
...). A retryable failure (``err.retryable``) leaves the buffers as they were and the ring already
re-wired without the departed peer: call the same all-reduce again.

The library is found through $CONCORD_LIB, next to this package, or built from the Concord checkout
the package sits in (``go build -buildmode=c-shared``).
"""

from __future__ import annotations

import ctypes
import enum
import ipaddress
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, TypeVar

from . import _lib
from ._buffers import Buffer, buffer
from .errors import (AbortedError, BusyError, ClosedError, ConcordError, DescriptorMismatchError, InvalidError,
                     KickedError, LocalFailureError, MasterLostError, NonFiniteError, NotConnectedError,
                     PeerLeftError, RefusedError, SyncError, TooFewPeersError, check)

__all__ = [
    "Master", "Communicator", "SharedState", "AsyncReduce", "ReduceOp", "Quant", "Strategy", "ReduceInfo",
    "SyncInfo", "ConcordError", "PeerLeftError", "AbortedError", "TooFewPeersError", "LocalFailureError",
    "NonFiniteError", "KickedError", "ClosedError", "DescriptorMismatchError", "MasterLostError", "BusyError",
    "InvalidError", "SyncError", "NotConnectedError", "RefusedError", "library_path", "run_with_rejoin",
]


class ReduceOp(enum.IntEnum):
    """Reductions (pcclRedOp_t). AVG divides the sum by the number of peers."""

    SUM = 0
    AVG = 1
    PROD = 2
    MAX = 3
    MIN = 4


class Quant(enum.Enum):
    """Quantization of an all-reduce's wire traffic (float32/float64 buffers only). The MINMAX kinds
    encode the all-gather phase; the _BOTH kinds encode the reduce-scatter's hops as well (SUM, AVG,
    MIN and MAX only), for about a quarter (uint8) or half (uint16) of the float bytes on every hop.
    Results stay bit-identical on every peer. Each value is (quantized type, algorithm) of pcclQuant*."""

    NONE = None
    MINMAX_U8 = (0, 1)  # pcclUint8, pcclQuantMinMax
    MINMAX_U16 = (3, 1)  # pcclUint16, pcclQuantMinMax
    MINMAX_U8_BOTH = (0, 16)  # pcclUint8, concordQuantMinMaxBothPhases
    MINMAX_U16_BOTH = (3, 16)  # pcclUint16, concordQuantMinMaxBothPhases


class Strategy(enum.IntEnum):
    """How a peer takes part in a shared-state sync."""

    ENFORCE_POPULAR = 0
    RECEIVE_ONLY = 1
    SEND_ONLY = 2


@dataclass(frozen=True)
class ReduceInfo:
    """What an all-reduce did: the peers that took part and the payload bytes this peer sent and
    received, quantized as they went on the wire."""

    world_size: int
    tx_bytes: int
    rx_bytes: int


@dataclass(frozen=True)
class SyncInfo:
    """What a shared-state sync did: the revision now held, the entry bytes this peer fetched and
    those it sent to peers that fetched from it."""

    revision: int
    rx_bytes: int
    tx_bytes: int = 0


def library_path() -> str:
    """Returns the path of the libpccl.so the package uses (building it if need be)."""
    return str(_lib.find())


def _socket_address(host: str, port: int) -> _lib.SocketAddress:
    ip = ipaddress.ip_address(host)
    a = _lib.SocketAddress()
    if ip.version == 4:
        a.inet.protocol = 0
        a.inet.ipv4.data[:] = list(ip.packed)
    else:
        a.inet.protocol = 1
        a.inet.ipv6.data[:] = list(ip.packed)
    a.port = port
    return a


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class Master:
    """A Concord master served in this process (the run's coordinator). Use it as a context manager,
    or call run() and close(). ``port=0`` picks a free port; read it from ``port`` or ``address``.
    ``preset`` is "pccl" (the default: a silent peer is kept for 60 s, as PCCL's TCP keepalive
    does, while a closed connection removes it at once), "lan" (removed after 1.5 s of silence) or
    "wan" (6 s). ``transport`` is "tcp" (default), "tls" or "quic"; the last two need ``secret``.

    ``gossip`` ("host:port", port 0 picks one) runs a gossip failure detector there that peers join
    (Communicator's ``gossip_join``, the address in ``gossip_address``): a peer it declares dead is
    removed even while its connection stays open, as a hung process's does. ``guard`` is the
    contribution guard, a dict of ``reject_non_finite`` (bool), ``norm_factor`` (above 1; 0 is off) and
    ``exclude`` (kick the offender, else fail the all-reduce for everyone): it checks what peers with
    ``contribution_stats`` report before an all-reduce of float data starts. Both are off by default."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, preset: str | None = None,
                 secret: str | None = None, transport: str | None = None, gossip: str | None = None,
                 guard: dict[str, Any] | None = None):
        self._lib = _lib.lib()
        self._h = ctypes.c_void_p()
        check(self._lib.pcclCreateMaster(_socket_address(host, port), ctypes.byref(self._h)), "create master")
        self._host = host
        self._running = False
        if preset is not None:
            check(self._lib.concordMasterSetPreset(self._h, preset.encode()), "master preset")
        if secret is not None:
            check(self._lib.concordMasterSetSecret(self._h, secret.encode()), "master secret")
        if transport is not None:
            check(self._lib.concordMasterSetTransport(self._h, transport.encode()), "master transport")
        if gossip is not None:
            check(self._lib.concordMasterSetGossip(self._h, gossip.encode()), "master gossip")
        if guard is not None:
            unknown = set(guard) - {"reject_non_finite", "norm_factor", "exclude"}
            if unknown:
                raise InvalidError(f"guard: unknown settings {sorted(unknown)}")
            check(self._lib.concordMasterSetGuard(self._h, bool(guard.get("reject_non_finite", False)),
                                                  float(guard.get("norm_factor", 0)),
                                                  bool(guard.get("exclude", False))), "master guard")

    def run(self) -> "Master":
        """Starts serving in the background."""
        check(self._lib.pcclRunMaster(self._h), "run master")
        self._running = True
        return self

    @property
    def port(self) -> int:
        p = ctypes.c_uint16()
        check(self._lib.concordMasterGetPort(self._h, ctypes.byref(p)), "master port")
        return p.value

    @property
    def address(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{host}:{self.port}"

    @property
    def gossip_address(self) -> str:
        """The address peers join the running master's gossip detector at (``gossip_join``)."""
        buf = ctypes.create_string_buffer(256)
        check(self._lib.concordMasterGetGossipAddress(self._h, buf, len(buf)), "master gossip address")
        return buf.value.decode()

    def close(self) -> None:
        """Stops the master, waits for it and frees it. Idempotent."""
        if not self._h:
            return
        if self._running:
            check(self._lib.pcclInterruptMaster(self._h), "interrupt master")
            check(self._lib.pcclMasterAwaitTermination(self._h), "await master")
            self._running = False
        check(self._lib.pcclDestroyMaster(self._h), "destroy master")
        self._h = ctypes.c_void_p()

    def __enter__(self) -> "Master":
        return self.run() if not self._running else self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class SharedState:
    """Named arrays or tensors kept identical across the peer group by Communicator.sync_shared_state.
    Each entry's memory is used in place. ``revision`` must grow by one before each sync (any value on
    a fresh run); a sync that fetches state sets it to the group's."""

    def __init__(self, entries: dict[str, Any] | None = None, *, revision: int = 0, may_differ: Iterable[str] = ()):
        self.entries: dict[str, Any] = dict(entries or {})
        self.revision = revision
        self.may_differ = set(may_differ)

    def __setitem__(self, name: str, value: Any) -> None:
        self.entries[name] = value

    def __getitem__(self, name: str) -> Any:
        return self.entries[name]

    def __len__(self) -> int:
        return len(self.entries)


class AsyncReduce:
    """The handle of an all-reduce started by Communicator.all_reduce_async. wait() returns its
    ReduceInfo or raises; the buffers belong to the library until then."""

    def __init__(self, comm: "Communicator", op: _lib.AsyncReduceOp, keep: tuple):
        self._comm, self._op, self._keep = comm, op, keep
        self._result: ReduceInfo | BaseException | None = None
        self._lock = threading.Lock()

    def wait(self) -> ReduceInfo:
        with self._lock:
            if self._result is None:
                info = _lib.ReduceInfo()
                code = self._comm._lib.pcclAwaitAsyncReduce(ctypes.byref(self._op), ctypes.byref(info))
                try:
                    check(code, f"all-reduce tag {self._op.tag}")
                    self._result = ReduceInfo(info.local_world_size, info.tx_bytes, info.rx_bytes)
                except ConcordError as e:
                    self._result = e
                self._keep = ()
        if isinstance(self._result, BaseException):
            raise self._result
        return self._result

    @property
    def tag(self) -> int:
        return self._op.tag


class Communicator:
    """One peer's membership in a run. connect() (or entering the context) joins through the master
    at ``master`` ("host:port") and returns once the accepted peers admit this peer; close() leaves.

    ``group`` is the peer group (collectives and shared state span one group; see the package README
    for its status), ``pool_size`` the connections per ring neighbour, ``secret`` the run secret,
    ``transport`` "tcp" (default), "tls" or "quic" (both need ``secret``, and the master the same
    transport), ``site`` the datacenter name, ``nics`` the network interfaces (names or addresses, in
    rail order) the intra-site tier runs on when ``site`` is set, ``preset`` "pccl" (the default: as
    patient with silence as PCCL), "lan" or "wan", ``listen``/``advertise`` the address this peer
    accepts ring links on and the one neighbours dial. ``gossip_join`` is the master's gossip address
    (Master.gossip_address) to join its failure detector at, ``gossip_bind`` where this peer's gossip
    member binds (default: the host of ``listen`` or of the route to the master, any port);
    ``contribution_stats`` reports each float all-reduce's contribution norm to the master's guard.

    A peer the master removed (KickedError, or MasterLostError, with ``err.rejoinable``) comes back
    with rejoin(); it is then a newcomer and must fetch the group's state first. run_with_rejoin runs
    a training loop that way."""

    def __init__(self, master: str, *, group: int = 0, pool_size: int = 0, secret: str | None = None,
                 transport: str | None = None, site: str | None = None, nics: list[str] | None = None,
                 preset: str | None = None, listen: str | None = None,
                 advertise: str | None = None, master_timeout: float | None = None,
                 gossip_join: str | None = None, gossip_bind: str | None = None,
                 contribution_stats: bool = False):
        self._lib = _lib.lib()
        host, port = _split(master)
        params = _lib.CommCreateParams()
        params.master_address = _socket_address(host, port)
        params.peer_group = group
        params.p2p_connection_pool_size = pool_size
        self._h = ctypes.c_void_p()
        check(self._lib.pcclCreateCommunicator(ctypes.byref(params), ctypes.byref(self._h)), "create communicator")
        if preset is not None:
            check(self._lib.concordSetPreset(self._h, preset.encode()), "preset")
        if secret is not None:
            check(self._lib.concordSetSecret(self._h, secret.encode()), "secret")
        if transport is not None:
            check(self._lib.concordSetTransport(self._h, transport.encode()), "transport")
        if site is not None:
            check(self._lib.concordSetSite(self._h, site.encode()), "site")
        if nics is not None:
            check(self._lib.concordSetNICs(self._h, ",".join(nics).encode()), "nics")
        if listen is not None:
            check(self._lib.concordSetListenAddress(self._h, listen.encode(), (advertise or "").encode()), "listen")
        if master_timeout is not None:
            check(self._lib.concordSetMasterTimeout(self._h, int(master_timeout * 1000)), "master timeout")
        if gossip_join is not None or gossip_bind is not None:
            check(self._lib.concordSetGossip(self._h, (gossip_join or "").encode(), (gossip_bind or "").encode()),
                  "gossip")
        if contribution_stats:
            check(self._lib.concordSetContributionStats(self._h, True), "contribution stats")
        self._connected = False

    # -- membership --

    def connect(self) -> "Communicator":
        """Joins the run; blocks until the accepted peers admit this peer."""
        check(self._lib.pcclConnect(self._h), "connect")
        self._connected = True
        return self

    def rejoin(self, timeout: float | None = None) -> "Communicator":
        """Comes back into the run after the master removed this peer: drops the old membership and
        connects again with the same settings, retrying with a jittered backoff (100 ms doubling to 5 s)
        while the master cannot be reached, until the accepted peers admit it (their next
        update_topology). It raises at once, with RefusedError, on what a retry cannot fix (a wrong
        secret, another release), and MasterLostError after ``timeout`` seconds (None: no limit). The
        peer is then a newcomer: its first call is the group's state sync with Strategy.RECEIVE_ONLY."""
        ms = 0 if timeout is None else max(1, int(timeout * 1000))
        check(self._lib.concordRejoin(self._h, ms), "rejoin")
        self._connected = True
        return self

    def update_topology(self) -> None:
        """The membership step: every accepted peer calls it; together they admit waiting peers. It is
        the only call that admits them: the re-wiring after a failed all-reduce never does."""
        check(self._lib.pcclUpdateTopology(self._h), "update topology")

    def are_peers_pending(self) -> bool:
        """Whether peers wait to be admitted; every accepted peer calls it and gets the same answer."""
        out = ctypes.c_bool()
        check(self._lib.pcclArePeersPending(self._h, ctypes.byref(out)), "are peers pending")
        return out.value

    def optimize_topology(self) -> None:
        """Measures the links and re-orders the ring for bandwidth (every accepted peer calls it)."""
        check(self._lib.pcclOptimizeTopology(self._h), "optimize topology")

    def _attr(self, which: int) -> int:
        out = ctypes.c_int()
        check(self._lib.pcclGetAttribute(self._h, which, ctypes.byref(out)), "get attribute")
        return out.value

    @property
    def world_size(self) -> int:
        """Peers in this peer's group, as of the last membership step."""
        return self._attr(2)

    @property
    def global_world_size(self) -> int:
        return self._attr(1)

    @property
    def rank(self) -> int:
        out = ctypes.c_int()
        check(self._lib.concordGetRank(self._h, ctypes.byref(out)), "rank")
        return out.value

    @property
    def group(self) -> int:
        out = ctypes.c_uint32()
        check(self._lib.concordGetPeerGroup(self._h, ctypes.byref(out)), "group")
        return out.value

    # -- collectives --

    @staticmethod
    def _descriptor(b: Buffer, op: ReduceOp, tag: int, quant: Quant) -> _lib.ReduceDescriptor:
        d = _lib.ReduceDescriptor()
        d.count = b.count
        d.op = int(op)
        d.tag = tag
        d.src_descriptor.datatype = b.dtype
        if quant is Quant.NONE:
            d.quantization_options.quantized_datatype = b.dtype
            d.quantization_options.algorithm = 0
        else:
            d.quantization_options.quantized_datatype, d.quantization_options.algorithm = quant.value
        return d

    @staticmethod
    def _pair(send: Any, recv: Any) -> tuple[Buffer, Buffer]:
        s = buffer(send, "send", writable=recv is not None)
        r = s if recv is None or recv is send else buffer(recv, "recv")
        if (r.count, r.dtype) != (s.count, s.dtype):
            raise InvalidError(f"recv has {r.count} elements of type {r.dtype}, send {s.count} of type {s.dtype}")
        return s, r

    def all_reduce(self, send: Any, recv: Any = None, *, op: ReduceOp = ReduceOp.SUM, tag: int = 0,
                   quant: Quant = Quant.NONE) -> ReduceInfo:
        """Reduces ``send`` over the peer group into ``recv`` (default: in place into ``send``)."""
        return self.all_reduce_async(send, recv, op=op, tag=tag, quant=quant).wait()

    def all_reduce_async(self, send: Any, recv: Any = None, *, op: ReduceOp = ReduceOp.SUM, tag: int = 0,
                         quant: Quant = Quant.NONE) -> AsyncReduce:
        """Starts an all-reduce and returns its handle; several may run at once on different tags."""
        s, r = self._pair(send, recv)
        d = self._descriptor(s, op, tag, quant)
        h = _lib.AsyncReduceOp()
        check(self._lib.pcclAllReduceAsync(s.ptr, r.ptr, ctypes.byref(d), self._h, ctypes.byref(h)),
              f"all-reduce tag {tag}")
        return AsyncReduce(self, h, (s.owner, r.owner))

    def all_reduce_many(self, tensors: Sequence[Any], *, op: ReduceOp = ReduceOp.SUM, first_tag: int = 0,
                        max_in_flight: int = 8, quant: Quant = Quant.NONE) -> ReduceInfo:
        """All-reduces every tensor in place (tags first_tag, first_tag+1, ...), at most max_in_flight
        at a time, retrying those that fail because a peer left until all succeed or fewer than two
        peers remain (TooFewPeersError)."""
        bufs = [buffer(t, f"tensors[{i}]") for i, t in enumerate(tensors)]
        arr = (_lib.ReduceOpDescriptor * len(bufs))()
        for i, b in enumerate(bufs):
            arr[i].sendbuf = b.ptr
            arr[i].recvbuf = b.ptr
            arr[i].descriptor = self._descriptor(b, op, first_tag + i, quant)
        info = _lib.ReduceInfo()
        check(self._lib.pcclAllReduceMultipleWithRetry(arr, len(bufs), self._h, ctypes.byref(info), max_in_flight),
              "all-reduce many")
        return ReduceInfo(info.local_world_size, info.tx_bytes, info.rx_bytes)

    # -- shared state --

    def sync_shared_state(self, state: SharedState, strategy: Strategy = Strategy.ENFORCE_POPULAR) -> SyncInfo:
        """Makes ``state`` identical on every accepted peer of the group: the most popular whole
        state (every entry outside ``may_differ``) wins, ties broken the same way every time, and
        peers that differ receive the entries that differ in place."""
        names = list(state.entries)
        infos = (_lib.TensorInfo * max(1, len(names)))()
        keep = []
        for i, name in enumerate(names):
            b = buffer(state.entries[name], name)
            raw = name.encode()
            keep.append((raw, b))
            infos[i].name = raw
            infos[i].data = b.ptr
            infos[i].count = b.count
            infos[i].datatype = b.dtype
            infos[i].device_type = 0
            infos[i].allow_content_inequality = name in state.may_differ
        st = _lib.SharedStateC(state.revision, len(names), infos)
        info = _lib.SyncInfo()
        check(self._lib.pcclSynchronizeSharedState(self._h, ctypes.byref(st), int(strategy), ctypes.byref(info)),
              "sync shared state")
        state.revision = st.revision
        return SyncInfo(st.revision, info.rx_bytes, info.tx_bytes)

    # -- lifetime --

    def close(self) -> None:
        """Leaves the run and frees the communicator. Idempotent."""
        if self._h:
            self._lib.pcclDestroyCommunicator(self._h)
            self._h = ctypes.c_void_p()

    def __enter__(self) -> "Communicator":
        if not self._connected:
            try:
                self.connect()
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


T = TypeVar("T")


def run_with_rejoin(comm: Communicator, body: Callable[[int], T], *, timeout: float | None = None,
                    max_rejoins: int | None = None, on_rejoin: Callable[[ConcordError, int], Any] | None = None) -> T:
    """Runs ``body(rejoins)`` and keeps this peer in the run through kicks, as Go's pccl.Rejoin does:
    when body raises a ConcordError with ``rejoinable``, ``on_rejoin(err, rejoins)`` is called (rejoins
    counts this one), ``comm.rejoin(timeout)`` connects again as a newcomer, and body runs again with
    the count. body must then fetch the group's state first (Strategy.RECEIVE_ONLY), and leave no
    all-reduce of the old membership running when it raises. Returns what body returns; raises body's
    other errors, rejoin's (RefusedError; MasterLostError after ``timeout``), and the kick that would
    be rejoin number max_rejoins + 1."""
    rejoins = 0
    while True:
        try:
            return body(rejoins)
        except ConcordError as err:
            if not err.rejoinable or (max_rejoins is not None and rejoins >= max_rejoins):
                raise
            rejoins += 1
            if on_rejoin is not None:
                on_rejoin(err, rejoins)
        comm.rejoin(timeout)
