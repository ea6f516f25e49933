"""Thin, fast CUDA driver helpers: async copies, memset, kernel launch, error checking.

Copies, memsets and module loads go straight to ``libcuda`` through ``ctypes`` with declared
argument types. The hot path, a kernel launch with everything but the stream fixed, goes
through a Cython binding when one is installed: CuPy's ``launchKernel`` (typed C
arguments), else ``cuda.bindings``; ctypes with declared argument types is the slowest of
the three (it converts all eleven arguments on every call), and ``cuda.bindings`` builds
Python objects that CuPy's wrapper does not (docs/design/launch.md has the figures). Every
non-zero ``CUresult`` raises :class:`DriverError` with the driver's error name.

In the Numba CUDA simulator "device pointers" are host pointers, so the copies fall back
to ``ctypes.memmove``/``memset`` and launches never come here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable
from typing import Any

from ._runtime import SIMULATOR
from .errors import DriverError

__all__ = [
    "CU_ERROR_INVALID_CONTEXT",
    "CU_ERROR_INVALID_HANDLE",
    "check",
    "context_current",
    "context_device",
    "context_pop",
    "context_push",
    "context_set_current",
    "device_count",
    "driver_version",
    "launch_kernel",
    "libcuda",
    "load_function",
    "memcpy_2d_async",
    "memcpy_dtod_async",
    "function_registers",
    "memset_d8_async",
    "pointer_device",
    "pointer_launcher",
    "primary_context",
    "retry_launch",
    "stream_context",
    "stream_capturing",
    "stream_synchronize",
]

CU_ERROR_INVALID_CONTEXT = 201
CU_ERROR_NOT_INITIALIZED = 3
CU_ERROR_INVALID_HANDLE = 400
_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
_CU_MEMORYTYPE_DEVICE = 2

_size_t = ctypes.c_size_t
_ptr = ctypes.c_void_p
_u64 = ctypes.c_uint64
_uint = ctypes.c_uint


class _Memcpy2D(ctypes.Structure):
    _fields_ = [
        ("srcXInBytes", _size_t), ("srcY", _size_t), ("srcMemoryType", ctypes.c_int),
        ("srcHost", _ptr), ("srcDevice", _u64), ("srcArray", _ptr), ("srcPitch", _size_t),
        ("dstXInBytes", _size_t), ("dstY", _size_t), ("dstMemoryType", ctypes.c_int),
        ("dstHost", _ptr), ("dstDevice", _u64), ("dstArray", _ptr), ("dstPitch", _size_t),
        ("WidthInBytes", _size_t), ("Height", _size_t),
    ]


@functools.cache
def libcuda() -> ctypes.CDLL:
    """The CUDA driver library with the signatures this package calls."""
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    lib = ctypes.CDLL(name)
    lib.cuLaunchKernel.argtypes = [_ptr, _uint, _uint, _uint, _uint, _uint, _uint, _uint,
                                   _ptr, _ptr, _ptr]
    lib.cuLaunchCooperativeKernel.argtypes = [_ptr, _uint, _uint, _uint, _uint, _uint, _uint,
                                              _uint, _ptr, _ptr]
    lib.cuMemcpyDtoDAsync_v2.argtypes = [_u64, _u64, _size_t, _ptr]
    lib.cuMemcpy2DAsync_v2.argtypes = [ctypes.POINTER(_Memcpy2D), _ptr]
    lib.cuMemsetD8Async.argtypes = [_u64, ctypes.c_ubyte, _size_t, _ptr]
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuModuleLoadData.argtypes = [ctypes.POINTER(_ptr), ctypes.c_char_p]
    lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(_ptr), _ptr, ctypes.c_char_p]
    lib.cuFuncGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, _ptr]
    lib.cuFuncSetAttribute.argtypes = [_ptr, ctypes.c_int, ctypes.c_int]
    lib.cuStreamIsCapturing.argtypes = [_ptr, ctypes.POINTER(ctypes.c_int)]
    lib.cuStreamSynchronize.argtypes = [_ptr]
    lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [
        ctypes.POINTER(ctypes.c_int), _ptr, ctypes.c_int, _size_t]
    lib.cuInit.argtypes = [_uint]
    lib.cuDeviceGetCount.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(_ptr), ctypes.c_int]
    lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(_ptr)]
    lib.cuCtxSetCurrent.argtypes = [_ptr]
    lib.cuCtxPushCurrent_v2.argtypes = [_ptr]
    lib.cuCtxPopCurrent_v2.argtypes = [ctypes.POINTER(_ptr)]
    lib.cuCtxGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.cuPointerGetAttribute.argtypes = [_ptr, ctypes.c_int, _u64]
    lib.cuStreamGetCtx.argtypes = [_ptr, ctypes.POINTER(_ptr)]
    return lib


def check(code: int, what: str) -> None:
    """Raise :class:`DriverError` unless ``code`` is CUDA_SUCCESS."""
    if code:
        name = ctypes.c_char_p()
        try:
            libcuda().cuGetErrorName(code, ctypes.byref(name))
        except OSError:
            pass
        label = name.value.decode() if name.value else "unknown"
        raise DriverError(f"{what} failed with {label}", code)


def memcpy_dtod_async(dst: int, src: int, nbytes: int, stream: int) -> None:
    """Copy ``nbytes`` from device ``src`` to device ``dst`` on ``stream`` (no sync)."""
    if nbytes <= 0:
        return
    if SIMULATOR:
        ctypes.memmove(dst, src, nbytes)
        return
    check(libcuda().cuMemcpyDtoDAsync_v2(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")


def memcpy_2d_async(dst: int, dst_pitch: int, src: int, src_pitch: int, width_bytes: int,
                    height: int, stream: int) -> None:
    """Copy ``height`` rows of ``width_bytes`` between pitched device regions (no sync)."""
    if width_bytes <= 0 or height <= 0:
        return
    if SIMULATOR:
        for row in range(height):
            ctypes.memmove(dst + row * dst_pitch, src + row * src_pitch, width_bytes)
        return
    params = _Memcpy2D(srcMemoryType=_CU_MEMORYTYPE_DEVICE, srcDevice=src, srcPitch=src_pitch,
                       dstMemoryType=_CU_MEMORYTYPE_DEVICE, dstDevice=dst,
                       dstPitch=dst_pitch, WidthInBytes=width_bytes, Height=height)
    check(libcuda().cuMemcpy2DAsync_v2(ctypes.byref(params), stream), "cuMemcpy2DAsync")


def memset_d8_async(dst: int, value: int, nbytes: int, stream: int) -> None:
    """Set ``nbytes`` bytes at device ``dst`` to ``value`` on ``stream`` (no sync)."""
    if nbytes <= 0:
        return
    if SIMULATOR:
        ctypes.memset(dst, value, nbytes)
        return
    check(libcuda().cuMemsetD8Async(dst, value, nbytes, stream), "cuMemsetD8Async")


def stream_capturing(stream: int) -> bool:
    """Whether ``stream`` is being captured into a CUDA graph (``cuStreamIsCapturing``).
    An error (the legacy stream while another stream captures in global mode) counts as
    capturing: the caller then avoids allocations and synchronisation."""
    if SIMULATOR:
        return False
    status = ctypes.c_int()
    code = libcuda().cuStreamIsCapturing(stream, ctypes.byref(status))
    return bool(code) or status.value != 0


def stream_synchronize(stream: int) -> None:
    """Block the host until ``stream``'s work is done."""
    if SIMULATOR:
        return
    check(libcuda().cuStreamSynchronize(stream), "cuStreamSynchronize")


