"""Functional reductions: sum, mean, amax, amin, prod, norm, logsumexp, var, std,
argmax, argmin and the reduction backward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

__all__ = [
    "amax", "amin", "argmax", "argmin", "logsumexp", "mean", "norm", "prod", "reduce_backward",
    "std", "sum", "var",
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
    if launches is not None and alloc_workspace is None:  # torch (see fast_launch)
        x_ptr, y_ptr = x.data_ptr(), y.data_ptr()
        layout = (x.stride(), x_ptr & 15, y_ptr & 15)
        launch = launches.get(layout)
        if launch is not None:
            launch(handle, x_ptr, y_ptr)
            return y if keepdim else drop_dim(y, axis)
    args = ReduceArgs(x, y)
    plan.run(args, stream=handle,
             workspace=None if alloc_workspace is None else alloc_workspace(x))
    if launches is not None and alloc_workspace is None:
        fast_launch(launches, layout, plan, args)
    return y if keepdim else drop_dim(y, axis)


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
        axis = normalize_dim(dim, len(shape), "reduce_backward")
        return plan_for(("reduce_bw", kind, shape, axis, element, correction),
                        lambda: ReduceBackwardPlan.select(ReduceBackwardDescriptor(
                            kind, shape, axis, element, correction))), \
            ((shape, element),), axis

    plan, (alloc_dx,), current, *_ = call_site(
        dy, ("reduce_bw", kind, input_shape, dim, correction), make)
    dx = alloc_dx(dy)
    plan.run(ReduceBackwardArgs(dy, dx, x, y), stream=current() if stream is None else stream)
    return dx
