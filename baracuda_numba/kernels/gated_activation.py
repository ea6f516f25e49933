"""Gated activations: ``y = act(gate) · up`` and its gradient, elementwise.

``act`` per activation code (``ACT_*``: compiled into the 16-byte f16/bf16/f32 kernels,
one kernel each, a runtime argument of the f64 and element-layout kernels)::

    ACT_GLU         σ(g) = 1 / (1 + e^−g)            (F.glu: up = first half, gate = second)
    ACT_REGLU       relu(g)                          (NaN stays NaN, as torch's relu)
    ACT_SWIGLU      silu(g) = g · σ(g)
    ACT_GEGLU       gelu(g) = g · Φ(g),   Φ(g) = ½ · erfc(−g / √2)
    ACT_GEGLU_TANH  g · σ(2z),  z = √(2/π) · (g + 0.044715 · g³)      (= ½ g (1 + tanh z))

Backward, the activation recomputed from ``g`` (nothing saved)::

    dup   = dy · act(g)
    dgate = (dy · up) · act'(g)        ReGLU: 0 where relu(g) <= 0, else dy · up (a select,
                                       as torch's threshold_backward: NaN g passes dy · up)

The products are evaluated in torch's order (``silu_backward``, ``gelu_backward``,
``glu_backward``), so NaN and ±inf come out where torch's formula puts them. Φ uses
``erfc`` and the tanh form ``σ(2z)`` (the same function as ``½(1 + tanh z)``): both stay
accurate for negative ``g``, where ``1 + erf`` and ``1 + tanh`` cancel. f16/bf16/f32 are
computed in f32 and rounded once on store: f32 outputs with libdevice ``expf``/``erfcf``
(f32 accuracy), f16/bf16 outputs with ``ex2.approx`` exponentials and Numerical Recipes'
``erfcc`` fit for Φ (relative error <= 2.2e-5, under 0.1 of an f16 half ulp; libdevice's
``erfcf`` made the bf16 GeGLU compute bound); ``rcp.approx`` for the sigmoid's reciprocal
everywhere; f64 in f64 (IEEE division).

Work layout: the plan merges axes so each tensor is ``rows`` rows (an outer index of rank
<= 8, unravelled per thread) of ``row_units`` accesses; a thread of a grid-stride loop
takes :data:`UNITS_PER_THREAD` accesses ``t``, ``t + blockDim``, ... (all loads first)::

    (row, unit) = divmod(t, row_units)          offsets of every tensor from the row
    load gate, up (backward: dy, gate, up)  ->  f32 values  ->  act  ->  store y (dgate, dup)

Layouts (``GATED_LAYOUTS``): ``units16`` moves 16-byte ``ld/st.global.v4`` units (8 f16/bf16,
4 f32, 2 f64 values; unit stride along the row, unit-aligned pointers and outer strides);
``elements`` one element per access, any strides. Both call the same value functions, so
the bits are the same (bf16 NaN payloads aside: ``cvt`` writes the canonical NaN).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int64, types, uint16, uint32, uint64
from numba.types import float16

from .._runtime import SIMULATOR
from ..launch import Kernel, LazyTable
from ..types import ElementKind
from .common import (
    MAX_RANK,
    bf16_to_f32,
    bitcast,
    div_mod,
    f32_from_bits,
    f32_to_bf16,
    f32_to_bits,
    load16,
    load16_words,
    pack_bf16x2,
    pack_f16x2,
    rcp_approx_ftz_f32,
    store16,
    store16_words,
    unpack_bf16x2,
    unpack_f16x2,
)

#: Activation codes (the kernels' ``act`` parameter); GeGLU's tanh form is its own code.
ACT_GLU, ACT_REGLU, ACT_SWIGLU, ACT_GEGLU, ACT_GEGLU_TANH = 0, 1, 2, 3, 4

_SQRT1_2 = 0.70710678118654752440  # 1 / √2
_INV_SQRT_2PI = 0.39894228040143267794  # 1 / √(2π)
_SQRT_2_OVER_PI = 0.79788456080286535588  # √(2/π)
_TANH_CUBIC = 0.044715  # the tanh approximation's cubic coefficient (torch, Hendrycks)
_LOG2E = 1.44269504088896340736  # log2 e: e^x = 2^(x·log2 e)
#: Numerical Recipes' erfcc coefficients: erfc(z) = t·exp(−z² + Σ c_k t^k), t = 2 / (2 + z)
_ERFC_P = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
           -1.13520398, 1.48851587, -0.82215223, 0.17087277)

#: Tensors per kernel: forward (gate, up, y), backward (dy, gate, up, dgate, dup).
FORWARD_TENSORS = 3
BACKWARD_TENSORS = 5

# -- the activation, per compute type -------------------------------------------------------

if SIMULATOR:

    @cuda.jit(device=True)
    def _exp(value):
        """e^value in value's type (Python's math.exp raises on overflow; NumPy gives inf)."""
        return np.exp(value)

else:

    @cuda.jit(device=True, inline=True)
    def _exp(value):
        """e^value: libdevice ``expf`` / ``exp``."""
        return math.exp(value)



if SIMULATOR:

    @cuda.jit(device=True)
    def _exp_fast(value):
        """e^value in f32 (the simulator's stand-in for ``ex2.approx.ftz`` of value·log2 e)."""
        return np.float32(np.exp(np.float32(value)))

else:
    from llvmlite import ir as _ir
    from numba.core.extending import intrinsic

    @intrinsic
    def _ex2_approx_ftz(typingctx, x):
        """``ex2.approx.ftz.f32``: 2^x, one MUFU.EX2 (relative error below 2^-22)."""

        def codegen(context, builder, signature, args):
            x32 = context.cast(builder, args[0], signature.args[0], types.float32)
            fnty = _ir.FunctionType(_ir.FloatType(), [_ir.FloatType()])
            return builder.call(_ir.InlineAsm(fnty, "ex2.approx.ftz.f32 $0, $1;", "=f,f"),
                                [x32])

        return types.float32(x), codegen

    @cuda.jit(device=True, inline=True)
    def _exp_fast(value):
        """e^value as 2^(value·log2 e): one multiply and one MUFU.EX2 (libdevice ``expf``
        adds a Cody-Waite reduction, ~8 instructions); relative error <= |value|·2^-23."""
        return _ex2_approx_ftz(float32(value) * float32(_LOG2E))


@cuda.jit(device=True, inline=True)
def _reciprocal64(value):
    return float64(1) / value


def _erfc_fast(z):  # noqa: ANN001, ANN202 - the device function, for z >= 0 (or NaN)
    """Numerical Recipes' ``erfcc``: erfc(z) = t·e^(−z² + P(t)), t = 1 / (1 + z/2), P a
    degree-9 Chebyshev fit (relative error < 1.2e-7 in exact arithmetic, every z >= 0)."""
    t = rcp_approx_ftz_f32(float32(1) + float32(0.5) * z)
    c = _ERFC_P
    p = float32(c[9]) * t + float32(c[8])
    p = p * t + float32(c[7])
    p = p * t + float32(c[6])
    p = p * t + float32(c[5])
    p = p * t + float32(c[4])
    p = p * t + float32(c[3])
    p = p * t + float32(c[2])
    p = p * t + float32(c[1])
    return t * _exp_fast(p * t + float32(c[0]) - z * z)


def _activation_math(C, reciprocal, fast: bool = False):  # noqa: ANN001, ANN202
    """``(forward(act, g, u), backward(act, dy, g, u) -> (dgate, dup))`` in type ``C``;
    ``reciprocal(x)`` is ``1 / x`` (only ever of ``1 + e^t >= 1``, or inf or NaN).
    ``fast`` (f32 math for f16/bf16 outputs): e^x by ``ex2.approx`` and Φ by
    :func:`_erfc_fast`, relative error <= 2.2e-5 over all g (<= 5e-6 for |g| <= 6), far
    under the outputs' half ulp (f16 4.9e-4, bf16 3.9e-3)."""
    exp = _exp_fast if fast else _exp
    erfc_fast = cuda.jit(device=True, inline=True)(_erfc_fast) if fast else None

    @cuda.jit(device=True, inline=True)
    def sigmoid(g):
        return reciprocal(C(1) + C(exp(-g)))

    if fast:

        @cuda.jit(device=True, inline=True)
        def cdf(g):  # ½ erfc(|g|/√2) for g <= 0, 1 − that for g > 0 (no cancellation)
            half = C(0.5) * erfc_fast(abs(g) * C(_SQRT1_2))
            return C(1) - half if g > C(0) else half

    else:

        @cuda.jit(device=True, inline=True)
        def cdf(g):
            return C(0.5) * C(math.erfc(-g * C(_SQRT1_2)))

    @cuda.jit(device=True, inline=True)
    def tanh_gate(g):  # σ(2z) = ½(1 + tanh z)
        z = C(_SQRT_2_OVER_PI) * (g + C(_TANH_CUBIC) * g * g * g)
        return reciprocal(C(1) + C(exp(C(-2) * z)))

    @cuda.jit(device=True, inline=True)
    def relu(g):
        return g if g > C(0) or g != g else C(0)

    @cuda.jit(device=True, inline=True)
    def forward(act, g, u):
        if act == ACT_SWIGLU:
            return g * sigmoid(g) * u
        if act == ACT_GEGLU:
            return g * cdf(g) * u
        if act == ACT_GEGLU_TANH:
            return g * tanh_gate(g) * u
        if act == ACT_REGLU:
            return relu(g) * u
        return u * sigmoid(g)

    @cuda.jit(device=True, inline=True)
    def backward(act, dy, g, u):
        grad = dy * u
        if act == ACT_SWIGLU:
            s = sigmoid(g)
            return grad * s * (C(1) + g * (C(1) - s)), dy * (g * s)
        if act == ACT_GEGLU:
            p = cdf(g)
            density = C(exp(C(-0.5) * g * g)) * C(_INV_SQRT_2PI)
            return grad * (p + g * density), dy * (g * p)
        if act == ACT_GEGLU_TANH:
            s = tanh_gate(g)
            slope = C(_SQRT_2_OVER_PI) * (C(1) + C(3 * _TANH_CUBIC) * g * g)
            return grad * (s + C(2) * g * s * (C(1) - s) * slope), dy * (g * s)
        if act == ACT_REGLU:
            r = relu(g)
            return (C(0) if r <= C(0) else grad), dy * r
        s = sigmoid(g)
        return (C(1) - s) * s * dy * u, s * dy

    return forward, backward


#: f32 math takes ``rcp.approx.ftz`` (one MUFU op, within 1 ulp; a sigmoid below 2^-126
#: flushes to 0) for the IEEE division's refinement sequence: it runs on every element.
#: ``half``: the fast f32 math of f16/bf16 outputs (see :func:`_activation_math`).
_MATH = {"f32": _activation_math(float32, rcp_approx_ftz_f32),
         "half": _activation_math(float32, rcp_approx_ftz_f32, fast=True),
         "f64": _activation_math(float64, _reciprocal64)}

# -- codecs: one memory access <-> ``width`` compute values ----------------------------------
# ``load(array, index, values, at)`` fills ``values[at:at + width]``; ``store(array, index,
# values, at)`` writes them.
# units16: ``array`` is a uint32 view and ``index`` counts 16-byte units.


def _half_units(unpack_x2: Any, pack_x2: Any) -> tuple[Any, Any]:
    """The 16-byte unit codecs of a 16-bit kind: four 32-bit words, two halves each."""

    @cuda.jit(device=True, inline=True)
    def load(array, index, values, at):
        w = load16(array, uint64(index * 4))
        values[at], values[at + 1] = unpack_x2(w[0])
        values[at + 2], values[at + 3] = unpack_x2(w[1])
        values[at + 4], values[at + 5] = unpack_x2(w[2])
        values[at + 6], values[at + 7] = unpack_x2(w[3])

    @cuda.jit(device=True, inline=True)
    def store(array, index, values, at):
        store16(array, uint64(index * 4), (
            pack_x2(values[at], values[at + 1]), pack_x2(values[at + 2], values[at + 3]),
            pack_x2(values[at + 4], values[at + 5]), pack_x2(values[at + 6], values[at + 7])))

    return load, store


_load_units_f16, _store_units_f16 = _half_units(unpack_f16x2, pack_f16x2)
_load_units_bf16, _store_units_bf16 = _half_units(unpack_bf16x2, pack_bf16x2)


@cuda.jit(device=True, inline=True)
def _load_units_f32(array, index, values, at):
    w = load16(array, uint64(index * 4))
    values[at] = f32_from_bits(w[0])
    values[at + 1] = f32_from_bits(w[1])
    values[at + 2] = f32_from_bits(w[2])
    values[at + 3] = f32_from_bits(w[3])


@cuda.jit(device=True, inline=True)
def _store_units_f32(array, index, values, at):
    store16(array, uint64(index * 4), (f32_to_bits(values[at]), f32_to_bits(values[at + 1]),
                                       f32_to_bits(values[at + 2]), f32_to_bits(values[at + 3])))


@cuda.jit(device=True, inline=True)
def _load_units_f64(array, index, values, at):
    low, high = load16_words(array, uint64(index * 4))
    values[at] = bitcast(low, float64)
    values[at + 1] = bitcast(high, float64)


@cuda.jit(device=True, inline=True)
def _store_units_f64(array, index, values, at):
    store16_words(array, uint64(index * 4), bitcast(float64(values[at]), uint64),
                  bitcast(float64(values[at + 1]), uint64))


@cuda.jit(device=True, inline=True)
def _load_f16(array, index, values, at):
    values[at] = float32(array[uint64(index)])


@cuda.jit(device=True, inline=True)
def _store_f16(array, index, values, at):
    array[uint64(index)] = float16(values[at])


@cuda.jit(device=True, inline=True)
def _load_bf16(array, index, values, at):
    values[at] = bf16_to_f32(array[uint64(index)])


@cuda.jit(device=True, inline=True)
def _store_bf16(array, index, values, at):
    array[uint64(index)] = f32_to_bf16(values[at])


@cuda.jit(device=True, inline=True)
def _load_plain(array, index, values, at):  # f32 into f32, f64 into f64
    values[at] = array[uint64(index)]


@cuda.jit(device=True, inline=True)
def _store_plain(array, index, values, at):
    array[uint64(index)] = values[at]


# -- kernels --------------------------------------------------------------------------------


def _outer_offsets(tensors: int):  # noqa: ANN202 - returns a device function
    """``offsets(row, shape, strides, out)``: ``out[t]`` = offset of outer index ``row``
    in tensor ``t``; ``shape`` is padded to 8 axes, ``strides`` holds 8 per tensor."""

    @cuda.jit(device=True, inline=True)
    def offsets(row, shape, strides, out):
        if shape[MAX_RANK - 2] == 1:  # at most one outer axis (the usual rows): no division
            for t in range(tensors):
                out[t] = row * strides[t * MAX_RANK + MAX_RANK - 1]
            return
        for t in range(tensors):
            out[t] = int64(0)
        rest = int64(row)
        for axis in range(MAX_RANK - 1, -1, -1):
            extent = shape[axis]
            if extent != 1:
                rest, coord = div_mod(rest, extent)
                for t in range(tensors):
                    out[t] += coord * strides[t * MAX_RANK + axis]

    return offsets


_OFFSETS = {n: _outer_offsets(n) for n in (FORWARD_TENSORS, BACKWARD_TENSORS)}


def _make_gated_kernel(load, store, width: int, compute, math_set: str,  # noqa: ANN001
                       backward: bool, act: int):  # noqa: ANN202 - returns a kernel function
    """The kernel body; ``act`` >= 0 compiles that activation in, -1 reads it from
    ``params[2]`` (a uniform runtime branch). A thread takes :data:`UNITS_PER_THREAD`
    accesses ``blockDim`` apart (coalesced), issuing every load before the first store."""
    forward_value, backward_values = _MATH[math_set]
    tensors = BACKWARD_TENSORS if backward else FORWARD_TENSORS
    offsets = _OFFSETS[tensors]
    per = UNITS_PER_THREAD[backward]
    inputs = 3 if backward else 2
    n_values, n_where = width * per, tensors * per  # local array sizes: constants

    @cuda.jit(device=True, inline=True)
    def locate(t, row_units, params, shape, strides, at, where, k):
        """``where[k·tensors + i]`` = access index of tensor ``i`` for access ``t``."""
        row, unit = div_mod(t, row_units)
        offsets(row, shape, strides, at)
        for i in range(tensors):
            where[k * tensors + i] = params[3 + tensors + i] + at[i] + unit * params[3 + i]

    if not backward:

        def gated_activation(gate, up, y, params, shape, strides):
            """``params`` = (total, row_units, act, inner strides x3, bases x3)."""
            total, row_units = params[0], params[1]
            kind = params[2] if act < 0 else act
            g_values = cuda.local.array(n_values, compute)
            u_values = cuda.local.array(n_values, compute)
            at = cuda.local.array(tensors, int64)
            where = cuda.local.array(n_where, int64)
            block = int64(cuda.blockDim.x)
            t = int64(cuda.threadIdx.x) + int64(cuda.blockIdx.x) * block * per
            step = block * int64(cuda.gridDim.x) * per
            while t < total:
                for k in range(per):
                    if t + k * block < total:
                        locate(t + k * block, row_units, params, shape, strides, at, where, k)
                        load(gate, where[k * tensors], g_values, k * width)
                        load(up, where[k * tensors + 1], u_values, k * width)
                for k in range(per):
                    if t + k * block < total:
                        for e in range(k * width, (k + 1) * width):
                            g_values[e] = forward_value(kind, g_values[e], u_values[e])
                        store(y, where[k * tensors + inputs], g_values, k * width)
                t += step

        return gated_activation

    def gated_activation_backward(dy, gate, up, dgate, dup, params, shape, strides):
        """``params`` = (total, row_units, act, inner strides x5, bases x5, one output):
        with ``one output`` set, ``dup`` goes to ``dgate``'s array (the one-tensor form's
        ``dx``: one argument, since the simulator copies each array argument in and out
        and two over one buffer would undo each other's writes)."""
        total, row_units = params[0], params[1]
        kind = params[2] if act < 0 else act
        dup_out = dgate if params[13] != 0 else dup
        d_values = cuda.local.array(n_values, compute)
        g_values = cuda.local.array(n_values, compute)
        u_values = cuda.local.array(n_values, compute)
        at = cuda.local.array(tensors, int64)
        where = cuda.local.array(n_where, int64)
        block = int64(cuda.blockDim.x)
        t = int64(cuda.threadIdx.x) + int64(cuda.blockIdx.x) * block * per
        step = block * int64(cuda.gridDim.x) * per
        while t < total:
            for k in range(per):
                if t + k * block < total:
                    locate(t + k * block, row_units, params, shape, strides, at, where, k)
                    load(dy, where[k * tensors], d_values, k * width)
                    load(gate, where[k * tensors + 1], g_values, k * width)
                    load(up, where[k * tensors + 2], u_values, k * width)
            for k in range(per):
                if t + k * block < total:
                    for e in range(k * width, (k + 1) * width):
                        g_values[e], u_values[e] = backward_values(kind, d_values[e],
                                                                   g_values[e], u_values[e])
                    store(dgate, where[k * tensors + 3], g_values, k * width)
                    store(dup_out, where[k * tensors + 4], u_values, k * width)
            t += step

    return gated_activation_backward


#: (element, layout) -> (storage type of the kernel's arrays, load, store, values per
#: access, compute type, math set of :data:`_MATH`): the one table every signature, the
#: plan's dtype check and the tests come from. f16/bf16 take the fast f32 math in both
#: layouts (so both give the same bits), f32 libdevice's.
GATED_TABLE = {
    (ElementKind.F16, "units16"): (uint32, _load_units_f16, _store_units_f16, 8, float32,
                                   "half"),
    (ElementKind.BF16, "units16"): (uint32, _load_units_bf16, _store_units_bf16, 8, float32,
                                    "half"),
    (ElementKind.F32, "units16"): (uint32, _load_units_f32, _store_units_f32, 4, float32,
                                   "f32"),
    (ElementKind.F64, "units16"): (uint32, _load_units_f64, _store_units_f64, 2, float64,
                                   "f64"),
    (ElementKind.F16, "elements"): (float16, _load_f16, _store_f16, 1, float32, "half"),
    (ElementKind.BF16, "elements"): (uint16, _load_bf16, _store_bf16, 1, float32, "half"),
    (ElementKind.F32, "elements"): (float32, _load_plain, _store_plain, 1, float32, "f32"),
    (ElementKind.F64, "elements"): (float64, _load_plain, _store_plain, 1, float64, "f64"),
}
GATED_LAYOUTS = ("units16", "elements")
GATED_ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32, ElementKind.F64)
ACTIVATIONS = (ACT_GLU, ACT_REGLU, ACT_SWIGLU, ACT_GEGLU, ACT_GEGLU_TANH)
#: (element, layout) pairs whose kernels compile the activation in, one kernel per
#: activation: the 16-byte layouts of the benchmark's element kinds. A runtime activation
#: costs every kind the registers of the largest (ptxas: bf16 forward 42 registers, 5
#: blocks of 256 an SM) and its instructions; f64 and the element layout keep it.
SPECIALISED = ((ElementKind.F16, "units16"), (ElementKind.BF16, "units16"),
               (ElementKind.F32, "units16"))
