"""baracuda-check cases for the reduce family: every kind x element x (forward, gradient,
arg) x (last axis, first axis), and the Max/Min/Var/Std gradients on lines that the
register-resident kernels hold, against NumPy float64."""

from __future__ import annotations

import math

import numpy as np

from ..plans.reduce import (
    ARG_REDUCE_KINDS,
    REDUCE_BACKWARD_ELEMENTS,
    REDUCE_ELEMENTS,
    REDUCE_KINDS,
    ArgReduceArgs,
    ArgReduceDescriptor,
    ArgReducePlan,
    ReduceArgs,
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceBackwardPlan,
    ReduceDescriptor,
    ReducePlan,
)
from ..testing import (
    TOLERANCE,
    from_storage,
    poisoned,
    random_values,
    to_device,
    to_host,
    to_storage,
)
from ..types import ElementKind, ReduceKind
from . import CheckCase

K = ReduceKind
_SIM_SHAPES = [((3, 37), 1), ((37, 3), 0)]
_GPU_SHAPES = [((64, 4099), 1), ((4099, 64), 0)]
# Max/Min/Var/Std gradients whose lines fit in one block's registers (rows of whole words,
# strips of columns): the register-resident kernels, for the element kinds with word access
_REG_KINDS = (K.MAX, K.MIN, K.VAR, K.STD)
_REG_ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32)
_REG_SIM_SHAPES = [((5, 16), 1), ((160, 16), 0)]
_REG_GPU_SHAPES = [((64, 4096), 1), ((4096, 64), 0)]
# Max/Min gradients of long rows split over blocks and of columns too long for the
# registers, with a workspace: the tie count after dx (inputs with ties: the rewrite)
_TIE_SIM_SHAPES = [((2, 701), 1), ((600, 8), 0)]
_TIE_GPU_SHAPES = [((4, 70001), 1), ((10000, 8), 0)]
_INTS = (ElementKind.I32, ElementKind.I64)
# Forward rows of 64 elements: the short-row path of the word kernel (f32: 8 lanes x 4
# words, f16/bf16: 4 x 4), every forward and arg kind
_SHORT_SIM_SHAPES = [((37, 64), 1)]
_SHORT_GPU_SHAPES = [((4099, 64), 1)]


def _reference(kind: ReduceKind, x: np.ndarray, axis: int) -> np.ndarray:
    n = x.shape[axis]
    if kind is K.SUM:
        return x.sum(axis=axis, keepdims=True)
    if kind is K.MEAN:
        return x.sum(axis=axis, keepdims=True) / n
    if kind is K.PROD:
        return x.prod(axis=axis, keepdims=True)
    if kind is K.MAX:
        return x.max(axis=axis, keepdims=True)
    if kind is K.MIN:
        return x.min(axis=axis, keepdims=True)
    if kind is K.NORM2:
        return np.sqrt((x * x).sum(axis=axis, keepdims=True))
    if kind is K.LOG_SUM_EXP:
        m = x.max(axis=axis, keepdims=True)
        return m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))
    var = ((x - x.mean(axis=axis, keepdims=True)) ** 2).sum(axis=axis, keepdims=True) / (n - 1)
    return var if kind is K.VAR else np.sqrt(var)


