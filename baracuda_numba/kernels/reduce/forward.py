"""Forward reduction kernels: the generic body (``_make_reduce``) and the word-access rows
and columns kernels (``_make_reduce_rows_vec``, ``_make_reduce_cols_vec``), with the
lane reducers the gradients reuse for their statistics.
"""


import inspect
import math
from collections.abc import Callable
from typing import Any

from numba import cuda, float32, float64, int32, int64, types, uint32, uint64

from ...types import ElementKind, ReduceKind
from ..common import (
    MAX_RANK,
    bitcast,
    copy_async8,
    copy_async_wait,
    f32_from_bits,
    f32_to_bits,
    f32_to_half,
    load_half,
    opaque,
    shfl_xor,
)
from .ops import (
    _SUM_FUNCTIONS,
    CHUNK,
    ELEMENTS,
    HALF,
    INT_ELEMENTS,
    KIND_OPS,
    SHARED_SLOTS,
    _final_a,
    _lse_chunk_for,
    _lse_for,
    _offsets4,
    _store_i64,
    _welford_for,
    forward_spec,
)
from .words import (
    VEC_LOADS,
    _word_sign,
    _word_unpacker,
    _word_width,
)

# -- element access and the runtime variant ----------------------------------------------
# A forward kernel is built for a kernel kind and an element key: an ElementKind, or HALF
# (f16 and bf16 in one kernel: uint16 storage, the ``bf16`` flag at run time). Its last
# argument ``flags`` holds that flag (bit 0) and the kind's variant (bit 1,
# ``ops.FORWARD_VARIANT_OF``): Min runs the Max kernel on flipped values (floats: the
# sign bit, integers: bitwise NOT; either reverses the order, keeps NaN NaN and is exact
# at the int64 minimum) and flips the result back; Std runs the Var kernel and takes the
# square root of the result. Both flags are uniform over a launch (no divergence); the
# flip is one XOR per loaded value or word.

#: Kernel kinds with a runtime variant: Max (Min) flips, Var (Std) takes a square root.
_FLIPPED = ReduceKind.MAX
_ROOTED = ReduceKind.VAR

_ACCESS: dict[Any, tuple[Any, Any]] = {}


def _access(key: Any) -> tuple[Any, Any]:
    """``(load(x, i, bf16), store(v, bf16))`` of element key ``key``: HALF's convert by the
    flag, the others are the element's own (the flag unused)."""
    found = _ACCESS.get(key)
    if found is not None:
        return found
    if key == HALF:

        @cuda.jit(device=True, inline=True)
        def store_half(v, bf16):
            return f32_to_half(v, bf16)

        found = (load_half, store_half)
    else:
        spec = ELEMENTS[key]
        plain_load, plain_store = spec.load, spec.store

        @cuda.jit(device=True, inline=True)
        def load(x, i, bf16):
            return plain_load(x, i)

        @cuda.jit(device=True, inline=True)
        def store(v, bf16):
            return plain_store(v)

        found = (load, store)
    _ACCESS[key] = found
    return found


@cuda.jit(device=True, inline=True)
def _flip_f32(v, sign):
    return f32_from_bits(f32_to_bits(v) ^ sign)


@cuda.jit(device=True, inline=True)
def _flip_back_f32(r, sign):
    # max.NaN's NaN is the canonical one, as min.NaN's: kept
    if r != r:
        return r
    return _flip_f32(r, sign)


@cuda.jit(device=True, inline=True)
def _flip_f64(v, sign):
    return bitcast(bitcast(v, uint64) ^ sign, float64)


@cuda.jit(device=True, inline=True)
def _flip_int(v, sign):
    return v ^ sign


def _flips(acc: types.Type) -> tuple[Any, int, Any, Any]:
    """``(sign type, sign, flip(v, sign), flip_back(r, sign))`` of an accumulator type:
    Min(x) = flip_back(Max(flip(x))). nan_max (f64) returns a NaN operand, which the
    flip back restores; ``max.NaN.f32`` returns the canonical NaN, left as it is."""
    if acc == float32:
        return uint32, 0x80000000, _flip_f32, _flip_back_f32
    if acc == float64:
        return uint64, 1 << 63, _flip_f64, _flip_f64
    return int64, -1, _flip_int, _flip_int


