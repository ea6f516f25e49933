"""Device helpers shared by every kernel family.

* bf16 <-> f32 in registers: bf16 is the top half of an f32, so widening is a shift;
  narrowing rounds to nearest even, ``(bits + 0x7FFF + ((bits >> 16) & 1)) >> 16``,
  with NaN kept quiet (``0x7FC0`` | sign).
* ``bitcast(value, target)``: the same bits as another numeric type of the same width.
* Words: ``pack_*`` / ``unpack_*`` put 2 or 4 f16/bf16/f32 values into one 32- or 64-bit
  integer and back (bf16 narrowing: one ``cvt.rn.bf16x2.f32`` per pair on the GPU).
* NaN-propagating max/min: once either side is NaN the result is NaN (f32: one
  ``max.NaN``/``min.NaN`` instruction).
* Strided offsets for rank <= 8 (shape/strides padded to 8 with leading extent 1).
* Full-warp shuffles. The simulator has no shuffles: there they are emulated with a
  block-shared scratch row and two barriers, so every thread of the block must call them
  together (which block-level algorithms do anyway).

Everything here is ``inline`` so helpers cost nothing over hand-written code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32, int64, types, uint16, uint32, uint64
from numba.types import float16

from .._runtime import SIMULATOR

MAX_RANK = 8
FULL_MASK = 0xFFFFFFFF

# -- bf16 ------------------------------------------------------------------------------

if SIMULATOR:

    @cuda.jit(device=True)
    def bf16_to_f32(bits):
        """f32 value of bf16 storage ``bits`` (uint16)."""
        return np.float32(np.uint32(np.uint32(bits) << np.uint32(16)).view(np.float32))

    @cuda.jit(device=True)
    def f32_to_bf16(value):
        """bf16 storage (uint16) nearest to f32 ``value`` (ties to even, NaN stays NaN)."""
        bits = int(np.float32(value).view(np.uint32))
        if value != value:
            return np.uint16(((bits >> 16) & 0x8000) | 0x7FC0)
        return np.uint16(((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF)

else:
    from numba.cuda import libdevice

    @cuda.jit(device=True, inline=True)
    def bf16_to_f32(bits):
        """f32 value of bf16 storage ``bits`` (uint16)."""
        return libdevice.int_as_float(int32(uint32(bits) << uint32(16)))

    @cuda.jit(device=True, inline=True)
    def f32_to_bf16(value):
        """bf16 storage (uint16) nearest to f32 ``value`` (ties to even, NaN stays NaN)."""
        bits = uint32(libdevice.float_as_int(float32(value)))
        if value != value:
            return uint16(((bits >> uint32(16)) & uint32(0x8000)) | uint32(0x7FC0))
        rounded = bits + uint32(0x7FFF) + ((bits >> uint32(16)) & uint32(1))
        return uint16(rounded >> uint32(16))


# -- bit casts -----------------------------------------------------------------------------

if SIMULATOR:

    @cuda.jit(device=True)
    def bitcast(value, target):
        """``value``'s bits read as numeric type ``target`` (same width)."""
        return np.asarray(value).view(np.dtype(str(target)))[()]

else:
    from llvmlite import ir as _ir
    from numba.cuda.extending import intrinsic

    #: Numba scalar type -> (LLVM type, inline-asm register constraint).
    _ASM_TYPES = {types.float32: (_ir.FloatType(), "f"), types.uint32: (_ir.IntType(32), "r")}

    def _asm_binary(text: str, result: types.Type, operand: types.Type):  # noqa: ANN202
        """A Numba intrinsic ``result(operand, operand)`` that is the one PTX instruction
        ``text`` (``$0`` the result, ``$1`` and ``$2`` the operands)."""
        out, out_constraint = _ASM_TYPES[result]
        arg, arg_constraint = _ASM_TYPES[operand]
        fnty = _ir.FunctionType(out, [arg, arg])
        constraints = f"={out_constraint},{arg_constraint},{arg_constraint}"

        @intrinsic
        def asm_binary(typingctx, a, b):
            def codegen(context, builder, signature, args):
                return builder.call(_ir.InlineAsm(fnty, text, constraints), args)

            return result(operand, operand), codegen

        return asm_binary

    @intrinsic
    def bitcast(typingctx, value, target):
        """``value``'s bits read as numeric type ``target`` (same width): one LLVM
        ``bitcast``, no instruction (f16 lives in an i16 register, f32 in a b32 one)."""
        to = target.instance_type

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(to))

        return to(value, target), codegen


# -- words: two or four elements in one integer -----------------------------------------
# Vector kernels move 4-, 8- or 16-byte words and (un)pack the elements in registers:
# f16 by bit casts plus the hardware ``cvt``, bf16 by shifts (widening) and
# ``cvt.rn.bf16x2.f32`` (narrowing two values in one instruction), f32 by bit casts. The
# lower element is the one at the lower address (little endian).


