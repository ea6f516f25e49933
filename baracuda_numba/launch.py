"""The one launch path every plan uses.

A :class:`Kernel` is one ``@cuda.jit`` function at one explicit Numba signature. Kernel
modules create them at import (compiling nothing) and register them, so every
signature of the package is known in one place (:func:`registered_kernels`,
:func:`compile_all_ptx`). A kernel is loaded on first use (:meth:`Kernel.load`: its first
bind, launch or device query): from the cubin cache (:mod:`baracuda_numba.cubin_cache`,
one ``cuModuleLoadData``), else compiled by Numba and written there. So a plan's first
``run`` compiles only the kernels it launches, not every variant its ``select`` might
pick (:meth:`Kernel.prepare` only declares the intent). A compile that takes longer than
:data:`COMPILE_NOTICE_S` logs one line on the ``baracuda_numba`` logger. Launches:

* **direct** (default on a GPU): the arguments are packed with a precompiled
  ``struct.Struct`` into one reusable parameter buffer, in Numba's kernel ABI, and
  launched with one ``cuLaunchKernel`` on the caller's stream. No typing, no argument
  conversion, no synchronisation; capturable in a CUDA graph.
* **dispatcher** (the simulator, or ``set_launch_mode("dispatcher")``): the same
  arguments are wrapped as Numba device arrays and launched through the Numba dispatcher.
  Tests run both and compare.

Argument values by signature type:

* ``types.Array(dtype, 1, "A")``: a ``(pointer, extent)`` pair; ``extent`` counts
  elements of ``dtype`` (kernels receive flat 1-D views and index them with explicit
  strides, so one signature serves every rank and layout);
* ``types.UniTuple(int64, n)``: a tuple of ``n`` ints;
* integer, float and boolean scalars: Python numbers.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import pathlib
import re
import struct
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numba import cuda, types

from . import cubin_cache, devices
from ._runtime import SIMULATOR
from .driver import (
    check,
    driver_version,
    function_static_shared,
    launch_kernel,
    load_function,
    max_active_blocks,
    pointer_launcher,
    retry_launch,
    set_max_dynamic_shared,
)

__all__ = [
    "BoundLaunch",
    "Kernel",
    "LazyTable",
    "compile_all_ptx",
    "flat",
    "imported_kernel_sources",
    "kernel_ptx",
    "launch_mode",
    "precompile",
    "registered_kernels",
    "set_launch_mode",
    "source_digest",
]

_REGISTRY: list[Kernel] = []
_LAZY_TABLES: list[LazyTable] = []
_DISPATCHERS: dict[tuple[Callable[..., Any], int | None], Any] = {}
_mode = os.environ.get("BARACUDA_LAUNCH", "direct").strip().lower()
if _mode not in ("direct", "dispatcher"):
    raise ValueError(f"BARACUDA_LAUNCH must be 'direct' or 'dispatcher', not {_mode!r}")
#: ``[launches go through cuLaunchKernel]``, read by every generated launcher per call
_DIRECT = [not SIMULATOR and _mode == "direct"]

#: Simulator launches cap grid-stride kernels at this many blocks of this many threads:
#: the simulator runs one Python thread per CUDA thread (about 0.2 ms each).
SIM_MAX_BLOCKS = 2
SIM_MAX_THREADS = 32


def flat(array_type: types.Type) -> types.Array:
    """The flat 1-D array type a kernel receives for element storage ``array_type``."""
    return types.Array(array_type, 1, "A")


def launch_mode() -> str:
    """``"direct"`` (cuLaunchKernel) or ``"dispatcher"`` (Numba's launcher)."""
    return "dispatcher" if SIMULATOR else _mode


def set_launch_mode(mode: str) -> None:
    """Choose the GPU launch path for every kernel (tests compare the two)."""
    global _mode
    if mode not in ("direct", "dispatcher"):
        raise ValueError(f"set_launch_mode: mode must be 'direct' or 'dispatcher', not {mode!r}")
    _mode = mode
    _DIRECT[0] = not SIMULATOR and mode == "direct"


class LazyTable(dict):  # type: ignore[type-arg]
    """A kernel table whose entries (their kernels and device functions) are built on first
    lookup, so that importing a family's module creates no Numba dispatchers. It reads as
    the whole table: its keys, ``len``, iteration and ``in`` cover every entry, ``get`` and
    ``[]`` build the one asked for, ``values()`` / ``items()`` build all (as
    :func:`registered_kernels` does for ``precompile`` and the PTX test). A built entry is
    a plain dict hit."""

    def __init__(self, keys: Any, build: Callable[[Any], Any]) -> None:
        super().__init__()
        self._keys = tuple(keys)
        self._known = frozenset(self._keys)
        self._build = build
        self._builders: dict[Any, Callable[[Any], Any]] = {}
        self._lock = threading.RLock()
        _LAZY_TABLES.append(self)

    def extend(self, keys: Any, build: Callable[[Any], Any]) -> None:
        """More entries, built by ``build`` (another kernel of the same table's keys)."""
        new = [key for key in keys if key not in self._known]
        self._keys += tuple(new)
        self._known = self._known | frozenset(new)
        self._builders.update(dict.fromkeys(new, build))

    def __missing__(self, key: Any) -> Any:
        if key not in self._known:
            raise KeyError(key)
        with self._lock:
            if not dict.__contains__(self, key):
                dict.__setitem__(self, key, self._builders.get(key, self._build)(key))
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self._known else default

    def __contains__(self, key: object) -> bool:
        return key in self._known

    def __iter__(self) -> Any:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self) -> Any:  # type: ignore[override]
        return list(self._keys)

    def values(self) -> Any:  # type: ignore[override]
        return [self[key] for key in self._keys]

    def items(self) -> Any:  # type: ignore[override]
        return [(key, self[key]) for key in self._keys]

    def __repr__(self) -> str:
        return f"LazyTable({len(self._keys)} entries, {dict.__len__(self)} built)"