def _gradient(kind: ReduceKind, dy: np.ndarray, x: np.ndarray, y: np.ndarray,
              axis: int) -> np.ndarray:
    n = x.shape[axis]
    if kind is K.SUM:
        return np.broadcast_to(dy, x.shape)
    if kind is K.MEAN:
        return np.broadcast_to(dy / n, x.shape)
    if kind in (K.MAX, K.MIN):
        mask = x == y
        return dy / mask.sum(axis=axis, keepdims=True) * mask
    if kind is K.PROD:  # torch: exact where the line holds zeros
        zero = x == 0
        zeros = np.broadcast_to(zero.sum(axis=axis, keepdims=True), x.shape)
        others = np.where(zero, 1.0, x).prod(axis=axis, keepdims=True)
        exact = np.where(zero & (zeros == 1), dy * others, dy * 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(zeros == 0, dy * y / x, exact)
    if kind is K.NORM2:
        return dy * x / y
    if kind is K.LOG_SUM_EXP:
        return dy * np.exp(x - y)
    centered = x - x.mean(axis=axis, keepdims=True)
    if kind is K.VAR:
        return dy * 2 * centered / (n - 1)
    return dy / (2 * y) * 2 * centered / (n - 1)


def _inputs(kind: ReduceKind, shape: tuple[int, ...], element: ElementKind,
            rng: np.random.Generator) -> np.ndarray:
    if kind is K.PROD:
        if element in _INTS:
            return rng.integers(-2, 3, size=shape).astype(element.storage_dtype)
        # factors e^u, u in +-0.02: products of thousands stay in f16 range; the first
        # lines hold one, two and only zeros (the gradient's exact fix-up)
        x = np.exp(rng.uniform(-0.02, 0.02, size=shape))
        lines = x.reshape(-1, shape[-1]) if x.size else x.reshape(0, 0)  # a view
        if lines.shape[0] >= 3 and lines.shape[1] >= 2:
            lines[0, 1] = 0.0
            lines[1, :2] = 0.0
            lines[2, :] = 0.0
        return to_storage(x, element)
    if kind in (K.MAX, K.MIN, K.ARGMAX, K.ARGMIN):  # ties
        return to_storage(rng.integers(-4, 5, size=shape) * 0.5, element)
    return random_values(shape, element, rng)


def _error(got: np.ndarray, expected: np.ndarray, scale: np.ndarray | float) -> float:
    got = np.asarray(got, dtype=np.float64)
    if not np.array_equal(np.isnan(got), np.isnan(expected)):
        return math.inf
    finite = np.isfinite(expected)
    if not np.array_equal(got[~finite], expected[~finite]):
        return math.inf
    denominator = np.broadcast_to(np.abs(expected) + scale, expected.shape)[finite]
    diff = np.abs(got[finite] - expected[finite])
    return float(np.max(diff / np.maximum(denominator, 1e-300), initial=0.0))


def _rtol(element: ElementKind, n: int) -> float:
    """One output rounding + accumulator error growing like sqrt(n)."""
    acc = TOLERANCE[ElementKind.F64 if element is ElementKind.F64 else ElementKind.F32][0]
    own = TOLERANCE[element][0] if element not in _INTS else 0.0
    return own + acc * math.sqrt(n)


def _forward_case(kind, element, shape, axis):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        x = _inputs(kind, shape, element, rng)
        desc = ReduceDescriptor(kind, shape, axis, element)
        plan = ReducePlan.select(desc)
        y = to_device(poisoned(desc.output_shape(), element))
        ws = to_device(np.zeros(plan.workspace_size, np.uint8)) if plan.workspace_size else None
        plan.run(ReduceArgs(to_device(x), y), workspace=ws)
        x64 = from_storage(x, element).astype(np.float64)
        if element in _INTS:  # int64 accumulation, stored in the element's width (wraps)
            expected = _reference(kind, x.astype(np.int64), axis).astype(
                element.storage_dtype).astype(np.float64)
        else:
            expected = _reference(kind, x64, axis)
        scale = {K.SUM: np.abs(x64).sum(axis=axis, keepdims=True),
                 K.MEAN: np.abs(x64).mean(axis=axis, keepdims=True),
                 K.VAR: (x64 ** 2).mean(axis=axis, keepdims=True),
                 K.LOG_SUM_EXP: 1.0}.get(kind, 0.0)
        got = from_storage(to_host(y), element)
        return _error(got, expected, scale), _rtol(element, shape[axis])

    return run


def _arg_case(kind, element, shape, axis):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        x = _inputs(kind, shape, element, rng)
        desc = ArgReduceDescriptor(kind, shape, axis, element)
        plan = ArgReducePlan.select(desc)
        y = to_device(poisoned(desc.output_shape(), ElementKind.I64))
        ws = to_device(np.zeros(plan.workspace_size, np.uint8)) if plan.workspace_size else None
        plan.run(ArgReduceArgs(to_device(x), y), workspace=ws)
        pick = np.argmax if kind is K.ARGMAX else np.argmin
        expected = np.expand_dims(pick(from_storage(x, element), axis=axis), axis)
        return float(np.count_nonzero(to_host(y) != expected)), 0.0

    return run


def _backward_case(kind, element, shape, axis):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        x = _inputs(kind, shape, element, rng)
        x64 = from_storage(x, element)
        y = to_storage(_reference(kind, x64, axis), element)
        out_shape = tuple(1 if d == axis else s for d, s in enumerate(shape))
        dy = random_values(out_shape, element, rng)
        plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis, element))
        dx = to_device(poisoned(shape, element))
        ws = to_device(np.zeros(plan.workspace_size, np.uint8)) if plan.workspace_size else None
        plan.run(ReduceBackwardArgs(to_device(dy), dx, to_device(x), to_device(y)), workspace=ws)
        expected = _gradient(kind, from_storage(dy, element), x64, from_storage(y, element), axis)
        # f32/f64 arithmetic relative to the largest gradient, and f16's subnormal spacing
        scale = (8 * TOLERANCE[ElementKind.F32][0] * np.max(np.abs(expected))
                 + (2.0 ** -24 if element is ElementKind.F16 else 0.0)) / (2 * _rtol(element, 1))
        return _error(from_storage(to_host(dx), element), expected, scale), 2 * _rtol(element, 1)

    return run