@cuda.jit(device=True, inline=True)
def f32_from_bits(bits):
    """The float32 whose bits are the low 32 bits of integer ``bits``."""
    return bitcast(uint32(bits), float32)


@cuda.jit(device=True, inline=True)
def f32_to_bits(value):
    """uint32 holding the bits of float32 ``value``."""
    return bitcast(float32(value), uint32)


@cuda.jit(device=True, inline=True)
def f16_from_bits(bits):
    """The float16 stored in the low 16 bits of integer ``bits`` (f16 -> f32 is then the
    hardware ``cvt``)."""
    return bitcast(uint16(bits & 0xFFFF), float16)


@cuda.jit(device=True, inline=True)
def f16_to_bits(value):
    """uint32 holding the 16 storage bits of float16 ``value``."""
    return uint32(bitcast(float16(value), uint16))


if SIMULATOR:

    @cuda.jit(device=True, inline=True)
    def pack_bf16x2(low, high):
        """uint32 of two bf16 values rounded from f32 (``low`` in the lower half)."""
        return uint32(f32_to_bf16(low)) | (uint32(f32_to_bf16(high)) << uint32(16))

    @cuda.jit(device=True, inline=True)
    def pack_f16x2(low, high):
        """uint32 of two f16 values rounded from f32 (``low`` in the lower half)."""
        return f16_to_bits(float16(low)) | (f16_to_bits(float16(high)) << uint32(16))

else:

    def _cvt_x2(target: str):  # noqa: ANN202 - returns a Numba intrinsic
        # (high, low) -> uint32
        return _asm_binary(f"cvt.rn.{target}.f32 $0, $1, $2;", types.uint32, types.float32)

    #: ``cvt.rn.bf16x2.f32``: two values rounded to nearest even in one instruction
    #: (sm_80+), ``high`` in the upper half. The software narrowing of
    #: :func:`f32_to_bf16` is 6 integer instructions per value plus a NaN test. Same
    #: results except NaN, which comes out as the canonical quiet NaN.
    _cvt_bf16x2 = _cvt_x2("bf16x2")
    #: ``cvt.rn.f16x2.f32``: the same for f16 (the rounding of ``float16(f32)``). Packing
    #: two ``cvt.rn.f16.f32`` results with shifts let LLVM emit ``bfi.b64 ..., 16, 48``
    #: in the reduce gradients, which came out with the top element missing on the GPU;
    #: one packed conversion leaves nothing to insert.
    _cvt_f16x2 = _cvt_x2("f16x2")

    @cuda.jit(device=True, inline=True)
    def pack_bf16x2(low, high):
        """uint32 of two bf16 values rounded from f32 (``low`` in the lower half)."""
        return _cvt_bf16x2(float32(high), float32(low))

    @cuda.jit(device=True, inline=True)
    def pack_f16x2(low, high):
        """uint32 of two f16 values rounded from f32 (``low`` in the lower half): round to
        nearest even, overflow to inf."""
        return _cvt_f16x2(float32(high), float32(low))


@cuda.jit(device=True, inline=True)
def unpack_bf16x2(unit):
    """The two bf16 values of a uint32 as f32 (lower half first)."""
    return (bf16_to_f32(uint16(unit & uint32(0xFFFF))),
            bf16_to_f32(uint16(unit >> uint32(16))))


@cuda.jit(device=True, inline=True)
def unpack_f16x2(unit):
    """The two f16 values of a uint32 as f32 (lower half first)."""
    return (float32(f16_from_bits(unit & uint32(0xFFFF))),
            float32(f16_from_bits(unit >> uint32(16))))


@cuda.jit(device=True, inline=True)
def pack_f32x2(low, high):
    """uint64 of two f32 values (``low`` in the lower half)."""
    return uint64(f32_to_bits(low)) | (uint64(f32_to_bits(high)) << uint64(32))


@cuda.jit(device=True, inline=True)
def unpack_f32x2(unit):
    """The two f32 values of a uint64 (lower half first)."""
    return (f32_from_bits(uint32(unit & uint64(0xFFFFFFFF))),
            f32_from_bits(uint32(unit >> uint64(32))))


def _x4(pack_x2: Any, unpack_x2: Any) -> tuple[Any, Any]:
    """``pack_x4(a0, a1, a2, a3)`` -> uint64 of four 16-bit values rounded from f32 (``a0``
    at the lowest address) and ``unpack_x4(unit)`` -> the four as f32 (lowest address
    first), from the element kind's pair helpers (two pairs, lower 32 bits first)."""

    @cuda.jit(device=True, inline=True)
    def pack_x4(a0, a1, a2, a3):
        return uint64(pack_x2(a0, a1)) | (uint64(pack_x2(a2, a3)) << uint64(32))

    @cuda.jit(device=True, inline=True)
    def unpack_x4(unit):
        low, high = uint32(unit & uint64(0xFFFFFFFF)), uint32(unit >> uint64(32))
        a0, a1 = unpack_x2(low)
        a2, a3 = unpack_x2(high)
        return a0, a1, a2, a3

    return pack_x4, unpack_x4