def _controls(kind: Any, key: Any) -> Any:
    """Device function ``controls(flags) -> (bf16, variant, sign)``: the half kernels'
    bf16 flag, the variant and the sign mask of the flip (0 where nothing flips);
    compile-time False / 0 for the keys and kinds without them."""
    HALF_KEY = key == HALF
    VARIES = kind is _FLIPPED or kind is _ROOTED
    FLIPS = kind is _FLIPPED
    SIGN_T, SIGN, _, _ = _flips(forward_spec(key).acc)

    @cuda.jit(device=True, inline=True)
    def controls(flags):
        bf16 = HALF_KEY and (flags & 1) != 0
        variant = VARIES and (flags & 2) != 0
        sign = SIGN_T(SIGN) if FLIPS and variant else SIGN_T(0)
        return bf16, variant, sign

    return controls


def _flag_kernel(body: Any, controls: Any, half_key: bool,
                 bf16_only: bool = False) -> Callable[..., None]:
    """The kernel of device function ``body`` (named ``<kernel>_body``; its last three
    parameters ``bf16, variant, sign``) taking ``flags`` instead (``_controls``): HALF runs
    ``body`` in two copies, one per value of the bf16 flag (a constant in each), so that
    each converts as one element kind throughout, as the kernels of one kind did."""
    names = ", ".join(list(inspect.signature(body.py_func).parameters)[:-3])
    name = body.py_func.__name__.removesuffix("_body")
    namespace = {"__name__": __name__, "body": body, "controls": controls,
                 "HALF_KEY": half_key}
    if bf16_only:  # one copy, bf16 throughout (the flag's bit is ignored)
        exec(f"def {name}({names}, flags):\n"  # noqa: S102 - a fixed template
             f"    _, variant, sign = controls(flags)\n"
             f"    body({names}, True, variant, sign)\n", namespace)
        return namespace[name]
    exec(f"def {name}({names}, flags):\n"  # noqa: S102 - a fixed template
         f"    bf16, variant, sign = controls(flags)\n"
         f"    if HALF_KEY and bf16:\n"
         f"        body({names}, True, variant, sign)\n"
         f"    else:\n"
         f"        body({names}, False, variant, sign)\n", namespace)
    return namespace[name]


def _loader(kind: Any, key: Any) -> Any:
    """Device function ``load(x, i, bf16, sign)``: element ``i`` in the accumulator type,
    flipped by ``sign`` for the kind that flips."""
    plain = _access(key)[0]
    if kind is not _FLIPPED:

        @cuda.jit(device=True, inline=True)
        def load(x, i, bf16, sign):
            return plain(x, i, bf16)

        return load
    flip = _flips(forward_spec(key).acc)[2]

    @cuda.jit(device=True, inline=True)
    def load_flipped(x, i, bf16, sign):
        return flip(plain(x, i, bf16), sign)

    return load_flipped


def _finisher(kind: Any, key: Any, final: Any) -> Any:
    """Device function ``finish(a, b, c, k, param, variant, sign)``: ``final`` with the
    variant's last step (Max: the flip back; Var: the square root)."""
    flip_back = _flips(forward_spec(key).acc)[3]
    FLIPS, ROOTS = kind is _FLIPPED, kind is _ROOTED

    @cuda.jit(device=True, inline=True)
    def finish(a, b, c, k, param, variant, sign):
        r = final(a, b, c, k, param)
        if FLIPS and variant:
            r = flip_back(r, sign)
        if ROOTS and variant:
            r = math.sqrt(r)
        return r

    return finish


# -- the forward kernel ------------------------------------------------------------------


_LANE_REDUCERS: dict[tuple[Any, Any, bool], Any] = {}
_LANE_COMBINERS: dict[tuple[Any, Any], Any] = {}


