"""``GatedActivationPlan`` / ``GatedActivationBackwardPlan``: ``y = act(gate) · up``.

Kinds (``GatedActivationKind``, upstream's discriminants): ``SWIGLU`` silu, ``GEGLU`` gelu
(``approximate="none"``: exact erf; ``"tanh"``: torch's tanh approximation), ``REGLU``
relu, ``GLU`` sigmoid (``F.glu``). Backward: ``dup = dy · act(gate)``, ``dgate = dy · up ·
act'(gate)``, the activation recomputed (see ``kernels/gated_activation.py`` for the
formulas and their NaN/inf behaviour, which follows torch's formula).

Two input forms, fixed by the descriptor:

* ``split_dim = d`` (an int, default the last axis): one tensor ``x`` of ``input_shape``
  whose axis ``d`` holds the two halves; ``y`` has ``output_shape`` (axis ``d`` halved).
  The gate is the first half for SwiGLU/GeGLU/ReGLU (``[gate | up]``, as fused gate-up
  projections produce) and the second for GLU (``F.glu``: first half · σ(second));
  ``gate_first`` overrides that (upstream's convention is ``gate_first=False`` for every
  kind). The backward writes ``dgate`` and ``dup`` into one ``dx`` of ``input_shape``.
* ``split_dim = None``: two tensors ``gate`` and ``up`` of ``input_shape`` (= output shape);
  the backward writes ``dgate`` and ``dup``.

Contract: dtypes f16, bf16, f32 (f32 math, one rounding on store) and f64 (f64 math);
rank 1..8; any non-negative strides (inputs may broadcast with stride 0); unit stride along
the rows, aligned pointers and 16-byte-multiple outer strides take 16-byte accesses, any
other layout one element per access (same bits). Outputs must not overlap the inputs or
each other. Deterministic and bit-stable (one thread per element, no atomics).

Kernel choice: :func:`choose_kernel`, a pure function of the problem (merged shape,
strides, offsets, pointer residues, the ``layout`` option), exposed after each run as
``plan.choice``; ``plan.layout = "elements"`` forces the element kernel (tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..arrays import TensorRef, as_mut, as_ref, flat_span
from ..errors import InvalidProblem
from ..kernels.common import pad8
from ..kernels.gated_activation import (
    ACT_GEGLU,
    ACT_GEGLU_TANH,
    ACT_GLU,
    ACT_REGLU,
    ACT_SWIGLU,
    GATED_ELEMENTS,
    GATED_LAYOUTS,
    UNITS_PER_THREAD,
    gated_kernel,
)
from ..launch import BoundLaunch
from ..streams import stream_handle
from ..types import (
    ArchSku,
    BackendKind,
    ElementKind,
    GatedActivationKind,
    KernelSku,
    MathPrecision,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
)
from .base import LAUNCHED, LayoutMemo, Plan, fail, plan_args, product, replay_launcher

__all__ = ["GatedActivationArgs", "GatedActivationBackwardArgs",
           "GatedActivationBackwardDescriptor", "GatedActivationBackwardPlan",
           "GatedActivationDescriptor", "GatedActivationPlan", "KernelChoice",
           "choose_kernel"]

_APPROXIMATIONS = ("none", "tanh")
_BLOCK = 256  # threads a block: 8 blocks of 256 fill an SM's 2048 threads
_MAX_GRID = (1 << 31) - 1  # gridDim.x limit; the kernels grid-stride past it
_ACT = {GatedActivationKind.GLU: ACT_GLU, GatedActivationKind.REGLU: ACT_REGLU,
        GatedActivationKind.SWIGLU: ACT_SWIGLU, GatedActivationKind.GEGLU: ACT_GEGLU}


@dataclass(frozen=True, slots=True)
class GatedActivationDescriptor:
    """``kind``, the input shape, the split axis (None: two input tensors) and the element
    kind; ``approximate`` ("none" or "tanh", GeGLU only) and ``gate_first`` (one-tensor form:
    None = the kind's convention) are keywords."""

    kind: GatedActivationKind
    input_shape: tuple[int, ...]
    split_dim: int | None
    element: ElementKind
    approximate: str = field(default="none", kw_only=True)
    gate_first: bool | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(self.input_shape))

    @property
    def output_shape(self) -> tuple[int, ...]:
        """``input_shape`` with ``split_dim`` halved (two-tensor form: ``input_shape``)."""
        if self.split_dim is None:
            return self.input_shape
        axis = self.split_dim % len(self.input_shape)
        shape = list(self.input_shape)
        shape[axis] //= 2
        return tuple(shape)


