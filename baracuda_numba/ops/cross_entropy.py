"""Functional cross-entropy over ``[N, V]`` logits with class-index targets, and its
backward (``CrossEntropyLossPlan`` / ``CrossEntropyLossBackwardPlan``)."""

from __future__ import annotations

from typing import Any

from .._frameworks import allocator, element_of, framework_of, stream_source
from ..errors import InvalidProblem
from ..plans.cross_entropy import (
    CrossEntropyLossArgs,
    CrossEntropyLossBackwardArgs,
    CrossEntropyLossBackwardDescriptor,
    CrossEntropyLossBackwardPlan,
    CrossEntropyLossDescriptor,
    CrossEntropyLossPlan,
)
from ..types import ElementKind, LossReduction
from ._core import plan_for

__all__ = ["cross_entropy", "cross_entropy_backward"]

_REDUCTIONS = {"none": LossReduction.NONE, "mean": LossReduction.MEAN,
               "sum": LossReduction.SUM}


def _reduction(reduction: Any, fn: str) -> LossReduction:
    if isinstance(reduction, LossReduction):
        return reduction
    found = _REDUCTIONS.get(reduction) if isinstance(reduction, str) else None
    if found is None:
        raise InvalidProblem(f"{fn}: reduction = {reduction!r} must be 'none', 'mean' or "
                             "'sum'")
    return found


def _contiguous(array: Any) -> Any:
    """``array`` itself when it is contiguous, else a contiguous copy (targets, weights)."""
    kind = framework_of(array)
    if kind == "torch":
        return array.contiguous()
    if kind == "cupy":
        import cupy

        return cupy.ascontiguousarray(array)
    return array


def _float32(array: Any) -> Any:
    """Class weights as a contiguous f32 vector."""
    if array is None:
        return None
    if element_of(array) is not ElementKind.F32:
        array = array.float() if framework_of(array) == "torch" else array.astype("float32")
    return _contiguous(array)


def _problem(logits: Any, target: Any, fn: str) -> tuple[int, int, ElementKind]:
    if len(logits.shape) != 2:
        raise InvalidProblem(f"{fn}: logits has shape {tuple(logits.shape)}; it must be "
                             "[N, V]")
    n, v = (int(s) for s in logits.shape)
    if tuple(int(s) for s in target.shape) != (n,):
        raise InvalidProblem(f"{fn}: target has shape {tuple(target.shape)}; it must be "
                             f"[N] = ({n},)")
    target_element = element_of(target)
    if target_element not in (ElementKind.I32, ElementKind.I64):
        raise InvalidProblem(f"{fn}: target has dtype {target.dtype}; class indices must be "
                             "int32 or int64")
    return n, v, target_element


def _scalar(out: Any) -> Any:
    return out.reshape(())


def cross_entropy(logits: Any, target: Any, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                  softcap: float | None = None, weight: Any = None, *,
                  return_lse: bool = False, grad_out: Any = None,
                  split: int | None = None, stream: Any = None) -> Any:
    """Softmax cross-entropy of ``logits`` ``[N, V]`` (f16/bf16/f32/f64, inner stride 1)
    against class indices ``target`` ``[N]`` (int32/int64), as ``F.cross_entropy`` with
    the same defaults, plus ``z_loss`` (``+ z * w_t * lse^2`` per row) and ``softcap``
    (``c * tanh(x / c)`` before the softmax). Returns the f32 loss (a scalar, or ``[N]``
    for ``reduction="none"``), and the f32 per-row log-sum-exp with ``return_lse``.

    ``grad_out`` (an ``[N, V]`` array of the logits' dtype, which may be ``logits``
    itself) receives the gradient of the returned loss in the same launch. ``split``
    forces the number of column chunks per row (see ``plan.choice``)."""
    fn = "cross_entropy"
    n, v, target_element = _problem(logits, target, fn)
    desc = CrossEntropyLossDescriptor(
        n, v, _reduction(reduction, fn), element_of(logits), target_element,
        ignore_index=int(ignore_index), label_smoothing=float(label_smoothing),
        z_loss=float(z_loss), softcap=None if softcap is None else float(softcap),
        has_weight=weight is not None, compute_grad=grad_out is not None)
    plan = plan_for(("cross_entropy", desc, split),
                    lambda: CrossEntropyLossPlan.select(desc, split=split), logits)
    reduced = desc.reduction is not LossReduction.NONE
    out = allocator(logits, (1,) if reduced else (n,), ElementKind.F32)(logits)
    lse = allocator(logits, (n,), ElementKind.F32)(logits)
    workspace = allocator(logits, (plan.workspace_size,), ElementKind.U8)(logits)
    plan.run(CrossEntropyLossArgs(logits, _contiguous(target), out, lse, _float32(weight),
                                  grad_out),
             stream=stream_source(logits)() if stream is None else stream, workspace=workspace)
    loss = _scalar(out) if reduced else out
    return (loss, lse) if return_lse else loss


def cross_entropy_backward(logits: Any, target: Any, lse: Any, dy: Any,
                           ignore_index: int = -100, reduction: str = "mean",
                           label_smoothing: float = 0.0, z_loss: float = 0.0,
                           softcap: float | None = None, weight: Any = None, *,
                           out: Any = None, split: int | None = None,
                           stream: Any = None) -> Any:
    """The gradient of :func:`cross_entropy`'s loss for upstream gradient ``dy`` (f32;
    ``[N]`` for ``"none"``, a scalar otherwise), from the saved ``lse``. ``out``: where to
    write it (default a new array; may be ``logits`` itself)."""
    fn = "cross_entropy_backward"
    n, v, target_element = _problem(logits, target, fn)
    desc = CrossEntropyLossBackwardDescriptor(
        n, v, _reduction(reduction, fn), element_of(logits), target_element,
        ignore_index=int(ignore_index), label_smoothing=float(label_smoothing),
        z_loss=float(z_loss), softcap=None if softcap is None else float(softcap),
        has_weight=weight is not None)
    plan = plan_for(("cross_entropy_backward", desc, split),
                    lambda: CrossEntropyLossBackwardPlan.select(desc, split=split), logits)
    if out is None:
        out = allocator(logits, (n, v), desc.element)(logits)
    if desc.reduction is not LossReduction.NONE:
        dy = dy.reshape((1,))
    workspace = allocator(logits, (plan.workspace_size,), ElementKind.U8)(logits)
    plan.run(CrossEntropyLossBackwardArgs(logits, _contiguous(target), lse, _float32(dy),
                                          out, _float32(weight)),
             stream=stream_source(logits)() if stream is None else stream, workspace=workspace)
    return out