def _lane_combiner(kind: Any, element: ElementKind) -> Any:
    """Device function: merge the states of the ``lanes`` lanes of each slot (result in
    lane 0): xor shuffles within a warp (row layout), then a shared-memory tree across
    warps (row layout) or across lanes strided by ``slots`` (column layout). Every thread
    of the block calls it."""
    found = _LANE_COMBINERS.get((kind, element))
    if found is not None:
        return found
    ops = KIND_OPS[kind]
    merge = ops.functions(forward_spec(element).acc)[2]
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


def _lane_reducer(kind: Any, element: Any, ctl: bool = False) -> Any:
    """Device function: the state of output ``o`` over elements ``[begin, end)`` of its
    row, folded by the block's ``lanes`` lanes of one slot (complete in lane 0). Every
    thread of the block must call it (shuffles and barriers); ``valid`` threads load.
    ``element``: an ElementKind or HALF; ``ctl``: the function takes ``(bf16, sign)``
    last (``_controls``), else it has neither (no flag, nothing flipped)."""
    found = _LANE_REDUCERS.get((kind, element, ctl))
    if found is not None:
        return found
    if not ctl:
        reduce_ctl = _lane_reducer(kind, element, True)
        NO_SIGN = _flips(forward_spec(element).acc)[0](0)

        @cuda.jit(device=True, inline=True)
        def lane_reduce_plain(x, x_off, x_axis_stride, aux_value, valid, begin, end, tid,
                              lane, lanes, slots, row_layout, sa, sb, sk):
            return reduce_ctl(x, x_off, x_axis_stride, aux_value, valid, begin, end, tid,
                              lane, lanes, slots, row_layout, sa, sb, sk, False, NO_SIGN)

        _LANE_REDUCERS[(kind, element, ctl)] = lane_reduce_plain
        return lane_reduce_plain
    ops = KIND_OPS[kind]
    spec = forward_spec(element)
    ACC = spec.acc
    load = _loader(kind, element)
    step, fold_chunk, merge = ops.functions(ACC)
    INIT_A, INIT_K = ops.init_a(spec), ops.init_k
    combine = _lane_combiner(kind, element)

    @cuda.jit(device=True, inline=True)
    def fold_lane(x, x_off, x_axis_stride, aux_value, begin, end, lane, lanes, bf16, sign):
        a = ACC(INIT_A)
        b = ACC(0)
        c = ACC(0)
        k = int64(INIT_K)
        span = int64(lanes)
        x_span = span * x_axis_stride
        i = begin + lane
        x_at = x_off + i * x_axis_stride
        values = cuda.local.array(CHUNK, ACC)
        while i + (CHUNK - 1) * span < end:  # CHUNK independent loads in flight
            for u in range(CHUNK):
                values[u] = load(x, x_at + u * x_span, bf16, sign)
            a, b, c, k = fold_chunk(a, b, c, k, values, i, span, aux_value)
            i += CHUNK * span
            x_at += CHUNK * x_span
        while i < end:
            a, b, c, k = step(a, b, c, k, load(x, x_at, bf16, sign), i, aux_value)
            i += span
            x_at += x_span
        return a, b, c, k

    @cuda.jit(device=True, inline=True)
    def lane_reduce(x, x_off, x_axis_stride, aux_value, valid, begin, end, tid, lane, lanes,
                    slots, row_layout, sa, sb, sk, bf16, sign):
        a = ACC(INIT_A)
        b = ACC(0)
        c = ACC(0)
        k = int64(INIT_K)
        if valid:
            a, b, c, k = fold_lane(x, x_off, x_axis_stride, aux_value, begin, end, lane,
                                   lanes, bf16, sign)
        return combine(a, b, c, k, tid, lane, lanes, slots, row_layout, sa, sb, sk)

    _LANE_REDUCERS[(kind, element, ctl)] = lane_reduce
    return lane_reduce