#: Four f16 / bf16 values in a uint64 (see ``_x4``).
pack_f16x4, unpack_f16x4 = _x4(pack_f16x2, unpack_f16x2)
pack_bf16x4, unpack_bf16x4 = _x4(pack_bf16x2, unpack_bf16x2)


# -- f16 and bf16 in one kernel -------------------------------------------------------------
# A "half" kernel serves both 16-bit float kinds: its arrays are uint16 (or words of them)
# and a runtime flag ``bf16`` (the same for the whole launch, so the branch never
# diverges) picks the conversion. One signature instead of two per body; the plan passes
# ``half_flag(element)``.


@cuda.jit(device=True, inline=True)
def half_to_f32(bits, bf16):
    """f32 value of 16-bit storage ``bits``: bf16 where ``bf16``, else IEEE f16."""
    if bf16:
        return bf16_to_f32(uint16(bits))
    return float32(f16_from_bits(bits))


@cuda.jit(device=True, inline=True)
def f32_to_half(value, bf16):
    """16-bit storage (uint16) nearest to f32 ``value``: bf16 where ``bf16``, else f16."""
    if bf16:
        return f32_to_bf16(float32(value))
    return uint16(f16_to_bits(float16(value)))


@cuda.jit(device=True, inline=True)
def unpack_half2(unit, bf16):
    """The two 16-bit values of a uint32 as f32 (lower half first), bf16 or f16."""
    if bf16:
        return unpack_bf16x2(unit)
    return unpack_f16x2(unit)


@cuda.jit(device=True, inline=True)
def pack_half2(low, high, bf16):
    """uint32 of two 16-bit values rounded from f32 (``low`` in the lower half)."""
    if bf16:
        return pack_bf16x2(low, high)
    return pack_f16x2(low, high)


@cuda.jit(device=True, inline=True)
def unpack_half4(unit, bf16):
    """The four 16-bit values of a uint64 as f32 (lowest address first)."""
    if bf16:
        return unpack_bf16x4(unit)
    return unpack_f16x4(unit)


@cuda.jit(device=True, inline=True)
def pack_half4(a0, a1, a2, a3, bf16):
    """uint64 of four 16-bit values rounded from f32 (``a0`` at the lowest address)."""
    if bf16:
        return pack_bf16x4(a0, a1, a2, a3)
    return pack_f16x4(a0, a1, a2, a3)


@cuda.jit(device=True, inline=True)
def load_half(x, i, bf16):
    """Element ``i`` of uint16 array ``x`` as f32 (bf16 or f16 storage)."""
    return half_to_f32(x[uint64(i)], bf16)


def half_flag(element: Any) -> int:
    """The ``bf16`` runtime flag of a half kernel for element kind ``element`` (1 for
    bf16, 0 for f16 and every other kind)."""
    return int(getattr(element, "name", "") == "BF16")


def is_half(element: Any) -> bool:
    """Whether element kind ``element`` runs on a half kernel (f16 or bf16)."""
    return getattr(element, "name", "") in ("F16", "BF16")


# -- equality masks of packed halves ------------------------------------------------------
# ``eq_mask_*x2(a, b)``: the uint32 whose 16-bit half i is 0xFFFF where half i of ``a``
# equals half i of ``b`` as floats (IEEE: -0 == +0, NaN equals nothing, subnormals kept),
# else 0: one ``set.eq.u32.{f16x2,bf16x2}`` for two comparisons, where unpacking to f32
# and comparing takes 2-3 instructions per element. The bf16x2 form needs sm_90: call it
# only where ``compiled_for_sm90()`` holds.

if SIMULATOR:

    @cuda.jit(device=True, inline=True)
    def compiled_for_sm90():
        """Whether the kernel is compiled for sm_90 or later (the simulator: True)."""
        return True

    def _eq_mask_x2(unpack_x2: Any) -> Any:
        @cuda.jit(device=True, inline=True)
        def eq_mask_x2(a, b):
            a0, a1 = unpack_x2(uint32(a))
            b0, b1 = unpack_x2(uint32(b))
            return (uint32(0xFFFF) if a0 == b0 else uint32(0)) | \
                (uint32(0xFFFF0000) if a1 == b1 else uint32(0))

        return eq_mask_x2

    eq_mask_f16x2 = _eq_mask_x2(unpack_f16x2)
    eq_mask_bf16x2 = _eq_mask_x2(unpack_bf16x2)

