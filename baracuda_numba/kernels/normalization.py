"""RMSNorm and LayerNorm over the last ``k`` axes, forward and backward.

Each row of ``n = prod(normalized_shape)`` elements (``h = x + residual`` when a residual
is given, rounded once to the storage dtype and written out) is normalized::

    RMSNorm:   rstd = 1 / sqrt(mean(h²) + eps)                  x̂ = h · rstd
    LayerNorm: mean = Σh / n, rstd = 1 / sqrt(Σ(h − mean)² / n + eps),  x̂ = (h − mean) · rstd
    y = x̂ · (offset + w) + b          (w, b optional; offset = 1 for Gemma's (1 + w))

Backward, with ``g = dy · (offset + w)`` and ``x̂`` recomputed from the saved statistics::

    dx = rstd · (g − x̂ · Σ(g·x̂)/n)                     (RMSNorm)
    dx = rstd · (g − Σg/n − x̂ · Σ(g·x̂)/n)              (LayerNorm)
    dx += dh                                            (the incoming gradient of h, if any)
    dw = Σ_rows dy · x̂,   db = Σ_rows dy

Algorithm: one block per row (grid-stride over rows); each thread takes the row's
elements ``tid, tid + T, ...``; block sums are warp butterflies then a fixed-order sum of
the warp totals in warp order (``_row_sums``), so every thread holds the same
statistics. Statistics accumulate in f32 (f64 for f64 activations).

The weight gradients use no atomics. Rows are cut into ``chunks`` of a fixed number of
rows, a function of the problem only; one block takes a chunk and each thread keeps, in
a local array, the running sums of its own columns over the chunk's rows, in row order.
The chunk partials go to the workspace (``[chunks, n]`` for dw, then for db) and
``norm_finalize`` sums each column's partials in chunk order::

    rows  ──chunk 0──┬──chunk 1──┬── ...        block c: partial[c, j] = Σ_{rows of c} dy·x̂
                     ▼           ▼
    workspace [c, j] ──────────────────►  finalize: dw[j] = Σ_c partial[c, j]  (c = 0, 1, ...)

so ``dw``/``db`` are bit-identical whatever the block size or grid.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from numba import cuda, float32, float64, int64, types, uint16, uint32, uint64
from numba.types import float16

from ..launch import Kernel, LazyTable, flat
from ..types import ElementKind
from .common import (
    bf16_to_f32,
    f32_from_bits,
    f32_to_bf16,
    f32_to_bits,
    load16,
    load16_ro,
    pack_bf16x2,
    pack_f16x2,
    shfl_down,
    store16,
    strided_offset2,
    to_f16,
    to_f32,
    to_f64,
    unpack_bf16x2,
    unpack_f16x2,
)

# Bits of the ``flags`` argument (uniform branches; one signature covers every option).
FLAG_WEIGHT = 1
FLAG_BIAS = 2
FLAG_RESIDUAL = 4  # forward: h = x + residual written out; backward: dh added to dx
FLAG_LAYER = 8  # the register kernels: LayerNorm (else RMSNorm)
FLAG_WEIGHT_GRAD = 16  # backward: dw partials (FLAG_WEIGHT alone only scales g by w)

#: Columns one backward thread can own (its dw/db running sums live in a local array):
#: with 1024 threads a block covers rows of up to 65536 elements.
MAX_COLUMNS_PER_THREAD = 64
MAX_BLOCK = 1024
#: The generic kernels launch up to MAX_BLOCK threads: 64 registers a thread fill the file.
GENERIC_MAX_REGISTERS = 64

_TUPLE8 = types.UniTuple(int64, 8)


# -- device helpers ----------------------------------------------------------------------

#: element kind -> (storage type, statistics type, widen to it, narrow from it)
_STORAGE = {
    ElementKind.F16: (float16, float32, to_f32, to_f16),
    ElementKind.BF16: (uint16, float32, bf16_to_f32, f32_to_bf16),
    ElementKind.F32: (float32, float32, to_f32, to_f32),
    ElementKind.F64: (float64, float64, to_f64, to_f64),
}


@cuda.jit(device=True, inline=True)
def _row_sums(first, second, sums, tid, block):
    """The block's sums of ``first`` and ``second`` (f64), the same in every thread and
    in a fixed order: a shuffle tree to each warp's lane 0, then the warp totals in warp
    order from ``sums`` (64 f64). Every thread of the block calls it (two barriers)."""
    offset = 16
    while offset > 0:
        first += shfl_down(first, offset)
        second += shfl_down(second, offset)
        offset >>= 1
    if tid & 31 == 0:
        sums[tid >> 5] = first
        sums[32 + (tid >> 5)] = second
    cuda.syncthreads()
    total_first = float64(0)
    total_second = float64(0)
    for warp in range((block + 31) >> 5):
        total_first += sums[warp]
        total_second += sums[32 + warp]
    cuda.syncthreads()  # sums is free for the next call
    return total_first, total_second


@functools.cache
def _forward_factory(element: ElementKind, weight_element: ElementKind, layer: bool) -> Any:
    storage, acc, widen, narrow = _STORAGE[element]
    widen_w = _STORAGE[weight_element][2]

    def norm_forward(x, residual, h, y, weight, bias, rstd_out, mean_out, outer_shape,
                     x_strides, r_strides, h_strides, y_strides, x_inner, r_inner, h_inner,
                     y_inner, rows, n, eps, offset, flags):
        """y (and h) of rows ``blockIdx.x, + gridDim.x, ...``; rstd (and mean) saved."""
        sums = cuda.shared.array(64, float64)
        tid = cuda.threadIdx.x
        block = cuda.blockDim.x
        has_residual = flags & FLAG_RESIDUAL
        row = int64(cuda.blockIdx.x)
        while row < rows:
            x_row, r_row = strided_offset2(row, outer_shape, x_strides, r_strides)
            h_row, y_row = strided_offset2(row, outer_shape, h_strides, y_strides)
            total = acc(0)
            j = int64(tid)
            while j < n:
                v = widen(x[uint64(x_row + j * x_inner)])
                if has_residual:
                    rounded = narrow(v + widen(residual[uint64(r_row + j * r_inner)]))
                    h[uint64(h_row + j * h_inner)] = rounded
                    v = widen(rounded)
                total += v if layer else v * v
                j += block
            mean = acc(0)
            if layer:
                mean = acc(_row_sums(total, acc(0), sums, tid, block)[0] / n)
                total = acc(0)
                j = int64(tid)
                while j < n:  # second pass for the variance: no cancellation
                    if has_residual:
                        v = widen(h[uint64(h_row + j * h_inner)])
                    else:
                        v = widen(x[uint64(x_row + j * x_inner)])
                    total += (v - mean) * (v - mean)
                    j += block
            variance = acc(_row_sums(total, acc(0), sums, tid, block)[0] / n)
            rstd = acc(1) / math.sqrt(variance + acc(eps))
            if tid == 0:
                rstd_out[row] = rstd
                if layer:
                    mean_out[row] = mean
            j = int64(tid)
            while j < n:
                if has_residual:
                    v = widen(h[uint64(h_row + j * h_inner)])
                else:
                    v = widen(x[uint64(x_row + j * x_inner)])
                out = (v - mean) * rstd
                if flags & FLAG_WEIGHT:
                    out *= acc(offset) + acc(widen_w(weight[uint64(j)]))
                if flags & FLAG_BIAS:
                    out += acc(widen_w(bias[uint64(j)]))
                y[uint64(y_row + j * y_inner)] = narrow(out)
                j += block
            row += cuda.gridDim.x

    return norm_forward


@functools.cache
def _backward_factory(element: ElementKind, weight_element: ElementKind, layer: bool) -> Any:
    storage, acc, widen, narrow = _STORAGE[element]
    widen_w = _STORAGE[weight_element][2]

    def norm_backward(dy, x, dh, dx, weight, rstd_in, mean_in, partials, outer_shape,
                      dy_strides, x_strides, dh_strides, dx_strides, dy_inner, x_inner,
                      dh_inner, dx_inner, rows, n, rows_per_chunk, chunks, offset, flags):
        """dx of the rows of chunks ``blockIdx.x, + gridDim.x, ...``; the chunk's dw/db
        partials to ``partials`` (``[chunks, n]`` each) when weight/bias are given."""
        sums = cuda.shared.array(64, float64)
        dw_run = cuda.local.array(MAX_COLUMNS_PER_THREAD, acc)
        db_run = cuda.local.array(MAX_COLUMNS_PER_THREAD, acc)
        tid = cuda.threadIdx.x
        block = cuda.blockDim.x
        with_partials = flags & (FLAG_WEIGHT_GRAD | FLAG_BIAS)
        chunk = int64(cuda.blockIdx.x)
        while chunk < chunks:
            for k in range(MAX_COLUMNS_PER_THREAD):
                dw_run[k] = acc(0)
                db_run[k] = acc(0)
            row = chunk * rows_per_chunk
            end = min(row + rows_per_chunk, rows)
            while row < end:
                dy_row, x_row = strided_offset2(row, outer_shape, dy_strides, x_strides)
                dh_row, dx_row = strided_offset2(row, outer_shape, dh_strides, dx_strides)
                rstd = acc(rstd_in[row])
                mean = acc(mean_in[row]) if layer else acc(0)
                sum_g = acc(0)
                sum_gx = acc(0)
                j = int64(tid)
                while j < n:
                    g = widen(dy[uint64(dy_row + j * dy_inner)])
                    if flags & FLAG_WEIGHT:
                        g *= acc(offset) + acc(widen_w(weight[uint64(j)]))
                    sum_g += g
                    sum_gx += g * ((widen(x[uint64(x_row + j * x_inner)]) - mean) * rstd)
                    j += block
                if layer:
                    total_g, total_gx = _row_sums(sum_g, sum_gx, sums, tid, block)
                    mean_g = acc(total_g / n)
                else:
                    total_g, total_gx = _row_sums(acc(0), sum_gx, sums, tid, block)
                    mean_g = acc(0)
                mean_gx = acc(total_gx / n)
                j = int64(tid)
                k = 0
                while j < n:
                    grad = widen(dy[uint64(dy_row + j * dy_inner)])
                    normed = (widen(x[uint64(x_row + j * x_inner)]) - mean) * rstd
                    g = grad
                    if flags & FLAG_WEIGHT:
                        g *= acc(offset) + acc(widen_w(weight[uint64(j)]))
                    out = rstd * (g - mean_g - normed * mean_gx)
                    if flags & FLAG_RESIDUAL:
                        out += widen(dh[uint64(dh_row + j * dh_inner)])
                    dx[uint64(dx_row + j * dx_inner)] = narrow(out)
                    dw_run[k] += grad * normed
                    db_run[k] += grad
                    j += block
                    k += 1
                row += 1
            if with_partials:
                j = int64(tid)
                k = 0
                while j < n:
                    if flags & FLAG_WEIGHT_GRAD:
                        partials[uint64(chunk * n + j)] = dw_run[k]
                    if flags & FLAG_BIAS:
                        partials[uint64((chunks + chunk) * n + j)] = db_run[k]
                    j += block
                    k += 1
            chunk += cuda.gridDim.x

    return norm_backward


#: The finalize kernel's block: FINALIZE_LANES warps, each summing every FINALIZE_LANES-th
#: chunk of the same 32 columns (coalesced 128-byte rows), then combined in warp order.
FINALIZE_LANES = 8
FINALIZE_BLOCK = 32 * FINALIZE_LANES


@functools.cache
def _finalize_factory(acc: Any, weight_element: ElementKind) -> Any:
    narrow_w = _STORAGE[weight_element][3]

    def norm_finalize(partials, dweight, dbias, chunks, n, flags):
        """``dweight[j] = Σ_c partials[c, j]`` and ``dbias[j]`` from the second half. A
        block takes 32 of the ``2n`` columns (grid-stride); warp ``l`` sums chunks
        ``l, l + L, ...`` in four interleaved running sums (independent loads in flight),
        and lane 0's warp adds the ``L`` warp sums in warp order: a fixed order that
        depends on ``chunks`` only (L = FINALIZE_LANES: launched with FINALIZE_BLOCK
        threads; the simulator's single warp is the same sums in another order)."""
        part = cuda.shared.array((FINALIZE_LANES, 32), acc)
        lane = int64(cuda.threadIdx.x >> 5)
        step = int64(cuda.blockDim.x >> 5)  # FINALIZE_LANES (fewer in the simulator)
        inner = int64(cuda.threadIdx.x & 31)
        start = int64(cuda.blockIdx.x) * 32
        while start < 2 * n:  # uniform per block: the barriers below are safe
            column = start + inner
            second = column >= n
            j = column - n if second else column
            active = column < 2 * n and ((flags & FLAG_BIAS) if second
                                         else (flags & FLAG_WEIGHT_GRAD)) != 0
            base = chunks * n if second else int64(0)
            t0 = acc(0)
            t1 = acc(0)
            t2 = acc(0)
            t3 = acc(0)
            if active:
                c = lane
                while c + 3 * step < chunks:
                    t0 += partials[uint64(base + c * n + j)]
                    t1 += partials[uint64(base + (c + step) * n + j)]
                    t2 += partials[uint64(base + (c + 2 * step) * n + j)]
                    t3 += partials[uint64(base + (c + 3 * step) * n + j)]
                    c += 4 * step
                while c < chunks:
                    t0 += partials[uint64(base + c * n + j)]
                    c += step
            part[lane, inner] = (t0 + t1) + (t2 + t3)
            cuda.syncthreads()
            if lane == 0 and active:
                total = acc(0)
                for w in range(step):
                    total += part[w, inner]
                if second:
                    dbias[uint64(j)] = narrow_w(total)
                else:
                    dweight[uint64(j)] = narrow_w(total)
            cuda.syncthreads()
            start += int64(cuda.gridDim.x) * 32

    return norm_finalize


# -- the row-in-registers forward (16-byte units) ------------------------------------------
# Contiguous, 16-byte aligned rows of f16/bf16/f32: a thread loads up to VEC_MAX_UNITS
# 16-byte units of its row (units tid, tid + T, ...) once, keeps them in registers for the
# statistics and the output, and stores 16-byte units. The unrolled body is generated
# from the element kinds (one local variable per value, so nothing goes to local memory).

#: 16-byte units a thread holds at most (32 f32 values for 16-bit kinds; each unit adds
#: generated code, and compile time grows faster than the code).
VEC_MAX_UNITS = 4
#: Threads per block at most for the register kernel (with VEC_MAX_UNITS, rows of up to
#: 16384 16-bit values).
VEC_MAX_BLOCK = 512
#: Register cap of both register kernels: 64 a thread lets 1024 threads share an SM (the
#: bytes in flight a memory-bound row needs); the held rows fit it without spills because
#: only packed 16-byte words stay live across the block sums (see _lanes_init).
VEC_MAX_REGISTERS = 64
VEC_ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32)