def _state_writer(kind: Any, element: Any, final: Any) -> Any:
    """Device function that writes output ``o``'s combined state ``(a, b, c, k)``: to
    ``y[y_off]`` as ``store(final(a, b, c, k, param))`` (with the variant's last step,
    ``_finisher``), or with ``to_workspace`` as split ``split``'s partial state (workspace
    layout: ``ws_acc`` [n_acc][splits][out_numel] accumulators, ``ws_k``
    [splits][out_numel] int64 states). Shared by every forward kernel, so the workspace
    layout is written in one place."""
    ops = KIND_OPS[kind]
    store = _access(element)[1]
    ARG = ops.arg
    finish = _finisher(kind, element, final)
    N_ACC, USES_K = ops.n_acc, ops.uses_k

    @cuda.jit(device=True, inline=True)
    def write_state(y, y_off, ws_acc, ws_k, to_workspace, a, b, c, k, param, o, out_numel,
                    split, splits, bf16, variant, sign):
        if not to_workspace:
            if ARG:
                y[uint64(y_off)] = _store_i64(final(a, b, c, k, param))
            else:
                y[uint64(y_off)] = store(finish(a, b, c, k, param, variant, sign), bf16)
        else:
            if N_ACC >= 1:
                ws_acc[uint64(split * out_numel + o)] = a
            if N_ACC >= 2:
                ws_acc[uint64((splits + split) * out_numel + o)] = b
            if USES_K:
                ws_k[uint64(split * out_numel + o)] = k

    return write_state


def _make_reduce(kind: Any, element: Any) -> Callable[..., None]:
    ops = KIND_OPS[kind]
    spec = forward_spec(element)
    ACC = spec.acc
    load = _access(element)[0]
    merge = ops.functions(ACC)[2]
    lane_reduce = _lane_reducer(kind, element, True)
    combine = _lane_combiner(kind, element)
    controls = _controls(kind, element)
    HALF_KEY = element == HALF
    # integer sums must not go through a float division
    final = _final_a if element in INT_ELEMENTS and kind is ReduceKind.SUM else ops.final
    write_state = _state_writer(kind, element, final)
    INIT_A, INIT_K = ops.init_a(spec), ops.init_k
    N_ACC, USES_K, USES_AUX = ops.n_acc, ops.uses_k, ops.uses_aux

    @cuda.jit(device=True, inline=True)
    def reduce_rows_body(x, y, ws_acc, ws_k, aux, out_numel, extent, x_axis_stride,
                         out_shape, x_strides, y_strides, aux_strides, lanes, row_layout,
                         splits, chunk_len, mode, param, bf16, variant, sign):
        """See the module docstring. ``ws_acc``: [n_acc][splits][out_numel] accumulator
        states, ``ws_k``: [splits][out_numel] int64 states; ``bf16``, ``variant``,
        ``sign``: ``_controls``."""
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
                                out_numel, 0, splits, bf16, variant, sign)
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
            aux_value = load(aux, aux_off, bf16) if USES_AUX and valid else ACC(0)
            a, b, c, k = lane_reduce(x, x_off, x_axis_stride, aux_value, valid, begin, end,
                                     tid, lane, lanes, slots, row_layout, sa, sb, sk, bf16,
                                     sign)
            if lane == 0 and valid:
                write_state(y, y_off, ws_acc, ws_k, mode != 0, a, b, c, k, param, o,
                            out_numel, split, splits, bf16, variant, sign)
            group += cuda.gridDim.x

    return _flag_kernel(reduce_rows_body, controls, HALF_KEY)


def _vec_chunk(kind: Any, acc: types.Type, width: int, loads: int = VEC_LOADS) -> Any:
    """Fold the ``loads * width`` values of one batch of ``loads`` words (``values[u *
    width + e]`` at row index ``i0 + u * vspan + e``): Welford exactly (one merge), Sum in
    ``width`` independent chains, LogSumExp with a max, independent exps and a merge per
    part of LSE_PART values (``_lse_chunk_for``), every other kind step by step in index
    order."""
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

    if ops.functions is _lse_for:
        return _lse_chunk_for(acc, count, step, merge)

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


_VEC_LANE_REDUCERS: dict[tuple[Any, Any, bool], Any] = {}


