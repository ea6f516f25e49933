"""Scan: the fast kernels of layouts that collapse to [outer, extent, inner]: ``rows_fast``
and ``cols_fast`` for the scalar-state forward kinds (sketch below)."""

from __future__ import annotations

import numpy as np
from numba import boolean, cuda, float32, float64, int32, int64, types, uint16, uint32, uint64

from ..._runtime import SIMULATOR
from ...launch import Kernel
from ...types import ElementKind
from ..common import (
    bitcast,
    load_relaxed,
    shfl_down,
    shfl_idx,
    shfl_up,
)
from .ops import (
    CODE_BF16,
    CODE_CUMMAX,
    CODE_CUMMIN,
    CODE_CUMPROD,
    CODE_CUMSUM,
    CODE_LOG_CUMSUM_EXP,
    FLOAT_ELEMENTS,
    INT_ELEMENTS,
    SCAN_STORAGE,
    _constants,
    _make_logaddexp,
    element_token,
)

# -- fast kernels for the common layout ----------------------------------------------------
#
# Scalar-state forward scans (Cumsum, Cumprod, LogCumsumExp, and Cummax/Cummin values) of
# operands whose lines sit at a uniform pitch: the plan collapses the tensor to
# [outer, extent, inner] for x and y (inner axes contiguous). Arrays are 'C' 1-D views
# indexed with uint64 (no stride multiply, no negative-index wraparound), and where the
# pointers and strides allow it every access moves an 8-byte word of ``8 // itemsize``
# elements through a second uint64 view of the same bytes.
#
# rows_fast (inner = 1): one warp per (line, segment). A tile is 32 lanes x WORDS words; lane
# ``l`` holds elements ``k*32*V + l*V + j`` (j < V) of group ``k`` in registers:
#
#     words --unpack--> V values --serial scan--> warp shfl_up scan of the lane totals
#         --> + carry + exclusive lane prefix --> pack --> words     (no smem, no barrier)
#
# cols_fast (inner >= 32): a block of 32 lanes x CHUNKS rows of threads covers 32*V columns;
# each thread scans ROWS consecutive rows of its V columns in registers, chunk totals are
# combined through shared memory (double-buffered: one barrier per tile). 2-byte elements
# (but LogCumsumExp) keep the rows as packed words across the barrier (reduce, exchange,
# rescan):
#
#     ROWS words --reduce per column--> chunk totals --smem--> prefix
#         --> rescan the words from the prefix --> cvt pairs --> words
#
# Both split few long lines into segments over warps/blocks in two phases like the generic
# kernels (phase 1: segment aggregates to ``ws``; phase 2: prefix of the earlier segments,
# combined in a fixed order, so results are deterministic). rows_fast at f32 accumulators
# (F16, BF16, F32) does it in one launch instead (PHASE_CHAINED), each segment read twice
# by its warp, the second time mostly from L2:
#
#     ticket t = atomic add on words[0]          (segments in ticket order: line-major)
#     reduce segment t --> aggregate --> words[1 + t] = READY | f32 bits   (one atomic
#         exchange: flag and value arrive together)
#     poll words[1 + first of the line .. t] until READY --> prefix, in phase 2's lanes
#         and order (bit-identical to the two launches) --> rescan segment t from it
#
# A warp waits only for segments of smaller tickets, whose warps took them earlier and
# wait only for smaller ones still: no deadlock whatever the grid and residency. The
# plan zeroes ``words`` (the ticket and the flags) before the launch.

_WORD_BYTES = 8
#: rows_fast's ``phase`` of the chained split: one launch (the kernel zeroes nothing: the
#: plan clears the ticket and flag words first)
PHASE_CHAINED = 3
#: chained split: bit 32 of a published segment word (the f32 aggregate's bits below it)
_READY_BIT = 32
#: rows_fast: uint64 words per lane per tile (loads in flight per thread)
FAST_WORDS = 2 if SIMULATOR else 4
#: rows_fast threads per block (independent warps)
FAST_ROWS_BLOCK = 32 if SIMULATOR else 128
#: cols_fast: chunks per block (threadIdx.y) and rows per thread per tile
FAST_COLS_CHUNKS = 2 if SIMULATOR else 8
_FAST_COLS_VALUES = 4 if SIMULATOR else 16  # values per thread per tile (rows x V)
#: fused Cummax/Cummin backward on the GPU: (rows words per lane, cols values per thread)
#: and chunks per cols block: blocked rows of 4 words (one warp scan per tile each way),
#: 16 cols values (fewer leave the chunk loops dominant). Measurements: docs/design/scan.md.
_EXTREMUM_BACKWARD_SIZES = (4, 16)
_EXTREMUM_COLS_CHUNKS = FAST_COLS_CHUNKS
#: family -> (rows_fast words, cols_fast values per thread by element size: 8, 4, 2
#: bytes) on the GPU: fewer for the families with large combines, whose unrolled loops
#: otherwise stay loops and put the per-thread values in local memory (PTX of compute 9.0
#: checked for ld.local/st.local). 2-byte elements of the packed cols body (every family
#: but lse) take 8 rows (32 values): twice the bytes in flight per thread of 4 rows
#: under the same register cap (docs/design/scan.md).
_FAST_COLS_BY_SIZE = (16, 16, 32)
_FAST_SIZES = {"arith": (FAST_WORDS, _FAST_COLS_BY_SIZE), "lse": (4, (8, 8, 8)),
               "extremum": (FAST_WORDS, _FAST_COLS_BY_SIZE)}

