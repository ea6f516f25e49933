"""``CrossEntropyLossPlan`` / ``CrossEntropyLossBackwardPlan``: softmax cross-entropy over
the rows of ``[N, V]`` logits with class-index targets (upstream's names).

Options (descriptor): ``reduction`` (none / mean / sum; mean over the non-ignored rows,
weighted by ``w_t`` as torch when class weights are given), ``ignore_index``,
``label_smoothing`` (torch's formula), ``z_loss`` (``+ z * w_t * lse^2`` per row),
``softcap`` (``c * tanh(x / c)`` before the softmax), class weights. The math is in
``kernels/cross_entropy.py``.

Outputs of the forward: ``out`` (f32, ``[N]`` for none, ``[1]`` otherwise), ``lse``
(f32 ``[N]``) and, with ``compute_grad``, ``grad`` (``[N, V]`` in the logits' kind): the
gradient of the loss for ``dy = 1`` (per row for none), computed in the same launch and
allowed to be the logits' own buffer (two reads and one write of the logits in all).
The backward plan computes ``dinput`` from the logits, the saved ``lse`` and ``dy``
(``[N]`` for none, ``[1]`` otherwise); ``dinput`` may also be the logits' buffer.

Which kernels run is :func:`choose_kernel`'s pure decision (``plan.choice``): one block
per row, or, for few long rows, each row split into a fixed number of column chunks
(depending on the problem size only) whose partial results are merged in chunk order.
Everything is deterministic and bit-identical from run to run. Targets outside ``[0, V)``
other than ``ignore_index`` give a NaN loss row; with ``BARACUDA_DEBUG=1`` the plan
counts them on the device first (one host synchronisation) and raises
``InvalidProblem``.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

from .._runtime import SIMULATOR
from ..arrays import TensorRef, as_mut, as_ref
from ..debug import debug_enabled
from ..driver import check, libcuda, stream_synchronize
from ..errors import InvalidProblem, Unsupported
from ..kernels.cross_entropy import (
    CE_COMBINE_KERNEL,
    CE_ELEMENTS,
    CE_FINALIZE_KERNEL,
    CE_GRAD_KERNELS,
    CE_PARTIAL_KERNELS,
    CE_ROWS_KERNELS,
    CE_TARGET_WORDS,
    CE_TARGETS_KERNEL,
    CE_UNIT_ELEMENTS,
    HEADER_BAD,
    HEADER_ONE,
    HEADER_SLOTS,
    PARTIAL_SLOTS,
)
from ..streams import stream_handle
from ..types import (
    ArchSku,
    BackendKind,
    CrossEntropyTargetKind,
    ElementKind,
    KernelSku,
    LossKind,
    LossReduction,
    MathPrecision,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
)
from .base import Plan, fail, plan_args

__all__ = [
    "CROSS_ENTROPY_ELEMENTS",
    "CROSS_ENTROPY_TARGET_ELEMENTS",
    "CrossEntropyChoice",
    "CrossEntropyLossArgs",
    "CrossEntropyLossBackwardArgs",
    "CrossEntropyLossBackwardDescriptor",
    "CrossEntropyLossBackwardPlan",
    "CrossEntropyLossDescriptor",
    "CrossEntropyLossPlan",
    "choose_kernel",
]

CROSS_ENTROPY_ELEMENTS = tuple(CE_ELEMENTS)
CROSS_ENTROPY_TARGET_ELEMENTS = tuple(CE_TARGET_WORDS)

# One row per block takes up to this many threads: two such blocks per SM, each thread
# with four 8-byte loads in flight, stream a long row, and one block's barriers between
# its passes overlap the other's loads (the simulator runs a thread per Python thread).
_MAX_BLOCK = 32 if SIMULATOR else 512
_MIN_BLOCK = 32
# Below this many rows one block per row leaves most SMs of a current GPU idle, so long
# rows are split into column chunks.
_SPLIT_BELOW_ROWS = 128
# Blocks the split aims for: a few waves on the largest current GPUs. A constant, so the
# split (and the bits of the result) depends on the problem only, not on the device.
_SPLIT_TARGET_BLOCKS = 1024
# A chunk shorter than this re-reads too little to pay for its partial and merge.
_MIN_CHUNK = 4096
# Chunks per row at most: the merge is sequential per row.
_MAX_CHUNKS = 256
# Threads of the one-block kernels (targets, finalize) and of the merge.
_SMALL_BLOCK = 32 if SIMULATOR else 1024
_COMBINE_BLOCK = 32 if SIMULATOR else 128
_MAX_GRID = (1 << 31) - 1


@dataclass(frozen=True, slots=True)
class CrossEntropyChoice:
    """What :func:`choose_kernel` decided: ``path`` ``"rows"`` (one block per row) or
    ``"split"`` (``chunks`` column chunks of ``chunk_len`` elements per row), and the
    block size of the row kernels."""

    path: str
    chunks: int
    chunk_len: int
    block: int


def _block_for(elements: int, unit: int) -> int:
    """Threads for a span of ``elements``: about eight 8-byte units per thread (two
    rounds of four loads), in warps."""
    threads = max(1, -(-elements // (8 * unit)))
    block = _MIN_BLOCK
    while block < threads and block < _MAX_BLOCK:
        block *= 2
    return min(block, _MAX_BLOCK)


def choose_kernel(n_rows: int, class_extent: int, unit: int,
                  split: int | None = None) -> CrossEntropyChoice:
    """The kernels for ``n_rows`` rows of ``class_extent`` classes, ``unit`` elements per
    8-byte unit. ``split`` forces the number of column chunks (1: one block per row);
    None picks it from the problem size alone."""
    if split is None:
        chunks = 1
        if n_rows < _SPLIT_BELOW_ROWS and class_extent >= 2 * _MIN_CHUNK:
            wanted = -(-_SPLIT_TARGET_BLOCKS // max(n_rows, 1))
            chunks = max(1, min(wanted, class_extent // _MIN_CHUNK, _MAX_CHUNKS))
    else:
        chunks = max(1, min(split, class_extent))
    if chunks == 1:
        return CrossEntropyChoice("rows", 1, class_extent, _block_for(class_extent, unit))
    chunk_len = -(-class_extent // chunks)
    chunk_len = -(-chunk_len // unit) * unit  # chunks start on unit boundaries
    chunks = -(-class_extent // chunk_len)
    return CrossEntropyChoice("split", chunks, chunk_len, _block_for(chunk_len, unit))


@dataclass(frozen=True, slots=True)
class CrossEntropyLossDescriptor:
    """``n_rows`` x ``class_extent`` logits of ``element``; targets of
    ``target_element`` (I32/I64). ``softcap`` None or > 0; ``label_smoothing`` in
    [0, 1]; ``z_loss`` >= 0. ``compute_grad``: the forward also writes the gradient."""

    n_rows: int
    class_extent: int
    reduction: LossReduction
    element: ElementKind
    target_element: ElementKind = ElementKind.I64
    target_kind: CrossEntropyTargetKind = CrossEntropyTargetKind.CLASS_INDEX
    ignore_index: int = -100
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    softcap: float | None = None
    has_weight: bool = False
    compute_grad: bool = False


@dataclass(frozen=True, slots=True)
class CrossEntropyLossBackwardDescriptor:
    """The forward descriptor's problem and options (no ``compute_grad``)."""

    n_rows: int
    class_extent: int
    reduction: LossReduction
    element: ElementKind
    target_element: ElementKind = ElementKind.I64
    target_kind: CrossEntropyTargetKind = CrossEntropyTargetKind.CLASS_INDEX
    ignore_index: int = -100
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    softcap: float | None = None
    has_weight: bool = False


