"""Several GPUs in one process: which device an array or a stream is on, and running there.

A ``CUfunction`` belongs to one CUDA context, device memory to one device and a stream to
one context. When the process sees several devices (one process driving several GPUs, or
a ``torchrun`` rank that was not restricted to its own GPU), every plan is bound to the
device current when it was selected (its kernels, tables and layout memos live there):
``run`` checks that every array and the stream are on that device and launches in that
device's primary context, whatever the caller's current device is.

The decision is taken once, at first use (:func:`several`): a process that sees one
device (or the simulator) runs none of this per call: no wrapper is generated, no
device is read. :func:`force_several_devices` turns the several-device path on anyway
(tests: ``pytest --several-devices``; a one-GPU machine proves the checked path gives the
same results).

Device of an array: torch ``get_device()``, CuPy ``device.id``, a :class:`TensorRef`
its owner's, anything else (Numba device arrays, ``__cuda_array_interface__``) the
driver's ``CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`` of its pointer
(:func:`pointer_device`). Device of a stream: torch ``device.index``, CuPy ``device_id``,
a raw handle the device of its context; the legacy and per-thread default streams (0, 1,
2, ``None``) have none: they are the current context's, so they follow the launch.

In the simulator a device is a number kept per thread (:func:`current_device`,
:func:`on`); :func:`pointer_device` gives device 0 there (tests replace it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from . import driver
from ._runtime import SIMULATOR
from .errors import InvalidProblem

__all__ = ["array_device", "check_devices", "context_device", "current_context",
           "current_device",
           "force_several_devices", "on", "pointer_device", "several", "stream_device"]

#: ``[decision]``: None until :func:`several` first runs.
_SEVERAL: list[bool | None] = [None]
_SIM = threading.local()  # the simulator's current device, per thread
_CONTEXTS: dict[int, int] = {}  # device ordinal -> retained primary context
_CONTEXT_DEVICES: dict[int, int] = {}  # CUcontext -> device ordinal (asked once each)
_LOCK = threading.Lock()


def several() -> bool:
    """Whether the several-device path is on: the process sees more than one device
    (``cuDeviceGetCount``, read once), or :func:`force_several_devices` said so. False
    in the simulator unless forced."""
    found = _SEVERAL[0]
    if found is None:
        found = _SEVERAL[0] = (not SIMULATOR) and driver.device_count() > 1
    return found


def force_several_devices(enabled: bool | None = True) -> bool | None:
    """Turn the several-device path on (``True``), off (``False``), or back to what the
    device count says (``None``); returns the setting it replaces (pass it back to
    restore). Takes effect for plans selected afterwards (a plan decides when it is
    built; the functional layer's cached plans stay as they were built:
    ``ops.clear_plan_cache()``)."""
    previous = _SEVERAL[0]
    _SEVERAL[0] = enabled
    return previous


def current_context() -> int:
    """The calling thread's current ``CUcontext``, after making Numba's (device 0's
    primary context, or the current device's) current where none is."""
    context = driver.context_current()
    if context == 0:
        from numba import cuda

        cuda.current_context()
        context = driver.context_current()
    return context


def current_device() -> int:
    """The calling thread's current device (the device of its current context; 0 where
    none is current, the device a first CUDA call would pick)."""
    if SIMULATOR:
        return getattr(_SIM, "device", 0)
    context = driver.context_current()
    return context_device(context) if context else 0


def context_device(context: int) -> int:
    """The device of ``context``, asked of the driver once per context (a context keeps
    its device; primary contexts live as long as the process)."""
    found = _CONTEXT_DEVICES.get(context)
    if found is None:
        if len(_CONTEXT_DEVICES) > 256:
            _CONTEXT_DEVICES.clear()
        found = _CONTEXT_DEVICES[context] = driver.context_device(context)
    return found


def primary_context(device: int) -> int:
    """The primary context of ``device`` (retained once per process)."""
    context = _CONTEXTS.get(device)
    if context is None:
        with _LOCK:
            context = _CONTEXTS.get(device)
            if context is None:
                context = _CONTEXTS[device] = driver.primary_context(device)
    return context


class on:  # noqa: N801 (used as a context manager, like a function)
    """``with on(device):`` runs its body with ``device``'s primary context current: pushed
    when another context is current, popped at the end (nothing when it is current
    already). ``device`` None: nothing."""

    __slots__ = ("_device", "_pushed", "_previous")

    def __init__(self, device: int | None) -> None:
        self._device = device
        self._pushed = False
        self._previous = 0

    def __enter__(self) -> on:
        device = self._device
        if device is None:
            return self
        if SIMULATOR:
            self._previous = getattr(_SIM, "device", 0)
            _SIM.device = device
            return self
        context = primary_context(device)
        if driver.context_current() != context:
            driver.context_push(context)
            self._pushed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._device is None:
            return
        if SIMULATOR:
            _SIM.device = self._previous
        elif self._pushed:
            self._pushed = False
            driver.context_pop()


def pointer_device(pointer: int) -> int | None:
    """The device holding memory at ``pointer`` (None: the driver does not know it). The
    simulator's "device memory" is host memory: device 0."""
    if SIMULATOR:
        return 0
    return driver.pointer_device(pointer)


def _torch_device(array: Any) -> int | None:
    index = array.get_device()
    return None if index < 0 else index


def _cupy_device(array: Any) -> int | None:
    return array.device.id


def _ref_device(array: Any) -> int | None:
    owner = array.owner
    if owner is not None and owner is not array:
        return array_device(owner)
    return pointer_device(array.ptr)


def _numba_device(array: Any) -> int | None:
    return pointer_device(array.device_ctypes_pointer.value or 0)


def _interface_device(array: Any) -> int | None:
    try:
        interface = array.__cuda_array_interface__
    except RuntimeError:  # torch, requires_grad
        interface = array.detach().__cuda_array_interface__
    return pointer_device(interface["data"][0] or 0)


def _numpy_device(array: Any) -> int | None:  # simulator: host memory stands in
    return pointer_device(array.ctypes.data)


def _simulator_array_device(array: Any) -> int | None:
    return _numpy_device(array._ary)


def _no_device(_array: Any) -> None:
    return None


_READERS: dict[type, Any] = {}


def _reader(cls: type, array: Any) -> Any:
    from .arrays import TensorRef

    names = {c.__module__.split(".")[0] + "." + c.__name__ for c in cls.__mro__}
    module = cls.__module__ or ""
    if "torch.Tensor" in names:
        found = _torch_device
    elif module.startswith("cupy") and hasattr(cls, "data"):
        found = _cupy_device
    elif issubclass(cls, TensorRef):
        found = _ref_device
    elif SIMULATOR and cls.__name__ == "FakeCUDAArray":
        found = _simulator_array_device
    elif SIMULATOR and "numpy.ndarray" in names:
        found = _numpy_device
    elif module.startswith("numba") and hasattr(cls, "device_ctypes_pointer"):
        found = _numba_device
    elif hasattr(array, "__cuda_array_interface__"):
        found = _interface_device
    else:
        found = _no_device
    _READERS[cls] = found
    return found


def array_device(array: Any) -> int | None:
    """The device ordinal of ``array`` (a torch tensor, CuPy array, Numba device array,
    :class:`~baracuda_numba.arrays.TensorRef` or ``__cuda_array_interface__`` object);
    None for anything that is not a device array (``None``, numbers, CPU tensors)."""
    if array is None:
        return None
    read = _READERS.get(type(array)) or _reader(type(array), array)
    return read(array)


def stream_device(stream: Any) -> int | None:
    """The device ordinal of ``stream``; None for the default streams (``None``, 0, 1, 2:
    each context has its own, so they follow the context a launch runs in)."""
    if stream is None:
        return None
    if type(stream) is not int:
        device = getattr(stream, "device", None)  # torch.cuda.Stream
        index = getattr(device, "index", None)
        if index is not None:
            return int(index)
        device_id = getattr(stream, "device_id", None)  # cupy.cuda.Stream
        if device_id is not None:
            return int(device_id)
        from .streams import stream_handle

        stream = stream_handle(stream)
    return handle_device(stream)


def handle_device(handle: int) -> int | None:
    """The device of the raw ``CUstream`` ``handle`` (its context's); None for the default
    streams and in the simulator (no contexts)."""
    if handle in (0, 1, 2) or SIMULATOR:
        return None
    return context_device(driver.stream_context(handle))


def check_devices(plan: str, arrays: Iterable[tuple[str, Any]], stream: Any,
                  bound: int | None) -> int | None:
    """The one device that every array (``(name, array)`` pairs; non-arrays are skipped)
    and ``stream`` are on, and that is ``bound`` (the plan's device, None: any). Raises
    :class:`~baracuda_numba.errors.InvalidProblem` naming the plan, the arguments and their
    devices otherwise. Returns None where nothing has a device."""
    where: dict[int, list[str]] = {}
    for name, array in arrays:
        device = array_device(array)
        if device is not None:
            where.setdefault(device, []).append(name)
    device = stream_device(stream)
    if device is not None:
        where.setdefault(device, []).append("stream")
    if len(where) > 1:
        listing = "; ".join(f"{', '.join(names)} on device {device}"
                            for device, names in sorted(where.items()))
        raise InvalidProblem(f"{plan}: arrays and stream must be on one device, got "
                             f"{listing}")
    if not where:
        return bound
    (device, names), = where.items()
    if bound is not None and device != bound:
        raise InvalidProblem(
            f"{plan}: {', '.join(names)} on device {device}, but this plan was selected on "
            f"device {bound} (its kernels and device state live there); select one plan "
            "per device")
    return device