#: The backward takes the forward's descriptor (upstream: "backward descriptor identical").
GatedActivationBackwardDescriptor = GatedActivationDescriptor


@plan_args
class GatedActivationArgs:
    """One-tensor form: ``x`` read, ``y`` written; two-tensor form: ``gate`` and ``up``
    read, ``y`` written."""

    x: Any = None
    y: Any = None
    gate: Any = None
    up: Any = None


@plan_args
class GatedActivationBackwardArgs:
    """One-tensor form: ``dy``, ``x`` read, ``dx`` (both halves) written; two-tensor form:
    ``dy``, ``gate``, ``up`` read, ``dgate``, ``dup`` written."""

    dy: Any = None
    x: Any = None
    dx: Any = None
    gate: Any = None
    up: Any = None
    dgate: Any = None
    dup: Any = None


@dataclass(frozen=True, slots=True)
class KernelChoice:
    """What :func:`choose_kernel` picked: the layout (``units16`` or ``elements``), the
    elements per access, the merged outer shape (padded to 8), per tensor its outer
    strides, inner stride and base offset (all in accesses), the accesses per row, the
    total accesses, the block, the grid and the accesses a thread takes per loop trip."""

    layout: str
    unit: int
    outer_shape: tuple[int, ...]
    outer_strides: tuple[tuple[int, ...], ...]
    inner_strides: tuple[int, ...]
    bases: tuple[int, ...]
    row_units: int
    total: int
    block: int
    grid: int
    per_thread: int = 1


