"""Scan: the indexed rows kernel, Cummax/Cummin with indices and record flags over the
fast kernels' layouts and word codecs."""

from __future__ import annotations

from numba import boolean, cuda, int64, types, uint64

from ..._runtime import SIMULATOR
from ...launch import Kernel
from ...types import ElementKind
from ..common import (
    shfl_down,
    shfl_idx,
    shfl_up,
)
from .fast import FAST_ROWS_BLOCK, FastFormat, _c_flat, _cap, _word_codecs
from .ops import (
    CODE_BF16,
    CODE_CUMMAX,
    CODE_CUMMAX_RECORD_FLAG,
    CODE_CUMMIN,
    CODE_CUMMIN_RECORD_FLAG,
    _constants,
)


def _indexed_ops(acc: types.Type):
    """identity / combine of Cummax/Cummin with the winner's position, and of their
    record-flag pre-passes: ``_forward_ops`` restricted to these four
    codes (the same NaN and tie rules), so the kernel stays small."""
    _, _, lowest, highest = _constants(acc)
    no_index = int64(-1)

    @cuda.jit(device=True, inline=True)
    def identity(code):
        if code == CODE_CUMMAX or code == CODE_CUMMAX_RECORD_FLAG:
            return (lowest, no_index)
        return (highest, no_index)

    @cuda.jit(device=True, inline=True)
    def combine(a, b, code):
        # the record-flag pre-passes follow the same rule: a record is where the index
        # output changes, so the gradient goes where torch's does
        if b[0] != b[0]:  # a later NaN wins (torch: the index of the last NaN)
            return b
        if a[0] != a[0]:
            return a
        if code == CODE_CUMMAX or code == CODE_CUMMAX_RECORD_FLAG:
            return b if b[0] >= a[0] else a
        return b if b[0] <= a[0] else a

    return identity, combine


if SIMULATOR:

    @cuda.jit(device=True)
    def _warp_barrier():
        """The simulator runs one warp per block where this is used."""
        cuda.syncthreads()

else:

    @cuda.jit(device=True, inline=True)
    def _warp_barrier():
        cuda.syncwarp()


#: Indexed rows kernel: words per lane per tile. One on the GPU: with 2 or 4 the word loop
#: stays a loop and the (value, position) pairs go to local memory (PTX, compute 9.0).
_INDEXED_WORDS = 2 if SIMULATOR else 1
#: Codes of the indexed rows kernel: Cummax/Cummin with an index output, and the record
#: flags of their backward (a 1 where the element is the running winner, else 0).
INDEXED_CODES = (CODE_CUMMAX, CODE_CUMMIN, CODE_CUMMAX_RECORD_FLAG, CODE_CUMMIN_RECORD_FLAG)


