"""Single-axis reductions, their gradients and arg-reductions.

Every forward reduction folds the ``extent`` elements of one output position ("row") into
a state of four registers ``(a, b, c, k)`` (three of the accumulator type, one int64) and
finalises it:

==========  ===========================================  ============================
kind        state and step ``s <- step(s, v)``           final
==========  ===========================================  ============================
Sum/Mean    ``a += v``                                   ``a`` / ``a / extent``
Prod        ``a *= v``                                   ``a``
Max/Min     ``a = nan_max(a, v)`` (NaN propagates)       ``a``
Norm2       ``a += v*v`` (f32 for halves: no overflow)   ``sqrt(a)``
LogSumExp   online ``(m, s)``: ``s = s e^(m-v') +...``  ``m + log s`` (-inf/+inf safe)
Var/Std     Welford ``(mean, m2, n)``, Chan merge        ``m2 / max(n - corr, 0)``
Argmax/min  ``(best value, first index)``, NaN = best    index (int64)
ties        ``k += (v == y)`` (Max/Min gradient)         count
==========  ===========================================  ============================

Accumulators: f32 for f16/bf16/f32, f64 for f64, int64 for i32/i64 (i32 results wrap).

Work layout (one generic kernel body; the kind's ``step``/``merge``/``final`` come from a
per-kind table and are compiled in, not branched on)::

    block = 256 threads = P output slots x L lanes (L a power of two)
      row layout    (reduce axis has stride 1): lane = tid % L  -> lanes read consecutive
                     elements of one row; L <= 32 reduces with warp shuffles only
      column layout (reduce axis strided):      slot = tid % P  -> consecutive threads own
                     consecutive outputs and walk the axis together (coalesced)
    grid.x -> groups of P outputs (grid-stride), grid.y -> S splits of the axis

Each thread keeps CHUNK = 8 loads in flight per iteration, then folds them (``chunk``;
Welford folds the chunk exactly and merges it with one division). Lanes combine by warp
shuffles (xor tree), then a shared-memory tree across warps/lanes. With S > 1 each split
writes its partial state to the workspace and a second launch of the same kernel (``mode``
2/3) merges the S states per output in split order: deterministic, no atomics.

Modes: 0 reduce into ``y``; 1 write partial states to the workspace; 2 merge partial
states into ``y``; 3 merge partial states into workspace slot 0 (gradient statistics).

The gradient kernel uses the same layout (no cross-lane step): every output position
loads ``dy`` (and ``y``/a statistic) once, then writes its ``extent`` elements of ``dx``.
The Max/Min (tie count) and Var/Std (mean) gradients of lines that fit in one block's
registers read ``x`` once: the register-resident kernels load the line as 8-byte words
into registers, reduce the statistic across the lanes (fixed order), then write ``dx``
from the registers (rows: ``reduce_backward_rows_reg``; strips of columns:
``reduce_backward_cols_reg``, 1024-thread blocks)::

    rows    lane l of a row holds words l, l + L,..., (<= 8 per lane, L <= 256 lanes)
    columns thread t holds column word t % C of rows t // C + u * (1024 / C), u < 16

The gradients without a statistic (Sum / Mean, Prod, Norm2, LogSumExp) of a contiguous,
16-byte aligned dx take ``reduce_backward_broadcast`` where the plans choose it: threads
numbered along dx's 16-byte units as an elementwise kernel's, each unit's line found by
one division (rows) or kept per thread by a grid stride of whole rows (columns).

Longer Max/Min lines take the tie count after dx (split word rows, column word kernel,
with a workspace): pass 1 writes dx as if every count were 1 (away from the ties dx is
``c - c`` for every count), each split counts its ties and records them in 64-bit masks
(a bit per element); the TIES merge sums the counts; pass 2 (the same kernel) rewrites
only the lines whose count is not 1: the tied words from the masks without reading x
(``_tied_word_rewriter``), or the whole line for a NaN extreme (no tie).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32, int64, types, uint16, uint32, uint64
from numba.cuda import libdevice

from .._runtime import SIMULATOR
from ..launch import Kernel
from ..types import ElementKind, ReduceKind
from .common import (
    MAX_RANK,
    bitcast,
    compiled_for_sm90,
    copy_async8,
    copy_async8_run,
    copy_async_wait,
    div_f64,
    div_mod,
    eq_mask_bf16x4,
    eq_mask_f16x4,
    f32_from_bits,
    load16_words,
    load_bf16,
    load_f16,
    load_relaxed,
    load_same,
    max_nan_f32,
    min_nan_f32,
    nan_max,
    nan_min,
    opaque,
    pack_bf16x4,
    pack_f16x4,
    pack_f32x2,
    rcp_approx_ftz_f32,
    shfl_idx,
    shfl_xor,
    store16_words,
    store_bf16,
    to_f16,
    to_f32,
    to_f64,
    unpack_f16x4,
    unpack_f32x2,
    wait_ns,
)

#: Shared-array capacity: the largest block the kernels are launched with.
SHARED_SLOTS = 256
#: Internal kind: number of positions equal to the saved max/min (Max/Min gradient).
TIES = "ties"
#: Loads each thread keeps in flight per loop iteration (independent, then folded).
CHUNK = 8

_INF = math.inf
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1

# -- element loads/stores ---------------------------------------------------------------


# Indices are non-negative: an unsigned index spares Numba's negative-index wraparound
# (3 instructions per access), and the C-layout flat arrays make the address base + 4 i.


@cuda.jit(device=True, inline=True)
def _load_i64(x, i):
    return int64(x[uint64(i)])


@cuda.jit(device=True, inline=True)
def _store_i32(v):
    # two's-complement wrap of the int64 accumulator (torch's int32 overflow behaviour)
    w = int64(v) & 0xFFFFFFFF
    if w >= 0x80000000:
        w -= 0x100000000
    return int32(w)


@cuda.jit(device=True, inline=True)
def _store_i64(v):
    return int64(v)


@dataclass(frozen=True)
class ElementSpec:
    """How one element kind is stored, loaded and accumulated."""

    storage: types.Type
    acc: types.Type
    load: Any
    store: Any
    lowest: float | int  # -inf, or the int64 minimum
    highest: float | int


#: The element table: every kernel, signature and supported-dtype message derives from it.
ELEMENTS: dict[ElementKind, ElementSpec] = {
    ElementKind.F16: ElementSpec(types.float16, float32, load_f16, to_f16, -_INF, _INF),
    ElementKind.BF16: ElementSpec(uint16, float32, load_bf16, store_bf16, -_INF, _INF),
    ElementKind.F32: ElementSpec(float32, float32, load_same, to_f32, -_INF, _INF),
    ElementKind.F64: ElementSpec(float64, float64, load_same, to_f64, -_INF, _INF),
    ElementKind.I32: ElementSpec(int32, int64, _load_i64, _store_i32, _INT64_MIN, _INT64_MAX),
    ElementKind.I64: ElementSpec(int64, int64, _load_i64, _store_i64, _INT64_MIN, _INT64_MAX),
}
FLOAT_ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32, ElementKind.F64)
INT_ELEMENTS = (ElementKind.I32, ElementKind.I64)

# -- per-kind state functions ------------------------------------------------------------
# step(a, b, c, k, v, index, aux) and merge(a1, b1, c1, k1, a2, b2, c2, k2) return the new
# (a, b, c, k); final(a, b, c, k, param) returns the accumulator-typed result.


@cuda.jit(device=True, inline=True)
def _sum_step(a, b, c, k, v, i, aux):
    return a + v, b, c, k


@cuda.jit(device=True, inline=True)
def _sum_merge(a, b, c, k, a2, b2, c2, k2):
    return a + a2, b, c, k


@cuda.jit(device=True, inline=True)
def _final_a(a, b, c, k, param):
    return a


@cuda.jit(device=True, inline=True)
def _final_mean(a, b, c, k, param):
    # param = extent as a float; 0/0 = NaN is the empty-axis mean (torch)
    return a / param


@cuda.jit(device=True, inline=True)
def _prod_step(a, b, c, k, v, i, aux):
    return a * v, b, c, k


@cuda.jit(device=True, inline=True)
def _prod_merge(a, b, c, k, a2, b2, c2, k2):
    return a * a2, b, c, k


@cuda.jit(device=True, inline=True)
def _norm2_step(a, b, c, k, v, i, aux):
    return a + v * v, b, c, k


@cuda.jit(device=True, inline=True)
def _final_sqrt(a, b, c, k, param):
    return math.sqrt(a)


def _lse_functions(ACC: types.Type) -> tuple[Any, Any]:
    """Online log-sum-exp on (a = running max m, b = sum of exp(x - m)). NaN poisons both;
    -inf elements add nothing; +inf meets the ``v == m`` branch (exp(0) = 1), so no
    inf - inf ever reaches exp."""
    ONE = 1.0

    @cuda.jit(device=True, inline=True)
    def lse_step(a, b, c, k, v, i, aux):
        if v != v:
            return v, v, c, k
        if a != a or v == -_INF:
            return a, b, c, k
        if v == a:
            return a, b + ACC(ONE), c, k
        if v < a:
            return a, b + ACC(math.exp(v - a)), c, k
        return v, b * ACC(math.exp(a - v)) + ACC(ONE), c, k

    @cuda.jit(device=True, inline=True)
    def lse_merge(a, b, c, k, a2, b2, c2, k2):
        if a != a:
            return a, b, c, k
        if a2 != a2:
            return a2, b2, c, k
        if a2 == -_INF:
            return a, b, c, k
        if a == -_INF:
            return a2, b2, c, k
        if a == a2:
            return a, b + b2, c, k
        if a > a2:
            return a, b + b2 * ACC(math.exp(a2 - a)), c, k
        return a2, b2 + b * ACC(math.exp(a - a2)), c, k

    return lse_step, lse_merge


@cuda.jit(device=True, inline=True)
def _final_lse(a, b, c, k, param):
    if a != a:
        return a
    if a == -_INF or a == _INF:
        return a
    return a + math.log(b)


def _welford_functions(ACC: types.Type) -> tuple[Any, Any, Any]:
    """Welford on (a = mean, b = m2, k = count) with Chan et al.'s merge; ``chunk`` folds a
    CHUNK-element chunk exactly (its own mean and m2) and merges once: one division per
    chunk instead of one per element."""
    INV_CHUNK = 1.0 / CHUNK

    @cuda.jit(device=True, inline=True)
    def welford_merge(a, b, c, k, a2, b2, c2, k2):
        if k2 == 0:
            return a, b, c, k
        if k == 0:
            return a2, b2, c2, k2
        n = k + k2
        delta = a2 - a
        frac = ACC(k2) / ACC(n)
        return a + delta * frac, b + b2 + delta * delta * ACC(k) * frac, c, n

    @cuda.jit(device=True, inline=True)
    def welford_step(a, b, c, k, v, i, aux):
        n = k + 1
        delta = v - a
        mean = a + delta / ACC(n)
        return mean, b + delta * (v - mean), c, n

    @cuda.jit(device=True, inline=True)
    def welford_chunk(a, b, c, k, values, i, span, aux):
        total = ACC(0)
        for u in range(CHUNK):
            total += values[u]
        chunk_mean = total * ACC(INV_CHUNK)
        chunk_m2 = ACC(0)
        for u in range(CHUNK):
            d = values[u] - chunk_mean
            chunk_m2 += d * d
        return welford_merge(a, b, c, k, chunk_mean, chunk_m2, c, int64(CHUNK))

    return welford_step, welford_chunk, welford_merge


@cuda.jit(device=True, inline=True)
def _final_var(a, b, c, k, param):
    # param = correction; torch: m2 / max(n - correction, 0), so n <= correction gives inf
    # (or NaN when m2 == 0), never 0
    divisor = float64(k) - param
    if divisor < 0.0:
        divisor = 0.0
    return float64(b) / divisor


@cuda.jit(device=True, inline=True)
def _final_std(a, b, c, k, param):
    return math.sqrt(_final_var(a, b, c, k, param))


@cuda.jit(device=True, inline=True)
def _ties_step(a, b, c, k, v, i, aux):
    if v == aux:
        return a, b, c, k + 1
    return a, b, c, k


@cuda.jit(device=True, inline=True)
def _ties_merge(a, b, c, k, a2, b2, c2, k2):
    return a, b, c, k + k2


@cuda.jit(device=True, inline=True)
def _final_k(a, b, c, k, param):
    return k


@cuda.jit(device=True, inline=True)
def _argmax_step(a, b, c, k, v, i, aux):
    # elements of one lane arrive in increasing index order: strict > keeps the first
    if k < 0 or (a == a and (v != v or v > a)):
        return v, b, c, i
    return a, b, c, k


@cuda.jit(device=True, inline=True)
def _argmin_step(a, b, c, k, v, i, aux):
    if k < 0 or (a == a and (v != v or v < a)):
        return v, b, c, i
    return a, b, c, k


@cuda.jit(device=True, inline=True)
def _arg_pick(a, k, a2, k2, first_better):
    """Merge two (value, index) candidates: NaN wins, then the better value, then the
    smaller index (first occurrence)."""
    if k2 < 0:
        return a, k
    if k < 0:
        return a2, k2
    nan1 = a != a
    nan2 = a2 != a2
    if nan1 and nan2:
        return (a, k) if k < k2 else (a2, k2)
    if nan1:
        return a, k
    if nan2:
        return a2, k2
    if first_better:
        return a, k
    if a == a2:
        return (a, k) if k < k2 else (a2, k2)
    return a2, k2


@cuda.jit(device=True, inline=True)
def _argmax_merge(a, b, c, k, a2, b2, c2, k2):
    best, index = _arg_pick(a, k, a2, k2, a > a2)
    return best, b, c, index


@cuda.jit(device=True, inline=True)
def _argmin_merge(a, b, c, k, a2, b2, c2, k2):
    best, index = _arg_pick(a, k, a2, k2, a < a2)
    return best, b, c, index


def _sequential_chunk(step: Any) -> Any:
    """``chunk`` for kinds without a chunked form: the CHUNK steps in index order."""

    @cuda.jit(device=True, inline=True)
    def chunk(a, b, c, k, values, i, span, aux):
        for u in range(CHUNK):
            a, b, c, k = step(a, b, c, k, values[u], i + u * span, aux)
        return a, b, c, k

    return chunk


def _plain(step: Any, merge: Any) -> Callable[[types.Type], tuple[Any, Any, Any]]:
    """Functions of a kind whose arithmetic needs no typed constants."""
    functions = (step, _sequential_chunk(step), merge)
    return lambda acc: functions


def _extremum_functions(op: Any) -> Callable[[types.Type], tuple[Any, Any, Any]]:
    """Functions of Max or Min from the NaN-propagating binary ``op``."""

    @cuda.jit(device=True, inline=True)
    def step(a, b, c, k, v, i, aux):
        return op(a, v), b, c, k

    @cuda.jit(device=True, inline=True)
    def merge(a, b, c, k, a2, b2, c2, k2):
        return op(a, a2), b, c, k

    return _plain(step, merge)


def _extremum(op: Any, op_f32: Any) -> Callable[[types.Type], tuple[Any, Any, Any]]:
    """Max/Min: the f32 accumulator (f16, bf16 and f32 inputs) folds with one
    ``max.NaN``/``min.NaN`` instruction per value (``op_f32``); other types with ``op``
    (nan_max/nan_min). Same values (NaN wins; the result is one of the inputs), so the
    fold order does not matter beyond the sign of a zero and a NaN's payload."""
    generic = _extremum_functions(op)
    fast = _extremum_functions(op_f32)
    return lambda acc: fast(acc) if acc == types.float32 else generic(acc)


_PER_ACC: dict[tuple[Any, types.Type], tuple[Any, Any, Any]] = {}


def _lse_for(acc: types.Type) -> tuple[Any, Any, Any]:
    found = _PER_ACC.get(("lse", acc))
    if found is None:
        step, merge = _lse_functions(acc)
        found = _PER_ACC[("lse", acc)] = (step, _sequential_chunk(step), merge)
    return found


def _welford_for(acc: types.Type) -> tuple[Any, Any, Any]:
    found = _PER_ACC.get(("welford", acc))
    if found is None:
        found = _PER_ACC[("welford", acc)] = _welford_functions(acc)
    return found


@dataclass(frozen=True)
class KindOps:
    """A reduction kind: ``functions(acc) -> (step, chunk, merge)``, its ``final``, the
    initial state and which registers it uses.

    ``init_a`` maps the ElementSpec to the initial ``a`` (Max starts at the lowest value
    of the accumulator type); ``n_acc`` accumulator registers and ``uses_k`` decide what
    a partial state occupies in the workspace; ``uses_aux`` reads ``y`` per output (ties);
    ``arg`` writes the int64 index ``k``.
    """

    functions: Callable[[types.Type], tuple[Any, Any, Any]]
    final: Any
    init_a: Callable[[ElementSpec], float | int] = lambda spec: 0
    init_k: int = 0
    n_acc: int = 1
    uses_k: bool = False
    uses_aux: bool = False
    arg: bool = False


_SUM_FUNCTIONS = _plain(_sum_step, _sum_merge)

#: The kind table (ReduceKind members plus the internal TIES).
KIND_OPS: dict[Any, KindOps] = {
    # float Sum and Mean share one kernel: final = a / param, param = 1 (exact) or extent
    ReduceKind.SUM: KindOps(_SUM_FUNCTIONS, _final_mean),
    ReduceKind.PROD: KindOps(_plain(_prod_step, _prod_merge), _final_a,
                             init_a=lambda spec: 1),
    ReduceKind.MAX: KindOps(_extremum(nan_max, max_nan_f32),
                            _final_a, init_a=lambda spec: spec.lowest),
    ReduceKind.MIN: KindOps(_extremum(nan_min, min_nan_f32),
                            _final_a, init_a=lambda spec: spec.highest),
    ReduceKind.NORM2: KindOps(_plain(_norm2_step, _sum_merge), _final_sqrt),
    ReduceKind.LOG_SUM_EXP: KindOps(_lse_for, _final_lse, init_a=lambda spec: -_INF,
                                    n_acc=2),
    ReduceKind.VAR: KindOps(_welford_for, _final_var, n_acc=2, uses_k=True),
    ReduceKind.STD: KindOps(_welford_for, _final_std, n_acc=2, uses_k=True),
    ReduceKind.ARGMAX: KindOps(_plain(_argmax_step, _argmax_merge), _final_k,
                               init_a=lambda spec: spec.lowest, init_k=-1, uses_k=True,
                               arg=True),
    ReduceKind.ARGMIN: KindOps(_plain(_argmin_step, _argmin_merge), _final_k,
                               init_a=lambda spec: spec.highest, init_k=-1, uses_k=True,
                               arg=True),
    TIES: KindOps(_plain(_ties_step, _ties_merge), _final_k, n_acc=0, uses_k=True,
                  uses_aux=True),
}

#: Kernel kind that computes each forward kind (float Mean is the Sum kernel).
FORWARD_KERNEL_KIND = {ReduceKind.MEAN: ReduceKind.SUM}

