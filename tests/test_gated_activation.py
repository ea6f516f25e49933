"""GatedActivationPlan / GatedActivationBackwardPlan against NumPy float64 references
(torch's formulas: ``F.silu(g)·u``, ``F.gelu(g, approximate)·u``, ``F.relu(g)·u``,
``F.glu``), the dispatch function on the CPU, rejections, and on a GPU against torch with
autograd (large shapes, one tensor over 2^31 elements)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import FLOAT_ELEMENTS, TOLERANCE, torch_or_skip

from baracuda_numba.errors import InvalidProblem, Unsupported
from baracuda_numba.plans.gated_activation import (
    GatedActivationArgs,
    GatedActivationBackwardArgs,
    GatedActivationBackwardPlan,
    GatedActivationDescriptor,
    GatedActivationPlan,
    choose_kernel,
)
from baracuda_numba.testing import (
    assert_within,
    from_storage,
    poisoned,
    random_values,
    to_device,
    to_host,
    to_storage,
)
from baracuda_numba.types import ElementKind, GatedActivationKind

K = GatedActivationKind
E = ElementKind
#: (kind, approximate): the five activations
ACTIVATIONS = ((K.SWIGLU, "none"), (K.GEGLU, "none"), (K.GEGLU, "tanh"), (K.REGLU, "none"),
               (K.GLU, "none"))
IEEE_SPECIALS = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's inf·0

# -- NumPy float64 references (torch's formulas; Φ and the tanh form written without the
# cancellation of 1 + erf / 1 + tanh, which float64 would also suffer for g << 0) ----------

_erfc = np.vectorize(math.erfc, otypes=[np.float64])
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _sigmoid(g: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-g))


def _tanh_z(g: np.ndarray) -> np.ndarray:
    return _SQRT_2_OVER_PI * (g + 0.044715 * g ** 3)


def reference_forward(kind: K, approximate: str, g: np.ndarray, u: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(y, conditioning factor): act(g)·u in float64."""
    with np.errstate(all="ignore"):
        if kind is K.SWIGLU:
            return g / (1.0 + np.exp(-g)) * u, 1.0 + np.abs(g)
        if kind is K.GEGLU and approximate == "tanh":
            z = _tanh_z(g)
            return g * _sigmoid(2.0 * z) * u, 1.0 + 2.0 * np.abs(z)
        if kind is K.GEGLU:
            return g * (0.5 * _erfc(-g / math.sqrt(2.0))) * u, 1.0 + g * g
        if kind is K.REGLU:
            relu = np.where((g > 0) | np.isnan(g), g, 0.0)
            return relu * u, np.ones_like(g)
        return u * _sigmoid(g), 1.0 + np.abs(g)


