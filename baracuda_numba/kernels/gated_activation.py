"""Gated activations: ``y = act(gate) · up`` and its gradient, elementwise.

``act`` per activation code (``ACT_*``, a runtime argument of every kernel)::

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
computed in f32 (libdevice ``expf``/``erfcf``, ``rcp.approx`` for the sigmoid's
reciprocal) and rounded once on store; f64 in f64 (IEEE division).

Work layout: the plan merges axes so each tensor is ``rows`` rows (an outer index of rank
<= 8, unravelled per thread) of ``row_units`` accesses; thread ``t`` of a grid-stride loop
takes access ``t``::

    (row, unit) = divmod(t, row_units)          offsets of every tensor from the row
    load gate, up (backward: dy, gate, up)  ->  f32 values  ->  act  ->  store y (dgate, dup)

Layouts (``GATED_LAYOUTS``): ``units16`` moves 16-byte ``ld/st.global.v4`` units (8 f16/bf16,
4 f32, 2 f64 values; unit stride along the row, unit-aligned pointers and outer strides);
``elements`` one element per access, any strides. Both call the same value functions, so
the bits are the same (bf16 NaN payloads aside: ``cvt`` writes the canonical NaN).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64, int64, types, uint16, uint32, uint64
from numba.types import float16

from .._runtime import SIMULATOR
from ..launch import Kernel
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



@cuda.jit(device=True, inline=True)
def _reciprocal64(value):
    return float64(1) / value


def _activation_math(C, reciprocal):  # noqa: ANN001, ANN202 - returns device functions
    """``(forward(act, g, u), backward(act, dy, g, u) -> (dgate, dup))`` in type ``C``;
    ``reciprocal(x)`` is ``1 / x`` (only ever of ``1 + e^t >= 1``, or inf or NaN)."""

    @cuda.jit(device=True, inline=True)
    def sigmoid(g):
        return reciprocal(C(1) + C(_exp(-g)))

    @cuda.jit(device=True, inline=True)
    def cdf(g):
        return C(0.5) * C(math.erfc(-g * C(_SQRT1_2)))

    @cuda.jit(device=True, inline=True)
    def tanh_gate(g):  # σ(2z) = ½(1 + tanh z)
        z = C(_SQRT_2_OVER_PI) * (g + C(_TANH_CUBIC) * g * g * g)
        return reciprocal(C(1) + C(_exp(C(-2) * z)))

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
            density = C(_exp(C(-0.5) * g * g)) * C(_INV_SQRT_2PI)
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
_MATH = {float32: _activation_math(float32, rcp_approx_ftz_f32),
         float64: _activation_math(float64, _reciprocal64)}

# -- codecs: one memory access <-> ``width`` compute values ----------------------------------
# ``load(array, index, values)`` fills ``values[0:width]``; ``store(array, index, values)``.
# units16: ``array`` is a uint32 view and ``index`` counts 16-byte units.


@cuda.jit(device=True, inline=True)
def _load_units_f16(array, index, values):
    w = load16(array, uint64(index * 4))
    values[0], values[1] = unpack_f16x2(w[0])
    values[2], values[3] = unpack_f16x2(w[1])
    values[4], values[5] = unpack_f16x2(w[2])
    values[6], values[7] = unpack_f16x2(w[3])


@cuda.jit(device=True, inline=True)
def _store_units_f16(array, index, values):
    store16(array, uint64(index * 4), (
        pack_f16x2(values[0], values[1]), pack_f16x2(values[2], values[3]),
        pack_f16x2(values[4], values[5]), pack_f16x2(values[6], values[7])))


@cuda.jit(device=True, inline=True)
def _load_units_bf16(array, index, values):
    w = load16(array, uint64(index * 4))
    values[0], values[1] = unpack_bf16x2(w[0])
    values[2], values[3] = unpack_bf16x2(w[1])
    values[4], values[5] = unpack_bf16x2(w[2])
    values[6], values[7] = unpack_bf16x2(w[3])


@cuda.jit(device=True, inline=True)
def _store_units_bf16(array, index, values):
    store16(array, uint64(index * 4), (
        pack_bf16x2(values[0], values[1]), pack_bf16x2(values[2], values[3]),
        pack_bf16x2(values[4], values[5]), pack_bf16x2(values[6], values[7])))


@cuda.jit(device=True, inline=True)
def _load_units_f32(array, index, values):
    w = load16(array, uint64(index * 4))
    values[0] = f32_from_bits(w[0])
    values[1] = f32_from_bits(w[1])
    values[2] = f32_from_bits(w[2])
    values[3] = f32_from_bits(w[3])


@cuda.jit(device=True, inline=True)
def _store_units_f32(array, index, values):
    store16(array, uint64(index * 4), (f32_to_bits(values[0]), f32_to_bits(values[1]),
                                       f32_to_bits(values[2]), f32_to_bits(values[3])))


@cuda.jit(device=True, inline=True)
def _load_units_f64(array, index, values):
    low, high = load16_words(array, uint64(index * 4))
    values[0] = bitcast(low, float64)
    values[1] = bitcast(high, float64)


@cuda.jit(device=True, inline=True)
def _store_units_f64(array, index, values):
    store16_words(array, uint64(index * 4), bitcast(float64(values[0]), uint64),
                  bitcast(float64(values[1]), uint64))


@cuda.jit(device=True, inline=True)
def _load_f16(array, index, values):
    values[0] = float32(array[uint64(index)])


@cuda.jit(device=True, inline=True)
def _store_f16(array, index, values):
    array[uint64(index)] = float16(values[0])


@cuda.jit(device=True, inline=True)
def _load_bf16(array, index, values):
    values[0] = bf16_to_f32(array[uint64(index)])


@cuda.jit(device=True, inline=True)
def _store_bf16(array, index, values):
    array[uint64(index)] = f32_to_bf16(values[0])


@cuda.jit(device=True, inline=True)
def _load_plain(array, index, values):  # f32 into f32, f64 into f64
    values[0] = array[uint64(index)]


@cuda.jit(device=True, inline=True)
def _store_plain(array, index, values):
    array[uint64(index)] = values[0]


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


def _make_gated_kernel(load, store, width: int, compute, backward: bool,  # noqa: ANN001
                       fixed_act: int):  # noqa: ANN202 - returns a kernel function
    """The kernel body; ``fixed_act`` >= 0 compiles one activation in (tuning builds)."""
    forward_value, backward_values = _MATH[compute]
    tensors = BACKWARD_TENSORS if backward else FORWARD_TENSORS
    offsets = _OFFSETS[tensors]

    if not backward:

        def gated_activation(gate, up, y, params, shape, strides):
            """``params`` = (total, row_units, act, inner strides x3, bases x3)."""
            total, row_units, act = params[0], params[1], params[2]
            if fixed_act >= 0:
                act = fixed_act
            g_values = cuda.local.array(width, compute)
            u_values = cuda.local.array(width, compute)
            at = cuda.local.array(tensors, int64)
            t = int64(cuda.threadIdx.x) + int64(cuda.blockIdx.x) * int64(cuda.blockDim.x)
            step = int64(cuda.blockDim.x) * int64(cuda.gridDim.x)
            while t < total:
                row, unit = div_mod(t, row_units)
                offsets(row, shape, strides, at)
                load(gate, params[6] + at[0] + unit * params[3], g_values)
                load(up, params[7] + at[1] + unit * params[4], u_values)
                for e in range(width):
                    g_values[e] = forward_value(act, g_values[e], u_values[e])
                store(y, params[8] + at[2] + unit * params[5], g_values)
                t += step

        return gated_activation

    def gated_activation_backward(dy, gate, up, dgate, dup, params, shape, strides):
        """``params`` = (total, row_units, act, inner strides x5, bases x5, one output):
        with ``one output`` set, ``dup`` goes to ``dgate``'s array (the one-tensor form's
        ``dx``: one argument, since the simulator copies each array argument in and out
        and two over one buffer would undo each other's writes)."""
        total, row_units, act = params[0], params[1], params[2]
        dup_out = dgate if params[13] != 0 else dup
        if fixed_act >= 0:
            act = fixed_act
        d_values = cuda.local.array(width, compute)
        g_values = cuda.local.array(width, compute)
        u_values = cuda.local.array(width, compute)
        at = cuda.local.array(tensors, int64)
        t = int64(cuda.threadIdx.x) + int64(cuda.blockIdx.x) * int64(cuda.blockDim.x)
        step = int64(cuda.blockDim.x) * int64(cuda.gridDim.x)
        while t < total:
            row, unit = div_mod(t, row_units)
            offsets(row, shape, strides, at)
            load(dy, params[8] + at[0] + unit * params[3], d_values)
            load(gate, params[9] + at[1] + unit * params[4], g_values)
            load(up, params[10] + at[2] + unit * params[5], u_values)
            for e in range(width):
                g_values[e], u_values[e] = backward_values(act, d_values[e], g_values[e],
                                                           u_values[e])
            store(dgate, params[11] + at[3] + unit * params[6], g_values)
            store(dup_out, params[12] + at[4] + unit * params[7], u_values)
            t += step

    return gated_activation_backward