def _vec_lane_reducer(kind: Any, element: Any, ctl: bool = False) -> Any:
    """Device function: the state of one contiguous row ``x[x_off : x_off + extent]``
    (split ``split`` of ``splits``: words ``[split * chunk_vecs,...)`` of the row's
    aligned body; split 0 adds the unaligned head, the last split the tail), folded by the
    ``lanes`` lanes of one slot with word loads and combined (complete in lane 0). Every
    thread of the block must call it; ``valid`` threads load. ``shift``: elements between
    the word-aligned base of ``xv`` and ``x``. ``element``: an ElementKind or HALF;
    ``ctl``: the function takes ``(bf16, sign, wsign)`` last (``_controls``,
    ``_word_sign``), else it has none of them (no flag, nothing flipped)."""
    found = _VEC_LANE_REDUCERS.get((kind, element, ctl))
    if found is not None:
        return found
    if not ctl:
        reduce_ctl = _vec_lane_reducer(kind, element, True)
        NO_SIGN = _flips(forward_spec(element).acc)[0](0)

        @cuda.jit(device=True, inline=True)
        def vec_lane_reduce_plain(x, xv, x_off, shift, aux_value, valid, extent, split,
                                  splits, chunk_vecs, tid, lane, lanes, slots, sa, sb, sk):
            return reduce_ctl(x, xv, x_off, shift, aux_value, valid, extent, split, splits,
                              chunk_vecs, tid, lane, lanes, slots, sa, sb, sk, False,
                              NO_SIGN, uint64(0))

        _VEC_LANE_REDUCERS[(kind, element, ctl)] = vec_lane_reduce_plain
        return vec_lane_reduce_plain
    ACC = forward_spec(element).acc
    INIT_A, INIT_K = KIND_OPS[kind].init_a(forward_spec(element)), KIND_OPS[kind].init_k
    combine = _lane_combiner(kind, element)
    fold_words = _word_folder(kind, element)

    @cuda.jit(device=True, inline=True)
    def vec_lane_reduce(x, xv, x_off, shift, aux_value, valid, extent, split, splits,
                        chunk_vecs, tid, lane, lanes, slots, sa, sb, sk, bf16, sign, wsign):
        a = ACC(INIT_A)
        b = ACC(0)
        c = ACC(0)
        k = int64(INIT_K)
        if valid:
            a, b, c, k = fold_words(x, xv, x_off, shift, aux_value, extent, split, splits,
                                    chunk_vecs, lane, lanes, bf16, sign, wsign)
        return combine(a, b, c, k, tid, lane, lanes, slots, 1, sa, sb, sk)

    _VEC_LANE_REDUCERS[(kind, element, ctl)] = vec_lane_reduce
    return vec_lane_reduce


