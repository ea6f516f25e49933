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

This module holds the contexts: which device is current, each device's primary context
and running in it (:func:`on`). The device of an array is read where arrays are read
(:func:`baracuda_numba.arrays.array_device`), of a stream where streams are
(:func:`baracuda_numba.streams.stream_device`); the check of a plan's arguments is
:func:`baracuda_numba.plans.base.check_devices`.

In the simulator a device is a number kept per thread (:func:`current_device`,
:func:`on`); :func:`~baracuda_numba.arrays.pointer_device` gives device 0 there (tests
replace it).
"""

from __future__ import annotations

import threading

from . import driver
from ._runtime import SIMULATOR

__all__ = ["context_device", "current_context", "current_device", "force_several_devices",
           "on", "primary_context", "several"]

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