else:
    from numba.core import cgutils

    @intrinsic
    def compiled_for_sm90(typingctx):
        """Whether the kernel is compiled for sm_90 or later: NVVM's
        ``__nvvm_reflect("__CUDA_ARCH")``, a constant once the target is known, so the
        branch not taken (and any sm_90-only instruction in it) is not in the PTX."""

        def codegen(context, builder, signature, args):
            module = builder.module
            fnty = _ir.FunctionType(_ir.IntType(32), [_ir.IntType(8).as_pointer()])
            reflect = cgutils.get_or_insert_function(module, fnty, "__nvvm_reflect")
            name = module.globals.get("baracuda_reflect_cuda_arch")
            if name is None:
                name = cgutils.global_constant(module, "baracuda_reflect_cuda_arch",
                                               cgutils.make_bytearray(b"__CUDA_ARCH\0"))
            arch = builder.call(reflect, [builder.bitcast(name, _ir.IntType(8).as_pointer())])
            return builder.icmp_signed(">=", arch, _ir.Constant(_ir.IntType(32), 900))

        return types.boolean(), codegen

    eq_mask_f16x2 = _asm_binary("set.eq.u32.f16x2 $0, $1, $2;", types.uint32, types.uint32)
    eq_mask_bf16x2 = _asm_binary("set.eq.u32.bf16x2 $0, $1, $2;", types.uint32, types.uint32)


def _eq_mask_x4(eq_mask_x2: Any) -> Any:
    """``eq_mask_x4(a, b)``: the equality mask (0xFFFF per equal half) of two uint64 words
    of four f16 / bf16 values, from the pair helper (lower 32 bits first)."""

    @cuda.jit(device=True, inline=True)
    def eq_mask_x4(a, b):
        low = eq_mask_x2(uint32(a & uint64(0xFFFFFFFF)), uint32(b & uint64(0xFFFFFFFF)))
        high = eq_mask_x2(uint32(a >> uint64(32)), uint32(b >> uint64(32)))
        return uint64(low) | (uint64(high) << uint64(32))

    return eq_mask_x4


eq_mask_f16x4 = _eq_mask_x4(eq_mask_f16x2)
eq_mask_bf16x4 = _eq_mask_x4(eq_mask_bf16x2)


@cuda.jit(device=True, inline=True)
def eq_mask_half4(a, b, bf16):
    """:func:`eq_mask_bf16x4` where ``bf16`` (sm_90 only, as that one), else f16's."""
    if bf16:
        return eq_mask_bf16x4(a, b)
    return eq_mask_f16x4(a, b)


# -- NaN-propagating comparisons ---------------------------------------------------------


@cuda.jit(device=True, inline=True)
def nan_max(a, b):
    """max(a, b), NaN if either is NaN (torch.maximum semantics)."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a >= b else b


@cuda.jit(device=True, inline=True)
def nan_min(a, b):
    """min(a, b), NaN if either is NaN (torch.minimum semantics)."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a <= b else b


if SIMULATOR:

    @cuda.jit(device=True)
    def max_nan_f32(a, b):
        """f32 :func:`nan_max` (the simulator's stand-in for ``max.NaN.f32``)."""
        return nan_max(np.float32(a), np.float32(b))

    @cuda.jit(device=True)
    def min_nan_f32(a, b):
        """f32 :func:`nan_min` (the simulator's stand-in for ``min.NaN.f32``)."""
        return nan_min(np.float32(a), np.float32(b))

    @cuda.jit(device=True)
    def rcp_approx_ftz_f32(x):
        """1 / x in f32 (the simulator's stand-in for ``rcp.approx.ftz.f32``)."""
        return np.float32(1.0) / np.float32(x)

else:

    def _nan_extremum_f32(op: str):  # noqa: ANN202 - returns a Numba intrinsic
        return _asm_binary(f"{op}.NaN.f32 $0, $1, $2;", types.float32, types.float32)

    #: ``max.NaN.f32`` (sm_80+): one instruction for :func:`nan_max` of two f32 values (the
    #: result is the canonical NaN if either is NaN; -0 < +0). nan_max's compare-and-select
    #: chain is 4-5 dependent instructions, which bound the Max reductions' sequential
    #: folds (bf16 [256, 1e6] Max along rows: 78% of copy vs 93% for Sum).
    max_nan_f32 = _nan_extremum_f32("max")
    #: ``min.NaN.f32``: as :data:`max_nan_f32` for :func:`nan_min`.
    min_nan_f32 = _nan_extremum_f32("min")

    @intrinsic
    def rcp_approx_ftz_f32(typingctx, x):
        """``rcp.approx.ftz.f32``: 1 / x within 1 ulp of f32 where x and 1 / x are normal
        (2^-126 <= |x| < 2^126), one MUFU.RCP; subnormal inputs and results flush to zero.
        (``div.approx.f32`` of 1 by x adds a scaling for the other ranges: 4 more
        instructions a value.)"""

        def codegen(context, builder, signature, args):
            x32 = context.cast(builder, args[0], signature.args[0], types.float32)
            fnty = _ir.FunctionType(_ir.FloatType(), [_ir.FloatType()])
            asm = _ir.InlineAsm(fnty, "rcp.approx.ftz.f32 $0, $1;", "=f,f")
            return builder.call(asm, [x32])

        return types.float32(x), codegen


# -- strided indexing ------------------------------------------------------------------