def reference_backward(kind: K, approximate: str, dy: np.ndarray, g: np.ndarray,
                       u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(dgate, dup, magnitude of dgate's terms, conditioning factor) in float64."""
    with np.errstate(all="ignore"):
        grad = dy * u
        y_over_u, cond = reference_forward(kind, approximate, g, np.ones_like(g))
        dup = dy * y_over_u
        if kind is K.SWIGLU:
            s = _sigmoid(g)
            terms = (s, g * s * (1.0 - s))
        elif kind is K.GEGLU and approximate == "tanh":
            s = _sigmoid(2.0 * _tanh_z(g))
            slope = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * g * g)
            terms = (s, 2.0 * g * s * (1.0 - s) * slope)
        elif kind is K.GEGLU:
            terms = (0.5 * _erfc(-g / math.sqrt(2.0)),
                     g * np.exp(-0.5 * g * g) / math.sqrt(2.0 * math.pi))
        elif kind is K.REGLU:
            relu = np.where((g > 0) | np.isnan(g), g, 0.0)
            dgate = np.where(relu <= 0, 0.0, grad)
            return dgate, dup, np.abs(dgate), cond
        else:
            s = _sigmoid(g)
            terms = ((1.0 - s) * s, np.zeros_like(g))
        dgate = grad * (terms[0] + terms[1])
        magnitude = np.abs(grad) * (np.abs(terms[0]) + np.abs(terms[1]))
        return dgate, dup, magnitude, cond


def _bound(element: ElementKind, magnitude: np.ndarray, cond: np.ndarray) -> np.ndarray:
    """rtol · conditioning · magnitude + atol: f32 math (a few ulps, times the exponent's
    or erfc's conditioning) plus one rounding to the storage type."""
    rtol, atol = TOLERANCE[element]
    with np.errstate(invalid="ignore"):
        return rtol * np.nan_to_num(cond, posinf=0.0) * np.nan_to_num(magnitude, posinf=0.0) \
            + atol


# -- running the plans on host arrays ---------------------------------------------------------


def _descriptor(kind: K, approximate: str, shape: tuple[int, ...], split_dim: int | None,
                element: ElementKind, **options) -> GatedActivationDescriptor:
    return GatedActivationDescriptor(kind, shape, split_dim, element, approximate=approximate,
                                     **options)


def _split(x: np.ndarray, split_dim: int, gate_first: bool) -> tuple[np.ndarray, np.ndarray]:
    first, second = np.split(x, 2, axis=split_dim)
    return (first, second) if gate_first else (second, first)


def _dev(array):
    """A device array of a host array; a device array (a strided view) as it is."""
    return to_device(array) if isinstance(array, np.ndarray) else array


def run_forward(desc: GatedActivationDescriptor, inputs: tuple[np.ndarray, ...],
                layout: str | None = None) -> tuple[np.ndarray, GatedActivationPlan]:
    plan = GatedActivationPlan.select(desc)
    plan.layout = layout
    y = to_device(poisoned(desc.output_shape, desc.element))
    if desc.split_dim is None:
        args = GatedActivationArgs(y=y, gate=_dev(inputs[0]), up=_dev(inputs[1]))
    else:
        args = GatedActivationArgs(to_device(inputs[0]), y)
    plan.run(args)
    return to_host(y), plan


def run_backward(desc: GatedActivationDescriptor, dy: np.ndarray, inputs: tuple[np.ndarray, ...],
                 layout: str | None = None) -> tuple[np.ndarray, ...]:
    plan = GatedActivationBackwardPlan.select(desc)
    plan.layout = layout
    if desc.split_dim is None:
        dgate = to_device(poisoned(desc.input_shape, desc.element))
        dup = to_device(poisoned(desc.input_shape, desc.element))
        plan.run(GatedActivationBackwardArgs(to_device(dy), gate=to_device(inputs[0]),
                                             up=to_device(inputs[1]), dgate=dgate, dup=dup))
        return to_host(dgate), to_host(dup)
    dx = to_device(poisoned(desc.input_shape, desc.element))
    plan.run(GatedActivationBackwardArgs(to_device(dy), to_device(inputs[0]), dx))
    return (to_host(dx),)


def check_forward(kind: K, approximate: str, element: ElementKind, shape: tuple[int, ...],
                  split_dim: int | None, rng: np.random.Generator, layout: str | None = None,
                  values: tuple[np.ndarray, ...] | None = None) -> str:
    desc = _descriptor(kind, approximate, shape, split_dim, element)
    if values is None:
        values = ((random_values(shape, element, rng),) if split_dim is not None else
                  (random_values(shape, element, rng), random_values(shape, element, rng)))
    got, plan = run_forward(desc, values, layout)
    if split_dim is None:
        g, u = (from_storage(v, element) for v in values)
    else:
        g, u = _split(from_storage(values[0], element), split_dim, kind is not K.GLU)
    expected, cond = reference_forward(kind, approximate, g, u)
    assert_within(from_storage(got, element), expected,
                  _bound(element, np.abs(expected), cond), f"{kind.name} {approximate} fw")
    return plan.choice.layout


def check_backward(kind: K, approximate: str, element: ElementKind, shape: tuple[int, ...],
                   split_dim: int | None, rng: np.random.Generator,
                   layout: str | None = None) -> None:
    desc = _descriptor(kind, approximate, shape, split_dim, element)
    out_shape = desc.output_shape
    dy = random_values(out_shape, element, rng)
    if split_dim is None:
        inputs = (random_values(shape, element, rng), random_values(shape, element, rng))
        g, u = (from_storage(v, element) for v in inputs)
    else:
        inputs = (random_values(shape, element, rng),)
        g, u = _split(from_storage(inputs[0], element), split_dim, kind is not K.GLU)
    outputs = run_backward(desc, dy, inputs, layout)
    dgate, dup, magnitude, cond = reference_backward(kind, approximate,
                                                      from_storage(dy, element), g, u)
    if split_dim is None:
        got_dgate, got_dup = (from_storage(o, element) for o in outputs)
    else:
        got_dgate, got_dup = _split(from_storage(outputs[0], element), split_dim,
                                    kind is not K.GLU)
    what = f"{kind.name} {approximate} bw"
    assert_within(got_dgate, dgate, _bound(element, magnitude, cond), what + " dgate")
    assert_within(got_dup, dup, _bound(element, np.abs(dup), cond), what + " dup")


# -- the grid: every activation x form x layout at one element kind, every element kind at
# one activation (the simulator runs ~0.2 ms a thread) ----------------------------------------

FORMS = ((16,), None), ((3, 32), -1), ((3, 16), None), ((4, 8), 0)
ODD = ((3, 14), -1), ((5, 7), None)


@pytest.mark.parametrize("kind,approximate", ACTIVATIONS)
@pytest.mark.parametrize("shape,split_dim", FORMS + ODD)
def test_forward_activations(kind, approximate, shape, split_dim, rng):
    element = E.F32
    layout = check_forward(kind, approximate, element, shape, split_dim, rng)
    if (shape, split_dim) in ODD:
        assert layout == "elements"
    check_forward(kind, approximate, element, shape, split_dim, rng, layout="elements")


@pytest.mark.parametrize("kind,approximate", ACTIVATIONS)
@pytest.mark.parametrize("shape,split_dim", [((3, 32), -1), ((3, 16), None), ((5, 7), None)])
def test_backward_activations(kind, approximate, shape, split_dim, rng):
    check_backward(kind, approximate, E.F32, shape, split_dim, rng)
    check_backward(kind, approximate, E.F32, shape, split_dim, rng, layout="elements")


@pytest.mark.parametrize("element", FLOAT_ELEMENTS)
@pytest.mark.parametrize("kind,approximate", ((K.SWIGLU, "none"), (K.GEGLU, "none")))
def test_elements(element, kind, approximate, rng):
    for shape, split_dim in (((2, 32), -1), ((2, 15), None)):
        check_forward(kind, approximate, element, shape, split_dim, rng)
        check_backward(kind, approximate, element, shape, split_dim, rng)


@pytest.mark.parametrize("element", (E.BF16, E.F32))
def test_units_and_elements_same_bits(element, rng):
    """Both layouts compute the same values (the bits of a rerun never change)."""
    for kind, approximate in ACTIVATIONS:
        desc = _descriptor(kind, approximate, (2, 32), -1, element)
        x = random_values((2, 32), element, rng)
        units, plan = run_forward(desc, (x,))
        assert plan.choice.layout == "units16"
        again, _ = run_forward(desc, (x,))
        elements, plan = run_forward(desc, (x,), layout="elements")
        assert plan.choice.layout == "elements"
        assert np.array_equal(units.view(np.uint8), again.view(np.uint8))
        assert np.array_equal(units.view(np.uint8), elements.view(np.uint8))


@IEEE_SPECIALS
@pytest.mark.parametrize("element", (E.F16, E.BF16))
@pytest.mark.parametrize("kind,approximate", ((K.SWIGLU, "none"), (K.GEGLU, "none"),
                                              (K.GEGLU, "tanh")))
def test_fast_math_tails(element, kind, approximate, rng):
    """f16/bf16 outputs take the fast f32 math (ex2.approx exponentials, the erfcc fit for
    Φ): still within the dtype's tolerance far out in both tails."""
    g = to_storage(np.linspace(-12.0, 12.0, 48), element)
    u = to_storage(np.linspace(1.5, -1.5, 48), element)
    check_forward(kind, approximate, element, (48,), None, rng, values=(g, u))
    check_forward(kind, approximate, element, (48,), None, rng, layout="elements",
                  values=(g, u))
    dy = to_storage(np.full(48, 0.75), element)
    dgate, dup, magnitude, cond = reference_backward(
        kind, approximate, from_storage(dy, element), from_storage(g, element),
        from_storage(u, element))
    got_dgate, got_dup = run_backward(_descriptor(kind, approximate, (48,), None, element),
                                      dy, (g, u))
    assert_within(from_storage(got_dgate, element), dgate, _bound(element, magnitude, cond),
                  "dgate")
    assert_within(from_storage(got_dup, element), dup, _bound(element, np.abs(dup), cond),
                  "dup")


# -- IEEE specials: NaN and inf where torch's formula puts them -------------------------------

_SPECIAL_G = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 4.0, -4.0, 0.5,
                       -3.0, 5.0, np.nan, np.inf, -np.inf, 2.0])