@cuda.jit(device=True, inline=True)
def _u16_from_bits(bits):
    return uint16(bits)


@cuda.jit(device=True, inline=True)
def _u16_to_bits(value):
    return uint64(value)


@cuda.jit(device=True, inline=True)
def _f32_from_bits(bits):
    return bitcast(uint32(bits), float32)


@cuda.jit(device=True, inline=True)
def _f32_to_bits(value):
    return uint64(bitcast(value, uint32))


@cuda.jit(device=True, inline=True)
def _i32_from_bits(bits):
    return bitcast(uint32(bits), int32)


@cuda.jit(device=True, inline=True)
def _i32_to_bits(value):
    return uint64(bitcast(value, uint32))


@cuda.jit(device=True, inline=True)
def _f64_from_bits(bits):
    return bitcast(uint64(bits), float64)


@cuda.jit(device=True, inline=True)
def _f64_to_bits(value):
    return bitcast(value, uint64)


@cuda.jit(device=True, inline=True)
def _i64_from_bits(bits):
    return bitcast(uint64(bits), int64)


@cuda.jit(device=True, inline=True)
def _i64_to_bits(value):
    return bitcast(value, uint64)


#: element kind -> (storage from its zero-extended bits, storage to bits); both 2-byte
#: kinds are uint16 storage (the half kernels)
_WORD_BITS = {
    ElementKind.F16: (_u16_from_bits, _u16_to_bits),
    ElementKind.BF16: (_u16_from_bits, _u16_to_bits),
    ElementKind.F32: (_f32_from_bits, _f32_to_bits),
    ElementKind.F64: (_f64_from_bits, _f64_to_bits),
    ElementKind.I32: (_i32_from_bits, _i32_to_bits),
    ElementKind.I64: (_i64_from_bits, _i64_to_bits),
}


@cuda.jit(device=True, inline=True)
def _read_entry(ws, index):
    """The two-launch split's segment aggregate ``ws[index]`` (phase 1 wrote it)."""
    return ws[index]


@cuda.jit(device=True, inline=True)
def _read_published(words, index):
    """The chained split's f32 aggregate in ``words[index]``, once it is published: the
    word is polled at L2 (``load_relaxed``) until its READY bit is set."""
    word = load_relaxed(words, index)
    while (word >> uint64(_READY_BIT)) == uint64(0):
        word = load_relaxed(words, index)
    return _f32_from_bits(word)


@cuda.jit(device=True, inline=True)
def _publish(words, index, aggregate):
    """Publish an f32 segment aggregate: READY and its bits as one 64-bit atomic exchange
    (a reader never sees the flag without the value)."""
    cuda.atomic.exch(words, index, (uint64(1) << uint64(_READY_BIT)) | _f32_to_bits(aggregate))


@cuda.jit(device=True, inline=True)
def _take_ticket(words, lane):
    """The warp's next work item: lane 0 takes ticket ``words[0]`` (an atomic counter,
    zero before the launch), every lane gets it."""
    ticket = int64(0)
    if lane == 0:
        ticket = int64(cuda.atomic.add(words, 0, uint64(1)))
    return shfl_idx(ticket, 0)


#: Forward kinds the fast kernels serve (scalar state: no index output, no flag pre-pass),
#: by family: one compiled kernel per family keeps the per-element code small (a runtime
#: kind switch with every combine inlined left the per-thread values in local memory).
#: ``arith`` (Cumsum, Cumprod): the code selects the sum or the product at run time.
FAST_FAMILY = {CODE_CUMSUM: "arith", CODE_CUMPROD: "arith", CODE_LOG_CUMSUM_EXP: "lse",
               CODE_CUMMAX: "extremum", CODE_CUMMIN: "extremum"}
#: family -> element kinds with fast kernels (the rest use the generic kernels)
FAST_ELEMENTS = {"arith": FLOAT_ELEMENTS + INT_ELEMENTS, "lse": FLOAT_ELEMENTS,
                 "extremum": FLOAT_ELEMENTS + INT_ELEMENTS}


def _scalar_forward_ops(acc: types.Type, family: str):
    """identity / combine of one family of forward kinds on the value alone: the same
    arithmetic and the same NaN, tie (later wins, which decides the sign of a zero) and
    -inf rules as ``_forward_ops``. The arith family (Cumsum, Cumprod) reads ``code``, the
    extremum family too (max or min).

    arith: a runtime select between ``a + b`` and ``a * b`` (one operation of each, so the
    same bits as the separate kernels had); the code is uniform over the launch."""
    zero, one, lowest, highest = _constants(acc)
    logaddexp = _make_logaddexp(acc)

    if family == "arith":

        @cuda.jit(device=True, inline=True)
        def identity(code):
            return one if code == CODE_CUMPROD else zero

        @cuda.jit(device=True, inline=True)
        def combine(a, b, code):
            if code == CODE_CUMPROD:
                return acc(a * b)
            return acc(a + b)

    elif family == "lse":

        @cuda.jit(device=True, inline=True)
        def identity(code):
            return lowest

        @cuda.jit(device=True, inline=True)
        def combine(a, b, code):
            return logaddexp(a, b)

    else:

        @cuda.jit(device=True, inline=True)
        def identity(code):
            return lowest if code == CODE_CUMMAX else highest

        @cuda.jit(device=True, inline=True)
        def combine(a, b, code):
            if b != b:
                return b
            if a != a:
                return a
            if code == CODE_CUMMAX:
                return b if b >= a else a
            return b if b <= a else a

    return identity, combine


