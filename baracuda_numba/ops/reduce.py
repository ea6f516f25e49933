"""Functional reductions: sum, mean, amax, amin, prod, norm, logsumexp, var, std,
argmax, argmin and the reduction backward.

``dim`` is one axis, several (a tuple or list) or None (every axis; ``()`` too, as torch),
except ``prod`` (one axis or None) and ``argmax`` / ``argmin`` (None: the index into the
flattened input). Several axes run as ONE single-axis plan launch on a view where the
reduced axes collapse (:func:`axis_layout`), else on a contiguous copy permuted through
``WriteSlicePlan`` (every kind, Var/Std included: no sequential reductions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from .._frameworks import allocator, element_of
from .._runtime import SIMULATOR
from ..arrays import as_ref, contiguous_strides
from ..errors import InvalidProblem
from ..plans.base import product
from ..plans.reduce import (
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
from ..streams import stream_handle
from ..types import ElementKind, ReduceKind
from ._core import (
    call_site,
    drop_dim,
    fast_launch,
    keepdim_shape,
    normalize_dim,
    plan_for,
    workspace_spec,
)
from .write_slice import write_slice

__all__ = [
    "AxisLayout", "amax", "amin", "argmax", "argmin", "axis_layout", "logsumexp", "mean",
    "norm", "prod", "reduce_axes", "reduce_backward", "std", "sum", "var",
]


def _reduce(kind: ReduceKind, x: Any, dim: int, keepdim: bool, correction: int,
            stream: Any) -> Any:
    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        axis = normalize_dim(dim, len(shape), kind.name.lower())
        plan = plan_for(("reduce", kind, shape, axis, element, correction),
                        lambda: ReducePlan.select(ReduceDescriptor(kind, shape, axis, element,
                                                                   correction)))
        return plan, ((keepdim_shape(shape, axis), element), workspace_spec(plan)), axis

    plan, (alloc_y, alloc_workspace), current, axis, launches = call_site(
        x, ("reduce", kind, dim, correction), make)
    y = alloc_y(x)
    handle = current() if stream is None else stream_handle(stream)
    workspace = None if alloc_workspace is None else alloc_workspace(x)
    if launches is not None:  # torch (see fast_launch)
        x_ptr, y_ptr = x.data_ptr(), y.data_ptr()
        ws_ptr = 0 if workspace is None else workspace.data_ptr()
        layout = (x.stride(), x_ptr & 15, y_ptr & 15, ws_ptr & 15)
        launch = launches.get(layout)
        if launch is not None:
            launch(handle, x_ptr, y_ptr, ws_ptr)
            return y if keepdim else drop_dim(y, axis)
    args = ReduceArgs(x, y)
    plan.run(args, stream=handle, workspace=workspace)
    if launches is not None:
        fast_launch(launches, layout, plan, args, workspace)
    return y if keepdim else drop_dim(y, axis)


#: ``dim`` of a reduction: one axis, several (a tuple or list), or None (every axis).
Dim = int | Sequence[int] | None


def reduce_axes(dim: Dim, rank: int, fn: str) -> tuple[int, ...]:
    """The sorted, non-negative axes ``dim`` names (torch's rules): None and ``()`` mean
    every axis (``torch.sum(x, dim=())`` reduces all of them), negative axes count from
    the end, a repeated axis is ``InvalidProblem``. A 0-d tensor takes 0, -1, None or ()."""
    if dim is None:
        return tuple(range(rank))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if not dims:
        return tuple(range(rank))
    axes = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int):
            raise InvalidProblem(f"{fn}: dim = {dim!r} must be an int, a sequence of ints or "
                                 "None")
        if rank == 0 and d not in (0, -1):
            raise InvalidProblem(f"{fn}: dim = {d} is out of range for a 0-d tensor")
        axes.append(normalize_dim(d, rank, fn) if rank else 0)
    if len(set(axes)) != len(axes):
        raise InvalidProblem(f"{fn}: dim = {dim!r} names an axis more than once")
    return tuple(sorted(axes)) if rank else ()


class AxisLayout(NamedTuple):
    """How a reduction over ``axes`` of an array runs as ONE single-axis reduction.

    ``perm`` None: the array viewed (no copy) as ``shape``, reducing ``axis``: every run
    of adjacent reduced axes of extent > 1 collapses into one axis (``mean(-2, -1)`` of
    NCHW is ``[N, C, H*W]`` along 2, ``sum((0, 1))`` of ``[B, S, D]`` is ``[B*S, D]`` along
    0). Otherwise (reduced axes apart, or a run whose strides do not merge) the array is
    copied contiguously in the order ``perm`` (kept axes, then reduced axes) and that copy
    viewed as ``shape`` = ``(kept, reduced)`` along 1. ``keep_shape``: the result with
    keepdim (1 at every reduced axis)."""

    perm: tuple[int, ...] | None
    shape: tuple[int, ...]
    axis: int
    keep_shape: tuple[int, ...]


def axis_layout(shape: tuple[int, ...], strides: tuple[int, ...],
                axes: tuple[int, ...]) -> AxisLayout:
    """The :class:`AxisLayout` of a reduction over ``axes`` (sorted) of an array of
    ``shape`` / element ``strides`` (a pure function of the layout)."""
    # lists and loops only (no generator expressions): torch.compile traces this function
    keep_shape = tuple([1 if d in axes else n for d, n in enumerate(shape)])
    big = [d for d in axes if shape[d] != 1]
    kept = [d for d in range(len(shape)) if d not in axes]
    if not big:  # only extent-1 axes: reduce a trailing axis of 1
        return AxisLayout(None, tuple([shape[d] for d in kept]) + (1,), len(kept), keep_shape)
    merged = True
    for a, b in zip(big, big[1:]):
        merged = merged and strides[a] == strides[b] * shape[b]
    between = False
    for d in range(big[0], big[-1] + 1):
        between = between or (d not in axes and shape[d] != 1)
    if merged and not between:
        kept_before = [shape[d] for d in kept if d < big[0]]
        kept_after = [shape[d] for d in kept if d > big[-1]]
        return AxisLayout(None, (*kept_before, product([shape[d] for d in big]), *kept_after),
                          len(kept_before), keep_shape)
    return AxisLayout(tuple(kept) + tuple(axes), (product([shape[d] for d in kept]),
                                                  product([shape[d] for d in axes])),
                      1, keep_shape)


def _permute(x: Any, perm: tuple[int, ...]) -> Any:
    """A view of ``x`` with its axes in the order ``perm``. Numba's device arrays transpose
    only 2-d arrays, and by a copy on the default stream, so theirs is built from the
    permuted shape and strides over the same memory."""
    if hasattr(x, "permute"):
        return x.permute(*perm)
    if hasattr(x, "gpu_data") and not SIMULATOR:
        from numba.cuda.cudadrv.devicearray import DeviceNDArray

        return DeviceNDArray(tuple(x.shape[d] for d in perm), tuple(x.strides[d] for d in perm),
                             x.dtype, stream=x.stream, gpu_data=x.gpu_data)
    return x.transpose(perm)


def permuted_copy(x: Any, perm: tuple[int, ...], stream: Any = None) -> Any:
    """A contiguous copy of ``x`` with its axes in the order ``perm`` (WriteSlicePlan)."""
    source = _permute(x, perm)
    shape = tuple(int(n) for n in source.shape)
    dest = allocator(x, shape, element_of(x), contiguous=True)(x)
    if math.prod(shape) == 0:
        return dest
    return write_slice(dest, source, (0,) * len(shape), stream=stream)


def _collapsed(x: Any, dim: Dim, fn: str,
               stream: Any) -> tuple[Any, AxisLayout, tuple[int, ...]]:
    """``x`` as the single-axis problem of a reduction over ``dim`` (a view, or the
    permuted copy), its layout and the result's shape without keepdim."""
    shape = tuple(int(n) for n in x.shape)
    axes = reduce_axes(dim, len(shape), fn)
    strides = as_ref(x, fn, "x").strides if math.prod(shape) else contiguous_strides(shape)
    layout = axis_layout(shape, strides, axes)
    source = x if layout.perm is None else permuted_copy(x, layout.perm, stream)
    out_shape = tuple(n for d, n in enumerate(shape) if d not in axes)
    return source.reshape(layout.shape), layout, out_shape


def _multi(kind: ReduceKind, x: Any, dim: Dim, keepdim: bool, correction: float,
           stream: Any) -> Any:
    """A reduction over several axes (or none given: all) as one single-axis launch."""
    if isinstance(dim, int) and x.ndim:
        return _reduce(kind, x, dim, keepdim, correction, stream)
    source, layout, out_shape = _collapsed(x, dim, kind.name.lower(), stream)
    y = _reduce(kind, source, layout.axis, True, correction, stream)
    return y.reshape(layout.keep_shape if keepdim else out_shape)


def sum(x: Any, dim: Dim = None, *, keepdim: bool = False, stream: Any = None) -> Any:  # noqa: A001
    """Sum over ``dim`` (f32 accumulation for halves; empty axis -> 0)."""
    return _multi(ReduceKind.SUM, x, dim, keepdim, 1, stream)


def mean(x: Any, dim: Dim = None, *, keepdim: bool = False, stream: Any = None) -> Any:
    """Mean over ``dim`` (empty axis -> NaN)."""
    return _multi(ReduceKind.MEAN, x, dim, keepdim, 1, stream)


def amax(x: Any, dim: Dim = None, *, keepdim: bool = False, stream: Any = None) -> Any:
    """Maximum over ``dim``; NaN propagates."""
    return _multi(ReduceKind.MAX, x, dim, keepdim, 1, stream)


def amin(x: Any, dim: Dim = None, *, keepdim: bool = False, stream: Any = None) -> Any:
    """Minimum over ``dim``; NaN propagates."""
    return _multi(ReduceKind.MIN, x, dim, keepdim, 1, stream)


def prod(x: Any, dim: int | None = None, *, keepdim: bool = False, stream: Any = None) -> Any:
    """Product over ``dim`` (empty axis -> 1); one axis or None (all), as torch.prod."""
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)):
        raise InvalidProblem(f"prod: dim = {dim!r} must be an int or None (torch.prod "
                             "reduces one axis or all)")
    return _multi(ReduceKind.PROD, x, dim, keepdim, 1, stream)


