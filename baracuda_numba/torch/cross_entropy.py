"""torch twins of the cross-entropy family: ``cross_entropy`` (autograd, the
``baracuda::cross_entropy`` custom op under ``torch.compile``) and
``fused_linear_cross_entropy`` (hidden @ weight.T + cross-entropy, chunk by chunk of
tokens, never holding the ``[N, V]`` logits)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InvalidProblem, Unsupported
from ..ops.cross_entropy import _REDUCTIONS, cross_entropy_backward
from ..ops.cross_entropy import cross_entropy as _ops_cross_entropy
from ._core import LIB, compiling

__all__ = ["cross_entropy", "fused_linear_cross_entropy"]

_NAMES = {int(v): k for k, v in _REDUCTIONS.items()}


def _reduction_code(reduction: str, fn: str) -> int:
    if reduction not in _REDUCTIONS:
        raise InvalidProblem(f"{fn}: reduction = {reduction!r} must be 'none', 'mean' or "
                             "'sum'")
    return int(_REDUCTIONS[reduction])


def _forward(logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
             reduction: int, label_smoothing: float, z_loss: float,
             softcap: float) -> tuple[Tensor, Tensor]:
    return _ops_cross_entropy(logits, target, ignore_index, _NAMES[reduction], label_smoothing,
                              z_loss, softcap or None, weight, return_lse=True)


def _backward(logits: Tensor, target: Tensor, lse: Tensor, dy: Tensor,
              weight: Tensor | None, ignore_index: int, reduction: int,
              label_smoothing: float, z_loss: float, softcap: float,
              out: Tensor | None = None) -> Tensor:
    return cross_entropy_backward(logits, target, lse, dy.float().contiguous(), ignore_index,
                                  _NAMES[reduction], label_smoothing, z_loss, softcap or None,
                                  weight, out=out)


@torch.library.custom_op(f"{LIB}::cross_entropy", mutates_args=())
def _cross_entropy_op(logits: Tensor, target: Tensor, weight: Tensor | None,
                      ignore_index: int, reduction: int, label_smoothing: float, z_loss: float,
                      softcap: float) -> tuple[Tensor, Tensor]:
    return _forward(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss,
                    softcap)


@_cross_entropy_op.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap):
    n = logits.shape[0]
    loss = logits.new_empty((n,) if reduction == 0 else (), dtype=torch.float32)
    return loss, logits.new_empty((n,), dtype=torch.float32)


@torch.library.custom_op(f"{LIB}::cross_entropy_backward", mutates_args=())
def _cross_entropy_backward_op(logits: Tensor, target: Tensor, lse: Tensor, dy: Tensor,
                               weight: Tensor | None, ignore_index: int, reduction: int,
                               label_smoothing: float, z_loss: float,
                               softcap: float) -> Tensor:
    return _backward(logits, target, lse, dy, weight, ignore_index, reduction,
                     label_smoothing, z_loss, softcap)


@_cross_entropy_backward_op.register_fake
def _(logits, target, lse, dy, weight, ignore_index, reduction, label_smoothing, z_loss,
      softcap):
    return torch.empty_like(logits)


def _setup(ctx, inputs, output) -> None:
    logits, target, weight, *options = inputs
    ctx.options = tuple(options)
    ctx.save_for_backward(logits, target, weight, output[1])


def _backward_op(ctx, dloss: Tensor, dlse: Tensor):
    logits, target, weight, lse = ctx.saved_tensors
    grad = _cross_entropy_backward_op(logits, target, lse, dloss, weight, *ctx.options)
    return (grad,) + (None,) * 7


_cross_entropy_op.register_autograd(_backward_op, setup_context=_setup)


class _CrossEntropyFunction(torch.autograd.Function):
    """Eager twin of ``baracuda::cross_entropy``; ``inplace`` writes the gradient over the
    saved logits' own buffer (no ``[N, V]`` allocation in the backward)."""

    @staticmethod
    def forward(ctx, logits, target, weight, inplace, *options):
        loss, lse = _forward(logits, target, weight, *options)
        ctx.options, ctx.inplace = options, inplace
        ctx.save_for_backward(logits, target, weight, lse)
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    def backward(ctx, dloss, dlse):
        logits, target, weight, lse = ctx.saved_tensors
        grad = _backward(logits, target, lse, dloss, weight, *ctx.options,
                         out=logits if ctx.inplace else None)
        return (grad, None, None, None) + (None,) * len(ctx.options)


