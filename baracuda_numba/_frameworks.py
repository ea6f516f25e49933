"""Which framework an array belongs to, and how to allocate like it (no eager imports).

Used by the functional API: outputs are allocated with the input's own framework on the
input's device (torch -> torch, CuPy -> CuPy, Numba/simulator -> Numba device array), and
the default stream is that framework's current stream.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from .arrays import array_device, contiguous_strides
from .types import ElementKind

__all__ = ["allocator", "device_token", "element_of", "framework_of", "stream_source"]

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


def _torch_dtype(element: ElementKind) -> Any:
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
    return _TORCH_DTYPES[element]


def allocator(like: Any, shape: tuple[int, ...], element: ElementKind, *,
              contiguous: bool = False) -> Callable[[Any], Any]:
    """A function ``alloc(like)`` that allocates an uninitialised array of ``shape`` /
    ``element`` in ``like``'s framework and on its device; everything but the allocation
    is resolved now, so the functional API builds it once per call site (and calls it with
    arrays of the same type, shape, dtype and device).

    torch: ``torch.empty_like(like)`` where shape and dtype are ``like``'s (it keeps a dense
    input's strides, as torch's own ops do); else ``torch.empty_like(template)``, with a
    template of the output's shape, dtype and device that holds at most one element
    (zero strides make it overlapping, so the copy comes out contiguous; a template of at
    most one element has contiguous strides itself): the same tensor as
    ``torch.empty(*shape, dtype=, device=)`` without parsing the keywords (about half its
    host time; ``like.new_empty(shape, dtype=)`` is slower still). ``contiguous=True``
    always allocates row-major (never ``like``'s strides)."""
    kind = framework_of(like)
    if kind == "torch":
        import torch

        dtype, device = _torch_dtype(element), like.device
        if tuple(like.shape) == tuple(shape) and like.dtype == dtype and not contiguous:
            return torch.empty_like
        numel = 1
        for extent in shape:
            numel *= extent
        strides = contiguous_strides(shape) if numel <= 1 else (0,) * len(shape)
        template = torch.empty_strided(shape, strides, dtype=dtype, device=device)
        empty_like = torch.empty_like

        def alloc(_like: Any) -> Any:
            return empty_like(template)

        alloc.template = template  # type: ignore[attr-defined]
        return alloc
    if kind == "cupy":
        import cupy

        device_id = like.device.id
        dtype = like.dtype if element is ElementKind.BF16 and element_of(like) is element \
            else (np.uint16 if element is ElementKind.BF16 else element.storage_dtype)

        def cupy_empty(_like: Any) -> Any:
            with cupy.cuda.Device(device_id):
                return cupy.empty(shape, dtype=dtype)

        return cupy_empty
    from numba import cuda

    from . import devices

    if devices.several():  # Numba allocates in the current context: make it like's
        device = array_device(like)

        def numba_empty(_like: Any) -> Any:
            with devices.on(device):
                return cuda.device_array(shape, dtype=element.storage_dtype)

        return numba_empty
    return lambda _like: cuda.device_array(shape, dtype=element.storage_dtype)


_RAW_STREAM: list[Any] = []


def _torch_raw_stream() -> Any:
    if not _RAW_STREAM:
        import torch

        _RAW_STREAM.append(getattr(torch._C, "_cuda_getCurrentRawStream", None))
    return _RAW_STREAM[0]


def _cupy_stream() -> int:
    import cupy

    return cupy.cuda.get_current_stream().ptr


def _cupy_device_stream(device_id: int) -> Callable[[], int]:
    """CuPy's current stream of device ``device_id`` (several devices: not the current
    device's)."""
    import cupy

    def current() -> int:
        with cupy.cuda.Device(device_id):
            return cupy.cuda.get_current_stream().ptr

    return current


def _legacy_stream() -> int:
    return 0


def stream_source(like: Any) -> Callable[[], Any]:
    """A zero-argument function returning the framework's current stream for ``like``'s
    device (0, the legacy default stream, for Numba arrays)."""
    kind = framework_of(like)
    if kind == "torch":
        raw = _torch_raw_stream()
        if raw is not None:  # the raw handle without building a torch.cuda.Stream
            return partial(raw, like.get_device())
        import torch

        device = like.device
        return lambda: torch.cuda.current_stream(device).cuda_stream
    if kind == "cupy":
        from . import devices

        return _cupy_device_stream(like.device.id) if devices.several() else _cupy_stream
    return _legacy_stream


_DEVICE_TOKENS: dict[type, Callable[[Any], Any]] = {}


def device_token(like: Any) -> Any:
    """A hashable token of ``like``'s device (torch: ``.get_device()``; CuPy: the device id;
    Numba: None, arrays live on the current context's device, unless several devices are
    visible: then the device holding the pointer); one dict lookup and one call per array
    after the first of its type."""
    token = _DEVICE_TOKENS.get(type(like))
    if token is None:
        kind = framework_of(like)
        if kind == "torch":
            def token(a: Any) -> Any:
                return a.get_device()  # an int (-1: CPU); cheaper than building .device
        elif kind == "cupy":
            def token(a: Any) -> Any:
                return a.device.id
        else:
            from . import devices

            def token(a: Any) -> Any:  # several devices: the one holding the pointer
                return array_device(a) if devices.several() else None
        _DEVICE_TOKENS[type(like)] = token
    return token(like)