#: Kernel kinds per element kind (integers: the exact ones).
FORWARD_KINDS: dict[ElementKind, tuple[Any,...]] = {
    **{e: (ReduceKind.SUM, ReduceKind.MAX, ReduceKind.MIN, ReduceKind.PROD,
           ReduceKind.NORM2, ReduceKind.LOG_SUM_EXP, ReduceKind.VAR, ReduceKind.STD,
           ReduceKind.ARGMAX, ReduceKind.ARGMIN, TIES) for e in FLOAT_ELEMENTS},
    **{e: (ReduceKind.SUM, ReduceKind.MAX, ReduceKind.MIN, ReduceKind.PROD,
           ReduceKind.ARGMAX, ReduceKind.ARGMIN) for e in INT_ELEMENTS},
}

# -- index helpers ---------------------------------------------------------------------


@cuda.jit(device=True, inline=True)
def _offsets4(linear, shape, s0, s1, s2, s3):
    """Offsets of output position ``linear`` (row-major over ``shape``) in four operands
    (one unravel, 32-bit divisions whenever the values fit)."""
    o0 = int64(0)
    o1 = int64(0)
    o2 = int64(0)
    o3 = int64(0)
    rest = int64(linear)
    for axis in range(MAX_RANK - 1, -1, -1):
        extent = shape[axis]
        if extent != 1:
            rest, coord = div_mod(rest, extent)
            o0 += coord * s0[axis]
            o1 += coord * s1[axis]
            o2 += coord * s2[axis]
            o3 += coord * s3[axis]
    return o0, o1, o2, o3


# -- the forward kernel ------------------------------------------------------------------


_LANE_REDUCERS: dict[tuple[Any, ElementKind], Any] = {}
_LANE_COMBINERS: dict[tuple[Any, ElementKind], Any] = {}


def _lane_combiner(kind: Any, element: ElementKind) -> Any:
    """Device function: merge the states of the ``lanes`` lanes of each slot (result in
    lane 0): xor shuffles within a warp (row layout), then a shared-memory tree across
    warps (row layout) or across lanes strided by ``slots`` (column layout). Every thread
    of the block calls it."""
    found = _LANE_COMBINERS.get((kind, element))
    if found is not None:
        return found
    ops = KIND_OPS[kind]
    merge = ops.functions(ELEMENTS[element].acc)[2]
    N_ACC, USES_K, ARG = ops.n_acc, ops.uses_k, ops.arg

    @cuda.jit(device=True, inline=True)
    def combine(a, b, c, k, tid, lane, lanes, slots, row_layout, sa, sb, sk):
        if row_layout:
            width = min(lanes, 32) // 2
            while width >= 1:
                a2 = shfl_xor(a, width) if N_ACC >= 1 or ARG else a
                b2 = shfl_xor(b, width) if N_ACC >= 2 else b
                k2 = shfl_xor(k, width) if USES_K else k
                a, b, c, k = merge(a, b, c, k, a2, b2, c, k2)
                width //= 2
            groups = lanes // 32 if lanes > 32 else 1
            group_stride = 32
            group_index = lane // 32
            leader = lane % 32 == 0
        else:
            groups = lanes
            group_stride = slots
            group_index = lane
            leader = True
        if groups > 1:
            sa[tid] = a
            sb[tid] = b
            sk[tid] = k
            cuda.syncthreads()
            half = groups // 2
            while half >= 1:
                if leader and group_index < half:
                    other = tid + half * group_stride
                    a, b, c, k = merge(a, b, c, k, sa[other], sb[other], c, sk[other])
                    sa[tid] = a
                    sb[tid] = b
                    sk[tid] = k
                cuda.syncthreads()
                half //= 2
            cuda.syncthreads()  # the shared slots are free again when this returns
        return a, b, c, k

    _LANE_COMBINERS[(kind, element)] = combine
    return combine


def _lane_reducer(kind: Any, element: ElementKind) -> Any:
    """Device function: the state of output ``o`` over elements ``[begin, end)`` of its
    row, folded by the block's ``lanes`` lanes of one slot (complete in lane 0). Every
    thread of the block must call it (shuffles and barriers); ``valid`` threads load."""
    found = _LANE_REDUCERS.get((kind, element))
    if found is not None:
        return found
    ops = KIND_OPS[kind]
    spec = ELEMENTS[element]
    ACC = spec.acc
    load = spec.load
    step, fold_chunk, merge = ops.functions(ACC)
    INIT_A, INIT_K = ops.init_a(spec), ops.init_k
    combine = _lane_combiner(kind, element)

    @cuda.jit(device=True, inline=True)
    def lane_reduce(x, x_off, x_axis_stride, aux_value, valid, begin, end, tid, lane, lanes,
                    slots, row_layout, sa, sb, sk):
        a = ACC(INIT_A)
        b = ACC(0)
        c = ACC(0)
        k = int64(INIT_K)
        span = int64(lanes)
        x_span = span * x_axis_stride
        if valid:
            i = begin + lane
            x_at = x_off + i * x_axis_stride
            values = cuda.local.array(CHUNK, ACC)
            while i + (CHUNK - 1) * span < end:  # CHUNK independent loads in flight
                for u in range(CHUNK):
                    values[u] = load(x, x_at + u * x_span)
                a, b, c, k = fold_chunk(a, b, c, k, values, i, span, aux_value)
                i += CHUNK * span
                x_at += CHUNK * x_span
            while i < end:
                a, b, c, k = step(a, b, c, k, load(x, x_at), i, aux_value)
                i += span
                x_at += x_span
        return combine(a, b, c, k, tid, lane, lanes, slots, row_layout, sa, sb, sk)

    _LANE_REDUCERS[(kind, element)] = lane_reduce
    return lane_reduce


def _state_writer(kind: Any, element: ElementKind, final: Any) -> Any:
    """Device function that writes output ``o``'s combined state ``(a, b, c, k)``: to
    ``y[y_off]`` as ``store(final(a, b, c, k, param))``, or with ``to_workspace`` as
    split ``split``'s partial state (workspace layout: ``ws_acc`` [n_acc][splits][out_numel]
    accumulators, ``ws_k`` [splits][out_numel] int64 states). Shared by every forward
    kernel, so the workspace layout is written in one place."""
    ops = KIND_OPS[kind]
    store = _store_i64 if ops.arg else ELEMENTS[element].store
    N_ACC, USES_K = ops.n_acc, ops.uses_k

    @cuda.jit(device=True, inline=True)
    def write_state(y, y_off, ws_acc, ws_k, to_workspace, a, b, c, k, param, o, out_numel,
                    split, splits):
        if not to_workspace:
            y[uint64(y_off)] = store(final(a, b, c, k, param))
        else:
            if N_ACC >= 1:
                ws_acc[uint64(split * out_numel + o)] = a
            if N_ACC >= 2:
                ws_acc[uint64((splits + split) * out_numel + o)] = b
            if USES_K:
                ws_k[uint64(split * out_numel + o)] = k

    return write_state


def _make_reduce(kind: Any, element: ElementKind) -> Callable[..., None]:
    ops = KIND_OPS[kind]
    spec = ELEMENTS[element]
    ACC = spec.acc
    load = spec.load
    merge = ops.functions(ACC)[2]
    lane_reduce = _lane_reducer(kind, element)
    combine = _lane_combiner(kind, element)
    # integer sums must not go through a float division
    final = _final_a if element in INT_ELEMENTS and kind is ReduceKind.SUM else ops.final
    write_state = _state_writer(kind, element, final)
    INIT_A, INIT_K = ops.init_a(spec), ops.init_k
    N_ACC, USES_K, USES_AUX = ops.n_acc, ops.uses_k, ops.uses_aux

    def reduce_rows(x, y, ws_acc, ws_k, aux, out_numel, extent, x_axis_stride, out_shape,
                    x_strides, y_strides, aux_strides, lanes, row_layout, splits, chunk_len,
                    mode, param):
        """See the module docstring. ``ws_acc``: [n_acc][splits][out_numel] accumulator
        states, ``ws_k``: [splits][out_numel] int64 states."""
        tid = cuda.threadIdx.x
        block = cuda.blockDim.x
        sa = cuda.shared.array(SHARED_SLOTS, ACC)
        sb = cuda.shared.array(SHARED_SLOTS, ACC)
        sk = cuda.shared.array(SHARED_SLOTS, int64)
        slots = block // lanes
        if mode >= 2:
            # merge the split states: consecutive threads own consecutive outputs, the
            # ``lanes`` lanes of an output take every lanes-th split, then combine
            lane = tid // slots
            slot = tid % slots
            group = int64(cuda.blockIdx.x)
            while group * slots < out_numel:  # uniform across the block
                o = group * slots + slot
                valid = o < out_numel
                a = ACC(INIT_A)
                b = ACC(0)
                c = ACC(0)
                k = int64(INIT_K)
                if valid:
                    s = int64(lane)
                    while s < splits:
                        a2 = ws_acc[uint64(s * out_numel + o)] if N_ACC >= 1 else a
                        b2 = ws_acc[uint64((splits + s) * out_numel + o)] if N_ACC >= 2 else b
                        k2 = ws_k[uint64(s * out_numel + o)] if USES_K else k
                        a, b, c, k = merge(a, b, c, k, a2, b2, c, k2)
                        s += lanes
                a, b, c, k = combine(a, b, c, k, tid, lane, lanes, slots, 0, sa, sb, sk)
                if valid and lane == 0:
                    y_off = int64(0)
                    if mode != 3:
                        _, y_off, _, _ = _offsets4(o, out_shape, x_strides, y_strides,
                                                   aux_strides, aux_strides)
                    write_state(y, y_off, ws_acc, ws_k, mode == 3, a, b, c, k, param, o,
                                out_numel, 0, splits)
                group += cuda.gridDim.x
            return

        if row_layout:
            lane = tid % lanes
            slot = tid // lanes
        else:
            lane = tid // slots
            slot = tid % slots
        split = int64(cuda.blockIdx.y)
        begin = split * chunk_len
        end = min(extent, begin + chunk_len)
        group = int64(cuda.blockIdx.x)
        while group * slots < out_numel:  # uniform across the block
            o = group * slots + slot
            valid = o < out_numel
            x_off = y_off = aux_off = int64(0)
            if valid:
                x_off, y_off, aux_off, _ = _offsets4(o, out_shape, x_strides, y_strides,
                                                     aux_strides, aux_strides)
            aux_value = load(aux, aux_off) if USES_AUX and valid else ACC(0)
            a, b, c, k = lane_reduce(x, x_off, x_axis_stride, aux_value, valid, begin, end,
                                     tid, lane, lanes, slots, row_layout, sa, sb, sk)
            if lane == 0 and valid:
                write_state(y, y_off, ws_acc, ws_k, mode != 0, a, b, c, k, param, o,
                            out_numel, split, splits)
            group += cuda.gridDim.x

    return reduce_rows


# -- the gradient kernel -----------------------------------------------------------------
# coefficient(g, y, stat_a, stat_k, param) -> per-output c; element(c, x, y, stat_a) -> dx


@cuda.jit(device=True, inline=True)
def _coef_identity(g, yv, mean, count, param):
    return g


@cuda.jit(device=True, inline=True)
def _coef_mean(g, yv, mean, count, param):
    return g / param


@cuda.jit(device=True, inline=True)
def _coef_ties(g, yv, mean, count, param):
    # torch amax/jax max: (dy / count) * (x == y); count == 0 (NaN max) gives NaN
    return g / float64(count)


@cuda.jit(device=True, inline=True)
def _coef_prod(g, yv, mean, count, param):
    return g * yv


@cuda.jit(device=True, inline=True)
def _coef_norm2(g, yv, mean, count, param):
    # torch: x * (dy / y) with the y == 0 rows set to 0 (subgradient 0 at the origin)
    if yv == 0.0:
        return yv
    return g / yv


@cuda.jit(device=True, inline=True)
def _coef_var(g, yv, mean, count, param):
    # param = 2 / (n - correction) (inf when n == correction, as torch)
    return g * param


@cuda.jit(device=True, inline=True)
def _coef_std(g, yv, mean, count, param):
    # torch: var_backward(dy / (2 y) masked to 0 where y == 0)
    if yv == 0.0:
        return yv
    return g / (yv + yv) * param


if SIMULATOR:  # the simulator's libdevice has no frcp_rn

    @cuda.jit(device=True, inline=True)
    def _recip_f32(x):
        return np.float32(1.0) / np.float32(x)

else:

    @cuda.jit(device=True, inline=True)
    def _recip_f32(x):
        return libdevice.frcp_rn(x)


@cuda.jit(device=True, inline=True)
def _coef_std_f32(g, yv, mean, count, param):
    # _coef_std of an f32 accumulator: g times the correctly rounded 1 / (2 y) (rcp.rn.f32)
    # instead of an IEEE division (two roundings, <= 1.5 ulp; y = inf gives 0, y NaN NaN,
    # as the division). Every lane of a register-resident row computes it.
    # (Measurements: docs/design/reduce.md, "Measured constants".)
    if yv == 0.0:
        return yv
    return g * _recip_f32(yv + yv) * param


@cuda.jit(device=True, inline=True)
def _elem_coef(c, x, yv, mean):
    return c


@cuda.jit(device=True, inline=True)
def _elem_ties(c, x, yv, mean):
    if x == yv:
        return c
    return c - c  # 0, or NaN when c is inf/NaN (as torch's (dy / count) * mask)


#: |x| range where 1 / x is a normal float32 (2^-126 <= |x| < 2^126).
_RECIP_LOW = float32(2.0**-126)
_RECIP_HIGH = float32(2.0**126)


@cuda.jit(device=True, inline=True)
def _elem_div(c, x, yv, mean):
    # c / x as c * (1 / x): c (= dy * y) is one value per row, and the product of many
    # factors is often 0 or subnormal there, which sends every IEEE division c / x down
    # its slow path (bf16 Prod gradients ran at 16-41% of copy); 1 / x of a normal x
    # never does. Two roundings (<= 1.5 ulp of f32; zeros, infs and NaNs as c / x);
    # outside the normal range of 1 / x it divides.
    ax = abs(x)
    if ax >= _RECIP_LOW and ax < _RECIP_HIGH:
        return c * (float32(1.0) / x)
    return c / x


@cuda.jit(device=True, inline=True)
def _recip_normal(x):
    # whether 1 / x is a normal float32 (2^-126 <= |x| < 2^126); no branch
    ax = abs(x)
    return (ax >= _RECIP_LOW) & (ax < _RECIP_HIGH)


@cuda.jit(device=True, inline=True)
def _elem_recip_half(c, x, yv, mean):
    # c / x as c times the approximate 1 / x (rcp.approx.ftz: <= 1 ulp of f32, far below
    # the final rounding to 8 or 11 bits): _elem_div_half where _recip_normal(x) holds
    return c * rcp_approx_ftz_f32(x)


@cuda.jit(device=True, inline=True)
def _elem_quotient(c, x, yv, mean):
    return c / x


@cuda.jit(device=True, inline=True)
def _elem_div_half(c, x, yv, mean):
    # _elem_div for f16/bf16 elements: 1 / x approximate instead of the correctly rounded
    # rcp.rn sequence (_elem_recip_half), the IEEE division outside its range
    if _recip_normal(x):
        return _elem_recip_half(c, x, yv, mean)
    return _elem_quotient(c, x, yv, mean)


@cuda.jit(device=True, inline=True)
def _elem_mul(c, x, yv, mean):
    return c * x


@cuda.jit(device=True, inline=True)
def _elem_lse(c, x, yv, mean):
    return c * math.exp(x - yv)


@cuda.jit(device=True, inline=True)
def _elem_centered(c, x, yv, mean):
    return c * (x - mean)


@dataclass(frozen=True)
class GradOps:
    """A gradient formula ``dx = element(coefficient(dy, y, stat), x)``; ``stat`` names
    the per-output statistic it needs (``"mean"``: a sum over the line, from the
    statistic pass or reduced in the gradient kernel (fused), divided by the extent;
    ``"ties"`` count)."""

    coefficient: Any
    element: Any
    reads_x: bool
    reads_y: bool
    stat: str | None = None
    coefficient_f32: Any = None  # the coefficient for an f32 accumulator, if another
    element_half: Any = None  # the element function for f16/bf16 elements, if another
    #: f16/bf16: ``(fast, holds, exact)`` with ``element_half(c, x,...) = fast(c, x,...)
    #: if holds(x) else exact(c, x,...)``, for kernels that test a word's elements with
    #: ``holds`` (no branch) and take ``exact`` only for a word where one fails
    checked_half: tuple[Any, Any, Any] | None = None


def _grad_fns(kind: ReduceKind, element: ElementKind) -> tuple[Any, Any]:
    """(coefficient, element) device functions of ``kind``'s gradient for ``element``'s
    accumulator."""
    ops = GRAD_OPS[kind]
    elem = ops.element_half if ops.element_half is not None and element.byte_width == 2 \
        else ops.element
    if ops.coefficient_f32 is not None and ELEMENTS[element].acc is float32:
        return ops.coefficient_f32, elem
    return ops.coefficient, elem


def _grad_checked(kind: ReduceKind, element: ElementKind) -> tuple[Any, Any, Any] | None:
    """``GradOps.checked_half`` of ``kind`` for 2-byte elements, else None."""
    return GRAD_OPS[kind].checked_half if element.byte_width == 2 else None


#: The gradient table (float element kinds only). Sum is Mean with param = 1 (dy / 1 is
#: exact); Min is Max (both route to the positions equal to y).
GRAD_OPS: dict[ReduceKind, GradOps] = {
    ReduceKind.MEAN: GradOps(_coef_mean, _elem_coef, False, False),
    ReduceKind.MAX: GradOps(_coef_ties, _elem_ties, True, True, "ties"),
    ReduceKind.PROD: GradOps(_coef_prod, _elem_div, True, True, element_half=_elem_div_half,
                             checked_half=(_elem_recip_half, _recip_normal, _elem_quotient)),
    ReduceKind.NORM2: GradOps(_coef_norm2, _elem_mul, True, True),
    ReduceKind.LOG_SUM_EXP: GradOps(_coef_identity, _elem_lse, True, True),
    ReduceKind.VAR: GradOps(_coef_var, _elem_centered, True, False, "mean"),
    ReduceKind.STD: GradOps(_coef_std, _elem_centered, True, True, "mean", _coef_std_f32),
}