_SPECIAL_U = np.array([1.0, 2.0, 3.0, np.inf, np.nan, -np.inf, 0.0, 1.5, np.inf, np.nan,
                       -2.0, 0.0, 0.0, 0.0, 0.0, -np.inf])


@IEEE_SPECIALS
@pytest.mark.parametrize("kind,approximate", ACTIVATIONS)
@pytest.mark.parametrize("element", (E.F32, E.BF16))
def test_specials(kind, approximate, element, rng):
    g = to_storage(_SPECIAL_G, element)
    u = to_storage(_SPECIAL_U, element)
    check_forward(kind, approximate, element, (16,), None, rng, values=(g, u))
    dy = to_storage(np.array([1.0, -1.0, 2.0, 0.5] * 4), element)
    dgate, dup, magnitude, cond = reference_backward(
        kind, approximate, from_storage(dy, element), from_storage(g, element),
        from_storage(u, element))
    desc = _descriptor(kind, approximate, (16,), None, element)
    got_dgate, got_dup = run_backward(desc, dy, (g, u))
    assert_within(from_storage(got_dgate, element), dgate, _bound(element, magnitude, cond),
                  "dgate")
    assert_within(from_storage(got_dup, element), dup, _bound(element, np.abs(dup), cond),
                  "dup")