def cross_entropy(logits: Tensor, target: Tensor, weight: Tensor | None = None,
                  ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, *, z_loss: float = 0.0,
                  softcap: float | None = None, return_lse: bool = False,
                  inplace_backward: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """``F.cross_entropy(logits, target, weight, ignore_index=, reduction=,
    label_smoothing=)`` for ``[N, V]`` logits and class indices, plus ``z_loss`` and
    ``softcap``; differentiable in ``logits``. The loss is f32 whatever the logits' dtype
    (torch returns the logits' dtype). ``return_lse``: also the f32 per-row log-sum-exp.
    ``inplace_backward`` (eager only): the gradient overwrites the logits' storage, so
    the caller must not use the logits after ``backward``."""
    code = _reduction_code(reduction, "cross_entropy")
    if weight is not None and weight.dtype != torch.float32:
        weight = weight.float()
    options = (int(ignore_index), code, float(label_smoothing), float(z_loss),
               float(softcap or 0.0))
    if compiling():
        loss, lse = _cross_entropy_op(logits, target, weight, *options)
    elif logits.requires_grad and torch.is_grad_enabled():
        loss, lse = _CrossEntropyFunction.apply(logits, target, weight, inplace_backward,
                                                *options)
    else:
        loss, lse = _forward(logits, target, weight, *options)
    return (loss, lse) if return_lse else loss


# -- fused linear cross-entropy --------------------------------------------------------------

#: Rows of a logits chunk at least: each chunk's grad_weight accumulation reads and
#: writes all of grad_weight, so fewer, larger chunks move less (and GEMMs stay efficient).
_MIN_CHUNK_ROWS = 1024
#: Rows at most: the chunk's logits stay a small fraction of the full [N, V].
_MAX_CHUNK_ROWS = 4096
#: The chunk's logits at most this fraction of the weight's size (rows <= fraction * H):
#: the peak extra memory (grad_weight, the chunk, grad_hidden) then stays within 1.4x
#: the weight, a quarter of the unfused path's for an LLM head.
_CHUNK_OF_WEIGHT = 0.4
#: Chunk rows are a multiple of this (whole GEMM tiles).
_CHUNK_ALIGN = 256


def _chunk_rows(n: int, hidden: int, vocab: int) -> int:
    """Rows per chunk: as many as ``_CHUNK_OF_WEIGHT * hidden`` (so few chunks, few
    re-reads of grad_weight), rounded to ``_CHUNK_ALIGN``, within
    [_MIN_CHUNK_ROWS, _MAX_CHUNK_ROWS]."""
    rows = int(_CHUNK_OF_WEIGHT * hidden) // _CHUNK_ALIGN * _CHUNK_ALIGN
    rows = max(_MIN_CHUNK_ROWS, min(rows, _MAX_CHUNK_ROWS))
    return min(rows, max(n, 1))


def _flce_forward(hidden, weight, target, bias, class_weight, ignore_index, reduction,
                  label_smoothing, z_loss, softcap, chunk_rows, need_grads):
    """(loss, grad_hidden, grad_weight, grad_bias) for dloss = 1; grads None unless
    ``need_grads``."""
    n, h = hidden.shape
    v = weight.shape[0]
    denom, scale = None, 1.0
    if reduction == "mean":
        valid = target != ignore_index
        if class_weight is None:
            denom = valid.sum()
        else:
            denom = class_weight.float()[target.clamp(0, v - 1)].masked_fill(~valid, 0).sum()
        if any(need_grads):
            # One host synchronisation per call (none per chunk): the gradient GEMMs take
            # 1 / D as their f32 alpha (a bf16 multiply afterwards would round 1 / D).
            denom_host = float(denom.item())
            scale = 1.0 / denom_host if denom_host else 0.0
    rows_loss = torch.empty(n, device=hidden.device, dtype=torch.float32)
    grad_hidden = torch.empty_like(hidden) if need_grads[0] else None
    grad_weight = torch.empty_like(weight) if need_grads[1] else None
    grad_bias = (torch.zeros(v, device=hidden.device, dtype=torch.float32)
                 if need_grads[2] else None)
    chunk = chunk_rows or _chunk_rows(n, h, v)
    buffer = torch.empty((min(chunk, max(n, 1)), v), device=hidden.device, dtype=hidden.dtype)
    any_grad = any(need_grads)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        part = hidden[start:stop]
        logits = buffer[:stop - start]
        # bf16/f16 GEMMs with f32 accumulation (torch's matmul), straight into the buffer.
        if bias is None:
            torch.mm(part, weight.t(), out=logits)
        else:
            torch.addmm(bias, part, weight.t(), out=logits)
        # The loss rows and the gradient of their sum, written over the chunk's logits.
        rows_loss[start:stop] = _ops_cross_entropy(
            logits, target[start:stop], ignore_index, "none", label_smoothing, z_loss,
            softcap, class_weight, grad_out=logits if any_grad else None)
        if grad_hidden is not None:
            grad_hidden[start:stop].addmm_(logits, weight, beta=0, alpha=scale)
        if grad_weight is not None:
            grad_weight.addmm_(logits.t(), part, beta=0 if start == 0 else 1, alpha=scale)
        if grad_bias is not None:
            grad_bias.add_(logits.sum(0, dtype=torch.float32), alpha=scale)
    if reduction == "none":
        loss = rows_loss
    elif reduction == "sum":
        loss = rows_loss.sum()
    else:
        loss = rows_loss.sum() / denom
    if grad_bias is not None:
        grad_bias = grad_bias.to(bias.dtype)
    return loss, grad_hidden, grad_weight, grad_bias


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, bias, class_weight, *options):
        need = (hidden.requires_grad, weight.requires_grad,
                bias is not None and bias.requires_grad)
        loss, *grads = _flce_forward(hidden, weight, target, bias, class_weight, *options,
                                     need_grads=need)
        ctx.save_for_backward(*(g if g is not None else torch.empty(0) for g in grads))
        ctx.present = tuple(g is not None for g in grads)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        grads = [g.mul_(dloss.to(g.dtype)) if present else None
                 for g, present in zip(ctx.saved_tensors, ctx.present)]
        return (grads[0], grads[1], None, grads[2], None) + (None,) * 6


