"""The registered kernels of the family: one ``Kernel`` per (kind, element) of each
kernel name, with their signatures.
"""


from collections.abc import Callable
from typing import Any

from numba import float64, int32, int64, types, uint32, uint64

from ...launch import Kernel, LazyTable
from ...types import ElementKind, ReduceKind
from .backward import (
    _half_kernel,
    _half_signature,
    _make_backward,
    _make_backward_broadcast,
    _make_prod_zero_fixup,
)
from .backward_cols import (
    REG_COL_STRIP_HELD,
    REG_COL_STRIP_WORDS,
    REG_COL_WORDS,
    REG_COLS_BLOCK,
    _make_backward_cols_reg,
    _make_backward_cols_vec,
)
from .backward_rows import (
    HOLD_MAX_REGISTERS,
    HOLD_WORDS,
    _make_backward_rows_hold,
    _make_backward_rows_reg,
    _make_backward_rows_vec,
)
from .forward import (
    LONG_SHORT_KINDS,
    _make_reduce,
    _make_reduce_cols_vec,
    _make_reduce_rows_vec,
)
from .ops import (
    ELEMENTS,
    FLOAT_ELEMENTS,
    FORWARD_KINDS,
    GRAD_OPS,
    KIND_OPS,
    TIES,
    forward_key,
    forward_spec,
)
from .words import VEC_MAX_REGISTERS, VECTOR

# -- the kernel tables -------------------------------------------------------------------

_TUPLE8 = types.UniTuple(int64, 8)


def flat(dtype: types.Type) -> types.Array:
    """Flat C-contiguous 1-D view (unit stride known at compile time); launch.py passes
    every array as a contiguous (pointer, extent) pair."""
    return types.Array(dtype, 1, "C")


def _kind_name(kind: Any) -> str:
    return kind if isinstance(kind, str) else kind.name.lower()


def _grad_kernels(name: str, keys: list[tuple[Any, ElementKind]],
                 make: Callable[[Any, ElementKind], Callable[..., None]],
                 signature: Callable[[Any, ElementKind], tuple[types.Type, ...]],
                 max_registers: Callable[[Any], int | None] = lambda kind: None,
                 named_kind: bool = True,
                 halves: Callable[[Any], bool] = lambda kind: True) -> LazyTable:
    """``name``'s gradient kernels, one per (kind, element) of ``keys``, each built on its
    first lookup (``make(kind, element)`` the function, ``signature(kind, element)`` its
    types, ``max_registers(kind)`` its register cap); the F16 and BF16 keys of a kind
    share one ``half`` kernel (``_half_kernel``) where ``halves(kind)``, else each has its
    own. Named ``name[kind,element]``, or ``name[element]`` without ``named_kind``."""
    built: dict[Any, Kernel] = {}  # kind -> its half kernel

    def build(key: tuple[Any, ElementKind]) -> Kernel:
        kind, element = key
        kind_name = _kind_name(kind) + "," if named_kind else ""
        if element not in (ElementKind.F16, ElementKind.BF16) or not halves(kind):
            return Kernel(f"{name}[{kind_name}{element.name.lower()}]",
                          make(kind, element), signature(kind, element),
                          max_registers=max_registers(kind))
        if kind not in built:
            f16_signature = signature(kind, ElementKind.F16)
            built[kind] = Kernel(
                f"{name}[{kind_name}half]",
                _half_kernel(make(kind, ElementKind.F16), make(kind, ElementKind.BF16),
                             f16_signature),
                _half_signature(f16_signature), max_registers=max_registers(kind))
        return built[kind]

    return LazyTable(keys, build)