def _indexed_tiles(fmt: FastFormat, words: int):
    """``load_tile`` / ``store_tile`` of ``_make_rows_indexed``: a striped tile's values
    and positions (-1 past the segment's end) into the lane's ``vals`` / ``idxs``, words
    where the tile is whole; the scanned values (or record flags) and indices back, the
    indices of full 2-byte tiles through the warp's ``stage`` slice."""
    per_word = fmt.per_word
    tile = 32 * words * per_word
    per_lane = words * per_word
    stage_indices = per_word == 4
    identity, _ = _indexed_ops(fmt.acc)
    widen, narrow = fmt.widen, fmt.narrow
    unpack, pack_one, store_word = _word_codecs(fmt)

    @cuda.jit(device=True, inline=True)
    def load_tile(x, xw, vals, idxs, base, s_end, full, lane, xb, extent, extent_words,
                  reverse, code, bf16):
        for k in range(words):
            sw = base // per_word + k * 32 + lane
            w = uint64(0)
            if full:
                if reverse:
                    w = xw[uint64(xb // per_word + extent_words - 1 - sw)]
                else:
                    w = xw[uint64(xb // per_word + sw)]
            for j in range(per_word):
                s = sw * per_word + j
                pos = extent - 1 - s if reverse else s
                v = identity(code)[0]
                p = int64(-1)
                if full:
                    v = unpack(w, per_word - 1 - j if reverse else j, bf16)
                    p = pos
                elif s < s_end:
                    v = widen(x[uint64(xb + pos)], bf16)
                    p = pos
                vals[k * per_word + j] = v
                idxs[k * per_word + j] = p
    @cuda.jit(device=True, inline=True)
    def store_tile(yw, y, out_idx, stage, vals, idxs, base, s_end, full, lane, yb, ib, extent,
                   extent_words, slice_at, reverse, write_index, bf16):
        staged = stage_indices and full and write_index
        for k in range(words):
            sw = base // per_word + k * 32 + lane
            if full:
                w = uint64(0)
                for j in range(per_word):
                    w |= pack_one(vals[k * per_word + j],
                                  per_word - 1 - j if reverse else j, bf16)
                if reverse:
                    store_word(yw, y, yb // per_word + extent_words - 1 - sw, w)
                else:
                    store_word(yw, y, yb // per_word + sw, w)
            for j in range(per_word):
                s = sw * per_word + j
                if staged:
                    # offset in the tile's span of memory (ascending positions)
                    at = (k * 32 + lane) * per_word + j
                    if reverse:
                        at = tile - 1 - at
                    stage[slice_at + at + at // 16] = idxs[k * per_word + j]
                elif s < s_end:
                    pos = extent - 1 - s if reverse else s
                    if not full:
                        y[uint64(yb + pos)] = narrow(vals[k * per_word + j], bf16)
                    if write_index:
                        out_idx[uint64(ib + pos)] = idxs[k * per_word + j]
        if staged:
            _warp_barrier()
            first = extent - base - tile if reverse else base
            for m in range(per_lane):
                at = m * 32 + lane
                out_idx[uint64(ib + first + at)] = stage[slice_at + at + at // 16]
            _warp_barrier()  # the slice is rewritten by the next tile
    return load_tile, store_tile


def _make_rows_indexed(fmt: FastFormat, words: int):
    """rows_fast for the (value, position) state of Cummax/Cummin (striped tiles; the
    combine is not commutative, so phase 1 reduces each word group in scan order).

    Full tiles of 2-byte elements write their int64 indices through shared memory (one
    slice per warp): a lane's 4 consecutive indices stored directly are 4 stores of 8
    bytes at a 32-byte stride across the warp, each touching 32 sectors in part (L2
    throughput 79% vs DRAM 33% for bf16 [4096²], Nsight Compute); staged, each store
    instruction writes 256 consecutive bytes. One padding slot per 16 indices keeps the
    staging free of bank conflicts (8-byte accesses, both orders). Staging pays for
    2-byte elements only; f32 (2 per lane, 16-byte stride) is slower staged, so 4-byte
    elements store directly (docs/design/scan.md)."""
    acc = fmt.acc
    per_word = fmt.per_word
    per_lane = words * per_word
    tile = 32 * per_lane
    stage_indices = per_word == 4
    warp_slots = tile + tile // 16
    stage_slots = (FAST_ROWS_BLOCK // 32) * warp_slots if stage_indices else 1
    zero, one, _, _ = _constants(acc)
    identity, combine = _indexed_ops(acc)
    load_tile, store_tile = _indexed_tiles(fmt, words)

    @cuda.jit(device=True, inline=True)
    def shfl_pair_up(state, delta):
        return (shfl_up(state[0], delta), shfl_up(state[1], delta))

    @cuda.jit(device=True, inline=True)
    def warp_total(state, lane, code):
        delta = 1
        while delta < 32:
            other = (shfl_down(state[0], delta), shfl_down(state[1], delta))
            if lane + delta < 32:
                state = combine(state, other, code)
            delta *= 2
        return (shfl_idx(state[0], 0), shfl_idx(state[1], 0))

    def scan_rows_indexed(x, xw, yw, y, out_idx, ws_a, ws_b, lines, extent, x_pitch,
                          y_pitch, i_pitch, seg_len, nseg, phase, reverse, vec, write_index,
                          code):
        bf16 = code >= CODE_BF16  # a half kernel's bf16 flag rides on the code
        code = code & (CODE_BF16 - 1)
        vals = cuda.local.array(per_lane, acc)
        idxs = cuda.local.array(per_lane, int64)
        stage = cuda.shared.array(stage_slots, int64)
        lane = int64(cuda.threadIdx.x % 32)
        warps = int64(cuda.blockDim.x // 32)
        item = int64(cuda.blockIdx.x) * warps + int64(cuda.threadIdx.x // 32)
        step = int64(cuda.gridDim.x) * warps
        slice_at = int64(cuda.threadIdx.x // 32) * warp_slots
        extent_words = extent // per_word
        flags = code >= CODE_CUMMAX_RECORD_FLAG
        while item < lines * nseg:
            line = item // nseg
            seg = item - line * nseg
            xb = line * x_pitch
            yb = line * y_pitch
            ib = line * i_pitch
            s_begin = seg * seg_len
            s_end = min(extent, s_begin + seg_len)
            carry = identity(code)
            if phase == 2:
                # combine(ws[first], ..., ws[first + seg - 1]) in order, on every lane
                first = line * nseg
                per = (seg + 31) // 32
                lo = min(seg, lane * per)
                hi = min(seg, lo + per)
                part = identity(code)
                for g in range(lo, hi):
                    part = combine(part, (ws_a[uint64(first + g)], ws_b[uint64(first + g)]),
                                   code)
                carry = warp_total(part, lane, code)
            base = s_begin
            while base < s_end:
                full = vec and base + tile <= s_end
                load_tile(x, xw, vals, idxs, base, s_end, full, lane, xb, extent,
                          extent_words, reverse, code, bf16)
                for k in range(words):
                    run = (vals[k * per_word], idxs[k * per_word])
                    for j in range(1, per_word):
                        run = combine(run, (vals[k * per_word + j], idxs[k * per_word + j]),
                                      code)
                        vals[k * per_word + j] = run[0]
                        idxs[k * per_word + j] = run[1]
                    if phase == 1:
                        carry = combine(carry, warp_total(run, lane, code), code)
                    else:
                        inc = run
                        delta = 1
                        while delta < 32:
                            other = shfl_pair_up(inc, delta)
                            if lane >= delta:
                                inc = combine(other, inc, code)
                            delta *= 2
                        excl = shfl_pair_up(inc, 1)
                        prefix = carry
                        if lane > 0:
                            prefix = combine(carry, excl, code)
                        for j in range(per_word):
                            state = combine(prefix, (vals[k * per_word + j],
                                                     idxs[k * per_word + j]), code)
                            value = state[0]
                            if flags:
                                s = (base // per_word + k * 32 + lane) * per_word + j
                                pos = extent - 1 - s if reverse else s
                                value = one if state[1] == pos else zero
                            vals[k * per_word + j] = value
                            idxs[k * per_word + j] = state[1]
                        carry = combine(carry, (shfl_idx(inc[0], 31), shfl_idx(inc[1], 31)),
                                        code)
                if phase != 1:
                    store_tile(yw, y, out_idx, stage, vals, idxs, base, s_end, full, lane, yb,
                               ib, extent, extent_words, slice_at, reverse, write_index, bf16)
                base += tile
            if phase == 1 and lane == 0:
                ws_a[uint64(item)] = carry[0]
                ws_b[uint64(item)] = carry[1]
            item += step

    scan_rows_indexed.__qualname__ = f"scan_rows_indexed_{fmt.token}_{words}"
    return scan_rows_indexed


class IndexedKernels:
    """rows_fast with the winner's position: Cummax/Cummin with indices and the record
    flags of their backward, at one element kind."""

    def __init__(self, element: ElementKind, words: int = _INDEXED_WORDS,
                 register: bool = True, max_registers: int | None = None) -> None:
        fmt = FastFormat(element, "extremum")
        self.per_word = fmt.per_word
        self.tile = 32 * words * fmt.per_word
        arrays = (_c_flat(fmt.storage), _c_flat(uint64), _c_flat(uint64),
                  _c_flat(fmt.storage), _c_flat(int64), _c_flat(fmt.acc), _c_flat(int64))
        self.rows = Kernel(f"scan_rows_indexed[{fmt.token},{words}]",
                           _make_rows_indexed(fmt, words),
                           arrays + (int64,) * 8 + (boolean, boolean, boolean, int64),
                           register=register, max_registers=_cap(fmt, max_registers, 4))