# -- layouts: strided rows, rank 8, broadcast, empty -----------------------------------------


@pytest.mark.parametrize("element", (E.BF16, E.F64))
def test_strided_rows(element, rng):
    """Halves sliced out of wider rows (outer stride > row), a transposed up, rank 8."""
    kind = K.SWIGLU
    wide = random_values((3, 48), element, rng)
    on_device = to_device(wide)
    gate, up = on_device[:, :16], on_device[:, 24:40]
    desc = _descriptor(kind, "none", (3, 16), None, element)
    got, plan = run_forward(desc, (gate, up))
    assert plan.choice.layout == "units16"
    expected, cond = reference_forward(kind, "none", from_storage(wide[:, :16], element),
                                       from_storage(wide[:, 24:40], element))
    assert_within(from_storage(got, element), expected,
                  _bound(element, np.abs(expected), cond), "strided")
    every_third = on_device[:, 0:24:3]  # inner stride 3: the element kernel
    got, plan = run_forward(_descriptor(kind, "none", (3, 8), None, element),
                            (on_device[:, 24:32], every_third))
    assert plan.choice.layout == "elements"
    expected, cond = reference_forward(kind, "none", from_storage(wide[:, 24:32], element),
                                       from_storage(wide[:, 0:24:3], element))
    assert_within(from_storage(got, element), expected,
                  _bound(element, np.abs(expected), cond), "inner stride 3")
    block = random_values((2, 5, 16), element, rng)  # outer axes that do not merge
    on_device = to_device(block)
    got, plan = run_forward(_descriptor(K.GEGLU, "none", (2, 3, 8), None, element),
                            (on_device[:, 1:4, :8], on_device[:, 2:5, 8:]))
    assert plan.choice.outer_shape[-3:] == (1, 2, 3)
    expected, cond = reference_forward(K.GEGLU, "none", from_storage(block[:, 1:4, :8], element),
                                       from_storage(block[:, 2:5, 8:], element))
    assert_within(from_storage(got, element), expected,
                  _bound(element, np.abs(expected), cond), "two outer axes")
    shape8 = (1, 2, 1, 2, 1, 1, 2, 4)
    check_forward(K.GLU, "none", element, shape8, 3, rng)
    check_backward(K.GEGLU, "tanh", element, shape8, 6, rng)


@pytest.mark.gpu
def test_gpu_broadcast_up():
    """An up of stride 0 along the rows (an expanded view) is read as given."""
    torch = torch_or_skip()
    from baracuda_numba import ops

    gate = torch.randn(3, 64, device="cuda")
    up = torch.randn(64, device="cuda").expand(3, 64)
    want = torch.nn.functional.silu(gate.double()) * up.double()
    assert torch.allclose(ops.swiglu(gate, up).double(), want, rtol=4e-6, atol=1e-6)


