"""torch twins of the reductions: sum, mean, amax, amin, prod, norm, logsumexp, var, std,
argmax, argmin."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .. import ops
from ..ops.reduce import _arg_reduce as _arg_reduce_call
from ..ops.reduce import _reduce as _reduce_call
from ..types import ReduceKind
from ._core import LIB, compiling, needs_grad

__all__ = ["amax", "amin", "argmax", "argmin", "logsumexp", "mean", "norm", "prod", "std", "sum",
           "var"]

_NO_SAVED = (ReduceKind.SUM, ReduceKind.MEAN)


@torch.library.custom_op(f"{LIB}::reduce", mutates_args=())
def _reduce_op(x: Tensor, kind: int, dim: int, correction: int) -> Tensor:
    return _reduce_call(ReduceKind(kind), x, dim, True, correction, None)


@_reduce_op.register_fake
def _(x: Tensor, kind: int, dim: int, correction: int) -> Tensor:
    shape = list(x.shape)
    shape[dim % x.dim()] = 1
    return x.new_empty(shape)


@torch.library.custom_op(f"{LIB}::reduce_backward", mutates_args=())
def _reduce_backward_op(dy: Tensor, x: Tensor | None, y: Tensor | None,
                        input_shape: Sequence[int], kind: int, dim: int,
                        correction: int) -> Tensor:
    return ops.reduce_backward(ReduceKind(kind), dy, input_shape, dim, x=x, y=y,
                               correction=correction)


@_reduce_backward_op.register_fake
def _(dy: Tensor, x: Tensor | None, y: Tensor | None, input_shape: Sequence[int], kind: int,
      dim: int, correction: int) -> Tensor:
    return dy.new_empty(list(input_shape))


def _reduce_setup(ctx, inputs, output) -> None:
    x, kind, dim, correction = inputs
    ctx.kind, ctx.dim, ctx.correction = kind, dim % x.dim(), correction
    ctx.input_shape = list(x.shape)
    if ReduceKind(kind) in _NO_SAVED:
        ctx.save_for_backward(None, None)
    else:
        ctx.save_for_backward(x, output)


def _reduce_backward(ctx, grad: Tensor):
    x, y = ctx.saved_tensors
    dx = _reduce_backward_op(grad, x, y, ctx.input_shape, ctx.kind, ctx.dim, ctx.correction)
    return dx, None, None, None


_reduce_op.register_autograd(_reduce_backward, setup_context=_reduce_setup)


class _ReduceFunction(torch.autograd.Function):
    """Eager twin of ``baracuda::reduce``."""

    @staticmethod
    def forward(x, kind, dim, correction):
        return _reduce_call(ReduceKind(kind), x, dim, True, correction, None)

    setup_context = staticmethod(_reduce_setup)

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        dx = ops.reduce_backward(ReduceKind(ctx.kind), grad, ctx.input_shape, ctx.dim, x=x, y=y,
                                 correction=ctx.correction)
        return dx, None, None, None


def _reduce(kind: ReduceKind, x: Tensor, dim: int, keepdim: bool, correction: int = 1) -> Tensor:
    if compiling():
        y = _reduce_op(x, int(kind), dim, correction)
    elif not needs_grad(x):
        y = _reduce_call(kind, x, dim, True, correction, None)
    else:
        y = _ReduceFunction.apply(x, int(kind), dim, correction)
    return y if keepdim else y.squeeze(dim)


def sum(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:  # noqa: A001
    return _reduce(ReduceKind.SUM, x, dim, keepdim)


def mean(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.MEAN, x, dim, keepdim)


def amax(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    """Max over ``dim``; its gradient is split equally across ties (JAX's rule)."""
    return _reduce(ReduceKind.MAX, x, dim, keepdim)


def amin(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.MIN, x, dim, keepdim)


def prod(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.PROD, x, dim, keepdim)


def norm(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.NORM2, x, dim, keepdim)


def logsumexp(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.LOG_SUM_EXP, x, dim, keepdim)


def var(x: Tensor, dim: int, *, correction: int = 1, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.VAR, x, dim, keepdim, correction)


def std(x: Tensor, dim: int, *, correction: int = 1, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.STD, x, dim, keepdim, correction)


@torch.library.custom_op(f"{LIB}::arg_reduce", mutates_args=())
def _arg_reduce_op(x: Tensor, kind: int, dim: int) -> Tensor:
    return _arg_reduce_call(ReduceKind(kind), x, dim, True, None)


@_arg_reduce_op.register_fake
def _(x: Tensor, kind: int, dim: int) -> Tensor:
    shape = list(x.shape)
    shape[dim % x.dim()] = 1
    return x.new_empty(shape, dtype=torch.int64)


def _arg_reduce(kind: ReduceKind, x: Tensor, dim: int, keepdim: bool) -> Tensor:
    if compiling():
        y = _arg_reduce_op(x, int(kind), dim)
    else:
        y = _arg_reduce_call(kind, x.detach(), dim, True, None)
    return y if keepdim else y.squeeze(dim)


def argmax(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _arg_reduce(ReduceKind.ARGMAX, x, dim, keepdim)


def argmin(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _arg_reduce(ReduceKind.ARGMIN, x, dim, keepdim)
