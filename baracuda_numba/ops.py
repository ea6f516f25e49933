"""Functional API: one-line calls over cached plans, for torch, CuPy and Numba arrays.

Each function builds (on a cache miss only) the descriptor from its arguments, takes the
plan from a bounded, thread-safe cache keyed by the call's static facts, allocates
outputs with the input's own framework on the input's device, and runs on that
framework's current stream unless ``stream=`` is given. Repeated calls with the same
shapes pay only the plan's ``run`` plus an output allocation.

Conventions follow PyTorch: ``dim`` may be negative; reductions take ``keepdim``;
``cummax``/``cummin`` return ``(values, indices)``; ``var``/``std`` take ``correction``.
Backward functions take the forward's saved tensors as the seeds define them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ._frameworks import allocator, device_token, element_of, framework_of, stream_source
from .errors import InvalidProblem
from .plans.fractional_max_pool import (
    FractionalMaxPool2dBwArgs,
    FractionalMaxPool2dDescriptor,
    FractionalMaxPool2dFwArgs,
    FractionalMaxPool2dPlan,
    FractionalMaxPool3dBwArgs,
    FractionalMaxPool3dDescriptor,
    FractionalMaxPool3dFwArgs,
    FractionalMaxPool3dPlan,
    FractionalPlacement,
)
from .plans.reduce import (
    ArgReduceArgs,
    ArgReduceDescriptor,
    ArgReducePlan,
    ReduceArgs,
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceBackwardPlan,
    ReduceDescriptor,
    ReducePlan,
)
from .plans.rope import (
    RopeArgs,
    RopeBackwardArgs,
    RopeBackwardDescriptor,
    RopeBackwardPlan,
    RopeDescriptor,
    RopePlan,
)
from .plans.scan import (
    ScanArgs,
    ScanBackwardArgs,
    ScanBackwardDescriptor,
    ScanBackwardPlan,
    ScanDescriptor,
    ScanPlan,
)
from .plans.write_slice import WriteSliceArgs, WriteSliceDescriptor, WriteSlicePlan
from .streams import stream_handle
from .types import ElementKind, ReduceKind, RopePairing, ScanKind

__all__ = [
    "amax", "amin", "argmax", "argmin", "clear_plan_cache", "cummax", "cummin", "cumprod",
    "cumsum", "fractional_max_pool2d", "fractional_max_pool2d_backward",
    "fractional_max_pool3d", "fractional_max_pool3d_backward", "logcumsumexp", "logsumexp",
    "mean", "norm", "plan_for", "prod", "reduce_backward", "rope", "rope_backward",
    "scan_backward", "std", "sum", "var", "write_slice",
]

_CACHE_SIZE = 1024


class _Bounded:
    """A bounded, thread-safe map filled on demand: ``get(key, make)`` returns the cached
    value or stores ``make()``; past ``size`` entries the oldest insertion is dropped.
    Hits take no lock (one ``dict.get``)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._values: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.peek = self._values.get  # the value or None; never fills

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        value = self._values.get(key)
        if value is None:
            value = make()
            with self._lock:
                self._values[key] = value
                if len(self._values) > self._size:
                    self._values.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._values.clear()

    def __len__(self) -> int:
        return len(self._values)


_plans = _Bounded(_CACHE_SIZE)  # (family, descriptor fields) -> plan
_sites = _Bounded(_CACHE_SIZE)  # (family, options, array type, shape, dtype, device) -> _Site


def plan_for(key: Any, make: Callable[[], Any]) -> Any:
    """The cached plan for ``key``; ``make()`` selects it on a miss (bounded cache)."""
    return _plans.get(key, make)


def clear_plan_cache() -> None:
    _plans.clear()
    _sites.clear()


class _Site(NamedTuple):
    """What a call with given options and input layout facts needs besides ``run``: the
    plan, output allocators (``alloc(input)``; ``None`` where there is no such output) and
    the framework's
    current-stream source; ``axis`` is the normalised ``dim`` (reductions)."""

    plan: Any
    outputs: tuple[Callable[[Any], Any] | None, ...]
    stream: Callable[[], Any]
    axis: int = 0
    #: torch inputs: input layout -> ``plan.layout_launch`` (see :func:`_fast_launch`)
    launches: dict[Any, Any] | None = None


