"""torch twins of softmax and log_softmax (autograd, ``torch.library`` custom ops)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops.softmax import _run
from ..types import SoftmaxKind
from ._core import LIB, EagerFunction, compiling, needs_grad

__all__ = ["log_softmax", "softmax"]


@torch.library.custom_op(f"{LIB}::softmax", mutates_args=())
def _softmax_op(x: Tensor, kind: int, dim: int, scale: float) -> Tensor:
    return _run(SoftmaxKind(kind), False, (x,), dim, scale, None)


@_softmax_op.register_fake
def _(x: Tensor, kind: int, dim: int, scale: float) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{LIB}::softmax_backward", mutates_args=())
def _softmax_backward_op(dy: Tensor, y: Tensor, kind: int, dim: int, scale: float) -> Tensor:
    return _run(SoftmaxKind(kind), True, (dy, y), dim, scale, None)


@_softmax_backward_op.register_fake
def _(dy: Tensor, y: Tensor, kind: int, dim: int, scale: float) -> Tensor:
    return torch.empty_like(y)


def _setup(ctx, inputs, output) -> None:
    _, kind, dim, scale = inputs
    ctx.kind, ctx.dim, ctx.scale = kind, dim, scale
    ctx.save_for_backward(output)


def _backward_op(ctx, grad: Tensor):
    (y,) = ctx.saved_tensors
    return _softmax_backward_op(grad, y, ctx.kind, ctx.dim, ctx.scale), None, None, None


_softmax_op.register_autograd(_backward_op, setup_context=_setup)


class _SoftmaxFunction(EagerFunction):
    """Eager twin of ``baracuda::softmax``."""

    @staticmethod
    def forward(x, kind, dim, scale):
        return _run(SoftmaxKind(kind), False, (x,), dim, scale, None)

    setup_context = staticmethod(_setup)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        dx = _run(SoftmaxKind(ctx.kind), True, (grad, y), ctx.dim, ctx.scale, None)
        return dx, None, None, None


def _softmax(kind: SoftmaxKind, x: Tensor, dim: int, dtype: torch.dtype | None,
             scale: float) -> Tensor:
    if dtype is not None and x.dtype != dtype:
        x = x.to(dtype)
    if compiling():
        return _softmax_op(x, int(kind), dim, float(scale))
    if not needs_grad(x):
        return _run(kind, False, (x,), dim, scale, None)
    return _SoftmaxFunction.apply(x, int(kind), dim, float(scale))


def softmax(x: Tensor, dim: int, *, dtype: torch.dtype | None = None,
            scale: float = 1.0) -> Tensor:
    """``torch.softmax(x * scale, dim, dtype=dtype)``; differentiable."""
    return _softmax(SoftmaxKind.SOFTMAX, x, dim, dtype, scale)


def log_softmax(x: Tensor, dim: int, *, dtype: torch.dtype | None = None,
                scale: float = 1.0) -> Tensor:
    """``torch.log_softmax(x * scale, dim, dtype=dtype)``; differentiable."""
    return _softmax(SoftmaxKind.LOG_SOFTMAX, x, dim, dtype, scale)