def _forward_kernels(name: str, keys: list[tuple[Any, ElementKind]],
                     make: Callable[..., Any],
                     signature: Callable[[Any, Any], tuple[types.Type, ...]],
                     max_registers: int | None = None,
                     bf16_own: tuple[Any, ...] = ()) -> LazyTable:
    """``name``'s forward kernels for every (kind, element) of ``keys``: the keys of one
    ``forward_key`` (Min and Max, Std and Var, f16 and bf16) share one kernel, named by
    it (``reduce[max,half]``) and built on the first lookup of any of them; the plans pass
    ``forward_flags(kind, element)`` as its last argument. BF16 keys of the kernel kinds
    in ``bf16_own`` take a kernel of their own (the half body once, bf16 throughout)."""
    built: dict[tuple[Any, Any], Kernel] = {}

    def build(key: tuple[Any, ElementKind]) -> Kernel:
        kind, element = forward_key(*key)
        own = key[1] is ElementKind.BF16 and kind in bf16_own
        at = (kind, ElementKind.BF16 if own else element)
        kernel = built.get(at)
        if kernel is None:
            function = make(kind, element, bf16_only=True) if own else make(kind, element)
            kernel = built[at] = Kernel(
                f"{name}[{_kind_name(kind)},{_kind_name(at[1])}]", function,
                signature(kind, element), max_registers=max_registers)
        return kernel
    return LazyTable(keys, build)


def _reduce_signature(kind: Any, element: Any) -> tuple[types.Type,...]:
    spec = forward_spec(element)
    out = int64 if KIND_OPS[kind].arg else spec.storage
    return (flat(spec.storage), flat(out), flat(spec.acc), flat(int64), flat(spec.storage),
            int64, int64, int64, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64, int64,
            int64, int64, float64, int64)


def _backward_signature(element: ElementKind) -> tuple[types.Type,...]:
    spec = ELEMENTS[element]
    arr = flat(spec.storage)
    return (arr, arr, arr, arr, flat(spec.acc), flat(int64), int64, int64, int64, int64,
            _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64, int64, float64, int64,
            int64)


#: (kind, element) -> forward kernel (kind: a ReduceKind or TIES; one kernel per
#: ``forward_key``).
REDUCE_KERNELS = _forward_kernels(
    "reduce", [(kind, element) for element, kinds in FORWARD_KINDS.items() for kind in kinds],
    _make_reduce, _reduce_signature)

#: Kernel kind that computes each gradient kind: Sum is Mean's (param 1), Min Max's, Std
#: Var's (``flags`` FLAG_STD: backward.grad_flags).
GRAD_KERNEL_KIND = {ReduceKind.SUM: ReduceKind.MEAN, ReduceKind.MIN: ReduceKind.MAX,
                    ReduceKind.STD: ReduceKind.VAR}
#: The gradient kernel kinds (GRAD_OPS less the kinds another kind's kernel computes).
GRAD_KINDS = tuple(kind for kind in GRAD_OPS if kind not in GRAD_KERNEL_KIND)

#: (kind, element) -> gradient kernel (float element kinds; f16 and bf16: one half kernel).
REDUCE_BACKWARD_KERNELS = _grad_kernels(
    "reduce_backward", [(kind, element) for element in FLOAT_ELEMENTS for kind in GRAD_KINDS],
    _make_backward, lambda kind, element: _backward_signature(element))

#: (Prod, element) -> the exact Prod gradient of the lines whose product is 0 (one kernel
#: for every layout: strided line addressing; launched after the ``dy * y / x`` pass).
REDUCE_BACKWARD_PROD_ZEROS_KERNELS = _grad_kernels(
    "reduce_backward_prod_zeros", [(ReduceKind.PROD, element) for element in FLOAT_ELEMENTS],
    lambda kind, element: _make_prod_zero_fixup(element),
    lambda kind, element: (flat(ELEMENTS[element].storage),) * 4
    + (int64, int64, int64, int64, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64),
    named_kind=False)


def _vec_reduce_signature(kind: Any, element: Any) -> tuple[types.Type,...]:
    spec = forward_spec(element)
    out = int64 if KIND_OPS[kind].arg else spec.storage
    return (flat(spec.storage), flat(uint64), flat(out), flat(spec.acc), flat(int64),
            flat(spec.storage), int64, int64, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64,
            int64, int64, float64, int64, int64)


