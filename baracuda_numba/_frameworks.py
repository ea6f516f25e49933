"""Which framework an array belongs to, and how to allocate like it (no eager imports).

Used by the functional API: outputs are allocated with the input's own framework on the
input's device (torch -> torch, CuPy -> CuPy, Numba/simulator -> Numba device array), and
the default stream is that framework's current stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .types import ElementKind

__all__ = ["current_stream", "element_of", "empty", "framework_of"]

_KINDS: dict[type, str] = {}


def framework_of(array: Any) -> str:
    """'torch', 'cupy' or 'numba' (Numba device arrays and the simulator's arrays)."""
    cls = type(array)
    found = _KINDS.get(cls)
    if found is None:
        names = {c.__module__.split(".")[0] for c in cls.__mro__}
        if "torch" in names:
            found = "torch"
        elif "cupy" in names:
            found = "cupy"
        else:
            found = "numba"
        _KINDS[cls] = found
    return found


_ELEMENTS: dict[Any, ElementKind] = {}


def element_of(array: Any) -> ElementKind:
    """The element kind of an array's dtype (bf16 from torch/ml_dtypes included); cached
    per dtype object."""
    dtype = array.dtype
    found = _ELEMENTS.get(dtype)
    if found is None:
        found = _ELEMENTS[dtype] = ElementKind.from_dtype(getattr(dtype, "name", None)
                                                          or str(dtype))
    return found


_TORCH_DTYPES: dict[ElementKind, Any] = {}


def empty(like: Any, shape: tuple[int, ...], element: ElementKind) -> Any:
    """An uninitialised array of ``shape``/``element`` in ``like``'s framework and device."""
    kind = framework_of(like)
    if kind == "torch":
        import torch

        if not _TORCH_DTYPES:
            _TORCH_DTYPES.update({
                ElementKind.F16: torch.float16, ElementKind.BF16: torch.bfloat16,
                ElementKind.F32: torch.float32, ElementKind.F64: torch.float64,
                ElementKind.I32: torch.int32, ElementKind.I64: torch.int64,
                ElementKind.S8: torch.int8, ElementKind.U8: torch.uint8,
                ElementKind.BOOL: torch.bool, ElementKind.COMPLEX32: torch.complex64,
                ElementKind.COMPLEX64: torch.complex128,
            })
        return like.new_empty(shape, dtype=_TORCH_DTYPES[element])
    if kind == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            if element is ElementKind.BF16:
                return cupy.empty(shape, dtype=like.dtype if element_of(like) is element
                                  else np.uint16)
            return cupy.empty(shape, dtype=element.storage_dtype)
    from numba import cuda

    return cuda.device_array(shape, dtype=element.storage_dtype)


_RAW_STREAM: list[Any] = []


def _torch_raw_stream() -> Any:
    if not _RAW_STREAM:
        import torch

        _RAW_STREAM.append(getattr(torch._C, "_cuda_getCurrentRawStream", None))
    return _RAW_STREAM[0]


def current_stream(like: Any) -> Any:
    """The framework's current stream for ``like``'s device (0: Numba's default stream)."""
    kind = framework_of(like)
    if kind == "torch":
        raw = _torch_raw_stream()
        if raw is not None:  # the raw handle without building a torch.cuda.Stream (~0.3 µs)
            return raw(like.get_device())
        import torch

        return torch.cuda.current_stream(like.device).cuda_stream
    if kind == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return 0
