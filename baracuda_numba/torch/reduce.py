"""torch twins of the reductions: sum, mean, amax, amin, prod, norm, logsumexp, var, std,
argmax, argmin.

``dim`` is one axis, several (a tuple or list) or None (every axis; ``()`` too, as torch),
except ``prod`` (one axis or None, as ``torch.prod``) and ``argmax`` / ``argmin`` (None:
the index into the flattened input). Several axes run as ONE single-axis reduction on a
view of the input wherever the reduced axes collapse into one (``ops.axis_layout``), else
on a permuted contiguous copy (``WriteSlicePlan`` in eager mode; under ``torch.compile``
the compiler's own copy); the gradient is the single-axis gradient on that view.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .. import ops
from ..errors import InvalidProblem
from ..ops.reduce import _arg_reduce as _arg_reduce_call
from ..ops.reduce import _reduce as _reduce_call
from ..ops.reduce import axis_layout, permuted_copy, reduce_axes
from ..types import ReduceKind
from ._core import LIB, EagerFunction, compiling, needs_grad

__all__ = ["amax", "amin", "argmax", "argmin", "logsumexp", "mean", "norm", "prod", "std", "sum",
           "var"]

_NO_SAVED = (ReduceKind.SUM, ReduceKind.MEAN)
#: ``dim``: one axis, several, or None (every axis)
Dim = int | Sequence[int] | None


@torch.library.custom_op(f"{LIB}::reduce", mutates_args=())
def _reduce_op(x: Tensor, kind: int, dim: int, correction: float) -> Tensor:
    return _reduce_call(ReduceKind(kind), x, dim, True, correction, None)


@_reduce_op.register_fake
def _(x: Tensor, kind: int, dim: int, correction: float) -> Tensor:
    shape = list(x.shape)
    shape[dim % x.dim()] = 1
    return x.new_empty(shape)


@torch.library.custom_op(f"{LIB}::reduce_backward", mutates_args=())
def _reduce_backward_op(dy: Tensor, x: Tensor | None, y: Tensor | None,
                        input_shape: Sequence[int], kind: int, dim: int,
                        correction: float) -> Tensor:
    return ops.reduce_backward(ReduceKind(kind), dy, input_shape, dim, x=x, y=y,
                               correction=correction)


@_reduce_backward_op.register_fake
def _(dy: Tensor, x: Tensor | None, y: Tensor | None, input_shape: Sequence[int], kind: int,
      dim: int, correction: float) -> Tensor:
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


class _ReduceFunction(EagerFunction):
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


class _PermutedCopy(torch.autograd.Function):
    """A contiguous copy of ``x`` with its axes in the order ``perm`` (WriteSlicePlan);
    the gradient is the incoming one permuted back (a view)."""

    @staticmethod
    def forward(ctx, x: Tensor, perm: tuple[int, ...]) -> Tensor:
        ctx.perm = perm
        return permuted_copy(x, perm)

    @staticmethod
    def backward(ctx, grad: Tensor):
        inverse = tuple(ctx.perm.index(d) for d in range(len(ctx.perm)))
        return grad.permute(inverse), None


def _reduce_axis(kind: ReduceKind, x: Tensor, dim: int, correction: float) -> Tensor:
    """The keepdim reduction over one axis."""
    if compiling():
        return _reduce_op(x, int(kind), dim, float(correction))
    if not needs_grad(x):
        return _reduce_call(kind, x, dim, True, correction, None)
    return _ReduceFunction.apply(x, int(kind), dim, correction)


def _collapse(x: Tensor, dim: Dim, fn: str) -> tuple[Tensor, int, tuple[int, ...],
                                                      list[int]]:
    """``x`` as one single-axis problem (a view, or the permuted copy), its axis, the
    keepdim result shape and the result shape without keepdim."""
    axes = reduce_axes(dim, x.dim(), fn)
    layout = axis_layout(tuple(x.shape), tuple(x.stride()), axes)
    if layout.perm is None:
        source = x.reshape(layout.shape)  # the axes merge: a view
    elif compiling():
        source = x.permute(layout.perm).reshape(layout.shape)
    else:
        source = _PermutedCopy.apply(x, layout.perm).view(layout.shape)
    out_shape = [n for d, n in enumerate(x.shape) if d not in axes]
    return source, layout.axis, layout.keep_shape, out_shape


def _reduce(kind: ReduceKind, x: Tensor, dim: Dim, keepdim: bool,
            correction: float = 1) -> Tensor:
    if isinstance(dim, int) and not isinstance(dim, bool) and x.dim():
        y = _reduce_axis(kind, x, dim, correction)
        return y if keepdim else y.squeeze(dim)
    source, axis, keep_shape, out_shape = _collapse(x, dim, kind.name.lower())
    y = _reduce_axis(kind, source, axis, correction)
    return y.reshape(keep_shape if keepdim else out_shape)


_INT64_SUMS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32)


def sum(x: Tensor, dim: Dim = None, keepdim: bool = False, *,  # noqa: A001
        dtype: torch.dtype | None = None) -> Tensor:
    """``torch.sum``: bool and integer inputs sum in int64 (torch's promotion), ``dtype``
    casts the input first."""
    if dtype is not None:
        x = x.to(dtype)
    elif x.dtype in _INT64_SUMS:
        x = x.to(torch.int64)
    return _reduce(ReduceKind.SUM, x, dim, keepdim)


def mean(x: Tensor, dim: Dim = None, keepdim: bool = False, *,
         dtype: torch.dtype | None = None) -> Tensor:
    if dtype is not None:
        x = x.to(dtype)
    return _reduce(ReduceKind.MEAN, x, dim, keepdim)


def amax(x: Tensor, dim: Dim = (), keepdim: bool = False) -> Tensor:
    """Max over ``dim``; its gradient is split equally across ties (JAX's rule)."""
    return _reduce(ReduceKind.MAX, x, dim, keepdim)


def amin(x: Tensor, dim: Dim = (), keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.MIN, x, dim, keepdim)


def prod(x: Tensor, dim: int | None = None, keepdim: bool = False, *,
         dtype: torch.dtype | None = None) -> Tensor:
    """``torch.prod``: one axis or None (all); the gradient is exact where a line holds
    zeros."""
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)):
        raise InvalidProblem(f"prod: dim = {dim!r} must be an int or None (torch.prod "
                             "reduces one axis or all)")
    if dtype is not None:
        x = x.to(dtype)
    elif x.dtype in _INT64_SUMS:
        x = x.to(torch.int64)
    return _reduce(ReduceKind.PROD, x, dim, keepdim)


