"""Loading libpccl.so and its C types (ctypes mirrors of bindings/c/pccl.h)."""

from __future__ import annotations

import ctypes
import os
import pathlib
import shutil
import subprocess
import threading

LIB_NAME = "libpccl.so"

# pcclResult_t
SUCCESS = 0
NOT_INITIALIZED = 1
INTERNAL_ERROR = 2
INVALID_ARGUMENT = 3
INVALID_USAGE = 4
TOO_FEW_PEERS = 5
MASTER_CONNECTION_FAILED = 6
RANK_CONNECTION_FAILED = 7
RANK_CONNECTION_LOST = 8
NO_SHARED_STATE_AVAILABLE = 9
PENDING_ASYNC_OPS = 10
UPDATE_TOPOLOGY_FAILED = 11
TOPOLOGY_OPTIMIZATION_FAILED = 12


class IPv4(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint8 * 4)]


class IPv6(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint8 * 16)]


class InetAddress(ctypes.Structure):
    _fields_ = [("protocol", ctypes.c_int), ("ipv4", IPv4), ("ipv6", IPv6)]


class SocketAddress(ctypes.Structure):
    _fields_ = [("inet", InetAddress), ("port", ctypes.c_uint16)]


class CommCreateParams(ctypes.Structure):
    _fields_ = [
        ("master_address", SocketAddress),
        ("peer_group", ctypes.c_uint32),
        ("p2p_connection_pool_size", ctypes.c_uint32),
    ]


class ReduceInfo(ctypes.Structure):
    _fields_ = [("local_world_size", ctypes.c_uint32), ("tx_bytes", ctypes.c_uint64), ("rx_bytes", ctypes.c_uint64)]


class OperandDescriptor(ctypes.Structure):
    _fields_ = [("datatype", ctypes.c_int), ("distribution_hint", ctypes.c_int)]


class QuantizationOptions(ctypes.Structure):
    _fields_ = [("quantized_datatype", ctypes.c_int), ("algorithm", ctypes.c_int)]


class ReduceDescriptor(ctypes.Structure):
    _fields_ = [
        ("count", ctypes.c_size_t),
        ("op", ctypes.c_int),
        ("tag", ctypes.c_uint64),
        ("src_descriptor", OperandDescriptor),
        ("quantization_options", QuantizationOptions),
    ]


class ReduceOpDescriptor(ctypes.Structure):
    _fields_ = [("sendbuf", ctypes.c_void_p), ("recvbuf", ctypes.c_void_p), ("descriptor", ReduceDescriptor)]


class AsyncReduceOp(ctypes.Structure):
    _fields_ = [("comm", ctypes.c_void_p), ("tag", ctypes.c_uint64)]


class TensorInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("data", ctypes.c_void_p),
        ("count", ctypes.c_size_t),
        ("datatype", ctypes.c_int),
        ("device_type", ctypes.c_int),
        ("allow_content_inequality", ctypes.c_bool),
    ]


class SharedStateC(ctypes.Structure):
    _fields_ = [("revision", ctypes.c_uint64), ("count", ctypes.c_size_t), ("infos", ctypes.POINTER(TensorInfo))]


class SyncInfo(ctypes.Structure):
    _fields_ = [("tx_bytes", ctypes.c_uint64), ("rx_bytes", ctypes.c_uint64)]


class BuildInfo(ctypes.Structure):
    _fields_ = [("has_cuda_support", ctypes.c_bool)]