class FastFormat:
    """Compile-time constants of the fast kernels at one element kind."""

    def __init__(self, element: ElementKind, family: str) -> None:
        storage, acc, widen, narrow = SCAN_STORAGE[element]
        self.element = element
        self.token = element_token(element)  # HALF: f16 and bf16 share the kernels
        self.family = family
        self.storage = storage
        self.acc = acc
        self.widen = widen
        self.narrow = narrow
        self.per_word = _WORD_BYTES // np.dtype(str(storage)).itemsize
        self.from_bits, self.to_bits = _WORD_BITS[element]
        self.identity, self.combine = _scalar_forward_ops(acc, family)


def _word_codecs(fmt: FastFormat):
    """unpack(word, j, bf16) -> accumulator value of element j; pack_one(value, j, bf16) -> its bits
    in place j of a word."""
    per_word = fmt.per_word
    bits = 64 // per_word
    mask = uint64((1 << bits) - 1) if bits < 64 else uint64(0xFFFFFFFFFFFFFFFF)
    widen, narrow, from_bits, to_bits = fmt.widen, fmt.narrow, fmt.from_bits, fmt.to_bits

    @cuda.jit(device=True, inline=True)
    def unpack(word, j, bf16):
        return widen(from_bits((word >> uint64(bits * j)) & mask), bf16)

    @cuda.jit(device=True, inline=True)
    def pack_one(value, j, bf16):
        return to_bits(narrow(value, bf16)) << uint64(bits * j)

    @cuda.jit(device=True, inline=True)
    def store_word(yw, y, index, word):
        yw[uint64(index)] = word
        if SIMULATOR:
            # The simulator copies each argument in and back out: y's copy-back (it comes
            # after yw) would undo the word store, so mirror the word's elements into y.
            for j in range(per_word):
                y[uint64(index * per_word + j)] = from_bits((word >> uint64(bits * j)) & mask)

    return unpack, pack_one, store_word


if SIMULATOR:

    def _make_pair_pack(element: ElementKind):
        narrow, to_bits = SCAN_STORAGE[element][3], _WORD_BITS[element][1]

        @cuda.jit(device=True)
        def pack_pair(high, low, bf16):
            return (to_bits(narrow(high, bf16)) << uint64(16)) | to_bits(narrow(low, bf16))

        return pack_pair

else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    def _cvt_pair(op: str):
        @intrinsic
        def cvt_pair(typingctx, high, low):
            """Bits of (high, low) rounded to 2-byte floats, ``high`` in bits 16-31: one
            ``cvt.rn.{bf16,f16}x2.f32`` (sm_80+; round to nearest even, NaN stays NaN)."""

            def codegen(context, builder, signature, args):
                fnty = ir.FunctionType(ir.IntType(32), [ir.FloatType(), ir.FloatType()])
                bits = builder.call(ir.InlineAsm(fnty, f"{op} $0, $1, $2;", "=r,f,f"), args)
                return builder.zext(bits, ir.IntType(64))

            return uint64(float32, float32), codegen

        return cvt_pair

    _cvt_bf16x2 = _cvt_pair("cvt.rn.bf16x2.f32")
    _cvt_f16x2 = _cvt_pair("cvt.rn.f16x2.f32")

    def _make_pair_pack(element: ElementKind):
        @cuda.jit(device=True, inline=True)
        def pack_pair(high, low, bf16):
            """bf16 pairs where ``bf16`` (uniform over the launch), else f16 pairs."""
            if bf16:
                return _cvt_bf16x2(high, low)
            return _cvt_f16x2(high, low)

        return pack_pair


def _make_pack_values(fmt: FastFormat):
    """pack_values(vals, first, bf16) -> the word of 2-byte floats ``vals[first:first + 4]``
    (element j in place j), converted in pairs (``_make_pair_pack``): 2 instructions per
    word instead of a rounding sequence per element (bf16 cols_fast was compute-bound
    with it: SM 78%, memory 50%, Nsight Compute, [64, 1e6] axis 0)."""
    pack_pair = _make_pair_pack(fmt.element)

    @cuda.jit(device=True, inline=True)
    def pack_values(vals, first, bf16):
        return pack_pair(vals[first + 1], vals[first], bf16) | \
            (pack_pair(vals[first + 3], vals[first + 2], bf16) << uint64(32))

    return pack_values