# -- devices and contexts (the several-device path of :mod:`baracuda_numba.devices`) ----


def device_count() -> int:
    """How many CUDA devices this process sees (``cuDeviceGetCount``); 0 without a driver."""
    try:
        lib = libcuda()
    except OSError:
        return 0
    count = ctypes.c_int()
    if lib.cuInit(0) or lib.cuDeviceGetCount(ctypes.byref(count)):
        return 0
    return count.value


def primary_context(ordinal: int) -> int:
    """The primary context of device ``ordinal`` (the one the CUDA runtime, torch, CuPy and
    Numba use), retained for the life of the process."""
    lib = libcuda()
    device = ctypes.c_int()
    check(lib.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
    context = _ptr()
    check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device.value),
          "cuDevicePrimaryCtxRetain")
    return context.value or 0


def context_current() -> int:
    """The calling thread's current ``CUcontext`` (0: none, also before the driver's
    ``cuInit``: a fresh process that loads a kernel before any other CUDA call)."""
    context = _ptr()
    code = libcuda().cuCtxGetCurrent(ctypes.byref(context))
    if code == CU_ERROR_NOT_INITIALIZED:
        return 0
    check(code, "cuCtxGetCurrent")
    return context.value or 0


def context_set_current(context: int) -> None:
    """Make ``context`` the calling thread's current context (replacing the top of its
    stack)."""
    check(libcuda().cuCtxSetCurrent(context), "cuCtxSetCurrent")