@plan_args
class CrossEntropyLossArgs:
    """``input`` [N, V] (inner stride 1), ``target`` [N] contiguous, ``out`` f32 [N]
    (none) or [1], ``lse`` f32 [N], ``weight`` f32 [V] (with ``has_weight``), ``grad``
    [N, V] (with ``compute_grad``; the logits' own buffer or disjoint from them)."""

    input: Any
    target: Any
    out: Any
    lse: Any
    weight: Any = None
    grad: Any = None


@plan_args
class CrossEntropyLossBackwardArgs:
    """``dy`` f32 [N] (none) or [1]; ``dinput`` [N, V], possibly the logits' buffer."""

    input: Any
    target: Any
    lse: Any
    dy: Any
    dinput: Any
    weight: Any = None


def _check_descriptor(plan: type[Plan], desc: Any) -> None:
    """Every rule that depends on the descriptor alone."""
    name = plan.name
    for field in ("n_rows", "class_extent"):
        value = getattr(desc, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            fail(name, InvalidProblem, field, f"= {value!r} must be a non-negative int")
    if desc.class_extent < 1:
        fail(name, InvalidProblem, "class_extent", "= 0 must be at least 1")
    if not isinstance(desc.reduction, LossReduction):
        fail(name, InvalidProblem, "reduction",
             f"= {desc.reduction!r} must be a LossReduction (NONE, MEAN or SUM)")
    plan.check_element(desc.element, CROSS_ENTROPY_ELEMENTS)
    if desc.target_element not in CROSS_ENTROPY_TARGET_ELEMENTS:
        fail(name, Unsupported, "target_element",
             f"= {desc.target_element!r} must be I32 or I64 (class indices)")
    if desc.target_kind is not CrossEntropyTargetKind.CLASS_INDEX:
        fail(name, Unsupported, "target_kind",
             f"= {desc.target_kind!r}: only CLASS_INDEX targets are implemented")
    if not isinstance(desc.ignore_index, int) or isinstance(desc.ignore_index, bool):
        fail(name, InvalidProblem, "ignore_index", f"= {desc.ignore_index!r} must be an int")
    smoothing = desc.label_smoothing
    if not isinstance(smoothing, (int, float)) or not 0.0 <= smoothing <= 1.0:
        fail(name, InvalidProblem, "label_smoothing",
             f"= {smoothing!r} must be a number in [0, 1]")
    z = desc.z_loss
    if not isinstance(z, (int, float)) or not (math.isfinite(z) and z >= 0.0):
        fail(name, InvalidProblem, "z_loss", f"= {z!r} must be a finite number >= 0")
    cap = desc.softcap
    if cap is not None and (not isinstance(cap, (int, float)) or not (math.isfinite(cap)
                                                                       and cap > 0.0)):
        fail(name, InvalidProblem, "softcap", f"= {cap!r} must be None or a finite number > 0")


def _sku(desc: Any) -> KernelSku:
    f64 = desc.element is ElementKind.F64
    guarantee = PrecisionGuarantee(MathPrecision.F64 if f64 else MathPrecision.F32,
                                   ElementKind.F64 if f64 else ElementKind.F32,
                                   bit_stable_on_same_hardware=True, deterministic=True)
    return KernelSku(OpCategory.LOSS, int(LossKind.CROSS_ENTROPY), desc.element,
                     desc.target_element, None, None, ArchSku.SM80, BackendKind.BESPOKE,
                     guarantee)


def _read_f32(pointer: int, stream: int) -> float:
    """The f32 at device ``pointer`` after ``stream``'s work (a host synchronisation)."""
    stream_synchronize(stream)
    if SIMULATOR:
        return ctypes.c_float.from_address(pointer).value
    value = ctypes.c_float()
    check(libcuda().cuMemcpyDtoH_v2(ctypes.byref(value), ctypes.c_uint64(pointer),
                                    ctypes.c_size_t(4)), "cuMemcpyDtoH")
    return value.value


class _CrossEntropyBase(Plan):
    """Shared views and launches of the forward and backward plans."""

    def __init__(self, desc: Any, pref: PlanPreference | None, split: int | None,
                 workspace_size: int) -> None:
        self._unit = CE_UNIT_ELEMENTS[desc.element]
        super().__init__(desc, _sku(desc), pref, workspace_size)
        self._words = CE_TARGET_WORDS[desc.target_element]
        CE_TARGETS_KERNEL.prepare()

    @staticmethod
    def _choice(desc: Any, split: int | None) -> CrossEntropyChoice:
        return choose_kernel(desc.n_rows, desc.class_extent, CE_UNIT_ELEMENTS[desc.element],
                             split)

    @staticmethod
    def _header_bytes() -> int:
        return HEADER_SLOTS * 4

    def _logits(self, array: Any, arg: str, writable: bool) -> TensorRef:
        desc = self.descriptor
        shape = (desc.n_rows, desc.class_extent)
        view = (as_mut if writable else as_ref)(array, self.name, arg, desc.element, shape)
        if desc.class_extent > 1 and desc.n_rows > 0 and view.strides[1] != 1:
            fail(self.name, Unsupported, arg,
                 f"has strides {view.strides}; the class axis must have stride 1")
        return view

    def _row_stride(self, view: TensorRef) -> int:
        return view.strides[0] if self.descriptor.n_rows > 1 else self.descriptor.class_extent

    def _small(self, array: Any, arg: str, element: ElementKind, shape: tuple[int, ...],
               writable: bool = False) -> TensorRef:
        view = (as_mut if writable else as_ref)(array, self.name, arg, element, shape)
        if shape[0] > 1 and view.strides[0] != 1:
            fail(self.name, Unsupported, arg,
                 f"has strides {view.strides}; it must be contiguous")
        return view

    def _target_views(self, target: Any, weight: Any) -> tuple[TensorRef, TensorRef | None]:
        desc = self.descriptor
        target_view = self._small(target, "target", desc.target_element, (desc.n_rows,))
        weight_view = None
        if desc.has_weight:
            if weight is None:
                fail(self.name, InvalidProblem, "weight", "is None but has_weight is set")
            weight_view = self._small(weight, "weight", ElementKind.F32, (desc.class_extent,))
        elif weight is not None:
            fail(self.name, InvalidProblem, "weight", "is given but has_weight is not set")
        return target_view, weight_view

    def _check_alias(self, logits: TensorRef, out: TensorRef, arg: str) -> None:
        """``out`` is either exactly the logits' view or disjoint from it."""
        if out.ptr == logits.ptr and out.strides == logits.strides:
            return
        span = self._span(logits) * logits.itemsize
        out_span = self._span(out) * out.itemsize
        if out.ptr < logits.ptr + span and logits.ptr < out.ptr + out_span:
            fail(self.name, InvalidProblem, arg,
                 "overlaps the logits without being exactly their buffer")

    def _span(self, view: TensorRef) -> int:
        desc = self.descriptor
        if desc.n_rows == 0:
            return 0
        return (desc.n_rows - 1) * self._row_stride(view) + desc.class_extent

    def _vec(self, *views: TensorRef) -> bool:
        """Whether every logits-shaped view can be read as 8-byte units."""
        unit = self._unit
        one_row = self.descriptor.n_rows <= 1
        return all(v.ptr % 8 == 0 and (one_row or self._row_stride(v) % unit == 0)
                   for v in views)

    def _pair(self, view: TensorRef | None, vec: bool) -> tuple[tuple[int, int], tuple[int, int]]:
        """(element array, 8-byte unit array) arguments of a logits-shaped view."""
        if view is None:
            return (0, 0), (0, 0)
        span = self._span(view)
        return (view.ptr, span), ((view.ptr, span // self._unit) if vec else (0, 0))

    def _launch_targets(self, handle: int, target: TensorRef, weight: TensorRef | None,
                        ws: int) -> None:
        desc = self.descriptor
        weight_arg = (weight.ptr, desc.class_extent) if weight is not None else (0, 0)
        CE_TARGETS_KERNEL.launch(1, _SMALL_BLOCK, handle, (
            self._target_arg(target), weight_arg, (ws, HEADER_SLOTS), desc.n_rows,
            desc.class_extent, desc.ignore_index, int(weight is not None), self._words))
        if debug_enabled():
            bad = _read_f32(ws + HEADER_BAD * 4, handle)
            if bad:
                fail(self.name, InvalidProblem, "target",
                     f"has {int(bad)} values outside [0, {desc.class_extent}) other than "
                     f"ignore_index = {desc.ignore_index} (BARACUDA_DEBUG check)")

    def _target_arg(self, target: TensorRef) -> tuple[int, int]:
        """The targets as int32 words (two per int64 target)."""
        return (target.ptr, self.descriptor.n_rows * self._words)

    def _launch_grad(self, handle: int, logits: TensorRef, target: TensorRef,
                     weight: TensorRef | None, lse: int, dy: tuple[int, int], dy_stride: int,
                     grad: TensorRef, ws: int) -> None:
        desc, choice = self.descriptor, self.choice
        vec = self._vec(logits, grad)
        x, x_units = self._pair(logits, vec)
        g, g_units = self._pair(grad, vec)
        blocks = min(desc.n_rows * choice.chunks, _MAX_GRID)
        CE_GRAD_KERNELS[desc.element].launch(blocks, choice.block, handle, (
            x, x_units, self._target_arg(target),
            (weight.ptr, desc.class_extent) if weight is not None else (0, 0),
            (lse, desc.n_rows), dy, (ws, HEADER_SLOTS), g, g_units, desc.n_rows,
            desc.class_extent, self._row_stride(logits), self._row_stride(grad),
            choice.chunks, choice.chunk_len, desc.ignore_index, int(vec),
            float(desc.softcap or 0.0), float(desc.label_smoothing), float(desc.z_loss),
            int(weight is not None), int(desc.reduction), dy_stride, self._words))


class CrossEntropyLossPlan(_CrossEntropyBase):
    """See the module docstring. ``select(desc, pref, split=k)`` forces ``k`` column
    chunks per row (1: one block per row); ``plan.choice`` is what runs."""

    name = "CrossEntropyLossPlan"

    @classmethod
    def select(cls, desc: CrossEntropyLossDescriptor, pref: PlanPreference | None = None, *,
               split: int | None = None) -> CrossEntropyLossPlan:
        if not isinstance(desc, CrossEntropyLossDescriptor):
            fail(cls.name, InvalidProblem, "desc",
                 f"is a {type(desc).__name__}, not a CrossEntropyLossDescriptor")
        _check_descriptor(cls, desc)
        if split is not None and (not isinstance(split, int) or split < 1):
            fail(cls.name, InvalidProblem, "split", f"= {split!r} must be None or an int >= 1")
        return cls(desc, pref, split)

    def __init__(self, desc: CrossEntropyLossDescriptor, pref: PlanPreference | None,
                 split: int | None) -> None:
        self.choice = self._choice(desc, split)
        n = desc.n_rows
        self._loss_rows_offset = self._header_bytes()
        size = self._loss_rows_offset
        if desc.reduction is not LossReduction.NONE:
            size += -(-n * 4 // 16) * 16
        self._partials_offset = size
        if self.choice.path == "split":
            size += n * self.choice.chunks * PARTIAL_SLOTS * 4
        super().__init__(desc, pref, split, size)
        if self.choice.path == "rows":
            CE_ROWS_KERNELS[desc.element, desc.compute_grad].prepare()
        else:
            CE_PARTIAL_KERNELS[desc.element].prepare()
            CE_COMBINE_KERNEL.prepare()
            if desc.compute_grad:
                CE_GRAD_KERNELS[desc.element].prepare()
        if desc.reduction is not LossReduction.NONE:
            CE_FINALIZE_KERNEL.prepare()

    def can_implement(self, args: CrossEntropyLossArgs) -> tuple[Any, ...]:
        """Views of (input, target, weight, out, lse, grad) after every array check."""
        desc = self.descriptor
        logits = self._logits(args.input, "input", writable=False)
        target, weight = self._target_views(args.target, args.weight)
        out_shape = (desc.n_rows,) if desc.reduction is LossReduction.NONE else (1,)
        out = self._small(args.out, "out", ElementKind.F32, out_shape, writable=True)
        lse = self._small(args.lse, "lse", ElementKind.F32, (desc.n_rows,), writable=True)
        grad = None
        if desc.compute_grad:
            if args.grad is None:
                fail(self.name, InvalidProblem, "grad", "is None but compute_grad is set")
            grad = self._logits(args.grad, "grad", writable=True)
            self._check_alias(logits, grad, "grad")
        elif args.grad is not None:
            fail(self.name, InvalidProblem, "grad", "is given but compute_grad is not set")
        return logits, target, weight, out, lse, grad

    def run(self, args: CrossEntropyLossArgs, stream: Any = None, workspace: Any = None) -> None:
        """Loss, lse (and gradient) on ``stream``; no host sync unless BARACUDA_DEBUG."""
        logits, target, weight, out, lse, grad = self.can_implement(args)
        ws = self.check_workspace(workspace)
        handle = stream_handle(stream)
        desc, choice = self.descriptor, self.choice
        self._launch_targets(handle, target, weight, ws)
        n = desc.n_rows
        reduced = desc.reduction is not LossReduction.NONE
        loss_rows = ws + self._loss_rows_offset if reduced else out.ptr
        weight_arg = (weight.ptr, desc.class_extent) if weight is not None else (0, 0)
        options = (float(desc.softcap or 0.0), float(desc.label_smoothing),
                   float(desc.z_loss))
        if n and choice.path == "rows":
            vec = self._vec(logits, grad) if grad is not None else self._vec(logits)
            x, x_units = self._pair(logits, vec)
            g, g_units = self._pair(grad, vec)
            kernel = CE_ROWS_KERNELS[desc.element, desc.compute_grad]
            kernel.launch(min(n, _MAX_GRID), choice.block, handle, (
                x, x_units, self._target_arg(target), weight_arg, (ws, HEADER_SLOTS),
                (loss_rows, n), (lse.ptr, n), g, g_units, n, desc.class_extent,
                self._row_stride(logits), self._row_stride(grad) if grad is not None else 0,
                desc.ignore_index,
                int(vec), *options, int(weight is not None), int(desc.reduction),
                self._words))
        elif n:
            vec = self._vec(logits)
            x, x_units = self._pair(logits, vec)
            partials = (ws + self._partials_offset, n * choice.chunks * PARTIAL_SLOTS)
            CE_PARTIAL_KERNELS[desc.element].launch(
                min(n * choice.chunks, _MAX_GRID), choice.block, handle, (
                    x, x_units, self._target_arg(target), weight_arg, partials, n,
                    desc.class_extent, self._row_stride(logits), choice.chunks,
                    choice.chunk_len, int(vec), options[0], int(desc.label_smoothing != 0),
                    int(weight is not None), self._words))
            CE_COMBINE_KERNEL.launch(
                min(-(-n // _COMBINE_BLOCK), _MAX_GRID), _COMBINE_BLOCK, handle, (
                    self._target_arg(target), weight_arg, partials, (ws, HEADER_SLOTS),
                    (loss_rows, n), (lse.ptr, n), n, desc.class_extent, choice.chunks,
                    choice.chunk_len, desc.ignore_index, options[1], options[2],
                    int(weight is not None), self._words))
            if grad is not None:
                self._launch_grad(handle, logits, target, weight, lse.ptr,
                                  (ws + HEADER_ONE * 4, 1), 0, grad, ws)
        if reduced:
            CE_FINALIZE_KERNEL.launch(1, _SMALL_BLOCK, handle, (
                (loss_rows, n), (ws, HEADER_SLOTS), (out.ptr, 1), n,
                int(desc.reduction is LossReduction.MEAN)))


class CrossEntropyLossBackwardPlan(_CrossEntropyBase):
    """``dinput`` from the logits, the saved ``lse`` and ``dy``. ``select(desc, pref,
    split=k)`` forces ``k`` column chunks per row; ``plan.choice`` is what runs."""

    name = "CrossEntropyLossBackwardPlan"

    @classmethod
    def select(cls, desc: CrossEntropyLossBackwardDescriptor, pref: PlanPreference | None = None,
               *, split: int | None = None) -> CrossEntropyLossBackwardPlan:
        if not isinstance(desc, CrossEntropyLossBackwardDescriptor):
            fail(cls.name, InvalidProblem, "desc",
                 f"is a {type(desc).__name__}, not a CrossEntropyLossBackwardDescriptor")
        _check_descriptor(cls, desc)
        if split is not None and (not isinstance(split, int) or split < 1):
            fail(cls.name, InvalidProblem, "split", f"= {split!r} must be None or an int >= 1")
        return cls(desc, pref, split)

    def __init__(self, desc: CrossEntropyLossBackwardDescriptor, pref: PlanPreference | None,
                 split: int | None) -> None:
        self.choice = self._choice(desc, split)
        super().__init__(desc, pref, split, self._header_bytes())
        CE_GRAD_KERNELS[desc.element].prepare()

    def can_implement(self, args: CrossEntropyLossBackwardArgs) -> tuple[Any, ...]:
        """Views of (input, target, weight, lse, dy, dinput) after every array check."""
        desc = self.descriptor
        logits = self._logits(args.input, "input", writable=False)
        target, weight = self._target_views(args.target, args.weight)
        lse = self._small(args.lse, "lse", ElementKind.F32, (desc.n_rows,))
        dy_shape = (desc.n_rows,) if desc.reduction is LossReduction.NONE else (1,)
        dy = self._small(args.dy, "dy", ElementKind.F32, dy_shape)
        dinput = self._logits(args.dinput, "dinput", writable=True)
        self._check_alias(logits, dinput, "dinput")
        return logits, target, weight, lse, dy, dinput

    def run(self, args: CrossEntropyLossBackwardArgs, stream: Any = None,
            workspace: Any = None) -> None:
        """Write ``dinput`` on ``stream`` (no host sync unless BARACUDA_DEBUG)."""
        logits, target, weight, lse, dy, dinput = self.can_implement(args)
        ws = self.check_workspace(workspace)
        handle = stream_handle(stream)
        self._launch_targets(handle, target, weight, ws)
        desc = self.descriptor
        if desc.n_rows == 0:
            return
        per_row = desc.reduction is LossReduction.NONE
        self._launch_grad(handle, logits, target, weight, lse.ptr,
                          (dy.ptr, desc.n_rows if per_row else 1), int(per_row), dinput, ws)
