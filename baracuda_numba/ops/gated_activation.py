"""Functional gated activations and their gradients: ``act(gate) · up``.

``gate`` alone is one tensor whose last axis holds ``[gate | up]`` (``glu``: ``F.glu``'s
halves along ``dim``, ``x[first] · σ(x[second])``); with ``up`` given, two tensors of one
shape. The backward functions return ``dx`` (both halves, one-tensor form) or
``(dgate, dup)``.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidProblem
from ..plans.gated_activation import (
    GatedActivationArgs,
    GatedActivationBackwardArgs,
    GatedActivationBackwardPlan,
    GatedActivationDescriptor,
    GatedActivationPlan,
)
from ..types import ElementKind, GatedActivationKind
from ._core import call_site, plan_for

__all__ = ["geglu", "geglu_backward", "glu", "glu_backward", "reglu", "reglu_backward",
           "swiglu", "swiglu_backward"]

K = GatedActivationKind


def _approximate(approximate: str, fn: str) -> str:
    if approximate not in ("none", "tanh"):
        raise InvalidProblem(f"{fn}: approximate = {approximate!r} must be 'none' or 'tanh'")
    return approximate


def _forward(kind: K, approximate: str, gate: Any, up: Any, dim: int | None,
             stream: Any) -> Any:
    split = -1 if up is None and dim is None else dim

    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        desc = GatedActivationDescriptor(kind, shape, split, element, approximate=approximate)
        plan = plan_for(("gated", desc), lambda: GatedActivationPlan.select(desc))
        return plan, ((desc.output_shape, element),), 0

    plan, (alloc_y,), current, *_ = call_site(
        gate, ("gated", kind, approximate, split), make)
    y = alloc_y(gate)
    args = (GatedActivationArgs(gate, y) if split is not None
            else GatedActivationArgs(y=y, gate=gate, up=up))
    plan.run(args, stream=current() if stream is None else stream)
    return y


def _backward(kind: K, approximate: str, dy: Any, gate: Any, up: Any, dim: int | None,
              stream: Any) -> Any:
    split = -1 if up is None and dim is None else dim

    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        desc = GatedActivationDescriptor(kind, shape, split, element, approximate=approximate)
        plan = plan_for(("gated_bw", desc), lambda: GatedActivationBackwardPlan.select(desc))
        spec = (shape, element)
        return plan, (spec, None if split is not None else spec), 0

    plan, (alloc_a, alloc_b), current, *_ = call_site(
        gate, ("gated_bw", kind, approximate, split), make)
    stream = current() if stream is None else stream
    if split is not None:
        dx = alloc_a(gate)
        plan.run(GatedActivationBackwardArgs(dy, gate, dx), stream=stream)
        return dx
    dgate, dup = alloc_a(gate), alloc_b(gate)
    plan.run(GatedActivationBackwardArgs(dy, gate=gate, up=up, dgate=dgate, dup=dup),
             stream=stream)
    return dgate, dup


def swiglu(gate: Any, up: Any = None, *, stream: Any = None) -> Any:
    """``silu(gate) · up``; ``up=None``: ``gate`` is ``[.., 2I]`` holding ``[gate | up]``."""
    return _forward(K.SWIGLU, "none", gate, up, None, stream)


def geglu(gate: Any, up: Any = None, approximate: str = "none", *,
          stream: Any = None) -> Any:
    """``gelu(gate, approximate) · up`` (``"none"``: exact erf; ``"tanh"``)."""
    return _forward(K.GEGLU, _approximate(approximate, "geglu"), gate, up, None, stream)


def reglu(gate: Any, up: Any = None, *, stream: Any = None) -> Any:
    """``relu(gate) · up`` (NaN gates give NaN, as ``F.relu``)."""
    return _forward(K.REGLU, "none", gate, up, None, stream)


def glu(x: Any, dim: int = -1, *, stream: Any = None) -> Any:
    """``F.glu(x, dim)``: the first half of ``dim`` times the sigmoid of the second."""
    return _forward(K.GLU, "none", x, None, dim, stream)


def swiglu_backward(dy: Any, gate: Any, up: Any = None, *, stream: Any = None) -> Any:
    """Gradient of :func:`swiglu`: ``dx`` (one-tensor form) or ``(dgate, dup)``."""
    return _backward(K.SWIGLU, "none", dy, gate, up, None, stream)


def geglu_backward(dy: Any, gate: Any, up: Any = None, approximate: str = "none", *,
                   stream: Any = None) -> Any:
    """Gradient of :func:`geglu`."""
    return _backward(K.GEGLU, _approximate(approximate, "geglu_backward"), dy, gate, up,
                     None, stream)


def reglu_backward(dy: Any, gate: Any, up: Any = None, *, stream: Any = None) -> Any:
    """Gradient of :func:`reglu`."""
    return _backward(K.REGLU, "none", dy, gate, up, None, stream)


def glu_backward(dy: Any, x: Any, dim: int = -1, *, stream: Any = None) -> Any:
    """Gradient of :func:`glu`: ``dx`` of ``x``'s shape."""
    return _backward(K.GLU, "none", dy, x, None, dim, stream)