def _make_backward(kind: ReduceKind, element: ElementKind) -> Callable[..., None]:
    ops = GRAD_OPS[kind]
    spec = ELEMENTS[element]
    ACC = spec.acc
    load, store = spec.load, spec.store
    coefficient, element_fn = _grad_fns(kind, element)
    READS_X, READS_Y = ops.reads_x, ops.reads_y
    STAT_MEAN, STAT_TIES = ops.stat == "mean", ops.stat == "ties"
    HAS_STAT = ops.stat is not None
    # fused: the mean as the Sum reducer's sum over the extent; Welford's squared
    # deviations are never read.
    # (Measurements: docs/design/reduce.md, "Measured constants".)
    stat_reduce = _lane_reducer(TIES if STAT_TIES else ReduceKind.SUM, element)

    def reduce_backward(dy, x, y, dx, stat_acc, stat_k, out_numel, extent, x_axis_stride,
                        dx_axis_stride, out_shape, dy_strides, x_strides, y_strides,
                        dx_strides, lanes, row_layout, chunk_len, param, fused):
        """dx over the rows of ``out_numel`` outputs. The statistic (mean / tie count) is
        ``stat_acc[o] / extent`` (a sum) / ``stat_k[o]``, or with ``fused`` (one split
        only) reduced here first by the lanes of the row, which then re-read their elements
        (cache-warm)."""
        tid = cuda.threadIdx.x
        block = cuda.blockDim.x
        slots = block // lanes
        if row_layout:
            lane = tid % lanes
            slot = tid // lanes
        else:
            lane = tid // slots
            slot = tid % slots
        begin = int64(cuda.blockIdx.y) * chunk_len
        end = min(extent, begin + chunk_len)
        span = int64(lanes)
        x_span = span * x_axis_stride
        dx_span = span * dx_axis_stride
        sa = cuda.shared.array(SHARED_SLOTS, ACC)
        sb = cuda.shared.array(SHARED_SLOTS, ACC)
        sk = cuda.shared.array(SHARED_SLOTS, int64)
        group = int64(cuda.blockIdx.x)
        while group * slots < out_numel:  # uniform across the block
            o = group * slots + slot
            valid = o < out_numel
            dy_off = x_off = y_off = dx_off = int64(0)
            if valid:
                dy_off, x_off, y_off, dx_off = _offsets4(o, out_shape, dy_strides, x_strides,
                                                         y_strides, dx_strides)
            g = load(dy, dy_off) if valid else ACC(0)
            yv = load(y, y_off) if READS_Y and valid else g
            mean = g
            count = int64(0)
            if HAS_STAT:
                if fused:
                    a, b, c, k = stat_reduce(x, x_off, x_axis_stride, yv, valid, begin, end,
                                             tid, lane, lanes, slots, row_layout, sa, sb, sk)
                    if lane == 0:
                        sa[slot] = a
                        sk[slot] = k
                    cuda.syncthreads()
                    mean = sa[slot] / ACC(extent) if STAT_MEAN else sa[slot]
                    count = sk[slot]
                    cuda.syncthreads()  # sa/sk are free for the next group
                elif valid:
                    if STAT_MEAN:
                        mean = stat_acc[o] / ACC(extent)  # the statistic pass's sum
                    else:
                        count = stat_k[o]
            if valid:
                cf = ACC(coefficient(g, yv, mean, count, param))
                i = begin + lane
                x_at = x_off + i * x_axis_stride
                dx_at = dx_off + i * dx_axis_stride
                while i + 3 * span < end:
                    if READS_X:
                        v0 = load(x, x_at)
                        v1 = load(x, x_at + x_span)
                        v2 = load(x, x_at + 2 * x_span)
                        v3 = load(x, x_at + 3 * x_span)
                    else:
                        v0 = v1 = v2 = v3 = cf
                    dx[uint64(dx_at)] = store(element_fn(cf, v0, yv, mean))
                    dx[uint64(dx_at + dx_span)] = store(element_fn(cf, v1, yv, mean))
                    dx[uint64(dx_at + 2 * dx_span)] = store(element_fn(cf, v2, yv, mean))
                    dx[uint64(dx_at + 3 * dx_span)] = store(element_fn(cf, v3, yv, mean))
                    i += 4 * span
                    x_at += 4 * x_span
                    dx_at += 4 * dx_span
                while i < end:
                    v = load(x, x_at) if READS_X else cf
                    dx[uint64(dx_at)] = store(element_fn(cf, v, yv, mean))
                    i += span
                    x_at += x_span
                    dx_at += dx_span
            group += cuda.gridDim.x

    return reduce_backward


# -- vector (8-byte word) access of contiguous runs ---------------------------------------
# The same bytes as the element array, viewed as uint64 words: one load moves 2 f32 or 4
# f16/bf16 elements (a plain 4-byte load per element falls well short of the copy
# bandwidth; 8-byte words with 8 loads in flight per thread come close).
# (Measurements: docs/design/reduce.md, "Measured constants".)

#: Word loads each thread keeps in flight (8 x 8 bytes).
VEC_LOADS = 8


def tie_mask_iters(width: int) -> int:
    """Word-loop iterations (VEC_LOADS words of ``width`` elements per lane) per 64-bit tie
    mask of the Max/Min gradient's tie count after dx, one bit per element: 4 for f32, 2
    for f16/bf16; 1 in the simulator, whose small geometries give a lane only a few
    iterations per split (every mask boundary is exercised there)."""
    return 1 if SIMULATOR else 64 // (VEC_LOADS * width)


#: Register cap of the forward word kernels: 4 resident 256-thread blocks per SM, which the
#: plans' one-wave split rule assumes (uncapped: 80 registers for Sum, 127 for bf16 Var;
#: capped, ptxas spills 36-200 bytes, outside the load loop for Sum).
VEC_MAX_REGISTERS = 64

@cuda.jit(device=True, inline=True)
def _unpack_f32(w, values, base):
    values[base], values[base + 1] = unpack_f32x2(w)


@cuda.jit(device=True, inline=True)
def _unpack_bf16(w, values, base):
    lo = uint32(w & uint64(0xFFFFFFFF))
    hi = uint32(w >> uint64(32))
    values[base] = f32_from_bits(lo << uint32(16))
    values[base + 1] = f32_from_bits(lo & uint32(0xFFFF0000))
    values[base + 2] = f32_from_bits(hi << uint32(16))
    values[base + 3] = f32_from_bits(hi & uint32(0xFFFF0000))


@cuda.jit(device=True, inline=True)
def _unpack_f16(w, values, base):
    values[base], values[base + 1], values[base + 2], values[base + 3] = unpack_f16x4(w)


@cuda.jit(device=True, inline=True)
def _pack_f32(values):
    return pack_f32x2(values[0], values[1])


@cuda.jit(device=True, inline=True)
def _pack_bf16(values):
    return pack_bf16x4(values[0], values[1], values[2], values[3])


@cuda.jit(device=True, inline=True)
def _pack_f16(values):
    return pack_f16x4(values[0], values[1], values[2], values[3])


def _word_storer(width: int, storage: Any) -> Any:
    """``store_word(dx, dxv, word, w, shift)``: write word ``w`` at word index ``word`` of
    ``dxv`` (element ``word * width - shift`` of ``dx``). The simulator copies each kernel
    array in and out separately, so two views of one buffer would overwrite each other's
    writes: there the word is unpacked into ``dx`` elements instead."""
    if not SIMULATOR:

        @cuda.jit(device=True, inline=True)
        def store_word(dx, dxv, word, w, shift):
            dxv[uint64(word)] = w

        return store_word
    bits = 64 // width
    mask = (1 << bits) - 1
    view = {2: np.float32, 4: None}[width] if storage is not types.float16 else np.float16

    def as_storage(b):
        if view is np.float32:
            return np.uint32(b).view(np.float32)
        if view is np.float16:
            return np.uint16(b).view(np.float16)
        return np.uint16(b)

    @cuda.jit(device=True)
    def sim_store_word(dx, dxv, word, w, shift):
        for e in range(width):
            dx[int(word) * width - int(shift) + e] = as_storage((int(w) >> (e * bits)) & mask)

    return sim_store_word


@dataclass(frozen=True)
class VectorSpec:
    """Word access of an element kind: ``width`` elements per uint64 word, ``unpack(w,
    values, base)`` writes them (accumulator type) to ``values[base:base + width]`` in
    memory order, ``pack(values)`` rounds ``values[0:width]`` to the element kind and packs
    them into a word (bf16 on the GPU: ``cvt.rn.bf16x2.f32`` per pair, NaN canonical)."""

    width: int
    unpack: Any
    pack: Any
    store_word: Any
    eq_mask: Any = None  # f16/bf16: equality mask of two words (kernels.common.eq_mask_*)

    @property
    def log_width(self) -> int:
        return self.width.bit_length() - 1


#: Element kinds with word access (f64/i64 words hold one element: nothing to gain; i32
#: reductions are not a target).
VECTOR: dict[ElementKind, VectorSpec] = {
    ElementKind.F16: VectorSpec(4, _unpack_f16, _pack_f16, _word_storer(4, types.float16),
                                eq_mask_f16x4),
    ElementKind.BF16: VectorSpec(4, _unpack_bf16, _pack_bf16, _word_storer(4, uint16),
                                 eq_mask_bf16x4),
    ElementKind.F32: VectorSpec(2, _unpack_f32, _pack_f32, _word_storer(2, float32)),
}
#: The most elements a word holds (f16 / bf16).
_MAX_WIDTH = max(spec.width for spec in VECTOR.values())


def _vec_chunk(kind: Any, acc: types.Type, width: int, loads: int = VEC_LOADS) -> Any:
    """Fold the ``loads * width`` values of one batch of ``loads`` words (``values[u *
    width + e]`` at row index ``i0 + u * vspan + e``): Welford exactly (one merge), Sum in
    ``width`` independent chains, every other kind step by step in index order."""
    count = loads * width
    ops = KIND_OPS[kind]
    step, _, merge = ops.functions(acc)
    if ops.functions is _welford_for:
        INV = 1.0 / count

        @cuda.jit(device=True, inline=True)
        def welford_vec_chunk(a, b, c, k, values, i0, vspan, aux):
            total = acc(0)
            for u in range(count):
                total += values[u]
            chunk_mean = total * acc(INV)
            chunk_m2 = acc(0)
            for u in range(count):
                d = values[u] - chunk_mean
                chunk_m2 += d * d
            return merge(a, b, c, k, chunk_mean, chunk_m2, c, int64(count))

        return welford_vec_chunk

    if ops.functions is _SUM_FUNCTIONS:
        # Sum/Mean: ``width`` independent chains (one per element position of a word) of
        # ``loads`` adds each, then the chains in order, then ``a``: a fixed order, so still
        # deterministic and bit-stable, and a dependency chain of loads + width adds
        # instead of loads * width (bf16, 8 loads: 12 instead of 32).

        @cuda.jit(device=True, inline=True)
        def chains_vec_chunk(a, b, c, k, values, i0, vspan, aux):
            for e in range(width):
                for u in range(1, loads):
                    values[e] += values[u * width + e]
            total = values[0]
            for e in range(1, width):
                total += values[e]
            return a + total, b, c, k

        return chains_vec_chunk

    @cuda.jit(device=True, inline=True)
    def sequential_vec_chunk(a, b, c, k, values, i0, vspan, aux):
        for u in range(loads):
            for e in range(width):
                a, b, c, k = step(a, b, c, k, values[u * width + e], i0 + u * vspan + e, aux)
        return a, b, c, k

    return sequential_vec_chunk


_VEC_LANE_REDUCERS: dict[tuple[Any, ElementKind], Any] = {}


def _vec_lane_reducer(kind: Any, element: ElementKind) -> Any:
    """Device function: the state of one contiguous row ``x[x_off : x_off + extent]``
    (split ``split`` of ``splits``: words ``[split * chunk_vecs,...)`` of the row's
    aligned body; split 0 adds the unaligned head, the last split the tail), folded by the
    ``lanes`` lanes of one slot with word loads and combined (complete in lane 0). Every
    thread of the block must call it; ``valid`` threads load. ``shift``: elements between
    the word-aligned base of ``xv`` and ``x``."""
    found = _VEC_LANE_REDUCERS.get((kind, element))
    if found is not None:
        return found
    ops = KIND_OPS[kind]
    spec = ELEMENTS[element]
    vec = VECTOR[element]
    ACC = spec.acc
    load = spec.load
    unpack = vec.unpack
    step = ops.functions(ACC)[0]
    W, LOG_W, MASK = vec.width, vec.log_width, vec.width - 1
    COUNT = VEC_LOADS * W
    chunk = _vec_chunk(kind, ACC, W)
    INIT_A, INIT_K = ops.init_a(spec), ops.init_k
    combine = _lane_combiner(kind, element)

    @cuda.jit(device=True, inline=True)
    def vec_lane_reduce(x, xv, x_off, shift, aux_value, valid, extent, split, splits,
                        chunk_vecs, tid, lane, lanes, slots, sa, sb, sk):
        a = ACC(INIT_A)
        b = ACC(0)
        c = ACC(0)
        k = int64(INIT_K)
        if valid:
            p0 = x_off + shift
            head = (W - (p0 & MASK)) & MASK
            if head > extent:
                head = extent
            nvec = (extent - head) >> LOG_W
            base = (p0 + head) >> LOG_W
            if split == 0:
                t = int64(lane)
                while t < head:  # fewer lanes than head elements: rows of few words
                    a, b, c, k = step(a, b, c, k, load(x, x_off + t), t, aux_value)
                    t += lanes
            begin = split * chunk_vecs
            end = min(nvec, begin + chunk_vecs)
            span = int64(lanes)
            vspan = span * W
            j = begin + lane
            words = cuda.local.array(VEC_LOADS, uint64)
            values = cuda.local.array(COUNT, ACC)
            while j + (VEC_LOADS - 1) * span < end:  # VEC_LOADS word loads in flight
                for u in range(VEC_LOADS):
                    words[u] = xv[uint64(base + j + u * span)]
                for u in range(VEC_LOADS):
                    unpack(words[u], values, u * W)
                a, b, c, k = chunk(a, b, c, k, values, head + j * W, vspan, aux_value)
                j += VEC_LOADS * span
            if j < end:  # the rest: still one batch of loads, folded word by word
                for u in range(VEC_LOADS):
                    if j + u * span < end:
                        words[u] = xv[uint64(base + j + u * span)]
                while j < end:
                    unpack(words[0], values, 0)
                    for u in range(VEC_LOADS - 1):
                        words[u] = words[u + 1]
                    for e in range(W):
                        a, b, c, k = step(a, b, c, k, values[e], head + j * W + e, aux_value)
                    j += span
            if split == splits - 1:
                t = head + (nvec << LOG_W) + lane
                while t < extent:
                    a, b, c, k = step(a, b, c, k, load(x, x_off + t), t, aux_value)
                    t += lanes
        return combine(a, b, c, k, tid, lane, lanes, slots, 1, sa, sb, sk)

    _VEC_LANE_REDUCERS[(kind, element)] = vec_lane_reduce
    return vec_lane_reduce


#: Words per lane of the short-row path of ``reduce_rows_vec`` (rows of ``lanes *
#: SHORT_LOADS`` words; the plans use it for 4 or 8 lanes).
#: (Measurements: docs/design/reduce.md, "Measured constants".)
SHORT_LOADS = 4
#: Kernel kinds whose short-row path also takes rows of exactly ``lanes * VEC_LOADS`` words
#: (up to a block of lanes): the kinds with one operation per merge. The others keep the
#: row loop there.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
LONG_SHORT_KINDS = (ReduceKind.SUM, ReduceKind.MAX, ReduceKind.MIN, ReduceKind.PROD,
                    ReduceKind.NORM2)


#: Lanes per row from which the short-row path of the LONG_SHORT_KINDS parks each thread's
#: words of its next row in shared memory (``cp.async``) while the block combines the
#: current one (the ``REDUCE_ROWS_PARK_KERNELS``), over a one-wave grid of blocks that walk
#: their rows (``plans.reduce._SHORT_GRID_X``).
#: (Measurements: docs/design/reduce.md, "Measured constants".)
PARK_MIN_LANES = 8