def _merge(shape: tuple[int, ...], strides: tuple[tuple[int, ...], ...]
           ) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Drop extent-1 axes and fold each axis into the next inner one where every tensor
    is contiguous across the two: the same elements in fewer, longer rows."""
    axes = [a for a in range(len(shape)) if shape[a] != 1] or [len(shape) - 1]
    merged_shape = [shape[axes[-1]]]
    merged = [[s[axes[-1]]] for s in strides]
    for axis in reversed(axes[:-1]):
        if all(s[axis] == m[0] * merged_shape[0] for s, m in zip(strides, merged)):
            merged_shape[0] *= shape[axis]
        else:
            merged_shape.insert(0, shape[axis])
            for s, m in zip(strides, merged):
                m.insert(0, s[axis])
    return tuple(merged_shape), tuple(tuple(m) for m in merged)


def choose_kernel(element: ElementKind, shape: tuple[int, ...],
                  strides: tuple[tuple[int, ...], ...], bases: tuple[int, ...],
                  residues: tuple[int, ...], layout: str | None = None,
                  max_grid: int = _MAX_GRID, per_thread: int = 1) -> KernelChoice:
    """The kernel for tensors of ``shape`` (non-empty) with per-tensor ``strides`` and base
    offsets ``bases`` (elements) at pointers whose residues mod 16 are ``residues``:
    ``units16`` where every row is unit-strided, whole 16-byte units long and every unit
    is 16-byte aligned (``layout`` None or "units16"), else ``elements``; the grid covers
    ``total`` with ``per_thread`` accesses a thread (the kernel's loop trip)."""
    merged_shape, merged = _merge(shape, strides)
    row_len = merged_shape[-1]
    unit = 16 // element.byte_width
    vector = (layout in (None, "units16") and row_len % unit == 0
              and all(m[-1] == 1 for m in merged)
              and all(o % unit == 0 for m in merged for o in m[:-1])
              and all((r + b * element.byte_width) % 16 == 0 for r, b in zip(residues, bases)))
    if not vector:
        unit = 1
    outer = merged_shape[:-1]
    row_units = row_len // unit
    total = product(outer) * row_units
    grid = max(1, min(-(-total // (_BLOCK * per_thread)), max_grid))
    return KernelChoice(
        "units16" if vector else "elements", unit, pad8(outer, 1),
        tuple(pad8(tuple(o // unit for o in m[:-1]), 0) for m in merged),
        tuple(1 if vector else m[-1] for m in merged), tuple(b // unit for b in bases),
        row_units, total, _BLOCK, grid, per_thread)


class _GatedBase(Plan):
    """Validation, dispatch and launch shared by the forward and backward plans."""

    _backward = False

    @classmethod
    def select(cls, desc: GatedActivationDescriptor,
               pref: PlanPreference | None = None) -> Any:
        if not isinstance(desc.kind, GatedActivationKind):
            fail(cls.name, InvalidProblem, "desc.kind",
                 f"= {desc.kind!r} is not a GatedActivationKind")
        cls.check_rank(desc.input_shape, "desc.input_shape")
        rank = len(desc.input_shape)
        if desc.split_dim is not None:
            if not isinstance(desc.split_dim, int) or not -rank <= desc.split_dim < rank:
                fail(cls.name, InvalidProblem, "desc.split_dim",
                     f"= {desc.split_dim!r} must be None or an int in [-{rank}, {rank})")
            extent = desc.input_shape[desc.split_dim % rank]
            if extent % 2:
                fail(cls.name, InvalidProblem,
                     f"desc.input_shape[{desc.split_dim % rank}]",
                     f"= {extent} must be even (it holds the gate and up halves)")
        cls.check_element(desc.element, GATED_ELEMENTS)
        if desc.approximate not in _APPROXIMATIONS:
            fail(cls.name, InvalidProblem, "desc.approximate",
                 f"= {desc.approximate!r} must be 'none' or 'tanh'")
        if desc.approximate == "tanh" and desc.kind is not GatedActivationKind.GEGLU:
            fail(cls.name, InvalidProblem, "desc.approximate",
                 f"= 'tanh' applies to GEGLU only, not {desc.kind.name}")
        if desc.gate_first not in (None, True, False):
            fail(cls.name, InvalidProblem, "desc.gate_first",
                 f"= {desc.gate_first!r} must be None, True or False")
        return cls(desc, pref)

    def __init__(self, desc: GatedActivationDescriptor, pref: PlanPreference | None) -> None:
        element = desc.element
        f64 = element is ElementKind.F64
        guarantee = PrecisionGuarantee(MathPrecision.F64 if f64 else MathPrecision.F32,
                                       ElementKind.F64 if f64 else ElementKind.F32,
                                       bit_stable_on_same_hardware=True, deterministic=True)
        one_tensor = desc.split_dim is not None
        sku = KernelSku(OpCategory.GATED_ACTIVATION, int(desc.kind), element, None,
                        "one_tensor" if one_tensor else "two_tensors",
                        "tanh" if desc.approximate == "tanh" else None, ArchSku.SM80,
                        BackendKind.BESPOKE, guarantee)
        super().__init__(desc, sku, pref)
        self._one_tensor = one_tensor
        self._input_shape = desc.input_shape
        self._output_shape = desc.output_shape
        self._empty = product(self._output_shape) == 0
        self._act = ACT_GEGLU_TANH if desc.approximate == "tanh" else _ACT[desc.kind]
        gate_first = desc.gate_first
        if gate_first is None:
            gate_first = desc.kind is not GatedActivationKind.GLU
        self._gate_first = gate_first
        self._axis = None if desc.split_dim is None else desc.split_dim % len(desc.input_shape)
        self._itemsize = element.byte_width
        #: "units16", "elements" or None (automatic, the default): which kernel
        #: :func:`choose_kernel` may pick (tests force "elements" with it).
        self.layout: str | None = None
        #: the last launch's :class:`KernelChoice` (None before the first run)
        self.choice: KernelChoice | None = None
        self._kernels = {layout: gated_kernel(element, layout, self._backward, self._act)
                         for layout in GATED_LAYOUTS}
        self._launches: dict[tuple[Any, ...], tuple[BoundLaunch, KernelChoice]] = {}
        tensors = 5 if self._backward else 3
        if self._one_tensor:  # x, (unused), y  |  dy, x, (unused), dx, (unused)
            disjoint = ((0, 3), (1, 3)) if self._backward else ((0, 2),)
        elif self._backward:
            disjoint = tuple((i, j) for i in range(3) for j in (3, 4)) + ((3, 4),)
        else:
            disjoint = ((0, 2), (1, 2))
        self._memo = LayoutMemo(tensors, disjoint)
        if not self._empty:
            for kernel in self._kernels.values():
                kernel.prepare()

    # -- arrays -----------------------------------------------------------------------------

    def _view(self, value: Any, arg: str, shape: tuple[int, ...], write: bool) -> TensorRef:
        if value is None:
            fail(self.name, InvalidProblem, arg,
                 f"is None; the {'one' if self._one_tensor else 'two'}-tensor form "
                 f"(split_dim = {self.descriptor.split_dim}) needs it")
        make = as_mut if write else as_ref
        return make(value, self.name, arg, self.descriptor.element, shape)

    def _absent(self, args: Any, names: tuple[str, ...]) -> None:
        for name in names:
            if getattr(args, name) is not None:
                form = ("one-tensor form (split_dim set)" if self._one_tensor
                        else "two-tensor form (split_dim None)")
                fail(self.name, InvalidProblem, name, f"must be None in the {form}")

    def _halves(self, view: TensorRef) -> tuple[tuple[int, ...], int, int]:
        """(strides, gate base, up base) of the two halves of a one-tensor view."""
        offset = self._output_shape[self._axis] * view.strides[self._axis]
        return view.strides, (0 if self._gate_first else offset), \
            (offset if self._gate_first else 0)

    def _check_disjoint(self, outputs: list[tuple[str, TensorRef]],
                        inputs: list[tuple[str, TensorRef]]) -> None:
        spans = {name: (view.ptr, view.ptr + self._span(view)) for name, view in outputs + inputs}
        names = [n for n, _ in outputs]
        for i, out in enumerate(names):
            for other in names[i + 1:] + [n for n, _ in inputs]:
                (a0, a1), (b0, b1) = spans[out], spans[other]
                if a0 < b1 and b0 < a1:
                    fail(self.name, InvalidProblem, out, f"overlaps {other}; outputs must not "
                         "share memory with the inputs or each other")

    # -- launch -----------------------------------------------------------------------------

    def _launch(self, views: list[TensorRef], strides: tuple[tuple[int, ...], ...],
                bases: tuple[int, ...]) -> tuple[BoundLaunch, KernelChoice]:
        key = (tuple(v.ptr % 16 for v in views), strides, bases, self.layout)
        found = self._launches.get(key)
        if found is None:
            choice = choose_kernel(self.descriptor.element, self._output_shape, strides,
                                   bases, key[0], self.layout,
                                   per_thread=UNITS_PER_THREAD[self._backward])
            kernel = self._kernels[choice.layout]
            unit_bytes = choice.unit * self._itemsize
            extents = []
            # the one-tensor backward writes both halves of dx through its dgate argument
            one_output = self._backward and self._one_tensor
            for i, view in enumerate(views):
                span = 0 if one_output and i == 4 else self._span(view)
                extents.append((0, -(-span // unit_bytes) * (unit_bytes // 4)
                                if choice.layout == "units16" else -(-span // self._itemsize)))
            strides_flat = tuple(s for outer in choice.outer_strides for s in outer)
            params = (choice.total, choice.row_units, self._act, *choice.inner_strides,
                      *choice.bases) + ((int(one_output),) if self._backward else ())
            bound = kernel.bind(choice.grid, choice.block,
                                (*extents, params, choice.outer_shape, strides_flat))
            if len(self._launches) >= 64:
                self._launches.clear()
            found = self._launches[key] = (bound, choice)
        return found

    def _go(self, args_arrays: tuple[Any, ...], stream: Any, views: list[TensorRef],
            strides: tuple[tuple[int, ...], ...], bases: tuple[int, ...],
            memo_key: Any) -> None:
        handle = stream_handle(stream)
        if self._empty:
            return
        bound, self.choice = self._launch(views, strides, bases)
        pointers = tuple(v.ptr for v in views)
        if self._backward and self._one_tensor:
            pointers = pointers[:4] + (0,)
        bound.fast(handle, *pointers)
        # the memo's arrays are the kernel's views in the same order, None where the
        # one-tensor form passes x (dx) twice
        given = tuple(0 if a is None else v.ptr for a, v in zip(args_arrays, views))
        replay = replay_launcher([(bound, pointers)], given)
        if replay is not None:
            self._memo.store(memo_key, replay, tuple(0 if a is None else self._span(v)
                                                     for a, v in zip(args_arrays, views)))

    def _span(self, view: TensorRef) -> int:
        """Bytes from a view's first element to one past its last."""
        return flat_span(view.shape, view.strides) * self._itemsize


class GatedActivationPlan(_GatedBase):
    """See the module docstring."""

    name = "GatedActivationPlan"

    def can_implement(self, args: GatedActivationArgs) -> tuple[list[TensorRef],
                                                                tuple[tuple[int, ...], ...],
                                                                tuple[int, ...]]:
        """(views gate, up, y; their strides; their base offsets) after every check."""
        if self._one_tensor:
            self._absent(args, ("gate", "up"))
            x = self._view(args.x, "x", self._input_shape, False)
            y = self._view(args.y, "y", self._output_shape, True)
            self._check_disjoint([("y", y)], [("x", x)])
            strides, gate_base, up_base = self._halves(x)
            return [x, x, y], (strides, strides, y.strides), (gate_base, up_base, 0)
        self._absent(args, ("x",))
        gate = self._view(args.gate, "gate", self._input_shape, False)
        up = self._view(args.up, "up", self._input_shape, False)
        y = self._view(args.y, "y", self._output_shape, True)
        self._check_disjoint([("y", y)], [("gate", gate), ("up", up)])
        return [gate, up, y], (gate.strides, up.strides, y.strides), (0, 0, 0)

    def run(self, args: GatedActivationArgs, stream: Any = None,
            workspace: Any = None) -> None:
        """``y = act(gate) · up`` on ``stream`` (no host synchronisation)."""
        arrays = ((args.x, None, args.y) if self._one_tensor
                  else (args.gate, args.up, args.y))
        memo_key = self._memo.launch(stream, self.layout, *arrays)
        if memo_key is LAUNCHED:
            return
        views, strides, bases = self.can_implement(args)
        self._go(arrays, stream, views, strides, bases, memo_key)


class GatedActivationBackwardPlan(_GatedBase):
    """See the module docstring."""

    name = "GatedActivationBackwardPlan"
    _backward = True

    def can_implement(self, args: GatedActivationBackwardArgs) -> tuple[
            list[TensorRef], tuple[tuple[int, ...], ...], tuple[int, ...]]:
        """(views dy, gate, up, dgate, dup; their strides; base offsets) after every
        check."""
        dy = self._view(args.dy, "dy", self._output_shape, False)
        if self._one_tensor:
            self._absent(args, ("gate", "up", "dgate", "dup"))
            x = self._view(args.x, "x", self._input_shape, False)
            dx = self._view(args.dx, "dx", self._input_shape, True)
            self._check_disjoint([("dx", dx)], [("dy", dy), ("x", x)])
            x_strides, gate_base, up_base = self._halves(x)
            dx_strides, dgate_base, dup_base = self._halves(dx)
            return ([dy, x, x, dx, dx],
                    (dy.strides, x_strides, x_strides, dx_strides, dx_strides),
                    (0, gate_base, up_base, dgate_base, dup_base))
        self._absent(args, ("x", "dx"))
        gate = self._view(args.gate, "gate", self._input_shape, False)
        up = self._view(args.up, "up", self._input_shape, False)
        dgate = self._view(args.dgate, "dgate", self._input_shape, True)
        dup = self._view(args.dup, "dup", self._input_shape, True)
        self._check_disjoint([("dgate", dgate), ("dup", dup)],
                             [("dy", dy), ("gate", gate), ("up", up)])
        return ([dy, gate, up, dgate, dup],
                (dy.strides, gate.strides, up.strides, dgate.strides, dup.strides),
                (0, 0, 0, 0, 0))

    def run(self, args: GatedActivationBackwardArgs, stream: Any = None,
            workspace: Any = None) -> None:
        """``dgate``, ``dup`` (or both halves of ``dx``) on ``stream`` (no host sync)."""
        arrays = ((args.dy, args.x, None, args.dx, None) if self._one_tensor
                  else (args.dy, args.gate, args.up, args.dgate, args.dup))
        memo_key = self._memo.launch(stream, self.layout, *arrays)
        if memo_key is LAUNCHED:
            return
        views, strides, bases = self.can_implement(args)
        self._go(arrays, stream, views, strides, bases, memo_key)

