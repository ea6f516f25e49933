"""CrossEntropy: loss, per-row log-sum-exp and (optionally) the gradient over ``[N, V]``.

For row ``i`` with target ``t`` (not ``ignore_index``), class weights ``w`` (all 1 without
``weight=``), ``W = sum_c w_c``, smoothing ``eps``, z-loss weight ``z`` and soft-cap ``c``::

    y_c   = c * tanh(x_c / c)            (x_c without soft-cap)
    lse   = log sum_c exp(y_c)
    loss  = w_t (1 - eps) (lse - y_t) + eps / V * (W lse - sum_c w_c y_c) + w_t z lse^2
    dloss/dx_j = [ (w_t (1 - eps) + eps W / V + 2 w_t z lse) p_j
                   - w_t (1 - eps) [j == t] - eps w_j / V ] * (1 - (y_j / c)^2)

with ``p_j = exp(y_j - lse)``, times ``dy_i`` (none), ``dy / D`` (mean, ``D = sum of
w_t`` over the non-ignored rows) or ``dy`` (sum). An ignored row has loss 0 and gradient
0 (its ``lse`` is still written). A target outside ``[0, V)`` that is not
``ignore_index`` gives a NaN loss and gradient row (the plan raises instead under
``BARACUDA_DEBUG=1``).

Kernels (all loops grid-stride, so any grid covers any problem)::

    ce_targets      one block: D, W, count of bad targets        -> workspace header
    ce_rows[grad]   one block per row: pass 1 online max-and-sum (and sum w_c y_c),
                    block reduction, loss and lse; pass 2 (grad) re-reads the row and
                    writes the gradient, possibly over the logits themselves
    ce_partials     few rows: one block per (row, column chunk): (m, s, sum w y, y_t)
    ce_combine      one thread per row: merges its chunks in chunk order -> lse, loss
    ce_grad         one block per (row, column chunk): the gradient from lse and dy
                    (the backward plan, and the few-rows path's gradient)
    ce_finalize     one block: sum of the per-row losses (fixed tree), / D for mean

Rows are read as 8-byte units (4 f16/bf16, 2 f32, 1 f64) when the row stride and the
pointer allow, the tail element by element. Every reduction has a fixed order, so
results are bit-identical run to run.
"""

from __future__ import annotations

import math
from typing import Any

from numba import cuda, float32, float64, int32, int64, uint16, uint64
from numba.types import float16

from .._runtime import SIMULATOR
from ..launch import Kernel, LazyTable, flat
from ..types import ElementKind
from .common import (
    bf16_to_f32,
    bitcast,
    f32_to_bf16,
    pack_bf16x4,
    pack_f16x4,
    pack_f32x2,
    shfl_xor,
    unpack_bf16x4,
    unpack_f16x4,
    unpack_f32x2,
)

# Workspace header (f32 slots): D, W, bad targets, the constant 1.0 the few-rows path
# passes as dy, then padding to keep what follows 16-byte aligned.
HEADER_DENOM = 0
HEADER_WEIGHT_SUM = 1
HEADER_BAD = 2
HEADER_ONE = 3
HEADER_SLOTS = 4
#: f32 slots per (row, chunk) partial: m, s, sum w y, y_t.
PARTIAL_SLOTS = 4

# -- logarithm ---------------------------------------------------------------------------

if SIMULATOR:

    @cuda.jit(device=True)
    def _log(value):
        """log(value) with log(0) = -inf (Python's math.log raises there)."""
        if value > 0:
            return math.log(value)
        return -math.inf if value == 0 else math.nan

else:

    @cuda.jit(device=True, inline=True)
    def _log(value):
        """log(value) (libdevice: log(0) = -inf)."""
        return math.log(value)


if SIMULATOR:

    @cuda.jit(device=True)
    def _exp32(value):
        """e^value in f32 (the simulator has no libdevice ``fast_expf``)."""
        return float32(math.exp(value))

else:
    from numba.cuda import libdevice

    @cuda.jit(device=True, inline=True)
    def _exp32(value):
        """e^value as ``ex2.approx(value * log2 e)``: one multiply and one MUFU.EX2
        instead of ``expf``'s ~10-instruction reduction, which made the row loops
        issue-bound; relative error ~2 ulp + |value| * 2^-23, and the arguments here are
        <= 0, where a term's error is scaled by the term itself."""
        return libdevice.fast_expf(float32(value))