def _word_folder(kind: Any, element: Any) -> Any:
    """Device function ``fold_words(...)``: one lane's state of its words of a row (the
    loads and folds of ``_vec_lane_reducer``, for one value of the bf16 flag)."""
    ops = KIND_OPS[kind]
    spec = forward_spec(element)
    ACC = spec.acc
    load = _loader(kind, element)
    unpack = _word_unpacker(kind, element)
    W = _word_width(element)
    LOG_W, MASK = W.bit_length() - 1, W - 1
    COUNT = VEC_LOADS * W
    chunk = _vec_chunk(kind, ACC, W)
    step = ops.functions(ACC)[0]
    INIT_A, INIT_K = ops.init_a(spec), ops.init_k

    @cuda.jit(device=True, inline=True)
    def fold_words(x, xv, x_off, shift, aux_value, extent, split, splits, chunk_vecs, lane,
                   lanes, bf16, sign, wsign):
        a = ACC(INIT_A)
        b = ACC(0)
        c = ACC(0)
        k = int64(INIT_K)
        p0 = x_off + shift
        head = (W - (p0 & MASK)) & MASK
        if head > extent:
            head = extent
        nvec = (extent - head) >> LOG_W
        base = (p0 + head) >> LOG_W
        if split == 0:
            t = int64(lane)
            while t < head:  # fewer lanes than head elements: rows of few words
                a, b, c, k = step(a, b, c, k, load(x, x_off + t, bf16, sign), t,
                                  aux_value)
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
                unpack(words[u], values, u * W, bf16, wsign)
            a, b, c, k = chunk(a, b, c, k, values, head + j * W, vspan, aux_value)
            j += VEC_LOADS * span
        if j < end:  # the rest: still one batch of loads, folded word by word
            for u in range(VEC_LOADS):
                if j + u * span < end:
                    words[u] = xv[uint64(base + j + u * span)]
            while j < end:
                unpack(words[0], values, 0, bf16, wsign)
                for u in range(VEC_LOADS - 1):
                    words[u] = words[u + 1]
                for e in range(W):
                    a, b, c, k = step(a, b, c, k, values[e], head + j * W + e, aux_value)
                j += span
        if split == splits - 1:
            t = head + (nvec << LOG_W) + lane
            while t < extent:
                a, b, c, k = step(a, b, c, k, load(x, x_off + t, bf16, sign), t,
                                  aux_value)
                t += lanes
        return a, b, c, k

    return fold_words


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
#: their rows (``plans.reduce.geometry._SHORT_GRID_X``).
#: (Measurements: docs/design/reduce.md, "Measured constants".)
PARK_MIN_LANES = 8


def _short_row_steps(kind: Any) -> tuple[Any, Any, Any]:
    """The steps of ``reduce_rows_vec``'s short-row path: ``(short_row_words,
    park_short_row, parked_words)``."""
    SHORT_WORDS = VEC_LOADS if kind in LONG_SHORT_KINDS else SHORT_LOADS

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

    @cuda.jit(device=True, inline=True)
    def parked_words(parked, words, tid, block, whole):
        """Wait for the thread's parked words of its row and take them into ``words``."""
        copy_async_wait()
        for u in range(SHORT_WORDS):  # the thread's own slots: no barrier
            if u < SHORT_LOADS or whole:
                words[u] = parked[tid + u * block]

    return short_row_words, park_short_row, parked_words


def _short_folder(kind: Any, element: Any) -> Any:
    """Device function ``fold_short(words, values, whole, lane, vspan, aux_value, bf16,
    wsign)``: the state of one lane's words of a short row (VEC_LOADS words where
    ``whole``, else SHORT_LOADS), folded with the kind's chunk."""
    ops = KIND_OPS[kind]
    spec = forward_spec(element)
    ACC = spec.acc
    W = _word_width(element)
    SHORT_WORDS = VEC_LOADS if kind in LONG_SHORT_KINDS else SHORT_LOADS
    INIT_A, INIT_K = ops.init_a(spec), ops.init_k
    short_chunk = _vec_chunk(kind, ACC, W, SHORT_LOADS)
    long_chunk = _vec_chunk(kind, ACC, W)
    unpack = _word_unpacker(kind, element)

    @cuda.jit(device=True, inline=True)
    def fold_short(words, values, whole, lane, vspan, aux_value, bf16, wsign):
        a = ACC(INIT_A)
        b = ACC(0)
        c = ACC(0)
        k = int64(INIT_K)
        if whole:
            for u in range(SHORT_WORDS):
                unpack(words[u], values, u * W, bf16, wsign)
            return long_chunk(a, b, c, k, values, int64(lane * W), vspan, aux_value)
        for u in range(SHORT_LOADS):
            unpack(words[u], values, u * W, bf16, wsign)
        return short_chunk(a, b, c, k, values, int64(lane * W), vspan, aux_value)

    return fold_short