def _site(x: Any, options: tuple[Any, ...],
          make: Callable[[tuple[int, ...], ElementKind], tuple[Any, tuple, int]]) -> _Site:
    """The call site of ``options`` with input ``x``: on a miss, ``make(shape, element)``
    returns ``(plan, ((shape, element) | None, ...) per output, axis)``. Keyed by what
    decides plan and allocation: the options, the array type, shape, dtype and device."""
    key = (options, type(x), x.shape, x.dtype, device_token(x))
    site = _sites.peek(key)
    if site is not None:
        return site

    def build() -> _Site:
        plan, outputs, axis = make(tuple(int(s) for s in x.shape), element_of(x))
        allocs = tuple(None if spec is None else allocator(x, *spec) for spec in outputs)
        return _Site(plan, allocs, stream_source(x), axis,
                     {} if framework_of(x) == "torch" else None)

    return _sites.get(key, build)


def _fast_launch(launches: dict[Any, Any], layout: Any, plan: Any, args: Any) -> None:
    """Keep ``plan.layout_launch(args)`` (after a checked ``run(args)``) under ``layout``:
    the input's strides and the pointers' alignment (mod 16) of every array.

    The call site already fixes the input's type, shape, dtype and device, and every
    output is a fresh allocation whose layout follows from the input's (``empty_like``
    keeps a dense input's strides; anything else comes out contiguous): so this key
    decides everything ``run``'s checks look at, and a fresh output cannot overlap the
    input, which is all ``run``'s per-call aliasing checks would see. A repeated call
    then launches with the new pointers and skips the args object and ``run``'s reading
    of every array's layout (H100 host: see docs/notes/host.md)."""
    launch = plan.layout_launch(args)
    if launch is not None:
        if len(launches) >= 64:
            launches.clear()
        launches[layout] = launch


def _dim(dim: int, rank: int, fn: str) -> int:
    if not -rank <= dim < max(rank, 1):
        raise InvalidProblem(f"{fn}: dim = {dim} is out of range for rank {rank}")
    return dim % max(rank, 1)


def _drop_dim(array: Any, dim: int) -> Any:
    """``array`` (keepdim) with axis ``dim`` (extent 1) removed, as a view."""
    shape = tuple(array.shape)
    new_shape = shape[:dim] + shape[dim + 1:]
    if hasattr(array, "squeeze") and not hasattr(array, "copy_to_host"):
        return array.squeeze(dim) if shape[dim] == 1 else array.reshape(new_shape)
    return array.reshape(new_shape)


# -- write_slice ---------------------------------------------------------------------------


