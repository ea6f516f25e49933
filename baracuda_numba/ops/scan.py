"""Functional scans: cumsum, cumprod, logcumsumexp, cummax, cummin and their backward."""

from __future__ import annotations

from typing import Any

from ..plans.scan import (
    ScanArgs,
    ScanBackwardArgs,
    ScanBackwardDescriptor,
    ScanBackwardPlan,
    ScanDescriptor,
    ScanPlan,
)
from ..streams import stream_handle
from ..types import ElementKind, ScanKind
from ._core import call_site, fast_launch, normalize_dim, plan_for, workspace_spec

__all__ = ["cummax", "cummin", "cumprod", "cumsum", "logcumsumexp", "scan_backward"]


def _scan(kind: ScanKind, x: Any, dim: int, reverse: bool, stream: Any,
          with_indices: bool) -> Any:
    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        axis = normalize_dim(dim, len(shape), kind.name.lower())
        plan = plan_for(("scan", kind, shape, axis, reverse, element), lambda: ScanPlan.select(
            ScanDescriptor(kind, shape, axis, reverse, element=element)))
        return plan, ((shape, element), (shape, ElementKind.I64) if with_indices else None,
                      workspace_spec(plan)), axis

    plan, (alloc_y, alloc_indices, alloc_workspace), current, _, launches = call_site(
        x, ("scan", kind, dim, reverse, with_indices), make)
    y = alloc_y(x)
    indices = None if alloc_indices is None else alloc_indices(x)
    handle = current() if stream is None else stream_handle(stream)
    # the plan's split path for few long lines: the workspace it asks for, every call
    workspace = None if alloc_workspace is None else alloc_workspace(x)
    if launches is not None:  # torch: the input's layout picks the launch (fast_launch)
        pointers = (x.data_ptr(), y.data_ptr(), 0 if indices is None else indices.data_ptr(),
                    0 if workspace is None else workspace.data_ptr())
        layout = (x.stride(), pointers[0] & 15, pointers[1] & 15, pointers[2] & 15,
                  pointers[3] & 15)
        launch = launches.get(layout)
        if launch is not None:
            launch(handle, *pointers)
            return (y, indices) if with_indices else y
    args = ScanArgs(x, y, indices)
    plan.run(args, stream=handle, workspace=workspace)
    if launches is not None:
        fast_launch(launches, layout, plan, args, workspace)
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
        axis = normalize_dim(dim, len(shape), "scan_backward")
        plan = plan_for(("scan_bw", kind, shape, axis, reverse, element),
                        lambda: ScanBackwardPlan.select(ScanBackwardDescriptor(
                            kind, shape, axis, reverse, element=element)))
        return plan, ((shape, element), workspace_spec(plan)), axis

    plan, (alloc_dx, alloc_workspace), current, *_ = call_site(
        dy, ("scan_bw", kind, dim, reverse), make)
    dx = alloc_dx(dy)
    plan.run(ScanBackwardArgs(dy, dx, x, y), stream=current() if stream is None else stream,
             workspace=None if alloc_workspace is None else alloc_workspace(dy))
    return dx
