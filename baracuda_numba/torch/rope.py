"""torch twins of the rotary position embedding."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ._core import LIB, compiling, needs_grad

__all__ = ["rope"]

@torch.library.custom_op(f"{LIB}::rope", mutates_args=())
def _rope_op(x: Tensor, positions: Tensor | None, base: float, pairing: str, rotary_dim: int,
             backward: bool) -> Tensor:
    return _rope_impl(x, positions, base, pairing, rotary_dim, backward)


@_rope_op.register_fake
def _(x: Tensor, positions: Tensor | None, base: float, pairing: str, rotary_dim: int,
      backward: bool) -> Tensor:
    return torch.empty_like(x)


def _rope_setup(ctx, inputs, output) -> None:
    _, positions, ctx.base, ctx.pairing, ctx.rotary_dim, ctx.backward = inputs
    ctx.save_for_backward(positions)


def _rope_backward(ctx, grad: Tensor):
    (positions,) = ctx.saved_tensors
    dx = _rope_op(grad, positions, ctx.base, ctx.pairing, ctx.rotary_dim, not ctx.backward)
    return dx, None, None, None, None, None


_rope_op.register_autograd(_rope_backward, setup_context=_rope_setup)


def _rope_impl(x: Tensor, positions: Tensor | None, base: float, pairing: str,
               rotary_dim: int, backward: bool) -> Tensor:
    if x.dim() == 4 and x.shape[-1] > 1 and x.stride(-1) != 1:
        # The plans need unit stride along the features; gradients flowing back through a
        # transpose often lack it.
        x = x.contiguous()
    rotary = None if rotary_dim <= 0 else rotary_dim
    fn = ops.rope_backward if backward else ops.rope
    return fn(x, positions=positions, base=base, pairing=pairing, rotary_dim=rotary)


class _RopeFunction(torch.autograd.Function):
    """Eager twin of ``baracuda::rope``."""

    @staticmethod
    def forward(x, positions, base, pairing, rotary_dim, backward):
        return _rope_impl(x, positions, base, pairing, rotary_dim, backward)

    setup_context = staticmethod(_rope_setup)

    @staticmethod
    def backward(ctx, grad):
        (positions,) = ctx.saved_tensors
        dx = _rope_impl(grad, positions, ctx.base, ctx.pairing, ctx.rotary_dim,
                        not ctx.backward)
        return dx, None, None, None, None, None


def rope(x: Tensor, *, positions: Tensor | None = None, base: float = 10000.0,
         pairing: str = "interleaved", rotary_dim: int | None = None) -> Tensor:
    """Rotary embedding of ``x`` ``[B, H, S, D]``; ``pairing`` 'interleaved' (GPT-J) or
    'half_split' (NeoX/Llama ``rotate_half``)."""
    if compiling():
        return _rope_op(x, positions, float(base), pairing, rotary_dim or 0, False)
    if not needs_grad(x):
        return _rope_impl(x, positions, float(base), pairing, rotary_dim or 0, False)
    return _RopeFunction.apply(x, positions, float(base), pairing, rotary_dim or 0, False)
