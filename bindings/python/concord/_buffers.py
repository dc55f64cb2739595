"""Describing numpy arrays and torch CPU tensors as raw buffers, without importing either library
unless the caller passes one of its objects."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from .errors import InvalidError

# pcclDataType_t
UINT8, INT8, INT16, UINT16, UINT32, INT32, UINT64, INT64, FLOAT16, BFLOAT16, FLOAT, DOUBLE = range(12)

_NUMPY = {
    "uint8": UINT8, "int8": INT8, "int16": INT16, "uint16": UINT16, "uint32": UINT32, "int32": INT32,
    "uint64": UINT64, "int64": INT64, "float16": FLOAT16, "float32": FLOAT, "float64": DOUBLE,
}
_TORCH = {
    "torch.uint8": UINT8, "torch.int8": INT8, "torch.int16": INT16, "torch.uint16": UINT16,
    "torch.uint32": UINT32, "torch.int32": INT32, "torch.uint64": UINT64, "torch.int64": INT64,
    "torch.float16": FLOAT16, "torch.bfloat16": BFLOAT16, "torch.float32": FLOAT, "torch.float64": DOUBLE,
}


@dataclass
class Buffer:
    """The memory of an array or tensor: its address, element count and element type. ``owner``
    keeps the object alive while the library uses the memory."""

    ptr: int
    count: int
    dtype: int
    nbytes: int
    owner: Any


def _is_torch(x: Any) -> bool:
    mod = sys.modules.get("torch")
    return mod is not None and isinstance(x, mod.Tensor)


def _is_numpy(x: Any) -> bool:
    mod = sys.modules.get("numpy")
    return mod is not None and isinstance(x, mod.ndarray)


def buffer(x: Any, what: str = "buffer", writable: bool = True) -> Buffer:
    """Returns the Buffer of a contiguous numpy array or torch CPU tensor, used in place."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise InvalidError(f"{what}: torch tensor on {x.device}; collectives take CPU tensors (stage to host)")
        if not x.is_contiguous():
            raise InvalidError(f"{what}: torch tensor is not contiguous")
        dt = _TORCH.get(str(x.dtype))
        if dt is None:
            raise InvalidError(f"{what}: unsupported torch dtype {x.dtype}")
        return Buffer(x.data_ptr(), x.numel(), dt, x.numel() * x.element_size(), x)
    if _is_numpy(x):
        if not x.flags["C_CONTIGUOUS"]:
            raise InvalidError(f"{what}: numpy array is not C-contiguous")
        if writable and not x.flags["WRITEABLE"]:
            raise InvalidError(f"{what}: numpy array is read-only")
        dt = _NUMPY.get(x.dtype.name)
        if dt is None:
            raise InvalidError(f"{what}: unsupported numpy dtype {x.dtype}")
        return Buffer(x.ctypes.data, x.size, dt, x.nbytes, x)
    raise InvalidError(f"{what}: want a numpy.ndarray or a torch.Tensor, got {type(x).__name__}")