_P = ctypes.c_void_p
_R = ctypes.c_int
_SIGNATURES = {
    "pcclInit": [],
    "pcclCreateCommunicator": [ctypes.POINTER(CommCreateParams), ctypes.POINTER(_P)],
    "pcclGetAttribute": [_P, ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
    "pcclDestroyCommunicator": [_P],
    "pcclConnect": [_P],
    "pcclUpdateTopology": [_P],
    "pcclArePeersPending": [_P, ctypes.POINTER(ctypes.c_bool)],
    "pcclOptimizeTopology": [_P],
    "pcclAllReduce": [_P, _P, ctypes.POINTER(ReduceDescriptor), _P, ctypes.POINTER(ReduceInfo)],
    "pcclAllReduceAsync": [_P, _P, ctypes.POINTER(ReduceDescriptor), _P, ctypes.POINTER(AsyncReduceOp)],
    "pcclAllReduceMultipleWithRetry": [
        ctypes.POINTER(ReduceOpDescriptor), ctypes.c_size_t, _P, ctypes.POINTER(ReduceInfo), ctypes.c_int],
    "pcclAwaitAsyncReduce": [ctypes.POINTER(AsyncReduceOp), ctypes.POINTER(ReduceInfo)],
    "pcclSynchronizeSharedState": [_P, ctypes.POINTER(SharedStateC), ctypes.c_int, ctypes.POINTER(SyncInfo)],
    "pcclCreateMaster": [SocketAddress, ctypes.POINTER(_P)],
    "pcclRunMaster": [_P],
    "pcclInterruptMaster": [_P],
    "pcclMasterAwaitTermination": [_P],
    "pcclDestroyMaster": [_P],
    "pcclGetBuildInfo": [ctypes.POINTER(BuildInfo)],
    "concordGetLastErrorKind": [],
    "concordSetTransport": [_P, ctypes.c_char_p],
    "concordSetSecret": [_P, ctypes.c_char_p],
    "concordSetNICs": [_P, ctypes.c_char_p],
    "concordSetSite": [_P, ctypes.c_char_p],
    "concordSetListenAddress": [_P, ctypes.c_char_p, ctypes.c_char_p],
    "concordSetPreset": [_P, ctypes.c_char_p],
    "concordSetMasterTimeout": [_P, ctypes.c_uint64],
    "concordGetPeerGroup": [_P, ctypes.POINTER(ctypes.c_uint32)],
    "concordGetRank": [_P, ctypes.POINTER(ctypes.c_int)],
    "concordMasterSetPreset": [_P, ctypes.c_char_p],
    "concordMasterSetSecret": [_P, ctypes.c_char_p],
    "concordMasterSetTransport": [_P, ctypes.c_char_p],
    "concordMasterGetPort": [_P, ctypes.POINTER(ctypes.c_uint16)],
    "concordMasterSetGossip": [_P, ctypes.c_char_p],
    "concordMasterGetGossipAddress": [_P, ctypes.c_char_p, ctypes.c_size_t],
    "concordMasterSetGuard": [_P, ctypes.c_bool, ctypes.c_double, ctypes.c_bool],
    "concordSetGossip": [_P, ctypes.c_char_p, ctypes.c_char_p],
    "concordSetContributionStats": [_P, ctypes.c_bool],
    "concordRejoin": [_P, ctypes.c_uint64],
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def repo_root() -> pathlib.Path | None:
    """Returns the Concord checkout this package sits in, or None when it is installed elsewhere."""
    for d in pathlib.Path(__file__).resolve().parents:
        if (d / "go.mod").is_file() and (d / "bindings" / "c" / "pccl.h").is_file():
            return d
    return None


def build(out: pathlib.Path) -> pathlib.Path:
    """Builds libpccl.so from the checkout with the Go toolchain and returns its path."""
    root = repo_root()
    if root is None:
        raise OSError("libpccl.so not found and no Concord checkout to build it from: set CONCORD_LIB")
    go = shutil.which("go") or "/usr/local/go/bin/go"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([go, "build", "-buildmode=c-shared", "-o", str(out), "./bindings/c"], cwd=root, check=True)
    return out


def find() -> pathlib.Path:
    """Locates libpccl.so: $CONCORD_LIB, next to this package, or a build from the checkout."""
    env = os.environ.get("CONCORD_LIB")
    if env:
        return pathlib.Path(env)
    here = pathlib.Path(__file__).resolve().parent / LIB_NAME
    if here.is_file():
        return here
    cached = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "concord" / LIB_NAME
    root = repo_root()
    if cached.is_file() and root is not None:
        newest = max(p.stat().st_mtime for p in (root / "bindings" / "c").glob("*.go"))
        if cached.stat().st_mtime >= newest:
            return cached
    return build(cached)


def lib() -> ctypes.CDLL:
    """Returns the loaded library, loading (and if need be building) it on first use."""
    global _lib
    with _lock:
        if _lib is None:
            handle = ctypes.CDLL(str(find()))
            for name, args in _SIGNATURES.items():
                fn = getattr(handle, name)
                fn.argtypes = args
                fn.restype = _R
            handle.concordGetLastError.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            handle.concordGetLastError.restype = ctypes.c_size_t
            handle.concordRejoinable.argtypes = []
            handle.concordRejoinable.restype = ctypes.c_bool
            if handle.pcclInit() != SUCCESS:
                raise OSError("pcclInit failed")
            _lib = handle
        return _lib


def last_error() -> tuple[int, str, bool]:
    """Returns the kind and message of the most recent failed call, and whether a rejoin can fix it."""
    h = lib()
    buf = ctypes.create_string_buffer(1024)
    h.concordGetLastError(buf, len(buf))
    return h.concordGetLastErrorKind(), buf.value.decode(errors="replace"), bool(h.concordRejoinable())
