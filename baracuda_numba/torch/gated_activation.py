"""torch twins of the gated activations (``swiglu``, ``geglu``, ``reglu``, ``glu``), with
autograd through ``GatedActivationBackwardPlan``: the activation is recomputed from the
saved inputs (nothing else is saved)."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ..types import GatedActivationKind
from ._core import LIB, EagerFunction, compiling, needs_grad

__all__ = ["geglu", "glu", "reglu", "swiglu"]

K = GatedActivationKind
_FORWARD = {K.SWIGLU: ops.swiglu, K.REGLU: ops.reglu}
_BACKWARD = {K.SWIGLU: ops.swiglu_backward, K.REGLU: ops.reglu_backward}


def _rows(t: Tensor) -> Tensor:
    """The plans take any strides; a gradient with a non-unit last stride runs the
    element kernel, so make it dense once (it is read once either way)."""
    return t if t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _forward_impl(gate: Tensor, up: Tensor | None, kind: int, approximate: str,
                  dim: int) -> Tensor:
    kind = K(kind)
    if kind is K.GLU:
        return ops.glu(gate, dim)
    if kind is K.GEGLU:
        return ops.geglu(gate, up, approximate)
    return _FORWARD[kind](gate, up)


def _backward_impl(dy: Tensor, gate: Tensor, up: Tensor | None, kind: int, approximate: str,
                   dim: int) -> list[Tensor]:
    kind = K(kind)
    dy = _rows(dy)
    if kind is K.GLU:
        return [ops.glu_backward(dy, gate, dim)]
    if kind is K.GEGLU:
        out = ops.geglu_backward(dy, gate, up, approximate)
    else:
        out = _BACKWARD[kind](dy, gate, up)
    return [out] if up is None else list(out)


@torch.library.custom_op(f"{LIB}::gated_activation", mutates_args=())
def _gated_op(gate: Tensor, up: Tensor | None, kind: int, approximate: str,
              dim: int) -> Tensor:
    return _forward_impl(gate, up, kind, approximate, dim)


@_gated_op.register_fake
def _(gate: Tensor, up: Tensor | None, kind: int, approximate: str, dim: int) -> Tensor:
    if up is not None:
        return torch.empty_like(gate)
    shape = list(gate.shape)
    shape[dim] //= 2
    return gate.new_empty(shape)


@torch.library.custom_op(f"{LIB}::gated_activation_backward", mutates_args=())
def _gated_backward_op(dy: Tensor, gate: Tensor, up: Tensor | None, kind: int,
                       approximate: str, dim: int) -> list[Tensor]:
    return _backward_impl(dy, gate, up, kind, approximate, dim)


@_gated_backward_op.register_fake
def _(dy: Tensor, gate: Tensor, up: Tensor | None, kind: int, approximate: str,
      dim: int) -> list[Tensor]:
    return [torch.empty_like(gate)] if up is None else [torch.empty_like(gate),
                                                        torch.empty_like(up)]


def _setup(ctx, inputs, output) -> None:
    gate, up, ctx.kind, ctx.approximate, ctx.dim = inputs
    ctx.save_for_backward(gate, up)


def _grads(grads: list[Tensor], up: Tensor | None) -> tuple:
    if up is None:
        return grads[0], None, None, None, None
    return grads[0], grads[1], None, None, None


def _op_backward(ctx, dy: Tensor):
    gate, up = ctx.saved_tensors
    return _grads(_gated_backward_op(dy, gate, up, ctx.kind, ctx.approximate, ctx.dim), up)


_gated_op.register_autograd(_op_backward, setup_context=_setup)


class _GatedFunction(EagerFunction):
    """Eager twin of ``baracuda::gated_activation``."""

    @staticmethod
    def forward(gate, up, kind, approximate, dim):
        return _forward_impl(gate, up, kind, approximate, dim)

    setup_context = staticmethod(_setup)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        return _grads(_backward_impl(dy, gate, up, ctx.kind, ctx.approximate, ctx.dim), up)


def _gated(gate: Tensor, up: Tensor | None, kind: K, approximate: str, dim: int) -> Tensor:
    if compiling():
        return _gated_op(gate, up, int(kind), approximate, dim)
    if not (needs_grad(gate) or (up is not None and needs_grad(up))):
        return _forward_impl(gate, up, int(kind), approximate, dim)
    return _GatedFunction.apply(gate, up, int(kind), approximate, dim)


def swiglu(gate: Tensor, up: Tensor | None = None) -> Tensor:
    """``F.silu(gate) * up``; ``up=None``: ``gate`` is ``[.., 2I]`` holding ``[gate | up]``."""
    return _gated(gate, up, K.SWIGLU, "none", -1)


def geglu(gate: Tensor, up: Tensor | None = None, approximate: str = "none") -> Tensor:
    """``F.gelu(gate, approximate=approximate) * up``."""
    return _gated(gate, up, K.GEGLU, approximate, -1)


def reglu(gate: Tensor, up: Tensor | None = None) -> Tensor:
    """``F.relu(gate) * up``."""
    return _gated(gate, up, K.REGLU, "none", -1)


def glu(x: Tensor, dim: int = -1) -> Tensor:
    """``F.glu(x, dim)``."""
    return _gated(x, None, K.GLU, "none", dim)