@cuda.jit(device=True, inline=True)
def div_mod(value, extent):
    """(value // extent, value % extent) for non-negative int64s; uses 32-bit unsigned
    division when both fit (about 5x fewer instructions than 64-bit division)."""
    if value < 4294967296 and extent < 4294967296:
        small_value = uint32(value)
        small_extent = uint32(extent)
        quotient = small_value // small_extent
        return int64(quotient), int64(small_value - quotient * small_extent)
    quotient = value // extent
    return quotient, value - quotient * extent


@cuda.jit(device=True, inline=True)
def strided_offset(linear, shape, strides):
    """Offset (elements) of row-major ``linear`` index in a tensor of ``shape``/``strides``
    (UniTuple(int64, 8), leading axes padded with extent 1)."""
    offset = int64(0)
    rest = int64(linear)
    for axis in range(MAX_RANK - 1, -1, -1):
        extent = shape[axis]
        if extent != 1:
            rest, coord = div_mod(rest, extent)
            offset += coord * strides[axis]
    return offset


@cuda.jit(device=True, inline=True)
def strided_offset2(linear, shape, strides_a, strides_b):
    """Offsets of ``linear`` in two tensors of the same ``shape`` (one unravel for both)."""
    offset_a = int64(0)
    offset_b = int64(0)
    rest = int64(linear)
    for axis in range(MAX_RANK - 1, -1, -1):
        extent = shape[axis]
        if extent != 1:
            rest, coord = div_mod(rest, extent)
            offset_a += coord * strides_a[axis]
            offset_b += coord * strides_b[axis]
    return offset_a, offset_b


def pad8(values: tuple[int, ...], fill: int) -> tuple[int, ...]:
    """Host helper: left-pad a shape/stride tuple to 8 entries (kernel tuple arguments)."""
    return (fill,) * (MAX_RANK - len(values)) + tuple(values)


# -- warp shuffles ---------------------------------------------------------------------

if SIMULATOR:

    import threading

    def _sim_warp_sync():
        """Wait for the other lanes of this thread's warp (the simulator's threads are
        Python threads; ``BlockThread`` has the lane's block manager and linear id).

        A warp-level barrier, not ``cuda.syncthreads``: the simulator counts any blocked
        thread at any barrier as arrived, so a block barrier inside a shuffle would also
        release warps waiting at a real ``syncthreads`` elsewhere (after a different
        number of shuffles), which a GPU's ``bar.sync`` does not. The lanes of a warp are
        those of the block that exist (a partial last warp has fewer); every one of them
        must reach the shuffle, as ``FULL_MASK`` requires on the GPU (else this raises
        after 60 s rather than hang).
        """
        me = threading.current_thread()
        manager = me._manager
        barriers = manager.__dict__.setdefault("_baracuda_warp_barriers", {})
        base = me.thread_id - me.thread_id % 32
        barrier = barriers.get(base)
        if barrier is None:
            threads = int(np.prod(manager._block_dim))
            barrier = barriers.setdefault(base, threading.Barrier(min(32, threads - base)))
        barrier.wait(timeout=60.0)

    def _sim_exchange(value, source_lane):
        scratch = cuda.shared.array(1024, dtype=np.float64)  # one slot per thread
        boxed = cuda.shared.array(1024, dtype=np.int64)
        tid = cuda.threadIdx.x + cuda.blockDim.x * (cuda.threadIdx.y
                                                    + cuda.blockDim.y * cuda.threadIdx.z)
        is_int = isinstance(value, (int, np.integer))
        if is_int:
            boxed[tid] = value
        else:
            scratch[tid] = value
        _sim_warp_sync()
        warp_base = tid - tid % 32
        source = warp_base + source_lane
        result = boxed[source] if is_int else scratch[source]
        _sim_warp_sync()
        return type(value)(result)

    @cuda.jit(device=True)
    def shfl_down(value, delta):
        """Value of lane ``lane + delta`` (own value past the warp's end)."""
        lane = (cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y) % 32
        return _sim_exchange(value, lane + delta if lane + delta < 32 else lane)

    @cuda.jit(device=True)
    def shfl_up(value, delta):
        """Value of lane ``lane - delta`` (own value below lane 0)."""
        lane = (cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y) % 32
        return _sim_exchange(value, lane - delta if lane >= delta else lane)

    @cuda.jit(device=True)
    def shfl_xor(value, lane_mask):
        """Value of lane ``lane ^ lane_mask``."""
        lane = (cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y) % 32
        return _sim_exchange(value, lane ^ lane_mask)

    @cuda.jit(device=True)
    def shfl_idx(value, source_lane):
        """Value of lane ``source_lane``."""
        return _sim_exchange(value, source_lane)