def _make_reduce_rows_vec(kind: Any, element: Any, park: bool = False,
                          bf16_only: bool = False) -> Callable[..., None]:
    ops = KIND_OPS[kind]
    spec = forward_spec(element)
    ACC = spec.acc
    load = _access(element)[0]
    vec_lane_reduce = _vec_lane_reducer(kind, element, True)
    write_state = _state_writer(kind, element, ops.final)
    combine = _lane_combiner(kind, element)
    controls, word_sign = _controls(kind, element), _word_sign(kind, element)
    W = _word_width(element)
    LOG_W = W.bit_length() - 1
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
    HALF_KEY = element == HALF
    short_row_words, park_short_row, parked_words = _short_row_steps(kind)
    fold_short = _short_folder(kind, element)

    @cuda.jit(device=True, inline=True)
    def reduce_rows_vec_body(x, xv, y, ws_acc, ws_k, aux, out_numel, extent, out_shape,
                             x_strides, y_strides, aux_strides, lanes, splits, chunk_vecs,
                             mode, param, shift, bf16, variant, sign):
        """Contiguous rows (reduce axis stride 1) with word loads: ``lanes`` lanes per row
        (consecutive threads), ``block / lanes`` rows per block, grid.x over row groups
        (grid-stride), grid.y over ``splits`` splits of ``chunk_vecs`` words. ``mode`` 0
        writes ``y``, 1 the split's partial state (merged by the ``reduce`` kernel's modes
        2/3, same workspace layout).

        ``chunk_vecs == 0`` selects the short-row path (plans: one split, one collapsed
        output dim, ``shift == 0``, rows of exactly ``lanes * SHORT_LOADS`` or, for
        LONG_SHORT_KINDS, ``lanes * VEC_LOADS`` words starting on a word): lane ``l`` of
        row ``o`` loads words ``l + u * lanes`` (u < the words per lane) at once and folds
        them with the kind's chunk; no head, tail or remainder path and one multiply per
        offset. LONG_SHORT_KINDS with rows of at least PARK_MIN_LANES lanes issue the
        ``cp.async`` copies of each thread's words of its next row (one grid of groups
        later) into its own shared slots once it has its current words in registers, so
        they are in flight while the block combines and writes the current row.
        ``bf16``, ``variant``, ``sign``: ``_controls``."""
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
        wsign = word_sign(variant)
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
            park = PARK and lanes >= PARK_MIN_LANES  # always, where the plans bind a park kernel
            o = group * slots + slot
            if park and o < out_numel:
                park_short_row(parked, tid, block, xv, o, row_words, lane, lanes, whole)
            while group * slots < out_numel:  # uniform across the block
                o = group * slots + slot
                valid = o < out_numel
                if park:
                    parked_words(parked, words, tid, block, whole)
                elif valid:
                    short_row_words(xv, words, o, row_words, lane, lanes, whole)
                a = ACC(INIT_A)
                b = ACC(0)
                c = ACC(0)
                k = int64(INIT_K)
                if valid:
                    aux_value = load(aux, uint64(o) * aux_stride, bf16) if USES_AUX \
                        else ACC(0)
                    a, b, c, k = fold_short(words, values, whole, lane, vspan, aux_value,
                                            bf16, wsign)
                # the next copies into the slots read above: a thread's own read comes first
                # in program order, so it cannot see them
                if park and o + ahead < out_numel:
                    park_short_row(parked, tid, block, xv, o + ahead, row_words, lane, lanes,
                                   whole)
                a, b, c, k = combine(a, b, c, k, tid, lane, lanes, slots, 1, sa, sb, sk)
                if lane == 0 and valid:
                    write_state(y, int64(uint64(o) * y_stride), ws_acc, ws_k, mode != 0, a, b,
                                c, k, param, o, out_numel, split, splits, bf16, variant, sign)
                group += cuda.gridDim.x
            return
        while group * slots < out_numel:  # uniform across the block
            o = group * slots + slot
            valid = o < out_numel
            x_off = y_off = aux_off = int64(0)
            if valid:
                x_off, y_off, aux_off, _ = _offsets4(o, out_shape, x_strides, y_strides,
                                                     aux_strides, aux_strides)
            aux_value = load(aux, aux_off, bf16) if USES_AUX and valid else ACC(0)
            a, b, c, k = vec_lane_reduce(x, xv, x_off, shift, aux_value, valid, extent, split,
                                         splits, chunk_vecs, tid, lane, lanes, slots, sa, sb,
                                         sk, bf16, sign, wsign)
            if lane == 0 and valid:
                write_state(y, y_off, ws_acc, ws_k, mode != 0, a, b, c, k, param, o,
                            out_numel, split, splits, bf16, variant, sign)
            group += cuda.gridDim.x

    return _flag_kernel(reduce_rows_vec_body, controls, HALF_KEY, bf16_only)