def write_slice(dest: Any, source: Any, offsets: Sequence[int], *, stream: Any = None) -> Any:
    """``dest[o_0:o_0+n_0, ..., o_k:o_k+n_k] = source`` in place (``n = source.shape``);
    returns ``dest``. Bit-exact; any strides."""
    offsets = tuple(offsets)

    def make(dest_shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        source_shape = tuple(int(s) for s in source.shape)
        starts = tuple(int(o) for o in offsets)
        ranges = tuple((o, o + n) for o, n in zip(starts, source_shape))
        return plan_for(("write_slice", dest_shape, source_shape, starts, element),
                        lambda: WriteSlicePlan.select(WriteSliceDescriptor(
                            dest_shape, source_shape, ranges, element))), (), 0

    site = _site(dest, ("write_slice", source.shape, offsets), make)
    site.plan.run(WriteSliceArgs(dest, source), stream=site.stream() if stream is None
                  else stream)
    return dest


# -- scans ---------------------------------------------------------------------------------


def _scan(kind: ScanKind, x: Any, dim: int, reverse: bool, stream: Any,
          with_indices: bool) -> Any:
    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        axis = _dim(dim, len(shape), kind.name.lower())
        plan = plan_for(("scan", kind, shape, axis, reverse, element), lambda: ScanPlan.select(
            ScanDescriptor(kind, shape, axis, reverse, element=element)))
        return plan, ((shape, element), (shape, ElementKind.I64) if with_indices else None), \
            axis

    plan, (alloc_y, alloc_indices), current, _, launches = _site(
        x, ("scan", kind, dim, reverse, with_indices), make)
    y = alloc_y(x)
    indices = None if alloc_indices is None else alloc_indices(x)
    handle = current() if stream is None else stream_handle(stream)
    if launches is not None:  # torch: the input's layout picks the launch (_fast_launch)
        pointers = (x.data_ptr(), y.data_ptr(), 0 if indices is None else indices.data_ptr())
        layout = (x.stride(), pointers[0] & 15, pointers[1] & 15, pointers[2] & 15)
        launch = launches.get(layout)
        if launch is not None:
            launch(handle, *pointers)
            return (y, indices) if with_indices else y
    args = ScanArgs(x, y, indices)
    plan.run(args, stream=handle)
    if launches is not None:
        _fast_launch(launches, layout, plan, args)
    return (y, indices) if with_indices else y


def cumsum(x: Any, dim: int, *, reverse: bool = False, stream: Any = None) -> Any:
    """Inclusive prefix sum along ``dim`` (f32 accumulation for f16/bf16)."""
    return _scan(ScanKind.CUMSUM, x, dim, reverse, stream, False)


def cumprod(x: Any, dim: int, *, reverse: bool = False, stream: Any = None) -> Any:
    """Inclusive prefix product along ``dim``."""
    return _scan(ScanKind.CUMPROD, x, dim, reverse, stream, False)


def logcumsumexp(x: Any, dim: int, *, reverse: bool = False, stream: Any = None) -> Any:
    """``log(cumsum(exp(x)))`` along ``dim``, computed stably (all -inf prefix -> -inf)."""
    return _scan(ScanKind.LOG_CUMSUM_EXP, x, dim, reverse, stream, False)


def cummax(x: Any, dim: int, *, reverse: bool = False, stream: Any = None) -> tuple[Any, Any]:
    """Running maximum and its index (int64) along ``dim``, as ``torch.cummax``; NaN wins."""
    return _scan(ScanKind.CUMMAX, x, dim, reverse, stream, True)


def cummin(x: Any, dim: int, *, reverse: bool = False, stream: Any = None) -> tuple[Any, Any]:
    """Running minimum and its index (int64) along ``dim``, as ``torch.cummin``; NaN wins."""
    return _scan(ScanKind.CUMMIN, x, dim, reverse, stream, True)


def scan_backward(kind: ScanKind, dy: Any, dim: int, *, x: Any = None, y: Any = None,
                  reverse: bool = False, stream: Any = None) -> Any:
    """Gradient of the ``kind`` scan: ``dx`` from ``dy`` and the saved ``x``/``y``
    (Cumsum: none; Cumprod and LogCumsumExp: x and y; Cummax/Cummin: x)."""
    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        axis = _dim(dim, len(shape), "scan_backward")
        return plan_for(("scan_bw", kind, shape, axis, reverse, element),
                        lambda: ScanBackwardPlan.select(ScanBackwardDescriptor(
                            kind, shape, axis, reverse, element=element))), \
            ((shape, element),), axis

    plan, (alloc_dx,), current, *_ = _site(dy, ("scan_bw", kind, dim, reverse), make)
    dx = alloc_dx(dy)
    plan.run(ScanBackwardArgs(dy, dx, x, y), stream=current() if stream is None else stream)
    return dx


# -- reductions ----------------------------------------------------------------------------


def _reduce(kind: ReduceKind, x: Any, dim: int, keepdim: bool, correction: int,
            stream: Any) -> Any:
    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        axis = _dim(dim, len(shape), kind.name.lower())
        plan = plan_for(("reduce", kind, shape, axis, element, correction),
                        lambda: ReducePlan.select(ReduceDescriptor(kind, shape, axis, element,
                                                                   correction)))
        return plan, ((_keepdim(shape, axis), element), _workspace(plan)), axis

    plan, (alloc_y, alloc_workspace), current, axis, launches = _site(
        x, ("reduce", kind, dim, correction), make)
    y = alloc_y(x)
    handle = current() if stream is None else stream_handle(stream)
    if launches is not None and alloc_workspace is None:  # torch (see _fast_launch)
        x_ptr, y_ptr = x.data_ptr(), y.data_ptr()
        layout = (x.stride(), x_ptr & 15, y_ptr & 15)
        launch = launches.get(layout)
        if launch is not None:
            launch(handle, x_ptr, y_ptr)
            return y if keepdim else _drop_dim(y, axis)
    args = ReduceArgs(x, y)
    plan.run(args, stream=handle,
             workspace=None if alloc_workspace is None else alloc_workspace(x))
    if launches is not None and alloc_workspace is None:
        _fast_launch(launches, layout, plan, args)
    return y if keepdim else _drop_dim(y, axis)


def _keepdim(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + (1,) + shape[axis + 1:]


def _workspace(plan: Any) -> tuple[tuple[int], ElementKind] | None:
    """The workspace spec of ``plan`` (bytes, allocated per call with the input's
    framework), None if it needs none."""
    size = plan.workspace_size
    return ((size,), ElementKind.U8) if size else None


def sum(x: Any, dim: int, *, keepdim: bool = False, stream: Any = None) -> Any:  # noqa: A001
    """Sum over ``dim`` (f32 accumulation for halves; empty axis -> 0)."""
    return _reduce(ReduceKind.SUM, x, dim, keepdim, 1, stream)


def mean(x: Any, dim: int, *, keepdim: bool = False, stream: Any = None) -> Any:
    """Mean over ``dim`` (empty axis -> NaN)."""
    return _reduce(ReduceKind.MEAN, x, dim, keepdim, 1, stream)


def amax(x: Any, dim: int, *, keepdim: bool = False, stream: Any = None) -> Any:
    """Maximum over ``dim``; NaN propagates."""
    return _reduce(ReduceKind.MAX, x, dim, keepdim, 1, stream)


def amin(x: Any, dim: int, *, keepdim: bool = False, stream: Any = None) -> Any:
    """Minimum over ``dim``; NaN propagates."""
    return _reduce(ReduceKind.MIN, x, dim, keepdim, 1, stream)


def prod(x: Any, dim: int, *, keepdim: bool = False, stream: Any = None) -> Any:
    """Product over ``dim`` (empty axis -> 1)."""
    return _reduce(ReduceKind.PROD, x, dim, keepdim, 1, stream)


def norm(x: Any, dim: int, *, keepdim: bool = False, stream: Any = None) -> Any:
    """Euclidean norm over ``dim`` (no overflow for half inputs)."""
    return _reduce(ReduceKind.NORM2, x, dim, keepdim, 1, stream)


def logsumexp(x: Any, dim: int, *, keepdim: bool = False, stream: Any = None) -> Any:
    """``log(sum(exp(x)))`` over ``dim``, stable (all -inf -> -inf)."""
    return _reduce(ReduceKind.LOG_SUM_EXP, x, dim, keepdim, 1, stream)


def var(x: Any, dim: int, *, correction: int = 1, keepdim: bool = False,
        stream: Any = None) -> Any:
    """Variance over ``dim`` with divisor ``n - correction`` (inf/NaN when <= 0)."""
    return _reduce(ReduceKind.VAR, x, dim, keepdim, correction, stream)


def std(x: Any, dim: int, *, correction: int = 1, keepdim: bool = False,
        stream: Any = None) -> Any:
    """Standard deviation over ``dim`` with divisor ``n - correction``."""
    return _reduce(ReduceKind.STD, x, dim, keepdim, correction, stream)


def _arg_reduce(kind: ReduceKind, x: Any, dim: int, keepdim: bool, stream: Any) -> Any:
    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        axis = _dim(dim, len(shape), kind.name.lower())
        plan = plan_for(("arg_reduce", kind, shape, axis, element),
                        lambda: ArgReducePlan.select(ArgReduceDescriptor(kind, shape, axis,
                                                                         element)))
        return plan, ((_keepdim(shape, axis), ElementKind.I64), _workspace(plan)), axis

    plan, (alloc_y, alloc_workspace), current, axis, *_ = _site(x, ("arg_reduce", kind, dim),
                                                            make)
    y = alloc_y(x)
    plan.run(ArgReduceArgs(x, y), stream=current() if stream is None else stream,
             workspace=None if alloc_workspace is None else alloc_workspace(x))
    return y if keepdim else _drop_dim(y, axis)


def argmax(x: Any, dim: int, *, keepdim: bool = False, stream: Any = None) -> Any:
    """Index (int64) of the first maximum over ``dim``; NaN counts as the maximum."""
    return _arg_reduce(ReduceKind.ARGMAX, x, dim, keepdim, stream)


def argmin(x: Any, dim: int, *, keepdim: bool = False, stream: Any = None) -> Any:
    """Index (int64) of the first minimum over ``dim``; NaN counts as the minimum."""
    return _arg_reduce(ReduceKind.ARGMIN, x, dim, keepdim, stream)


def reduce_backward(kind: ReduceKind, dy: Any, input_shape: Sequence[int], dim: int, *,
                    x: Any = None, y: Any = None, correction: int = 1,
                    stream: Any = None) -> Any:
    """``dx`` of the ``kind`` reduction over ``dim``; ``dy`` and the saved ``y`` keepdim
    (Sum/Mean need neither ``x`` nor ``y``; the others need both). Max/Min split the
    gradient equally across tied maxima."""
    input_shape = tuple(input_shape)

    def make(_dy_shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        shape = tuple(int(s) for s in input_shape)
        axis = _dim(dim, len(shape), "reduce_backward")
        return plan_for(("reduce_bw", kind, shape, axis, element, correction),
                        lambda: ReduceBackwardPlan.select(ReduceBackwardDescriptor(
                            kind, shape, axis, element, correction))), \
            ((shape, element),), axis

    plan, (alloc_dx,), current, *_ = _site(
        dy, ("reduce_bw", kind, input_shape, dim, correction), make)
    dx = alloc_dx(dy)
    plan.run(ReduceBackwardArgs(dy, dx, x, y), stream=current() if stream is None else stream)
    return dx


# -- rotary embedding ----------------------------------------------------------------------


def _pairing(pairing: RopePairing | str) -> RopePairing:
    if isinstance(pairing, RopePairing):
        return pairing
    return RopePairing[pairing.upper().replace("-", "_")]


def _rope(backward: bool, x: Any, positions: Any, base: float, pairing: Any,
          rotary_dim: int | None, inplace: bool, stream: Any) -> Any:
    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        if len(shape) != 4:
            raise InvalidProblem(f"{'rope_backward' if backward else 'rope'}: x must be "
                                 f"[B, H, S, D], got shape {shape}")
        pair = _pairing(pairing)
        options = dict(base=float(base), element=element, pairing=pair,
                       rotary_dim=rotary_dim)
        if backward:
            plan = plan_for(("rope_bw", shape, float(base), element, pair, rotary_dim),
                            lambda: RopeBackwardPlan.select(RopeBackwardDescriptor(
                                *shape, **options)))
        else:
            plan = plan_for(("rope", shape, float(base), element, pair, rotary_dim),
                            lambda: RopePlan.select(RopeDescriptor(*shape, **options)))
        return plan, (None if inplace else (shape, element),), 0

    plan, (alloc_y,), current, *_ = _site(
        x, ("rope", backward, base, pairing, rotary_dim, inplace), make)
    y = x if alloc_y is None else alloc_y(x)
    args = (RopeBackwardArgs if backward else RopeArgs)(x, y, positions)
    plan.run(args, stream=current() if stream is None else stream)
    return y


def rope(x: Any, *, positions: Any = None, base: float = 10000.0,
         pairing: RopePairing | str = RopePairing.INTERLEAVED, rotary_dim: int | None = None,
         inplace: bool = False, stream: Any = None) -> Any:
    """Rotary position embedding of ``x`` ``[B, H, S, D]`` (last axis stride 1; other axes
    any stride). ``positions``: int64 ``[S]`` or ``[B, S]`` (default ``s``)."""
    return _rope(False, x, positions, base, pairing, rotary_dim, inplace, stream)


def rope_backward(dy: Any, *, positions: Any = None, base: float = 10000.0,
                  pairing: RopePairing | str = RopePairing.INTERLEAVED,
                  rotary_dim: int | None = None, inplace: bool = False,
                  stream: Any = None) -> Any:
    """Gradient of :func:`rope`: the rotation of ``dy`` by ``-theta``."""
    return _rope(True, dy, positions, base, pairing, rotary_dim, inplace, stream)


# -- fractional max pooling ----------------------------------------------------------------


def _placement(placement: FractionalPlacement | str) -> FractionalPlacement:
    if isinstance(placement, FractionalPlacement):
        return placement
    return FractionalPlacement[placement.upper()]


# spatial dims -> (plan, descriptor, forward args, backward args)
_FMP_CLASSES = {
    2: (FractionalMaxPool2dPlan, FractionalMaxPool2dDescriptor, FractionalMaxPool2dFwArgs,
        FractionalMaxPool2dBwArgs),
    3: (FractionalMaxPool3dPlan, FractionalMaxPool3dDescriptor, FractionalMaxPool3dFwArgs,
        FractionalMaxPool3dBwArgs),
}


def _fmp_plan(dims: int, shape: tuple[int, ...], window: tuple[int, ...],
              out: tuple[int, ...], element: ElementKind, where: FractionalPlacement) -> Any:
    plan_class, desc_class, _, _ = _FMP_CLASSES[dims]
    return plan_for(("fmp", dims, shape, window, out, element, where),
                    lambda: plan_class.select(desc_class(*shape, *window, *out, element,
                                                         placement=where)))


def _fmp(dims: int, x: Any, kernel_size: Sequence[int] | int, output_size: Sequence[int],
         random_samples: Any, placement: Any, stream: Any) -> tuple[Any, Any]:
    window = _window(kernel_size, dims)
    output_size = tuple(output_size)

    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        if len(shape) != dims + 2:
            raise InvalidProblem(f"fractional_max_pool{dims}d: x must have rank {dims + 2}, "
                                 f"got shape {shape}")
        out = tuple(int(o) for o in output_size)
        plan = _fmp_plan(dims, shape, window, out, element, _placement(placement))
        return plan, ((shape[:2] + out, element), (shape[:2] + out, ElementKind.I64)), 0

    plan, (alloc_y, alloc_indices), current, *_ = _site(
        x, ("fmp", dims, window, output_size, placement), make)
    y, indices = alloc_y(x), alloc_indices(x)
    plan.run_fw(_FMP_CLASSES[dims][2](x, y, indices, random_samples),
                stream=current() if stream is None else stream)
    return y, indices


def _window(kernel_size: Sequence[int] | int, dims: int) -> tuple[int, ...]:
    return (int(kernel_size),) * dims if isinstance(kernel_size, int) \
        else tuple(int(k) for k in kernel_size)


def _fmp_backward(dims: int, dy: Any, indices: Any, input_shape: Sequence[int],
                  kernel_size: Sequence[int] | int, placement: Any, stream: Any) -> Any:
    window = _window(kernel_size, dims)
    input_shape = tuple(input_shape)

    def make(dy_shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        shape = tuple(int(s) for s in input_shape)
        plan = _fmp_plan(dims, shape, window, dy_shape[2:], element, _placement(placement))
        return plan, ((shape, element),), 0

    plan, (alloc_dx,), current, *_ = _site(
        dy, ("fmp_bw", dims, input_shape, window, placement), make)
    dx = alloc_dx(dy)
    plan.run_bw(_FMP_CLASSES[dims][3](dy, indices, dx),
                stream=current() if stream is None else stream)
    return dx


def fractional_max_pool2d(x: Any, kernel_size: Sequence[int] | int, output_size: Sequence[int],
                          random_samples: Any, *, placement: Any = "baracuda",
                          stream: Any = None) -> tuple[Any, Any]:
    """Fractional max pooling of NCHW ``x``: ``(y, indices)``, indices int64 offsets into
    the whole input. ``random_samples``: f32 ``[N, C, 2]`` uniforms in [0, 1)."""
    return _fmp(2, x, kernel_size, output_size, random_samples, placement, stream)


def fractional_max_pool3d(x: Any, kernel_size: Sequence[int] | int, output_size: Sequence[int],
                          random_samples: Any, *, placement: Any = "baracuda",
                          stream: Any = None) -> tuple[Any, Any]:
    """3-D sibling of :func:`fractional_max_pool2d` (NCDHW, samples ``[N, C, 3]``)."""
    return _fmp(3, x, kernel_size, output_size, random_samples, placement, stream)


def fractional_max_pool2d_backward(dy: Any, indices: Any, input_shape: Sequence[int],
                                   kernel_size: Sequence[int] | int, *,
                                   placement: Any = "baracuda", stream: Any = None) -> Any:
    """``dx`` of :func:`fractional_max_pool2d`: deterministic, every element written."""
    return _fmp_backward(2, dy, indices, input_shape, kernel_size, placement, stream)


def fractional_max_pool3d_backward(dy: Any, indices: Any, input_shape: Sequence[int],
                                   kernel_size: Sequence[int] | int, *,
                                   placement: Any = "baracuda", stream: Any = None) -> Any:
    """``dx`` of :func:`fractional_max_pool3d`."""
    return _fmp_backward(3, dy, indices, input_shape, kernel_size, placement, stream)