else:

    @cuda.jit(device=True, inline=True)
    def shfl_down(value, delta):
        """Value of lane ``lane + delta`` (own value past the warp's end)."""
        return cuda.shfl_down_sync(FULL_MASK, value, delta)

    @cuda.jit(device=True, inline=True)
    def shfl_up(value, delta):
        """Value of lane ``lane - delta`` (own value below lane 0)."""
        return cuda.shfl_up_sync(FULL_MASK, value, delta)

    @cuda.jit(device=True, inline=True)
    def shfl_xor(value, lane_mask):
        """Value of lane ``lane ^ lane_mask``."""
        return cuda.shfl_xor_sync(FULL_MASK, value, lane_mask)

    @cuda.jit(device=True, inline=True)
    def shfl_idx(value, source_lane):
        """Value of lane ``source_lane``."""
        return cuda.shfl_sync(FULL_MASK, value, source_lane)


# -- asynchronous copies to shared memory (sm_80+ ``cp.async``) ---------------------------
# Global words copied straight into shared memory, without a register: a block can keep
# more of its loads in flight than its registers hold. A thread's copies are complete
# (for that thread) after ``copy_async_wait``; other threads of the block see them only
# after a barrier as well.

if SIMULATOR:

    @cuda.jit(device=True)
    def copy_async8(shared, shared_index, source, index):
        """``shared[shared_index] = source[index]`` for 8-byte elements (at once here)."""
        shared[shared_index] = source[index]

    def copy_async8_run(count: int, stride: int) -> Any:
        """``copy_async8`` of ``count`` words ``stride`` elements apart on both sides."""

        @cuda.jit(device=True)
        def copy_run(shared, shared_index, source, index):
            for u in range(count):
                shared[shared_index + u * stride] = source[index + u * stride]

        return copy_run

    @cuda.jit(device=True)
    def copy_async_wait():
        """Wait for this thread's ``copy_async8`` copies (nothing to wait for here)."""

    @cuda.jit(device=True)
    def opaque(value):
        """``value`` (the GPU version hides it from the compiler's loop hoisting)."""
        return value

else:

    def element_address(context, builder, array_type, array, index_type, index):
        """Codegen helper of intrinsics: the generic address (i64) of ``array[index]``."""
        ary = context.make_array(array_type)(context, builder, array)
        offset = context.cast(builder, index, index_type, types.int64)
        return builder.ptrtoint(builder.gep(ary.data, [offset]), _ir.IntType(64))

    def _copy_async8_intrinsic(count: int, stride: int) -> Any:
        # one asm block: the offsets are immediates on two base registers (separate
        # copies let LLVM hoist every shared address out of the kernel's loop, and spill)
        copies = " ".join(f"cp.async.ca.shared.global [t+{u * stride * 8}], "
                          f"[$1+{u * stride * 8}], 8;" for u in range(count))

        @intrinsic
        def copy_run(typingctx, shared, shared_index, source, index):
            def codegen(context, builder, signature, args):
                to = element_address(context, builder, signature.args[0], args[0],
                                      signature.args[1], args[1])
                frm = element_address(context, builder, signature.args[2], args[2],
                                       signature.args[3], args[3])
                fnty = _ir.FunctionType(_ir.VoidType(), [_ir.IntType(64), _ir.IntType(64)])
                asm = _ir.InlineAsm(
                    fnty, "{ .reg .u64 s; .reg .u32 t; cvta.to.shared.u64 s, $0; "
                    f"cvt.u32.u64 t, s; {copies} }}", "l,l,~{memory}", side_effect=True)
                builder.call(asm, [to, frm])
                return context.get_dummy_value()

            return types.void(shared, shared_index, source, index), codegen

        return copy_run

    #: ``cp.async.ca.shared.global`` of 8 bytes: ``shared[shared_index] =
    #: source[index]`` (``shared`` a shared array, both 8-byte elements), issued and not
    #: waited for. The compiler does not move memory accesses across it.
    copy_async8 = _copy_async8_intrinsic(1, 0)

    def copy_async8_run(count: int, stride: int) -> Any:
        """``copy_async8`` of ``count`` words ``stride`` elements apart on both sides
        (``shared[shared_index + u * stride] = source[index + u * stride]``), in one asm
        block."""
        return _copy_async8_intrinsic(count, stride)

    @intrinsic
    def opaque(typingctx, value):
        """``value`` (a 32-bit integer) through a volatile ``mov``: the compiler cannot see
        through it, so what is computed from it stays where it is written (not hoisted
        out of a loop into registers held for the whole kernel)."""
        if not isinstance(value, types.Integer) or value.bitwidth != 32:
            return None

        def codegen(context, builder, signature, args):
            fnty = _ir.FunctionType(_ir.IntType(32), [_ir.IntType(32)])
            return builder.call(_ir.InlineAsm(fnty, "mov.b32 $0, $1;", "=r,r",
                                              side_effect=True), args)

        return value(value), codegen

    @intrinsic
    def copy_async_wait(typingctx):
        """``cp.async.wait_all``: this thread's ``copy_async8`` copies are in shared
        memory (a memory clobber: no shared read moves above it)."""

        def codegen(context, builder, signature, args):
            fnty = _ir.FunctionType(_ir.VoidType(), [])
            builder.call(_ir.InlineAsm(fnty, "cp.async.wait_all;", "~{memory}",
                                       side_effect=True), [])
            return context.get_dummy_value()

        return types.void(), codegen