_UNPACK = {ElementKind.F16: "unpack_f16x2", ElementKind.BF16: "unpack_bf16x2",
           ElementKind.F32: "f32_from_bits"}
_PACK = {ElementKind.F16: "pack_f16x2", ElementKind.BF16: "pack_bf16x2",
         ElementKind.F32: "f32_to_bits"}


def _decode(element: ElementKind, words: list[str], names: list[str]) -> list[str]:
    """Lines assigning the f32 values of ``words`` (expressions of uint32) to ``names``."""
    per_word = 4 // element.byte_width
    return [f"{', '.join(names[i * per_word:(i + 1) * per_word])} = "
            f"{_UNPACK[element]}({word})" for i, word in enumerate(words)]


def _encode(element: ElementKind, names: list[str]) -> str:
    """A 4-tuple expression of the uint32 words packing ``names``."""
    per_word = 4 // element.byte_width
    words = [f"{_PACK[element]}({', '.join(names[i:i + per_word])})"
             for i in range(0, len(names), per_word)]
    return f"({', '.join(words)})"


def _unit_values(element: ElementKind, k: int, vec: int) -> list[str]:
    """Body of unit ``k`` (under ``if p{k}:``) once its words ``x{k}`` (and ``r{k}``) are
    loaded: decode, add the residual and store h (rounded), sum."""
    v = [f"v{k}_{e}" for e in range(vec)]
    lines = _decode(element, [f"x{k}[{i}]" for i in range(4)], v)
    lines += ["if has_residual:"]
    r = [f"s{k}_{e}" for e in range(vec)]
    lines += ["    " + line for line in _decode(element, [f"r{k}[{i}]" for i in range(4)], r)]
    lines += [f"    w{k} = {_encode(element, [f'{a} + {b}' for a, b in zip(v, r)])}",
              f"    store16(hw, uint64(h_row + u{k} * 4), w{k})",
              f"    x{k} = w{k}"]  # h's packed words are what the thread holds from here
    lines += ["    " + line for line in _decode(element, [f"x{k}[{i}]" for i in range(4)], v)]
    return lines


