"""The per-kind and per-element tables of the reductions: element loads/stores, the forward
state functions (``KIND_OPS``), the gradient formulas (``GRAD_OPS``) and index helpers.
"""


import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32, int64, types, uint16, uint64
from numba.cuda import libdevice

from ..._runtime import SIMULATOR
from ...types import ElementKind, ReduceKind
from ..common import (
    MAX_RANK,
    div_mod,
    load_bf16,
    load_f16,
    load_same,
    max_nan_f32,
    min_nan_f32,
    nan_max,
    nan_min,
    rcp_approx_ftz_f32,
    store_bf16,
    to_f16,
    to_f32,
    to_f64,
)

#: Shared-array capacity: the largest block the kernels are launched with.
SHARED_SLOTS = 256
#: Internal kind: number of positions equal to the saved max/min (Max/Min gradient).
TIES = "ties"
#: Loads each thread keeps in flight per loop iteration (independent, then folded).
CHUNK = 8
#: Independent chains of a LogSumExp batch's folds (a few partial results beside the
#: values: a tree over every value would hold half of them again in registers).
_LSE_CHAINS = 4
#: Values per LogSumExp batch fold: a word batch of 32 bf16/f16 values folds as two, since
#: all 32 live at once across its max made ptxas spill inside the word loop under the
#: word kernels' register cap.
LSE_PART = 16

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
def _add(a, b):
    return a + b


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


def _chained(op: Any, count: int, ACC: types.Type) -> Any:
    """Device function ``fold(values)``: ``op`` over ``values[0:count]`` (``count`` a power
    of two) in ``min(count, _LSE_CHAINS)`` interleaved chains (value ``u`` goes to chain
    ``u % chains``), then a pairwise tree over the chains: a fixed order, and
    count / chains + log2(chains) dependent steps instead of count - 1."""
    assert count >= 1 and count & (count - 1) == 0, count
    CHAINS = min(count, _LSE_CHAINS)
    LEVELS = CHAINS.bit_length() - 1

    @cuda.jit(device=True, inline=True)
    def fold(values, base):
        part = cuda.local.array(CHAINS, ACC)
        for u in range(CHAINS):
            part[u] = values[base + u]
        for u in range(CHAINS, count):  # constant trip counts: unrolled, indices constant
            part[u % CHAINS] = op(part[u % CHAINS], values[base + u])
        for level in range(LEVELS):
            width = CHAINS >> (level + 1)
            for u in range(CHAINS // 2):
                if u < width:
                    part[u] = op(part[u], part[u + width])
        return part[0]

    return fold


def _lse_chunk_for(ACC: types.Type, count: int, step: Any, merge: Any) -> Any:
    """``chunk`` of LogSumExp over one batch ``values[0:count]`` (``count`` a power of two;
    the batch's row indices do not matter). An f64 accumulator folds step by step
    (``step``): the batch fold took its generic kernel from 60 to 88 registers and
    measured slower (docs/design/reduce.md). Otherwise in parts of ``min(count, LSE_PART)``
    values:
    each part's own state (m, s), m = max(values) (NaN-propagating) and s = sum(exp(v -
    m)), merged once into the running state by ``merge``. A part's exps are independent
    and both of its folds run in a few chains, where the step-by-step fold is one
    dependent chain of a branch, an exp and a multiply-add per value. A part whose m is
    not finite needs no branch: its s is NaN (exp(inf - inf) or exp(NaN)), which nothing
    reads: ``merge`` drops a part of max -inf and keeps m where it is NaN; a state of
    max +inf stays +inf through every merge but a NaN one, and ``_final_lse`` returns the
    max where it is +-inf or NaN. ``values`` is overwritten."""
    if ACC == float64:
        return _sequential_chunk(step)
    PART = min(count, LSE_PART)
    PARTS = count // PART
    peak = _chained(max_nan_f32 if ACC == types.float32 else nan_max, PART, ACC)
    total = _chained(_add, PART, ACC)

    @cuda.jit(device=True, inline=True)
    def lse_part(a, b, c, k, values, base):
        m = peak(values, base)
        for u in range(PART):
            values[base + u] = ACC(math.exp(values[base + u] - m))
        return merge(a, b, c, k, m, total(values, base), c, k)

    @cuda.jit(device=True, inline=True)
    def lse_chunk(a, b, c, k, values, i, span, aux):
        for p in range(PARTS):
            a, b, c, k = lse_part(a, b, c, k, values, p * PART)
        return a, b, c, k

    return lse_chunk


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
        found = _PER_ACC[("lse", acc)] = (step, _lse_chunk_for(acc, CHUNK, step, merge), merge)
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

#: Forward kinds that run another kind's kernel with its runtime ``variant`` (bit 1 of the
#: forward kernels' ``flags``): Min is Max of the flipped values, flipped back once per
#: output (floats: the sign bit, so NaN stays NaN; integers: bitwise NOT, exact at the
#: int64 minimum); Std is Var with a square root per output. Argmax and Argmin keep a
#: kernel each (the flip in their hot loop measured slower).
FORWARD_VARIANT_OF = {ReduceKind.MIN: ReduceKind.MAX, ReduceKind.STD: ReduceKind.VAR}

#: The forward kernels' element key of f16 and bf16: one "half" kernel (uint16 storage,
#: the runtime ``bf16`` flag in bit 0 of ``flags``) serves both.
HALF = "half"


def forward_key(kind: Any, element: ElementKind) -> tuple[Any, Any]:
    """The (kernel kind, element key) whose forward kernel computes ``kind`` of
    ``element`` (Min: Max's, Std: Var's; f16 and bf16: HALF)."""
    key = HALF if element in (ElementKind.F16, ElementKind.BF16) else element
    return FORWARD_VARIANT_OF.get(kind, kind), key


def forward_flags(kind: Any, element: ElementKind) -> int:
    """The ``flags`` argument of the forward kernels for ``kind`` of ``element``: bit 0
    the bf16 flag of a half kernel, bit 1 the variant (FORWARD_VARIANT_OF)."""
    return int(element is ElementKind.BF16) | (2 if kind in FORWARD_VARIANT_OF else 0)


#: Storage of the half kernels (the f16 or bf16 bits; loads convert by the flag).
HALF_SPEC = ElementSpec(uint16, float32, None, None, -_INF, _INF)


def forward_spec(key: Any) -> ElementSpec:
    """ElementSpec of a forward element key (HALF: uint16 storage, f32 accumulator)."""
    return HALF_SPEC if key == HALF else ELEMENTS[key]

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