def test_sku():
    from baracuda_numba.types import OpCategory

    plan = GatedActivationBackwardPlan.select(_descriptor(K.GEGLU, "tanh", (4, 8), -1, E.BF16))
    sku = plan.sku
    assert (sku.category, sku.op, sku.layout, sku.epilogue) == (
        OpCategory.GATED_ACTIVATION, 3, "one_tensor", "tanh")
    assert plan.precision_guarantee.deterministic
    assert plan.precision_guarantee.accumulator is E.F32
    assert GatedActivationPlan.select(_descriptor(K.GLU, "none", (4,), None, E.F64)
                                      ).precision_guarantee.accumulator is E.F64


def test_empty_writes_nothing():
    element = E.F32
    for shape, split in (((0, 8), -1), ((4, 0), -1), ((0, 3), None)):
        desc = _descriptor(K.SWIGLU, "none", shape, split, element)
        got, plan = run_forward(desc, (np.zeros(shape, np.float32),) * 2)
        assert got.size == 0 and plan.choice is None


# -- the functional layer ----------------------------------------------------------------------


def test_ops(rng):
    from baracuda_numba import ops

    element = E.F32
    x = random_values((4, 16), element, rng)
    dy = random_values((4, 8), element, rng)
    first, second = x[:, :8].astype(np.float64), x[:, 8:].astype(np.float64)
    for fn, kind, approximate in ((ops.swiglu, K.SWIGLU, "none"), (ops.reglu, K.REGLU, "none"),
                                  (lambda *a: ops.geglu(*a, approximate="tanh"), K.GEGLU,
                                   "tanh")):
        expected, cond = reference_forward(kind, approximate, first, second)
        bound = _bound(element, np.abs(expected), cond)
        assert_within(to_host(fn(to_device(x))), expected, bound, f"{kind.name} one tensor")
        two = fn(to_device(np.ascontiguousarray(x[:, :8])), to_device(np.ascontiguousarray(
            x[:, 8:])))
        assert_within(to_host(two), expected, bound, f"{kind.name} two tensors")
    expected, cond = reference_forward(K.GLU, "none", x[2:].astype(np.float64),
                                       x[:2].astype(np.float64))
    assert_within(to_host(ops.glu(to_device(x), 0)), expected,
                  _bound(element, np.abs(expected), cond), "glu dim 0")
    dgate, dup, magnitude, cond = reference_backward(K.SWIGLU, "none", dy.astype(np.float64),
                                                     first, second)
    dx = to_host(ops.swiglu_backward(to_device(dy), to_device(x)))
    assert_within(dx[:, :8], dgate, _bound(element, magnitude, cond), "dgate")
    assert_within(dx[:, 8:], dup, _bound(element, np.abs(dup), cond), "dup")
    dy2 = random_values((2, 16), element, rng)
    dgate, dup, magnitude, cond = reference_backward(K.GLU, "none", dy2.astype(np.float64),
                                                     x[2:].astype(np.float64),
                                                     x[:2].astype(np.float64))
    dx = to_host(ops.glu_backward(to_device(dy2), to_device(x), 0))
    assert_within(dx[2:], dgate, _bound(element, magnitude, cond), "glu dgate")
    assert_within(dx[:2], dup, _bound(element, np.abs(dup), cond), "glu dup")
    with pytest.raises(InvalidProblem, match="approximate"):
        ops.geglu(to_device(x), approximate="fast")
    with pytest.raises(InvalidProblem, match="split_dim"):
        ops.glu(to_device(x), 2)


# -- the dispatch function (CPU only, no launch) ---------------------------------------------


def test_choose_kernel_merges_and_vectorises():
    # contiguous two-tensor form: one row of 4·1024 elements in 16-byte units
    c = choose_kernel(E.BF16, (4, 1024), ((1024, 1),) * 3, (0, 0, 0), (0, 0, 0))
    assert (c.layout, c.unit, c.row_units, c.total) == ("units16", 8, 512, 512)
    assert c.outer_shape == (1,) * 8 and c.grid == 2
    # one-tensor form: rows of 2I with the up half at +I
    c = choose_kernel(E.F32, (4, 64), ((128, 1), (128, 1), (64, 1)), (0, 64, 0), (0, 0, 0))
    assert (c.layout, c.unit, c.row_units) == ("units16", 4, 16)
    assert c.outer_shape[-1] == 4 and c.bases == (0, 16, 0)
    assert [s[-1] for s in c.outer_strides] == [32, 32, 16]


