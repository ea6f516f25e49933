"""torch twins of the rotary position embedding (q alone, or q and k in one call)."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ._core import LIB, EagerFunction, compiling, needs_grad

__all__ = ["rope"]


@torch.library.custom_op(f"{LIB}::rope", mutates_args=())
def _rope_op(x: Tensor, k: Tensor | None, positions: Tensor | None, inv_freq: Tensor | None,
             cos: Tensor | None, sin: Tensor | None, cu_seqlens: Tensor | None, base: float,
             pairing: str, rotary_dim: int, layout: str,
             backward: bool) -> tuple[Tensor, Tensor]:
    return _rope_impl(x, k, positions, inv_freq, cos, sin, cu_seqlens, base, pairing,
                      rotary_dim, layout, backward)


@_rope_op.register_fake
def _(x: Tensor, k: Tensor | None, positions: Tensor | None, inv_freq: Tensor | None,
      cos: Tensor | None, sin: Tensor | None, cu_seqlens: Tensor | None, base: float,
      pairing: str, rotary_dim: int, layout: str, backward: bool) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), (x.new_empty(0) if k is None else torch.empty_like(k))


_OPTIONS = ("base", "pairing", "rotary_dim", "layout", "backward")


def _rope_setup(ctx, inputs, output) -> None:
    x, k, positions, inv_freq, cos, sin, cu_seqlens = inputs[:7]
    for name, value in zip(_OPTIONS, inputs[7:]):
        setattr(ctx, name, value)
    ctx.has_k = k is not None
    ctx.save_for_backward(positions, inv_freq, cos, sin, cu_seqlens)


def _grads(ctx, grad_x: Tensor, grad_k: Tensor, op) -> tuple:
    positions, inv_freq, cos, sin, cu_seqlens = ctx.saved_tensors
    dk_in = grad_k if ctx.has_k else None
    if dk_in is not None and grad_k.numel() == 0 and grad_k.dim() == 1:
        dk_in = None
    dx, dk = op(grad_x, dk_in, positions, inv_freq, cos, sin, cu_seqlens, ctx.base,
                ctx.pairing, ctx.rotary_dim, ctx.layout, not ctx.backward)
    return (dx, dk if ctx.has_k else None) + (None,) * 10


def _rope_backward(ctx, grad_x: Tensor, grad_k: Tensor):
    return _grads(ctx, grad_x, grad_k, _rope_op)


_rope_op.register_autograd(_rope_backward, setup_context=_rope_setup)


def _unit_stride(t: Tensor | None) -> Tensor | None:
    # The plans need unit stride along the features; gradients flowing back through a
    # transpose often lack it.
    if t is not None and t.shape[-1] > 1 and t.stride(-1) != 1:
        return t.contiguous()
    return t


def _rope_impl(x: Tensor, k: Tensor | None, positions: Tensor | None,
               inv_freq: Tensor | None, cos: Tensor | None, sin: Tensor | None,
               cu_seqlens: Tensor | None, base: float, pairing: str, rotary_dim: int,
               layout: str, backward: bool) -> tuple[Tensor, Tensor]:
    x, k = _unit_stride(x), _unit_stride(k)
    rotary = None if rotary_dim < 0 else rotary_dim  # -1 stands for "the whole head"
    fn = ops.rope_backward if backward else ops.rope
    options = dict(positions=positions, base=base, pairing=pairing, rotary_dim=rotary,
                   inv_freq=inv_freq, cos=cos, sin=sin, layout=layout, cu_seqlens=cu_seqlens)
    if k is None:
        return fn(x, **options), x.new_empty(0)
    out = fn(x, **({"dk": k} if backward else {"k": k}), **options)
    return out[0], out[1]


class _RopeFunction(EagerFunction):
    """Eager twin of ``baracuda::rope``."""

    @staticmethod
    def forward(*inputs):
        return _rope_impl(*inputs)

    setup_context = staticmethod(_rope_setup)

    @staticmethod
    def backward(ctx, grad_x, grad_k):
        return _grads(ctx, grad_x, grad_k, _rope_impl)


def rope(x: Tensor, *, k: Tensor | None = None, positions: Tensor | None = None,
         base: float = 10000.0, inv_freq: Tensor | None = None, cos: Tensor | None = None,
         sin: Tensor | None = None, pairing: str = "interleaved", rotary_dim: int | None = None,
         layout: str = "BHSD", cu_seqlens: Tensor | None = None) -> Tensor | tuple[Tensor,
                                                                                 Tensor]:
    """Rotary embedding of ``x`` (and ``k``: then ``(x_out, k_out)``); ``pairing``
    'interleaved' (GPT-J) or 'half_split' (NeoX/Llama ``rotate_half``); ``layout`` 'BHSD',
    'BSHD' or 'THD'; angles from ``base``, ``inv_freq`` or ``cos``/``sin`` (see
    :func:`baracuda_numba.ops.rope`). Differentiable with respect to x and k (not the
    tables); ``rotary_dim=0`` returns x (and k) unchanged."""
    rotary = -1 if rotary_dim is None else int(rotary_dim)
    inputs = (x, k, positions, inv_freq, cos, sin, cu_seqlens, float(base), pairing, rotary,
              str(layout).upper(), False)
    if compiling():
        y, k_out = _rope_op(*inputs)
    elif not (needs_grad(x) or (k is not None and needs_grad(k))):
        y, k_out = _rope_impl(*inputs)
    else:
        y, k_out = _RopeFunction.apply(*inputs)
    return y if k is None else (y, k_out)