@torch.library.custom_op(f"{LIB}::fused_linear_cross_entropy", mutates_args=())
def _flce_op(hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None,
             class_weight: Tensor | None, ignore_index: int, reduction: str,
             label_smoothing: float, z_loss: float, softcap: float | None,
             chunk_rows: int | None, need_hidden: bool, need_weight: bool,
             need_bias: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The custom op twin (torch.compile): (loss, grad_hidden, grad_weight, grad_bias)
    for dloss = 1, an absent gradient as an empty tensor of its own."""
    loss, *grads = _flce_forward(
        hidden, weight, target, bias, class_weight, ignore_index, reduction,
        label_smoothing, z_loss, softcap, chunk_rows, (need_hidden, need_weight, need_bias))
    return (loss, *(g if g is not None else hidden.new_empty((0,)) for g in grads))


@_flce_op.register_fake
def _(hidden, weight, target, bias, class_weight, ignore_index, reduction, label_smoothing,
      z_loss, softcap, chunk_rows, need_hidden, need_weight, need_bias):
    n = hidden.shape[0]
    loss = hidden.new_empty((n,) if reduction == "none" else (), dtype=torch.float32)
    return (loss, torch.empty_like(hidden) if need_hidden else hidden.new_empty((0,)),
            torch.empty_like(weight) if need_weight else hidden.new_empty((0,)),
            torch.empty_like(bias) if need_bias else hidden.new_empty((0,)))


def _flce_setup(ctx, inputs, output) -> None:
    ctx.present = tuple(inputs[11:14])
    ctx.save_for_backward(*output[1:])


def _flce_backward(ctx, dloss, *_unused):
    grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
    grads = [g * dloss.to(g.dtype) if present else None
             for g, present in zip((grad_hidden, grad_weight, grad_bias), ctx.present)]
    return (grads[0], grads[1], None, grads[2]) + (None,) * 10


_flce_op.register_autograd(_flce_backward, setup_context=_flce_setup)


def fused_linear_cross_entropy(hidden: Tensor, weight: Tensor, target: Tensor,
                               bias: Tensor | None = None, ignore_index: int = -100,
                               reduction: str = "mean", label_smoothing: float = 0.0,
                               z_loss: float = 0.0, softcap: float | None = None,
                               class_weight: Tensor | None = None, *,
                               chunk_rows: int | None = None) -> Tensor:
    """``cross_entropy(hidden @ weight.T + bias, target, ...)`` without the ``[N, V]``
    logits: chunks of ``chunk_rows`` tokens (default: about 0.4 x H rows, within
    1024-4096) go through torch's matmul and the cross-entropy plan with the gradient
    written in place, and the gradients for ``hidden``, ``weight`` and ``bias`` are
    accumulated during the forward (the backward scales them by the upstream gradient).
    ``mean`` with gradients costs one host synchronisation per call (the denominator).
    Under ``torch.compile`` it is the ``baracuda::fused_linear_cross_entropy`` custom op
    (no graph break).
    ``reduction="none"`` is forward-only (its gradient needs per-row dy)."""
    fn = "fused_linear_cross_entropy"
    _reduction_code(reduction, fn)
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise InvalidProblem(f"{fn}: hidden {tuple(hidden.shape)} and weight "
                             f"{tuple(weight.shape)} must be [N, H] and [V, H]")
    if target.shape != (hidden.shape[0],):
        raise InvalidProblem(f"{fn}: target has shape {tuple(target.shape)}; it must be "
                             f"[N] = ({hidden.shape[0]},)")
    if chunk_rows is not None and chunk_rows < 1:
        raise InvalidProblem(f"{fn}: chunk_rows = {chunk_rows} must be >= 1")
    hidden = hidden.contiguous()
    weight = weight.contiguous()
    if class_weight is not None:
        class_weight = class_weight.float().contiguous()
    options = (int(ignore_index), reduction, float(label_smoothing), float(z_loss),
               None if softcap is None else float(softcap), chunk_rows)
    grad_on = torch.is_grad_enabled()
    need = (grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
            grad_on and bias is not None and bias.requires_grad)
    if any(need) and reduction == "none":
        raise Unsupported(f"{fn}: reduction = 'none' with gradients is not supported (the "
                          "gradient is formed in the forward, for one upstream scalar)")
    if compiling():
        return _flce_op(hidden, weight, target, bias, class_weight, *options, *need)[0]
    if not any(need):
        return _flce_forward(hidden, weight, target, bias, class_weight, *options,
                             need_grads=(False, False, False))[0]
    return _FusedLinearCrossEntropy.apply(hidden, weight, target, bias, class_weight,
                                          *options)