#: 16-byte accesses a thread takes per loop trip, by direction (forward, backward); all
#: of a trip's loads are issued before any compute. One: with the activation compiled in,
#: ptxas gives the bf16 forward 32 registers (8 blocks of 256, 2048 threads an SM, 64 KB
#: of loads in flight); two take 60 registers (4 blocks: the same bytes in flight from
#: half the threads, fewer warps to hide the math).
UNITS_PER_THREAD = (1, 1)
#: Register cap of the backward kernels: 48 a thread is 5 blocks of 256 an SM (60 KB of
#: loads in flight); ptxas gives GeGLU tanh's 54 uncapped (4 blocks), 48 with 12 bytes
#: spilled, the other kinds 46-48 unspilled. The forwards need no cap (30-32).
BACKWARD_MAX_REGISTERS = 48


def _signature(storage: types.Type, backward: bool) -> tuple[types.Type, ...]:
    tensors = BACKWARD_TENSORS if backward else FORWARD_TENSORS
    array = types.Array(storage, 1, "C")
    return ((array,) * tensors + (types.UniTuple(int64, 3 + 2 * tensors + backward),
                                  types.UniTuple(int64, MAX_RANK),
                                  types.UniTuple(int64, MAX_RANK * tensors)))


def build_gated_kernel(element: ElementKind, layout: str, backward: bool,
                       act: int = -1, register: bool = True) -> Kernel:
    """The kernel of ``GATED_TABLE[element, layout]``; ``act`` >= 0 compiles that
    activation in, -1 takes it from the launch's ``params``."""
    storage, load, store, width, compute, math_set = GATED_TABLE[element, layout]
    body = _make_gated_kernel(load, store, width, compute, math_set, backward, act)
    direction = "bw" if backward else "fw"
    suffix = f",act{act}" if act >= 0 else ""
    return Kernel(f"gated_activation[{element.name},{layout},{direction}{suffix}]", body,
                  _signature(storage, backward), grid_stride=True, register=register,
                  max_registers=BACKWARD_MAX_REGISTERS if backward else None)


#: (element, layout, backward, act) -> Kernel, act -1 for the runtime-activation kernels:
#: 3 x 5 x 2 specialised + 5 x 2 runtime = 40 signatures.
GATED_KERNELS = LazyTable(
    [(element, layout, backward, act)
     for element, layout in GATED_TABLE for backward in (False, True)
     for act in (ACTIVATIONS if (element, layout) in SPECIALISED else (-1,))],
    lambda key: build_gated_kernel(*key))


def gated_kernel(element: ElementKind, layout: str, backward: bool, act: int) -> Kernel:
    """The kernel that runs activation ``act`` on ``(element, layout)``."""
    found = GATED_KERNELS.get((element, layout, backward, act))
    return found if found is not None else GATED_KERNELS[element, layout, backward, -1]