def norm(x: Any, dim: Dim = None, *, keepdim: bool = False, stream: Any = None) -> Any:
    """Euclidean norm over ``dim`` (no overflow for half inputs)."""
    return _multi(ReduceKind.NORM2, x, dim, keepdim, 1, stream)


def logsumexp(x: Any, dim: Dim = None, *, keepdim: bool = False, stream: Any = None) -> Any:
    """``log(sum(exp(x)))`` over ``dim``, stable (all -inf -> -inf)."""
    return _multi(ReduceKind.LOG_SUM_EXP, x, dim, keepdim, 1, stream)


def var(x: Any, dim: Dim = None, *, correction: float = 1, keepdim: bool = False,
        stream: Any = None) -> Any:
    """Variance over ``dim`` with divisor ``n - correction`` (inf/NaN when <= 0)."""
    return _multi(ReduceKind.VAR, x, dim, keepdim, correction, stream)


def std(x: Any, dim: Dim = None, *, correction: float = 1, keepdim: bool = False,
        stream: Any = None) -> Any:
    """Standard deviation over ``dim`` with divisor ``n - correction``."""
    return _multi(ReduceKind.STD, x, dim, keepdim, correction, stream)


def _arg_reduce(kind: ReduceKind, x: Any, dim: int, keepdim: bool, stream: Any) -> Any:
    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        axis = normalize_dim(dim, len(shape), kind.name.lower())
        plan = plan_for(("arg_reduce", kind, shape, axis, element),
                        lambda: ArgReducePlan.select(ArgReduceDescriptor(kind, shape, axis,
                                                                         element)))
        return plan, ((keepdim_shape(shape, axis), ElementKind.I64), workspace_spec(plan)), axis

    plan, (alloc_y, alloc_workspace), current, axis, *_ = call_site(x, ("arg_reduce", kind, dim),
                                                            make)
    y = alloc_y(x)
    plan.run(ArgReduceArgs(x, y), stream=current() if stream is None else stream,
             workspace=None if alloc_workspace is None else alloc_workspace(x))
    return y if keepdim else drop_dim(y, axis)