def _vec_cols_signature(kind: Any, element: Any) -> tuple[types.Type,...]:
    spec = forward_spec(element)
    out = int64 if KIND_OPS[kind].arg else spec.storage
    return (flat(uint64), flat(out), flat(spec.acc), flat(int64), flat(spec.storage), int64,
            int64, int64, int64, int64, int64, int64, int64, int64, float64, int64)


def _vec_backward_rows_signature(element: ElementKind) -> tuple[types.Type,...]:
    spec = ELEMENTS[element]
    arr = flat(spec.storage)
    words = flat(uint64)
    return (arr, arr, words, arr, arr, words, flat(spec.acc), flat(int64), int64, int64,
            _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64, float64, int64, int64,
            int64)


def _vec_backward_cols_signature(element: ElementKind) -> tuple[types.Type,...]:
    spec = ELEMENTS[element]
    arr = flat(spec.storage)
    words = flat(uint64)
    return (arr, words, arr, arr, words, flat(spec.acc), flat(int64), int64, int64, int64,
            int64, int64, int64, int64, float64, int64, int64)


#: Forward kernel kinds of the word kernels: every one but TIES (the Max/Min gradient's
#: tie count, which these layouts take after dx; elsewhere the generic kernel).
VEC_FORWARD_KINDS = {element: tuple(k for k in FORWARD_KINDS[element] if k is not TIES)
                     for element in VECTOR}

#: (kind, element) -> contiguous-row forward kernel with word loads (the float kinds of
#: the VECTOR elements). Sum's bf16 keys take a kernel of their own: the half kernel's
#: runtime conversion spills under the register cap and cost the bf16 pool rows over 10 %
#: (docs/design/reduce.md).
_VEC_FORWARD_KEYS = [(kind, element) for element in VECTOR for kind in VEC_FORWARD_KINDS[element]]
REDUCE_ROWS_VEC_KERNELS = _forward_kernels("reduce_rows_vec", _VEC_FORWARD_KEYS,
                                           _make_reduce_rows_vec, _vec_reduce_signature,
                                           VEC_MAX_REGISTERS,
                                           bf16_own=(ReduceKind.SUM,))

#: (kind, element) -> the same kernel whose short-row path parks each thread's next row
#: (``park``; LONG_SHORT_KINDS, which the plans give it for rows of at least
#: PARK_MIN_LANES lanes). A kernel of its own: with both short-row paths in one kernel,
#: ptxas spilled more and 4-lane rows were slower (docs/design/reduce.md).
REDUCE_ROWS_PARK_KERNELS = _forward_kernels(
    "reduce_rows_park", [(kind, element) for element in VECTOR for kind in LONG_SHORT_KINDS],
    lambda kind, element: _make_reduce_rows_vec(kind, element, park=True),
    _vec_reduce_signature, VEC_MAX_REGISTERS)

#: (kind, element) -> column-layout forward kernel with word loads.
REDUCE_COLS_VEC_KERNELS = _forward_kernels("reduce_cols_vec", _VEC_FORWARD_KEYS,
                                           _make_reduce_cols_vec, _vec_cols_signature,
                                           VEC_MAX_REGISTERS)

#: Register caps of the contiguous-row gradient kernels, per kind (the others uncapped).
#: Prod / Norm2 / LogSumExp use 77-80 registers uncapped (3 resident 256-thread blocks per
#: SM) and 63-64 without spilling at 64 (4 blocks).
#: (Measurements: docs/design/reduce.md, "Measured constants".)
GRAD_ROWS_MAX_REGISTERS = {ReduceKind.PROD: 64, ReduceKind.NORM2: 64,
                           ReduceKind.LOG_SUM_EXP: 64, ReduceKind.MAX: 128}