def context_push(context: int) -> None:
    """Push ``context`` on the calling thread's context stack (current until popped)."""
    check(libcuda().cuCtxPushCurrent_v2(context), "cuCtxPushCurrent")


def context_pop() -> None:
    """Pop the calling thread's current context (the one pushed last)."""
    popped = _ptr()
    check(libcuda().cuCtxPopCurrent_v2(ctypes.byref(popped)), "cuCtxPopCurrent")


def context_device(context: int) -> int:
    """The device ordinal of ``context`` (made current for the query if it is not)."""
    lib = libcuda()
    device = ctypes.c_int()
    if context and context != context_current():
        context_push(context)
        try:
            check(lib.cuCtxGetDevice(ctypes.byref(device)), "cuCtxGetDevice")
        finally:
            context_pop()
    else:
        check(lib.cuCtxGetDevice(ctypes.byref(device)), "cuCtxGetDevice")
    return device.value


def pointer_device(pointer: int) -> int | None:
    """The device ordinal that holds device (or managed) memory at ``pointer``
    (``CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL``); None where the driver does not know the
    address (host memory not registered with CUDA)."""
    ordinal = ctypes.c_int()
    code = libcuda().cuPointerGetAttribute(ctypes.byref(ordinal),
                                           _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, pointer)
    return None if code else ordinal.value


def stream_context(stream: int) -> int:
    """The context ``stream`` belongs to (``cuStreamGetCtx``)."""
    context = _ptr()
    check(libcuda().cuStreamGetCtx(stream, ctypes.byref(context)), "cuStreamGetCtx")
    return context.value or 0


def retry_launch(code: Any, context: int, attempt: Callable[..., Any],
                 arguments: tuple[Any, ...], what: str) -> None:
    """After a launch of a function loaded in ``context`` returned ``code``: retry
    ``attempt(*arguments)`` (the same launch, returning its ``CUresult``) once where the
    failure is the calling thread's context, else raise :class:`DriverError`.

    * no context current (the first launch from a new thread): make ``context`` current,
      retry in place (later launches from the thread then need no retry);
    * ``context`` is current already (a thread whose context was made current since):
      retry in place;
    * another context is current (another device's): push ``context``, retry, pop, so the
      caller's current device is what it was.

    A retry that fails raises with its own ``CUresult``."""
    code = int(code)
    if code in (CU_ERROR_INVALID_CONTEXT, CU_ERROR_INVALID_HANDLE) and context:
        current = context_current()
        if current == 0:
            context_set_current(context)
            code = int(attempt(*arguments))
        elif current == context:
            if code == CU_ERROR_INVALID_CONTEXT:
                code = int(attempt(*arguments))
        else:
            context_push(context)
            try:
                code = int(attempt(*arguments))
            finally:
                context_pop()
    check(code, what)


_modules: list[int] = []  # loaded modules stay loaded for the life of the process


@functools.cache
def driver_version() -> int:
    """The CUDA driver's version (``cuDriverGetVersion``: 12040 for 12.4); 0 where no driver
    is found."""
    try:
        lib = libcuda()
    except OSError:
        return 0
    version = ctypes.c_int()
    return version.value if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 else 0