def _held_values(element: ElementKind, k: int, vec: int, words: str = "x",
                 tag: str = "") -> list[str]:
    """Decode unit ``k``'s held words ``x{k}`` (``words``) again into ``v{k}_*``: only the
    packed words stay live across the block sums (half the registers of f32 values for
    16-bit kinds, which is what lets the block run at 64 registers a thread without
    spills). ``tag`` keeps the names of each use distinct (each assigned in one place)."""
    return _decode(element, [f"{words}{k}[{i}]" for i in range(4)],
                   [f"v{tag}{k}_{e}" for e in range(vec)])


def _weight_values(weight: ElementKind, k: int, vec: int, array: str,
                   names: list[str], tag: str = "") -> list[str]:
    """Lines loading unit ``k``'s ``vec`` entries of ``array`` (weight or bias, in kind
    ``weight``: one or two 16-byte loads) as f32 into ``names``."""
    wunits = vec * weight.byte_width // 16
    lines, words = [], []
    for i in range(wunits):
        lines.append(f"q{tag}{k}{array[0]}{i} = load16_ro({array}, uint64(u{k} * {4 * wunits} + "
                     f"{4 * i}))")
        words += [f"q{tag}{k}{array[0]}{i}[{j}]" for j in range(4)]
    return lines + _decode(weight, words, names)