def _make_reduce_rows_vec(kind: Any, element: ElementKind,
                          park: bool = False) -> Callable[..., None]:
    ops = KIND_OPS[kind]
    spec = ELEMENTS[element]
    vec = VECTOR[element]
    ACC = spec.acc
    load = spec.load
    vec_lane_reduce = _vec_lane_reducer(kind, element)
    write_state = _state_writer(kind, element, ops.final)
    combine = _lane_combiner(kind, element)
    short_chunk = _vec_chunk(kind, ACC, vec.width, SHORT_LOADS)
    long_chunk = _vec_chunk(kind, ACC, vec.width)
    unpack = vec.unpack
    W, LOG_W = vec.width, vec.log_width
    LONG = kind in LONG_SHORT_KINDS
    SHORT_WORDS = VEC_LOADS if LONG else SHORT_LOADS
    SHORT_COUNT = SHORT_WORDS * W
    # ``park`` (REDUCE_ROWS_PARK_KERNELS, LONG_SHORT_KINDS): each thread's words of its
    # next row are parked while the block combines this one, where a row spans at least
    # PARK_MIN_LANES lanes; elsewhere a thread loads its row when it reaches it
    PARK = park and LONG
    SHORT_PARKED = SHORT_WORDS * SHARED_SLOTS if PARK else 1  # blocks of <= SHARED_SLOTS
    INIT_A, INIT_K = ops.init_a(spec), ops.init_k
    USES_AUX = ops.uses_aux
    LAST = MAX_RANK - 1

    @cuda.jit(device=True, inline=True)
    def short_row_words(xv, words, o, row_words, lane, lanes, whole):
        """Load lane ``lane``'s words of short row ``o`` (as ``park_short_row``) into
        ``words``, all in flight at once."""
        at = uint64(o) * row_words + uint64(lane)
        for u in range(SHORT_WORDS):
            if u < SHORT_LOADS or whole:
                words[u] = xv[at + uint64(u * lanes)]

    @cuda.jit(device=True, inline=True)
    def park_short_row(parked, tid, block, xv, o, row_words, lane, lanes, whole):
        """Issue ``cp.async`` copies of lane ``lane``'s words of short row ``o`` (words
        ``lane + u * lanes``: SHORT_LOADS of them, or SHORT_WORDS where ``whole``) into
        the thread's own slots ``tid + u * block`` of ``parked``, not waited for."""
        at = uint64(o) * row_words + uint64(lane)
        # the first slot hidden from the compiler: the slots' addresses stay an immediate
        # from one register instead of being hoisted out of the row loop
        here = opaque(int32(tid))
        for u in range(SHORT_WORDS):
            if u < SHORT_LOADS or whole:
                copy_async8(parked, here + u * block, xv, at + uint64(u * lanes))

    def reduce_rows_vec(x, xv, y, ws_acc, ws_k, aux, out_numel, extent, out_shape, x_strides,
                        y_strides, aux_strides, lanes, splits, chunk_vecs, mode, param, shift):
        """Contiguous rows (reduce axis stride 1) with word loads: ``lanes`` lanes per row
        (consecutive threads), ``block / lanes`` rows per block, grid.x over row groups
        (grid-stride), grid.y over ``splits`` splits of ``chunk_vecs`` words. ``mode`` 0
        writes ``y``, 1 the split's partial state (merged by the ``reduce`` kernel's modes
        2/3, same workspace layout).

        ``fused`` for the tie count (Max/Min), three passes over the split rows without
        re-reading x where every row has exactly one tie: 2 writes dx as if each row's
        count were 1 and each split's count of ties to ``stat_k[split * out_numel + o]``;
        after the merge of those counts into ``stat_k[o]``, 3 rewrites the rows whose
        count is not 1 (ties, or none: a NaN y) and skips the others.

        ``chunk_vecs == 0`` selects the short-row path (plans: one split, one collapsed
        output dim, ``shift == 0``, rows of exactly ``lanes * SHORT_LOADS`` or, for
        LONG_SHORT_KINDS, ``lanes * VEC_LOADS`` words starting on a word): lane ``l`` of
        row ``o`` loads words ``l + u * lanes`` (u < the words per lane) at once and folds
        them with the kind's chunk; no head, tail or remainder path and one multiply per
        offset. LONG_SHORT_KINDS with rows of at least PARK_MIN_LANES lanes issue the
        ``cp.async`` copies of each thread's words of its next row (one grid of groups
        later) into its own shared slots once it has its current words in registers, so
        they are in flight while the block combines and writes the current row."""
        tid = cuda.threadIdx.x
        block = cuda.blockDim.x
        sa = cuda.shared.array(SHARED_SLOTS, ACC)
        sb = cuda.shared.array(SHARED_SLOTS, ACC)
        sk = cuda.shared.array(SHARED_SLOTS, int64)
        slots = block // lanes
        lane = tid % lanes
        slot = tid // lanes
        split = int64(cuda.blockIdx.y)
        group = int64(cuda.blockIdx.x)
        if chunk_vecs == 0:
            row_words = uint64(x_strides[LAST]) >> uint64(LOG_W)
            y_stride = uint64(y_strides[LAST])
            aux_stride = uint64(aux_strides[LAST])
            # VEC_LOADS words per lane (LONG_SHORT_KINDS only), else SHORT_LOADS
            whole = LONG and (extent >> LOG_W) == lanes * VEC_LOADS
            words = cuda.local.array(SHORT_WORDS, uint64)
            values = cuda.local.array(SHORT_COUNT, ACC)
            # each thread's words of its next row, copied while the block combines this one
            parked = cuda.shared.array(SHORT_PARKED, uint64)
            vspan = int64(lanes * W)
            ahead = int64(cuda.gridDim.x) * slots  # the same slot's row one group later
            # (always true where the plans bind a park kernel; the check keeps its code the
            # code that was measured, b290639's)
            park = PARK and lanes >= PARK_MIN_LANES
            o = group * slots + slot
            if park and o < out_numel:
                park_short_row(parked, tid, block, xv, o, row_words, lane, lanes, whole)
            while group * slots < out_numel:  # uniform across the block
                o = group * slots + slot
                valid = o < out_numel
                if park:
                    copy_async_wait()
                    for u in range(SHORT_WORDS):  # the thread's own slots: no barrier
                        if u < SHORT_LOADS or whole:
                            words[u] = parked[tid + u * block]
                elif valid:
                    short_row_words(xv, words, o, row_words, lane, lanes, whole)
                a = ACC(INIT_A)
                b = ACC(0)
                c = ACC(0)
                k = int64(INIT_K)
                if valid:
                    aux_value = load(aux, uint64(o) * aux_stride) if USES_AUX else ACC(0)
                    if whole:
                        for u in range(SHORT_WORDS):
                            unpack(words[u], values, u * W)
                        a, b, c, k = long_chunk(a, b, c, k, values, int64(lane * W), vspan,
                                                aux_value)
                    else:
                        for u in range(SHORT_LOADS):
                            unpack(words[u], values, u * W)
                        a, b, c, k = short_chunk(a, b, c, k, values, int64(lane * W), vspan,
                                                 aux_value)
                # the next copies into the slots read above: a thread's own read comes first
                # in program order, so it cannot see them
                if park and o + ahead < out_numel:
                    park_short_row(parked, tid, block, xv, o + ahead, row_words, lane, lanes,
                                   whole)
                a, b, c, k = combine(a, b, c, k, tid, lane, lanes, slots, 1, sa, sb, sk)
                if lane == 0 and valid:
                    write_state(y, int64(uint64(o) * y_stride), ws_acc, ws_k, mode != 0, a, b,
                                c, k, param, o, out_numel, split, splits)
                group += cuda.gridDim.x
            return
        while group * slots < out_numel:  # uniform across the block
            o = group * slots + slot
            valid = o < out_numel
            x_off = y_off = aux_off = int64(0)
            if valid:
                x_off, y_off, aux_off, _ = _offsets4(o, out_shape, x_strides, y_strides,
                                                     aux_strides, aux_strides)
            aux_value = load(aux, aux_off) if USES_AUX and valid else ACC(0)
            a, b, c, k = vec_lane_reduce(x, xv, x_off, shift, aux_value, valid, extent, split,
                                         splits, chunk_vecs, tid, lane, lanes, slots, sa, sb,
                                         sk)
            if lane == 0 and valid:
                write_state(y, y_off, ws_acc, ws_k, mode != 0, a, b, c, k, param, o,
                            out_numel, split, splits)
            group += cuda.gridDim.x

    return reduce_rows_vec


def _make_reduce_cols_vec(kind: Any, element: ElementKind) -> Callable[..., None]:
    ops = KIND_OPS[kind]
    spec = ELEMENTS[element]
    vec = VECTOR[element]
    ACC = spec.acc
    load = spec.load
    step, fold_chunk, merge = ops.functions(ACC)
    combine = _lane_combiner(kind, element)
    write_state = _state_writer(kind, element, ops.final)
    unpack = vec.unpack
    W, LOG_W = vec.width, vec.log_width
    CHUNK_VALUES = CHUNK * W
    INIT_A, INIT_K = ops.init_a(spec), ops.init_k
    USES_AUX = ops.uses_aux

    def reduce_cols_vec(xv, y, ws_acc, ws_k, aux, out_numel, extent, axis_words, y_stride,
                        aux_stride, lanes, splits, chunk_len, mode, param):
        """Column layout with word loads: ``x`` is ``extent`` rows of ``out_numel``
        contiguous outputs, ``axis_words`` words apart (word aligned, ``out_numel`` a
        multiple of W). Each slot owns the W outputs of one word (W states); consecutive
        threads own consecutive words, the ``block / slots`` lanes of a slot walk the axis
        together and meet in a shared-memory tree; grid.y splits the axis (``mode`` as in
        ``reduce_rows_vec``)."""
        tid = cuda.threadIdx.x
        block = cuda.blockDim.x
        sa = cuda.shared.array(SHARED_SLOTS, ACC)
        sb = cuda.shared.array(SHARED_SLOTS, ACC)
        sk = cuda.shared.array(SHARED_SLOTS, int64)
        slots = block // lanes
        lane = tid // slots
        slot = tid % slots
        split = int64(cuda.blockIdx.y)
        begin = split * chunk_len
        end = min(extent, begin + chunk_len)
        out_words = out_numel >> LOG_W
        span = int64(lanes)
        word_span = span * axis_words
        st_a = cuda.local.array(W, ACC)
        st_b = cuda.local.array(W, ACC)
        st_k = cuda.local.array(W, int64)
        aux_values = cuda.local.array(W, ACC)
        words = cuda.local.array(CHUNK, uint64)
        values = cuda.local.array(CHUNK_VALUES, ACC)
        column = cuda.local.array(CHUNK, ACC)
        group = int64(cuda.blockIdx.x)
        while group * slots < out_words:  # uniform across the block
            ow = group * slots + slot
            valid = ow < out_words
            c = ACC(0)
            for e in range(W):
                st_a[e] = ACC(INIT_A)
                st_b[e] = ACC(0)
                st_k[e] = int64(INIT_K)
                aux_values[e] = ACC(0)
                if USES_AUX and valid:
                    aux_values[e] = load(aux, ((ow << LOG_W) + e) * aux_stride)
            if valid:
                i = begin + lane
                at = i * axis_words + ow
                while i + (CHUNK - 1) * span < end:  # CHUNK word loads in flight
                    for u in range(CHUNK):
                        words[u] = xv[uint64(at + u * word_span)]
                    for u in range(CHUNK):
                        unpack(words[u], values, u * W)
                    for e in range(W):
                        for u in range(CHUNK):
                            column[u] = values[u * W + e]
                        a, b, c, k = fold_chunk(st_a[e], st_b[e], c, st_k[e], column, i, span,
                                                aux_values[e])
                        st_a[e] = a
                        st_b[e] = b
                        st_k[e] = k
                    i += CHUNK * span
                    at += CHUNK * word_span
                if i < end:  # the rest: one batch of loads, folded word by word
                    for u in range(CHUNK):
                        if i + u * span < end:
                            words[u] = xv[uint64(at + u * word_span)]
                    while i < end:
                        unpack(words[0], values, 0)
                        for u in range(CHUNK - 1):
                            words[u] = words[u + 1]
                        for e in range(W):
                            a, b, c, k = step(st_a[e], st_b[e], c, st_k[e], values[e], i,
                                              aux_values[e])
                            st_a[e] = a
                            st_b[e] = b
                            st_k[e] = k
                        i += span
            for e in range(W):
                a, b, c, k = combine(st_a[e], st_b[e], c, st_k[e], tid, lane, lanes, slots, 0,
                                     sa, sb, sk)
                if lane == 0 and valid:
                    o = (ow << LOG_W) + e
                    write_state(y, o * y_stride, ws_acc, ws_k, mode != 0, a, b, c, k, param, o,
                                out_numel, split, splits)
            group += cuda.gridDim.x

    return reduce_cols_vec


#: Tie masks the rewrite pass of the Max/Min gradient loads at once, per kernel (one
#: dependent load per mask before: a lane walks ~30 masks of a 1e6-long row split in two).
#: The column kernel loaded 2 (one split's masks) until its first pass had grown past 80
#: registers anyway; it now takes the masks of every split a block walks as one list, 8 in
#: flight (``_col_tied_rewriter``, in a kernel of its own since: the
#: REDUCE_BACKWARD_COLS_REWRITE_KERNELS).
#: (Measurements: docs/design/reduce.md, "Measured constants".)
REWRITE_MASKS_ROWS = 8
REWRITE_MASKS_COLS = 8


@dataclass(frozen=True)
class TieWords:
    """Device functions finding the Max/Min gradient's ties in a packed word of f16/bf16
    values without unpacking it (``VectorSpec.eq_mask``: one ``set.eq`` per two values,
    where unpacking, comparing and packing take 2-3 instructions per value), for a word
    ``yw`` of the extremes (``pack`` of the W y values: exact, as each is an element):

    * ``splat(v, values)``: the word of W copies of ``v`` rounded to the element kind
      (``values``: W scratch slots);
    * ``mask(w, yw)``: the bits of each element of ``w`` equal to its y set (IEEE ==, as
      ``_elem_ties``: ``VectorSpec.eq_mask``);
    * ``count(m)``: the number of elements in mask ``m``;
    * ``select(m, cw, zw)``: the elements of ``m`` from ``cw``, the others from ``zw``
      (the gradient word: ``cw`` of the coefficients where x ties, ``zw`` of ``c - c``);
    * ``usable()``: whether ``mask`` compiles for the target (bf16's ``set.eq`` needs
      sm_90; a constant once the target is known, so the path not taken is not in the
      PTX: sm_80 keeps the unpacked comparisons)."""

    splat: Any
    mask: Any
    count: Any
    select: Any
    usable: Any  # () -> whether mask works on the target (bf16: sm_90+)


