"""Functional rotary position embedding and its backward."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidProblem
from ..plans.rope import (
    RopeArgs,
    RopeBackwardArgs,
    RopeBackwardDescriptor,
    RopeBackwardPlan,
    RopeDescriptor,
    RopePlan,
)
from ..types import ElementKind, RopePairing
from ._core import call_site, plan_for

__all__ = ["rope", "rope_backward"]


def _pairing(pairing: RopePairing | str) -> RopePairing:
    if isinstance(pairing, RopePairing):
        return pairing
    return RopePairing[pairing.upper().replace("-", "_")]


def _rope(backward: bool, x: Any, positions: Any, base: float, pairing: Any,
          rotary_dim: int | None, inplace: bool, stream: Any) -> Any:
    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        if len(shape) != 4:
            raise InvalidProblem(f"{'rope_backward' if backward else 'rope'}: x must be "
                                 f"[B, H, S, D], got shape {shape}")
        pair = _pairing(pairing)
        options = dict(base=float(base), element=element, pairing=pair,
                       rotary_dim=rotary_dim)
        if backward:
            plan = plan_for(("rope_bw", shape, float(base), element, pair, rotary_dim),
                            lambda: RopeBackwardPlan.select(RopeBackwardDescriptor(
                                *shape, **options)))
        else:
            plan = plan_for(("rope", shape, float(base), element, pair, rotary_dim),
                            lambda: RopePlan.select(RopeDescriptor(*shape, **options)))
        return plan, (None if inplace else (shape, element),), 0

    plan, (alloc_y,), current, *_ = call_site(
        x, ("rope", backward, base, pairing, rotary_dim, inplace), make)
    y = x if alloc_y is None else alloc_y(x)
    args = (RopeBackwardArgs if backward else RopeArgs)(x, y, positions)
    plan.run(args, stream=current() if stream is None else stream)
    return y


def rope(x: Any, *, positions: Any = None, base: float = 10000.0,
         pairing: RopePairing | str = RopePairing.INTERLEAVED, rotary_dim: int | None = None,
         inplace: bool = False, stream: Any = None) -> Any:
    """Rotary position embedding of ``x`` ``[B, H, S, D]`` (last axis stride 1; other axes
    any stride). ``positions``: int64 ``[S]`` or ``[B, S]`` (default ``s``)."""
    return _rope(False, x, positions, base, pairing, rotary_dim, inplace, stream)


def rope_backward(dy: Any, *, positions: Any = None, base: float = 10000.0,
                  pairing: RopePairing | str = RopePairing.INTERLEAVED,
                  rotary_dim: int | None = None, inplace: bool = False,
                  stream: Any = None) -> Any:
    """Gradient of :func:`rope`: the rotation of ``dy`` by ``-theta``."""
    return _rope(True, dy, positions, base, pairing, rotary_dim, inplace, stream)