#: (kind, element) -> contiguous-row gradient kernel with word loads and stores.
_VEC_GRAD_KEYS = [(kind, element) for element in VECTOR for kind in GRAD_KINDS]
#: Max/Min and Norm2 keep an f16 and a bf16 kernel: one half kernel spilled 96 / 20 bytes
#: at the cap (the two: none).
REDUCE_BACKWARD_ROWS_VEC_KERNELS = _grad_kernels(
    "reduce_backward_rows_vec", _VEC_GRAD_KEYS, _make_backward_rows_vec,
    lambda kind, element: _vec_backward_rows_signature(element), GRAD_ROWS_MAX_REGISTERS.get,
    halves=lambda kind: kind not in (ReduceKind.MAX, ReduceKind.NORM2))

#: (kind, element) -> column-layout gradient kernel with word loads and stores (Max/Min:
#: modes 0 and 2).
#: Max/Min keep an f16 and a bf16 kernel: as one half kernel (both bodies) ptxas gave it 98
#: registers against 70 (2 resident 256-thread blocks per SM instead of 3).
REDUCE_BACKWARD_COLS_VEC_KERNELS = _grad_kernels(
    "reduce_backward_cols_vec", _VEC_GRAD_KEYS, _make_backward_cols_vec,
    lambda kind, element: _vec_backward_cols_signature(element),
    halves=lambda kind: kind is not ReduceKind.MAX)

#: (kind, element) -> the gradient without a statistic of a contiguous dx in dx's memory
#: order (rows and columns; Sum / Mean: a broadcast of dy). Mean's is held at 32 registers
#: (ptxas alone: f16 / bf16 34 uncapped, 32 capped without spilling; f32 30): 2048
#: resident threads per SM.
BROADCAST_MAX_REGISTERS = {ReduceKind.MEAN: 32}
REDUCE_BACKWARD_BROADCAST_KERNELS = _grad_kernels(
    "reduce_backward_broadcast",
    [(kind, element) for element in VECTOR for kind in GRAD_KINDS if GRAD_OPS[kind].stat is None],
    _make_backward_broadcast,
    lambda kind, element: (flat(ELEMENTS[element].storage), flat(ELEMENTS[element].storage),
                           flat(uint32), flat(uint32), int64, int64, float64, int64, int64,
                           int64, float64, int64),
    BROADCAST_MAX_REGISTERS.get)

#: (kind, element) -> the rewrite pass (mode 3) of the column tie count after dx, Max/Min.
#: Held at 128 registers (f16/bf16 take 154 uncapped in ``ptxas``, with its 8 masks in
#: flight.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
REDUCE_BACKWARD_COLS_REWRITE_KERNELS = _grad_kernels(
    "reduce_backward_cols_rewrite",
    [(kind, element) for element in VECTOR for kind in GRAD_KINDS
     if GRAD_OPS[kind].stat == "ties"],
    lambda kind, element: _make_backward_cols_vec(kind, element, rewrite_pass=True),
    lambda kind, element: _vec_backward_cols_signature(element), lambda kind: 128,
    halves=lambda kind: False)  # one half kernel spilled 120 bytes at the cap


def _reg_backward_signature(element: ElementKind) -> tuple[types.Type,...]:
    spec = ELEMENTS[element]
    arr = flat(spec.storage)
    words = flat(uint64)
    return (arr, words, arr, arr, words, int64, int64, int64, int64, int64, int32, float64,
            int64)


#: Gradient kinds with a per-row statistic (Max/Min: tie count, Var/Std: mean).
STAT_GRAD_KINDS = tuple(kind for kind in GRAD_KINDS if GRAD_OPS[kind].stat is not None)
#: Gradients without a statistic that read x (``dx = element(coefficient(dy, y), x)``).
STREAM_GRAD_KINDS = tuple(kind for kind in GRAD_KINDS
                          if GRAD_OPS[kind].stat is None and GRAD_OPS[kind].reads_x)