def cases(simulator: bool) -> list[CheckCase]:
    shapes = _SIM_SHAPES if simulator else _GPU_SHAPES
    out = []
    for shape, axis in shapes:
        label = f"{shape} axis {axis}"
        for kind in REDUCE_KINDS:
            for element in REDUCE_ELEMENTS[kind]:
                out.append(CheckCase("reduce", "ReducePlan", element.name,
                                     f"{kind.name} {label}",
                                     _forward_case(kind, element, shape, axis)))
            for element in REDUCE_BACKWARD_ELEMENTS:
                out.append(CheckCase("reduce", "ReduceBackwardPlan", element.name,
                                     f"{kind.name} {label}",
                                     _backward_case(kind, element, shape, axis)))
        for kind in ARG_REDUCE_KINDS:
            for element in REDUCE_ELEMENTS[kind]:
                out.append(CheckCase("reduce", "ArgReducePlan", element.name,
                                     f"{kind.name} {label}",
                                     _arg_case(kind, element, shape, axis)))
    for shape, axis in _SHORT_SIM_SHAPES if simulator else _SHORT_GPU_SHAPES:
        for element in _REG_ELEMENTS:
            for kind in REDUCE_KINDS:
                out.append(CheckCase("reduce", "ReducePlan", element.name,
                                     f"{kind.name} {shape} axis {axis} (short rows)",
                                     _forward_case(kind, element, shape, axis)))
            for kind in ARG_REDUCE_KINDS:
                out.append(CheckCase("reduce", "ArgReducePlan", element.name,
                                     f"{kind.name} {shape} axis {axis} (short rows)",
                                     _arg_case(kind, element, shape, axis)))
    for shape, axis in _REG_SIM_SHAPES if simulator else _REG_GPU_SHAPES:
        for kind in _REG_KINDS:
            for element in _REG_ELEMENTS:
                out.append(CheckCase("reduce", "ReduceBackwardPlan", element.name,
                                     f"{kind.name} {shape} axis {axis} (register-resident)",
                                     _backward_case(kind, element, shape, axis)))
    for shape, axis in _TIE_SIM_SHAPES if simulator else _TIE_GPU_SHAPES:
        for kind in (K.MAX, K.MIN):
            for element in _REG_ELEMENTS:
                out.append(CheckCase("reduce", "ReduceBackwardPlan", element.name,
                                     f"{kind.name} {shape} axis {axis} (tie count after dx)",
                                     _backward_case(kind, element, shape, axis)))
    return out
