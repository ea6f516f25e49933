"""Functional softmax and log-softmax along one axis, and their backward."""

from __future__ import annotations

from typing import Any

from .._frameworks import framework_of
from ..plans.softmax import (
    SoftmaxArgs,
    SoftmaxBackwardArgs,
    SoftmaxBackwardDescriptor,
    SoftmaxBackwardPlan,
    SoftmaxDescriptor,
    SoftmaxPlan,
)
from ..types import ElementKind, SoftmaxKind
from ._core import call_site, normalize_dim, plan_for

__all__ = ["log_softmax", "softmax", "softmax_backward"]


def _strides(x: Any) -> tuple[int, ...]:
    """Strides of ``x`` in elements."""
    if framework_of(x) == "torch":
        return tuple(x.stride())
    return tuple(s // x.dtype.itemsize for s in x.strides)


def _cast(x: Any, dtype: Any) -> Any:
    """``x`` as ``dtype`` (torch's ``dtype=``: the input is cast before the op)."""
    if dtype is None or x.dtype == dtype:
        return x
    return x.to(dtype) if framework_of(x) == "torch" else x.astype(dtype)


def _run(kind: SoftmaxKind, backward: bool, arrays: tuple[Any, ...], dim: int, scale: float,
         stream: Any) -> Any:
    first = arrays[0]
    name = ("log_softmax" if kind is SoftmaxKind.LOG_SOFTMAX else "softmax") + (
        "_backward" if backward else "")

    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        axis = normalize_dim(dim, len(shape), name)
        plan_cls, desc_cls = ((SoftmaxBackwardPlan, SoftmaxBackwardDescriptor) if backward
                              else (SoftmaxPlan, SoftmaxDescriptor))
        plan = plan_for(("softmax", backward, kind, shape, axis, element, float(scale)),
                        lambda: plan_cls.select(desc_cls(shape, axis, kind, element,
                                                         float(scale))))
        workspace = (plan.workspace_size,) if plan.workspace_size else None
        return plan, ((shape, element), workspace and (workspace, ElementKind.U8)), axis

    plan, (alloc_out, alloc_workspace), current, *_ = call_site(
        first, ("softmax", backward, kind, dim, scale), make)
    out = alloc_out(first)
    workspace = None
    if alloc_workspace is not None and plan.workspace_size_for(_strides(first)):
        workspace = alloc_workspace(first)
    args = SoftmaxBackwardArgs(*arrays, out) if backward else SoftmaxArgs(first, out)
    plan.run(args, stream=current() if stream is None else stream, workspace=workspace)
    return out


def softmax(x: Any, dim: int, *, dtype: Any = None, scale: float = 1.0,
            stream: Any = None) -> Any:
    """``exp(x' - max) / sum(exp(x' - max))`` along ``dim`` with ``x' = scale * x`` (cast
    to ``dtype`` first when given). A row holding NaN or +inf, or all -inf, gives NaN."""
    return _run(SoftmaxKind.SOFTMAX, False, (_cast(x, dtype),), dim, scale, stream)


def log_softmax(x: Any, dim: int, *, dtype: Any = None, scale: float = 1.0,
                stream: Any = None) -> Any:
    """``(x' - max) - log(sum(exp(x' - max)))`` along ``dim`` with ``x' = scale * x``."""
    return _run(SoftmaxKind.LOG_SOFTMAX, False, (_cast(x, dtype),), dim, scale, stream)


def softmax_backward(dy: Any, y: Any, dim: int, *, log: bool = False, scale: float = 1.0,
                     stream: Any = None) -> Any:
    """``dx`` from the saved forward output ``y``: softmax ``scale * y * (dy - sum(dy *
    y))``; with ``log=True`` (``y`` the log-probabilities) ``scale * (dy - exp(y) *
    sum(dy))``."""
    kind = SoftmaxKind.LOG_SOFTMAX if log else SoftmaxKind.SOFTMAX
    return _run(kind, True, (dy, y), dim, scale, stream)