#: (kind, element) -> register-resident gradient of word-aligned rows that fit in the
#: registers of one block (x read once).
REDUCE_BACKWARD_ROWS_REG_KERNELS = _grad_kernels(
    "reduce_backward_rows_reg",
    [(kind, element) for element in VECTOR for kind in STAT_GRAD_KINDS + STREAM_GRAD_KINDS],
    _make_backward_rows_reg, lambda kind, element: _reg_backward_signature(element))
def _hold_signature(element: ElementKind) -> tuple[types.Type,...]:
    spec = ELEMENTS[element]
    arr = flat(spec.storage)
    words = flat(uint64)
    return (arr, words, arr, arr, words, flat(int64), flat(int64), int64, int64, int64,
            int64, int64, int64, float64, int64)


#: (kind, element) -> the Var/Std and Max/Min gradients (Min is Max's kernel) of long
#: word-aligned rows with x read once: each chunk (two of the plan's ``_sync_layout``
#: parts) held in registers and, its second half, in shared memory (HOLD_STASH_BYTES a
#: block) until its row's total is published.
REDUCE_BACKWARD_ROWS_HOLD_STASH_KERNELS = _grad_kernels(
    "reduce_backward_rows_hold_stash",
    [(kind, element) for element in VECTOR for kind in (ReduceKind.VAR, ReduceKind.MAX)],
    lambda kind, element: _make_backward_rows_hold(kind, element, HOLD_WORDS),
    lambda kind, element: _hold_signature(element), lambda kind: HOLD_MAX_REGISTERS,
    halves=lambda kind: False)  # one half kernel spilled 24-32 bytes at the cap (the two 0-8)


def _cols_reg_kernels(name: str, max_registers: int, stash: int = 0, wide_words: int = 0,
                      held: int = REG_COL_WORDS, halves: bool = True) -> LazyTable:
    """The column register-resident gradients of one table: ``wide_words`` > 0 for strips
    of up to that many words whose pairs may exceed 32 (each thread then adds its own
    pairs' warp partials), ``held`` rows a thread in registers; ``halves``: one half kernel
    for f16 and bf16."""
    return _grad_kernels(name, [(kind, element) for element in VECTOR for kind in STAT_GRAD_KINDS],
                    lambda kind, element: _make_backward_cols_reg(kind, element, stash,
                                                                  wide_words, held),
                    lambda kind, element: _reg_backward_signature(element),
                    lambda kind: max_registers, halves=lambda kind: halves)


#: (kind, element) -> the column register-resident gradient in 256-byte strips
#: (REG_COL_STRIP_WORDS column words) of columns of at most REG_COL_STRIP_HELD *
#: REG_COLS_STRIP_BLOCK / REG_COL_STRIP_WORDS rows, REG_COL_STRIP_HELD rows a thread:
#: 128 registers (two 256-thread blocks an SM). A copy with this memory work reaches 92-93
#: % of copy at [256, 2^20] against 83-84 % in 128-byte strips.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
REDUCE_BACKWARD_COLS_STRIP_KERNELS = _cols_reg_kernels(
    "reduce_backward_cols_strip", 128, wide_words=REG_COL_STRIP_WORDS,
    held=REG_COL_STRIP_HELD)

#: Words per thread the stash kernels below park in dynamic shared memory (on top of
#: REG_COL_WORDS in registers), and the bytes of it a launch takes (REG_COLS_BLOCK
#: threads: 128 KiB on the GPU).
REG_COL_STASH = REG_COL_WORDS
REG_COLS_STASH_BYTES = REG_COL_STASH * REG_COLS_BLOCK * 8
#: (kind, element) -> the column register-resident gradient with a shared-memory stash:
#: strips of twice the width in REG_COLS_BLOCK-thread blocks.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
#: f16 and bf16 keep a kernel each: one half kernel spilled 84-112 bytes at the cap (the
#: two: 0-40).
REDUCE_BACKWARD_COLS_STASH_KERNELS = _cols_reg_kernels("reduce_backward_cols_stash", 64,
                                                       REG_COL_STASH, halves=False)
