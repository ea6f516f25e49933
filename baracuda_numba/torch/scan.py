"""torch twins of the scans: cumsum, cumprod, logcumsumexp, cummax, cummin."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ..errors import InvalidProblem
from ..ops.scan import _scan as _scan_call
from ..types import ScanKind
from ._core import LIB, EagerFunction, compiling, needs_grad, no_indices

__all__ = ["cummax", "cummin", "cumprod", "cumsum", "logcumsumexp"]

# kind -> (saves x, saves y)
_SCAN_SAVES = {
    ScanKind.CUMSUM: (False, False),
    ScanKind.CUMPROD: (True, True),
    ScanKind.CUMMAX: (True, False),
    ScanKind.CUMMIN: (True, False),
    ScanKind.LOG_CUMSUM_EXP: (True, True),
}


@torch.library.custom_op(f"{LIB}::scan", mutates_args=())
def _scan_op(x: Tensor, kind: int, dim: int, reverse: bool) -> tuple[Tensor, Tensor]:
    return _scan_impl(x, kind, dim, reverse)


@_scan_op.register_fake
def _(x: Tensor, kind: int, dim: int, reverse: bool) -> tuple[Tensor, Tensor]:
    if ScanKind(kind) in (ScanKind.CUMMAX, ScanKind.CUMMIN):
        return torch.empty_like(x), torch.empty_like(x, dtype=torch.int64)
    return torch.empty_like(x), x.new_empty((0,), dtype=torch.int64)


@torch.library.custom_op(f"{LIB}::scan_backward", mutates_args=())
def _scan_backward_op(dy: Tensor, x: Tensor | None, y: Tensor | None, kind: int, dim: int,
                      reverse: bool) -> Tensor:
    return ops.scan_backward(ScanKind(kind), dy, dim, x=x, y=y, reverse=reverse)


@_scan_backward_op.register_fake
def _(dy: Tensor, x: Tensor | None, y: Tensor | None, kind: int, dim: int,
      reverse: bool) -> Tensor:
    return torch.empty_like(dy)


def _scan_setup(ctx, inputs, output) -> None:
    x, kind, dim, reverse = inputs
    saves_x, saves_y = _SCAN_SAVES[ScanKind(kind)]
    ctx.kind, ctx.dim, ctx.reverse = kind, dim, reverse
    ctx.save_for_backward(x if saves_x else None, output[0] if saves_y else None)


def _scan_backward(ctx, grad_y: Tensor, grad_indices: Tensor):
    x, y = ctx.saved_tensors
    dx = _scan_backward_op(grad_y, x, y, ctx.kind, ctx.dim, ctx.reverse)
    return dx, None, None, None


_scan_op.register_autograd(_scan_backward, setup_context=_scan_setup)


class _ScanFunction(EagerFunction):
    """Eager twin of ``baracuda::scan`` (same forward, same backward plan)."""

    @staticmethod
    def forward(x, kind, dim, reverse):
        return _scan_impl(x, kind, dim, reverse)

    setup_context = staticmethod(_scan_setup)

    @staticmethod
    def backward(ctx, grad_y, grad_indices):
        x, y = ctx.saved_tensors
        dx = ops.scan_backward(ScanKind(ctx.kind), grad_y, ctx.dim, x=x, y=y,
                               reverse=ctx.reverse)
        return dx, None, None, None


def _scan_impl(x: Tensor, kind: int, dim: int, reverse: bool) -> tuple[Tensor, Tensor]:
    scan_kind = ScanKind(kind)
    if scan_kind in (ScanKind.CUMMAX, ScanKind.CUMMIN):
        values, indices = _scan_call(scan_kind, x, dim, reverse, None, True)
        return values, indices
    return _scan_call(scan_kind, x, dim, reverse, None, False), no_indices(x)


def _scan(x: Tensor, kind: ScanKind, dim: int, reverse: bool) -> tuple[Tensor, Tensor]:
    if x.dim() == 0:  # torch: a 0-d tensor scans as one element along dim 0 or -1
        if dim not in (0, -1):
            raise InvalidProblem(f"{kind.name.lower()}: dim = {dim} is out of range for a "
                                 "0-d tensor")
        values, indices = _scan(x.reshape(1), kind, 0, reverse)
        return values.reshape(()), indices.reshape(()) if indices.numel() else indices
    if compiling():
        return _scan_op(x, int(kind), dim, reverse)
    if not needs_grad(x):
        return _scan_impl(x, int(kind), dim, reverse)
    return _ScanFunction.apply(x, int(kind), dim, reverse)


def _promoted(x: Tensor, dtype: torch.dtype | None) -> Tensor:
    """torch's promotion of cumsum / cumprod: ``dtype`` casts first; bool and integer
    inputs accumulate in int64."""
    if dtype is not None:
        return x.to(dtype)
    return x.to(torch.int64) if x.dtype in _INT64_SCANS else x


_INT64_SCANS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32)


def cumsum(x: Tensor, dim: int, *, dtype: torch.dtype | None = None,
           reverse: bool = False) -> Tensor:
    """``torch.cumsum`` (f32 accumulation for halves; bool and integers in int64);
    ``reverse`` scans from the end."""
    return _scan(_promoted(x, dtype), ScanKind.CUMSUM, dim, reverse)[0]


def cumprod(x: Tensor, dim: int, *, dtype: torch.dtype | None = None,
            reverse: bool = False) -> Tensor:
    """``torch.cumprod``; the gradient is exact when ``x`` has zeros."""
    return _scan(_promoted(x, dtype), ScanKind.CUMPROD, dim, reverse)[0]


def logcumsumexp(x: Tensor, dim: int, *, reverse: bool = False) -> Tensor:
    """``torch.logcumsumexp`` (all -inf prefix -> -inf)."""
    return _scan(x, ScanKind.LOG_CUMSUM_EXP, dim, reverse)[0]


def cummax(x: Tensor, dim: int, *, reverse: bool = False) -> tuple[Tensor, Tensor]:
    """``torch.cummax``: (values, indices); NaN propagates."""
    return _scan(x, ScanKind.CUMMAX, dim, reverse)


def cummin(x: Tensor, dim: int, *, reverse: bool = False) -> tuple[Tensor, Tensor]:
    """``torch.cummin``: (values, indices); NaN propagates."""
    return _scan(x, ScanKind.CUMMIN, dim, reverse)