def _unit_store(element: ElementKind, weight: ElementKind, k: int, vec: int,
                words: str = "x", row: str = "y_row", tag: str = "") -> list[str]:
    """Body of unit ``k``'s output: normalize, scale/shift, store 16 bytes of y (from the
    held ``words``, with ``mean{tag}``/``rstd{tag}``, at ``row``)."""
    o = [f"o{tag}{k}_{e}" for e in range(vec)]
    lines = _held_values(element, k, vec, words, tag)
    lines += [f"{o[e]} = (v{tag}{k}_{e} - mean{tag}) * rstd{tag}" for e in range(vec)]
    for flag, array in (("FLAG_WEIGHT", "weight"), ("FLAG_BIAS", "bias")):
        names = [f"c{tag}{k}{array[0]}_{e}" for e in range(vec)]
        lines.append(f"if flags & {flag}:")
        lines += ["    " + line for line in _weight_values(weight, k, vec, array, names, tag)]
        op = "*= offset32 +" if array == "weight" else "+="
        lines += [f"    {o[e]} {op} {names[e]}" for e in range(vec)]
    lines.append(f"store16(yw, uint64({row} + u{k} * 4), {_encode(element, o)})")
    return lines


# The units' offsets ``u{k} = tid + k · block`` (and the backward's shared slots) are
# loop-invariant: hoisted out of the row loop they stay live as 64-bit values, one per
# unit, array and element, and the kernel spills. Reading ``block`` and the backward's
# slot count from shared memory after a barrier each row makes them row-local (cheap to
# recompute).
# ``lanes[2]`` is a zero the compiler cannot see: the backward decodes its held words a
# second time as ``word ^ blind`` after the block sums, so the first decode's f32 values
# are not kept alive across the barrier (common-subexpression elimination would).
def _lanes_init(second: str = "units") -> str:
    """Kernel-head lines filling ``lanes`` (block, ``second``, a hidden zero)."""
    return ("    lanes = cuda.shared.array(3, int64)\n"
            "    if tid == 0:\n"
            "        lanes[0] = block\n"
            f"        lanes[1] = {second}\n"
            "        lanes[2] = 0\n"
            "    cuda.syncthreads()\n")


def _lanes(units: range) -> list[str]:
    """Lines defining ``u{k}`` and ``p{k}`` from ``lanes`` (see _lanes_init)."""
    lines = ["blk = lanes[0]"]
    for k in units:
        lines += [f"u{k} = tid + {k} * blk", f"p{k} = u{k} < units"]
    return lines


def _row_sum_lines(element: ElementKind, k: int, vec: int, words: str, tag: str,
                   target: str, centre: str | None) -> list[str]:
    """Under a unit's predicate: ``target`` = the sum of unit ``k``'s values (decoded from
    ``words``), or with ``centre`` the sum of their squared differences from it (``""``:
    of their squares)."""
    lines = _held_values(element, k, vec, words, tag)
    v = [f"v{tag}{k}_{e}" for e in range(vec)]
    if centre is None:
        return lines + [f"{target} = " + " + ".join(v)]
    if not centre:
        return lines + [f"{target} = " + " + ".join(f"{a} * {a}" for a in v)]
    lines += [f"d{tag}{k}_{e} = {v[e]} - {centre}" for e in range(vec)]
    return lines + [f"{target} = " + " + ".join(f"d{tag}{k}_{e} * d{tag}{k}_{e}"
                                                 for e in range(vec))]