# -- polling another block's results, and waiting ------------------------------------------
# A block that waits for words other blocks publish (an atomic exchange each) reads them
# with ``load_relaxed``: a plain load at the GPU's coherence point (L2), which does not
# serialise on the word's L2 line as an atomic does, and which the compiler keeps inside
# the polling loop. ``wait_ns`` holds the calling thread for about ``ns`` nanoseconds.

if SIMULATOR:

    @cuda.jit(device=True)
    def load_relaxed(array, index):
        """``array[index]`` (int64 or uint64), read at the GPU's coherence point on the
        GPU."""
        return array[index]

    @cuda.jit(device=True)
    def wait_ns(ns):
        """Nothing here (the GPU version waits ``ns`` nanoseconds)."""

else:

    @intrinsic
    def load_relaxed(typingctx, array, index):
        """``array[index]`` of an int64 or uint64 array by ``ld.relaxed.gpu`` (L2, no
        atomic), a volatile asm: never hoisted out of a polling loop nor merged with
        another read."""
        if not (isinstance(array, types.Array) and array.dtype in (types.int64, types.uint64)):
            return None

        def codegen(context, builder, signature, args):
            address = element_address(context, builder, signature.args[0], args[0],
                                      signature.args[1], args[1])
            fnty = _ir.FunctionType(_ir.IntType(64), [_ir.IntType(64)])
            asm = _ir.InlineAsm(fnty, "ld.relaxed.gpu.global.b64 $0, [$1];", "=l,l",
                                side_effect=True)
            return builder.call(asm, [address])

        return array.dtype(array, index), codegen

    @intrinsic
    def _globaltimer(typingctx):
        """The GPU's nanosecond timer (``%globaltimer``)."""

        def codegen(context, builder, signature, args):
            fnty = _ir.FunctionType(_ir.IntType(64), [])
            return builder.call(_ir.InlineAsm(fnty, "mov.u64 $0, %globaltimer;", "=l",
                                              side_effect=True), [])

        return types.int64(), codegen

    @cuda.jit(device=True, inline=True)
    def wait_ns(ns):
        """Hold the calling thread until ``%globaltimer`` has advanced ``ns`` (int64)
        nanoseconds, sleeping 200 ns at a time between reads."""
        start = _globaltimer()
        while _globaltimer() - start < ns:
            cuda.nanosleep(200)


# -- 16-byte loads and stores ------------------------------------------------------------

#: A 16-byte memory unit in registers: four 32-bit words (``ld/st.global.v4.u32``).
WORDS4 = types.UniTuple(uint32, 4)

if SIMULATOR:

    @cuda.jit(device=True, inline=True)
    def load16(array, index):
        """Words ``index .. index+3`` of a uint32 array (``index`` a multiple of 4)."""
        return (array[index], array[index + 1], array[index + 2], array[index + 3])

    load16_last = load16  # the simulator has no cache policies
    load16_ro = load16

else:

    def _load16_asm(text: str):  # noqa: ANN202 - returns a Numba intrinsic
        """A 16-byte load intrinsic ``(uint32 array, index) -> 4 words`` whose PTX is
        ``text`` (outputs $0-$3, the address $4). Volatile: the loads stay in program order
        before the stores that follow (in place, a repeated head is read before it is
        written)."""

        @intrinsic
        def load(typingctx, array, index):
            def codegen(context, builder, signature, args):
                address = element_address(context, builder, signature.args[0], args[0],
                                          signature.args[1], args[1])
                word = _ir.IntType(32)
                fnty = _ir.FunctionType(_ir.LiteralStructType([word] * 4), [_ir.IntType(64)])
                asm = _ir.InlineAsm(fnty, text, "=r,=r,=r,=r,l", side_effect=True)
                loaded = builder.call(asm, [address])
                return context.make_tuple(builder, WORDS4,
                                          [builder.extract_value(loaded, i) for i in range(4)])

            return WORDS4(array, index), codegen

        return load

    #: ``ld.global.v4.u32``: words ``index .. index+3`` of a uint32 array in one 16-byte
    #: access (the address must be 16-byte aligned). Numba has no 16-byte scalar type; its
    #: 8-byte accesses fall a few percent short of torch's ``copy_`` on large tensors where
    #: 16-byte ones match it (docs/design/rope.md).
    load16 = _load16_asm("ld.global.v4.u32 {$0, $1, $2, $3}, [$4];")
    #: ``load16`` with an L2 ``evict_last`` policy (``createpolicy.fractional`` +
    #: ``.L2::cache_hint``, what Triton emits for ``eviction_policy="evict_last"``): for
    #: small tables read by every thread while a large tensor streams through L2.
    load16_last = _load16_asm("{ .reg .b64 p; createpolicy.fractional.L2::evict_last.b64 p, "
                              "1.0; ld.global.L2::cache_hint.v4.u32 {$0, $1, $2, $3}, [$4], "
                              "p; }")

    @intrinsic
    def load16_ro(typingctx, array, index):
        """``load16`` of data no kernel writes during the launch (a weight, a table): an
        ordinary LLVM load with ``!invariant.load``, which NVVM emits as
        ``ld.global.nc.v4.u32``. Not volatile, so it need not wait for earlier stores; and
        not an asm, so it is never speculated out of the branch that guards it (the
        address must be valid only where the load runs)."""

        def codegen(context, builder, signature, args):
            address = element_address(context, builder, signature.args[0], args[0],
                                      signature.args[1], args[1])
            vector = _ir.VectorType(_ir.IntType(32), 4)
            loaded = builder.load(builder.inttoptr(address, vector.as_pointer(1)), align=16)
            loaded.set_metadata("invariant.load", builder.module.add_metadata([]))
            return context.make_tuple(builder, WORDS4, [
                builder.extract_element(loaded, _ir.Constant(_ir.IntType(32), i))
                for i in range(4)])

        return WORDS4(array, index), codegen