def _make_warp_helpers(fmt: FastFormat, read=_read_entry):
    """``warp_total`` and ``segments_prefix``, the latter reading each earlier segment's
    aggregate with ``read(source, index)``: ``_read_entry`` (the two-launch split's phase 2)
    or ``_read_published`` (the chained split), the same lanes and order either way."""
    identity, combine = fmt.identity, fmt.combine

    @cuda.jit(device=True, inline=True)
    def warp_total(value, lane, code):
        """combine(lane 0, lane 1, ..., lane 31) in lane order, on every lane (a fixed
        tree: deterministic)."""
        delta = 1
        while delta < 32:
            other = shfl_down(value, delta)
            if lane + delta < 32:
                value = combine(value, other, code)
            delta *= 2
        return shfl_idx(value, 0)

    @cuda.jit(device=True, inline=True)
    def segments_prefix(source, first, count, lane, code):
        """combine(read(source, first), ..., read(source, first + count - 1)) in order, on
        every lane: lane ``l`` combines its run of ``ceil(count / 32)`` entries, then
        ``warp_total`` the lanes (a fixed order: deterministic)."""
        per_lane = (count + 31) // 32
        lo = min(count, lane * per_lane)
        hi = min(count, lo + per_lane)
        value = identity(code)
        for g in range(lo, hi):
            value = combine(value, read(source, uint64(first + g)), code)
        return warp_total(value, lane, code)

    return warp_total, segments_prefix