def _vec_forward_source(element: ElementKind, weight: ElementKind, pair: bool) -> str:
    """The forward register kernel. ``pair`` (rows without a residual): a block takes two
    rows at once, the second's words in the residual's registers: twice the bytes in
    flight a thread, and one round of block sums (and of weight-load latency) for two
    rows. A compile-time choice: the single-row kernel (any residual) keeps its own code."""
    vec = 16 // element.byte_width
    units = range(VEC_MAX_UNITS)
    zero = "(uint32(0), uint32(0), uint32(0), uint32(0))"
    body = _lanes(units)
    for k in units:  # every load issued before any is used: the units' latencies overlap
        body += [f"x{k} = {zero}",
                 f"r{k} = {zero}", f"if p{k}:", f"    x{k} = load16(xw, uint64(x_row + u{k} * 4))"]
    if pair:  # the pair's second row (r_row: its offset in x)
        body.append("if second:")
        body += [f"    if p{k}:\n        r{k} = load16(xw, uint64(r_row + u{k} * 4))"
                 for k in units]
    else:
        body.append("if has_residual:")
        body += [f"    if p{k}:\n        r{k} = load16(rw, uint64(r_row + u{k} * 4))"
                 for k in units]
    for k in units:  # one partial sum per unit, each assigned once (fast to compile)
        body += [f"v{k}_{e} = float32(0)" for e in range(vec)] + [f"t{k} = float32(0)"]
        body += [f"if p{k}:"] + ["    " + line for line in _unit_values(element, k, vec)]
        plain = " + ".join(f"v{k}_{e}" for e in range(vec))
        squares = " + ".join(f"v{k}_{e} * v{k}_{e}" for e in range(vec))
        body += ["    if is_layer:", f"        t{k} = {plain}", "    else:",
                 f"        t{k} = {squares}"]
    body.append(f"total = {' + '.join(f't{k}' for k in units)}")
    body += _vec_forward_stats(element, vec, units, pair)
    for k in units:
        body += [f"if p{k}:"] + ["    " + line for line in _unit_store(element, weight, k, vec)]
    if pair:
        body.append("if second:")  # the weights again: L1 hits
        for k in units:
            body += [f"    if p{k}:"] + ["        " + line for line in _unit_store(
                element, weight, k, vec, "r", "h_row", "B")]
    head = ("def norm_forward_vec(xw, rw, hw, yw, weight, bias, rstd_out, mean_out,\n"
            "                     outer_shape, x_strides, r_strides, h_strides, y_strides,\n"
            "                     rows, units, n, eps, offset, flags):\n"
            "    sums = cuda.shared.array(64, float64)\n"
            "    tid = int64(cuda.threadIdx.x)\n"
            "    block = int64(cuda.blockDim.x)\n"
            "    has_residual = flags & FLAG_RESIDUAL\n"
            "    is_layer = flags & FLAG_LAYER\n"
            "    offset32 = float32(offset)\n"
            + _lanes_init())
    if pair:
        head += ("    row = int64(cuda.blockIdx.x) * 2\n"
                 "    while row < rows:\n"
                 "        second = row + 1 < rows\n"
                 "        next_row = row + 1 if second else row\n")
        offsets = (_row_offsets([("x_row", "y_row", "x_strides", "y_strides")], "row")
                   + _row_offsets([("r_row", "h_row", "x_strides", "y_strides")], "next_row"))
        step = "        row += int64(cuda.gridDim.x) * 2\n"
    else:
        head += ("    row = int64(cuda.blockIdx.x)\n"
                 "    while row < rows:\n")
        offsets = _row_offsets([("x_row", "r_row", "x_strides", "r_strides"),
                                ("h_row", "y_row", "h_strides", "y_strides")], "row")
        step = "        row += cuda.gridDim.x\n"
    body = offsets + body
    return head + "".join(f"        {line}\n" for line in "\n".join(body).splitlines()) + step


def _vec_forward_stats(element: ElementKind, vec: int, units: range, pair: bool) -> list[str]:
    """The forward register kernel's row statistics (mean for LayerNorm, rstd) from the
    partial sums ``t{k}``, stored by thread 0; with ``pair`` also the second row's."""
    if not pair:
        body = ["mean = float32(0)", "if is_layer:",
                "    mean = float32(_row_sums(total, float32(0), sums, tid, block)[0] / n)"]
        for k in units:  # LayerNorm's second pass, over the registers
            body += [f"    e{k} = float32(0)", f"    if p{k}:"]
            body += ["        " + line for line in _row_sum_lines(element, k, vec, "x", "",
                                                                f"e{k}", "mean")]
        body.append(f"    total = {' + '.join(f'e{k}' for k in units)}")
        return body + ["variance = float32(_row_sums(total, float32(0), sums, tid, block)[0] / n)",
                       "rstd = float32(1) / math.sqrt(variance + float32(eps))",
                       "if tid == 0:", "    rstd_out[row] = rstd", "    if is_layer:",
                       "        mean_out[row] = mean"]
    body = []
    for k in units:  # the second row's partial sums
        body += [f"z{k} = float32(0)", f"if second and p{k}:", "    if is_layer:"]
        body += ["        " + line for line in _row_sum_lines(element, k, vec, "r", "B",
                                                            f"z{k}", None)]
        body.append("    else:")
        body += ["        " + line for line in _row_sum_lines(element, k, vec, "r", "S",
                                                            f"z{k}", "")]
    body.append(f"total2 = {' + '.join(f'z{k}' for k in units)}")
    body += ["mean = float32(0)", "meanB = float32(0)", "if is_layer:",
             "    means = _row_sums(total, total2, sums, tid, block)",
             "    mean = float32(means[0] / n)", "    meanB = float32(means[1] / n)"]
    for k in units:  # LayerNorm's second pass, over the registers
        body += [f"    e{k} = float32(0)", f"    if p{k}:"]
        body += ["        " + line for line in _row_sum_lines(element, k, vec, "x", "E",
                                                            f"e{k}", "mean")]
        body += [f"    f{k} = float32(0)", f"    if second and p{k}:"]
        body += ["        " + line for line in _row_sum_lines(element, k, vec, "r", "F",
                                                            f"f{k}", "meanB")]
    body.append(f"    total = {' + '.join(f'e{k}' for k in units)}")
    body.append(f"    total2 = {' + '.join(f'f{k}' for k in units)}")
    return body + ["variances = _row_sums(total, total2, sums, tid, block)",
                   "rstd = float32(1) / math.sqrt(float32(variances[0] / n) + float32(eps))",
                   "rstdB = float32(1) / math.sqrt(float32(variances[1] / n) + float32(eps))",
                   "if tid == 0:", "    rstd_out[row] = rstd", "    if is_layer:",
                   "        mean_out[row] = mean", "    if second:",
                   "        rstd_out[row + 1] = rstdB", "        if is_layer:",
                   "            mean_out[row + 1] = meanB"]


@functools.cache
def _vec_forward_factory(element: ElementKind, weight: ElementKind, pair: bool) -> Any:
    """The generated ``norm_forward_vec`` for these kinds (see the section comment)."""
    return _generated("norm_forward_vec", _vec_forward_source(element, weight, pair))


# -- the row-in-registers backward ---------------------------------------------------------
# The same layout for dy, x, dh and dx: a thread holds x̂ and g of up to VEC_MAX_UNITS_BW
# units of the row in registers across the block sums; each column's dw/db running sums
# over the chunk's rows live in dynamic shared memory, ``slots`` f32 a unit (an odd count,
# so a warp's 32 units fall in 32 banks), unit ``u``'s at ``u · slots``: dw of its ``vec``
# columns first (when dw is wanted), then db (with a bias). A thread's slots are a
# constant offset from one address a unit (no index arithmetic a column); only the owning
# thread touches a slot, in row order, so the sums are the generic kernel's sums.