def _make_reduce_cols_vec(kind: Any, element: Any) -> Callable[..., None]:
    ops = KIND_OPS[kind]
    spec = forward_spec(element)
    ACC = spec.acc
    load = _access(element)[0]
    step, fold_chunk, merge = ops.functions(ACC)
    combine = _lane_combiner(kind, element)
    write_state = _state_writer(kind, element, ops.final)
    controls, word_sign = _controls(kind, element), _word_sign(kind, element)
    unpack = _word_unpacker(kind, element)
    W = _word_width(element)
    LOG_W = W.bit_length() - 1
    HALF_KEY = element == HALF
    CHUNK_VALUES = CHUNK * W
    INIT_A, INIT_K = ops.init_a(spec), ops.init_k
    USES_AUX = ops.uses_aux

    @cuda.jit(device=True, inline=True)
    def fold_columns(xv, st_a, st_b, st_k, aux_values, words, values, column, c, ow, begin,
                     end, lane, span, word_span, axis_words, bf16, wsign):
        """One lane's states of the W outputs of word ``ow`` over its rows of
        ``[begin, end)`` (in ``st_a``, ``st_b``, ``st_k``); returns ``c``."""
        i = begin + lane
        at = i * axis_words + ow
        while i + (CHUNK - 1) * span < end:  # CHUNK word loads in flight
            for u in range(CHUNK):
                words[u] = xv[uint64(at + u * word_span)]
            for u in range(CHUNK):
                unpack(words[u], values, u * W, bf16, wsign)
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
                unpack(words[0], values, 0, bf16, wsign)
                for u in range(CHUNK - 1):
                    words[u] = words[u + 1]
                for e in range(W):
                    a, b, c, k = step(st_a[e], st_b[e], c, st_k[e], values[e], i,
                                      aux_values[e])
                    st_a[e] = a
                    st_b[e] = b
                    st_k[e] = k
                i += span
        return c

    @cuda.jit(device=True, inline=True)
    def reduce_cols_vec_body(xv, y, ws_acc, ws_k, aux, out_numel, extent, axis_words,
                             y_stride, aux_stride, lanes, splits, chunk_len, mode, param, bf16,
                             variant, sign):
        """Column layout with word loads: ``x`` is ``extent`` rows of ``out_numel``
        contiguous outputs, ``axis_words`` words apart (word aligned, ``out_numel`` a
        multiple of W). Each slot owns the W outputs of one word (W states); consecutive
        threads own consecutive words, the ``block / slots`` lanes of a slot walk the axis
        together and meet in a shared-memory tree; grid.y splits the axis (``mode`` as in
        ``reduce_rows_vec``); ``bf16``, ``variant``, ``sign``: ``_controls``."""
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
        wsign = word_sign(variant)
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
                    aux_values[e] = load(aux, ((ow << LOG_W) + e) * aux_stride, bf16)
            if valid:
                c = fold_columns(xv, st_a, st_b, st_k, aux_values, words, values, column,
                                 c, ow, begin, end, lane, span, word_span, axis_words,
                                 bf16, wsign)
            for e in range(W):
                a, b, c, k = combine(st_a[e], st_b[e], c, st_k[e], tid, lane, lanes, slots, 0,
                                     sa, sb, sk)
                if lane == 0 and valid:
                    o = (ow << LOG_W) + e
                    write_state(y, o * y_stride, ws_acc, ws_k, mode != 0, a, b, c, k, param, o,
                                out_numel, split, splits, bf16, variant, sign)
            group += cuda.gridDim.x

    return _flag_kernel(reduce_cols_vec_body, controls, HALF_KEY)