def _make_tile_io(fmt: FastFormat, words: int):
    """``(load_tile, store_tile)`` of rows_fast: one tile of a lane's ``words`` words (striped,
    or blocked for the LogCumsumExp family) between the row and ``vals``; ``full`` tiles as
    whole words, the last one element by element (identity past ``s_end``)."""
    per_word = fmt.per_word
    blocked = fmt.family == "lse"
    identity, widen, narrow = fmt.identity, fmt.widen, fmt.narrow
    unpack, pack_one, store_word = _word_codecs(fmt)

    @cuda.jit(device=True, inline=True)
    def load_tile(x, xw, vals, full, base, s_end, xb, extent, extent_words, lane, reverse,
                  code, bf16):
        if full:
            for k in range(words):
                sw = base // per_word + (lane * words + k if blocked else k * 32 + lane)
                if reverse:
                    w = xw[uint64(xb // per_word + extent_words - 1 - sw)]
                else:
                    w = xw[uint64(xb // per_word + sw)]
                for j in range(per_word):
                    vals[k * per_word + j] = unpack(w, per_word - 1 - j if reverse else j, bf16)
        else:
            for k in range(words):
                for j in range(per_word):
                    s = base + (lane * words + k if blocked else k * 32 + lane) * per_word + j
                    v = identity(code)
                    if s < s_end:
                        pos = extent - 1 - s if reverse else s
                        v = widen(x[uint64(xb + pos)], bf16)
                    vals[k * per_word + j] = v

    @cuda.jit(device=True, inline=True)
    def store_tile(y, yw, vals, full, base, s_end, yb, extent, extent_words, lane, reverse, bf16):
        if full:
            for k in range(words):
                sw = base // per_word + (lane * words + k if blocked else k * 32 + lane)
                w = uint64(0)
                for j in range(per_word):
                    w |= pack_one(vals[k * per_word + j], per_word - 1 - j if reverse else j, bf16)
                if reverse:
                    store_word(yw, y, yb // per_word + extent_words - 1 - sw, w)
                else:
                    store_word(yw, y, yb // per_word + sw, w)
        else:
            for k in range(words):
                for j in range(per_word):
                    s = base + (lane * words + k if blocked else k * 32 + lane) * per_word + j
                    if s < s_end:
                        pos = extent - 1 - s if reverse else s
                        y[uint64(yb + pos)] = narrow(vals[k * per_word + j], bf16)

    return load_tile, store_tile


def _make_rows_fast(fmt: FastFormat, words: int, chained: bool):
    """The rows_fast kernel (see above) with ``words`` uint64 words per lane per tile.
    ``phase``: 0 (no split) and, for a split, 1 then 2 (two launches) or, compiled with
    ``chained`` (f32 accumulators only), PHASE_CHAINED (one launch) instead.

    Striped (default): lane ``l`` holds word ``k*32 + l`` of the tile for k < words
    (coalesced loads, one warp scan per word group). Blocked (the LogCumsumExp family,
    whose combine costs ~50 instructions): lane ``l`` holds words ``l*words + k``, a run of
    ``words*V`` consecutive elements, so one warp scan serves the whole run (f32 [4096²]:
    10 logaddexp per 2 elements striped)."""
    acc = fmt.acc
    per_word = fmt.per_word
    per_lane = words * per_word
    tile = 32 * per_lane
    blocked = fmt.family == "lse"
    scan_groups = 1 if blocked else words  # groups of consecutive elements per lane
    group = per_lane // scan_groups
    # phase 1 reduces a lane's values before the lanes: only in scan order when each lane
    # holds one run, or when the operation commutes (not for Cummax/Cummin ties)
    reduce_groups = scan_groups if fmt.family == "extremum" else 1
    reduce_size = per_lane // reduce_groups
    identity, combine = fmt.identity, fmt.combine
    load_tile, store_tile = _make_tile_io(fmt, words)
    warp_total, segments_prefix = _make_warp_helpers(fmt)
    _, published_prefix = _make_warp_helpers(fmt, _read_published)
    CHAINED = chained

    @cuda.jit(device=True, inline=True)
    def rows_fast(x, xw, yw, y, ws, flags, lines, extent, x_pitch, y_pitch, seg_len, nseg,
                  phase, reverse, vec, code, bf16):
        vals = cuda.local.array(per_lane, acc)
        lane = int64(cuda.threadIdx.x % 32)
        warps = int64(cuda.blockDim.x // 32)
        chain = CHAINED and phase == PHASE_CHAINED
        if chain:
            item = _take_ticket(flags, lane)
        else:
            item = int64(cuda.blockIdx.x) * warps + int64(cuda.threadIdx.x // 32)
        step = int64(cuda.gridDim.x) * warps
        extent_words = extent // per_word
        while item < lines * nseg:
            line = item // nseg
            seg = item - line * nseg
            xb = line * x_pitch
            yb = line * y_pitch
            s_begin = seg * seg_len
            s_end = min(extent, s_begin + seg_len)
            carry = identity(code)
            if not CHAINED and phase == 2:
                carry = segments_prefix(ws, line * nseg, seg, lane, code)
            # chained: a reducing pass over the segment (phase 1's), then a scanning one
            # (phase 2's) from the published prefix
            reducing = chain if CHAINED else phase == 1
            base = s_begin
            while base < s_end:
                full = vec and base + tile <= s_end
                load_tile(x, xw, vals, full, base, s_end, xb, extent, extent_words, lane,
                          reverse, code, bf16)
                if reducing:
                    for r in range(reduce_groups):
                        agg = vals[r * reduce_size]
                        for i in range(1, reduce_size):
                            agg = combine(agg, vals[r * reduce_size + i], code)
                        carry = combine(carry, warp_total(agg, lane, code), code)
                else:
                    for g in range(scan_groups):
                        run = vals[g * group]
                        for i in range(1, group):
                            run = combine(run, vals[g * group + i], code)
                            vals[g * group + i] = run
                        inc = run
                        delta = 1
                        while delta < 32:
                            other = shfl_up(inc, delta)
                            if lane >= delta:
                                inc = combine(other, inc, code)
                            delta *= 2
                        excl = shfl_up(inc, 1)
                        prefix = carry
                        if lane > 0:
                            prefix = combine(carry, excl, code)
                        for i in range(group):
                            vals[g * group + i] = combine(prefix, vals[g * group + i], code)
                        carry = combine(carry, shfl_idx(inc, 31), code)
                    store_tile(y, yw, vals, full, base, s_end, yb, extent, extent_words, lane,
                               reverse, bf16)
                base += tile
                if chain and reducing and base >= s_end:
                    if lane == 0:
                        _publish(flags, uint64(1 + item), carry)
                    carry = published_prefix(flags, 1 + line * nseg, seg, lane, code)
                    reducing = False
                    base = s_begin
            if not CHAINED and phase == 1 and lane == 0:
                ws[uint64(item)] = carry
            if chain:
                item = _take_ticket(flags, lane)
            else:
                item += step

    # arith: the body once per kind, each with its code a constant (the kind test folds
    # away, so each copy's loops are the plain sum's or product's: no select per combine)
    ARITH = fmt.family == "arith"

    def scan_rows_fast(x, xw, yw, y, ws, flags, lines, extent, x_pitch, y_pitch, seg_len,
                       nseg, phase, reverse, vec, code):
        """``flags`` (chained split only): ``[ticket, segment words...]``, zero at launch."""
        bf16 = code >= CODE_BF16  # a half kernel's bf16 flag rides on the code
        code = code & (CODE_BF16 - 1)
        if ARITH and code == CODE_CUMPROD:
            rows_fast(x, xw, yw, y, ws, flags, lines, extent, x_pitch, y_pitch, seg_len, nseg,
                      phase, reverse, vec, CODE_CUMPROD, bf16)
        elif ARITH:
            rows_fast(x, xw, yw, y, ws, flags, lines, extent, x_pitch, y_pitch, seg_len, nseg,
                      phase, reverse, vec, CODE_CUMSUM, bf16)
        else:
            rows_fast(x, xw, yw, y, ws, flags, lines, extent, x_pitch, y_pitch, seg_len, nseg,
                      phase, reverse, vec, code, bf16)

    scan_rows_fast.__qualname__ = f"scan_rows_fast_{fmt.family}_{fmt.token}_{words}" \
        + ("_chained" if chained else "")
    return scan_rows_fast


@cuda.jit(device=True, inline=True)
def _cols_item(item, nseg, groups, width, lane, per_word, inner, vec, seg_len, extent):
    """Work item ``item`` of the column kernels (segment-fastest, then column group, then
    outer index): its segment, outer index, this lane's first column and how many of its
    ``per_word`` columns exist, whether they can move as one word, and the segment's
    ``[s_begin, s_end)`` along the scan axis."""
    seg = item % nseg
    rest = item // nseg
    group = rest % groups
    o = rest // groups
    col = group * width + lane * per_word
    ncols = min(per_word, inner - col)
    wide = vec and ncols == per_word
    s_begin = seg * seg_len
    s_end = min(extent, s_begin + seg_len)
    return seg, o, col, ncols, wide, s_begin, s_end


@cuda.jit(device=True, inline=True)
def _cols_block(outer, inner, width, rows):
    """This thread's lane and chunk (row of threads) in a column kernel's block, the
    chunks per block, the rows per tile, the column groups per outer index and the lines."""
    chunks = int64(cuda.blockDim.y)
    return (int64(cuda.threadIdx.x), int64(cuda.threadIdx.y), chunks, chunks * rows,
            (inner + width - 1) // width, outer * inner)


def _make_cols_steps(fmt: FastFormat):
    """Device functions shared by the column kernels (``_make_cols_fast`` and
    ``_make_cols_fast_packed``), each over the ``per_word`` columns of a lane:

    * ``carry_in``: ``carry`` <- identity, then (phase 2) the aggregates of the earlier
      segments of these columns from ``ws``, combined in segment order;
    * ``exchange``: write this chunk's total ``total[at0:at0 + per_word]`` to
      ``part[parity][chunk][j][lane]`` (lane-contiguous, free of bank conflicts), barrier,
      then ``prefix`` <- ``carry`` + the totals of the earlier chunks and ``carry`` <-
      ``carry`` + every chunk's total (the carry into the next tile);
    * ``carry_out``: (phase 1) this segment's aggregate to ``ws``, segment-major.

    Runtime loops outside, unrolled loops over j inside: every local array index is a
    constant after unrolling (registers, not local memory)."""
    per_word = fmt.per_word
    identity, combine = fmt.identity, fmt.combine

    @cuda.jit(device=True, inline=True)
    def carry_in(carry, ws, phase, seg, lines, o, inner, col, ncols, code):
        for j in range(per_word):
            carry[j] = identity(code)
        if phase == 2:
            # ws is segment-major ([segment][line]): coalesced across lanes
            for g in range(seg):
                at = g * lines + o * inner + col
                for j in range(per_word):
                    if j < ncols:
                        carry[j] = combine(carry[j], ws[uint64(at + j)], code)

    @cuda.jit(device=True, inline=True)
    def exchange(part, total, at0, prefix, carry, parity, chunk, chunks, width, lane, code):
        slot = (parity * chunks + chunk) * width + lane
        for j in range(per_word):
            part[slot + j * 32] = total[at0 + j]
        cuda.syncthreads()
        for j in range(per_word):
            prefix[j] = carry[j]
        for c in range(chunk):
            at = (parity * chunks + c) * width + lane
            for j in range(per_word):
                prefix[j] = combine(prefix[j], part[at + j * 32], code)
        for j in range(per_word):
            carry[j] = prefix[j]
        for c in range(chunk, chunks):
            at = (parity * chunks + c) * width + lane
            for j in range(per_word):
                carry[j] = combine(carry[j], part[at + j * 32], code)

    @cuda.jit(device=True, inline=True)
    def carry_out(ws, carry, phase, chunk, seg, lines, o, inner, col, ncols):
        if phase == 1 and chunk == 0:
            for j in range(per_word):
                if j < ncols:
                    ws[uint64(seg * lines + o * inner + col + j)] = carry[j]

    return carry_in, exchange, carry_out


def _make_cols_kernel(fmt: FastFormat, rows: int, chunks_max: int, buffer: tuple, tile):
    """The loop shared by the column kernels: work items (segment, column group, outer
    index) over the grid, tiles of ``blockDim.y * rows`` rows over a segment, the carry
    between tiles and segments. ``tile(..., bf16)`` loads, scans and stores one tile through a
    per-thread ``buffer = (length, type)`` local array and a ``per_word`` one, ``run``."""
    acc = fmt.acc
    per_word = fmt.per_word
    width = 32 * per_word  # columns per block
    carry_in, _, carry_out = _make_cols_steps(fmt)
    part_slots = 2 * chunks_max * width
    buffer_len, buffer_type = buffer

    def scan_cols_fast(x, xw, yw, y, ws, outer, extent, inner, x_outer, x_step, y_outer,
                       y_step, seg_len, nseg, phase, reverse, vec, code):
        bf16 = code >= CODE_BF16  # a half kernel's bf16 flag rides on the code
        code = code & (CODE_BF16 - 1)
        part = cuda.shared.array(part_slots, acc)
        buf = cuda.local.array(buffer_len, buffer_type)
        carry = cuda.local.array(per_word, acc)
        run = cuda.local.array(per_word, acc)
        lane, chunk, chunks, tile_rows, groups, lines = _cols_block(outer, inner, width, rows)
        parity = int64(0)
        item = int64(cuda.blockIdx.x)
        while item < outer * groups * nseg:
            seg, o, col, ncols, wide, s_begin, s_end = _cols_item(
                item, nseg, groups, width, lane, per_word, inner, vec, seg_len, extent)
            xb = o * x_outer + col
            yb = o * y_outer + col
            carry_in(carry, ws, phase, seg, lines, o, inner, col, ncols, code)
            base = s_begin
            while base < s_end:
                tile(x, xw, yw, y, part, buf, carry, run, base + chunk * rows, s_end, xb, yb,
                     ncols, wide, extent, x_step, y_step, phase, reverse, parity, chunk,
                     chunks, lane, code, bf16)
                parity = 1 - parity
                base += tile_rows
            carry_out(ws, carry, phase, chunk, seg, lines, o, inner, col, ncols)
            item += cuda.gridDim.x

    return scan_cols_fast


def _make_cols_fast(fmt: FastFormat, rows: int, chunks_max: int):
    """The cols_fast kernel (see above): ``rows`` rows per thread per tile, up to
    ``chunks_max`` chunks (blockDim.y) per block."""
    acc = fmt.acc
    per_word = fmt.per_word
    width = 32 * per_word  # columns per block
    identity, combine, widen, narrow = fmt.identity, fmt.combine, fmt.widen, fmt.narrow
    unpack, pack_one, store_word = _word_codecs(fmt)
    _, exchange, _ = _make_cols_steps(fmt)

    @cuda.jit(device=True, inline=True)
    def tile(x, xw, yw, y, part, vals, carry, prefix, r0, s_end, xb, yb, ncols, wide,
             extent, x_step, y_step, phase, reverse, parity, chunk, chunks, lane, code, bf16):
        for r in range(rows):
            s = r0 + r
            pos = extent - 1 - s if reverse else s
            if wide and s < s_end:
                w = xw[uint64((xb + pos * x_step) // per_word)]
                for j in range(per_word):
                    vals[r * per_word + j] = unpack(w, j, bf16)
            else:
                for j in range(per_word):
                    v = identity(code)
                    if s < s_end and j < ncols:
                        v = widen(x[uint64(xb + pos * x_step + j)], bf16)
                    vals[r * per_word + j] = v
        for r in range(1, rows):
            for j in range(per_word):
                vals[r * per_word + j] = combine(vals[(r - 1) * per_word + j],
                                                 vals[r * per_word + j], code)
        exchange(part, vals, (rows - 1) * per_word, prefix, carry, parity, chunk,
                 chunks, width, lane, code)
        if phase != 1:
            for r in range(rows):
                for j in range(per_word):
                    vals[r * per_word + j] = combine(prefix[j], vals[r * per_word + j],
                                                     code)
        if phase != 1:
            for r in range(rows):
                s = r0 + r
                pos = extent - 1 - s if reverse else s
                if wide and s < s_end:
                    w = uint64(0)
                    for j in range(per_word):
                        w |= pack_one(vals[r * per_word + j], j, bf16)
                    store_word(yw, y, (yb + pos * y_step) // per_word, w)
                elif s < s_end:
                    for j in range(per_word):
                        if j < ncols:
                            y[uint64(yb + pos * y_step + j)] = narrow(
                                vals[r * per_word + j], bf16)

    scan_cols_fast = _make_cols_kernel(fmt, rows, chunks_max, (rows * per_word, acc), tile)
    scan_cols_fast.__qualname__ = f"scan_cols_fast_{fmt.family}_{fmt.token}_{rows}"
    return scan_cols_fast


def _make_cols_fast_packed(fmt: FastFormat, rows: int, chunks_max: int):
    """cols_fast for 2-byte elements: ``_make_cols_fast``'s contract and tiles, but a
    thread keeps its ``rows`` words *packed* (2 registers per row whatever V) from the
    load to the store instead of holding ``rows x V`` f32 values across the barrier: it
    reduces them column by column into its chunk total, the chunk totals are combined
    through shared memory, then it rescans the same words from its prefix,
    ``y[r] = (...((prefix + x[0]) + x[1]) ...) + x[r]``, and packs the results in pairs
    (``_make_pack_values``). f32 accumulation, one rounding per output, as before.

    The unpacked body took 137 registers for bf16 at 4 rows (capped at 64: 32 bytes in
    flight per thread, 41% of copy on [64, 1e6] axis 0); this one holds 8 rows (64 bytes)
    under the same cap. Wider elements keep ``_make_cols_fast`` (no gain packed), and so
    does LogCumsumExp, whose ~50-instruction combine is better off independent
    (``prefix + scanned[r]``) than in the rescan's dependent chain (docs/design/scan.md)."""
    per_word = fmt.per_word
    bits = 64 // per_word
    width = 32 * per_word  # columns per block
    identity, combine, narrow, to_bits = fmt.identity, fmt.combine, fmt.narrow, fmt.to_bits
    unpack, _, store_word = _word_codecs(fmt)
    pack_values = _make_pack_values(fmt)
    _, exchange, _ = _make_cols_steps(fmt)

    @cuda.jit(device=True, inline=True)
    def tile(x, xw, yw, y, part, words, carry, run, r0, s_end, xb, yb, ncols, wide,
             extent, x_step, y_step, phase, reverse, parity, chunk, chunks, lane, code, bf16):
        # rows past the segment end load nothing and are skipped below; columns
        # past ``inner`` (j >= ncols) carry zero bits and are never stored
        for r in range(rows):
            s = r0 + r
            pos = extent - 1 - s if reverse else s
            w = uint64(0)
            if wide and s < s_end:
                w = xw[uint64((xb + pos * x_step) // per_word)]
            elif s < s_end:
                for j in range(per_word):
                    if j < ncols:
                        w |= to_bits(x[uint64(xb + pos * x_step + j)]) << \
                            uint64(bits * j)
            words[r] = w
        for j in range(per_word):
            run[j] = identity(code)
        valid = min(rows, s_end - r0)  # rows of this thread in the segment
        for r in range(rows):
            if r < valid:
                for j in range(per_word):
                    run[j] = combine(run[j], unpack(words[r], j, bf16), code)
        # run <- carry + the earlier chunks' totals: this thread's prefix
        exchange(part, run, 0, run, carry, parity, chunk, chunks, width, lane, code)
        if phase != 1:
            for r in range(rows):
                s = r0 + r
                pos = extent - 1 - s if reverse else s
                for j in range(per_word):
                    run[j] = combine(run[j], unpack(words[r], j, bf16), code)
                if wide and s < s_end:
                    store_word(yw, y, (yb + pos * y_step) // per_word,
                               pack_values(run, 0, bf16))
                elif s < s_end:
                    for j in range(per_word):
                        if j < ncols:
                            y[uint64(yb + pos * y_step + j)] = narrow(run[j], bf16)

    scan_cols_fast = _make_cols_kernel(fmt, rows, chunks_max, (rows, uint64), tile)
    scan_cols_fast.__qualname__ = f"scan_cols_fast_packed_{fmt.family}_{fmt.token}_{rows}"
    return scan_cols_fast


def _c_flat(array_type: types.Type) -> types.Array:
    return types.Array(array_type, 1, "C")


#: Register cap (64: 4 blocks of 256 threads per SM) of cols_fast for 2- and 4-byte
#: elements and of the indexed rows kernel for 2-byte ones. Uncapped, cols_fast took 137
#: registers for bf16 (one block per SM) and 96 for f32, the indexed kernel 95 for bf16;
#: capped, ptxas spills 36-80 bytes (loop invariants), and every capped kernel is faster
#: than uncapped or at 80 registers; f32 indexed is not capped (no gain). The packed
#: 2-byte cols body (96 registers uncapped, 84 bytes spilled at 64) and the indexed kernel
#: with staged indices (98 / 76) keep the cap too. Measurements: docs/design/scan.md.
_MAX_REGISTERS = 64
#: Register cap of rows_fast[HALF,arith] (its two kind copies took 72 uncapped, 7 blocks of
#: 128 threads per SM; 64 fits without a spill, 8 blocks).
_ROWS_ARITH_HALF_CAP = 64


def _cap(fmt: FastFormat, max_registers: int | None, min_per_word: int) -> int | None:
    """The register cap: ``max_registers`` if given (0: none), else ``_MAX_REGISTERS``
    for elements of at least ``min_per_word`` per 8-byte word."""
    if max_registers is not None:
        return max_registers or None
    return _MAX_REGISTERS if fmt.per_word >= min_per_word else None


class FastKernels:
    """rows_fast and cols_fast of one family of forward kinds at one element kind.

    ``chained`` (rows_fast): split lines in one launch (``PHASE_CHAINED``) rather than
    two; allowed where the accumulator is f32 (F16, BF16, F32: a segment word holds READY
    and one f32), the default for the 16-bit elements, whose split rows it measured
    faster (F32's a few percent slower: docs/design/scan.md). The other choice is a tuning
    variant (its kernel name says so)."""

    def __init__(self, element: ElementKind, family: str, words: int | None = None,
                 col_values: int | None = None, register: bool = True,
                 cols_max_registers: int | None = None, chained: bool | None = None) -> None:
        fmt = FastFormat(element, family)
        chainable = fmt.acc == float32
        default = chainable and element.byte_width == 2
        if chained is None:
            chained = default
        elif chained and not chainable:
            raise ValueError(f"FastKernels: chained=True needs an f32 accumulator, not "
                             f"{fmt.acc} ({element.name})")
        words = words or (FAST_WORDS if SIMULATOR else _FAST_SIZES[family][0])
        col_values = col_values or (_FAST_COLS_VALUES if SIMULATOR else
                                    _FAST_SIZES[family][1][fmt.per_word.bit_length() - 1])
        self.format = fmt
        self.per_word = fmt.per_word
        self.words = words
        self.tile = 32 * words * fmt.per_word
        self.col_rows = max(2, col_values // fmt.per_word)
        self.acc_bytes = fmt.acc.bitwidth // 8
        #: whether rows_fast splits lines in one launch (PHASE_CHAINED) or two
        self.chained = chained
        arrays = (_c_flat(fmt.storage), _c_flat(uint64), _c_flat(uint64),
                  _c_flat(fmt.storage), _c_flat(fmt.acc))
        tag = f"{fmt.token},{family}"
        # the tile (and a non-default split) is in the names: the cubin cache is keyed by
        # name, so a tuning variant named like the default would load the default's cubin
        variant = "" if chained == default else ",chained" if chained else ",two-launch"
        self.rows = Kernel(f"scan_rows_fast[{tag},{words}{variant}]",
                           _make_rows_fast(fmt, words, chained),
                           arrays + (_c_flat(uint64),) + (int64,) * 7 + (boolean, boolean, int64),
                           register=register,
                           max_registers=_ROWS_ARITH_HALF_CAP
                           if family == "arith" and fmt.per_word == 4 else None)
        self.cols = Kernel(f"scan_cols_fast[{tag},{self.col_rows}]",
                           (_make_cols_fast_packed if fmt.per_word == 4 and family != "lse"
                            else _make_cols_fast)(fmt, self.col_rows, FAST_COLS_CHUNKS),
                           arrays + (int64,) * 10 + (boolean, boolean, int64),
                           register=register, max_registers=_cap(fmt, cols_max_registers, 2))