#: 16-byte units a backward thread holds at most, of x and of dy (four spill under
#: VEC_MAX_REGISTERS; two, with 1024-thread blocks, cover rows of 16384 16-bit values).
VEC_MAX_UNITS_BW = 2
#: Threads per block at most for the backward register kernel (64 registers each: one
#: block of 1024 fills the register file).
VEC_MAX_BLOCK_BW = 1024
#: Dynamic shared memory the backward's running sums may take (dw and db of 16-bit rows
#: of 16384: 8.5 · n bytes; under the opt-in limit of sm_80 and later).
VEC_MAX_SHARED_BW = 144 * 1024


def vec_backward_slots(vec: int, weight_grad: bool, bias: bool) -> int:
    """f32 running sums a unit of the backward register kernel keeps in shared memory
    (0 without partials; else odd: conflict-free, see the section comment). The kernel
    computes the same count from its flags (``slot_count`` in _vec_backward_source): the
    plan sizes the dynamic shared memory with this one."""
    held = (vec if weight_grad else 0) + (vec if bias else 0)
    return held + 1 if held else 0


def _backward_values(element: ElementKind, weight: ElementKind, k: int, vec: int,
                     blind: str = "") -> list[str]:
    """Under ``if p{k}:``, from the held words ``x{k}``/``d{k}``: dy (``b{k}_*``), x̂
    (``n{k}_*``) and g = dy · (offset + w) (``g{k}_*``) of unit ``k``. Run once for the
    sums and once more for dx, so only the packed words stay live across the block sums
    (the weight's second load hits L1)."""
    xs = [f"a{k}_{e}" for e in range(vec)]
    ds = [f"b{k}_{e}" for e in range(vec)]
    lines = _decode(element, [f"x{k}[{i}]{blind}" for i in range(4)], xs)
    lines += _decode(element, [f"d{k}[{i}]{blind}" for i in range(4)], ds)
    lines += [f"n{k}_{e} = (a{k}_{e} - mean) * rstd" for e in range(vec)]
    lines += [f"g{k}_{e} = b{k}_{e}" for e in range(vec)]
    names = [f"c{k}_{e}" for e in range(vec)]
    lines.append("if flags & FLAG_WEIGHT:")
    lines += ["    " + line for line in _weight_values(weight, k, vec, "weight", names)]
    lines += [f"    g{k}_{e} = b{k}_{e} * (offset32 + c{k}_{e})" for e in range(vec)]
    return lines


def _backward_unit(element: ElementKind, weight: ElementKind, k: int, vec: int) -> list[str]:
    """Under ``if p{k}:``, with ``x{k}``/``d{k}`` loaded: the row sums of unit ``k``."""
    lines = _backward_values(element, weight, k, vec)
    lines.append(f"sg{k} = " + " + ".join(f"g{k}_{e}" for e in range(vec)))
    lines.append(f"sgx{k} = " + " + ".join(f"g{k}_{e} * n{k}_{e}" for e in range(vec)))
    return lines


def _backward_store(element: ElementKind, weight: ElementKind, k: int, vec: int) -> list[str]:
    """Under ``if p{k}:``: dx of unit ``k`` (plus dh) stored as 16 bytes, and the running
    sums of dw/db in shared memory (unsigned slot indices: no wraparound arithmetic, and
    the column's offset folds into the access)."""
    o = [f"o{k}_{e}" for e in range(vec)]
    lines = _backward_values(element, weight, k, vec, " ^ blind")
    lines.append(f"slot{k} = uint64(u{k}) * slots")
    lines.append("if has_w:")
    lines += [f"    running[slot{k} + uint64({e})] += b{k}_{e} * n{k}_{e}" for e in range(vec)]
    lines.append("if has_b:")
    lines.append(f"    slotb{k} = slot{k} + db_at")
    lines += [f"    running[slotb{k} + uint64({e})] += b{k}_{e}" for e in range(vec)]
    lines += [f"{o[e]} = rstd * (g{k}_{e} - mean_g - n{k}_{e} * mean_gx)" for e in range(vec)]
    lines += ["if has_dh:"]
    lines += ["    " + line for line in _decode(element, [f"h{k}[{i}]" for i in range(4)],
                                                [f"s{k}_{e}" for e in range(vec)])]
    lines += [f"    {o[e]} += s{k}_{e}" for e in range(vec)]
    lines.append(f"store16(dxw, uint64(dx_row + u{k} * 4), {_encode(element, o)})")
    return lines


def _row_offsets(pairs: list[tuple[str, str, str, str]], row: str) -> list[str]:
    """Lines setting the row offsets ``(a, b)`` of each pair from strides ``(sa, sb)``: one
    multiply when the rows are one leading axis (``outer_shape[7] == rows``, the other
    extents 1), else the general unravel (integer divisions, a row's largest cost)."""
    lines = ["if outer_shape[7] == rows:"]
    for a, b, sa, sb in pairs:
        lines += [f"    {a} = ({row}) * {sa}[7]", f"    {b} = ({row}) * {sb}[7]"]
    lines.append("else:")
    lines += [f"    {a}, {b} = strided_offset2({row}, outer_shape, {sa}, {sb})"
              for a, b, sa, sb in pairs]
    return lines


def _backward_loads(units: range) -> list[str]:
    """Lines loading the words of x, dy (and dh) of the row into ``x{k}``, ``d{k}``,
    ``h{k}``."""
    zero = "(uint32(0), uint32(0), uint32(0), uint32(0))"
    lines = []
    for k in units:
        lines += [f"x{k} = {zero}", f"d{k} = {zero}", f"h{k} = {zero}", f"if p{k}:",
                  f"    x{k} = load16(xw, uint64(x_row + u{k} * 4))",
                  f"    d{k} = load16(dyw, uint64(dy_row + u{k} * 4))",
                  "    if has_dh:", f"        h{k} = load16(dhw, uint64(dh_row + u{k} * 4))"]
    return lines


