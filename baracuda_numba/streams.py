"""Normalise any framework's stream to a raw ``CUstream`` handle (an int).

Accepted: ``None`` (the legacy default stream, handle 0), an int handle, a Numba stream,
a ``torch.cuda.Stream``, a CuPy stream, or anything with ``__cuda_stream__``. The handle
is computed once per stream object and cached (the object is kept alive by the cache so
its ``id`` cannot be reused while cached). Nothing here synchronises.
"""

from __future__ import annotations

import threading
from typing import Any

from . import devices, driver
from ._runtime import SIMULATOR

__all__ = ["stream_device", "stream_handle"]

_CACHE_LIMIT = 256
_cache: dict[int, tuple[Any, int]] = {}
_lock = threading.Lock()


def _resolve(stream: Any) -> int:
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        _version, handle = protocol() if callable(protocol) else protocol
        return int(handle)
    for attribute in ("cuda_stream", "ptr", "handle"):  # torch, CuPy, Numba
        handle = getattr(stream, attribute, None)
        if handle is not None:
            value = getattr(handle, "value", handle)  # Numba ctypes handles
            return int(value or 0)
    raise TypeError(f"stream_handle: {type(stream).__name__} is not a CUDA stream (expected "
                    "None, an int, or a torch/CuPy/Numba stream or __cuda_stream__ object)")


def stream_handle(stream: Any) -> int:
    """The raw ``CUstream`` of ``stream`` (0 for ``None``)."""
    if stream is None:
        return 0
    if type(stream) is int:
        return stream
    entry = _cache.get(id(stream))
    if entry is not None and entry[0] is stream:
        return entry[1]
    handle = _resolve(stream)
    with _lock:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()
        _cache[id(stream)] = (stream, handle)
    return handle


def stream_device(stream: Any) -> int | None:
    """The device ordinal of ``stream`` (torch: ``device.index``, CuPy: ``device_id``, a raw
    handle or another stream object: its context's device); None for the default streams
    (``None``, 0, 1, 2: each context has its own, so they follow the context a launch
    runs in) and in the simulator."""
    if stream is None:
        return None
    if type(stream) is not int:
        index = getattr(getattr(stream, "device", None), "index", None)  # torch
        if index is not None:
            return int(index)
        device_id = getattr(stream, "device_id", None)  # CuPy
        if device_id is not None:
            return int(device_id)
        stream = stream_handle(stream)
    if stream in (0, 1, 2) or SIMULATOR:
        return None
    return devices.context_device(driver.stream_context(stream))
