"""``RMSNormPlan`` / ``LayerNormPlan`` and their backwards (upstream's names, capital RMS).

Normalizes over the trailing axes ``normalized_shape`` (a suffix of ``input_shape``, as
``torch.nn.functional.rms_norm`` / ``layer_norm``); the math is in ``kernels/normalization.py``.

Contract:

* activations f16, bf16, f32, f64; weight (and bias) in the activation's kind or f32
  (``weight_element``), contiguous, of shape ``normalized_shape`` (or a flat buffer);
* statistics ``rstd`` (and ``mean``) in f32 (f64 for f64), contiguous, of shape
  ``input_shape[:-k] + (1,) * k`` (torch's keepdim statistics);
* ``x``, ``residual``, ``y``, ``h``, ``dy``, ``dh``, ``dx``: any non-negative strides on the
  leading axes; the normalized axes must merge into one strided axis (stride of each
  equals the next one's stride times its extent), else ``Unsupported``;
* residual (forward): ``h = x + residual`` rounded once to the activation kind is written
  to ``h`` and normalized; backward with ``has_dh`` adds the incoming gradient of ``h`` to
  ``dx`` (which is then also the residual's gradient);
* ``eps`` finite and > 0 (RMSNorm: None means the activation kind's machine epsilon, as
  torch); ``offset`` finite, and 0 unless there is a weight (Gemma: ``offset = 1``).

Backward: ``dx`` per row, ``dweight``/``dbias`` without atomics through the workspace
(``workspace_size`` bytes, sized by ``select``; ``WorkspaceTooSmall`` before any launch
when short). Deterministic and bit-stable: the row chunks of the weight gradients are
fixed by the problem (:func:`choose_launch`), not by the launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, ClassVar, NamedTuple

from .._runtime import SIMULATOR
from ..arrays import TensorRef, as_mut, as_ref, flat_span
from ..errors import InvalidProblem, Unsupported
from ..kernels.common import pad8
from ..kernels.normalization import (
    FINALIZE_BLOCK,
    FLAG_BIAS,
    FLAG_LAYER,
    FLAG_RESIDUAL,
    FLAG_WEIGHT,
    FLAG_WEIGHT_GRAD,
    MAX_BLOCK,
    MAX_COLUMNS_PER_THREAD,
    NORM_BACKWARD_KERNELS,
    NORM_ELEMENTS,
    NORM_FINALIZE_KERNELS,
    NORM_FORWARD_KERNELS,
    NORM_VEC_BACKWARD_KERNELS,
    NORM_VEC_FORWARD_KERNELS,
    NORM_WEIGHT_ELEMENTS,
    VEC_ELEMENTS,
    VEC_MAX_BLOCK,
    VEC_MAX_BLOCK_BW,
    VEC_MAX_SHARED_BW,
    VEC_MAX_UNITS,
    VEC_MAX_UNITS_BW,
    stats_type,
    vec_backward_slots,
)
from ..streams import stream_handle
from ..types import (
    ArchSku,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    NormalizationKind,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
)
from .base import LAUNCHED, LayoutMemo, Plan, fail, plan_args, product, replay_launcher

__all__ = [
    "NORM_ELEMENTS", "LayerNormArgs", "LayerNormBackwardArgs", "LayerNormBackwardDescriptor",
    "LayerNormBackwardPlan", "LayerNormDescriptor", "LayerNormPlan", "NormLaunch",
    "RMSNormArgs", "RMSNormBackwardArgs", "RMSNormBackwardDescriptor", "RMSNormBackwardPlan",
    "RMSNormDescriptor", "RMSNormPlan", "choose_launch",
]

# 16-byte units a thread of the register kernel aims for: several loads in flight per
# thread, in blocks small enough that many rows share an SM.
_VEC_UNITS = 4
# The backward holds two arrays (x̂ and g) and runs a chunk of rows per block: 2 units a
# thread, more threads.
_VEC_UNITS_BW = 2
# Elements per thread a forward block aims for: enough threads to hide latency on short
# rows, few enough that a long row needs no second block.
_FORWARD_ITEMS = 4
# The backward's threads each own up to _BACKWARD_ITEMS columns' running sums (registers).
_BACKWARD_ITEMS = 8
# Forward grid cap: a grid-stride loop takes the rest (launch overhead of huge grids).
_MAX_FORWARD_GRID = 1 << 16
# Row chunks of the weight gradients: one block each, a block's rows run one after the
# other (latency bound), so enough chunks for about four resident blocks an SM on a large
# GPU; each chunk's partial row costs 4n bytes written and read again (per weight and
# bias), so beyond half the target at least _MIN_CHUNK_ROWS rows a chunk (partials under
# ~10 % of the traffic of 16-bit rows). The partials ([chunks, n] twice) stay under
# _MAX_PARTIALS elements (workspace bound).
_TARGET_CHUNKS = 512
_MIN_CHUNK_ROWS = 16
_MAX_PARTIALS = 1 << 23


def _overlaps(a: TensorRef, b: TensorRef) -> bool:
    """Whether the byte ranges that two non-empty views span intersect."""
    end_a = a.ptr + flat_span(a.shape, a.strides) * a.itemsize
    end_b = b.ptr + flat_span(b.shape, b.strides) * b.itemsize
    return a.ptr < end_a and b.ptr < end_b and a.ptr < end_b and b.ptr < end_a


@dataclass(frozen=True, slots=True)
class NormLaunch:
    """What :func:`choose_launch` decided: the kernel (``"rows"``, the generic one, or
    ``"rows_vec"``, the row held in registers as ``units`` 16-byte units), threads per
    block, blocks, and (backward) the row chunks of the weight gradients
    (``rows_per_chunk`` rows each, ``chunks`` of them; a function of ``rows`` and ``n``
    only)."""

    kernel: str
    block: int
    grid: int
    rows_per_chunk: int
    chunks: int
    units: int = 0
    #: Forward register kernel: rows a block takes at once (2: a pair, see ``pair``).
    rows_at_once: int = 1


def _round32(value: int) -> int:
    return max(32, -(-value // 32) * 32)


def choose_launch(rows: int, n: int, backward: bool, block: int | None = None, *,
                  vec: int = 0, kernel: str | None = None, residual: bool = False,
                  pair: bool | None = None) -> NormLaunch:
    """The launch of a ``rows x n`` problem. ``vec``: elements per 16-byte unit when the
    element kind has the register kernel (0: it has not); it is taken for forward rows
    of whole units that fit ``VEC_MAX_UNITS`` units a thread, unless ``kernel="rows"``.
    ``block`` (a multiple of 32, at most 1024, enough for ``n``) overrides the thread
    count; the chunks never depend on it. The forward register kernel takes rows in
    pairs without a ``residual`` (the second row's words in the residual's registers: a
    block's loads, block sums and weight loads then serve two rows), unless ``pair`` is
    False; the results are the same bits either way."""
    units = n // vec if vec and n % vec == 0 else 0
    held = VEC_MAX_UNITS_BW if backward else VEC_MAX_UNITS
    vec_block = VEC_MAX_BLOCK_BW if backward else VEC_MAX_BLOCK
    use_vec = (kernel != "rows" and 0 < units <= held * vec_block
               and (not backward or 4 * units * vec_backward_slots(vec, True, True)
                    <= VEC_MAX_SHARED_BW))
    if kernel == "rows_vec" and not use_vec:
        raise ValueError(f"kernel = 'rows_vec' does not take this problem (n = {n})")
    if use_vec:
        least, most = _round32(-(-units // held)), vec_block
        preferred = _round32(-(-units // (_VEC_UNITS_BW if backward else _VEC_UNITS)))
    else:
        least = _round32(-(-n // MAX_COLUMNS_PER_THREAD)) if backward else 32
        most = MAX_BLOCK
        preferred = _round32(-(-n // (_BACKWARD_ITEMS if backward else _FORWARD_ITEMS)))
    if block is None:
        # the simulator: about 0.2 ms a simulated thread, so the fewest that cover the row
        block = least if SIMULATOR else min(most, max(least, preferred))
    if block % 32 or not least <= block <= most:
        raise ValueError(f"= {block} must be a multiple of 32 in [{least}, {most}]")
    if not backward:
        at_once = 2 if use_vec and not residual and rows > 1 and pair is not False else 1
        return NormLaunch("rows_vec" if use_vec else "rows", block,
                          min(-(-rows // at_once), _MAX_FORWARD_GRID), 0, 0,
                          units if use_vec else 0, at_once)
    chunks = min(rows, _TARGET_CHUNKS, max(_TARGET_CHUNKS // 2, rows // _MIN_CHUNK_ROWS),
                 max(1, _MAX_PARTIALS // max(2 * n, 1)))
    rows_per_chunk = -(-rows // chunks) if chunks else 0
    chunks = -(-rows // rows_per_chunk) if rows_per_chunk else 0
    return NormLaunch("rows_vec" if use_vec else "rows", block, chunks, rows_per_chunk, chunks,
                      units if use_vec else 0)


# -- descriptors and args ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RMSNormDescriptor:
    """``y = h · rstd · (offset + w)``; ``eps=None``: the element's machine epsilon."""

    input_shape: tuple[int, ...]
    normalized_shape: tuple[int, ...]
    element: ElementKind
    eps: float | None = None
    has_weight: bool = False
    weight_element: ElementKind | None = None  # None: the activation kind
    has_residual: bool = False
    offset: float = 0.0


@dataclass(frozen=True, slots=True)
class LayerNormDescriptor:
    """``y = (h − mean) · rstd · w + b``."""

    input_shape: tuple[int, ...]
    normalized_shape: tuple[int, ...]
    element: ElementKind
    eps: float = 1e-5
    has_weight: bool = False
    has_bias: bool = False
    weight_element: ElementKind | None = None
    has_residual: bool = False


@dataclass(frozen=True, slots=True)
class RMSNormBackwardDescriptor:
    """Gradients of :class:`RMSNormDescriptor`'s op; ``has_dh``: an incoming gradient of
    ``h`` is added to ``dx``."""

    input_shape: tuple[int, ...]
    normalized_shape: tuple[int, ...]
    element: ElementKind
    has_weight: bool = False
    weight_element: ElementKind | None = None
    has_dh: bool = False
    offset: float = 0.0
    #: False: no ``dweight`` (the weight only scales the gradient; as torch when the weight
    #: does not require grad): no partials, no finalize launch, ``dweight`` must be None.
    weight_grad: bool = True


@dataclass(frozen=True, slots=True)
class LayerNormBackwardDescriptor:
    """Gradients of :class:`LayerNormDescriptor`'s op (``weight_grad`` as in
    :class:`RMSNormBackwardDescriptor`)."""

    input_shape: tuple[int, ...]
    normalized_shape: tuple[int, ...]
    element: ElementKind
    has_weight: bool = False
    has_bias: bool = False
    weight_element: ElementKind | None = None
    has_dh: bool = False
    weight_grad: bool = True


@plan_args
class RMSNormArgs:
    """``x`` in, ``y`` and ``rstd`` out; ``h`` out exactly when ``residual`` is given."""

    x: Any
    y: Any
    rstd: Any
    weight: Any = None
    residual: Any = None
    h: Any = None


@plan_args
class LayerNormArgs:
    x: Any
    y: Any
    mean: Any
    rstd: Any
    weight: Any = None
    bias: Any = None
    residual: Any = None
    h: Any = None


@plan_args
class RMSNormBackwardArgs:
    """``x`` is the normalized input (``h`` when the forward had a residual)."""

    dy: Any
    x: Any
    rstd: Any
    dx: Any
    weight: Any = None
    dweight: Any = None
    dh: Any = None


@plan_args
class LayerNormBackwardArgs:
    dy: Any
    x: Any
    mean: Any
    rstd: Any
    dx: Any
    weight: Any = None
    dweight: Any = None
    dbias: Any = None
    dh: Any = None


# -- the plans ---------------------------------------------------------------------------

_STATS_ELEMENT = {ElementKind.F64: ElementKind.F64}
#: ``torch.finfo(dtype).eps``: RMSNorm's default eps, as torch.
_MACHINE_EPSILON = {ElementKind.F16: 2.0 ** -10, ElementKind.BF16: 2.0 ** -7,
                    ElementKind.F32: 2.0 ** -23, ElementKind.F64: 2.0 ** -52}


class _Array(NamedTuple):
    """An array argument of a kernel: pointer and extent (elements of its flat view)."""

    ptr: int
    extent: int


_NO_ARRAY = _Array(0, 0)
#: ``[(bound launch, its pointers), ...]``: the launches of one ``run``, in order
_Calls = list[tuple[Any, tuple[int, ...]]]
#: The arrays that ``run`` writes (each must be disjoint from every other array).
_OUTPUTS = frozenset({"y", "h", "rstd", "mean", "dx", "dweight", "dbias"})


def _view_of(entry: Any) -> TensorRef | None:
    """The view of a ``can_implement`` entry (a row array's entry is a tuple)."""
    return entry[0] if isinstance(entry, tuple) else entry


class _NormPlan(Plan):
    """Shared by the four plans: checks, views, the launch."""

    layer: ClassVar[bool] = False
    backward: ClassVar[bool] = False
    args_type: ClassVar[type]

    @classmethod
    def select(cls, desc: Any, pref: PlanPreference | None = None, *,
               block: int | None = None, kernel: str | None = None,
               pair: bool | None = None) -> Any:
        """Validate ``desc`` and load the kernels. ``block``: threads per block instead of
        the dispatch's choice; ``kernel``: ``"rows"`` or ``"rows_vec"`` (forward) instead
        of the dispatch's choice; ``pair=False``: the forward register kernel one row a
        block (tests and tuning; the weight gradients do not depend on any of them, y and
        dx may differ in the last bits between kernels, not between pair and single)."""
        shape, normalized = tuple(desc.input_shape), tuple(desc.normalized_shape)
        cls.check_rank(shape, "input_shape")
        k = len(normalized)
        if not 1 <= k <= len(shape) or shape[len(shape) - k:] != normalized:
            fail(cls.name, InvalidProblem, "normalized_shape",
                 f"= {normalized} must be a non-empty suffix of input_shape = {shape}")
        cls.check_element(desc.element, NORM_ELEMENTS)
        weight_element = desc.weight_element or desc.element
        if weight_element not in NORM_WEIGHT_ELEMENTS[desc.element]:
            names = ", ".join(e.name for e in NORM_WEIGHT_ELEMENTS[desc.element])
            fail(cls.name, Unsupported, "weight_element",
                 f"= {weight_element.name} is not supported with {desc.element.name} "
                 f"activations (supported: {names})")
        eps = getattr(desc, "eps", 1.0)
        if eps is None:
            eps = _MACHINE_EPSILON[desc.element]
        if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
            fail(cls.name, InvalidProblem, "eps", f"= {eps!r} must be finite and > 0")
        offset = getattr(desc, "offset", 0.0)
        if not math.isfinite(offset):
            fail(cls.name, InvalidProblem, "offset", f"= {offset!r} must be finite")
        if offset != 0 and not desc.has_weight:
            fail(cls.name, InvalidProblem, "offset",
                 f"= {offset!r} needs a weight (it scales x̂ by offset + w)")
        n = product(normalized)
        rows = product(shape[:len(shape) - k])
        if n > MAX_BLOCK * MAX_COLUMNS_PER_THREAD and cls.backward:
            fail(cls.name, Unsupported, "normalized_shape",
                 f"has {n} elements; the backward takes at most "
                 f"{MAX_BLOCK * MAX_COLUMNS_PER_THREAD}")
        try:
            vec = 16 // desc.element.byte_width if desc.element in VEC_ELEMENTS else 0
            launch = choose_launch(rows, n, cls.backward, block, vec=vec, kernel=kernel,
                                   residual=getattr(desc, "has_residual", False), pair=pair)
            generic = launch if launch.kernel == "rows" else choose_launch(
                rows, n, cls.backward, None, kernel="rows")
        except ValueError as exc:
            fail(cls.name, InvalidProblem, "block/kernel", str(exc))
        return cls(desc, pref, weight_element, float(eps), float(offset), rows, n, launch,
                   generic)

    def __init__(self, desc: Any, pref: PlanPreference | None, weight_element: ElementKind,
                 eps: float, offset: float, rows: int, n: int, launch: NormLaunch,
                 generic: NormLaunch) -> None:
        self.weight_element = weight_element
        self.eps = eps
        self.offset = offset
        self.rows = rows
        self.n = n
        #: The launch ``run`` takes for contiguous rows at 16-byte aligned addresses;
        #: other layouts of a ``"rows_vec"`` choice take ``generic_choice``.
        self.choice = launch
        self.generic_choice = generic
        self.stats_element = _STATS_ELEMENT.get(desc.element, ElementKind.F32)
        k = len(desc.normalized_shape)
        self.stats_shape = tuple(desc.input_shape[:len(desc.input_shape) - k]) + (1,) * k
        has_bias = getattr(desc, "has_bias", False)
        #: Backward: whether ``dweight`` is computed (a weight, and ``weight_grad``).
        self.weight_grad = self.backward and desc.has_weight and desc.weight_grad
        self.flags = ((FLAG_WEIGHT if desc.has_weight else 0) | (FLAG_BIAS if has_bias else 0)
                      | (FLAG_WEIGHT_GRAD if self.weight_grad else 0)
                      | (FLAG_RESIDUAL if getattr(desc, "has_residual", False)
                         or getattr(desc, "has_dh", False) else 0))
        workspace = 0
        if self.backward and (self.weight_grad or has_bias) and rows and n:
            # partials [chunks, n] of dw, then of db (at an offset of chunks · n)
            workspace = (2 if has_bias else 1) * launch.chunks * n * self.stats_element.byte_width
        kind = NormalizationKind.LAYER_NORM if self.layer else NormalizationKind.RMS_NORM
        precision = (MathPrecision.F64 if desc.element is ElementKind.F64
                     else MathPrecision.F32)
        guarantee = PrecisionGuarantee(precision, self.stats_element,
                                       bit_stable_on_same_hardware=True, deterministic=True)
        sku = KernelSku(OpCategory.NORMALIZATION, int(kind), desc.element, weight_element,
                        None, None, ArchSku.SM80, BackendKind.BESPOKE, guarantee)
        super().__init__(desc, sku, pref, workspace)
        key = (desc.element, weight_element, self.layer)
        self._kernel = (NORM_BACKWARD_KERNELS if self.backward else NORM_FORWARD_KERNELS)[key]
        self._finalize = NORM_FINALIZE_KERNELS[(str(stats_type(desc.element)),
                                                weight_element)]
        self._vec_kernel = (NORM_VEC_BACKWARD_KERNELS.get(key[:2]) if self.backward
                            else NORM_VEC_FORWARD_KERNELS.get(
                                (*key[:2], launch.rows_at_once == 2)))
        self._vec_flags = self.flags | (FLAG_LAYER if self.layer else 0)
        #: Backward register kernel: dynamic shared bytes of the dw/db running sums.
        self._vec_shared = 0
        if launch.kernel == "rows_vec" and self.backward:
            vec = 16 // desc.element.byte_width
            self._vec_shared = 4 * launch.units * vec_backward_slots(vec, self.weight_grad,
                                                                     has_bias)
            self._vec_kernel.allow_dynamic_shared(max(self._vec_shared, 1))
        if rows and n:
            (self._vec_kernel if launch.kernel == "rows_vec" else self._kernel).prepare()
        if self.backward and (self.weight_grad or has_bias) and n:
            self._finalize.prepare()
        # the arrays of ``args`` in field order (then the workspace, backward): the memo's
        self._names = tuple(f.name for f in fields(self.args_type))
        self._arrays = attrgetter(*self._names)
        disjoint = tuple((i, j) for j, b in enumerate(self._names)
                         for i, a in enumerate(self._names[:j]) if _OUTPUTS & {a, b})
        self._memo = LayoutMemo(len(self._names) + self.backward, disjoint)
        self._bound: dict[Any, Any] = {}

    # -- views ---------------------------------------------------------------------------

    def _rows_view(self, obj: Any, arg: str, out: bool) -> tuple[TensorRef, tuple, int]:
        """View of an activation-shaped array: (view, padded outer strides, inner
        stride); the normalized axes must merge into one strided axis."""
        desc = self.descriptor
        shape = tuple(desc.input_shape)
        view = (as_mut if out else as_ref)(obj, self.name, arg, desc.element, shape)
        k = len(desc.normalized_shape)
        strides = view.strides
        inner_axes = [a for a in range(len(shape) - k, len(shape)) if shape[a] != 1]
        inner = strides[inner_axes[-1]] if inner_axes else 1
        expected = inner
        for axis in reversed(inner_axes):
            if strides[axis] != expected:
                fail(self.name, Unsupported, arg,
                     f"strides {strides} do not merge the normalized axes into one "
                     f"(stride[{axis}] = {strides[axis]}, needs {expected})")
            expected = strides[axis] * shape[axis]
        return view, pad8(strides[:len(shape) - k], 0), inner

    def _vector(self, obj: Any, arg: str, element: ElementKind, out: bool = False
                ) -> TensorRef:
        shape = tuple(self.descriptor.normalized_shape)
        view = (as_mut if out else as_ref)(obj, self.name, arg, element, shape)
        if view.numel and not view.is_contiguous():
            fail(self.name, InvalidProblem, arg, f"must be contiguous (strides {view.strides})")
        return view

    def _stats(self, obj: Any, arg: str, out: bool) -> TensorRef:
        view = (as_mut if out else as_ref)(obj, self.name, arg, self.stats_element,
                                           self.stats_shape)
        if view.numel and not view.is_contiguous():
            fail(self.name, InvalidProblem, arg, f"must be contiguous (strides {view.strides})")
        return view

    def _optional(self, present: bool, obj: Any, arg: str) -> None:
        if present != (obj is not None):
            need = "must be given" if present else "must be None"
            fail(self.name, InvalidProblem, arg, f"{need} (descriptor)")

    def _outer_shape(self) -> tuple[int, ...]:
        desc = self.descriptor
        k = len(desc.normalized_shape)
        return pad8(tuple(desc.input_shape[:len(desc.input_shape) - k]), 1)

    def _aligned(self, views: dict[str, Any], rows: tuple[str, ...],
                 vectors: tuple[str, ...]) -> bool:
        """Whether every row of the ``rows`` arrays is contiguous and starts 16-byte
        aligned, and the ``vectors`` (weight, bias) start 16-byte aligned: the register
        kernels' layout."""
        itemsize = self.descriptor.element.byte_width
        shape = self._outer_shape()
        for key in rows:
            view, outer, inner = views[key]
            if view is None:
                continue
            if (inner != 1 and self.n > 1) or view.ptr % 16 or any(
                    extent > 1 and stride * itemsize % 16 for extent, stride in zip(shape, outer)):
                return False
        return all(views[key] is None or views[key].ptr % 16 == 0 for key in vectors)

    def _words(self, entry: tuple[Any, tuple, int]) -> tuple[_Array, tuple]:
        """A row array as uint32 words: (pointer, extent), outer strides in words."""
        view, outer, _ = entry
        if view is None:
            return _NO_ARRAY, outer
        itemsize = self.descriptor.element.byte_width
        span = flat_span(view.shape, view.strides) * itemsize
        return _Array(view.ptr, -(-span // 4)), tuple(s * itemsize // 4 for s in outer)

    @staticmethod
    def _vector_words(view: TensorRef | None) -> _Array:
        return _NO_ARRAY if view is None else _Array(view.ptr, view.numel * view.itemsize // 4)

    def _check_aliasing(self, views: dict[str, Any], outputs: tuple[str, ...]) -> None:
        """An output may be another activation-shaped argument itself (same address and
        strides: each element is read before it is written, by the thread that writes
        it), but may not meet any other argument's memory otherwise."""
        view_of = _view_of
        names = [k for k in views if view_of(views[k]) is not None]
        for out in outputs:
            mine = view_of(views[out])
            if mine is None:
                continue
            for other in names:
                theirs = view_of(views[other])
                if other == out or not _overlaps(mine, theirs):
                    continue
                if (isinstance(views[out], tuple) and isinstance(views[other], tuple)
                        and (mine.ptr, mine.strides) == (theirs.ptr, theirs.strides)):
                    continue
                fail(self.name, InvalidProblem, out,
                     f"overlaps {other} in memory (only the same array, element for element, "
                     "may be both)")

    @staticmethod
    def _pointer(view: TensorRef | None) -> _Array:
        if view is None:
            return _NO_ARRAY
        return _Array(view.ptr, flat_span(view.shape, view.strides))

    # -- launches --------------------------------------------------------------------------

    def _bind(self, kernel: Any, grid: int, block: int, args: tuple[Any, ...],
              shared_bytes: int = 0) -> tuple[Any, tuple[int, ...]]:
        """``(bound launch, its pointers)`` for ``args`` (arrays as :class:`_Array`): the
        bound launch is kept per non-pointer arguments, so only the pointers move."""
        pointers = tuple(a.ptr for a in args if type(a) is _Array)
        fixed = tuple(_Array(0, a.extent) if type(a) is _Array else a for a in args)
        key = (kernel, grid, block, shared_bytes, fixed)
        bound = self._bound.get(key)
        if bound is None:
            if len(self._bound) >= 64:
                self._bound.clear()
            bound = self._bound[key] = kernel.bind(grid, block, fixed, shared_bytes)
        return bound, pointers

    def _go(self, memo_key: Any, stream: Any, views: dict[str, Any], calls: _Calls,
            workspace_ptr: int) -> None:
        """Launch ``calls`` on ``stream`` and keep their replay under ``memo_key`` (None:
        arrays the memo does not key; no replay either where two arrays share an address,
        which only the checked path accepts)."""
        handle = stream_handle(stream)
        for bound, pointers in calls:
            bound.fast(handle, *pointers)
        if memo_key is None:
            return
        given = [_view_of(views[name]) for name in self._names]
        pointers = tuple(0 if v is None else v.ptr for v in given)
        spans = tuple(0 if v is None else flat_span(v.shape, v.strides) * v.itemsize
                      for v in given)
        if self.backward:  # the workspace: no overlap test (as the checked path)
            pointers, spans = pointers + (workspace_ptr,), spans + (0,)
        launch = replay_launcher(calls, pointers)
        if launch is not None:
            self._memo.store(memo_key, launch, spans)


_ABSENT = (None, (0,) * 8, 0)


class _NormForward(_NormPlan):
    def can_implement(self, args: Any) -> dict[str, Any]:
        """Views of every array after checking shapes, dtypes and layouts."""
        desc = self.descriptor
        self._optional(desc.has_weight, args.weight, "weight")
        self._optional(getattr(desc, "has_bias", False), getattr(args, "bias", None), "bias")
        self._optional(desc.has_residual, args.residual, "residual")
        self._optional(desc.has_residual, args.h, "h")
        views = {"x": self._rows_view(args.x, "x", False),
                 "y": self._rows_view(args.y, "y", True),
                 "residual": _ABSENT, "h": _ABSENT,
                 "rstd": self._stats(args.rstd, "rstd", True),
                 "mean": self._stats(args.mean, "mean", True) if self.layer else None,
                 "weight": None, "bias": None}
        if desc.has_residual:
            views["residual"] = self._rows_view(args.residual, "residual", False)
            views["h"] = self._rows_view(args.h, "h", True)
        if desc.has_weight:
            views["weight"] = self._vector(args.weight, "weight", self.weight_element)
        if getattr(desc, "has_bias", False):
            views["bias"] = self._vector(args.bias, "bias", self.weight_element)
        self._check_aliasing(views, ("y", "h", "rstd", "mean"))
        return views

    def run(self, args: Any, stream: Any = None, workspace: Any = None) -> None:
        """Launch the forward on ``stream`` (no host sync); nothing when empty. Torch or
        CuPy arrays of a layout seen before skip the checks (``LayoutMemo``; the
        no-overlap tests of the outputs still run per call)."""
        memo_key = self._memo.launch(stream, None, *self._arrays(args))
        if memo_key is LAUNCHED:
            return
        views = self.can_implement(args)
        self._go(memo_key, stream, views, self._forward_calls(views), 0)

    def _forward_calls(self, v: dict[str, Any]) -> _Calls:
        if not (self.rows and self.n):
            return []
        if self.choice.kernel == "rows_vec" and self._aligned(
                v, ("x", "y", "residual", "h"), ("weight", "bias")):
            # the register kernel: activations as uint32 words, strides in words
            (x, xs), (r, rs), (h, hs), (y, ys) = (self._words(v[k])
                                                  for k in ("x", "residual", "h", "y"))
            choice = self.choice
            return [self._bind(self._vec_kernel, choice.grid, choice.block, (
                x, r, h, y, self._vector_words(v["weight"]), self._vector_words(v["bias"]),
                self._pointer(v["rstd"]), self._pointer(v["mean"]), self._outer_shape(),
                xs, rs, hs, ys, self.rows, choice.units, self.n, self.eps, self.offset,
                self._vec_flags))]
        p = self._pointer
        choice = self.generic_choice
        (x, xs, xi), (r, rs, ri), (h, hs, hi), (y, ys, yi) = (v["x"], v["residual"], v["h"],
                                                              v["y"])
        return [self._bind(self._kernel, choice.grid, choice.block, (
            p(x), p(r), p(h), p(y), p(v["weight"]), p(v["bias"]), p(v["rstd"]), p(v["mean"]),
            self._outer_shape(), xs, rs, hs, ys, xi, ri, hi, yi, self.rows, self.n,
            self.eps, self.offset, self.flags))]


class _NormBackward(_NormPlan):
    def can_implement(self, args: Any) -> dict[str, Any]:
        desc = self.descriptor
        has_bias = getattr(desc, "has_bias", False)
        self._optional(desc.has_weight, args.weight, "weight")
        self._optional(self.weight_grad, args.dweight, "dweight")
        self._optional(has_bias, getattr(args, "dbias", None), "dbias")
        self._optional(desc.has_dh, args.dh, "dh")
        views = {"dy": self._rows_view(args.dy, "dy", False),
                 "x": self._rows_view(args.x, "x", False),
                 "dx": self._rows_view(args.dx, "dx", True),
                 "dh": self._rows_view(args.dh, "dh", False) if desc.has_dh else _ABSENT,
                 "rstd": self._stats(args.rstd, "rstd", False),
                 "mean": self._stats(args.mean, "mean", False) if self.layer else None,
                 "weight": None, "dweight": None, "dbias": None}
        if desc.has_weight:
            views["weight"] = self._vector(args.weight, "weight", self.weight_element)
            if self.weight_grad:
                views["dweight"] = self._vector(args.dweight, "dweight", self.weight_element,
                                                True)
        if has_bias:
            views["dbias"] = self._vector(args.dbias, "dbias", self.weight_element, True)
        self._check_aliasing(views, ("dx", "dweight", "dbias"))
        return views

    def run(self, args: Any, stream: Any = None, workspace: Any = None) -> None:
        """``dx`` then (with weight or bias) the weight gradients, on ``stream``. Torch or
        CuPy arrays (and workspace) of a layout seen before skip the checks
        (``LayoutMemo``; the no-overlap tests of the outputs still run per call)."""
        memo_key = self._memo.launch(stream, None, *self._arrays(args),
                                     workspace if self._workspace_size else None)
        if memo_key is LAUNCHED:
            return
        views = self.can_implement(args)
        workspace_ptr = self.check_workspace(workspace)
        self._go(memo_key, stream, views, self._backward_calls(views, workspace_ptr),
                 workspace_ptr)

    def _backward_calls(self, v: dict[str, Any], workspace_ptr: int) -> _Calls:
        p = self._pointer
        partials = _Array(workspace_ptr, self.workspace_size // self.stats_element.byte_width)
        choice = self.choice
        calls = []
        if not (self.rows and self.n):
            pass
        elif choice.kernel == "rows_vec" and self._aligned(v, ("dy", "x", "dh", "dx"),
                                                           ("weight",)):
            (dy, dys), (x, xs), (dh, dhs), (dx, dxs) = (self._words(v[k])
                                                        for k in ("dy", "x", "dh", "dx"))
            calls.append(self._bind(self._vec_kernel, choice.grid, choice.block, (
                dy, x, dh, dx, self._vector_words(v["weight"]), p(v["rstd"]), p(v["mean"]),
                partials, self._outer_shape(), dys, xs, dhs, dxs, self.rows, choice.units,
                self.n, choice.rows_per_chunk, choice.chunks, self.offset, self._vec_flags),
                shared_bytes=self._vec_shared))
        else:
            generic = self.generic_choice
            (dy, dys, dyi), (x, xs, xi), (dh, dhs, dhi), (dx, dxs, dxi) = (
                v["dy"], v["x"], v["dh"], v["dx"])
            calls.append(self._bind(self._kernel, generic.grid, generic.block, (
                p(dy), p(x), p(dh), p(dx), p(v["weight"]), p(v["rstd"]), p(v["mean"]),
                partials, self._outer_shape(), dys, xs, dhs, dxs, dyi, xi, dhi, dxi,
                self.rows, self.n, generic.rows_per_chunk, generic.chunks, self.offset,
                self.flags)))
        if self.n and self.flags & (FLAG_WEIGHT_GRAD | FLAG_BIAS):
            grid = max(1, min(-(-2 * self.n // 32), 4096))  # 32 columns a block
            calls.append(self._bind(self._finalize, grid, FINALIZE_BLOCK, (
                partials, p(v["dweight"]), p(v["dbias"]), choice.chunks, self.n, self.flags)))
        return calls


class RMSNormPlan(_NormForward):
    """RMSNorm forward; see the module docstring."""

    name = "RMSNormPlan"
    args_type = RMSNormArgs


class LayerNormPlan(_NormForward):
    """LayerNorm forward; see the module docstring."""

    name = "LayerNormPlan"
    args_type = LayerNormArgs
    layer = True


class RMSNormBackwardPlan(_NormBackward):
    """RMSNorm backward; see the module docstring."""

    name = "RMSNormBackwardPlan"
    args_type = RMSNormBackwardArgs
    backward = True


class LayerNormBackwardPlan(_NormBackward):
    """LayerNorm backward; see the module docstring."""

    name = "LayerNormBackwardPlan"
    args_type = LayerNormBackwardArgs
    layer = True
    backward = True