def registered_kernels() -> list[Kernel]:
    """Every kernel signature of every kernel module (lazy tables built), by name."""
    import importlib
    import pkgutil

    from . import kernels

    for info in pkgutil.iter_modules(kernels.__path__):
        importlib.import_module(f"{kernels.__name__}.{info.name}")
    for table in list(_LAZY_TABLES):
        table.values()
    return sorted(_REGISTRY, key=lambda kernel: kernel.name)


def kernel_family(kernel: Kernel) -> str:
    """The family a kernel belongs to: its module under ``kernels/`` (``"scan"``), or the
    subpackage there (``kernels/reduce/forward.py``: ``"reduce"``)."""
    return _family_of(getattr(kernel.py_func, "__module__", "") or "")


def _family_of(module: str) -> str:
    parts = module.split(".")
    if "kernels" in parts[:-1]:
        return parts[parts.index("kernels") + 1]
    return parts[-1]


def kernel_dtype(kernel: Kernel) -> str | None:
    """The element token in a kernel's name (``"bf16"`` of ``reduce[sum,bf16]``, ``"half"``
    of a kernel serving f16 and bf16, ``"2b"`` of ``write_slice_rows[2B]``), lower case;
    None where the name has none."""
    _, _, rest = kernel.name.partition("[")
    tokens = [t.lower() for t in rest.rstrip("]").split(",")]
    return next((t for t in tokens if t in DTYPE_TOKENS), None)


#: Element tokens of kernel names: element kinds and, for byte-moving kernels, unit widths.
DTYPE_TOKENS = frozenset({"half", "f16", "bf16", "f32", "f64", "i32", "i64", "u8", "i8",
                          "1b", "2b", "4b", "8b", "16b"})


def precompile(families: Sequence[str] | None = None, jobs: int | None = None) -> int:
    """Fill the cubin cache for every registered kernel (of the kernel modules named in
    ``families``) that is not in it yet; see :func:`baracuda_numba.precompile.warmup`.
    Returns how many kernels were missing."""
    from .precompile import warmup

    return warmup(families, jobs=jobs)


def compile_all_ptx(cc: tuple[int, int] = (9, 0),
                    only: Callable[[Kernel], bool] | None = None) -> dict[str, str]:
    """Compile every registered signature to PTX for compute capability ``cc``.

    Needs no GPU (numba-cuda's cu12/cu13 extra brings NVVM). Returns name -> PTX.
    """
    return {kernel.name: kernel_ptx(kernel, (cc,))[cc] for kernel in registered_kernels()
            if only is None or only(kernel)}