if SIMULATOR:

    @cuda.jit(device=True, inline=True)
    def store16(array, index, words):
        """Store the four words of ``words`` at ``index .. index+3`` of a uint32 array."""
        array[index] = words[0]
        array[index + 1] = words[1]
        array[index + 2] = words[2]
        array[index + 3] = words[3]

else:

    @intrinsic
    def store16(typingctx, array, index, words):
        """``st.global.v4.u32``: the four words of ``words`` at ``index .. index+3`` (the
        address must be 16-byte aligned)."""

        def codegen(context, builder, signature, args):
            address = element_address(context, builder, signature.args[0], args[0],
                                      signature.args[1], args[1])
            word_types = signature.args[2]  # any tuple of 4 integers: cast to u32 words
            values = [context.cast(builder, builder.extract_value(args[2], i), word_types[i],
                                   types.uint32) for i in range(4)]
            word = _ir.IntType(32)
            fnty = _ir.FunctionType(_ir.VoidType(), [_ir.IntType(64)] + [word] * 4)
            asm = _ir.InlineAsm(fnty, "st.global.v4.u32 [$0], {$1, $2, $3, $4};",
                                "l,r,r,r,r", side_effect=True)
            builder.call(asm, [address] + values)
            return context.get_dummy_value()

        return types.void(array, index, words), codegen


@cuda.jit(device=True, inline=True)
def store16_words(array, index, low, high):
    """``store16`` of two 64-bit words: ``low`` at ``index .. index+1`` of a uint32 array,
    ``high`` at ``index+2 .. index+3`` (little-endian, as two 8-byte stores would)."""
    store16(array, index, (uint32(low & uint64(0xFFFFFFFF)), uint32(low >> uint64(32)),
                           uint32(high & uint64(0xFFFFFFFF)), uint32(high >> uint64(32))))


@cuda.jit(device=True, inline=True)
def load16_words(array, index):
    """``load16`` as two 64-bit words: (words ``index .. index+1``, ``index+2 ..
    index+3``) of a uint32 array, little-endian, as two 8-byte loads would give them."""
    w = load16(array, index)
    return (uint64(w[0]) | (uint64(w[1]) << uint64(32)),
            uint64(w[2]) | (uint64(w[3]) << uint64(32)))


@cuda.jit(device=True, inline=True)
def div_f64(value, divisor, inverse):
    """``value // divisor`` for int64 ``0 <= value < 2^52`` and ``divisor >= 1``, with
    ``inverse`` = ``1 / divisor`` rounded to f64 (host): the f64 product is within one of
    the quotient (relative error 2^-52 on a value below 2^52), and one step corrects it.
    About 8 instructions where a 64-bit division takes ~70."""
    quotient = int64(float64(value) * inverse)
    rest = value - quotient * divisor
    if rest < 0:
        quotient -= 1
    elif rest >= divisor:
        quotient += 1
    return quotient


# -- element loads, stores and value conversions ------------------------------------------
# Compute values from storage and back: 16-bit kinds widen to f32 on load and round once on
# store (``to_f16`` / ``to_f32`` / ``to_f64`` convert one value either way). Indices are
# non-negative: an unsigned index spares the negative-index wraparound.


@cuda.jit(device=True, inline=True)
def load_f16(x, i):
    return float32(x[uint64(i)])


@cuda.jit(device=True, inline=True)
def load_bf16(x, i):
    return bf16_to_f32(x[uint64(i)])


@cuda.jit(device=True, inline=True)
def load_same(x, i):
    return x[uint64(i)]


@cuda.jit(device=True, inline=True)
def to_f16(v):
    return types.float16(v)


@cuda.jit(device=True, inline=True)
def store_bf16(v):
    return f32_to_bf16(float32(v))


@cuda.jit(device=True, inline=True)
def to_f32(v):
    return float32(v)


@cuda.jit(device=True, inline=True)
def to_f64(v):
    return float64(v)