@pytest.mark.parametrize("why,args", [
    ("odd width", ((4, 63), ((126, 1), (126, 1), (63, 1)), (0, 63, 0), (0, 0, 0))),
    ("misaligned pointer", ((4, 64), ((64, 1),) * 3, (0, 0, 0), (0, 8, 0))),
    ("inner stride", ((4, 64), ((1, 4),) * 3, (0, 0, 0), (0, 0, 0))),
    ("outer stride", ((4, 64), ((66, 1), (64, 1), (64, 1)), (0, 0, 0), (0, 0, 0))),
])
def test_choose_kernel_falls_back_to_elements(why, args):
    c = choose_kernel(E.F32, *args)
    assert (c.layout, c.unit) == ("elements", 1), why
    assert c.total == 4 * 64 - (4 if why == "odd width" else 0)


def test_kernel_per_activation():
    """16-byte f16/bf16/f32 kernels compile the activation in; f64 and the element layout
    take it at run time (40 signatures, under the family budget of 60)."""
    from baracuda_numba.kernels.gated_activation import (
        ACT_GEGLU_TANH,
        GATED_KERNELS,
        gated_kernel,
    )

    assert len(GATED_KERNELS) == 40
    assert gated_kernel(E.BF16, "units16", True, ACT_GEGLU_TANH).name == \
        "gated_activation[BF16,units16,bw,act4]"
    assert gated_kernel(E.F64, "units16", False, ACT_GEGLU_TANH).name == \
        "gated_activation[F64,units16,fw]"
    assert gated_kernel(E.F32, "elements", False, 0).name == "gated_activation[F32,elements,fw]"
    c = choose_kernel(E.BF16, (4, 1024), ((1024, 1),) * 3, (0, 0, 0), (0, 0, 0),
                      per_thread=2)
    assert (c.total, c.per_thread, c.grid) == (512, 2, 1)


def test_choose_kernel_option_and_grid_limit():
    contiguous = ((4, 64), ((64, 1),) * 3, (0, 0, 0), (0, 0, 0))
    assert choose_kernel(E.F32, *contiguous, layout="elements").layout == "elements"
    assert choose_kernel(E.F32, *contiguous, layout="units16").layout == "units16"
    assert choose_kernel(E.F16, (1 << 20, 1024), ((1024, 1),) * 3, (0, 0, 0), (0, 0, 0),
                         max_grid=1000).grid == 1000


# -- rejections: the right error, raised before anything is written --------------------------


@pytest.mark.parametrize("desc_args,error", [
    ((K.SWIGLU, (4, 7), -1, E.F32), InvalidProblem),  # odd split axis
    ((K.SWIGLU, (4, 8), 2, E.F32), InvalidProblem),  # split_dim out of range
    ((K.SWIGLU, (), None, E.F32), InvalidProblem),  # rank 0
    ((K.SWIGLU, (1,) * 9, None, E.F32), Unsupported),  # rank 9
    ((K.SWIGLU, (4, -2), None, E.F32), InvalidProblem),
    ((K.SWIGLU, (4, 8), -1, E.I32), Unsupported),
    ((K.SWIGLU, (4, 8), -1, E.F32_STRICT), Unsupported),
    ((2, (4, 8), -1, E.F32), InvalidProblem),  # not a GatedActivationKind
])
def test_select_rejects(desc_args, error):
    with pytest.raises(error, match="GatedActivationPlan: "):
        GatedActivationPlan.select(GatedActivationDescriptor(*desc_args))
    with pytest.raises(error, match="GatedActivationBackwardPlan: "):
        GatedActivationBackwardPlan.select(GatedActivationDescriptor(*desc_args))


@pytest.mark.parametrize("kind,approximate", [(K.GEGLU, "exact"), (K.SWIGLU, "tanh"),
                                              (K.GEGLU, None)])