# -- online max-and-sum ------------------------------------------------------------------


def _fold_ops(acc: Any) -> tuple[Any, Any]:
    """``fold(m, s, y)``: the running (max, sum of exp(y - max)) with ``y`` added (``+inf``
    gives NaN as torch's log_softmax, NaN gives NaN, ``-inf`` adds nothing), and
    ``rebase(m, s, top)``: the state moved to max ``max(m, top)`` before a group of values
    <= ``top`` is added as ``exp(y - base)`` (``base`` is returned: the max, or 0 while it
    is still -inf, so -inf values add exp(-inf) = 0, never exp(NaN))."""
    exp = _exp32 if acc is float32 else math.exp

    @cuda.jit(device=True, inline=True)
    def fold(m, s, y):
        if y > m:
            return y, s * exp(m - y) + exp(y - y)
        if y != -math.inf:
            return m, s + exp(y - m)
        return m, s

    @cuda.jit(device=True, inline=True)
    def rebase(m, s, top):
        if top > m:
            if m != -math.inf:
                s = s * exp(m - top)
            m = top
        base = m if m != -math.inf else acc(0.0)
        return m, s, base

    return fold, rebase


@cuda.jit(device=True, inline=True)
def _merge(m1, s1, m2, s2):
    """Two (max, sum) states as one (an empty state is (-inf, 0))."""
    m = m1 if m1 >= m2 else m2
    t1 = s1 if m1 == m else s1 * math.exp(m1 - m)
    t2 = s2 if m2 == m else s2 * math.exp(m2 - m)
    return m, t1 + t2


def _block_reduce(acc: Any) -> Any:
    """``reduce(m, s, a)``: the block's merged (max, sum) and sum of ``a``, in a fixed
    order (lanes by xor shuffles, then warps in order), known to every thread. Every
    thread of the block must call it."""

    @cuda.jit(device=True, inline=True)
    def reduce(m, s, a):
        shared_m = cuda.shared.array(33, acc)
        shared_s = cuda.shared.array(33, acc)
        shared_a = cuda.shared.array(33, acc)
        lane = cuda.threadIdx.x % 32
        warp = cuda.threadIdx.x // 32
        offset = 16
        while offset > 0:
            m2 = shfl_xor(m, offset)
            s2 = shfl_xor(s, offset)
            a += shfl_xor(a, offset)
            m, s = _merge(m, s, m2, s2)
            offset //= 2
        if lane == 0:
            shared_m[warp] = m
            shared_s[warp] = s
            shared_a[warp] = a
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            warps = (cuda.blockDim.x + 31) // 32
            m = shared_m[0]
            s = shared_s[0]
            a = shared_a[0]
            for k in range(1, warps):
                m, s = _merge(m, s, shared_m[k], shared_s[k])
                a += shared_a[k]
            shared_m[32] = m
            shared_s[32] = s
            shared_a[32] = a
        cuda.syncthreads()
        m = shared_m[32]
        s = shared_s[32]
        a = shared_a[32]
        cuda.syncthreads()  # the slots are reused by the next row
        return m, s, a

    return reduce


def _block_sum(acc: Any) -> Any:
    """``total(value)``: the block's sum in a fixed tree order (every thread calls it;
    the result is valid in thread 0)."""

    @cuda.jit(device=True, inline=True)
    def total(value):
        shared = cuda.shared.array(1024, acc)
        tid = cuda.threadIdx.x
        shared[tid] = value
        cuda.syncthreads()
        width = 1
        while width < cuda.blockDim.x:
            width *= 2
        half = width // 2
        while half > 0:
            if tid < half and tid + half < cuda.blockDim.x:
                shared[tid] += shared[tid + half]
            cuda.syncthreads()
            half //= 2
        return shared[0]

    return total


# -- element kinds ---------------------------------------------------------------------