def kernel_ptx(kernel: Kernel, ccs: Sequence[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """PTX of ``kernel`` for each compute capability of ``ccs`` (no GPU needed), from one
    Numba compile where it can: numba-cuda's lowering reads the compute capability only
    below 7.5 (f64 atomic adds, fastmath tanh), so from 7.5 up one library's IR serves
    every architecture and only NVVM runs per cc (the front end is most of a compile).
    Falls back to a compile per cc where numba-cuda lacks the internal entry point."""
    # max_registers is a ptxas option: PTX is the same with or without it.
    ccs = tuple(ccs)
    from numba.cuda import compiler

    lower = getattr(compiler, "_compile_pyfunc_with_fixup", None)
    if lower is None or len(ccs) == 1 or min(ccs) < (7, 5):
        return {cc: cuda.compile_ptx(kernel.py_func, kernel.signature, cc=cc)[0] for cc in ccs}
    library, _ = lower(kernel.py_func, kernel.signature, device=False, cc=min(ccs),
                       abi="numba")
    out = {}
    for cc in ccs:
        codes = library.get_asm_strs(cc=cc)
        if len(codes) != 1:
            raise RuntimeError(f"{kernel.name}: {len(codes)} PTX modules for sm_{cc[0]}{cc[1]}")
        out[cc] = codes[0]
    return out


def _dispatcher(py_func: Callable[..., Any], max_registers: int | None) -> Any:
    key = (py_func, max_registers)
    found = _DISPATCHERS.get(key)
    if found is None:
        # Numba's disk-cache key ignores max_registers (a capped kernel would load the
        # uncapped build), so capped kernels rely on this package's cubin cache alone.
        # Generated sources (no file behind them) have no Numba cache locator either.
        options: dict[str, Any] = {"cache": not SIMULATOR and max_registers is None
                                   and os.path.isfile(py_func.__code__.co_filename)}
        if max_registers is not None and not SIMULATOR:
            options["max_registers"] = max_registers
        found = cuda.jit(**options)(py_func)
        _DISPATCHERS[key] = found
    return found


_SLOT_FORMATS = {
    types.int64: "q", types.uint64: "Q", types.int32: "i4x", types.uint32: "I4x",
    types.float64: "d", types.float32: "f4x", types.boolean: "?7x",
}
_ARRAY_SLOTS = 7  # meminfo, parent, nitems, itemsize, data, shape[0], strides[0]
# Natural-alignment formats: the kernel's parameter block laid out as a C struct, for
# launches that pass every parameter in one buffer (cuLaunchKernel's ``extra``).
_PACKED_FORMATS = {
    types.int64: "q", types.uint64: "Q", types.int32: "i", types.uint32: "I",
    types.float64: "d", types.float32: "f", types.boolean: "?",  # .param .u8
}
#: Pass parameters as one packed buffer (default) rather than one pointer per parameter:
#: the driver then copies one block instead of handling each of the ~40-70 scalars a
#: flattened Numba signature has.
PARAM_BUFFER = os.environ.get("BARACUDA_PARAM_BUFFER", "1") != "0"


class Kernel:
    """One kernel function at one signature; see the module docstring for argument values.

    ``grid_stride=True`` declares that the kernel covers any problem with any grid (a
    grid-stride loop), which lets simulator launches use a tiny grid. ``max_registers``
    caps registers per thread (occupancy) as ``cuda.jit(max_registers=...)`` does.
    """

    def __init__(self, name: str, py_func: Callable[..., Any], signature: Sequence[types.Type],
                 *, grid_stride: bool = False, register: bool = True,
                 max_registers: int | None = None) -> None:
        self.name = name
        self.py_func = py_func
        self.signature = tuple(signature)
        self.grid_stride = grid_stride
        self.max_registers = max_registers
        self._kinds: list[tuple[str, Any]] = []
        fmt = "<"
        for argtype in self.signature:
            if isinstance(argtype, types.Array):
                if argtype.ndim != 1:
                    raise TypeError(f"{name}: kernel arrays must be flat 1-D views")
                self._kinds.append(("array", np.dtype(str(argtype.dtype))))
                fmt += "q" * _ARRAY_SLOTS
            elif isinstance(argtype, types.UniTuple):
                self._kinds.append(("tuple", argtype.count))
                fmt += _SLOT_FORMATS[argtype.dtype] * argtype.count
            else:
                self._kinds.append(("scalar", argtype))
                fmt += _SLOT_FORMATS[argtype]
        self._struct = struct.Struct(fmt)
        self._slots = self._struct.size // 8
        packed = "@"
        self._packed_pointer_offsets: list[int] = []
        self._packable = True
        for argtype in self.signature:
            if isinstance(argtype, types.Array):
                self._packed_pointer_offsets.append(struct.calcsize(packed + "qqqq"))
                packed += "q" * _ARRAY_SLOTS
            elif isinstance(argtype, types.UniTuple) and argtype.dtype in _PACKED_FORMATS:
                packed += _PACKED_FORMATS[argtype.dtype] * argtype.count
            elif argtype in _PACKED_FORMATS:
                packed += _PACKED_FORMATS[argtype]
            else:
                self._packable = False
        self._packed = struct.Struct(packed)
        self._params = ctypes.create_string_buffer(self._struct.size)
        base = ctypes.addressof(self._params)
        self._pointers = (ctypes.c_void_p * self._slots)(*[base + 8 * i
                                                            for i in range(self._slots)])
        self._pointers_address = ctypes.addressof(self._pointers)
        self._lock = threading.Lock()
        # The CUfunction per CUcontext it was loaded in. A process that sees one device
        # also keeps it in _handle (and its context in _context): ``function`` then reads
        # one attribute and never asks the driver which context is current.
        self._handles: dict[int, int] = {}
        self._handle: int | None = None
        self._context = 0
        self._dynamic_shared = 0  # bytes of dynamic shared memory opted in so far
        self._opted: dict[int, int] = {}  # several devices: the opt-in set per context
        self._shared_limits: dict[int | None, int] = {}  # dynamic_shared_limit, once read
        self._dispatcher_obj: Any = None
        if register:
            _REGISTRY.append(self)

    def __repr__(self) -> str:
        return f"Kernel({self.name!r})"

    @property
    def packable(self) -> bool:
        """Whether every parameter type has a packed (natural alignment) format, so a
        launch can pass the parameter block whole through ``extra``."""
        return self._packable

    @property
    def packed_format(self) -> str:
        """The ``struct`` format of the packed parameter block (``"@"``, native alignment,
        then one code per slot: 7 ``q`` per array, the codes of tuples and scalars)."""
        return self._packed.format

    @property
    def dynamic_shared_bytes(self) -> int:
        """Bytes of dynamic shared memory this kernel is opted in to so far
        (:meth:`allow_dynamic_shared`; 0 before any opt-in and in the simulator)."""
        return self._dynamic_shared

    @property
    def dispatcher(self) -> Any:
        if self._dispatcher_obj is None:
            self._dispatcher_obj = _dispatcher(self.py_func, self.max_registers)
        return self._dispatcher_obj

    @property
    def function(self) -> int:
        """The driver's ``CUfunction`` of this kernel in the current context (loaded, and
        compiled if it is not in the cache, on first access in that context)."""
        handle = self._handle
        if handle is None:
            handle = self.resolved()[0]
        return handle

    _function = function  # the name launchers and drivers used before

    def resolved(self) -> tuple[int, int]:
        """``(CUfunction, CUcontext)``: this kernel loaded in the current context (on
        first use there), and that context."""
        if self._handle is not None:
            return self._handle, self._context
        context = devices.current_context()
        handle = self._handles.get(context)
        if handle is None:
            self.load()
            if self._handle is not None:
                return self._handle, self._context
            handle = self._handles[context]
        return handle, context

    @property
    def loaded(self) -> bool:
        """Whether this process holds the kernel's CUfunction already, in some context
        (always False in the simulator, which launches through Numba)."""
        return bool(self._handles)

    def prepare(self) -> Kernel:
        """Declare that a plan may launch this kernel; compiles nothing. The kernel loads
        on first use (bind, launch, a device query), so a plan's first ``run`` compiles
        only what it launches. :meth:`load` loads now."""
        return self

    def load(self) -> Kernel:
        """Resolve the CUfunction in the current context now, once per context.
        Idempotent; a no-op in the simulator.

        First from the cubin cache (one ``cuModuleLoadData``; every device of one compute
        capability loads the same entry); otherwise Numba compiles the signature, and the
        linked cubin is written to the cache for the next process
        (:func:`baracuda_numba.cubin_cache.lookup_or_fill`: one compile per kernel even
        with several processes filling one cache)."""
        if SIMULATOR or self._handle is not None:
            return self
        context = devices.current_context()
        if context in self._handles:
            return self
        with _PREPARE_LOCK:
            if context in self._handles:
                return self
            cc = cuda.current_context().device.compute_capability
            path = cubin_path(self, cc)
            entry, built = cubin_cache.lookup_or_fill(
                path, lambda: self._compile(cc, path, context))
            if not built:
                assert entry is not None
                try:
                    handle = load_function(entry[1], entry[0])
                except (OSError, ValueError, RuntimeError):
                    # intact but not loadable here: compile and replace it
                    rebuilt = self._compile(cc, path, context)
                    if rebuilt is not None and path is not None:
                        cubin_cache.write_entry(path, *rebuilt)
                else:
                    self._keep(context, handle)
        return self

    def _keep(self, context: int, handle: int) -> None:
        """Record ``handle`` as this kernel's CUfunction in ``context``. With several
        devices the dynamic shared memory opt-in made so far is set on it too (each
        context's function carries its own)."""
        self._handles[context] = handle
        if not devices.several():
            self._handle, self._context = handle, context
        elif self._dynamic_shared:
            nbytes = min(self._dynamic_shared, self.dynamic_shared_limit())
            set_max_dynamic_shared(handle, nbytes)
            self._opted[context] = nbytes

    def _compile(self, cc: tuple[int, int], path: pathlib.Path | None, context: int
                 ) -> tuple[bytes, bytes] | None:
        """Compile with Numba and keep its CUfunction (Numba loads it in the current
        context, ``context``); returns ``(entry name, cubin)`` for the cache (None if Numba
        gave no cubin bytes)."""
        with compile_notice(self.name, path):
            compiled = self.dispatcher.compile(self.signature)
            library = compiled._codelibrary
            self._keep(context, _as_cufunction(library.get_cufunc().handle))
        cubin = library.get_cubin(cc=cc)
        image = getattr(cubin, "code", cubin)  # cuda.core ObjectCode or raw bytes
        if not isinstance(image, (bytes, bytearray)):
            return None
        return library._entry_name.encode(), bytes(image)

    def dynamic_shared_limit(self) -> int:
        """Bytes of dynamic shared memory one block of this kernel can take on the current
        device: the opt-in limit per block (227 KiB on sm_90, 163 KiB on sm_80, 99 KiB on
        sm_86 / sm_89) less the kernel's static shared memory. Unbounded in the
        simulator. Read once per process."""
        if SIMULATOR:
            return 1 << 30
        key = devices.current_context() if self._handle is None else None
        found = self._shared_limits.get(key)
        if found is None:
            optin = int(cuda.current_context().device.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            found = self._shared_limits[key] = optin - function_static_shared(self.function)
        return found

    def resident_blocks(self, block: int, dynamic_shared: int = 0) -> int:
        """Blocks of ``block`` threads (and ``dynamic_shared`` bytes of dynamic shared
        memory) of this kernel the current device holds at once (all SMs). The simulator
        runs one block at a time: 1."""
        if SIMULATOR:
            return 1
        sms = int(cuda.current_context().device.MULTIPROCESSOR_COUNT)
        return sms * max_active_blocks(self.function, block, dynamic_shared)

    def allow_dynamic_shared(self, nbytes: int) -> Kernel:
        """Opt this kernel in to ``nbytes`` of dynamic shared memory per block
        (``cuda.shared.array(0, dtype)`` in the kernel, ``shared_bytes`` at launch), at
        most :meth:`dynamic_shared_limit` (a larger opt-in is refused by the driver; a
        plan picks its layouts within the limit). The opt-in is needed once static plus
        dynamic shared memory exceeds 48 KiB, so it is set for any request (the kernel's
        static tables count too). A no-op in the simulator, whose launches take any size.
        Idempotent; the largest request so far stays in force."""
        if SIMULATOR:
            return self
        if self._handle is None:  # several devices: the opt-in of this context's function
            return self._allow_dynamic_shared_here(nbytes)
        if nbytes <= self._dynamic_shared:
            return self
        nbytes = min(nbytes, self.dynamic_shared_limit())
        with _PREPARE_LOCK:
            if nbytes > self._dynamic_shared:
                set_max_dynamic_shared(self.function, nbytes)
                self._dynamic_shared = nbytes
        return self

    def _allow_dynamic_shared_here(self, nbytes: int) -> Kernel:
        function, context = self.resolved()
        if self._handle is not None:  # loaded just now, in a one-device process
            return self.allow_dynamic_shared(nbytes)
        nbytes = min(nbytes, self.dynamic_shared_limit())
        with _PREPARE_LOCK:
            if nbytes > self._opted.get(context, 0):
                set_max_dynamic_shared(function, nbytes)
                self._opted[context] = nbytes
            self._dynamic_shared = max(self._dynamic_shared, nbytes)
        return self

    def bind(self, grid: int | tuple[int, ...], block: int | tuple[int, ...],
             args: Sequence[Any], shared_bytes: int = 0,
             cooperative: bool = False) -> BoundLaunch:
        """Fix every argument except the array pointers (pass ``(0, extent)`` for arrays);
        the returned :class:`BoundLaunch` then launches with just a stream and pointers.
        ``cooperative``: a cooperative launch (every block resident at once, or an error;
        for kernels whose blocks wait on each other).

        Plans cache bound launches per layout, so a repeated ``run`` packs nothing."""
        return BoundLaunch(self, _dim3(grid), _dim3(block), tuple(args), shared_bytes,
                           cooperative=cooperative)

    # -- launching -------------------------------------------------------------------

    def launch(self, grid: int | tuple[int, ...], block: int | tuple[int, ...], stream: int,
               args: Sequence[Any], shared_bytes: int = 0) -> None:
        """Launch on raw stream handle ``stream``; never synchronises."""
        grid3 = _dim3(grid)
        block3 = _dim3(block)
        if SIMULATOR or _mode == "dispatcher":
            self._launch_dispatcher(grid3, block3, stream, args, shared_bytes)
            return
        function, context = self.resolved()
        values: list[Any] = []
        for (kind, info), value in zip(self._kinds, args):
            if kind == "array":
                pointer, extent = value
                itemsize = info.itemsize
                values += (0, 0, extent, itemsize, pointer, extent, itemsize)
            elif kind == "tuple":
                values += value
            else:
                values.append(value)
        code = self._attempt(function, grid3, block3, shared_bytes, stream, values)
        if code:  # e.g. the first launch from a thread with no current context
            retry_launch(code, context, self._attempt,
                         (function, grid3, block3, shared_bytes, stream, values),
                         f"cuLaunchKernel({self.name})")

    def _attempt(self, function: int, grid: tuple[int, int, int],
                 block: tuple[int, int, int], shared_bytes: int, stream: int,
                 values: list[Any]) -> int:
        """One ``cuLaunchKernel`` of :meth:`launch` (parameters packed under the lock);
        returns the ``CUresult``."""
        with self._lock:
            self._struct.pack_into(self._params, 0, *values)
            return launch_kernel(function, grid, block, shared_bytes, stream,
                                 self._pointers_address)

    def _launch_dispatcher(self, grid: tuple[int, int, int], block: tuple[int, int, int],
                           stream: int, args: Sequence[Any], shared_bytes: int) -> None:
        if SIMULATOR and self.grid_stride:
            grid = (min(grid[0], SIM_MAX_BLOCKS), min(grid[1], SIM_MAX_BLOCKS),
                    min(grid[2], SIM_MAX_BLOCKS))
            block = (min(block[0], SIM_MAX_THREADS), min(block[1], SIM_MAX_THREADS),
                     min(block[2], SIM_MAX_THREADS))
        converted = []
        for (kind, info), value in zip(self._kinds, args):
            if kind == "array":
                converted.append(_device_view(value[0], value[1], info))
            elif kind == "tuple":
                converted.append(tuple(value))
            else:
                converted.append(value)
        numba_stream = 0 if SIMULATOR else _numba_stream(stream)
        dispatcher = self.dispatcher
        if not SIMULATOR:
            dispatcher.compile(self.signature)
        with warnings.catch_warnings():
            # Small problems get small grids on purpose; Numba's occupancy warning is noise.
            warnings.filterwarnings("ignore", message=".*under-utilization.*")
            dispatcher[grid, block, numba_stream, shared_bytes](*converted)


class BoundLaunch:
    """A launch of one kernel with grid, block and every non-pointer argument packed once.

    ``bound(stream, pointer_0, pointer_1, ...)`` writes the array pointers (in argument
    order) into its own parameter block and calls ``cuLaunchKernel``; ``bound.fast`` is
    the same call as one generated function (:func:`~baracuda_numba.driver.pointer_launcher`),
    which plans keep for their repeated ``run`` (one Python frame less). By default the
    block is passed whole through ``extra`` (``CU_LAUNCH_PARAM_BUFFER_POINTER``); with
    ``packed=False`` as one pointer per parameter. ``cooperative`` launches with
    ``cuLaunchCooperativeKernel`` (one pointer per parameter: it takes no ``extra``). The
    dispatcher path (simulator, ``set_launch_mode("dispatcher")``) rebuilds the full
    argument list instead (and launches as usual: the simulator runs one block at a
    time anyway).
    """

    __slots__ = ("_args", "_array_positions", "_block", "_context", "_cooperative", "_extra",
                 "_function", "_grid", "_kernel", "_keepalive", "_lock", "_params_address",
                 "_pointer_slots", "_shared", "_use_extra", "fast")

    def __init__(self, kernel: Kernel, grid: tuple[int, int, int], block: tuple[int, int, int],
                 args: tuple[Any, ...], shared_bytes: int, packed: bool | None = None,
                 cooperative: bool = False) -> None:
        self._kernel = kernel
        self._cooperative = cooperative
        if cooperative:
            packed = False
        self._grid = grid
        self._block = block
        self._args = args
        self._shared = shared_bytes
        self._lock = threading.Lock()
        self._array_positions = [i for i, (kind, _) in enumerate(kernel._kinds)
                                 if kind == "array"]
        self._pointer_slots: list[Any] = []
        self._use_extra = (PARAM_BUFFER if packed is None else packed) and kernel._packable
        self._extra = None
        self._params_address = None
        self._keepalive: tuple[Any, ...] = ()
        self.fast: Callable[..., None] = self._dispatch
        self._function = self._context = 0
        if SIMULATOR:
            return
        # The function of the current context: a plan binds under its device's context.
        function, self._context = kernel.resolved()
        self._function = function
        values: list[Any] = []
        for (kind, info), value in zip(kernel._kinds, args):
            if kind == "array":
                extent = value[1]
                values += (0, 0, extent, info.itemsize, 0, extent, info.itemsize)
            elif kind == "tuple":
                values += value
            else:
                values.append(value)
        if self._use_extra:
            layout = kernel._packed
            buffer = ctypes.create_string_buffer(max(layout.size, 8))
            layout.pack_into(buffer, 0, *values)
            offsets = kernel._packed_pointer_offsets
            size = ctypes.c_size_t(layout.size)
            extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buffer), 2,
                                          ctypes.addressof(size), 0)
            self._extra = ctypes.addressof(extra)
            self._params_address = 0
            self._keepalive = (buffer, size, extra)
        else:
            layout = kernel._struct
            buffer = ctypes.create_string_buffer(layout.size)
            layout.pack_into(buffer, 0, *values)
            offsets = []
            slot = 0
            for kind, info in kernel._kinds:
                if kind == "array":
                    offsets.append(8 * (slot + 4))
                    slot += _ARRAY_SLOTS
                else:
                    slot += info if kind == "tuple" else 1
            base = ctypes.addressof(buffer)
            pointers = (ctypes.c_void_p * kernel._slots)(*[base + 8 * i
                                                           for i in range(kernel._slots)])
            self._params_address = ctypes.addressof(pointers)
            self._extra = 0
            self._keepalive = (buffer, pointers)
        self._pointer_slots = [ctypes.c_uint64.from_buffer(buffer, offset)
                               for offset in offsets]
        self.fast = pointer_launcher(function, grid, block, shared_bytes,
                                     self._params_address, self._extra, self._pointer_slots,
                                     self._lock, _DIRECT, self._dispatch, self._failed,
                                     cooperative=cooperative)

    def __call__(self, stream: int, *pointers: int) -> None:
        self.fast(stream, *pointers)

    @property
    def kernel(self) -> Kernel:
        """The kernel this launch runs."""
        return self._kernel

    @property
    def grid(self) -> tuple[int, int, int]:
        """The launch grid ``(x, y, z)`` (:meth:`Kernel.bind`'s, padded with 1s)."""
        return self._grid

    @property
    def block(self) -> tuple[int, int, int]:
        """The block shape ``(x, y, z)`` (:meth:`Kernel.bind`'s, padded with 1s)."""
        return self._block

    @property
    def args(self) -> tuple[Any, ...]:
        """The bound argument values in the kernel's order (arrays as ``(pointer,
        extent)``; the pointers are the ones given at bind time, each call passes its own)."""
        return self._args

    @property
    def extra(self) -> int | None:
        """The address of the ``extra`` array passed to ``cuLaunchKernel`` (the whole
        packed parameter block); 0 where the launch passes one pointer per parameter,
        None in the simulator / dispatcher path (no parameter block)."""
        return self._extra

    @property
    def params_address(self) -> int | None:
        """The address of the per-parameter pointer array passed as ``kernelParams``; 0
        where the launch passes the block through ``extra``, None in the simulator."""
        return self._params_address

    def taking(self, order: tuple[str, ...], arity: int) -> Callable[..., None] | None:
        """``launch(stream, a0, ..., a{arity-1})`` that passes pointer ``i`` from the
        expression ``order[i]`` (one of those names, ``"0"``, or a name plus a byte
        offset: a part of a workspace): ``fast`` for arrays
        given in another order (a plan's memo replaying one launch). None on the
        dispatcher path (simulator)."""
        if SIMULATOR:
            return None
        return pointer_launcher(self._function, self._grid, self._block,
                                self._shared, self._params_address, self._extra,
                                self._pointer_slots, self._lock, _DIRECT, self._dispatch,
                                self._failed, order, arity, self._cooperative)

    def _dispatch(self, stream: int, *pointers: int) -> None:
        """The launch through Numba's dispatcher (simulator, dispatcher mode)."""
        args = list(self._args)
        for position, pointer in zip(self._array_positions, pointers):
            args[position] = (pointer, args[position][1])
        self._kernel.launch(self._grid, self._block, stream, args, self._shared)

    @property
    def context(self) -> int:
        """The ``CUcontext`` whose ``CUfunction`` this launch calls (0 in the simulator)."""
        return self._context

    def _failed(self, code: Any, stream: int, *pointers: int) -> None:
        """A launch returned ``code``: a launch from a thread whose current context is not
        this launch's (none yet: the first launch from a new thread; another device's) is
        retried once in this launch's context (:func:`~baracuda_numba.driver.retry_launch`);
        else raise."""
        call = "cuLaunchCooperativeKernel" if self._cooperative else "cuLaunchKernel"
        attempt = getattr(self.fast, "attempt", None)
        if attempt is None:
            check(int(code), f"{call}({self._kernel.name})")
        retry_launch(code, self._context, attempt, (stream, *pointers),
                     f"{call}({self._kernel.name})")


_PREPARE_LOCK = threading.RLock()


#: Bump when a change outside ``kernels/`` changes generated code (compile options).
_CACHE_VERSION = 3


@functools.cache
def source_digest(module: str) -> str:
    """Hash of a kernel's family sources (``kernels/<family>.py``, or every file of the
    subpackage ``kernels/<family>/``; another module's own file), of
    ``kernels/common.py`` and of the Numba version: a change to one family's device code
    invalidates only that family's cubins."""
    import importlib

    import numba

    from . import kernels

    digest = hashlib.sha256(f"{_CACHE_VERSION}/{numba.__version__}".encode())
    root = pathlib.Path(kernels.__path__[0])
    sources = {root / "common.py"}
    family = root / _family_of(module)
    if module.startswith(f"{kernels.__name__}.") and family.is_dir():
        sources.update(family.rglob("*.py"))
    else:
        try:
            file = importlib.import_module(module).__file__
        except ImportError:
            file = None
        if file:
            sources.add(pathlib.Path(file))
        else:  # unknown origin: every kernel source
            sources.update(root.rglob("*.py"))
    sources |= imported_kernel_sources(sources, root)
    for source in sorted(s for s in sources if s.exists()):
        digest.update(str(source.relative_to(root) if source.is_relative_to(root)
                          else source.name).encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


def imported_kernel_sources(sources: set[pathlib.Path], root: pathlib.Path
                             ) -> set[pathlib.Path]:
    """The kernel modules under ``root`` that ``sources`` import, transitively: a module
    (``from .rope import ...`` in ``kernels/softmax.py``, ``from ..common import ...`` in
    ``kernels/scan/fast.py``) or every file of a family subpackage (``from .rope import``
    once ``kernels/rope/`` is a package). Device code taken from another family's module is
    part of the kernel, so a change there must invalidate this family's cubins too."""
    found: set[pathlib.Path] = set()
    pending = [s for s in sources if s.exists()]
    while pending:
        source = pending.pop()
        for dots, name in re.findall(r"^from (\.+)(\w+) import", source.read_text(), re.M):
            package = source.parents[len(dots) - 1]
            target = package / name
            paths = sorted(target.rglob("*.py")) if target.is_dir() else [
                target.with_suffix(".py")]
            for path in paths:
                if (path.exists() and path.is_relative_to(root) and path not in sources
                        and path not in found):
                    found.add(path)
                    pending.append(path)
    return found


@functools.cache
def _versions() -> tuple[str, str, int]:
    """(package, numba-cuda, CUDA driver) versions, for the cache key."""
    import numba_cuda

    from . import __version__

    return __version__, numba_cuda.__version__, driver_version()


def cubin_path(kernel: Kernel, cc: tuple[int, int]) -> pathlib.Path | None:
    """The cache file of ``kernel`` for compute capability ``cc`` (None: no cache folder);
    its name is :func:`baracuda_numba.cubin_cache.entry_key` of everything that changes
    the binary."""
    root = cubin_cache.cache_dir()
    if root is None:
        return None
    package, numba_cuda_version, driver = _versions()
    key = cubin_cache.entry_key(
        source_digest=source_digest(getattr(kernel.py_func, "__module__", "") or ""),
        name=kernel.name, signature=str(kernel.signature), max_registers=kernel.max_registers,
        cc=cc, package_version=package, numba_cuda_version=numba_cuda_version,
        driver_version=driver)
    return root / f"{key}{cubin_cache.SUFFIX}"


#: Seconds a compile runs before it says so on the ``baracuda_numba`` logger (a first call
#: that waits longer than this without a word reads as a hang).
COMPILE_NOTICE_S = 1.0

LOG = logging.getLogger("baracuda_numba")


class _Fallback(logging.StreamHandler):
    """Prints the package's INFO lines on stderr while the application has configured no
    logging (Python's own last-resort handler shows warnings only); once the root logger
    has a handler, the records go there alone."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


if LOG.level == logging.NOTSET:
    LOG.setLevel(logging.INFO)  # silence: logging.getLogger("baracuda_numba").setLevel(...)
if not any(isinstance(h, _Fallback) for h in LOG.handlers):
    _handler = _Fallback()
    _handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    LOG.addHandler(_handler)


class compile_notice:  # noqa: N801 (used as a context manager, like a function)
    """``with compile_notice(name, path):`` around a compile: after ``after`` seconds (while
    it still runs) one INFO line says what is compiling and where it will be cached; at
    the end one DEBUG line gives the time."""

    def __init__(self, name: str, path: pathlib.Path | None,
                 after: float | None = None) -> None:
        self.name = name
        where = f"cached in {_home(path.parent)}" if path is not None \
            else "not cached: no writable cache folder"
        self.message = f"compiling {name} (first use; {where})"
        self.after = COMPILE_NOTICE_S if after is None else after
        self._timer: threading.Timer | None = None

    def __enter__(self) -> compile_notice:
        self._start = time.perf_counter()
        if LOG.isEnabledFor(logging.INFO):
            self._timer = threading.Timer(self.after, LOG.info, (self.message,))
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        LOG.debug("compiled %s in %.2f s", self.name, time.perf_counter() - self._start)


def _home(path: pathlib.Path) -> str:
    """``path`` with the home folder written ``~``."""
    home = pathlib.Path.home()
    try:
        return f"~/{path.relative_to(home)}"
    except ValueError:
        return str(path)


def _dim3(dim: int | tuple[int, ...]) -> tuple[int, int, int]:
    if isinstance(dim, int):
        return (dim, 1, 1)
    padded = tuple(dim) + (1,) * (3 - len(dim))
    return (padded[0], padded[1], padded[2])


def _as_cufunction(handle: Any) -> int:
    """Numba loads modules as CUDA libraries: turn its ``CUkernel`` into a ``CUfunction``
    of the current context (a plain ``CUfunction`` is returned as is)."""
    from cuda.bindings import driver as cudrv

    if isinstance(handle, cudrv.CUkernel):
        err, function = cudrv.cuKernelGetFunction(handle)
        check(int(err), "cuKernelGetFunction")
        return int(function)
    return int(handle)


_NUMBA_STREAMS: dict[int, Any] = {}


def _numba_stream(handle: int) -> Any:
    found = _NUMBA_STREAMS.get(handle)
    if found is None:
        found = cuda.default_stream() if handle == 0 else cuda.external_stream(handle)
        _NUMBA_STREAMS[handle] = found
    return found


def _device_view(pointer: int, extent: int, dtype: np.dtype) -> Any:
    """A flat array of ``extent`` elements at ``pointer`` for the dispatcher path."""
    extent = max(int(extent), 0)
    if SIMULATOR:
        if extent == 0 or pointer == 0:
            return np.empty(max(extent, 1), dtype=dtype)
        raw = (ctypes.c_char * (extent * dtype.itemsize)).from_address(pointer)
        return np.frombuffer(raw, dtype=dtype)
    interface = {"shape": (extent,), "typestr": dtype.str, "data": (pointer, False),
                 "version": 3, "strides": None}
    return cuda.from_cuda_array_interface(interface, owner=None, sync=False)
