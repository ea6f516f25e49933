"""CrossEntropyLossPlan / CrossEntropyLossBackwardPlan against a NumPy float64 reference
(simulator and GPU), and the functional / torch layers against torch (GPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import TOLERANCE, torch_or_skip

from baracuda_numba import debug_enabled, set_debug
from baracuda_numba.errors import InvalidProblem, Unsupported
from baracuda_numba.plans.cross_entropy import (
    CrossEntropyChoice,
    CrossEntropyLossArgs,
    CrossEntropyLossBackwardArgs,
    CrossEntropyLossBackwardDescriptor,
    CrossEntropyLossBackwardPlan,
    CrossEntropyLossDescriptor,
    CrossEntropyLossPlan,
    choose_kernel,
)
from baracuda_numba.testing import from_storage, poisoned, random_values, to_device, to_host
from baracuda_numba.types import ElementKind, LossReduction

E = ElementKind
R = LossReduction
IEEE_SPECIALS = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf - inf in NumPy


# -- the reference ------------------------------------------------------------------------


def reference(x, target, reduction, ignore_index=-100, smoothing=0.0, z=0.0, softcap=None,
              weight=None, dy=None):
    """(loss, lse, grad) in float64, written from torch's definitions: log_softmax, NLL
    with class weights, torch's label-smoothing term, z * w_t * lse^2; grad of the loss
    times ``dy`` (1 when None)."""
    x = np.asarray(x, dtype=np.float64)
    n, v = x.shape
    y = softcap * np.tanh(x / softcap) if softcap else x
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        peak = np.max(y, axis=1, keepdims=True) if v else np.zeros((n, 1))
        peak = np.where(np.isfinite(peak), peak, 0.0)
        lse = np.log(np.sum(np.exp(y - peak), axis=1)) + peak[:, 0]
        w = np.ones(v) if weight is None else np.asarray(weight, dtype=np.float64)
        valid = target != ignore_index
        t = np.where(valid, target, 0)
        w_t = np.where(valid, w[t], 0.0)
        logp = y - lse[:, None]
        nll = -logp[np.arange(n), t]
        smooth = -(logp * w).sum(axis=1)
        rows = w_t * (1 - smoothing) * nll + w_t * z * lse ** 2
        if smoothing:
            rows = rows + smoothing / v * smooth
        rows = np.where(valid, rows, 0.0)
        denom = w_t.sum()
        if reduction is R.NONE:
            loss = rows
            scale = np.ones(n) if dy is None else np.asarray(dy, dtype=np.float64)
        elif reduction is R.SUM:
            loss = np.array([rows.sum()])
            scale = np.full(n, 1.0 if dy is None else float(dy[0]))
        else:
            loss = np.array([rows.sum() / denom if denom else math.nan])
            scale = np.full(n, (1.0 if dy is None else float(dy[0])) / denom)
        p = np.exp(logp)
        onehot = np.zeros((n, v))
        onehot[np.arange(n), t] = 1.0
        g = ((w_t * (1 - smoothing) + smoothing * w.sum() / v + 2 * z * w_t * lse)[:, None] * p
             - (w_t * (1 - smoothing))[:, None] * onehot - smoothing * w[None, :] / v)
        if softcap:
            g = g * (1 - (y / softcap) ** 2)
        g = np.where(valid[:, None], g * scale[:, None], 0.0)
    return loss, lse, g


def _tolerances(element, v):
    """(rtol of the loss and lse, rtol of the gradient stored in ``element``): sums of
    ``v`` terms in the accumulator (f64 for F64 logits, else f32), then one rounding of
    the output (loss and lse are f32 for every kind)."""
    acc = E.F64 if element is E.F64 else E.F32
    acc_rtol = TOLERANCE[acc][0] * 4 * max(1.0, math.sqrt(v))
    return acc_rtol + TOLERANCE[E.F32][0], TOLERANCE[element][0] + acc_rtol


def _check(got, want, rtol, what):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: NaN positions differ"
    assert np.array_equal(np.isposinf(got), np.isposinf(want)), f"{what}: +inf differ"
    assert np.array_equal(np.isneginf(got), np.isneginf(want)), f"{what}: -inf differ"
    finite = np.isfinite(want)
    scale = np.max(np.abs(want[finite])) if finite.any() else 0.0
    err = np.abs(got[finite] - want[finite])
    bound = rtol * (np.abs(want[finite]) + scale + 1e-30)
    bad = np.argwhere(err > bound)
    assert bad.size == 0, (f"{what}: {bad.size} mismatches, first at {bad[:3].tolist()}: "
                           f"got {got[finite][bad[:3, 0]]}, want {want[finite][bad[:3, 0]]}")


def _run_forward(x_host, target, element, reduction, grad=True, split=None, weight=None,
                 inplace=False, **options):
    n, v = x_host.shape
    desc = CrossEntropyLossDescriptor(
        n, v, reduction, element, E.I64 if target.dtype == np.int64 else E.I32,
        has_weight=weight is not None, compute_grad=grad, **options)
    plan = CrossEntropyLossPlan.select(desc, split=split)
    x = to_device(x_host)
    out = to_device(poisoned((n,) if reduction is R.NONE else (1,), E.F32))
    lse = to_device(poisoned((n,), E.F32))
    g = None
    if grad:
        g = x if inplace else to_device(poisoned((n, v), element))
    ws = to_device(np.zeros(max(plan.workspace_size // 4, 1), np.float32))
    w = None if weight is None else to_device(np.asarray(weight, np.float32))
    plan.run(CrossEntropyLossArgs(x, to_device(target), out, lse, w, g), workspace=ws)
    grad_host = from_storage(to_host(g), element) if grad else None
    return plan, to_host(out), to_host(lse), grad_host


def _targets(rng, n, v, ignored=(), dtype=np.int64):
    t = rng.integers(0, v, size=n).astype(dtype)
    t[list(ignored)] = -100
    return t


def _compare(x_host, target, element, reduction, split=None, weight=None, inplace=False,
             **options):
    plan, out, lse, grad = _run_forward(x_host, target, element, reduction, split=split,
                                        weight=weight, inplace=inplace, **options)
    want_loss, want_lse, want_grad = reference(
        from_storage(x_host, element), target, reduction,
        smoothing=options.get("label_smoothing", 0.0), z=options.get("z_loss", 0.0),
        softcap=options.get("softcap"), weight=weight)
    acc_rtol, grad_rtol = _tolerances(element, x_host.shape[1])
    _check(out, want_loss, acc_rtol, "loss")
    _check(lse, want_lse, acc_rtol, "lse")
    _check(grad, want_grad, grad_rtol, "grad")
    return plan


# -- dispatch (CPU only, no launch) ---------------------------------------------------------


def test_choose_kernel():
    assert choose_kernel(8192, 128256, 4) == CrossEntropyChoice(
        "rows", 1, 128256, choose_kernel(8192, 128256, 4).block)
    few = choose_kernel(2, 128256, 4)
    assert few.path == "split" and few.chunks > 1
    assert few.chunk_len % 4 == 0 and few.chunks * few.chunk_len >= 128256
    assert (few.chunks - 1) * few.chunk_len < 128256
    assert choose_kernel(2, 100, 4).path == "rows"  # too short to split
    assert choose_kernel(2, 1 << 19, 2) == choose_kernel(2, 1 << 19, 2)  # problem only
    forced = choose_kernel(1000, 37, 4, split=3)
    assert forced.path == "split" and forced.chunks == 3 and forced.chunk_len == 16
    assert choose_kernel(5, 1, 4, split=7).path == "rows"
    for n, v, unit in ((1, 1, 4), (3, 5, 1), (4096, 256000, 4), (1, 1 << 19, 2)):
        c = choose_kernel(n, v, unit)
        assert 32 <= c.block <= 1024 and c.block % 32 == 0


# -- forward and fused gradient ------------------------------------------------------------


@pytest.mark.parametrize("element", [E.F32, E.BF16, E.F16, E.F64])
@pytest.mark.parametrize("reduction", [R.NONE, R.MEAN, R.SUM])
def test_forward_with_grad(element, reduction, rng):
    x = random_values((3, 37), element, rng, -4, 4)
    _compare(x, _targets(rng, 3, 37, ignored=(1,)), element, reduction)


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("options", [
    {"label_smoothing": 0.1},
    {"z_loss": 1e-2},
    {"softcap": 2.5},
    {"weight": True},
    {"weight": True, "label_smoothing": 0.2, "z_loss": 1e-3, "softcap": 3.0},
], ids=["smoothing", "z_loss", "softcap", "weight", "all"])
@pytest.mark.parametrize("reduction", [R.MEAN, R.NONE])
def test_options(options, split, reduction, rng):
    """Each option on both paths, with ignored rows (smoothing: pytorch #73205)."""
    options = dict(options)
    weight = rng.uniform(0.25, 2.0, 29).astype(np.float32) if options.pop("weight", False) \
        else None
    x = random_values((4, 29), E.F32, rng, -3, 3)
    plan = _compare(x, _targets(rng, 4, 29, ignored=(0, 2)), E.F32, reduction, split=split,
                    weight=weight, **options)
    assert plan.choice.chunks == split


@pytest.mark.parametrize("v", [1, 2, 127, 128, 129])
@pytest.mark.parametrize("element", [E.BF16, E.F32])
def test_vocab_edges(v, element, rng):
    """One class, two classes, and one 32-thread block of 4-element units -1, 0, +1."""
    x = random_values((2, v), element, rng)
    _compare(x, _targets(rng, 2, v), element, R.MEAN)


@pytest.mark.parametrize("shape, split", [((1, 1031), 1), ((2, 1032), 1), ((2, 1032), 3)])
@pytest.mark.parametrize("element", [E.BF16, E.F32])
def test_long_rows(element, shape, split, rng):
    """Rows read as 8-byte units (row stride a multiple of the unit, or one row), long
    enough for every thread's four-loads-in-flight rounds, with and without a tail."""
    x = random_values(shape, element, rng, -6, 6)
    _compare(x, _targets(rng, *shape), element, R.MEAN, split=split, label_smoothing=0.05)


def test_functional(rng):
    """``ops.cross_entropy`` / ``ops.cross_entropy_backward`` run the plans: same bits."""
    from baracuda_numba import ops

    x = random_values((3, 21), E.F32, rng)
    target = _targets(rng, 3, 21, ignored=(0,))
    loss, lse = ops.cross_entropy(to_device(x), to_device(target), label_smoothing=0.1,
                                  return_lse=True)
    _, want_loss, want_lse, _ = _run_forward(x, target, E.F32, R.MEAN, grad=False,
                                             label_smoothing=0.1)
    assert to_host(loss).shape == () and to_host(loss) == want_loss[0]
    assert np.array_equal(to_host(lse), want_lse)
    dx = ops.cross_entropy_backward(to_device(x), to_device(target), lse,
                                    to_device(np.float32(1.0).reshape(())),
                                    label_smoothing=0.1)
    _, _, _, want_grad = _run_forward(x, target, E.F32, R.MEAN, label_smoothing=0.1)
    assert np.array_equal(to_host(dx), want_grad)  # fused and separate gradient agree
    with pytest.raises(InvalidProblem, match="cross_entropy: reduction"):
        ops.cross_entropy(to_device(x), to_device(target), reduction="avg")
    with pytest.raises(InvalidProblem, match="cross_entropy: target has dtype"):
        ops.cross_entropy(to_device(x), to_device(target.astype(np.float32)))


def test_int32_targets_and_split_edges(rng):
    x = random_values((3, 131), E.BF16, rng)
    target = np.array([130, -100, 0], np.int32)
    _compare(x, target, E.BF16, R.SUM, split=4)


@pytest.mark.parametrize("reduction", [R.MEAN, R.SUM, R.NONE])
def test_all_rows_ignored(reduction, rng):
    """Mean over no tokens is NaN (torch); sum 0; the gradient is zero."""
    x = random_values((3, 9), E.F32, rng)
    target = np.full(3, -100, np.int64)
    _, out, lse, grad = _run_forward(x, target, E.F32, reduction, label_smoothing=0.1)
    assert np.isnan(out[0]) if reduction is R.MEAN else not np.any(out)
    assert np.all(grad == 0) and np.all(np.isfinite(lse))


def test_custom_ignore_index(rng):
    x = random_values((3, 9), E.F32, rng)
    target = np.array([3, 5, 0], np.int64)
    _, out, _, grad = _run_forward(x, target, E.F32, R.NONE, ignore_index=5)
    assert out[1] == 0 and np.all(grad[1] == 0) and out[0] > 0


@IEEE_SPECIALS
@pytest.mark.parametrize("split", [1, 2])
def test_nan_and_inf_logits(split):
    """NaN anywhere in a row and +inf give NaN (as torch's log_softmax); -inf classes
    drop out; an all -inf row has lse -inf and a NaN loss."""
    v = 12
    x = np.zeros((5, v), np.float32)
    x[0, 3] = np.nan
    x[1, 4] = np.inf
    x[2, 5] = -np.inf
    x[3, :] = -np.inf
    x[4, 7] = -np.inf  # the target's own logit: infinite loss
    target = np.array([0, 0, 0, 0, 7], np.int64)
    _, out, lse, grad = _run_forward(x, target, E.F32, R.NONE, split=split)
    want_loss, want_lse, _ = reference(x, target, R.NONE)
    assert np.isnan(out[0]) and np.isnan(out[1]) and np.isnan(out[3])
    assert np.isposinf(out[4])
    _check(out[2:3], want_loss[2:3], 1e-5, "loss")
    _check(lse[[0, 2, 3, 4]], [np.nan, want_lse[2], -np.inf, want_lse[4]], 1e-5, "lse")
    assert np.all(np.isnan(grad[0])) and grad[2, 5] == 0


@pytest.mark.parametrize("split", [1, 3])
def test_bit_identical_reruns(split, rng):
    x = random_values((3, 61), E.BF16, rng)
    target = _targets(rng, 3, 61)
    first = _run_forward(x, target, E.BF16, R.MEAN, split=split, label_smoothing=0.1)
    second = _run_forward(x, target, E.BF16, R.MEAN, split=split, label_smoothing=0.1)
    for a, b in zip(first[1:], second[1:]):
        assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


@pytest.mark.parametrize("split", [1, 2])
def test_inplace_gradient(split, rng):
    """The gradient written over the logits' own buffer."""
    x = random_values((3, 40), E.BF16, rng)
    _compare(x, _targets(rng, 3, 40, ignored=(2,)), E.BF16, R.MEAN, split=split,
             inplace=True)


def test_strided_rows(rng):
    """Rows of a wider buffer (row stride 43: no 8-byte units) and a unit-aligned one."""
    for width in (43, 48):
        full = random_values((3, width), E.BF16, rng)
        view = to_device(full)[:, :37]
        target = _targets(rng, 3, 37)
        desc = CrossEntropyLossDescriptor(3, 37, R.NONE, E.BF16)
        plan = CrossEntropyLossPlan.select(desc)
        out = to_device(poisoned((3,), E.F32))
        lse = to_device(poisoned((3,), E.F32))
        ws = to_device(np.zeros(plan.workspace_size // 4, np.float32))
        plan.run(CrossEntropyLossArgs(view, to_device(target), out, lse), workspace=ws)
        want, want_lse, _ = reference(from_storage(full[:, :37], E.BF16), target, R.NONE)
        _check(to_host(out), want, _tolerances(E.BF16, 37)[0], "loss")
        _check(to_host(lse), want_lse, _tolerances(E.BF16, 37)[0], "lse")


def test_empty_batch():
    x = np.zeros((0, 5), np.float32)
    target = np.zeros(0, np.int64)
    for reduction, check in ((R.MEAN, np.isnan), (R.SUM, lambda v: v == 0)):
        _, out, _, _ = _run_forward(x, target, E.F32, reduction)
        assert check(out[0])


# -- backward plan --------------------------------------------------------------------------


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("reduction", [R.NONE, R.MEAN])
@pytest.mark.parametrize("inplace", [False, True])
def test_backward(split, reduction, inplace, rng):
    n, v = 3, 33
    x = random_values((n, v), E.BF16, rng)
    target = _targets(rng, n, v, ignored=(1,))
    weight = rng.uniform(0.5, 1.5, v).astype(np.float32)
    options = {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 4.0}
    _, _, lse, _ = _run_forward(x, target, E.BF16, reduction, grad=False, weight=weight,
                                **options)
    dy = rng.uniform(0.5, 2.0, n if reduction is R.NONE else 1).astype(np.float32)
    desc = CrossEntropyLossBackwardDescriptor(n, v, reduction, E.BF16, has_weight=True,
                                              **options)
    plan = CrossEntropyLossBackwardPlan.select(desc, split=split)
    x_dev = to_device(x)
    dinput = x_dev if inplace else to_device(poisoned((n, v), E.BF16))
    ws = to_device(np.zeros(plan.workspace_size // 4, np.float32))
    plan.run(CrossEntropyLossBackwardArgs(x_dev, to_device(target), to_device(lse),
                                          to_device(dy), dinput, to_device(weight)),
             workspace=ws)
    _, _, want = reference(from_storage(x, E.BF16), target, reduction, weight=weight, dy=dy,
                           smoothing=0.1, z=1e-3, softcap=4.0)
    _check(from_storage(to_host(dinput), E.BF16), want, _tolerances(E.BF16, v)[1], "dinput")


# -- out-of-range targets and the debug switch --------------------------------------------


def test_out_of_range_target_is_nan_without_debug(rng):
    assert not debug_enabled()
    x = random_values((2, 6), E.F32, rng)
    _, out, _, grad = _run_forward(x, np.array([6, 1], np.int64), E.F32, R.NONE)
    assert np.isnan(out[0]) and np.all(np.isnan(grad[0])) and np.isfinite(out[1])


def test_out_of_range_target_raises_under_debug(rng):
    set_debug(True)
    try:
        x = random_values((2, 6), E.F32, rng)
        desc = CrossEntropyLossDescriptor(2, 6, R.NONE, E.F32)
        plan = CrossEntropyLossPlan.select(desc)
        out = to_device(poisoned((2,), E.F32))
        ws = to_device(np.zeros(plan.workspace_size // 4, np.float32))
        with pytest.raises(InvalidProblem, match="CrossEntropyLossPlan: target has 1 values"):
            plan.run(CrossEntropyLossArgs(to_device(x), to_device(np.array([-1, 2])), out,
                                          to_device(poisoned((2,), E.F32))), workspace=ws)
        assert np.all(np.isnan(to_host(out)))  # the loss kernel never ran
    finally:
        set_debug(False)


# -- rejections ------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, exc, text", [
    ({"reduction": "mean"}, InvalidProblem, "reduction"),
    ({"label_smoothing": -0.1}, InvalidProblem, "label_smoothing"),
    ({"label_smoothing": 1.5}, InvalidProblem, "label_smoothing"),
    ({"z_loss": -1.0}, InvalidProblem, "z_loss"),
    ({"softcap": 0.0}, InvalidProblem, "softcap"),
    ({"class_extent": 0}, InvalidProblem, "class_extent"),
    ({"n_rows": -1}, InvalidProblem, "n_rows"),
    ({"element": E.I32}, Unsupported, "element"),
    ({"target_element": E.F32}, Unsupported, "target_element"),
])
def test_descriptor_rejections(fields, exc, text):
    base = {"n_rows": 2, "class_extent": 5, "reduction": R.MEAN, "element": E.F32}
    base.update(fields)
    with pytest.raises(exc, match=f"CrossEntropyLossPlan: {text}"):
        CrossEntropyLossPlan.select(CrossEntropyLossDescriptor(**base))
    with pytest.raises(exc, match=f"CrossEntropyLossBackwardPlan: {text}"):
        CrossEntropyLossBackwardPlan.select(CrossEntropyLossBackwardDescriptor(**base))


def test_array_rejections_write_nothing(rng):
    desc = CrossEntropyLossDescriptor(2, 5, R.NONE, E.F32, compute_grad=True)
    plan = CrossEntropyLossPlan.select(desc)
    x = to_device(random_values((2, 5), E.F32, rng))
    ws = to_device(np.zeros(plan.workspace_size // 4, np.float32))
    out = to_device(poisoned((2,), E.F32))
    lse = to_device(poisoned((2,), E.F32))
    grad = to_device(poisoned((2, 5), E.F32))
    good = np.array([1, 2], np.int64)
    cases = [
        ({"target": np.array([1, 2, 3], np.int64)}, InvalidProblem, "target"),
        ({"target": np.array([1.0, 2.0], np.float32)}, InvalidProblem, "target"),
        ({"input": to_device(np.zeros((2, 6), np.float32))}, InvalidProblem, "input"),
        ({"out": to_device(np.zeros(3, np.float32))}, InvalidProblem, "out"),
        ({"grad": None}, InvalidProblem, "grad"),
        ({"input": to_device(np.zeros((2, 10), np.float32))[:, ::2]}, Unsupported, "input"),
    ]
    for change, exc, arg in cases:
        fields = {"input": x, "target": to_device(good), "out": out, "lse": lse, "grad": grad}
        fields.update(change)
        with pytest.raises(exc, match=f"CrossEntropyLossPlan: {arg}"):
            plan.run(CrossEntropyLossArgs(**fields), workspace=ws)
    overlap = to_device(np.zeros(12, np.float32))
    half = overlap[2:12].reshape(2, 5)
    with pytest.raises(InvalidProblem, match="CrossEntropyLossPlan: grad overlaps"):
        plan.run(CrossEntropyLossArgs(overlap[:10].reshape(2, 5), to_device(good), out, lse,
                                      None, half), workspace=ws)
    assert np.all(np.isnan(to_host(out))) and np.all(np.isnan(to_host(lse)))
    assert np.all(np.isnan(to_host(grad)))


# -- GPU: torch, big shapes -------------------------------------------------------------------

BIG_SHAPES = [(3, (1 << 19) + 3), (4096, 32000), (257, 8193), (1, 1 << 20)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", BIG_SHAPES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_torch_against_f_cross_entropy(shape, dtype):
    torch = torch_or_skip()
    import baracuda_numba.torch as bt

    n, v = shape
    x = (torch.randn(n, v, device="cuda") * 3).to(getattr(torch, dtype))
    t = torch.randint(0, v, (n,), device="cuda")
    t[1::7] = -100
    weight = torch.rand(v, device="cuda") + 0.5
    for kwargs in ({}, {"label_smoothing": 0.1}, {"weight": weight},
                   {"weight": weight, "label_smoothing": 0.05, "reduction": "sum"},
                   {"reduction": "none"}):
        a = x.detach().clone().requires_grad_()
        b = x.detach().clone().requires_grad_()
        ours = bt.cross_entropy(a, t, **kwargs)
        theirs = torch.nn.functional.cross_entropy(b.float(), t, **kwargs)
        torch.testing.assert_close(ours, theirs, rtol=2e-5 * math.sqrt(v) / 30, atol=1e-5)
        dy = torch.rand_like(theirs)
        ours.backward(dy)
        theirs.backward(dy)
        torch.testing.assert_close(a.grad.float(), b.grad.float(),
                                   rtol=TOLERANCE[E.BF16 if dtype == "bfloat16" else E.F32][0],
                                   atol=1e-6 + 1e-3 * b.grad.abs().max().item())


@pytest.mark.gpu
def test_torch_z_loss_softcap_and_compile():
    torch = torch_or_skip()
    import baracuda_numba.torch as bt

    x = torch.randn(512, 4099, device="cuda", dtype=torch.bfloat16) * 4
    t = torch.randint(0, 4099, (512,), device="cuda")
    t[:50] = -100

    def eager(x):
        y = 30.0 * torch.tanh(x.float() / 30.0)
        lse = torch.logsumexp(y, dim=-1)
        ce = torch.nn.functional.cross_entropy(y, t, reduction="none", label_smoothing=0.1)
        valid = (t != -100).float()
        return ((ce + 1e-4 * lse ** 2 * valid).sum() / valid.sum())

    a = x.detach().clone().requires_grad_()
    b = x.detach().clone().requires_grad_()
    ours = bt.cross_entropy(a, t, label_smoothing=0.1, z_loss=1e-4, softcap=30.0)
    theirs = eager(b)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(a.grad.float(), b.grad.float(), rtol=1e-2, atol=1e-6)
    compiled = torch.compile(lambda x: bt.cross_entropy(x, t, label_smoothing=0.1))
    torch.testing.assert_close(compiled(x), bt.cross_entropy(x, t, label_smoothing=0.1))


@pytest.mark.gpu
def test_over_2_31_elements_inplace():
    """A [16400, 131072] bf16 tensor (2^31 + ... elements), gradient in place."""
    torch = torch_or_skip()
    import baracuda_numba.torch as bt

    n, v = 16400, 131072
    x = torch.randn(n, v, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, v, (n,), device="cuda")
    rows = torch.tensor([0, n // 2, n - 1], device="cuda")
    want = torch.nn.functional.cross_entropy(x[rows].float(), t[rows], reduction="none")
    want_grad = torch.softmax(x[rows].float(), -1)
    want_grad[torch.arange(3), t[rows]] -= 1
    loss = bt.cross_entropy(x, t, reduction="none", inplace_backward=True)
    torch.testing.assert_close(loss[rows], want, rtol=1e-4, atol=1e-4)
    x_leaf = x.requires_grad_()
    loss = bt.cross_entropy(x_leaf, t, reduction="sum", inplace_backward=True)
    loss.backward()
    torch.testing.assert_close(x_leaf.grad[rows].float(), want_grad, rtol=1e-2, atol=1e-4)
    del x, x_leaf


@pytest.mark.gpu
def test_ops_cross_entropy_matches_plan():
    torch = torch_or_skip()
    from baracuda_numba import ops

    x = torch.randn(64, 1000, device="cuda")
    t = torch.randint(0, 1000, (64,), device="cuda")
    loss, lse = ops.cross_entropy(x, t, return_lse=True)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(x, t))
    torch.testing.assert_close(lse, torch.logsumexp(x, -1))
    first, _ = ops.cross_entropy(x, t, return_lse=True)
    assert torch.equal(first, loss)  # bit-identical rerun


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [False, True])
def test_fused_linear_cross_entropy(bias):
    torch = torch_or_skip()
    import baracuda_numba.torch as bt

    n, h, v = 1030, 256, 5003
    hidden = torch.randn(n, h, device="cuda", requires_grad=True)
    weight = (torch.randn(v, h, device="cuda") / 16).requires_grad_()
    b = torch.randn(v, device="cuda", requires_grad=True) if bias else None
    t = torch.randint(0, v, (n,), device="cuda")
    t[::5] = -100
    loss = bt.fused_linear_cross_entropy(hidden, weight, t, bias=b, label_smoothing=0.1,
                                         chunk_rows=256)
    grads = torch.autograd.grad(loss, [hidden, weight] + ([b] if bias else []))
    logits = torch.nn.functional.linear(hidden, weight, b)
    want = torch.nn.functional.cross_entropy(logits, t, label_smoothing=0.1)
    want_grads = torch.autograd.grad(want, [hidden, weight] + ([b] if bias else []))
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)
    for got, expected in zip(grads, want_grads):
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-5)


@pytest.mark.gpu
def test_fused_linear_cross_entropy_compiles_without_graph_break():
    """``baracuda::fused_linear_cross_entropy`` under ``torch.compile(fullgraph=True)``."""
    torch = torch_or_skip()
    import baracuda_numba.torch as bt

    n, h, v = 300, 64, 1000
    hidden = torch.randn(n, h, device="cuda", requires_grad=True)
    weight = (torch.randn(v, h, device="cuda") / 8).requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")
    t[::7] = -100
    compiled = torch.compile(lambda hd, w: 2.0 * bt.fused_linear_cross_entropy(hd, w, t),
                             fullgraph=True)
    loss = compiled(hidden, weight)
    grads = torch.autograd.grad(loss, [hidden, weight])
    want = 2.0 * torch.nn.functional.cross_entropy(hidden @ weight.t(), t)
    want_grads = torch.autograd.grad(want, [hidden, weight])
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)
    for got, expected in zip(grads, want_grads):
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-5)
