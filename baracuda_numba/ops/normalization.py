"""Functional RMSNorm and LayerNorm (with the fused residual add) and their backwards.

Same positional arguments and defaults as ``torch.nn.functional.rms_norm`` /
``layer_norm``. With ``residual``, ``h = x + residual`` is normalized and the call returns
``(y, h)``; ``return_stats=True`` appends the saved statistics (``rstd``, and ``mean`` for
LayerNorm; f32, f64 for f64 inputs) that the backward functions take.
"""

from __future__ import annotations

from typing import Any

from .._frameworks import element_of
from ..plans.normalization import (
    LayerNormArgs,
    LayerNormBackwardArgs,
    LayerNormBackwardDescriptor,
    LayerNormBackwardPlan,
    LayerNormDescriptor,
    LayerNormPlan,
    RMSNormArgs,
    RMSNormBackwardArgs,
    RMSNormBackwardDescriptor,
    RMSNormBackwardPlan,
    RMSNormDescriptor,
    RMSNormPlan,
)
from ..types import ElementKind
from ._core import call_site, plan_for, workspace_spec

__all__ = ["layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward"]


def _shape(normalized_shape: Any) -> tuple[int, ...]:
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return tuple(int(s) for s in normalized_shape)


def _weight_kind(weight: Any, bias: Any = None) -> ElementKind | None:
    present = weight if weight is not None else bias
    return None if present is None else element_of(present)


def _forward(layer: bool, x: Any, normalized: tuple[int, ...], weight: Any, bias: Any,
             eps: float | None, residual: Any, offset: float, return_stats: bool,
             stream: Any) -> Any:
    weight_kind = _weight_kind(weight, bias)
    options = ("layer_norm" if layer else "rms_norm", normalized, weight is not None,
               bias is not None, weight_kind, eps, residual is not None, offset)

    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        if layer:
            desc: Any = LayerNormDescriptor(shape, normalized, element, eps,
                                            weight is not None, bias is not None,
                                            weight_kind, residual is not None)
            plan = plan_for(desc, lambda: LayerNormPlan.select(desc))
        else:
            desc = RMSNormDescriptor(shape, normalized, element, eps, weight is not None,
                                     weight_kind, residual is not None, offset)
            plan = plan_for(desc, lambda: RMSNormPlan.select(desc))
        stats = (plan.stats_shape, plan.stats_element)
        return plan, ((shape, element), (shape, element) if residual is not None else None,
                      stats, stats if layer else None), 0

    plan, (alloc_y, alloc_h, alloc_rstd, alloc_mean), current, *_ = call_site(
        x, options, make)
    y, rstd = alloc_y(x), alloc_rstd(x)
    h = None if alloc_h is None else alloc_h(x)
    stream = current() if stream is None else stream
    if layer:
        mean = alloc_mean(x)
        plan.run(LayerNormArgs(x, y, mean, rstd, weight, bias, residual, h), stream=stream)
        stats: tuple[Any, ...] = (rstd, mean)
    else:
        plan.run(RMSNormArgs(x, y, rstd, weight, residual, h), stream=stream)
        stats = (rstd,)
    out = (y,) if h is None else (y, h)
    if return_stats:
        out += stats
    return out[0] if len(out) == 1 else out


def rms_norm(x: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None, *,
             residual: Any = None, offset: float = 0.0, return_stats: bool = False,
             stream: Any = None) -> Any:
    """``y = h / sqrt(mean(h²) + eps) · (offset + weight)`` over the trailing axes
    ``normalized_shape``, ``h = x`` or ``x + residual``. Returns ``y``, ``(y, h)`` with a
    residual, plus ``rstd`` with ``return_stats``. ``eps=None``: ``finfo(x.dtype).eps``."""
    return _forward(False, x, _shape(normalized_shape), weight, None, eps, residual,
                    float(offset), return_stats, stream)


def layer_norm(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,
               eps: float = 1e-5, *, residual: Any = None, return_stats: bool = False,
               stream: Any = None) -> Any:
    """``y = (h − mean) / sqrt(var + eps) · weight + bias`` over the trailing axes
    ``normalized_shape`` (biased variance); returns as :func:`rms_norm`, the statistics
    being ``(rstd, mean)``."""
    return _forward(True, x, _shape(normalized_shape), weight, bias, eps, residual, 0.0,
                    return_stats, stream)


def _backward(layer: bool, dy: Any, x: Any, mean: Any, rstd: Any, normalized: tuple[int, ...],
              weight: Any, has_bias: bool, dh: Any, offset: float, weight_grad: bool,
              stream: Any) -> Any:
    weight_kind = _weight_kind(weight)
    weight_grad = bool(weight_grad) and weight is not None
    options = ("layer_norm_bw" if layer else "rms_norm_bw", normalized, weight is not None,
               has_bias, weight_kind, dh is not None, offset, weight_grad)

    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        if layer:
            desc: Any = LayerNormBackwardDescriptor(shape, normalized, element,
                                                    weight is not None, has_bias,
                                                    weight_kind, dh is not None,
                                                    weight_grad)
            plan = plan_for(desc, lambda: LayerNormBackwardPlan.select(desc))
        else:
            desc = RMSNormBackwardDescriptor(shape, normalized, element, weight is not None,
                                             weight_kind, dh is not None, offset,
                                             weight_grad)
            plan = plan_for(desc, lambda: RMSNormBackwardPlan.select(desc))
        vector = (normalized, plan.weight_element)
        return plan, ((shape, element), vector if weight_grad else None,
                      vector if has_bias else None, workspace_spec(plan)), 0

    plan, (alloc_dx, alloc_dw, alloc_db, alloc_ws), current, *_ = call_site(
        dy, options, make)
    dx = alloc_dx(dy)
    dweight = None if alloc_dw is None else alloc_dw(dy)
    dbias = None if alloc_db is None else alloc_db(dy)
    workspace = None if alloc_ws is None else alloc_ws(dy)
    stream = current() if stream is None else stream
    if layer:
        plan.run(LayerNormBackwardArgs(dy, x, mean, rstd, dx, weight, dweight, dbias, dh),
                 stream=stream, workspace=workspace)
        return dx, dweight, dbias
    plan.run(RMSNormBackwardArgs(dy, x, rstd, dx, weight, dweight, dh), stream=stream,
             workspace=workspace)
    return dx, dweight


def rms_norm_backward(dy: Any, x: Any, rstd: Any, normalized_shape: Any, weight: Any = None,
                      *, dh: Any = None, offset: float = 0.0, weight_grad: bool = True,
                      stream: Any = None) -> Any:
    """``(dx, dweight)`` of :func:`rms_norm` (``dweight`` None without a weight, or with
    ``weight_grad=False``: the weight then only scales the gradient). ``x`` is the
    normalized input (``h`` when the forward had a residual); ``dh``, the incoming
    gradient of ``h``, is added to ``dx``, which is then also the residual's gradient."""
    return _backward(False, dy, x, None, rstd, _shape(normalized_shape), weight, False, dh,
                     float(offset), weight_grad, stream)


def layer_norm_backward(dy: Any, x: Any, mean: Any, rstd: Any, normalized_shape: Any,
                        weight: Any = None, has_bias: bool = False, *, dh: Any = None,
                        weight_grad: bool = True, stream: Any = None) -> Any:
    """``(dx, dweight, dbias)`` of :func:`layer_norm` (None for an absent weight/bias);
    ``x``, ``dh`` and ``weight_grad`` as in :func:`rms_norm_backward`."""
    return _backward(True, dy, x, mean, rstd, _shape(normalized_shape), weight, has_bias, dh,
                     0.0, weight_grad, stream)
