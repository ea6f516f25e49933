"""torch twins of RMSNorm and LayerNorm (``F.rms_norm`` / ``F.layer_norm``), with the
fused residual add: ``rms_norm(x, shape, w, residual=r)`` returns ``(y, h)``, ``h = x + r``.

One custom op per direction, ``baracuda::norm_forward`` -> ``(y, h, rstd, mean)`` and
``baracuda::norm_backward`` -> ``(dx, dweight, dbias)`` (empty tensors stand for absent
outputs), so ``torch.compile`` sees one opaque node each way; eager calls take an
equivalent ``torch.autograd.Function`` (the dispatcher costs more host time than a launch).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .. import ops
from ._core import LIB, EagerFunction, compiling, needs_grad

__all__ = ["layer_norm", "rms_norm"]


def _empty(like: Tensor) -> Tensor:
    return like.new_empty((0,))


def _rows(t: Tensor | None, k: int) -> Tensor | None:
    """``t``, or a contiguous copy where its last ``k`` axes do not merge into one strided
    axis (the plans' layout rule; gradients through permutes often break it)."""
    if t is None or t.is_contiguous():  # one C call for the usual case
        return t
    expected = None
    for size, stride in zip(reversed(t.shape[t.dim() - k:]), reversed(t.stride()[t.dim() - k:])):
        if size == 1:
            continue
        if expected is not None and stride != expected:
            return t.contiguous()
        expected = stride * size
    return t


def _plain(t: Tensor | None) -> Tensor | None:
    """``t`` as a plain ``torch.Tensor`` (a Parameter's detached alias, same memory): the
    plans' layout memo keys plain tensors only, and weights are usually Parameters."""
    return t if t is None or type(t) is Tensor else t.detach()


@torch.library.custom_op(f"{LIB}::norm_forward", mutates_args=())
def _forward_op(x: Tensor, weight: Tensor | None, bias: Tensor | None,
                residual: Tensor | None, normalized_shape: list[int], eps: float,
                offset: float, layer: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _forward_impl(x, weight, bias, residual, normalized_shape, eps, offset, layer)


def _forward_impl(x: Tensor, weight: Tensor | None, bias: Tensor | None,
                  residual: Tensor | None, normalized_shape: list[int], eps: float,
                  offset: float, layer: bool, placeholders: bool = True
                  ) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
    """``(y, h, rstd, mean)``; an absent h or mean is an empty tensor (the custom op's and
    the autograd function's outputs), or None with ``placeholders=False``."""
    shape = tuple(normalized_shape)
    x, residual = _rows(x, len(shape)), _rows(residual, len(shape))
    weight, bias = _plain(weight), _plain(bias)
    if layer:
        out = ops.layer_norm(x, shape, weight, bias, eps, residual=residual,
                             return_stats=True)
    else:
        out = ops.rms_norm(x, shape, weight, eps, residual=residual, offset=offset,
                           return_stats=True)
    y, *rest = out
    h = rest.pop(0) if residual is not None else _empty(x) if placeholders else None
    rstd = rest[0]
    mean = rest[1] if layer else _empty(rstd) if placeholders else None
    return y, h, rstd, mean


@_forward_op.register_fake
def _(x, weight, bias, residual, normalized_shape, eps, offset, layer):
    k = len(normalized_shape)
    stats_shape = tuple(x.shape[:x.dim() - k]) + (1,) * k
    stats_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    rstd = x.new_empty(stats_shape, dtype=stats_dtype)
    return (torch.empty_like(x), torch.empty_like(x) if residual is not None else _empty(x),
            rstd, rstd.new_empty(stats_shape if layer else (0,)))


@torch.library.custom_op(f"{LIB}::norm_backward", mutates_args=())
def _backward_op(dy: Tensor, h: Tensor, mean: Tensor | None, rstd: Tensor,
                 weight: Tensor | None, dh: Tensor | None, normalized_shape: list[int],
                 offset: float, layer: bool, has_bias: bool, weight_grad: bool
                 ) -> tuple[Tensor, Tensor, Tensor]:
    dx, dweight, dbias = _backward_impl(dy, h, mean, rstd, weight, dh, normalized_shape,
                                        offset, layer, has_bias, weight_grad)
    return (dx, _empty(dy) if dweight is None else dweight,
            _empty(dy) if dbias is None else dbias)


def _backward_impl(dy: Tensor, h: Tensor, mean: Tensor | None, rstd: Tensor,
                   weight: Tensor | None, dh: Tensor | None, normalized_shape: list[int],
                   offset: float, layer: bool, has_bias: bool, weight_grad: bool
                   ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``(dx, dweight, dbias)``, None for an absent one (the custom op returns empty
    tensors instead; the eager path needs none). ``weight_grad=False``: no dweight (the
    weight does not require grad; as torch, no partials and no finalize launch)."""
    if dy is None:  # y unused (eager: gradients are not materialized), only h's gradient
        dy = torch.zeros_like(h)
    shape = tuple(normalized_shape)
    dy, dh, h = _rows(dy, len(shape)), _rows(dh, len(shape)), _rows(h, len(shape))
    weight = _plain(weight)
    if layer:
        dx, dweight, dbias = ops.layer_norm_backward(dy, h, mean, rstd, shape, weight,
                                                     has_bias, dh=dh, weight_grad=weight_grad)
    else:
        dx, dweight = ops.rms_norm_backward(dy, h, rstd, shape, weight, dh=dh, offset=offset,
                                            weight_grad=weight_grad)
        dbias = None
    return dx, dweight, dbias


@_backward_op.register_fake
def _(dy, h, mean, rstd, weight, dh, normalized_shape, offset, layer, has_bias, weight_grad):
    vector = weight if weight is not None else dy.new_empty(tuple(normalized_shape))
    return (torch.empty_like(dy),
            torch.empty_like(weight) if weight is not None and weight_grad else _empty(dy),
            torch.empty_like(vector) if has_bias else _empty(dy))


def _setup(ctx, inputs, output) -> None:
    x, weight, bias, residual, normalized_shape, _, offset, layer = inputs
    _, h, rstd, mean = output
    ctx.normalized_shape, ctx.offset, ctx.layer = normalized_shape, offset, layer
    ctx.has_residual, ctx.has_bias = residual is not None, bias is not None
    ctx.save_for_backward(h if residual is not None else x, rstd, mean if layer else None,
                          weight)


def _gradients(ctx, grad_y, grad_h, backward):
    h, rstd, mean, weight = ctx.saved_tensors
    dh = grad_h if ctx.has_residual else None
    weight_grad = weight is not None and ctx.needs_input_grad[1]
    dx, dweight, dbias = backward(grad_y, h, mean, rstd, weight, dh, ctx.normalized_shape,
                                  ctx.offset, ctx.layer, ctx.has_bias, weight_grad)
    return (dx, dweight if weight_grad else None, dbias if ctx.has_bias else None,
            dx if ctx.has_residual else None, None, None, None, None)


def _backward(ctx, grad_y, grad_h, grad_rstd, grad_mean):
    return _gradients(ctx, grad_y, grad_h, _backward_op)


_forward_op.register_autograd(_backward, setup_context=_setup)


def _eager_setup(ctx, inputs, output) -> None:
    """``_setup``, and no zero gradients built for the outputs the loss does not use (the
    statistics, h without a residual, often y or h): ``_gradients`` takes None."""
    _setup(ctx, inputs, output)
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[2], output[3])


class _NormFunction(EagerFunction):
    """Eager twin of ``baracuda::norm_forward`` (no dispatcher on the way)."""

    @staticmethod
    def forward(x, weight, bias, residual, normalized_shape, eps, offset, layer):
        return _forward_impl(x, weight, bias, residual, normalized_shape, eps, offset, layer)

    setup_context = staticmethod(_eager_setup)

    @staticmethod
    def backward(ctx, grad_y, grad_h, grad_rstd, grad_mean):
        return _gradients(ctx, grad_y, grad_h, _backward_impl)


def _norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, residual: Tensor | None,
          normalized_shape: list[int], eps: float, offset: float, layer: bool
          ) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
    """The custom op under torch.compile; in eager mode its autograd twin, or the plain
    implementation when nothing needs a gradient."""
    args = (x, weight, bias, residual, normalized_shape, eps, offset, layer)
    if compiling():
        return _forward_op(*args)
    if not any(t is not None and needs_grad(t) for t in (x, weight, bias, residual)):
        return _forward_impl(*args, placeholders=False)
    return _NormFunction.apply(*args)


def _normalized(normalized_shape: int | Sequence[int]) -> list[int]:
    if isinstance(normalized_shape, int):
        return [normalized_shape]
    return [int(s) for s in normalized_shape]


_MACHINE_EPSILON: dict[torch.dtype, float] = {}


def rms_norm(x: Tensor, normalized_shape: int | Sequence[int], weight: Tensor | None = None,
             eps: float | None = None, *, residual: Tensor | None = None,
             offset: float = 0.0) -> Tensor | tuple[Tensor, Tensor]:
    """``F.rms_norm`` (``eps=None``: ``finfo(x.dtype).eps``), with Gemma's ``offset``
    (``x̂ · (offset + weight)``) and the fused residual add (returns ``(y, x + residual)``)."""
    if eps is None:
        eps = _MACHINE_EPSILON.get(x.dtype)
        if eps is None:
            eps = _MACHINE_EPSILON[x.dtype] = float(torch.finfo(x.dtype).eps)
    y, h, _, _ = _norm(x, weight, None, residual, _normalized(normalized_shape), float(eps),
                       float(offset), False)
    return y if residual is None else (y, h)


def layer_norm(x: Tensor, normalized_shape: int | Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5, *,
               residual: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """``F.layer_norm``, with the fused residual add (returns ``(y, x + residual)``)."""
    y, h, _, _ = _norm(x, weight, bias, residual, _normalized(normalized_shape), float(eps),
                       0.0, True)
    return y if residual is None else (y, h)