def _tie_words(element: ElementKind) -> TieWords:
    """The ``TieWords`` of an element kind with ``VectorSpec.eq_mask`` (f16, bf16)."""
    vec = VECTOR[element]
    pack, W = vec.pack, vec.width
    SM90_ONLY = element is ElementKind.BF16
    LOG_BITS = uint32((64 // W).bit_length() - 1)  # bits per element, log 2

    @cuda.jit(device=True, inline=True)
    def splat(v, values):
        for e in range(W):
            values[e] = v
        return pack(values)

    @cuda.jit(device=True, inline=True)
    def count(m):
        return int32(uint32(cuda.popc(m)) >> LOG_BITS)

    @cuda.jit(device=True, inline=True)
    def select(m, cw, zw):
        return (cw & m) | (zw & ~m)

    @cuda.jit(device=True, inline=True)
    def usable():
        return compiled_for_sm90() if SM90_ONLY else True

    return TieWords(splat, vec.eq_mask, count, select, usable)


def _mask_rewriter(element: ElementKind) -> Any:
    """Device function: the tied words of one tie mask ``m`` of the Max/Min gradient's tie
    count after dx (bit ``q * W + e``: element e of the mask's word q, at ``first_word + q
    * word_span``), rewritten without reading x. Element e of such a word is ``cfs[e]``
    (dy / count) where it ties, else ``cfs[e] - cfs[e]``: what the first pass wrote there
    and at every word left alone (0, or NaN for a non-finite dy), as ``_elem_ties``. The
    tied words are visited lowest bit first (the lowest set bit's index is the population
    count below it), so a mask without ties costs one test."""
    vec = VECTOR[element]
    W, LOG_W, pack, store_word = vec.width, vec.log_width, vec.pack, vec.store_word
    WORD_BITS = uint64((1 << W) - 1)

    @cuda.jit(device=True, inline=True)
    def rewrite_mask(dx, dxv, m, cfs, first_word, word_span, results, shift):
        while m != 0:
            low = m & (~m + uint64(1))
            q = uint32(cuda.popc(low - uint64(1))) >> uint32(LOG_W)  # word in mask
            at = uint64(q << uint32(LOG_W))
            bits = (m >> at) & WORD_BITS
            m &= ~(WORD_BITS << at)
            for e in range(W):
                c = cfs[e]
                results[e] = c if (bits >> uint64(e)) & uint64(1) != 0 else c - c
            store_word(dx, dxv, first_word + int64(q) * word_span, pack(results), shift)

    return rewrite_mask


def _tied_word_rewriter(element: ElementKind, batch: int) -> Any:
    """Device function: the rewrite pass of the Max/Min gradient's tie count after dx for
    one lane's word loop (``batches`` iterations of VEC_LOADS words; word ``first_word +
    (it * VEC_LOADS + u) * word_span``): the words holding a tie, from the lane's tie masks
    (mask g at ``mask_at + g * mask_span``, bit ``(r * VEC_LOADS + u) * W + e`` for
    iteration ``g * MASK_ITERS + r``), by ``_mask_rewriter``. ``batch`` masks are loaded
    at once."""
    W = VECTOR[element].width
    rewrite_mask = _mask_rewriter(element)
    MASK_ITERS = tie_mask_iters(W)
    MASK_WORDS = MASK_ITERS * VEC_LOADS

    @cuda.jit(device=True, inline=True)
    def rewrite_tied(dx, dxv, stat_k, mask_at, mask_span, cfs, first_word, word_span,
                     batches, results, shift):
        groups = (batches + MASK_ITERS - 1) // MASK_ITERS
        masks = cuda.local.array(batch, uint64)
        g = int64(0)
        while g < groups:
            for b in range(batch):  # every mask load of the batch in flight
                if g + b < groups:
                    masks[b] = uint64(stat_k[uint64(mask_at + (g + b) * mask_span)])
            for b in range(batch):
                if g + b < groups:
                    rewrite_mask(dx, dxv, masks[b], cfs,
                                 first_word + (g + b) * MASK_WORDS * word_span, word_span,
                                 results, shift)
            g += batch

    return rewrite_tied


def _col_mask_layout(element: ElementKind) -> tuple[Any, Any]:
    """Device functions ``(mask_groups, mask_at)``: where the column word gradient's tie
    masks lie, for the first pass that writes them and the rewrite that reads them.
    ``mask_groups(chunk_len, lanes)``: the masks one lane holds of a full split (one per
    ``tie_mask_iters`` word-loop iterations of VEC_LOADS words). ``mask_at(masks_at,
    split, groups, g, lanes, lane, out_words, ow)``: the slot of mask ``g`` of (split,
    lane, output word ``ow``), ``masks_at + ((split * groups + g) * lanes + lane) *
    out_words + ow``: consecutive output words (a block's slots) are consecutive, and mask
    g + 1 lies ``lanes * out_words`` after mask g. (``plans.reduce._tie_slots`` sizes the
    same layout.)"""
    MASK_ITERS = tie_mask_iters(VECTOR[element].width)

    @cuda.jit(device=True, inline=True)
    def mask_groups(chunk_len, lanes):
        step = int64(VEC_LOADS) * lanes
        return ((chunk_len + step - 1) // step + MASK_ITERS - 1) // MASK_ITERS

    @cuda.jit(device=True, inline=True)
    def mask_at(masks_at, split, groups, g, lanes, lane, out_words, ow):
        return masks_at + ((split * groups + g) * lanes + lane) * out_words + ow

    return mask_groups, mask_at


def _col_tied_rewriter(element: ElementKind, batch: int) -> Any:
    """Device function: the rewrite pass of the column word gradient's tie count after dx
    for one (lane, output word) over every split its block walks (``split0``,
    ``split0 + split_step``,... below ``n_splits``): the masks of all those splits are
    taken as one list, ``batch`` loads in flight at once (one split's masks, 2-4, left
    the loads waiting on each other). Mask g of (split, lane, ow) lies at ``masks_at +
    ((split * groups + g) * lanes + lane) * out_words + ow`` (``groups`` masks a full split:
    ``_col_mask_layout``); a split's lane ``lane`` starts at row ``split * chunk_len +
    lane`` and holds only the masks of its own batches (the last split may be short)."""
    W = VECTOR[element].width
    rewrite_mask = _mask_rewriter(element)
    mask_groups, mask_at = _col_mask_layout(element)
    MASK_ITERS = tie_mask_iters(W)
    MASK_WORDS = MASK_ITERS * VEC_LOADS

    @cuda.jit(device=True, inline=True)
    def lane_masks(split, lane, step, chunk_len, extent):
        i = split * chunk_len + lane
        end = min(extent, split * chunk_len + chunk_len)
        batches = (end - i + step - 1) // step
        return (batches + MASK_ITERS - 1) // MASK_ITERS if i < end else int64(0)

    @cuda.jit(device=True, inline=True)
    def rewrite_tied_cols(dx, dxv, stat_k, masks_at, lanes, lane, ow, out_words, chunk_len,
                          extent, axis_words, split0, split_step, n_splits, cfs, results):
        # (split, g) walked by counters: no division in the loop (an int64 division is a
        # call of ~60 instructions, and the pass is instruction bound)
        step = int64(VEC_LOADS) * lanes
        groups = mask_groups(chunk_len, lanes)
        last = n_splits - 1
        last_groups = lane_masks(last, lane, step, chunk_len, extent)
        word_span = lanes * axis_words
        mask_words = MASK_WORDS * word_span
        masks = cuda.local.array(batch, uint64)
        split = split0
        g = int64(0)
        while split < n_splits:
            s = split
            h = g
            for b in range(batch):  # every mask load of the batch in flight
                m = uint64(0)
                if s < n_splits and h < (groups if s != last else last_groups):
                    m = uint64(stat_k[uint64(
                        mask_at(masks_at, s, groups, h, lanes, lane, out_words, ow))])
                masks[b] = m
                h += 1
                if h == groups:
                    h = int64(0)
                    s += split_step
            for b in range(batch):
                if masks[b] != 0:
                    first = (split * chunk_len + lane) * axis_words + ow + g * mask_words
                    rewrite_mask(dx, dxv, masks[b], cfs, first, word_span, results, 0)
                g += 1
                if g == groups:
                    g = int64(0)
                    split += split_step

    return rewrite_tied_cols


def _make_backward_rows_vec(kind: ReduceKind, element: ElementKind) -> Callable[..., None]:
    ops = GRAD_OPS[kind]
    spec = ELEMENTS[element]
    vec = VECTOR[element]
    ACC = spec.acc
    load, store = spec.load, spec.store
    unpack, pack, store_word = vec.unpack, vec.pack, vec.store_word
    W, LOG_W, MASK = vec.width, vec.log_width, vec.width - 1
    coefficient, element_fn = _grad_fns(kind, element)
    READS_X, READS_Y = ops.reads_x, ops.reads_y
    STAT_MEAN, STAT_TIES = ops.stat == "mean", ops.stat == "ties"
    HAS_STAT = ops.stat is not None
    stat_reduce = _vec_lane_reducer(TIES if STAT_TIES else ReduceKind.SUM, element)
    combine_ties = _lane_combiner(TIES, element)
    rewrite_tied = _tied_word_rewriter(element, REWRITE_MASKS_ROWS)
    MASK_ITERS = tie_mask_iters(W)
    LAST = MAX_RANK - 1

    def reduce_backward_rows_vec(dy, x, xv, y, dx, dxv, stat_acc, stat_k, out_numel, extent,
                                 out_shape, dy_strides, x_strides, y_strides, dx_strides,
                                 lanes, chunk_vecs, param, fused, shift):
        """The gradient of contiguous rows with word loads and stores: ``x`` and ``dx``
        have the same strides and the same word phase (``shift`` elements past the
        word-aligned bases of ``xv``/``dxv``), so one word index addresses both. Layout as
        ``reduce_rows_vec``; grid.y splits the rows into ``chunk_vecs`` words (the
        statistic then comes from ``stat_acc``/``stat_k``); ``fused`` (one split) reduces
        it here first.

        ``chunk_vecs == 0`` selects the short-row path of the kinds without a statistic
        (Sum, Mean, Prod, Norm2, LogSumExp; plans: the conditions of ``reduce_rows_vec``'s
        short rows, one split): lane ``l`` of row ``o`` loads x words ``l + u * lanes`` (u <
        SHORT_LOADS) at once, then stores the dx words at the same indices; no head, tail
        or remainder path and one multiply per offset. The store-only gradient (Sum /
        Mean: no x) also takes rows of ``lanes * VEC_LOADS`` words."""
        tid = cuda.threadIdx.x
        block = cuda.blockDim.x
        slots = block // lanes
        lane = tid % lanes
        slot = tid // lanes
        split = int64(cuda.blockIdx.y)
        splits = int64(cuda.gridDim.y)
        span = int64(lanes)
        sa = cuda.shared.array(SHARED_SLOTS, ACC)
        sb = cuda.shared.array(SHARED_SLOTS, ACC)
        sk = cuda.shared.array(SHARED_SLOTS, int64)
        words = cuda.local.array(VEC_LOADS, uint64)
        values = cuda.local.array(W, ACC)
        results = cuda.local.array(W, ACC)
        cfs = cuda.local.array(W, ACC)
        group = int64(cuda.blockIdx.x)
        if not HAS_STAT and chunk_vecs == 0:
            row_words = uint64(dx_strides[LAST]) >> uint64(LOG_W)
            # store-only rows (Sum / Mean) may hold VEC_LOADS words per lane
            held = VEC_LOADS if not READS_X and (extent >> LOG_W) == lanes * VEC_LOADS \
                else SHORT_LOADS
            while group * slots < out_numel:  # uniform across the block
                o = group * slots + slot
                if o < out_numel:
                    at = uint64(o) * row_words + uint64(lane)
                    if READS_X:  # every load of the row in flight at once
                        for u in range(SHORT_LOADS):
                            words[u] = xv[at + uint64(u * lanes)]
                    g = load(dy, o * dy_strides[LAST])
                    yv = load(y, o * y_strides[LAST]) if READS_Y else g
                    cf = ACC(coefficient(g, yv, g, int64(0), param))
                    if READS_X:
                        for u in range(SHORT_LOADS):
                            unpack(words[u], values, 0)
                            for e in range(W):
                                results[e] = element_fn(cf, values[e], yv, g)
                            w = pack(results)
                            store_word(dx, dxv, at + uint64(u * lanes), w, 0)
                    else:
                        for e in range(W):
                            results[e] = element_fn(cf, cf, yv, g)
                        w = pack(results)
                        for u in range(VEC_LOADS):
                            if u < held:
                                store_word(dx, dxv, at + uint64(u * lanes), w, 0)
                group += cuda.gridDim.x
            return
        while group * slots < out_numel:  # uniform across the block
            o = group * slots + slot
            valid = o < out_numel
            dy_off = x_off = y_off = dx_off = int64(0)
            if valid:
                dy_off, x_off, y_off, dx_off = _offsets4(o, out_shape, dy_strides, x_strides,
                                                         y_strides, dx_strides)
            g = load(dy, dy_off) if valid else ACC(0)
            yv = load(y, y_off) if READS_Y and valid else g
            mean = g
            count = int64(0)
            if HAS_STAT:
                if fused == 1:
                    a, b, c, k = stat_reduce(x, xv, x_off, shift, yv, valid, extent, 0, 1,
                                             chunk_vecs, tid, lane, lanes, slots, sa, sb, sk)
                    if lane == 0:
                        sa[slot] = a
                        sk[slot] = k
                    cuda.syncthreads()
                    mean = sa[slot] / ACC(extent) if STAT_MEAN else sa[slot]
                    count = sk[slot]
                    cuda.syncthreads()  # sa/sk are free for the next group
                elif STAT_TIES and fused == 2:
                    count = int64(1)
                elif valid:
                    if STAT_MEAN:
                        mean = stat_acc[o] / ACC(extent)  # the statistic pass's sum
                    else:
                        count = stat_k[o]
                        if fused == 3 and count == 1:
                            valid = False  # written by the first pass
            ties = int64(0)
            # rewrite of a row with ties: only the words holding one change (the other
            # positions are c - c for c = dy and for c = dy / count: 0, or NaN for both)
            sparse = STAT_TIES and fused == 3 and count > 1
            if valid:
                cf = ACC(coefficient(g, yv, mean, count, param))
                p0 = dx_off + shift
                head = (W - (p0 & MASK)) & MASK
                if head > extent:
                    head = extent
                nvec = (extent - head) >> LOG_W
                base = (p0 + head) >> LOG_W
                if split == 0:
                    t = int64(lane)
                    while t < head:
                        v = load(x, x_off + t) if READS_X else cf
                        tie = STAT_TIES and v == yv
                        if not sparse or tie:
                            dx[uint64(dx_off + t)] = store(element_fn(cf, v, yv, mean))
                        if tie:
                            ties += 1
                        t += span
                begin = split * chunk_vecs
                end = min(nvec, begin + chunk_vecs)
                j = begin + lane
                # tie masks (fused 2 writes them, 3 rewrites the tied words from them):
                # mask g of this lane, at mask_at + g * span, holds bit (r * VEC_LOADS + u)
                # * W + e for element e of word j + ((g * MASK_ITERS + r) * VEC_LOADS + u) *
                # span (the word loop's iteration g * MASK_ITERS + r) when it ties
                batches = (chunk_vecs + VEC_LOADS * span - 1) // (VEC_LOADS * span)
                mask_at = splits * out_numel + (o * splits + split) * (
                    (batches + MASK_ITERS - 1) // MASK_ITERS) * span + lane
                if sparse:
                    for e in range(W):
                        cfs[e] = cf
                    rewrite_tied(dx, dxv, stat_k, mask_at, span, cfs, base + j, span,
                                 (end - j + VEC_LOADS * span - 1) // (VEC_LOADS * span),
                                 results, shift)
                elif READS_X:
                    it = int64(0)
                    mask = uint64(0)
                    while j < end:  # VEC_LOADS word loads in flight, then their stores
                        for u in range(VEC_LOADS):
                            if j + u * span < end:
                                words[u] = xv[uint64(base + j + u * span)]
                        tied = uint32(0)  # bit u * W + e: element e of word u ties
                        for u in range(VEC_LOADS):
                            if j + u * span < end:
                                unpack(words[u], values, 0)
                                for e in range(W):
                                    results[e] = element_fn(cf, values[e], yv, mean)
                                    if STAT_TIES and values[e] == yv:
                                        tied |= uint32(1 << (u * W + e))
                                w = pack(results)
                                store_word(dx, dxv, base + j + u * span, w, shift)
                        j += VEC_LOADS * span
                        if STAT_TIES:
                            mask |= uint64(tied) << uint64(it % MASK_ITERS * (VEC_LOADS * W))
                        it += 1
                        if STAT_TIES and fused == 2 and (it % MASK_ITERS == 0 or j >= end):
                            stat_k[uint64(mask_at + (it - 1) // MASK_ITERS * span)] = \
                                int64(mask)
                            ties += int64(cuda.popc(mask))
                            mask = uint64(0)
                else:
                    for e in range(W):
                        results[e] = element_fn(cf, cf, yv, mean)
                    w = pack(results)
                    while j < end:
                        store_word(dx, dxv, base + j, w, shift)
                        j += span
                if split == splits - 1:
                    t = head + (nvec << LOG_W) + lane
                    while t < extent:
                        v = load(x, x_off + t) if READS_X else cf
                        tie = STAT_TIES and v == yv
                        if not sparse or tie:
                            dx[uint64(dx_off + t)] = store(element_fn(cf, v, yv, mean))
                        if tie:
                            ties += 1
                        t += span
            if STAT_TIES and fused == 2:  # this split's tie count (uniform across the block)
                ties = combine_ties(ACC(0), ACC(0), ACC(0), ties, tid, lane, lanes, slots, 1,
                                    sa, sb, sk)[3]
                if valid and lane == 0:
                    stat_k[uint64(split * out_numel + o)] = ties
            group += cuda.gridDim.x

    return reduce_backward_rows_vec


def _make_backward_cols_vec(kind: ReduceKind, element: ElementKind,
                            rewrite_pass: bool = False) -> Callable[..., None]:
    """The column word gradient kernel; for Max/Min (the tie count after dx) either its
    modes 0 and 2 or, with ``rewrite_pass``, its mode 3 alone (whatever ``mode`` says), so
    that the first pass does not hold the rewrite's registers. (``ptxas`` alone gives the
    first pass 70 / 64 registers, bf16 / f32; Numba's build gives it 96 / 124, 2 resident
    blocks per SM, which capped at 64-80 were slower or even: docs/design/reduce.md.)"""
    ops = GRAD_OPS[kind]
    spec = ELEMENTS[element]
    vec = VECTOR[element]
    ACC = spec.acc
    load = spec.load
    unpack, pack, store_word = vec.unpack, vec.pack, vec.store_word
    W, LOG_W = vec.width, vec.log_width
    coefficient, element_fn = _grad_fns(kind, element)
    # a word's elements by the fast formula, checked without a branch; the exact one for
    # the elements of a word where the check fails (Prod: 1 / x outside the normal range)
    checked = _grad_checked(kind, element)
    CHECKED = checked is not None
    fast_fn, fast_holds, exact_fn = checked or (None,) * 3
    READS_X, READS_Y = ops.reads_x, ops.reads_y
    STAT_MEAN, STAT_TIES = ops.stat == "mean", ops.stat == "ties"
    rewrite_tied = _col_tied_rewriter(element, REWRITE_MASKS_COLS)
    mask_groups, mask_at_of = _col_mask_layout(element)
    MASK_ITERS = tie_mask_iters(W)
    ELEMENT_BITS = uint64(sum(1 << b for b in range(0, 64, W)))  # element 0 of each word
    # f16/bf16 ties from equality masks of the packed words (TieWords; bf16 on sm_90): dx
    # by one select a word, the tie bits only for the (rare) words with a tie
    TIE_MASKS = STAT_TIES and vec.eq_mask is not None
    ties_w = _tie_words(element) if TIE_MASKS else None
    tie_mask, tie_select, tie_usable = \
        (ties_w.mask, ties_w.select, ties_w.usable) if TIE_MASKS else (None,) * 3
    FIELD = 64 // W  # bits per element of an equality mask
    # The mean's gradient walks each chunk from its end: the statistic pass (the same
    # chunks, walked forwards by blocks that all run at once) read those rows last, so the
    # first re-reads of x can still hit L2.
    # (Measurements: docs/design/reduce.md, "Measured constants".)
    BACKWARDS = STAT_MEAN
    REWRITE_PASS = rewrite_pass

    def reduce_backward_cols_vec(dy, xv, y, dx, dxv, stat_acc, stat_k, out_numel, extent,
                                 axis_words, dy_stride, y_stride, lanes, chunk_len, param,
                                 mode):
        """The gradient in the column layout with word loads and stores: ``x`` and ``dx``
        are ``extent`` rows of ``out_numel`` contiguous outputs, ``axis_words`` words apart
        (same layout, word aligned); each slot owns the W outputs of one word (W
        coefficients), its lanes walk the axis (the Var/Std gradients from the chunk's
        end down); the statistic comes from ``stat_acc``/``stat_k``. ``mode`` 2 and 3:
        the tie count's two passes. 2 writes dx with every count taken as 1, records the
        ties in the masks (as ``fused`` 2 of ``reduce_backward_rows_vec``) and adds each
        lane's ties to ``stat_k[o]`` (zeroed before; integer atomics, so the total does
        not depend on their order); 3 rewrites the words of the lines whose count is not
        1, in a grid of fewer splits than the first pass's (its blocks loop over the
        splits: most lines need nothing); 0 otherwise. f16/bf16 Max/Min words (bf16 on
        sm_90) take their ties from equality masks (``TieWords``): dx by one select a
        word, the tie bits only for a word with a tie."""
        if STAT_TIES:  # mode 3 in the rewrite kernel only (a constant there)
            mode = 3 if REWRITE_PASS else (2 if mode == 3 else mode)
        tid = cuda.threadIdx.x
        block = cuda.blockDim.x
        slots = block // lanes
        lane = tid // slots
        slot = tid % slots
        split = int64(cuda.blockIdx.y)
        begin = split * chunk_len
        end = min(extent, begin + chunk_len)
        # the axis splits (the grid's y in modes 0-2; mode 3 may take fewer blocks, which
        # loop over the splits)
        n_splits = (extent + chunk_len - 1) // chunk_len
        out_words = out_numel >> LOG_W
        span = int64(lanes)
        word_span = span * axis_words
        cfs = cuda.local.array(W, ACC)
        ys = cuda.local.array(W, ACC)
        means = cuda.local.array(W, ACC)
        ties = cuda.local.array(W, int64)
        words = cuda.local.array(VEC_LOADS, uint64)
        values = cuda.local.array(W, ACC)
        results = cuda.local.array(W, ACC)
        masks = tie_usable() if TIE_MASKS else False
        group = int64(cuda.blockIdx.x)
        while group * slots < out_words:
            ow = group * slots + slot
            valid = ow < out_words
            sparse = False
            yw = cw = zw = uint64(0)  # the words of the W extremes, cfs, cfs - cfs
            if valid:
                rewrite = False
                sparse = STAT_TIES and mode == 3
                for e in range(W):
                    o = (ow << LOG_W) + e
                    g = load(dy, o * dy_stride)
                    yv = load(y, o * y_stride) if READS_Y else g
                    mean = g
                    count = int64(0)
                    if STAT_MEAN:
                        mean = stat_acc[uint64(o)] / ACC(extent)  # the statistic pass's sum
                    if STAT_TIES:
                        count = int64(1) if mode == 2 else stat_k[uint64(o)]
                        rewrite = rewrite or count != 1
                        sparse = sparse and count != 0  # a NaN extreme: every word
                        ties[e] = 0
                    cfs[e] = ACC(coefficient(g, yv, mean, count, param))
                    ys[e] = yv
                    means[e] = mean
                if TIE_MASKS and masks:
                    yw = pack(ys)
                    cw = pack(cfs)
                    for e in range(W):
                        results[e] = cfs[e] - cfs[e]
                    zw = pack(results)
                if STAT_TIES and mode == 3 and not rewrite:
                    valid = False  # written by the first pass
            if STAT_TIES:
                split = int64(cuda.blockIdx.y)
                if valid and sparse:  # every split this block walks, at once
                    rewrite_tied(dx, dxv, stat_k, out_numel, span, lane, ow, out_words,
                                 chunk_len, extent, axis_words, split,
                                 int64(cuda.gridDim.y), n_splits, cfs, results)
                    valid = False
            while valid:
                if STAT_TIES:  # mode 3 loops over the splits
                    begin = split * chunk_len
                    end = min(extent, begin + chunk_len)
                i = begin + lane
                at = i * axis_words + ow
                # tie masks as in reduce_backward_rows_vec, after the out_numel counts
                # (_col_mask_layout: mask g at mask_at + g * mask_span)
                mask_span = span * out_words
                mask_at = mask_at_of(out_numel, split, mask_groups(chunk_len, span),
                                     int64(0), span, lane, out_words, ow)
                if READS_X:
                    it = int64(0)
                    mask = uint64(0)
                    step = VEC_LOADS * span
                    at_step = VEC_LOADS * word_span
                    if BACKWARDS and i < end:  # from this lane's last batch down
                        last = (end - 1 - i) // step
                        i += last * step
                        at += last * at_step
                        step = -step
                        at_step = -at_step
                    while i >= begin and i < end:  # VEC_LOADS word loads in flight, then stores
                        for u in range(VEC_LOADS):
                            if i + u * span < end:
                                words[u] = xv[uint64(at + u * word_span)]
                        tied = uint32(0)  # bit u * W + e: element e of word u ties
                        for u in range(VEC_LOADS):
                            if TIE_MASKS and masks and i + u * span < end:
                                m = tie_mask(words[u], yw)
                                store_word(dx, dxv, at + u * word_span,
                                           tie_select(m, cw, zw), 0)
                                if m != 0:  # rare: the word's tie bits
                                    for e in range(W):
                                        if (m >> uint64(e * FIELD)) & uint64(1) != 0:
                                            tied |= uint32(1 << (u * W + e))
                            elif i + u * span < end:
                                unpack(words[u], values, 0)
                                holds = True
                                for e in range(W):
                                    if CHECKED:
                                        results[e] = fast_fn(cfs[e], values[e], ys[e],
                                                             means[e])
                                        holds = holds & fast_holds(values[e])
                                    else:
                                        results[e] = element_fn(cfs[e], values[e], ys[e],
                                                                means[e])
                                    if STAT_TIES and values[e] == ys[e]:
                                        tied |= uint32(1 << (u * W + e))
                                if CHECKED:
                                    if not holds:
                                        for e in range(W):
                                            if not fast_holds(values[e]):
                                                results[e] = exact_fn(cfs[e], values[e],
                                                                      ys[e], means[e])
                                w = pack(results)
                                store_word(dx, dxv, at + u * word_span, w, 0)
                        i += step
                        at += at_step
                        if STAT_TIES:
                            mask |= uint64(tied) << uint64(it % MASK_ITERS * (VEC_LOADS * W))
                        it += 1
                        if STAT_TIES and mode == 2 and (it % MASK_ITERS == 0 or i >= end):
                            stat_k[uint64(mask_at + (it - 1) // MASK_ITERS * mask_span)] = \
                                int64(mask)
                            for e in range(W):  # bits e, e + W,...: column e of the word
                                ties[e] += int64(cuda.popc(mask & (ELEMENT_BITS << uint64(e))))
                            mask = uint64(0)
                else:
                    for e in range(W):
                        results[e] = element_fn(cfs[e], cfs[e], ys[e], means[e])
                    w = pack(results)
                    while i < end:
                        store_word(dx, dxv, at, w, 0)
                        i += span
                        at += word_span
                if not STAT_TIES or mode != 3:
                    break
                split += int64(cuda.gridDim.y)
                valid = split < n_splits
            if STAT_TIES and mode == 2:  # this lane's ties, added to the line's count
                for e in range(W):
                    if ow < out_words and ties[e] != 0:
                        cuda.atomic.add(stat_k, (ow << LOG_W) + e, ties[e])
            group += cuda.gridDim.x

    return reduce_backward_cols_vec


# -- the gradients without a statistic over a contiguous dx, in dx's memory order ---------
# dx = element(coefficient(dy, y), x) with dy and y repeated along the axis, written (and x
# read) in 16-byte units (K elements) in dx's memory order, threads numbered along the
# units as torch's elementwise kernels number them.

#: 16-byte units per thread of the broadcast's rows, a block apart.
BROADCAST_UNITS = 2
#: 16-byte units of x in flight per thread of the broadcast's columns (kinds that read x).
BROADCAST_COL_LOADS = 4


def _make_backward_broadcast(kind: ReduceKind, element: ElementKind) -> Callable[..., None]:
    ops = GRAD_OPS[kind]
    spec, vec = ELEMENTS[element], VECTOR[element]
    ACC, load, pack, unpack = spec.acc, spec.load, vec.pack, vec.unpack
    coefficient, element_fn = _grad_fns(kind, element)
    READS_X, READS_Y = ops.reads_x, ops.reads_y
    W = vec.width  # elements per 8-byte word; a unit is 2 words
    K = 2 * W
    U = BROADCAST_UNITS
    L = BROADCAST_COL_LOADS if READS_X else 1
    SLOTS = max(K, U * W)  # per element values: a column unit's K, or W per row unit

    @cuda.jit(device=True, inline=True)
    def line_values(dy, y, dy_off, y_off, param):
        """(coefficient, y) of one output position."""
        g = load(dy, dy_off)
        yv = load(y, y_off) if READS_Y else g
        return ACC(coefficient(g, yv, g, int64(0), param)), yv, g

    @cuda.jit(device=True, inline=True)
    def gradient_word(w, values, results, cfs, yvs, gs, base):
        """The dx word of x word ``w`` whose elements take cfs/yvs/gs[base + e]."""
        unpack(w, values, 0)
        for e in range(W):
            results[e] = element_fn(cfs[base + e], values[e], yvs[base + e], gs[base + e])
        return pack(results)

    def reduce_backward_broadcast(dy, y, xq, dxq, units, line_units, inverse, stride,
                                  dy_stride, y_stride, param):
        """``dx = element(coefficient(dy, y), x)`` (Sum / Mean: ``dy / param``) of a
        C-contiguous, 16-byte aligned dx seen as ``dxq`` (uint32, 4 per unit; ``xq``: x,
        the same layout), ``units`` 16-byte units in all.

        Rows (``stride == 0``; the reduced axis is the last, its extent a whole number
        ``line_units`` of units): unit ``u`` lies in row ``o = u // line_units``
        (``div_f64`` with ``inverse = 1 / line_units``) and takes the values of
        ``dy[o * dy_stride]`` and ``y[o * y_stride]``. Block ``b`` takes units ``b * block
        * U + t + k * block`` (``k < U``, t its thread): their loads first, then their
        stores.

        Columns (``stride > 0``; nothing before the reduced axis, the row after it
        ``line_units`` whole units): element ``j`` of unit ``u`` takes the values of
        ``dy[(n0 + j) * dy_stride]`` and ``y[(n0 + j) * y_stride]`` with ``n0 = (u %
        line_units) * K``. ``stride`` (the threads) is a multiple of ``line_units``, so
        thread ``g`` keeps one column unit: its values once, then units ``g, g + stride,
...``, L loads of x in flight."""
        block = int64(cuda.blockDim.x)
        words = cuda.local.array((U, 2), uint64)
        values = cuda.local.array(W, ACC)
        results = cuda.local.array(W, ACC)
        cfs = cuda.local.array(SLOTS, ACC)
        yvs = cuda.local.array(SLOTS, ACC)
        gs = cuda.local.array(SLOTS, ACC)
        if stride == 0:
            first = int64(cuda.blockIdx.x) * block * U + int64(cuda.threadIdx.x)
            for k in range(U):
                u = first + k * block
                if u < units:
                    o = div_f64(u, line_units, inverse)
                    c, yv, g = line_values(dy, y, o * dy_stride, o * y_stride, param)
                    for e in range(W):
                        cfs[k * W + e] = c
                        yvs[k * W + e] = yv
                        gs[k * W + e] = g
                    if READS_X:
                        words[k, 0], words[k, 1] = load16_words(xq, uint64(u * 4))
            for k in range(U):
                u = first + k * block
                if u < units:
                    if READS_X:
                        low = gradient_word(words[k, 0], values, results, cfs, yvs, gs, k * W)
                        high = gradient_word(words[k, 1], values, results, cfs, yvs, gs,
                                             k * W)
                    else:
                        for e in range(W):
                            results[e] = element_fn(cfs[k * W], cfs[k * W], yvs[k * W],
                                                    gs[k * W])
                        low = high = pack(results)
                    store16_words(dxq, uint64(u * 4), low, high)
            return
        g0 = int64(cuda.blockIdx.x) * block + int64(cuda.threadIdx.x)
        if g0 >= stride:
            return
        n0 = (g0 % line_units) * K
        for e in range(K):
            cfs[e], yvs[e], gs[e] = line_values(dy, y, (n0 + e) * dy_stride,
                                                (n0 + e) * y_stride, param)
        if not READS_X:
            for h in range(2):
                for e in range(W):
                    results[e] = element_fn(cfs[h * W + e], cfs[h * W + e], yvs[h * W + e],
                                            gs[h * W + e])
                words[0, h] = pack(results)
        held = cuda.local.array((L, 2), uint64)
        u = g0
        while u < units:
            if READS_X:
                for k in range(L):
                    if u + k * stride < units:
                        held[k, 0], held[k, 1] = load16_words(xq, uint64((u + k * stride) * 4))
            for k in range(L):
                v = u + k * stride
                if v < units:
                    if READS_X:
                        low = gradient_word(held[k, 0], values, results, cfs, yvs, gs, 0)
                        high = gradient_word(held[k, 1], values, results, cfs, yvs, gs, W)
                    else:
                        low, high = words[0, 0], words[0, 1]
                    store16_words(dxq, uint64(v * 4), low, high)
            u += L * stride

    return reduce_backward_broadcast


# -- the register-resident gradient (Max/Min, Var/Std of rows that fit on chip) ----------
# The statistic needs the whole row before the first dx value: the lanes of a row load its
# words once into registers (at most VEC_LOADS per lane), reduce the statistic (tie count
# or sum -> mean) across the lanes and write dx from the same registers, so x is read from
# memory once (2 passes: x read, dx written) instead of 3 (statistic, then gradient).


def _row_grad_parts(kind: ReduceKind, element: ElementKind) -> tuple[Any,...]:
    """What the register-resident row gradients (``_make_backward_rows_reg`` and its
    pair) take from the kind and element: the accumulator type, dy/y load, word unpack /
    pack / store, elements per word (and its log 2), ``coefficient`` and ``element_fn``,
    whether y is read, whether there is a statistic and whether it is the tie count, and
    the f16/bf16 tie masks (``TieWords``: whether, then splat / mask / count / select /
    usable, None without)."""
    ops = GRAD_OPS[kind]
    spec = ELEMENTS[element]
    vec = VECTOR[element]
    stat_ties = ops.stat == "ties"
    tie_masks = stat_ties and vec.eq_mask is not None
    ties = _tie_words(element) if tie_masks else None
    tie_parts = (ties.splat, ties.mask, ties.count, ties.select, ties.usable) if ties \
        else (None,) * 5
    return (spec.acc, spec.load, vec.unpack, vec.pack, vec.store_word, vec.width,
            vec.log_width, *_grad_fns(kind, element), ops.reads_y, ops.stat is not None,
            stat_ties, tie_masks, *tie_parts)


def _make_backward_rows_reg(kind: ReduceKind, element: ElementKind) -> Callable[..., None]:
    ops = GRAD_OPS[kind]
    (ACC, load, unpack, pack, store_word, W, LOG_W, coefficient, element_fn, READS_Y, STAT,
     STAT_TIES, TIE_MASKS, splat, tie_mask, tie_count, tie_select, tie_usable) = \
        _row_grad_parts(kind, element)
    WARPS = SHARED_SLOTS // 32  # most warps of one block
    PARTIALS = 2 * WARPS  # two buffers: one barrier per group
    # f32 Var/Std: whole rows load unpredicated, where ptxas sank the predicated loads to
    # their adds.
    # (Measurements: docs/design/reduce.md, "Measured constants".)
    WHOLE_LOADS = ops.stat == "mean" and element.byte_width == 4

    def reduce_backward_rows_reg(dy, xv, y, dx, dxv, out_numel, extent, row_words, dy_stride,
                                 y_stride, log2_lanes, param):
        """The Max/Min (tie count: ``count = #(x == y)``) or Var/Std (``mean = sum(x) /
        extent``) gradient of ``out_numel`` word-aligned contiguous rows of ``extent``
        elements (a multiple of W, at most ``lanes * VEC_LOADS`` words), ``row_words`` words
        apart in both ``x`` and ``dx``: ``lanes = 2**log2_lanes`` lanes per row
        (consecutive threads) hold the row's words in registers, lane ``l`` the words ``l +
        u * lanes``; the per-lane totals meet in an xor-shuffle butterfly (every lane gets
        the same value), then, for rows wider than a warp, the warps' totals in shared
        memory in warp order (a fixed order: deterministic). The kinds without a statistic
        (Prod, Norm2, LogSumExp: ``dx = element(coefficient(dy, y), x)``) skip the totals:
        every load of the row in flight at once, then every store."""
        # in-row indices are 32-bit (a row holds at most 256 * VEC_LOADS words) and lanes
        # is a power of two. Registers (ptxas, sm_90): 45-51, 4-5 resident blocks per SM;
        # with 64-bit index math about twice that.
        # (Measurements: docs/design/reduce.md, "Measured constants".)
        tid = uint32(cuda.threadIdx.x)
        log_lanes = uint32(log2_lanes)
        lanes = uint32(1) << log_lanes
        lane = tid & (lanes - uint32(1))
        slot = tid >> log_lanes
        slots = uint32(cuda.blockDim.x) >> log_lanes
        row_warps = lanes >> uint32(5)  # > 1: the row spans several warps
        partial = cuda.shared.array(PARTIALS, ACC)
        words = cuda.local.array(VEC_LOADS, uint64)
        values = cuda.local.array(W, ACC)
        results = cuda.local.array(W, ACC)
        nvec = uint32(extent >> LOG_W)
        # words of the row this lane holds (the same for every row)
        mine = uint32(uint32(nvec + lanes - uint32(1) - lane) >> log_lanes) if lane < nvec \
            else uint32(0)
        parity = uint32(0)
        group = int64(cuda.blockIdx.x)
        while group * slots < out_numel:  # uniform across the block
            o = group * slots + slot
            valid = o < out_numel
            g = load(dy, o * dy_stride) if valid else ACC(0)
            yv = load(y, o * y_stride) if READS_Y and valid else g
            at = uint64(o * row_words) + uint64(lane)
            held = mine if valid else uint32(0)
            # every load of the row in flight at once: unpredicated where every row of the
            # block is whole (ptxas sank the predicated loads to their use)
            if WHOLE_LOADS and mine == uint32(VEC_LOADS) and (group + 1) * slots <= out_numel:
                for u in range(VEC_LOADS):
                    words[u] = xv[at + uint64(uint32(u) << log_lanes)]
            else:
                for u in range(VEC_LOADS):
                    if u < held:
                        words[u] = xv[at + uint64(uint32(u) << log_lanes)]
            total = ACC(0)
            masks = False  # the ties from equality masks (f16/bf16; bf16 on sm_90)
            yw = uint64(0)
            if TIE_MASKS:
                masks = tie_usable()
                if masks:
                    yw = splat(yv, results)
                    n = int32(0)
                    for u in range(VEC_LOADS):
                        if u < held:
                            n += tie_count(tie_mask(words[u], yw))
                    total = ACC(n)
            if STAT:
                for u in range(VEC_LOADS):
                    if u < held and not masks:
                        unpack(words[u], values, 0)
                        for e in range(W):
                            if STAT_TIES:
                                total += ACC(1) if values[e] == yv else ACC(0)
                            else:
                                total += values[e]
                width = min(lanes, uint32(32)) >> uint32(1)
                while width >= uint32(1):  # a + b == b + a: both lanes of a pair: one sum
                    total += shfl_xor(total, width)
                    width = uint32(width >> uint32(1))
                if row_warps > uint32(1):
                    if tid & uint32(31) == uint32(0):
                        partial[uint32(parity * uint32(WARPS) + (tid >> uint32(5)))] = total
                    cuda.syncthreads()
                    first = uint32(parity * uint32(WARPS) + slot * row_warps)
                    total = partial[first]
                    for w in range(1, row_warps):
                        total += partial[uint32(first + uint32(w))]
                    parity = uint32(parity ^ uint32(1))
            mean = g
            count = int64(0)
            if STAT_TIES:
                count = int64(total)
            elif STAT:
                mean = total / ACC(extent)
            cf = ACC(coefficient(g, yv, mean, count, param))
            if TIE_MASKS and masks:  # each element cf where it ties, else cf - cf
                cw = splat(cf, results)
                zw = splat(cf - cf, results)
                for u in range(VEC_LOADS):
                    if u < held:
                        store_word(dx, dxv, at + uint64(uint32(u) << log_lanes),
                                   tie_select(tie_mask(words[u], yw), cw, zw), 0)
            for u in range(VEC_LOADS):
                if u < held and not masks:
                    unpack(words[u], values, 0)
                    for e in range(W):
                        results[e] = element_fn(cf, values[e], yv, mean)
                    w = pack(results)
                    store_word(dx, dxv, at + uint64(uint32(u) << log_lanes), w, 0)
            group += cuda.gridDim.x

    return reduce_backward_rows_reg


#: Threads of the hold gradient's blocks (a power of two, at most SHARED_SLOTS).
#: (Measurements: docs/design/reduce.md, "Measured constants".)
SYNC_BLOCK = 64 if SIMULATOR else 256
#: A published chunk partial: the bits of the f64 total, inverted (0 = not yet written; a
#: NaN total is written as the canonical NaN, whose inverse is not 0).
_CANONICAL_NAN_BITS = int64(0x7FF8000000000000)


@cuda.jit(device=True, inline=True)
def _block_total(value, sums, tid, block):
    """The f64 sum of ``value`` over the block (``sums``: one shared f64 per warp), in a
    fixed order, for every thread. The whole block calls it (two block barriers)."""
    width = 16
    while width >= 1:  # xor butterfly: every lane ends with the same sum
        value += shfl_xor(value, width)
        width >>= 1
    if tid & 31 == 0:
        sums[tid >> 5] = value
    cuda.syncthreads()
    total = float64(0)
    for w in range(block >> 5):
        total += sums[w]
    cuda.syncthreads()  # sums is free again
    return total


@cuda.jit(device=True, inline=True)
def _block_totals2(a, b, sums, tid, block):
    """``(_block_total(a), _block_total(b))`` (the same additions in the same order, so
    the same bits) in one pass: two barriers, not four (``sums``: two f64 per warp)."""
    width = 16
    while width >= 1:
        a += shfl_xor(a, width)
        b += shfl_xor(b, width)
        width >>= 1
    warps = block >> 5
    if tid & 31 == 0:
        sums[tid >> 5] = a
        sums[warps + (tid >> 5)] = b
    cuda.syncthreads()
    total_a = float64(0)
    total_b = float64(0)
    for w in range(warps):
        total_a += sums[w]
        total_b += sums[warps + w]
    cuda.syncthreads()  # sums is free again
    return total_a, total_b


@cuda.jit(device=True, inline=True)
def _first_ticket(ctl, shared_t, tid):
    """The block's first work item: thread 0 takes ticket ``ctl[0]`` (an atomic counter,
    zero before the launch) and the block reads it from ``shared_t[0]``."""
    if tid == 0:
        shared_t[0] = cuda.atomic.add(ctl, 0, int64(1))
    cuda.syncthreads()
    return shared_t[0]


@cuda.jit(device=True, inline=True)
def _publish_partial(partials, k, chunk_total, tid):
    """Thread 0 publishes chunk ``k``'s f64 total: its bits inverted, one atomic exchange
    (the value is its own ready flag; a NaN total as the canonical NaN)."""
    if tid == 0:
        if chunk_total != chunk_total:
            bits = _CANONICAL_NAN_BITS
        else:
            bits = bitcast(chunk_total, int64)
        cuda.atomic.exch(partials, k, ~bits)


def _make_row_total(read: Any, slots: int) -> Any:
    """``row_total(partials, row, parts, sums, tid, block)``: the f64 sum of ``row``'s
    ``parts`` published chunk totals, each read by ``read(partials, k)`` until every one is
    published, added in a fixed order (the same for every chunk of the row), for every
    thread. The whole block calls it. ``slots`` 0: a thread reads totals ``tid``, ``tid +
    block``,... (any ``parts``); else exactly ``slots`` of them, unrolled (``parts`` at
    most ``slots * block``: a loop of unknown count was unrolled by the compiler, 32 reads
    a thread, and spilled)."""
    SLOTS = slots

    @cuda.jit(device=True, inline=True)
    def add_partial(partials, k, row_total, published):
        bits = read(partials, k)
        return row_total + bitcast(~bits, float64), published & (bits != 0)

    @cuda.jit(device=True, inline=True)
    def row_total_fn(partials, row, parts, sums, tid, block):
        step = int64(block)
        while True:
            row_total = float64(0)
            published = True
            if SLOTS:
                for i in range(SLOTS):
                    q = int64(tid) + i * step
                    if q < parts:
                        row_total, published = add_partial(partials, row * parts + q,
                                                           row_total, published)
            else:
                q = int64(tid)
                while q < parts:
                    row_total, published = add_partial(partials, row * parts + q,
                                                       row_total, published)
                    q += step
            if cuda.syncthreads_and(int32(published)):
                break
        return _block_total(row_total, sums, tid, block)

    return row_total_fn


#: Chunk totals a thread of the hold kernels reads (a row's parts <= HOLD_POLL_SLOTS *
#: SYNC_BLOCK: the plan's rule).
HOLD_POLL_SLOTS = 2
#: The hold kernels' wait: relaxed loads (``load_relaxed``), HOLD_POLL_SLOTS a thread.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
_row_total_held = _make_row_total(load_relaxed, HOLD_POLL_SLOTS)


def _row_statistic(kind: ReduceKind, element: ElementKind) -> tuple[Any, Any, Any]:
    """``(row_saved, term, row_coefficient)`` of the gradients with a row statistic (a
    sum over the row): Var/Std ``dx = c * (x - mean)``, ``mean = total / extent``, the
    total a sum of x; Max/Min ``dx = (dy / count) * (x == y)``, the total a count of the
    ties ``x == y`` (exact in f64). ``row_saved(dy, y, row, dy_stride, y_stride)`` loads
    the row's ``(dy, y)`` (y is dy where the kind does not read it); ``term(v, yv)`` is
    an element's share of the total, in the element's accumulator; ``row_coefficient(g,
    yv, row_total, extent, param)`` gives the row's ``(c, y, mean)`` from them and the
    row's f64 total (``mean`` 0 for the ties)."""
    ops = GRAD_OPS[kind]
    assert ops.stat in ("mean", "ties")
    spec = ELEMENTS[element]
    ACC = spec.acc
    load = spec.load
    coefficient = _grad_fns(kind, element)[0]
    READS_Y = ops.reads_y
    TIES_STAT = ops.stat == "ties"

    @cuda.jit(device=True, inline=True)
    def row_saved(dy, y, row, dy_stride, y_stride):
        g = load(dy, row * dy_stride)
        return g, load(y, row * y_stride) if READS_Y else g

    @cuda.jit(device=True, inline=True)
    def term(v, yv):
        if TIES_STAT:
            return ACC(1) if v == yv else ACC(0)
        return v

    @cuda.jit(device=True, inline=True)
    def row_coefficient(g, yv, row_total, extent, param):
        if TIES_STAT:
            return ACC(coefficient(g, yv, ACC(0), int64(row_total), param)), yv, ACC(0)
        mean = ACC(row_total / float64(extent))
        return ACC(coefficient(g, yv, mean, int64(0), param)), yv, mean

    return row_saved, term, row_coefficient


#: Words per thread of one part of a hold chunk (registers; the second part is the
#: stash): the part of the plan's layout (``_SYNC_BATCHES`` batches of VEC_LOADS words,
#: plans.reduce, which asserts they match).
HOLD_WORDS = (1 if SIMULATOR else 2) * VEC_LOADS
#: Dynamic shared memory of a ``reduce_backward_rows_hold_stash`` block: HOLD_WORDS more
#: words a thread, copied by ``cp.async`` (no register) with the register loads in
#: flight. (Measurements: docs/design/reduce.md, "Measured constants".)
HOLD_STASH_BYTES = HOLD_WORDS * SYNC_BLOCK * 8


#: Register cap of the hold kernels: four 256-thread blocks per SM.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
HOLD_MAX_REGISTERS = 64
#: The hold kernels' blocks start in HOLD_PHASES phases (by block index), phase k
#: HOLD_PHASE_NS * k late, where the grid takes at least HOLD_PHASE_WAVES tickets a block.
#: A grid started at once loads its first rows together, so they complete together and
#: their blocks take the next rows together (a trace: blocks waited 31-44 % of their
#: time); the phases spread the rows' completions.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
HOLD_PHASES = 4
HOLD_PHASE_NS = 2500
HOLD_PHASE_WAVES = 4


def _make_backward_rows_hold(kind: ReduceKind, element: ElementKind,
                             stash: int) -> Callable[..., None]:
    STASH = stash  # words a thread parks in dynamic shared memory (cp.async): 0 or HOLD_WORDS
    PHASES = 1 if SIMULATOR else HOLD_PHASES
    assert STASH in (0, HOLD_WORDS)
    HALVES = 2 if STASH else 1  # parts (partials) a chunk of this kernel spans
    SUMS = 2 * (SHARED_SLOTS // 32)  # _block_totals2's two f64 a warp
    vec = VECTOR[element]
    ACC = ELEMENTS[element].acc
    unpack, pack, store_word = vec.unpack, vec.pack, vec.store_word
    W, LOG_W = vec.width, vec.log_width
    element_fn = _grad_fns(kind, element)[1]
    row_saved, term, row_coefficient = _row_statistic(kind, element)
    copy_stash = copy_async8_run(STASH, SYNC_BLOCK)
    # Every kind loads the row's dy (and y) with the chunk, not after the wait (Max/Min
    # need y for their sum anyway).
    # (Measurements: docs/design/reduce.md, "Measured constants".)

    def reduce_backward_rows_hold(dy, xv, y, dx, dxv, ctl, partials, out_numel, extent,
                                  row_words, dy_stride, y_stride, parts, param):
        """The gradient of ``out_numel`` long word-aligned rows, ``row_words`` words apart,
        whose row statistic is a sum over the row (``_row_statistic``): Var/Std ``dx = c *
        (x - mean)`` (``mean = sum(x) / extent``), Max/Min ``dx = (dy / count) * (x == y)``
        (``count`` the row's ties ``x == y``), with x read once. Each row is cut into the
        plan's ``parts`` parts of ``HOLD_WORDS * blockDim`` words; this kernel's chunk is
        ``HALVES`` of them (the second parked in shared memory), numbered row by row and
        handed out in ticket order (``ctl[0]``). A chunk's block loads its words (into
        registers; with the stash the second half by ``cp.async`` into shared memory), sums
        each half's terms, publishes their f64 totals in ``partials`` (one a part), waits
        until its row's ``parts`` totals are all published (relaxed loads, HOLD_POLL_SLOTS a
        thread), adds them in a fixed order and writes its chunk of ``dx`` from registers
        and shared memory. The blocks start in HOLD_PHASES phases, HOLD_PHASE_NS apart,
        where the grid takes HOLD_PHASE_WAVES tickets a block or more.

        A chunk waits for chunks with larger tickets, so the row's other chunks must be
        resident at once. A block takes its next ticket only after its row's total is in
        (while it stores), so a waiting block holds one ticket; with a row's chunks no
        more than the resident blocks, the lowest unfinished ticket's row then always has
        every chunk taken by a running block (the plan takes this kernel only where a
        row's chunks are at most a quarter (Max/Min: an eighth) of the device's resident
        blocks, or half when forced, or a row is one chunk). The plan launches it
        cooperatively (``cuLaunchCooperativeKernel``), so every block of its grid (at most
        the resident blocks) runs at once whatever else shares the device; a grid the
        device cannot hold fails to launch rather than waiting (``plan.row_hold = False``
        takes the statistic pass and the word rows, or Max/Min's tie count after dx).
        ``ctl`` and ``partials`` are zero before the launch; the block is SYNC_BLOCK
        threads (a constant here: the words' offsets are immediates)."""
        tid = cuda.threadIdx.x
        block = SYNC_BLOCK  # the launch's block: the words' offsets are immediates
        shared_t = cuda.shared.array(1, int64)
        sums = cuda.shared.array(SUMS, float64)
        words = cuda.local.array(HOLD_WORDS, uint64)
        values = cuda.local.array(W, ACC)
        results = cuda.local.array(W, ACC)
        parked = cuda.shared.array(0, uint64)
        nvec = extent >> LOG_W
        step = int64(block)
        chunk = step * (HOLD_WORDS + STASH)
        chunks = (parts + (HALVES - 1)) // HALVES  # this kernel's chunks a row
        n = out_numel * chunks
        if tid == 0 and PHASES > 1 and n >= HOLD_PHASE_WAVES * int64(cuda.gridDim.x):
            # phase k of PHASES (by block index) starts k * HOLD_PHASE_NS late
            wait_ns(HOLD_PHASE_NS * ((int64(cuda.blockIdx.x) * PHASES)
                                     // int64(cuda.gridDim.x)))
        t = _first_ticket(ctl, shared_t, tid)
        while t < n:  # uniform across the block
            row = t // chunks
            part = (t - row * chunks) * HALVES  # the part of the first half
            at = uint64(row * row_words)
            j = (t - row * chunks) * chunk + tid
            # The chunk's loops are written out here, against a thread's word count:
            # through _mean_grad_batches' helpers (bounds j + u·step < end) the kernel ran
            # slower. (Measurements: docs/design/reduce.md, "Measured constants".)
            count = min(nvec - (j - tid), chunk)  # words of this chunk
            # the thread's words left in it: 32-bit bounds against immediates (64-bit
            # tid + u·step bounds were hoisted out of the loop, 32 registers, and spilled)
            left = int32(count - tid)
            # the thread's first stash slot, hidden from the compiler: the slots' shared
            # addresses then stay an immediate from one register (hoisted out of the
            # ticket loop they were 16 registers for the whole kernel: f32 Var spilled
            # 64 bytes at the 64-register cap, against none now; ptxas -v, sm_90)
            slot = opaque(int32(tid))
            # every word of a full chunk: the loads unpredicated. Predicated, ptxas (sm_90,
            # 64 registers) sank f32 loads to their sums, a few in flight at a time.
            # (Measurements: docs/design/reduce.md, "Measured constants".)
            if left > (HOLD_WORDS + STASH - 1) * SYNC_BLOCK:
                copy_stash(parked, slot, xv, at + uint64(j + HOLD_WORDS * step))
                for u in range(HOLD_WORDS):
                    words[u] = xv[at + uint64(j + u * step)]
            else:
                for u in range(STASH):
                    if int32((HOLD_WORDS + u) * SYNC_BLOCK) < left:
                        copy_async8(parked, u * SYNC_BLOCK + slot, xv,
                                    at + uint64(j + (HOLD_WORDS + u) * step))
                for u in range(HOLD_WORDS):  # all in flight at once
                    if int32(u * SYNC_BLOCK) < left:
                        words[u] = xv[at + uint64(j + u * step)]
            g, yv = row_saved(dy, y, row, dy_stride, y_stride)  # in flight with the chunk
            total = ACC(0)
            for u in range(HOLD_WORDS):
                if int32(u * SYNC_BLOCK) < left:
                    unpack(words[u], values, 0)
                    for e in range(W):
                        total += term(values[e], yv)
            if STASH:
                copy_async_wait()
                second = ACC(0)
                for u in range(STASH):  # the thread's own slots: no barrier
                    if int32((HOLD_WORDS + u) * SYNC_BLOCK) < left:
                        unpack(parked[u * SYNC_BLOCK + slot], values, 0)
                        for e in range(W):
                            second += term(values[e], yv)
                first_total, second_total = _block_totals2(float64(total), float64(second),
                                                           sums, tid, block)
                _publish_partial(partials, row * parts + part, first_total, tid)
                if part + 1 < parts:
                    _publish_partial(partials, row * parts + part + 1, second_total, tid)
            else:
                _publish_partial(partials, row * parts + part,
                                 _block_total(float64(total), sums, tid, block), tid)
            row_total = _row_total_held(partials, row, parts, sums, tid, block)
            # the next ticket, in flight during the stores: taken only now, once this
            # chunk waits for nothing (a ticket taken before the wait would be a chunk
            # that no block starts while its holder waits, perhaps for that very chunk)
            if tid == 0:
                shared_t[0] = cuda.atomic.add(ctl, 0, int64(1))
            cf, yv, mean = row_coefficient(g, yv, row_total, extent, param)
            for u in range(HOLD_WORDS):
                if int32(u * SYNC_BLOCK) < left:
                    unpack(words[u], values, 0)
                    for e in range(W):
                        results[e] = element_fn(cf, values[e], yv, mean)
                    store_word(dx, dxv, at + uint64(j + u * step), pack(results), 0)
            for u in range(STASH):
                if int32((HOLD_WORDS + u) * SYNC_BLOCK) < left:
                    unpack(parked[u * SYNC_BLOCK + slot], values, 0)
                    for e in range(W):
                        results[e] = element_fn(cf, values[e], yv, mean)
                    store_word(dx, dxv, at + uint64(j + (HOLD_WORDS + u) * step),
                               pack(results), 0)
            cuda.syncthreads()  # shared_t holds the next ticket
            t = shared_t[0]

    return reduce_backward_rows_hold


#: Rows (words) each thread of the column register-resident gradient holds, and its block:
#: a 1024-thread block holds 4096 rows of a 32-byte strip of columns (128 KB of registers).
REG_COL_WORDS = 16
REG_COLS_BLOCK = 64 if SIMULATOR else 1024
#: (column word, element) pairs of one tile at most: one warp lane per pair in the combine
#: (up to 32), or each thread adding its own pairs' warp partials (up to 64, in blocks of
#: at most REG_COLS_WIDE_BLOCK threads).
_REG_COL_PAIRS = 32
REG_COL_WIDE_PAIRS = 64
REG_COLS_WIDE_BLOCK = 64 if SIMULATOR else 256
#: The 256-byte strips of short columns (``REDUCE_BACKWARD_COLS_STRIP_KERNELS``): the
#: column words of a strip, the rows each thread holds, and the largest block (at most
#: 256 rows on the GPU: 8 row lanes of 32 rows).
REG_COL_STRIP_WORDS = 32
REG_COL_STRIP_HELD = 32
REG_COLS_STRIP_BLOCK = 64 if SIMULATOR else 256


def _make_backward_cols_reg(kind: ReduceKind, element: ElementKind, stash: int = 0,
                            wide_words: int = 0,
                            held: int = REG_COL_WORDS) -> Callable[..., None]:
    ops = GRAD_OPS[kind]
    spec = ELEMENTS[element]
    vec = VECTOR[element]
    ACC = spec.acc
    load = spec.load
    unpack, pack, store_word = vec.unpack, vec.pack, vec.store_word
    W, LOG_W = vec.width, vec.log_width
    coefficient, element_fn = _grad_fns(kind, element)
    READS_Y = ops.reads_y
    STAT_TIES = ops.stat == "ties"
    SLOTS = max(REG_COLS_BLOCK // 32 * _REG_COL_PAIRS,  # one buffer of warp partials
                REG_COLS_WIDE_BLOCK // 32 * REG_COL_WIDE_PAIRS,
                REG_COLS_STRIP_BLOCK // 32 * REG_COL_STRIP_WORDS * _MAX_WIDTH)
    PARTIALS = 2 * SLOTS
    STASH = stash
    HELD = held
    # strips of up to ``wide_words`` words may hold more than 32 pairs (16-word f16/bf16
    # strips: 64; 32-word f32 strips: 64, f16/bf16: 128)
    WIDE = wide_words * W > _REG_COL_PAIRS
    assert STASH % HELD == 0, "the stash is loaded HELD words at a time"

    def reduce_backward_cols_reg(dy, xv, y, dx, dxv, out_numel, extent, axis_words,
                                 dy_stride, y_stride, log2_cw, param):
        """The Max/Min or Var/Std gradient (statistic as ``reduce_backward_rows_reg``) in
        the column layout: ``x`` and ``dx`` are ``extent`` rows of ``out_numel`` contiguous
        outputs, ``axis_words`` words apart (word aligned). A block owns ``cw = 2**log2_cw``
        consecutive words of outputs (a strip of columns) over every row: thread ``t``
        holds column word ``t % cw`` of rows ``t // cw + u * (block / cw)``, u <
        REG_COL_WORDS, in registers. The column totals meet in xor shuffles within each
        warp, then every warp adds the warps' partials from shared memory in warp order
        (fixed order: deterministic) and broadcasts them by shuffles; a strip of more than
        32 (word, element) pairs (16 f16/bf16 words) has each thread add its own pairs'
        partials instead, in the same order.

        With ``STASH`` > 0 (a multiple of HELD = REG_COL_WORDS) a thread holds rows u <
        STASH + HELD: the first STASH parked in dynamic shared memory (``STASH *
        REG_COLS_BLOCK`` words, slot ``u * REG_COLS_BLOCK + t``: private to the thread,
        no barrier; a compile-time stride keeps the addresses immediate offsets), the
        rest in registers. The stash goes HELD loads at a time (loaded, counted,
        parked), then the register rows are loaded. A block then holds a strip twice as
        wide (64 instead of 32 bytes of each of 4096 rows), which the memory serves
        faster. Without a stash a thread holds HELD rows, every load in flight at once."""
        tid = uint32(cuda.threadIdx.x)
        log_cw = uint32(log2_cw)
        cws = uint32(1) << log_cw
        cw = tid & (cws - uint32(1))
        rl = tid >> log_cw
        row_lanes = uint32(cuda.blockDim.x) >> log_cw
        pairs = cws * uint32(W)
        log_pairs = log_cw + uint32(LOG_W)
        lane = tid & uint32(31)
        warp = tid >> uint32(5)
        warps = uint32(cuda.blockDim.x) >> uint32(5)
        out_words = out_numel >> LOG_W
        rows = uint32(extent)
        mine = uint32(uint32(rows + row_lanes - uint32(1) - rl) // row_lanes) if rl < rows \
            else uint32(0)
        step = uint64(row_lanes) * uint64(axis_words)
        partial = cuda.shared.array(PARTIALS, ACC)
        parked = cuda.shared.array(0, uint64)
        words = cuda.local.array(HELD, uint64)
        values = cuda.local.array(W, ACC)
        results = cuda.local.array(W, ACC)
        totals = cuda.local.array(W, ACC)
        ys = cuda.local.array(W, ACC)
        cfs = cuda.local.array(W, ACC)
        means = cuda.local.array(W, ACC)
        parity = uint32(0)
        group = int64(cuda.blockIdx.x)
        while group * cws < out_words:  # uniform across the block
            ow = group * cws + cw
            valid = ow < out_words
            held = mine if valid else uint32(0)
            at = uint64(rl) * uint64(axis_words) + uint64(ow)
            # the first batch's loads (the whole strip without a stash), then dy and y
            load_words(xv, words, at, step, uint32(0), held)
            for e in range(W):
                o = (ow << LOG_W) + e
                cfs[e] = load(dy, o * dy_stride) if valid else ACC(0)
                ys[e] = load(y, o * y_stride) if READS_Y and valid else ACC(0)
                totals[e] = ACC(0)
            for b in range(STASH // HELD):  # the stash, HELD words at a time
                if b > 0:
                    load_words(xv, words, at, step, uint32(b * HELD), held)
                for u in range(HELD):
                    if uint32(b * HELD + u) < held:
                        count_word(words[u], values, ys, totals)
                        parked[uint32((b * HELD + u) * REG_COLS_BLOCK) + tid] = words[u]
            if STASH:
                load_words(xv, words, at, step, uint32(STASH), held)
            for u in range(HELD):
                if uint32(STASH + u) < held:
                    count_word(words[u], values, ys, totals)
            buffer = parity * uint32(SLOTS)
            for e in range(W):  # the row lanes of a warp (lane bits >= log_cw)
                total = totals[e]
                width = uint32(16)
                while width >= cws:
                    total += shfl_xor(total, width)
                    width = uint32(width >> uint32(1))
                if lane < cws:
                    partial[uint32(buffer + warp * pairs + cw * uint32(W) + uint32(e))] = total
            cuda.syncthreads()
            if WIDE and pairs > uint32(32):  # wide strips (small blocks): each thread adds
                for e in range(W):  # its own columns' warp partials, in warp order
                    total = ACC(0)
                    for w in range(warps):
                        total += partial[uint32(buffer + w * pairs + cw * uint32(W)
                                                + uint32(e))]
                    totals[e] = total
            else:
                # every warp: lane -> pair lane % pairs, adding warps lane // pairs + k *
                # parts
                pair = lane & (pairs - uint32(1))
                parts = uint32(32) >> log_pairs
                total = ACC(0)
                w = lane >> log_pairs
                while w < warps:
                    total += partial[uint32(buffer + w * pairs + pair)]
                    w = uint32(w + parts)
                width = uint32(16)
                while width >= pairs:
                    total += shfl_xor(total, width)
                    width = uint32(width >> uint32(1))
                for e in range(W):  # lane p < pairs holds pair p's total
                    totals[e] = shfl_idx(total, cw * uint32(W) + uint32(e))
            parity = uint32(parity ^ uint32(1))
            for e in range(W):
                g = cfs[e]
                mean = g
                count = int64(0)
                if STAT_TIES:
                    count = int64(totals[e])
                else:
                    mean = totals[e] / ACC(extent)
                cfs[e] = ACC(coefficient(g, ys[e], mean, count, param))
                means[e] = mean
            for u in range(HELD):  # the registers first (free for the stash's loads)
                if uint32(STASH + u) < held:
                    grad_word(dx, dxv, at + uint64(STASH + u) * step, words[u], values,
                              results, cfs, ys, means)
            for u in range(STASH):
                if u < held:
                    grad_word(dx, dxv, at + uint64(u) * step,
                              parked[uint32(u * REG_COLS_BLOCK) + tid], values, results, cfs,
                              ys, means)
            group += cuda.gridDim.x

    @cuda.jit(device=True, inline=True)
    def load_words(xv, words, at, step, first, held):
        """Issue the loads of rows ``first + u`` (u < HELD, below ``held``) into words:
        unpredicated where all HELD are (ptxas then issues them all before their first
        use; predicated, it sank f32 loads to their sums, a few in flight at a time, and
        spilled more, measurably slower: docs/design/reduce.md)."""
        if first + uint32(HELD) <= held:
            for u in range(HELD):
                words[u] = xv[at + uint64(first + uint32(u)) * step]
        else:
            for u in range(HELD):
                if first + uint32(u) < held:
                    words[u] = xv[at + uint64(first + uint32(u)) * step]

    @cuda.jit(device=True, inline=True)
    def count_word(word, values, ys, totals):
        """Add a word's elements (Max/Min: their ties with y) to the column totals."""
        unpack(word, values, 0)
        for e in range(W):
            if STAT_TIES:
                totals[e] += ACC(1) if values[e] == ys[e] else ACC(0)
            else:
                totals[e] += values[e]

    @cuda.jit(device=True, inline=True)
    def grad_word(dx, dxv, at, word, values, results, cfs, ys, means):
        """dx of a word's elements, stored at word ``at``."""
        unpack(word, values, 0)
        for e in range(W):
            results[e] = element_fn(cfs[e], values[e], ys[e], means[e])
        store_word(dx, dxv, at, pack(results), 0)

    return reduce_backward_cols_reg


# -- the exact Prod gradient of lines that hold zeros --------------------------------------


def _make_prod_zero_fixup(element: ElementKind) -> Callable[..., None]:
    spec = ELEMENTS[element]
    ACC = spec.acc
    load, store = spec.load, spec.store

    def reduce_backward_prod_zeros(dy, x, y, dx, out_numel, extent, x_axis_stride,
                                   dx_axis_stride, out_shape, dy_strides, x_strides,
                                   y_strides, dx_strides):
        """Rewrite the Prod gradient of every line whose saved product ``y`` is 0 after
        any layout's ``dy * y / x`` pass: with ``z`` zeros in the line, z == 1 gives
        ``dy * prod(nonzeros)`` at the zero and ``dy * 0`` elsewhere, z >= 2 ``dy * 0``
        everywhere (torch); z == 0 (an underflowed product) keeps ``dy * y / x``.

        A warp takes 32 lines: lane l loads line l's ``y``, and the warp moves on at once
        unless one of them is 0 (one load and five shuffles per 32 lines); each zero line
        is then walked by the whole warp (lanes strided along it, counts and products
        combined by an xor tree: deterministic)."""
        lane = cuda.threadIdx.x % 32
        warps = cuda.blockDim.x // 32
        group = int64(cuda.blockIdx.x) * warps + cuda.threadIdx.x // 32
        while group * 32 < out_numel:  # uniform across the warp
            mine = group * 32 + lane
            flags = int64(0)
            if mine < out_numel:
                _, _, y_off, _ = _offsets4(mine, out_shape, dy_strides, x_strides,
                                           y_strides, dx_strides)
                if load(y, y_off) == 0:
                    flags = int64(1) << lane
            for shift in (16, 8, 4, 2, 1):
                flags |= shfl_xor(flags, shift)
            for j in range(32 if flags != 0 else 0):  # flags: the same on every lane
                if (flags >> j) & 1 == 0:
                    continue
                line = group * 32 + j
                dy_off, x_off, _, dx_off = _offsets4(line, out_shape, dy_strides, x_strides,
                                                     y_strides, dx_strides)
                zeros = int64(0)
                others = ACC(1)
                i = int64(lane)
                while i < extent:
                    v = load(x, x_off + i * x_axis_stride)
                    if v == 0:
                        zeros += 1
                    else:
                        others *= v
                    i += 32
                for shift in (16, 8, 4, 2, 1):
                    zeros += shfl_xor(zeros, shift)
                    others *= shfl_xor(others, shift)
                if zeros > 0:
                    g = load(dy, dy_off)
                    at_zero = g * others if zeros == 1 else g * ACC(0)
                    elsewhere = g * ACC(0)
                    i = int64(lane)
                    while i < extent:
                        v = load(x, x_off + i * x_axis_stride)
                        dx[uint64(dx_off + i * dx_axis_stride)] = store(
                            at_zero if v == 0 else elsewhere)
                        i += 32
            group += int64(cuda.gridDim.x) * warps

    return reduce_backward_prod_zeros


# -- the kernel tables -------------------------------------------------------------------

_TUPLE8 = types.UniTuple(int64, 8)


def flat(dtype: types.Type) -> types.Array:
    """Flat C-contiguous 1-D view (unit stride known at compile time); launch.py passes
    every array as a contiguous (pointer, extent) pair."""
    return types.Array(dtype, 1, "C")


def _kind_name(kind: Any) -> str:
    return kind if isinstance(kind, str) else kind.name.lower()


def _reduce_signature(kind: Any, element: ElementKind) -> tuple[types.Type,...]:
    spec = ELEMENTS[element]
    out = int64 if KIND_OPS[kind].arg else spec.storage
    return (flat(spec.storage), flat(out), flat(spec.acc), flat(int64), flat(spec.storage),
            int64, int64, int64, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64, int64,
            int64, int64, float64)


def _backward_signature(element: ElementKind) -> tuple[types.Type,...]:
    spec = ELEMENTS[element]
    arr = flat(spec.storage)
    return (arr, arr, arr, arr, flat(spec.acc), flat(int64), int64, int64, int64, int64,
            _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64, int64, float64, int64)


#: (kind, element) -> forward kernel (kind: a ReduceKind or TIES).
REDUCE_KERNELS: dict[tuple[Any, ElementKind], Kernel] = {
    (kind, element): Kernel(f"reduce[{_kind_name(kind)},{element.name.lower()}]",
                            _make_reduce(kind, element), _reduce_signature(kind, element))
    for element, kinds in FORWARD_KINDS.items() for kind in kinds
}

#: Kernel kind that computes each gradient kind.
GRAD_KERNEL_KIND = {ReduceKind.SUM: ReduceKind.MEAN, ReduceKind.MIN: ReduceKind.MAX}

#: (kind, element) -> gradient kernel (float element kinds).
REDUCE_BACKWARD_KERNELS: dict[tuple[ReduceKind, ElementKind], Kernel] = {
    (kind, element): Kernel(f"reduce_backward[{_kind_name(kind)},{element.name.lower()}]",
                            _make_backward(kind, element), _backward_signature(element))
    for element in FLOAT_ELEMENTS for kind in GRAD_OPS
}

#: element -> the exact Prod gradient of the lines whose product is 0 (one kernel for every
#: layout: strided line addressing; launched after the ``dy * y / x`` pass).
REDUCE_BACKWARD_PROD_ZEROS_KERNELS: dict[ElementKind, Kernel] = {
    element: Kernel(f"reduce_backward_prod_zeros[{element.name.lower()}]",
                    _make_prod_zero_fixup(element),
                    (flat(ELEMENTS[element].storage),) * 4
                    + (int64, int64, int64, int64, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8))
    for element in FLOAT_ELEMENTS
}


def _vec_reduce_signature(kind: Any, element: ElementKind) -> tuple[types.Type,...]:
    spec = ELEMENTS[element]
    out = int64 if KIND_OPS[kind].arg else spec.storage
    return (flat(spec.storage), flat(uint64), flat(out), flat(spec.acc), flat(int64),
            flat(spec.storage), int64, int64, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64,
            int64, int64, float64, int64)


def _vec_cols_signature(kind: Any, element: ElementKind) -> tuple[types.Type,...]:
    spec = ELEMENTS[element]
    out = int64 if KIND_OPS[kind].arg else spec.storage
    return (flat(uint64), flat(out), flat(spec.acc), flat(int64), flat(spec.storage), int64,
            int64, int64, int64, int64, int64, int64, int64, int64, float64)


def _vec_backward_rows_signature(element: ElementKind) -> tuple[types.Type,...]:
    spec = ELEMENTS[element]
    arr = flat(spec.storage)
    words = flat(uint64)
    return (arr, arr, words, arr, arr, words, flat(spec.acc), flat(int64), int64, int64,
            _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64, float64, int64, int64)


def _vec_backward_cols_signature(element: ElementKind) -> tuple[types.Type,...]:
    spec = ELEMENTS[element]
    arr = flat(spec.storage)
    words = flat(uint64)
    return (arr, words, arr, arr, words, flat(spec.acc), flat(int64), int64, int64, int64,
            int64, int64, int64, int64, float64, int64)


#: Forward kernel kinds of the word kernels: every one but TIES (the Max/Min gradient's
#: tie count, which these layouts take after dx; elsewhere the generic kernel).
VEC_FORWARD_KINDS = {element: tuple(k for k in FORWARD_KINDS[element] if k is not TIES)
                     for element in VECTOR}

#: (kind, element) -> contiguous-row forward kernel with word loads (the float kinds of
#: the VECTOR elements).
REDUCE_ROWS_VEC_KERNELS: dict[tuple[Any, ElementKind], Kernel] = {
    (kind, element): Kernel(f"reduce_rows_vec[{_kind_name(kind)},{element.name.lower()}]",
                            _make_reduce_rows_vec(kind, element),
                            _vec_reduce_signature(kind, element),
                            max_registers=VEC_MAX_REGISTERS)
    for element in VECTOR for kind in VEC_FORWARD_KINDS[element]
}

#: (kind, element) -> the same kernel whose short-row path parks each thread's next row
#: (``park``; LONG_SHORT_KINDS, which the plans give it for rows of at least
#: PARK_MIN_LANES lanes). A kernel of its own: with both short-row paths in one kernel,
#: ptxas spilled more and 4-lane rows were slower (docs/design/reduce.md).
REDUCE_ROWS_PARK_KERNELS: dict[tuple[Any, ElementKind], Kernel] = {
    (kind, element): Kernel(f"reduce_rows_park[{_kind_name(kind)},{element.name.lower()}]",
                            _make_reduce_rows_vec(kind, element, park=True),
                            _vec_reduce_signature(kind, element),
                            max_registers=VEC_MAX_REGISTERS)
    for element in VECTOR for kind in LONG_SHORT_KINDS
}

#: (kind, element) -> column-layout forward kernel with word loads.
REDUCE_COLS_VEC_KERNELS: dict[tuple[Any, ElementKind], Kernel] = {
    (kind, element): Kernel(f"reduce_cols_vec[{_kind_name(kind)},{element.name.lower()}]",
                            _make_reduce_cols_vec(kind, element),
                            _vec_cols_signature(kind, element),
                            max_registers=VEC_MAX_REGISTERS)
    for element in VECTOR for kind in VEC_FORWARD_KINDS[element]
}

#: Register caps of the contiguous-row gradient kernels, per kind (the others uncapped).
#: Prod / Norm2 / LogSumExp use 77-80 registers uncapped (3 resident 256-thread blocks per
#: SM) and 63-64 without spilling at 64 (4 blocks).
#: (Measurements: docs/design/reduce.md, "Measured constants".)
GRAD_ROWS_MAX_REGISTERS = {ReduceKind.PROD: 64, ReduceKind.NORM2: 64,
                           ReduceKind.LOG_SUM_EXP: 64, ReduceKind.MAX: 128}

#: (kind, element) -> contiguous-row gradient kernel with word loads and stores.
REDUCE_BACKWARD_ROWS_VEC_KERNELS: dict[tuple[ReduceKind, ElementKind], Kernel] = {
    (kind, element): Kernel(
        f"reduce_backward_rows_vec[{_kind_name(kind)},{element.name.lower()}]",
        _make_backward_rows_vec(kind, element), _vec_backward_rows_signature(element),
        max_registers=GRAD_ROWS_MAX_REGISTERS.get(kind))
    for element in VECTOR for kind in GRAD_OPS
}

#: (kind, element) -> column-layout gradient kernel with word loads and stores (Max/Min:
#: modes 0 and 2).
REDUCE_BACKWARD_COLS_VEC_KERNELS: dict[tuple[ReduceKind, ElementKind], Kernel] = {
    (kind, element): Kernel(
        f"reduce_backward_cols_vec[{_kind_name(kind)},{element.name.lower()}]",
        _make_backward_cols_vec(kind, element), _vec_backward_cols_signature(element))
    for element in VECTOR for kind in GRAD_OPS
}

#: (kind, element) -> the gradient without a statistic of a contiguous dx in dx's memory
#: order (rows and columns; Sum / Mean: a broadcast of dy). Mean's is held at 32 registers
#: (ptxas alone: f16 / bf16 34 uncapped, 32 capped without spilling; f32 30): 2048
#: resident threads per SM.
BROADCAST_MAX_REGISTERS = {ReduceKind.MEAN: 32}
REDUCE_BACKWARD_BROADCAST_KERNELS: dict[tuple[ReduceKind, ElementKind], Kernel] = {
    (kind, element): Kernel(
        f"reduce_backward_broadcast[{_kind_name(kind)},{element.name.lower()}]",
        _make_backward_broadcast(kind, element),
        (flat(ELEMENTS[element].storage), flat(ELEMENTS[element].storage), flat(uint32),
         flat(uint32), int64, int64, float64, int64, int64, int64, float64),
        max_registers=BROADCAST_MAX_REGISTERS.get(kind))
    for element in VECTOR for kind, ops in GRAD_OPS.items() if ops.stat is None
}

#: (kind, element) -> the rewrite pass (mode 3) of the column tie count after dx, Max/Min.
#: Held at 128 registers (f16/bf16 take 154 uncapped in ``ptxas``, with its 8 masks in
#: flight.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
REDUCE_BACKWARD_COLS_REWRITE_KERNELS: dict[tuple[ReduceKind, ElementKind], Kernel] = {
    (kind, element): Kernel(
        f"reduce_backward_cols_rewrite[{_kind_name(kind)},{element.name.lower()}]",
        _make_backward_cols_vec(kind, element, rewrite_pass=True),
        _vec_backward_cols_signature(element), max_registers=128)
    for element in VECTOR for kind in GRAD_OPS if GRAD_OPS[kind].stat == "ties"
}


def _reg_backward_signature(element: ElementKind) -> tuple[types.Type,...]:
    spec = ELEMENTS[element]
    arr = flat(spec.storage)
    words = flat(uint64)
    return (arr, words, arr, arr, words, int64, int64, int64, int64, int64, int32, float64)


#: Gradient kinds with a per-row statistic (Max/Min: tie count, Var/Std: mean).
STAT_GRAD_KINDS = tuple(kind for kind, ops in GRAD_OPS.items() if ops.stat is not None)
#: Gradients without a statistic that read x (``dx = element(coefficient(dy, y), x)``).
STREAM_GRAD_KINDS = tuple(kind for kind, ops in GRAD_OPS.items()
                          if ops.stat is None and ops.reads_x)

#: (kind, element) -> register-resident gradient of word-aligned rows that fit in the
#: registers of one block (x read once).
REDUCE_BACKWARD_ROWS_REG_KERNELS: dict[tuple[ReduceKind, ElementKind], Kernel] = {
    (kind, element): Kernel(
        f"reduce_backward_rows_reg[{_kind_name(kind)},{element.name.lower()}]",
        _make_backward_rows_reg(kind, element), _reg_backward_signature(element))
    for element in VECTOR for kind in STAT_GRAD_KINDS + STREAM_GRAD_KINDS
}
def _hold_signature(element: ElementKind) -> tuple[types.Type,...]:
    spec = ELEMENTS[element]
    arr = flat(spec.storage)
    words = flat(uint64)
    return (arr, words, arr, arr, words, flat(int64), flat(int64), int64, int64, int64,
            int64, int64, int64, float64)


#: (kind, element) -> the Var/Std and Max/Min gradients (Min is Max's kernel) of long
#: word-aligned rows with x read once: each chunk (two of the plan's ``_sync_layout``
#: parts) held in registers and, its second half, in shared memory (HOLD_STASH_BYTES a
#: block) until its row's total is published.
REDUCE_BACKWARD_ROWS_HOLD_STASH_KERNELS: dict[tuple[ReduceKind, ElementKind], Kernel] = {
    (kind, element): Kernel(
        f"reduce_backward_rows_hold_stash[{_kind_name(kind)},{element.name.lower()}]",
        _make_backward_rows_hold(kind, element, HOLD_WORDS),
        _hold_signature(element), max_registers=HOLD_MAX_REGISTERS)
    for element in VECTOR for kind in (ReduceKind.VAR, ReduceKind.STD, ReduceKind.MAX)
}


def _cols_reg_kernels(name: str, max_registers: int, stash: int = 0, wide_words: int = 0,
                      held: int = REG_COL_WORDS) -> dict[tuple[ReduceKind, ElementKind], Kernel]:
    """The column register-resident gradients of one table: ``wide_words`` > 0 for strips
    of up to that many words whose pairs may exceed 32 (each thread then adds its own
    pairs' warp partials), ``held`` rows a thread in registers."""
    return {(kind, element): Kernel(f"{name}[{_kind_name(kind)},{element.name.lower()}]",
                                    _make_backward_cols_reg(kind, element, stash, wide_words,
                                                            held),
                                    _reg_backward_signature(element),
                                    max_registers=max_registers)
            for element in VECTOR for kind in STAT_GRAD_KINDS}


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
REDUCE_BACKWARD_COLS_STASH_KERNELS = _cols_reg_kernels("reduce_backward_cols_stash", 64,
                                                       REG_COL_STASH)