def _element_ops(element: ElementKind) -> tuple[Any, ...]:
    """(accumulator type, elements per 8-byte unit, load, store, unpack, pack) of one
    element kind: ``load``/``store`` convert one stored element, ``unpack(unit)`` gives the
    unit's elements (lowest address first), ``pack(values)`` the inverse."""
    if element is ElementKind.F64:
        acc = float64

        @cuda.jit(device=True, inline=True)
        def load(v):
            return float64(v)

        @cuda.jit(device=True, inline=True)
        def store(v):
            return float64(v)

        @cuda.jit(device=True, inline=True)
        def unpack(unit):
            return (bitcast(unit, float64),)

        @cuda.jit(device=True, inline=True)
        def pack(values):
            return bitcast(float64(values[0]), uint64)

        return acc, 1, load, store, unpack, pack
    acc = float32
    if element is ElementKind.F32:

        @cuda.jit(device=True, inline=True)
        def load(v):
            return float32(v)

        @cuda.jit(device=True, inline=True)
        def store(v):
            return float32(v)

        @cuda.jit(device=True, inline=True)
        def pack(values):
            return pack_f32x2(values[0], values[1])

        return acc, 2, load, store, unpack_f32x2, pack
    if element is ElementKind.BF16:

        @cuda.jit(device=True, inline=True)
        def load(v):
            return bf16_to_f32(v)

        @cuda.jit(device=True, inline=True)
        def store(v):
            return f32_to_bf16(v)

        @cuda.jit(device=True, inline=True)
        def pack(values):
            return pack_bf16x4(values[0], values[1], values[2], values[3])

        return acc, 4, load, store, unpack_bf16x4, pack

    @cuda.jit(device=True, inline=True)
    def load(v):
        return float32(v)

    @cuda.jit(device=True, inline=True)
    def store(v):
        return float16(v)

    @cuda.jit(device=True, inline=True)
    def pack(values):
        return pack_f16x4(values[0], values[1], values[2], values[3])

    return acc, 4, load, store, unpack_f16x4, pack


@cuda.jit(device=True, inline=True)
def _capped(x, softcap):
    """``softcap * tanh(x / softcap)``, or ``x`` when ``softcap`` is 0."""
    if softcap != 0:
        return softcap * math.tanh(x / softcap)
    return x


def _span_ops(element: ElementKind) -> tuple[Any, Any]:
    """``fold_span`` and ``grad_span`` of one element kind over the columns ``[lo, hi)``
    of a row (``lo`` a multiple of the unit when ``vec``): the block's threads stride over
    8-byte units, then over the scalar tail."""
    return _fold_span(element), _grad_span(element)