def norm(x: Tensor, dim: Dim = None, keepdim: bool = False) -> Tensor:
    """``torch.linalg.vector_norm(x, 2, dim, keepdim)``."""
    return _reduce(ReduceKind.NORM2, x, dim, keepdim)


def logsumexp(x: Tensor, dim: Dim = None, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.LOG_SUM_EXP, x, dim, keepdim)


def var(x: Tensor, dim: Dim = None, *, correction: float = 1,
        keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.VAR, x, dim, keepdim, correction)


def std(x: Tensor, dim: Dim = None, *, correction: float = 1,
        keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.STD, x, dim, keepdim, correction)


@torch.library.custom_op(f"{LIB}::arg_reduce", mutates_args=())
def _arg_reduce_op(x: Tensor, kind: int, dim: int) -> Tensor:
    return _arg_reduce_call(ReduceKind(kind), x, dim, True, None)


@_arg_reduce_op.register_fake
def _(x: Tensor, kind: int, dim: int) -> Tensor:
    shape = list(x.shape)
    shape[dim % x.dim()] = 1
    return x.new_empty(shape, dtype=torch.int64)


def _arg_reduce(kind: ReduceKind, x: Tensor, dim: int | None, keepdim: bool) -> Tensor:
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)):
        raise InvalidProblem(f"{kind.name.lower()}: dim = {dim!r} must be an int or None")
    if dim is None or x.dim() == 0:  # torch: the index into the flattened input
        y = _arg_reduce(kind, x.reshape(-1), 0, True)
        return y.reshape([1] * x.dim() if keepdim else [])
    if compiling():
        y = _arg_reduce_op(x, int(kind), dim)
    else:
        y = _arg_reduce_call(kind, x.detach(), dim, True, None)
    return y if keepdim else y.squeeze(dim)


def argmax(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return _arg_reduce(ReduceKind.ARGMAX, x, dim, keepdim)


def argmin(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return _arg_reduce(ReduceKind.ARGMIN, x, dim, keepdim)