def _vec_backward_source(element: ElementKind, weight: ElementKind) -> str:
    vec = 16 // element.byte_width
    units = range(VEC_MAX_UNITS_BW)
    body = _row_offsets([("dy_row", "x_row", "dy_strides", "x_strides"),
                         ("dh_row", "dx_row", "dh_strides", "dx_strides")], "row")
    body += _lanes(units) + ["rstd = rstd_in[row]", "mean = float32(0)", "if is_layer:",
                             "    mean = mean_in[row]"]
    body += _backward_loads(units)  # all loads first (dh's too: one round trip a row)
    for k in units:
        body += [f"sg{k} = float32(0)", f"sgx{k} = float32(0)"]
        body += [f"if p{k}:"] + ["    " + line for line in _backward_unit(element, weight, k,
                                                                          vec)]
    body.append(f"sum_g = {' + '.join(f'sg{k}' for k in units)}")
    body.append(f"sum_gx = {' + '.join(f'sgx{k}' for k in units)}")
    body += ["if is_layer:",
             "    total_g, total_gx = _row_sums(sum_g, sum_gx, sums, tid, block)",
             "    mean_g = float32(total_g / n)", "else:",
             "    total_g, total_gx = _row_sums(float32(0), sum_gx, sums, tid, block)",
             "    mean_g = float32(0)"]
    body += ["mean_gx = float32(total_gx / n)", "slots = uint64(lanes[1])",
             "blind = uint32(lanes[2])"]
    for k in units:
        body += [f"if p{k}:"] + ["    " + line
                                 for line in _backward_store(element, weight, k, vec)]
    held = _lanes(units) + ["slots = uint64(lanes[1])"]
    zeroing = held + [f"if p{k}:\n    for e in range(int64(slots)):\n"
                      f"        running[uint64(u{k}) * slots + uint64(e)] = float32(0)"
                      for k in units]
    publish = held + [f"if p{k}:\n    for e in range({vec}):\n        if has_w:\n"
                      f"            partials[uint64(chunk * n + u{k} * {vec} + e)] = "
                      f"running[uint64(u{k}) * slots + uint64(e)]\n        if has_b:\n"
                      f"            partials[uint64((chunks + chunk) * n + u{k} * {vec} + e)] = "
                      f"running[uint64(u{k}) * slots + db_at + uint64(e)]" for k in units]
    head = ("def norm_backward_vec(dyw, xw, dhw, dxw, weight, rstd_in, mean_in, partials,\n"
            "                      outer_shape, dy_strides, x_strides, dh_strides, dx_strides,\n"
            "                      rows, units, n, rows_per_chunk, chunks, offset, flags):\n"
            "    sums = cuda.shared.array(64, float64)\n"
            "    running = cuda.shared.array(0, float32)\n"
            "    tid = int64(cuda.threadIdx.x)\n"
            "    block = int64(cuda.blockDim.x)\n"
            "    has_dh = flags & FLAG_RESIDUAL\n"
            "    is_layer = flags & FLAG_LAYER\n"
            "    has_w = flags & FLAG_WEIGHT_GRAD\n"
            "    has_b = flags & FLAG_BIAS\n"
            "    with_partials = flags & (FLAG_WEIGHT_GRAD | FLAG_BIAS)\n"
            f"    db_at = uint64({vec}) if has_w else uint64(0)\n"
            "    slot_count = int64(0)\n"
            "    if with_partials:\n"
            "        slot_count = int64(db_at) + (" f"{vec}" " if has_b else 0) + 1\n"
            "    offset32 = float32(offset)\n"
            + _lanes_init("slot_count")
            + "    chunk = int64(cuda.blockIdx.x)\n"
            "    while chunk < chunks:\n"
            "        if with_partials:\n"
            + "".join(f"            {line}\n" for line in "\n".join(zeroing).splitlines())
            + "        row = chunk * rows_per_chunk\n"
            "        end = min(row + rows_per_chunk, rows)\n"
            + "        while row < end:\n")
    return (head + "".join(f"            {line}\n" for line in "\n".join(body).splitlines())
            + "            row += 1\n"
            "        if with_partials:\n"
            + "".join(f"            {line}\n" for line in "\n".join(publish).splitlines())
            + "        chunk += cuda.gridDim.x\n")


def _generated(name: str, source: str) -> Any:
    """The function ``name`` defined by the generated ``source``."""
    namespace = dict(
        __name__=__name__,  # the kernels' module: their family for precompile and the cache
        cuda=cuda, float32=float32, float64=float64, int64=int64, uint64=uint64, math=math,
        uint32=uint32, load16=load16, load16_ro=load16_ro, store16=store16,
        strided_offset2=strided_offset2,
        _row_sums=_row_sums, FLAG_RESIDUAL=FLAG_RESIDUAL, FLAG_WEIGHT=FLAG_WEIGHT,
        FLAG_WEIGHT_GRAD=FLAG_WEIGHT_GRAD, FLAG_BIAS=FLAG_BIAS, FLAG_LAYER=FLAG_LAYER,
        unpack_f16x2=unpack_f16x2, unpack_bf16x2=unpack_bf16x2, f32_from_bits=f32_from_bits,
        pack_f16x2=pack_f16x2, pack_bf16x2=pack_bf16x2, f32_to_bits=f32_to_bits)
    exec(compile(source, f"<{name}>", "exec"), namespace)
    return namespace[name]


@functools.cache
def _vec_backward_factory(element: ElementKind, weight: ElementKind) -> Any:
    """The generated ``norm_backward_vec`` for these kinds (see the section comment)."""
    return _generated("norm_backward_vec", _vec_backward_source(element, weight))


# -- the table ---------------------------------------------------------------------------