def _fold_span(element: ElementKind) -> Any:
    """``fold_span``: the online (max, sum of exp, smoothing sum) of a row's span."""
    acc, per, load, _, unpack, _ = _element_ops(element)
    fold, rebase = _fold_ops(acc)
    exp = _exp32 if acc is float32 else math.exp

    @cuda.jit(device=True, inline=True)
    def fold_one(m, s, a, y, col, smooth, has_weight, weight):
        m, s = fold(m, s, y)
        if smooth:
            a += y * acc(weight[col]) if has_weight else y
        return m, s, a

    @cuda.jit(device=True, inline=True)
    def fold_unit(m, s, a, word, col, softcap, smooth, has_weight, weight):
        values = unpack(word)
        if softcap == 0 and not smooth:
            # The common case: one max and one rescale per unit, then a subtract, a
            # multiply and one MUFU.EX2 per element (no per-element branch).
            top = acc(values[0])
            for k in range(1, per):
                top = max(top, acc(values[k]))
            m, s, base = rebase(m, s, top)
            for k in range(per):
                s += exp(acc(values[k]) - base)
            return m, s, a
        for k in range(per):
            y = _capped(acc(values[k]), softcap)
            m, s, a = fold_one(m, s, a, y, col + k, smooth, has_weight, weight)
        return m, s, a

    @cuda.jit(device=True, inline=True)
    def fold_span(x, x_units, row_off, lo, hi, vec, softcap, smooth, has_weight, weight):
        m = acc(-math.inf)
        s = acc(0.0)
        a = acc(0.0)
        tid = cuda.threadIdx.x
        step = cuda.blockDim.x
        tail = lo
        if vec:
            # Unsigned indices: no wrap-around arithmetic per load.
            unit_lo = uint64((row_off + lo) // per)
            units = (hi - lo) // per
            tail = lo + units * per
            u = int64(tid)
            while u + 3 * step < units:  # four loads issued before any math
                at = unit_lo + uint64(u)
                w0 = x_units[at]
                w1 = x_units[at + uint64(step)]
                w2 = x_units[at + uint64(2 * step)]
                w3 = x_units[at + uint64(3 * step)]
                m, s, a = fold_unit(m, s, a, w0, lo + u * per, softcap, smooth, has_weight,
                                    weight)
                m, s, a = fold_unit(m, s, a, w1, lo + (u + step) * per, softcap, smooth,
                                    has_weight, weight)
                m, s, a = fold_unit(m, s, a, w2, lo + (u + 2 * step) * per, softcap, smooth,
                                    has_weight, weight)
                m, s, a = fold_unit(m, s, a, w3, lo + (u + 3 * step) * per, softcap, smooth,
                                    has_weight, weight)
                u += 4 * step
            while u < units:
                m, s, a = fold_unit(m, s, a, x_units[unit_lo + uint64(u)], lo + u * per,
                                    softcap, smooth, has_weight, weight)
                u += step
        col = tail + tid
        while col < hi:
            y = _capped(load(x[row_off + col]), softcap)
            m, s, a = fold_one(m, s, a, y, col, smooth, has_weight, weight)
            col += step
        return m, s, a

    return fold_span


def _grad_span(element: ElementKind) -> Any:
    """``grad_span``: the gradient of a row's span, written as it is computed."""
    acc, per, load, store, unpack, pack = _element_ops(element)
    exp = _exp32 if acc is float32 else math.exp

    @cuda.jit(device=True, inline=True)
    def grad_one(value, col, target, coefs, has_weight, weight):
        """One gradient element; ``coefs`` already carry the row's scale (dy, 1/D)."""
        lse, coef_p, coef_t, eps_w, softcap, scale = coefs
        if scale == 0:
            return acc(0.0)  # ignored row: exact zeros whatever the logits hold
        y = _capped(acc(value), softcap)
        g = coef_p * exp(y - lse)
        if col == target:
            g -= coef_t
        if eps_w != 0:
            g -= eps_w * (acc(weight[col]) if has_weight else acc(1.0))
        if softcap != 0:
            r = y / softcap
            g *= acc(1.0) - r * r
        return g

    if per == 4:

        @cuda.jit(device=True, inline=True)
        def grad_unit(values, col, target, coefs, has_weight, weight):
            return pack((grad_one(values[0], col, target, coefs, has_weight, weight),
                         grad_one(values[1], col + 1, target, coefs, has_weight, weight),
                         grad_one(values[2], col + 2, target, coefs, has_weight, weight),
                         grad_one(values[3], col + 3, target, coefs, has_weight, weight)))

    elif per == 2:

        @cuda.jit(device=True, inline=True)
        def grad_unit(values, col, target, coefs, has_weight, weight):
            return pack((grad_one(values[0], col, target, coefs, has_weight, weight),
                         grad_one(values[1], col + 1, target, coefs, has_weight, weight)))

    else:

        @cuda.jit(device=True, inline=True)
        def grad_unit(values, col, target, coefs, has_weight, weight):
            return pack((grad_one(values[0], col, target, coefs, has_weight, weight),))

    @cuda.jit(device=True, inline=True)
    def grad_span(x, x_units, grad, grad_units, row_off, grad_off, lo, hi, vec, target, coefs,
                  has_weight, weight):
        tid = cuda.threadIdx.x
        step = cuda.blockDim.x
        tail = lo
        if vec:
            unit_lo = uint64((row_off + lo) // per)
            grad_unit_lo = uint64((grad_off + lo) // per)
            units = (hi - lo) // per
            tail = lo + units * per
            u = int64(tid)
            while u + 3 * step < units:  # four loads in flight, then their stores
                at = unit_lo + uint64(u)
                w0 = x_units[at]
                w1 = x_units[at + uint64(step)]
                w2 = x_units[at + uint64(2 * step)]
                w3 = x_units[at + uint64(3 * step)]
                out = grad_unit_lo + uint64(u)
                col = lo + u * per
                grad_units[out] = grad_unit(unpack(w0), col, target, coefs, has_weight,
                                            weight)
                grad_units[out + uint64(step)] = grad_unit(
                    unpack(w1), col + step * per, target, coefs, has_weight, weight)
                grad_units[out + uint64(2 * step)] = grad_unit(
                    unpack(w2), col + 2 * step * per, target, coefs, has_weight, weight)
                grad_units[out + uint64(3 * step)] = grad_unit(
                    unpack(w3), col + 3 * step * per, target, coefs, has_weight, weight)
                u += 4 * step
            while u < units:
                values = unpack(x_units[unit_lo + uint64(u)])
                grad_units[grad_unit_lo + uint64(u)] = grad_unit(
                    values, lo + u * per, target, coefs, has_weight, weight)
                u += step
        col = tail + tid
        while col < hi:
            g = grad_one(load(x[row_off + col]), col, target, coefs, has_weight, weight)
            grad[grad_off + col] = store(g)
            col += step

    return grad_span


# -- per-row terms -----------------------------------------------------------------------


@cuda.jit(device=True, inline=True)
def _target_at(target, row, words):
    """Row ``row``'s class index from int32 storage: int32 targets (``words`` 1) or the
    two little-endian words of int64 targets (``words`` 2), so one signature reads both."""
    if words == 1:
        return int64(target[row])
    low = int64(target[2 * row]) & 0xFFFFFFFF
    return (int64(target[2 * row + 1]) << 32) | low


@cuda.jit(device=True, inline=True)
def _target_weight(target, ignore_index, n_classes, has_weight, weight):
    """(state, w_t): state 0 ignored, 1 valid, 2 out of range (w_t NaN)."""
    if target == ignore_index:
        return 0, 0.0
    if target < 0 or target >= n_classes:
        return 2, math.nan
    return 1, (float64(weight[target]) if has_weight else 1.0)


def _row_terms(acc: Any) -> tuple[Any, Any]:
    """``row_loss`` (the loss of one row) and ``row_coefs`` (the gradient's coefficient
    tuple ``(lse, coef_p, coef_t, eps_w, softcap, scale)``) in accumulator type ``acc``."""

    @cuda.jit(device=True, inline=True)
    def row_loss(state, w_t, lse, y_t, smooth_sum, weight_sum, eps, z, n_classes):
        if state == 0:
            return acc(0.0)
        if state == 2:
            return acc(math.nan)
        wt = acc(w_t)
        loss = wt * (acc(1.0) - eps) * (lse - y_t)
        if eps != 0:
            loss += eps / acc(n_classes) * (weight_sum * lse - smooth_sum)
        if z != 0:
            loss += wt * z * lse * lse
        return loss

    @cuda.jit(device=True, inline=True)
    def row_coefs(state, w_t, lse, weight_sum, eps, z, softcap, n_classes, scale):
        wt = acc(w_t)
        eps_w = eps / acc(n_classes)
        coef_p = wt * (acc(1.0) - eps) + eps_w * weight_sum + acc(2.0) * wt * z * lse
        # The row's scale folded into the coefficients (one multiply less per element),
        # every coefficient in ``acc``: 1 / D arrives as f64, and an f64 coefficient made
        # the per-element gradient math f64.
        scale = acc(0.0) if state == 0 else acc(scale)
        return (acc(lse), acc(coef_p * scale), acc(wt * (acc(1.0) - eps) * scale),
                acc(eps_w * scale), acc(softcap), scale)

    return row_loss, row_coefs


@cuda.jit(device=True, inline=True)
def _inverse(denom):
    """1 / D of the mean, 0 when no row counts (every gradient row is then zero)."""
    if denom == 0:
        return denom
    return 1 / denom


# -- kernels -----------------------------------------------------------------------------

_REDUCE_F64 = _block_sum(float64)


def ce_targets(target, weight, ws, n_rows, n_classes, ignore_index, has_weight, words):
    """One block: ``ws[D] = sum of w_t`` over non-ignored rows, ``ws[W] = sum_c w_c`` (V
    without weights), ``ws[BAD]`` = targets outside ``[0, V)`` other than ignore_index,
    ``ws[ONE] = 1``. Fixed-order sums."""
    denom = 0.0
    bad = 0.0
    i = int64(cuda.threadIdx.x)
    while i < n_rows:
        state, w_t = _target_weight(_target_at(target, i, words), ignore_index, n_classes,
                                    has_weight, weight)
        if state == 1:
            denom += w_t
        elif state == 2:
            bad += 1.0
        i += cuda.blockDim.x
    weight_sum = 0.0
    if has_weight:
        c = int64(cuda.threadIdx.x)
        while c < n_classes:
            weight_sum += float64(weight[c])
            c += cuda.blockDim.x
    denom = _REDUCE_F64(denom)
    if cuda.threadIdx.x == 0:
        ws[HEADER_DENOM] = float32(denom)
    cuda.syncthreads()
    bad = _REDUCE_F64(bad)
    if cuda.threadIdx.x == 0:
        ws[HEADER_BAD] = float32(bad)
    cuda.syncthreads()
    weight_sum = _REDUCE_F64(weight_sum)
    if cuda.threadIdx.x == 0:
        ws[HEADER_WEIGHT_SUM] = float32(weight_sum if has_weight else float64(n_classes))
        ws[HEADER_ONE] = float32(1.0)


def ce_finalize(loss_rows, ws, out, n_rows, mean):
    """One block: ``out[0] = sum(loss_rows)`` (f64, fixed tree), divided by ``ws[D]`` for
    mean (NaN when D is 0, as torch's mean over no tokens)."""
    total = 0.0
    i = int64(cuda.threadIdx.x)
    while i < n_rows:
        total += float64(loss_rows[i])
        i += cuda.blockDim.x
    total = _REDUCE_F64(total)
    if cuda.threadIdx.x == 0:
        if mean:
            denom = float64(ws[HEADER_DENOM])
            total = total / denom if denom != 0 else math.nan
        out[0] = float32(total)


def _make_rows(element: ElementKind, grad: bool) -> Any:
    """``ce_rows``: one block per row (grid-stride), loss and lse, and with ``grad`` the
    gradient of the reduced loss (dy = 1) in the same launch."""
    acc, per, load, _, _, _ = _element_ops(element)
    fold_span, grad_span = _span_ops(element)
    reduce = _block_reduce(acc)
    row_loss, row_coefs = _row_terms(acc)

    def ce_rows(x, x_units, target, weight, ws, loss_rows, lse_out, grad_out, grad_units,
                n_rows, n_classes, row_stride, grad_stride, ignore_index, vec, softcap_in,
                eps_in, z_in, has_weight, reduction, words):
        softcap = acc(softcap_in)
        eps = acc(eps_in)
        z = acc(z_in)
        weight_sum = acc(ws[HEADER_WEIGHT_SUM])
        scale = acc(1.0)
        if reduction == 1:
            scale = _inverse(acc(ws[HEADER_DENOM]))
        row = int64(cuda.blockIdx.x)
        while row < n_rows:
            row_off = row * row_stride
            t = _target_at(target, row, words)
            state, w_t = _target_weight(t, ignore_index, n_classes, has_weight, weight)
            y_t = acc(math.nan)
            if state == 1:
                y_t = _capped(load(x[row_off + t]), softcap)
            m, s, a = fold_span(x, x_units, row_off, 0, n_classes, vec, softcap, eps != 0,
                                has_weight, weight)
            m, s, a = reduce(m, s, a)
            lse = m + _log(s)
            if cuda.threadIdx.x == 0:
                loss_rows[row] = float32(row_loss(state, w_t, lse, y_t, a, weight_sum, eps,
                                                  z, n_classes))
                lse_out[row] = float32(lse)
            if grad:
                coefs = row_coefs(state, w_t, lse, weight_sum, eps, z, softcap, n_classes,
                                  scale)
                grad_span(x, x_units, grad_out, grad_units, row_off, row * grad_stride, 0,
                          n_classes, vec, t, coefs, has_weight, weight)
            row += cuda.gridDim.x

    ce_rows.__name__ = f"ce_rows_{element.name.lower()}{'_grad' if grad else ''}"
    return ce_rows


def _make_partials(element: ElementKind) -> Any:
    """``ce_partials``: one block per (row, column chunk): the chunk's (max, sum, sum w y)
    and, in the chunk holding the target, y_t."""
    acc, per, load, _, _, _ = _element_ops(element)
    fold_span, _ = _span_ops(element)
    reduce = _block_reduce(acc)

    def ce_partials(x, x_units, target, weight, partials, n_rows, n_classes, row_stride,
                    chunks, chunk_len, vec, softcap_in, smooth, has_weight, words):
        softcap = acc(softcap_in)
        block = int64(cuda.blockIdx.x)
        while block < n_rows * chunks:
            row = block // chunks
            lo = (block - row * chunks) * chunk_len
            hi = min(lo + chunk_len, n_classes)
            row_off = row * row_stride
            m, s, a = fold_span(x, x_units, row_off, lo, hi, vec, softcap, smooth, has_weight,
                                weight)
            m, s, a = reduce(m, s, a)
            if cuda.threadIdx.x == 0:
                base = block * PARTIAL_SLOTS
                partials[base] = float32(m)
                partials[base + 1] = float32(s)
                partials[base + 2] = float32(a)
                t = _target_at(target, row, words)
                if lo <= t < hi:
                    partials[base + 3] = float32(_capped(load(x[row_off + t]), softcap))
            block += cuda.gridDim.x

    ce_partials.__name__ = f"ce_partials_{element.name.lower()}"
    return ce_partials


_ROW_LOSS_F32, _ = _row_terms(float32)


def ce_combine(target, weight, partials, ws, loss_rows, lse_out, n_rows, n_classes, chunks,
               chunk_len, ignore_index, eps_in, z_in, has_weight, words):
    """One thread per row: merge the row's chunk partials in chunk order -> lse, loss."""
    eps = float32(eps_in)
    z = float32(z_in)
    weight_sum = float32(ws[HEADER_WEIGHT_SUM])
    row = int64(cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x)
    while row < n_rows:
        base = row * chunks * PARTIAL_SLOTS
        m = partials[base]
        s = partials[base + 1]
        a = partials[base + 2]
        for k in range(1, chunks):
            slot = base + k * PARTIAL_SLOTS
            m, s = _merge(m, s, partials[slot], partials[slot + 1])
            a += partials[slot + 2]
        lse = m + _log(s)
        t = _target_at(target, row, words)
        state, w_t = _target_weight(t, ignore_index, n_classes, has_weight, weight)
        y_t = float32(math.nan)
        if state == 1:
            y_t = partials[base + (t // chunk_len) * PARTIAL_SLOTS + 3]
        loss_rows[row] = _ROW_LOSS_F32(state, w_t, float32(lse), y_t, a, weight_sum, eps, z,
                                       n_classes)
        lse_out[row] = float32(lse)
        row += cuda.gridDim.x * cuda.blockDim.x


def _make_grad(element: ElementKind) -> Any:
    """``ce_grad``: one block per (row, column chunk): the gradient from the saved lse and
    ``dy`` (per row with ``dy_stride`` 1, one value with 0)."""
    acc, _, _, _, _, _ = _element_ops(element)
    _, grad_span = _span_ops(element)
    _, row_coefs = _row_terms(acc)

    def ce_grad(x, x_units, target, weight, lse_in, dy, ws, grad_out, grad_units, n_rows,
                n_classes, row_stride, grad_stride, chunks, chunk_len, ignore_index, vec,
                softcap_in, eps_in, z_in, has_weight, reduction, dy_stride, words):
        softcap = acc(softcap_in)
        eps = acc(eps_in)
        z = acc(z_in)
        weight_sum = acc(ws[HEADER_WEIGHT_SUM])
        inverse = acc(1.0)
        if reduction == 1:
            inverse = _inverse(acc(ws[HEADER_DENOM]))
        block = int64(cuda.blockIdx.x)
        while block < n_rows * chunks:
            row = block // chunks
            lo = (block - row * chunks) * chunk_len
            hi = min(lo + chunk_len, n_classes)
            t = _target_at(target, row, words)
            state, w_t = _target_weight(t, ignore_index, n_classes, has_weight, weight)
            scale = acc(dy[row * dy_stride]) * inverse
            coefs = row_coefs(state, w_t, acc(lse_in[row]), weight_sum, eps, z, softcap,
                              n_classes, scale)
            grad_span(x, x_units, grad_out, grad_units, row * row_stride, row * grad_stride,
                      lo, hi, vec, t, coefs, has_weight, weight)
            block += cuda.gridDim.x

    ce_grad.__name__ = f"ce_grad_{element.name.lower()}"
    return ce_grad


# -- the table ----------------------------------------------------------------------------

#: Element kinds of the logits -> Numba storage type.
CE_ELEMENTS = {
    ElementKind.F16: float16,
    ElementKind.BF16: uint16,
    ElementKind.F32: float32,
    ElementKind.F64: float64,
}
#: Element kinds of the targets -> int32 words per target (both read through one int32
#: signature, see ``_target_at``).
CE_TARGET_WORDS = {ElementKind.I32: 1, ElementKind.I64: 2}
#: Elements per 8-byte unit, per logits kind.
CE_UNIT_ELEMENTS = {ElementKind.F16: 4, ElementKind.BF16: 4, ElementKind.F32: 2,
                    ElementKind.F64: 1}

_F32 = flat(float32)
_U64 = flat(uint64)
_I32 = flat(int32)


def _rows_signature(element: ElementKind) -> tuple[Any, ...]:
    x = flat(CE_ELEMENTS[element])
    return (x, _U64, _I32, _F32, _F32, _F32, _F32, x, _U64, int64, int64, int64, int64, int64,
            int32, float64, float64, float64, int32, int32, int32)


def _partials_signature(element: ElementKind) -> tuple[Any, ...]:
    return (flat(CE_ELEMENTS[element]), _U64, _I32, _F32, _F32, int64, int64, int64, int64,
            int64, int32, float64, int32, int32, int32)


def _grad_signature(element: ElementKind) -> tuple[Any, ...]:
    x = flat(CE_ELEMENTS[element])
    return (x, _U64, _I32, _F32, _F32, _F32, _F32, x, _U64, int64, int64, int64, int64, int64,
            int64, int64, int32, float64, float64, float64, int32, int32, int64, int32)


#: Registers per thread of the streaming kernels: 64 guarantees two 512-thread blocks per
#: SM (65536 registers), i.e. 32 KB of loads in flight per SM, with no spill (ptxas,
#: sm_90); above 64 only one block fits. f64 is left uncapped (it would spill at 64, and
#: f64 logits are not a bandwidth case).
CE_MAX_REGISTERS = 64


def _cap(element: ElementKind) -> int | None:
    return None if element is ElementKind.F64 else CE_MAX_REGISTERS

#: (logits kind, with gradient) -> the one-block-per-row kernel.
CE_ROWS_KERNELS = LazyTable(
    [(e, g) for e in CE_ELEMENTS for g in (False, True)],
    lambda key: Kernel(f"cross_entropy_rows[{key[0].name}{',grad' if key[1] else ''}]",
                       _make_rows(*key), _rows_signature(key[0]), grid_stride=True,
                       max_registers=_cap(key[0])))
CE_PARTIAL_KERNELS = LazyTable(
    CE_ELEMENTS,
    lambda e: Kernel(f"cross_entropy_partials[{e.name}]", _make_partials(e),
                     _partials_signature(e), grid_stride=True, max_registers=_cap(e)))
CE_GRAD_KERNELS = LazyTable(
    CE_ELEMENTS,
    lambda e: Kernel(f"cross_entropy_grad[{e.name}]", _make_grad(e), _grad_signature(e),
                     grid_stride=True, max_registers=_cap(e)))
CE_COMBINE_KERNEL = Kernel(
    "cross_entropy_combine", ce_combine,
    (_I32, _F32, _F32, _F32, _F32, _F32, int64, int64, int64, int64, int64, float64, float64,
     int32, int32), grid_stride=True)
CE_TARGETS_KERNEL = Kernel("cross_entropy_targets", ce_targets,
                           (_I32, _F32, _F32, int64, int64, int64, int32, int32),
                           grid_stride=True)
CE_FINALIZE_KERNEL = Kernel("cross_entropy_finalize", ce_finalize,
                            (_F32, _F32, _F32, int64, int32), grid_stride=True)