def _arg_multi(kind: ReduceKind, x: Any, dim: int | None, keepdim: bool,
               stream: Any) -> Any:
    """``dim`` None (or a 0-d ``x``): the index into the row-major flattened ``x``, as
    torch (a view where ``x`` flattens without a copy, else a contiguous copy first)."""
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)):
        raise InvalidProblem(f"{kind.name.lower()}: dim = {dim!r} must be an int or None")
    if dim is not None and x.ndim:
        return _arg_reduce(kind, x, dim, keepdim, stream)
    source, layout, _ = _collapsed(x, None, kind.name.lower(), stream)
    numel = math.prod(layout.shape)
    flat_x = source.reshape((numel,))
    y = _arg_reduce(kind, flat_x, 0, True, stream)
    return y.reshape(layout.keep_shape if keepdim else ())


def argmax(x: Any, dim: int | None = None, *, keepdim: bool = False,
           stream: Any = None) -> Any:
    """Index (int64) of the first maximum over ``dim`` (None: into the flattened ``x``);
    NaN counts as the maximum."""
    return _arg_multi(ReduceKind.ARGMAX, x, dim, keepdim, stream)


def argmin(x: Any, dim: int | None = None, *, keepdim: bool = False,
           stream: Any = None) -> Any:
    """Index (int64) of the first minimum over ``dim`` (None: into the flattened ``x``);
    NaN counts as the minimum."""
    return _arg_multi(ReduceKind.ARGMIN, x, dim, keepdim, stream)