#: Activation kind -> the weight kinds it takes (its own, or f32).
NORM_WEIGHT_ELEMENTS: dict[ElementKind, tuple[ElementKind, ...]] = {
    ElementKind.F16: (ElementKind.F16, ElementKind.F32),
    ElementKind.BF16: (ElementKind.BF16, ElementKind.F32),
    ElementKind.F32: (ElementKind.F32,),
    ElementKind.F64: (ElementKind.F64, ElementKind.F32),
}
NORM_ELEMENTS = tuple(NORM_WEIGHT_ELEMENTS)


def stats_type(element: ElementKind) -> Any:
    """The statistics' (and partials') Numba type: f64 for f64, else f32."""
    return _STORAGE[element][1]


def _storage(element: ElementKind) -> Any:
    return _STORAGE[element][0]


def _forward_kernel(element: ElementKind, weight: ElementKind, layer: bool) -> Kernel:
    s, w, a = _storage(element), _storage(weight), stats_type(element)
    name = f"norm_forward[{'layer' if layer else 'rms'},{element.name},w={weight.name}]"
    return Kernel(name, _forward_factory(element, weight, layer),
                  (flat(s), flat(s), flat(s), flat(s), flat(w), flat(w), flat(a), flat(a),
                   _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64, int64, int64,
                   int64, int64, float64, float64, int64), max_registers=GENERIC_MAX_REGISTERS)


def _backward_kernel(element: ElementKind, weight: ElementKind, layer: bool) -> Kernel:
    s, w, a = _storage(element), _storage(weight), stats_type(element)
    name = f"norm_backward[{'layer' if layer else 'rms'},{element.name},w={weight.name}]"
    return Kernel(name, _backward_factory(element, weight, layer),
                  (flat(s), flat(s), flat(s), flat(s), flat(w), flat(a), flat(a), flat(a),
                   _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64, int64, int64,
                   int64, int64, int64, int64, float64, int64),
                  max_registers=GENERIC_MAX_REGISTERS)


def _finalize_kernel(acc: Any, weight: ElementKind) -> Kernel:
    w = _storage(weight)
    stats = "F64" if acc is float64 else "F32"
    return Kernel(f"norm_finalize[{stats},w={weight.name}]", _finalize_factory(acc, weight),
                  (flat(acc), flat(w), flat(w), int64, int64, int64), grid_stride=True)


#: (activation, weight, layer) -> kernel
_GENERIC_KEYS = [(e, w, layer) for e, weights in NORM_WEIGHT_ELEMENTS.items()
                 for w in weights for layer in (False, True)]
NORM_FORWARD_KERNELS = LazyTable(_GENERIC_KEYS, lambda key: _forward_kernel(*key))
NORM_BACKWARD_KERNELS = LazyTable(_GENERIC_KEYS, lambda key: _backward_kernel(*key))
def _vec_forward_kernel(element: ElementKind, weight: ElementKind, pair: bool) -> Kernel:
    name = f"norm_forward_vec{'_pair' if pair else ''}[{element.name},w={weight.name}]"
    words = flat(uint32)
    return Kernel(name, _vec_forward_factory(element, weight, pair),
                  (words, words, words, words, words, words, flat(float32), flat(float32),
                   _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64, int64, float64,
                   float64, int64), max_registers=VEC_MAX_REGISTERS)


#: (activation, weight) -> the row-in-registers forward (VEC_ELEMENTS only; RMSNorm or
#: LayerNorm by FLAG_LAYER: one signature for both halves the generated code to compile)
NORM_VEC_FORWARD_KERNELS = LazyTable(
    [(e, w, pair) for e in VEC_ELEMENTS for w in NORM_WEIGHT_ELEMENTS[e] for pair in (False, True)],
    lambda key: _vec_forward_kernel(*key))
def _vec_backward_kernel(element: ElementKind, weight: ElementKind) -> Kernel:
    name = f"norm_backward_vec[{element.name},w={weight.name}]"
    words = flat(uint32)
    return Kernel(name, _vec_backward_factory(element, weight),
                  (words, words, words, words, words, flat(float32), flat(float32),
                   flat(float32), _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64,
                   int64, int64, int64, float64, int64), max_registers=VEC_MAX_REGISTERS)


#: (activation, weight) -> the row-in-registers backward (VEC_ELEMENTS only; FLAG_LAYER)
NORM_VEC_BACKWARD_KERNELS = LazyTable(
    [(e, w) for e in VEC_ELEMENTS for w in NORM_WEIGHT_ELEMENTS[e]],
    lambda key: _vec_backward_kernel(*key))
#: (statistics type name, weight) -> kernel
_FINALIZE_KEYS = {(str(stats_type(e)), w): (stats_type(e), w)  # each pair once (registry)
                  for e, weights in NORM_WEIGHT_ELEMENTS.items() for w in weights}
NORM_FINALIZE_KERNELS = LazyTable(_FINALIZE_KEYS,
                                  lambda key: _finalize_kernel(*_FINALIZE_KEYS[key]))

__all__ = ["FLAG_BIAS", "FLAG_LAYER", "FLAG_RESIDUAL", "FLAG_WEIGHT", "FLAG_WEIGHT_GRAD",
           "MAX_BLOCK", "FINALIZE_BLOCK", "MAX_COLUMNS_PER_THREAD",
           "NORM_BACKWARD_KERNELS", "NORM_ELEMENTS", "NORM_FINALIZE_KERNELS",
           "NORM_FORWARD_KERNELS", "NORM_VEC_BACKWARD_KERNELS", "NORM_VEC_FORWARD_KERNELS",
           "NORM_WEIGHT_ELEMENTS",
           "VEC_ELEMENTS", "VEC_MAX_BLOCK", "VEC_MAX_BLOCK_BW", "VEC_MAX_SHARED_BW",
           "VEC_MAX_UNITS",
           "VEC_MAX_UNITS_BW", "stats_type", "vec_backward_slots"]