def test_select_rejects_approximate(kind, approximate):
    with pytest.raises(InvalidProblem, match="desc.approximate"):
        GatedActivationPlan.select(_descriptor(kind, approximate, (4, 8), -1, E.F32))


def test_run_rejects_before_writing():
    element = E.F32
    plan = GatedActivationPlan.select(_descriptor(K.SWIGLU, "none", (4, 8), -1, element))
    x = to_device(random_values((4, 8), element, np.random.default_rng()))
    y = to_device(poisoned((4, 4), element))
    cases = [
        (GatedActivationArgs(to_device(np.zeros((4, 6), np.float32)), y), "x has shape"),
        (GatedActivationArgs(x, to_device(np.zeros((4, 8), np.float32))), "y has shape"),
        (GatedActivationArgs(to_device(np.zeros((4, 8), np.float64)), y), "x has typestr"),
        (GatedActivationArgs(x, y, gate=x), "gate must be None"),
        (GatedActivationArgs(None, y), "x is None"),
        (GatedActivationArgs(x, x[:, :4]), "y overlaps x"),
    ]
    for args, message in cases:
        with pytest.raises(InvalidProblem, match=message):
            plan.run(args)
    assert np.isnan(to_host(y)).all()
    forward_two = GatedActivationPlan.select(_descriptor(K.REGLU, "none", (4, 4), None, element))
    gate = to_device(random_values((4, 4), element, np.random.default_rng()))
    with pytest.raises(InvalidProblem, match="up has shape"):
        forward_two.run(GatedActivationArgs(y=y, gate=gate,
                                            up=to_device(np.zeros((4, 5), np.float32))))
    with pytest.raises(InvalidProblem, match="y overlaps gate"):
        forward_two.run(GatedActivationArgs(y=gate, gate=gate, up=gate))
    assert np.isnan(to_host(y)).all()
    two = GatedActivationBackwardPlan.select(_descriptor(K.GLU, "none", (4, 4), None, element))
    g, u, dy = (to_device(random_values((4, 4), element, np.random.default_rng()))
                for _ in range(3))
    dgate = to_device(poisoned((4, 4), element))
    for args, message in [
        (GatedActivationBackwardArgs(dy, gate=g, up=u, dgate=dgate, dup=dgate),
         "dgate overlaps dup"),
        (GatedActivationBackwardArgs(dy, gate=g, up=u, dgate=dgate, dup=g), "dup overlaps gate"),
        (GatedActivationBackwardArgs(dy, x=g, gate=g, up=u, dgate=dgate, dup=dy),
         "x must be None"),
        (GatedActivationBackwardArgs(dy, gate=g, dgate=dgate, dup=dy), "up is None"),
    ]:
        with pytest.raises(InvalidProblem, match=message):
            two.run(args)
    assert np.isnan(to_host(dgate)).all()


# -- GPU: against torch and autograd ---------------------------------------------------------

_TORCH_DTYPES = {E.F16: "float16", E.BF16: "bfloat16", E.F32: "float32", E.F64: "float64"}


def _torch_formula(torch, kind: K, approximate: str, g, u):
    F = torch.nn.functional
    if kind is K.SWIGLU:
        return F.silu(g) * u
    if kind is K.GEGLU:
        return F.gelu(g, approximate=approximate) * u
    if kind is K.REGLU:
        return F.relu(g) * u
    return F.glu(torch.cat((u, g), -1), -1)


def _torch_check(torch, kind, approximate, element, gate, up, dy, y, dgate, dup):
    """Our y / dgate / dup against torch's formula and autograd in float64 (torch's f32
    gelu and tanh lose digits for g << 0 to 1 + erf / 1 + tanh; its f64 does not here)."""
    g = gate.detach().double().requires_grad_()
    u = up.detach().double().requires_grad_()
    expected = _torch_formula(torch, kind, approximate, g, u)
    expected_dgate, expected_dup = torch.autograd.grad(expected, (g, u), dy.double())
    rtol, atol = TOLERANCE[element]
    cond = 8.0 if kind is K.GEGLU else 4.0  # inputs in [-2, 2]: the conditioning bound
    for got, want, what in ((y, expected, "y"), (dgate, expected_dgate, "dgate"),
                            (dup, expected_dup, "dup")):
        want = want.detach()
        bound = rtol * cond * (want.abs() + (dy.double().abs() * u.detach().abs()
                                             if what == "dgate" else 0)) + atol
        bad = ((got.double() - want).abs() > bound) | (got.isnan() != want.isnan())
        assert not bool(bad.any()), (what, int(bad.sum()), got[bad][:4], want[bad][:4])