def load_function(cubin: bytes, name: bytes) -> int:
    """Load ``cubin`` into the current context and return its function ``name``."""
    lib = libcuda()
    module = _ptr()
    check(lib.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
    function = _ptr()
    check(lib.cuModuleGetFunction(ctypes.byref(function), module, name),
          "cuModuleGetFunction")
    _modules.append(module.value or 0)
    return function.value or 0


def set_max_dynamic_shared(function: int, nbytes: int) -> None:
    """Allow launches of ``function`` with up to ``nbytes`` of dynamic shared memory
    (``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``; needed above 48 KiB, up to the
    device's opt-in limit: 227 KiB on sm_90)."""
    check(libcuda().cuFuncSetAttribute(function, 8, int(nbytes)), "cuFuncSetAttribute")


def function_static_shared(function: int) -> int:
    """Bytes of static shared memory per block of a loaded ``CUfunction``
    (``CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES``)."""
    value = ctypes.c_int()
    check(libcuda().cuFuncGetAttribute(ctypes.byref(value), 1, function),
          "cuFuncGetAttribute")
    return value.value


def max_active_blocks(function: int, block: int, dynamic_shared: int = 0) -> int:
    """Blocks of ``block`` threads (and ``dynamic_shared`` bytes) of ``function`` that one
    SM holds at once (``cuOccupancyMaxActiveBlocksPerMultiprocessor``)."""
    value = ctypes.c_int()
    check(libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(value), function, int(block), int(dynamic_shared)),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor")
    return value.value


def function_registers(function: int) -> int:
    """Registers per thread of a loaded ``CUfunction`` (``CU_FUNC_ATTRIBUTE_NUM_REGS``)."""
    value = ctypes.c_int()
    check(libcuda().cuFuncGetAttribute(ctypes.byref(value), 4, function),
          "cuFuncGetAttribute")
    return value.value


def launch_kernel(function: int, grid: tuple[int, int, int], block: tuple[int, int, int],
                  shared_bytes: int, stream: int, params: int | None,
                  extra: int | None = None, cooperative: bool = False) -> int:
    """``cuLaunchKernel`` with either ``params`` (a ``void*[]`` of parameter pointers) or
    ``extra`` (a ``CU_LAUNCH_PARAM_BUFFER_*`` list); returns the raw ``CUresult``.
    ``cooperative``: ``cuLaunchCooperativeKernel`` (``params`` only), whose blocks are
    all resident at once (a grid larger than the device holds fails instead)."""
    if cooperative:
        assert not extra
        return libcuda().cuLaunchCooperativeKernel(function, grid[0], grid[1], grid[2],
                                                   block[0], block[1], block[2],
                                                   shared_bytes, stream, params)
    return libcuda().cuLaunchKernel(function, grid[0], grid[1], grid[2], block[0], block[1],
                                    block[2], shared_bytes, stream, params, extra)


@functools.cache
def launcher() -> tuple[str, Any]:
    """The ``cuLaunchKernel`` binding of :func:`pointer_launcher`: ``("cupy", CuPy's
    launchKernel)``, ``("bindings", cuda.bindings.driver)`` or ``("ctypes", libcuda())``.

    The default takes the first one installed, in that order: CuPy's Cython wrapper has
    typed C integer arguments, the cheapest call (``cuda.bindings`` builds Python objects
    for the stream, the parameters and the result).
    ``$BARACUDA_LAUNCHER`` = ``cupy``, ``bindings`` or ``ctypes`` picks one (falling back
    down the list when it is not installed). Cached: ``launcher.cache_clear()`` re-reads
    the variable for launchers generated after it."""
    choice = os.environ.get("BARACUDA_LAUNCHER", "").lower()
    if choice in ("", "cupy"):
        try:  # the driver module alone: no ``import cupy``
            from cupy_backends.cuda.api import driver as cupy_driver

            return "cupy", cupy_driver
        except Exception:  # not installed, or a build that does not load here
            pass
    if choice in ("", "cupy", "bindings"):
        try:
            from cuda.bindings import driver
        except Exception:
            pass
        else:
            return "bindings", driver
    return "ctypes", libcuda()


def pointer_launcher(function: int, grid: tuple[int, int, int], block: tuple[int, int, int],
                     shared_bytes: int, params: int, extra: int, slots: list[Any],
                     lock: Any, direct: list[bool], fallback: Callable[..., None],
                     failed: Callable[..., None], order: tuple[str, ...] | None = None,
                     arity: int = 0, cooperative: bool = False,
                     binding: tuple[str, Any] | None = None) -> Callable[..., None]:
    """``launch(stream, pointer_0, ..., pointer_n-1)`` for one kernel, launch shape and
    parameter block, generated as one flat Python function (the host cost of every
    ``run``): under ``lock`` it writes the pointers into ``slots`` (``ctypes.c_uint64``
    views of the block) and calls ``cuLaunchKernel`` (through the binding
    :func:`launcher` picks) with ``params`` (address of a ``void*[]``) or ``extra`` (a
    ``CU_LAUNCH_PARAM_BUFFER_*`` list); exactly one of them is non-zero. While
    ``direct[0]`` is false it calls ``fallback(stream, *pointers)`` instead; a non-zero
    ``CUresult`` goes to ``failed(code, stream, *pointers)`` (the pointers in slot order);
    ``launch.attempt(stream, *pointers)`` is that launch again, slot order, returning the
    ``CUresult`` (what :func:`retry_launch` retries).

    With ``order`` the function takes ``launch(stream, a0, ..., a{arity-1})`` instead
    and writes slot ``i`` from the expression ``order[i]`` (one of those names, or
    ``"0"``): a memo's arrays in their own order, with no frame in between to reorder
    them. ``cooperative``: ``cuLaunchCooperativeKernel`` through ctypes (``params``
    only), for kernels whose blocks wait on each other. ``binding``: the ``(kind,
    module)`` to call instead of :func:`launcher`'s (a test's stand-in driver).

    Generated code rather than a generic ``__call__`` (a ``with lock`` block, a loop over
    the slots and a closure around the driver call): close to the bare driver call's host
    time (docs/design/launch.md)."""
    gx, gy, gz = grid
    bx, by, bz = block
    names = [f"p{i}" for i in range(len(slots))] if order is None else list(order)
    parameters = names if order is None else [f"a{i}" for i in range(arity)]
    namespace: dict[str, Any] = {"direct": direct, "fallback": fallback, "failed": failed,
                                 "acquire": lock.acquire, "release": lock.release}
    kind, binding = launcher() if binding is None else binding
    shape = f"{gx}, {gy}, {gz}, {bx}, {by}, {bz}, {shared_bytes}, stream"
    if cooperative:
        assert params and not extra
        namespace["call"], namespace["F"] = libcuda().cuLaunchCooperativeKernel, function
        call = f"        code = call(F, {shape}, {params})\n"
    elif kind == "cupy":  # raises CUDADriverError (its .status: the CUresult)
        namespace["call"], namespace["F"] = binding.launchKernel, function
        namespace["DriverFailure"] = binding.CUDADriverError
        call = ("        try:\n"
                f"            call(F, {shape}, {params}, {extra})\n"
                "        except DriverFailure as error:\n"
                "            code = error.status\n"
                "        else:\n"
                "            code = 0\n")
    elif kind == "bindings":
        namespace["call"], namespace["F"] = binding.cuLaunchKernel, binding.CUfunction(function)
        call = f"        code = call(F, {shape}, {params}, {extra})[0]\n"
    else:
        namespace["call"], namespace["F"] = binding.cuLaunchKernel, function
        call = f"        code = call(F, {shape}, {params or None}, {extra or None})\n"
    writes = ""
    for i, slot in enumerate(slots):
        namespace[f"s{i}"] = slot
        writes += f"        s{i}.value = {names[i]}\n"
    arguments = ", ".join(["stream", *names])
    slot_names = [f"p{i}" for i in range(len(slots))]
    attempt_writes = "".join(f"        s{i}.value = p{i}\n" for i in range(len(slots)))
    source = (f"def launch({', '.join(['stream', *parameters])}):\n"
              f"    if not direct[0]:\n"
              f"        return fallback({arguments})\n"
              f"    acquire()\n"
              f"    try:\n{writes}{call}"
              f"    finally:\n"
              f"        release()\n"
              f"    if code:\n"
              f"        failed(code, {arguments})\n"
              f"def attempt({', '.join(['stream', *slot_names])}):\n"
              f"    acquire()\n"
              f"    try:\n{attempt_writes}{call}"
              f"    finally:\n"
              f"        release()\n"
              f"    return code\n")
    exec(compile(source, f"<launch of CUfunction {function:#x}>", "exec"), namespace)
    launch = namespace["launch"]
    launch.attempt = namespace["attempt"]
    return launch