#: (element, layout) -> (storage type of the kernel's arrays, load, store, values per
#: access, compute type): the one table every signature, the plan's dtype check and the
#: tests come from.
GATED_TABLE = {
    (ElementKind.F16, "units16"): (uint32, _load_units_f16, _store_units_f16, 8, float32),
    (ElementKind.BF16, "units16"): (uint32, _load_units_bf16, _store_units_bf16, 8, float32),
    (ElementKind.F32, "units16"): (uint32, _load_units_f32, _store_units_f32, 4, float32),
    (ElementKind.F64, "units16"): (uint32, _load_units_f64, _store_units_f64, 2, float64),
    (ElementKind.F16, "elements"): (float16, _load_f16, _store_f16, 1, float32),
    (ElementKind.BF16, "elements"): (uint16, _load_bf16, _store_bf16, 1, float32),
    (ElementKind.F32, "elements"): (float32, _load_plain, _store_plain, 1, float32),
    (ElementKind.F64, "elements"): (float64, _load_plain, _store_plain, 1, float64),
}
GATED_LAYOUTS = ("units16", "elements")
GATED_ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32, ElementKind.F64)


def _signature(storage: types.Type, backward: bool) -> tuple[types.Type, ...]:
    tensors = BACKWARD_TENSORS if backward else FORWARD_TENSORS
    array = types.Array(storage, 1, "C")
    return ((array,) * tensors + (types.UniTuple(int64, 3 + 2 * tensors + backward),
                                  types.UniTuple(int64, MAX_RANK),
                                  types.UniTuple(int64, MAX_RANK * tensors)))


def build_gated_kernel(element: ElementKind, layout: str, backward: bool,
                       fixed_act: int = -1, register: bool = True) -> Kernel:
    """The kernel of ``GATED_TABLE[element, layout]``; ``fixed_act`` >= 0 builds an
    unregistered variant with that activation compiled in (benchmark A/B only)."""
    storage, load, store, width, compute = GATED_TABLE[element, layout]
    body = _make_gated_kernel(load, store, width, compute, backward, fixed_act)
    direction = "bw" if backward else "fw"
    suffix = f",act{fixed_act}" if fixed_act >= 0 else ""
    return Kernel(f"gated_activation[{element.name},{layout},{direction}{suffix}]", body,
                  _signature(storage, backward), grid_stride=True,
                  register=register and fixed_act < 0)


#: (element, layout, backward) -> Kernel: 16 signatures.
GATED_KERNELS = {(element, layout, backward): build_gated_kernel(element, layout, backward)
                 for element, layout in GATED_TABLE for backward in (False, True)}