@pytest.mark.gpu
@pytest.mark.parametrize("element", FLOAT_ELEMENTS)
@pytest.mark.parametrize("kind,approximate", ACTIVATIONS)
@pytest.mark.parametrize("shape", [(4096, 255), (1000, 257), (3, 1 << 17), (1, (1 << 20) + 8)])
def test_gpu_against_torch(element, kind, approximate, shape):
    torch = torch_or_skip()
    import baracuda_numba.torch as bt

    dtype = getattr(torch, _TORCH_DTYPES[element])
    x = (torch.rand(shape[0], 2 * shape[1], device="cuda") * 4 - 2).to(dtype)
    dy = (torch.rand(shape, device="cuda") * 4 - 2).to(dtype)
    first, second = x.chunk(2, -1)
    gate, up = (second, first) if kind is K.GLU else (first, second)
    xg = x.clone().requires_grad_()
    if kind is K.GLU:
        y = bt.glu(xg)
    elif kind is K.GEGLU:
        y = bt.geglu(xg, approximate=approximate)
    else:
        y = {K.SWIGLU: bt.swiglu, K.REGLU: bt.reglu}[kind](xg)
    (dx,) = torch.autograd.grad(y, xg, dy)
    d_first, d_second = dx.chunk(2, -1)
    dgate, dup = (d_second, d_first) if kind is K.GLU else (d_first, d_second)
    _torch_check(torch, kind, approximate, element, gate, up, dy, y, dgate, dup)
    # the two-tensor form on the strided halves gives the same bits
    if kind is not K.GLU:
        fn = {K.SWIGLU: bt.swiglu, K.REGLU: bt.reglu,
              K.GEGLU: lambda a, b: bt.geglu(a, b, approximate=approximate)}[kind]
        assert torch.equal(fn(gate, up), y.detach())


@pytest.mark.gpu
def test_gpu_over_2_31_elements():
    torch = torch_or_skip()
    from baracuda_numba import ops

    rows, width = 1 << 17, (1 << 14) + 8  # 2^31 + 2^20 outputs
    x = torch.empty(rows, 2 * width, device="cuda", dtype=torch.bfloat16).uniform_(-2, 2)
    y = ops.swiglu(x)
    gate, up = x.chunk(2, -1)
    for r in (0, rows // 2, rows - 1):
        want = (torch.nn.functional.silu(gate[r].float()) * up[r].float()).to(torch.bfloat16)
        diff = (y[r].float() - want.float()).abs()
        assert float(diff.max()) <= 8e-3 * float(want.float().abs().max()) + 8e-3
    del y
    dy = torch.ones(rows, width, device="cuda", dtype=torch.bfloat16)
    dx = ops.swiglu_backward(dy, x)
    r = rows - 1
    g = gate[r].double().requires_grad_()
    u = up[r].double().requires_grad_()
    dg, du = torch.autograd.grad(torch.nn.functional.silu(g) * u, (g, u),
                                 torch.ones_like(g))
    assert float((dx[r, :width].double() - dg).abs().max()) <= 8e-3 * 4 + 8e-3
    assert float((dx[r, width:].double() - du).abs().max()) <= 8e-3 * 4 + 8e-3


@pytest.mark.gpu
# torch.compile's machinery warns about its own internals (torch.jit deprecations inside
# inductor, fallbacks): not ours, and not failures of this test
@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.*")
@pytest.mark.filterwarnings("ignore::UserWarning:torch.*")
def test_gpu_custom_ops_compile():
    torch = torch_or_skip()
    import baracuda_numba.torch as bt

    x = torch.randn(64, 256, device="cuda", requires_grad=True)

    def model(t):
        return bt.swiglu(t).sum() + bt.geglu(t, approximate="tanh").sum() + bt.glu(t, 0).sum()

    eager = torch.autograd.grad(model(x), x)[0]
    compiled = torch.autograd.grad(torch.compile(model, fullgraph=True)(x), x)[0]
    # the same kernels; the three gradients may be summed in another order
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-6)