def reduce_backward(kind: ReduceKind, dy: Any, input_shape: Sequence[int], dim: Dim, *,
                    x: Any = None, y: Any = None, correction: float = 1,
                    stream: Any = None) -> Any:
    """``dx`` of the ``kind`` reduction over ``dim`` (an int, a sequence of ints or None:
    every axis); ``dy`` and the saved ``y`` keepdim (Sum/Mean need neither ``x`` nor
    ``y``; the others need both). Max/Min split the gradient equally across tied maxima.
    Several axes run as one single-axis gradient on the forward's :class:`AxisLayout`
    (``x`` viewed, or permuted and copied; ``dx`` then a permuted view)."""
    input_shape = tuple(int(n) for n in input_shape)
    if isinstance(dim, int) and input_shape:
        return _reduce_backward_axis(kind, dy, input_shape, dim, x, y, correction, stream)
    axes = reduce_axes(dim, len(input_shape), "reduce_backward")
    strides = as_ref(x, "reduce_backward", "x").strides \
        if x is not None and math.prod(input_shape) else contiguous_strides(input_shape)
    layout = axis_layout(input_shape, strides, axes)
    keep = layout.shape[:layout.axis] + (1,) + layout.shape[layout.axis + 1:]
    if layout.perm is None:
        dx = _reduce_backward_axis(
            kind, dy.reshape(keep), layout.shape, layout.axis,
            None if x is None else x.reshape(layout.shape),
            None if y is None else y.reshape(keep), correction, stream)
        return dx.reshape(input_shape)
    perm = layout.perm
    dy_p = _permute(dy.reshape(layout.keep_shape), perm).reshape(keep)
    y_p = None if y is None else _permute(y.reshape(layout.keep_shape), perm).reshape(keep)
    x_p = None if x is None else permuted_copy(x, perm, stream).reshape(layout.shape)
    dx = _reduce_backward_axis(kind, dy_p, layout.shape, layout.axis, x_p, y_p, correction,
                               stream)
    inverse = tuple(perm.index(d) for d in range(len(perm)))
    return _permute(dx.reshape(tuple(input_shape[d] for d in perm)), inverse)


def _reduce_backward_axis(kind: ReduceKind, dy: Any, input_shape: tuple[int, ...], dim: int,
                          x: Any, y: Any, correction: float, stream: Any) -> Any:
    """The single-axis gradient through the cached ReduceBackwardPlan (its workspace
    allocated per call where it asks for one)."""

    def make(_dy_shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        shape = tuple(int(s) for s in input_shape)
        axis = normalize_dim(dim, len(shape), "reduce_backward")
        plan = plan_for(("reduce_bw", kind, shape, axis, element, correction),
                        lambda: ReduceBackwardPlan.select(ReduceBackwardDescriptor(
                            kind, shape, axis, element, correction)))
        return plan, ((shape, element), workspace_spec(plan)), axis

    plan, (alloc_dx, alloc_workspace), current, *_ = call_site(
        dy, ("reduce_bw", kind, input_shape, dim, correction), make)
    dx = alloc_dx(dy)
    plan.run(ReduceBackwardArgs(dy, dx, x, y), stream=current() if stream is None else stream,
             workspace=None if alloc_workspace is None else alloc_workspace(dy))
    return dx
