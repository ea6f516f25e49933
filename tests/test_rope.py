"""RopePlan / RopeBackwardPlan against a plain NumPy float64 reference (and, on a GPU,
against PyTorch implementations of both pairings and torch.autograd).

The reference rounds exactly what the contract says the kernel rounds: for f16/bf16/f32
``inv_freq = f32(base^(-2i/R))`` (computed in f64) and ``θ = f32(f32(pos) · inv_freq)``;
cos/sin of that θ are then taken in f64 and rounded to f32. What remains is the kernel's
sincosf error (2 ulp), the f32 rotation and one rounding to the storage type.

Tolerances: ``TOLERANCE[element]`` with ``atol`` scaled by ``max|x|``: a rotation's error
is relative to the pair's norm, not to each output (an output near zero is the difference
of two products of size ``|x|``). For f64 the inverse frequency (``exp2`` of a product with
the host's ``log2 base``, ~1e-15 relative) is not rounded to a coarser type, so ``θ``
carries that relative error: the f64 atol is also scaled by ``1 + max|θ|``.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FLOAT_ELEMENTS, SIMULATOR, TOLERANCE, torch_or_skip

from baracuda_numba.arrays import TensorMut, as_mut, contiguous_strides
from baracuda_numba.errors import InvalidProblem, Unsupported
from baracuda_numba.kernels.rope import ROPE_KERNELS
from baracuda_numba.plans.rope import (
    RopeArgs,
    RopeBackwardArgs,
    RopeBackwardDescriptor,
    RopeBackwardPlan,
    RopeDescriptor,
    RopePlan,
)
from baracuda_numba.testing import (
    assert_close,
    from_storage,
    poisoned,
    random_values,
    to_device,
    to_host,
    to_storage,
)
from baracuda_numba.types import (
    AttentionKind,
    ElementKind,
    OpCategory,
    PlanPreference,
    RopePairing,
)

F16, BF16, F32, F64 = ElementKind.F16, ElementKind.BF16, ElementKind.F32, ElementKind.F64
INTERLEAVED, HALF_SPLIT = RopePairing.INTERLEAVED, RopePairing.HALF_SPLIT

# [B, H, S, D]: heads 5 = one batch of 4 + a remainder of 1; D = 12 with R = 8 makes the
# half-split unit path (R % 4 == 0) and a copied tail; R = 6 forces the element path.
SHAPE = (2, 5, 3, 12) if SIMULATOR else (3, 13, 37, 72)
# D = 32: 16-byte units of f16/bf16 (8 elements) tile D, R = 16, their halves and the tail
SHAPE16 = (2, 5, 3, 32) if SIMULATOR else (3, 13, 37, 144)


# -- reference ----------------------------------------------------------------------------


def rope_reference(x, positions, base, rotary_dim, pairing, inverse, element):
    """float64 RoPE of float64 ``x`` [B, H, S, D], rounding θ as the contract says."""
    batch, _, seq, _ = x.shape
    pairs = np.arange(rotary_dim // 2)
    inv_freq = np.float64(base) ** (-(2.0 * pairs) / rotary_dim)
    if positions is None:
        pos = np.broadcast_to(np.arange(seq), (batch, seq))
    else:
        pos = np.broadcast_to(np.asarray(positions), (batch, seq))
    if element is F64:
        theta = pos[:, :, None].astype(np.float64) * inv_freq
        cos, sin = np.cos(theta), np.sin(theta)
    else:
        theta = pos[:, :, None].astype(np.float32) * inv_freq.astype(np.float32)
        theta = theta.astype(np.float32).astype(np.float64)
        cos = np.cos(theta).astype(np.float32).astype(np.float64)
        sin = np.sin(theta).astype(np.float32).astype(np.float64)
    cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
    if inverse:
        sin = -sin
    y = x.copy()
    if pairing is INTERLEAVED:
        first, second = slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)
    else:
        first, second = slice(0, rotary_dim // 2), slice(rotary_dim // 2, rotary_dim)
    a, b = x[..., first], x[..., second]
    with np.errstate(invalid="ignore"):
        y[..., first] = a * cos - b * sin
        y[..., second] = b * cos + a * sin
    return y, float(np.max(np.abs(theta), initial=0.0))


def tolerance(element, x64, max_theta):
    rtol, atol = TOLERANCE[element]
    finite = x64[np.isfinite(x64)]
    scale = max(1.0, float(np.max(np.abs(finite), initial=0.0)))
    if element is F64:
        scale *= 1.0 + max_theta
    return rtol, atol * scale


def expected_storage_values(y64, element):
    """The reference as the storage type can hold it (one rounding), back in float64."""
    if element in (F16, BF16):
        return from_storage(to_storage(y64, element), element)
    return y64


#: Plan attributes that force one kernel family (``rows``: the ``ROPE_KERNELS`` layouts).
PATHS = {"table": {"angle_table": True},
         "table_planes": {"angle_table": True, "table_flat": False},
         "flat1": {"angle_table": True, "flat_planes_per_thread": 1},
         "flat4": {"angle_table": True, "flat_planes_per_thread": 4},
         "tile": {"angle_table": False, "tile": True},
         "rows": {"angle_table": False, "tile": False}}


def run_plan(desc, x_host, positions, inverse=False, force_pairs=False, out=None,
             heads_per_thread=None, units16=None, path=None):
    """``path``: a key of ``PATHS`` (forced: "table" takes rope_flat where it fits,
    "flat1" / "flat4" its variants with 1 / 4 planes a thread, "table_planes" never), or
    None (the plan's choice; "rows" when ``heads_per_thread`` or ``units16`` tune the rows
    kernels)."""
    plan = (RopeBackwardPlan if inverse else RopePlan).select(
        RopeBackwardDescriptor.of(desc) if inverse else desc)
    plan.force_pairs = force_pairs
    plan.units16 = units16
    if path is None and (heads_per_thread is not None or units16 is not None):
        path = "rows"
    for name, value in PATHS.get(path, {}).items():
        setattr(plan, name, value)
    if heads_per_thread is not None:  # both kernels: 8-byte units and 16-byte units
        plan.heads_per_thread = heads_per_thread
        plan.unit_heads_per_thread = heads_per_thread
        plan.retune()
    x = to_device(x_host)
    y = to_device(poisoned(x_host.shape, desc.element)) if out is None else out
    pos = None if positions is None else to_device(positions)
    args = RopeBackwardArgs(x, y, pos) if inverse else RopeArgs(x, y, pos)
    plan.run(args)
    return to_host(y)


def check(desc, x_host, positions, inverse=False, force_pairs=False, heads_per_thread=None,
          units16=None, path=None):
    element = desc.element
    rotary = desc.head_dim if desc.rotary_dim is None else desc.rotary_dim
    got = from_storage(run_plan(desc, x_host, positions, inverse, force_pairs,
                                heads_per_thread=heads_per_thread, units16=units16, path=path),
                       element)
    x64 = from_storage(x_host, element)
    y64, max_theta = rope_reference(x64, positions, desc.base, rotary, desc.pairing, inverse,
                                    element)
    rtol, atol = tolerance(element, x64, max_theta)
    assert_close(got, expected_storage_values(y64, element), rtol, atol,
                 f"{element.name} {desc.pairing.name} R={rotary} inverse={inverse}")


def make_positions(kind, shape, rng, high=4096):
    batch, _, seq, _ = shape
    if kind == "none":
        return None
    if kind == "shared":
        return rng.integers(0, high, size=seq).astype(np.int64)
    return rng.integers(0, high, size=(batch, seq)).astype(np.int64)


# -- values ---------------------------------------------------------------------------------


@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("positions", ["none", "shared", "per_sequence"])
@pytest.mark.parametrize("rotary_dim", [None, 8, 6], ids=["full", "R8", "R6"])
def test_matches_reference(rng, element, pairing, inverse, positions, rotary_dim):
    desc = RopeDescriptor(*SHAPE, element=element, pairing=pairing, rotary_dim=rotary_dim,
                          base=10000.0 if rotary_dim != 6 else 500.0)
    check(desc, random_values(SHAPE, element, rng), make_positions(positions, SHAPE, rng),
          inverse)


@pytest.mark.parametrize("element", [F16, BF16, F32], ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
@pytest.mark.parametrize("heads_per_thread", [1, 2, 3, 16])
@pytest.mark.parametrize("shape", [SHAPE, SHAPE16], ids=["D12", "D24"])
def test_several_heads_per_thread(rng, element, pairing, heads_per_thread, shape):
    """Large shapes walk up to 16 heads per thread in batches, small ones 4 (or all their
    heads); the last batch may be partial: every split must give the same rotation. (The
    16-byte unit kernel: full batches of 4 or 2 heads, then single heads; one head per
    thread loads before computing the angles.)"""
    desc = RopeDescriptor(*shape, element=element, pairing=pairing, rotary_dim=8
                          if shape is SHAPE else 16)
    x = random_values(shape, element, rng)
    check(desc, x, make_positions("per_sequence", shape, rng), heads_per_thread=heads_per_thread)


def test_heads_per_thread_follows_problem_size():
    """Decode-sized problems spread heads over threads; large ones amortise sincos."""
    decode = RopePlan.select(RopeDescriptor(64, 32, 1, 128, element=F16))
    prefill = RopePlan.select(RopeDescriptor(8, 32, 2048, 128, element=F16))
    assert decode.heads_per_thread == 4
    assert prefill.heads_per_thread == 16


@pytest.mark.parametrize("element", [F16, BF16, F32], ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
def test_element_path_matches_unit_path(rng, element, pairing):
    desc = RopeDescriptor(*SHAPE, element=element, pairing=pairing)
    x = random_values(SHAPE, element, rng)
    positions = make_positions("per_sequence", SHAPE, rng)
    units = run_plan(desc, x, positions)
    pairs = run_plan(desc, x, positions, force_pairs=True)
    np.testing.assert_array_equal(units.view(np.uint8), pairs.view(np.uint8))


@pytest.mark.parametrize("element", [F16, BF16, F32], ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
@pytest.mark.parametrize("rotary_dim", [None, 16], ids=["full", "R16"])
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "backward"])
def test_16_byte_units_match_the_other_paths(rng, element, pairing, rotary_dim, inverse):
    """The 16-byte unit kernel, the 8-byte (or 4-byte) unit kernels and the element path
    give the same bits (D = 32: 16-byte units tile R = 16, its half and the copied tail),
    and they match the reference."""
    desc = RopeDescriptor(*SHAPE16, element=element, pairing=pairing, rotary_dim=rotary_dim)
    x = random_values(SHAPE16, element, rng)
    positions = make_positions("per_sequence", SHAPE16, rng, high=1_000_001)
    plan = RopePlan.select(desc)
    plan.units16 = True
    view = as_mut(to_device(x), "test", "x")
    assert plan._layout(view, view)[0].endswith("_16B")
    wide = run_plan(desc, x, positions, inverse, units16=True)
    narrow = run_plan(desc, x, positions, inverse, units16=False)
    pairs = run_plan(desc, x, positions, inverse, force_pairs=True)
    np.testing.assert_array_equal(wide.view(np.uint8), narrow.view(np.uint8))
    np.testing.assert_array_equal(wide.view(np.uint8), pairs.view(np.uint8))
    check(desc, x, positions, inverse, units16=True)


@pytest.mark.parametrize("element", [F16, BF16, F32], ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
@pytest.mark.parametrize("rotary_dim", [None, 16], ids=["full", "R16"])
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "backward"])
def test_table_and_tile_match_the_other_paths(rng, element, pairing, rotary_dim, inverse):
    """rope_table (the plan's cos/sin table, positions absent) and rope_tile (angles shared
    through shared memory; positions absent or per sequence) give the bits of the rows
    kernels and the element path, and match the reference."""
    desc = RopeDescriptor(*SHAPE16, element=element, pairing=pairing, rotary_dim=rotary_dim)
    x = random_values(SHAPE16, element, rng)
    for positions in (None, make_positions("per_sequence", SHAPE16, rng, high=1_000_001)):
        paths = ("tile", "rows") if positions is not None else ("table", "table_planes",
                                                                   "tile", "rows")
        pairs = run_plan(desc, x, positions, inverse, force_pairs=True)
        for path in paths:
            got = run_plan(desc, x, positions, inverse, path=path)
            np.testing.assert_array_equal(got.view(np.uint8), pairs.view(np.uint8),
                                          err_msg=f"{path}, positions: {positions is not None}")
        check(desc, x, positions, inverse, path=paths[0])


@pytest.mark.parametrize("element", [F16, BF16, F32], ids=lambda e: e.name)
@pytest.mark.parametrize("dim, rotary_dim, seq", [(48, None, 5), (48, 16, 5), (32, None, 4)],
                         ids=["D48", "D48_R16", "D32_S4"])
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "backward"])
def test_flat_table_kernel(rng, element, dim, rotary_dim, seq, inverse):
    """rope_flat (the angle table over compact interleaved x and y, a unit of each of 2
    (b, h) planes per thread, rows and planes of a power of two of units or not) and its
    variants with 1 and 4 planes a thread (6 planes: whole groups, and a partial last
    group for 4) give the bits of rope_table and of the element path, out of place and in
    place (a partial rotary dim's tail left as it is), and match the reference."""
    shape = (2, 3, seq, dim) if SIMULATOR else (3, 2, 8 * seq + 1 if seq == 5 else 8 * seq, dim)
    desc = RopeDescriptor(*shape, element=element, rotary_dim=rotary_dim)
    x = random_values(shape, element, rng)
    expected = run_plan(desc, x, None, inverse, force_pairs=True)
    for path in ("table", "table_planes", "flat1", "flat4"):
        got = run_plan(desc, x, None, inverse, path=path)
        np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8), path)
    plan = (RopeBackwardPlan.select(RopeBackwardDescriptor.of(desc)) if inverse
            else RopePlan.select(desc))
    for planes in (None, 1, 4):
        plan.flat_planes_per_thread = planes
        plan.retune()
        x_dev = to_device(x)
        view = as_mut(x_dev, "test", "x")
        assert plan._kernel_path(view, view, None) == "table" and plan._flat_fits(view, view)
        plan.run(RopeBackwardArgs(x_dev, x_dev) if inverse else RopeArgs(x_dev, x_dev))
        np.testing.assert_array_equal(to_host(x_dev).view(np.uint8),
                                      expected.view(np.uint8), f"in place, planes {planes}")
    check(desc, x, None, inverse, path="table")


def test_flat_table_kernel_choice(monkeypatch):
    """rope_flat only for interleaved x and y that are both compact, fewer than 2^32 units
    and a grid that covers them (with 1, 2 or 4 planes a thread); ``table_flat = False``
    keeps rope_table."""
    from baracuda_numba.plans import rope as rope_plans

    shape = (2, 3, 4, 64)
    padded = (3 * 4 * 72, 4 * 72, 72, 1)

    def fits(pairing=INTERLEAVED, x_strides=None, y_strides=None, dims=shape, **attrs):
        plan = RopePlan.select(RopeDescriptor(*dims, element=F32, pairing=pairing))
        for name, value in attrs.items():
            setattr(plan, name, value)
        x = TensorMut(0x10000, dims, x_strides or contiguous_strides(dims), "<f4", 4, None)
        y = TensorMut(0x100000, dims, y_strides or contiguous_strides(dims), "<f4", 4, None)
        return plan._flat_fits(x, y)

    assert fits()
    assert not fits(HALF_SPLIT)
    assert not fits(x_strides=padded)
    assert not fits(y_strides=padded)
    assert not fits(table_flat=False)
    assert fits(dims=(3, 1, 1 << 17, 1 << 15))  # 3 * 2^30 units
    assert not fits(dims=(4, 1, 1 << 17, 1 << 15))  # 2^32 units
    # 4 planes a thread: 2^30 threads over 3 * 2^30 units; 5 * 2^30 units do not fit
    assert fits(dims=(3, 1, 1 << 17, 1 << 15), flat_planes_per_thread=4)
    assert not fits(dims=(5, 1, 1 << 17, 1 << 15), flat_planes_per_thread=4)
    block = rope_plans._FLAT_BLOCK[4]
    for planes in (1, 2, 4):  # 6 planes of 64 units, ceil(6 / planes) groups of them
        threads = -(-6 // planes) * 64
        monkeypatch.setattr(rope_plans, "_GRID_X_LIMIT", -(-threads // block))
        assert fits(flat_planes_per_thread=planes), planes
        monkeypatch.setattr(rope_plans, "_GRID_X_LIMIT", -(-threads // block) - 1)
        assert not fits(flat_planes_per_thread=planes), planes


@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
def test_tile_with_a_partial_last_head_group(rng, pairing, in_place):
    """rope_tile with 2 heads a block over an odd number of heads (5 in the simulator, 13
    on the GPU): the last block's second row of threads has no head (it loads the last
    head again and stores nothing); the bits are the element path's, and in place as
    well."""
    desc = RopeDescriptor(*SHAPE16, element=F16, pairing=pairing, rotary_dim=16)
    x = random_values(SHAPE16, F16, rng)
    positions = make_positions("per_sequence", SHAPE16, rng)
    expected = run_plan(desc, x, positions, force_pairs=True)
    plan = RopePlan.select(desc)
    plan.angle_table, plan.tile, plan.tile_heads_per_block = False, True, 2
    plan.retune()
    x_dev = to_device(x)
    pos = to_device(positions)
    view = as_mut(x_dev, "test", "x")
    assert plan._kernel_path(view, view, pos) == "tile"
    assert plan._tile_heads_per_block(plan._unit_items(view, view)[3]) == 2
    assert SHAPE16[1] % 2 == 1  # a partial last head group
    y_dev = x_dev if in_place else to_device(poisoned(SHAPE16, F16))
    plan.run(RopeArgs(x_dev, y_dev, pos))
    np.testing.assert_array_equal(to_host(y_dev).view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
@pytest.mark.parametrize("positions_kind", ["none", "per_sequence"])
def test_tile_with_more_pairs_than_threads(rng, pairing, positions_kind):
    """rope_tile with one head a block: fewer threads than pairs (D = 32 f16: 16 pairs for
    4 interleaved / 2 half-split items), so threads compute several pairs' angles, with
    positions and without (pos = s). Bits equal the element path's, and x is unchanged."""
    shape = (SHAPE16[0], 2, SHAPE16[2], 32)
    desc = RopeDescriptor(*shape, element=F16, pairing=pairing)
    x = random_values(shape, F16, rng)
    positions = make_positions(positions_kind, shape, rng, high=1_000_000)
    expected = run_plan(desc, x, positions, force_pairs=True)
    plan = RopePlan.select(desc)
    plan.angle_table, plan.tile, plan.tile_heads_per_block = False, True, 1
    plan.retune()
    x_dev = to_device(x)
    pos = None if positions is None else to_device(positions)
    view = as_mut(x_dev, "test", "x")
    assert plan._kernel_path(view, view, pos) == "tile"
    assert plan._tile_heads_per_block(plan._unit_items(view, view)[3]) == 1
    y_dev = to_device(poisoned(shape, F16))
    plan.run(RopeArgs(x_dev, y_dev, pos))
    np.testing.assert_array_equal(to_host(y_dev).view(np.uint8), expected.view(np.uint8))
    np.testing.assert_array_equal(to_host(x_dev).view(np.uint8), x.view(np.uint8))


@pytest.mark.parametrize("element", [F16, F32], ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
@pytest.mark.parametrize("path", ["units", "table", "tile"])
def test_16_byte_kernels_in_place_and_strided(rng, element, pairing, path):
    """rope_units, rope_table and rope_tile in place on q/k views of a fused
    [B, S, 3, H, D] tensor (outer strides in 16-byte units), v untouched; and out of place
    into padded strides."""
    batch, heads, seq, dim = SHAPE16
    fused = random_values((batch, seq, 3, heads, dim), element, rng)
    device = to_device(fused.reshape(-1))
    strides = (seq * 3 * heads * dim, dim, 3 * heads * dim, 1)
    positions = None if path == "table" else make_positions("per_sequence", SHAPE16, rng)
    pos = None if positions is None else to_device(positions)
    desc = RopeDescriptor(*SHAPE16, element=element, pairing=pairing, rotary_dim=16)
    plan = RopePlan.select(desc)
    if path == "units":
        plan.units16 = True
    for name, value in PATHS["rows" if path == "units" else path].items():
        setattr(plan, name, value)

    def takes_path(x_view, y_view):
        if path == "units":
            return plan._layout(x_view, y_view)[0].endswith("_16B")
        return plan._kernel_path(x_view, y_view, pos) == path

    for which in (0, 1):
        view = _view(device, which * heads * dim, SHAPE16, strides)
        assert takes_path(view, view)
        plan.run(RopeArgs(view, view, pos))
    got = from_storage(to_host(device).reshape(fused.shape), element)
    fused64 = from_storage(fused, element)
    for which in (0, 1):
        x64 = fused64[:, :, which].transpose(0, 2, 1, 3)
        y64, theta = rope_reference(x64, positions, 10000.0, 16, pairing, False, element)
        rtol, atol = tolerance(element, x64, theta)
        assert_close(got[:, :, which].transpose(0, 2, 1, 3),
                     expected_storage_values(y64, element), rtol, atol, f"qkv[{which}]")
    np.testing.assert_array_equal(got[:, :, 2], fused64[:, :, 2])
    # out of place: y with 8 elements of padding per row
    x_host = random_values(SHAPE16, element, rng)
    y_strides = (heads * seq * (dim + 8), dim + 8, heads * (dim + 8), 1)
    y_dev = to_device(poisoned((batch * seq * heads * (dim + 8),), element))
    y_view = _view(y_dev, 0, SHAPE16, y_strides)
    x_view = as_mut(to_device(x_host), "test", "x")
    assert takes_path(x_view, y_view)
    plan.run(RopeArgs(x_view, y_view, pos))
    y_all = to_host(y_dev)
    got = np.lib.stride_tricks.as_strided(
        y_all, SHAPE16, tuple(s * y_all.itemsize for s in y_strides))
    x64 = from_storage(x_host, element)
    y64, theta = rope_reference(x64, positions, 10000.0, 16, pairing, False, element)
    rtol, atol = tolerance(element, x64, theta)
    assert_close(from_storage(got, element), expected_storage_values(y64, element), rtol, atol,
                 "strided")
    padding = y_all.reshape(batch, seq, heads, dim + 8)[..., dim:]
    assert np.isnan(from_storage(padding, element)).all(), "padding was written"


@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
@pytest.mark.parametrize("limits", [(1, 1), (2, 3)], ids=["one_block", "two_blocks"])
def test_table_grid_stride_loops_and_tile_fallback(rng, monkeypatch, pairing, limits):
    """Grids capped below the problem (CUDA's limits on huge problems): the table kernel's
    blocks walk several planes; the tile kernel (one tile per block) is not taken, and the
    rows kernels it falls back to give the same bits."""
    from baracuda_numba.plans import rope as rope_plans

    monkeypatch.setattr(rope_plans, "_GRID_X_LIMIT", limits[0])
    monkeypatch.setattr(rope_plans, "_GRID_YZ_LIMIT", limits[1])
    desc = RopeDescriptor(*SHAPE16, element=F32, pairing=pairing, rotary_dim=16)
    plan = RopePlan.select(desc)
    plan.tile = True
    view = TensorMut(0x10000, SHAPE16, contiguous_strides(SHAPE16), "<f4", 4, None)
    assert plan._kernel_path(view, view, object()) == "rows"
    x = random_values(SHAPE16, F32, rng)
    positions = make_positions("per_sequence", SHAPE16, rng)
    expected = run_plan(desc, x, positions, force_pairs=True)
    np.testing.assert_array_equal(run_plan(desc, x, positions, path="tile"), expected)
    expected = run_plan(desc, x, None, force_pairs=True)
    for path in ("table", "tile"):
        np.testing.assert_array_equal(run_plan(desc, x, None, path=path), expected, path)


def test_kernel_path_choice():
    """The table without positions (f16/bf16/f32, up to 4 MB of table and the workspace
    preference); the tile for small problems; the rows kernels otherwise (f64, misaligned
    views, large problems with positions)."""
    def path(shape, element, positions=True, offset=0, pref=None, rotary_dim=None, **attrs):
        plan = RopePlan.select(RopeDescriptor(*shape, element=element, rotary_dim=rotary_dim),
                               pref)
        for name, value in attrs.items():
            setattr(plan, name, value)
        view = TensorMut(0x10000 + offset * element.byte_width, shape,
                         contiguous_strides(shape), "<f2", element.byte_width, None)
        return plan._kernel_path(view, view, object() if positions else None)

    large, decode = (8, 32, 2048, 128), (64, 32, 1, 128)
    for element in (F16, BF16, F32):
        assert path(large, element, positions=False) == "table"
        assert path(decode, element, positions=False) == "table"
        assert path(decode, element) == "tile"
        assert path(large, element) == "rows"
        assert path(decode, element, offset=2) == "rows"  # 16-byte units do not fit
    assert path(large, F64, positions=False) == "rows"
    assert path(decode, F64) == "rows"
    long_table = (1, 1, 32769, 128)  # 32769 * 64 pairs * 8 bytes > 4 MB
    assert path(long_table, F32, positions=False) == "rows"
    assert path(long_table, F32, positions=False, angle_table=True) == "table"
    assert path(large, F32, positions=False, pref=PlanPreference(max_workspace_bytes=4096)) \
        == "rows"
    assert path(large, F32, positions=False, angle_table=False) == "rows"
    assert path(large, F32, tile=True) == "tile"
    assert path(decode, F32, tile=False) == "rows"
    assert path(decode, F32, rotary_dim=0, positions=False) == "rows"  # nothing to rotate
    # the tile's 32-bit unit offsets: a view spanning 2^31 units or more takes the rows
    plan = RopePlan.select(RopeDescriptor(*decode, element=F32))
    widest = 4 * (((1 << 31) - 1 - 32 * 32) // 63)  # a batch stride spanning 2^31 - 1 units
    for batch_stride, expected in ((widest, "tile"), (widest + 4, "rows")):
        strides = (batch_stride, 128, 128, 1)
        view = TensorMut(0x10000, decode, strides, "<f4", 4, None)
        span_units = (63 * batch_stride + 31 * 128 + 128) // 4
        assert (span_units < 1 << 31) == (expected == "tile")
        assert plan._kernel_path(view, view, object()) == expected


def test_angle_table_is_built_once():
    """The table is built at the first run that takes it and kept (retune included)."""
    shape = (1, 2, 3, 8)
    plan = RopePlan.select(RopeDescriptor(*shape, element=F32))
    assert plan._table is None
    x = to_device(np.ones(shape, dtype=np.float32))
    plan.run(RopeArgs(x, x))
    table = plan._table
    assert table is not None and table.shape == (2 * 3 * 4,)
    plan.retune()
    plan.run(RopeArgs(x, x))
    assert plan._table is table
    cos_sin = to_host(table).reshape(3, 4, 2)
    theta = np.arange(3)[:, None].astype(np.float32) * (
        10000.0 ** (-(2.0 * np.arange(4)) / 8)).astype(np.float32)
    np.testing.assert_allclose(cos_sin[..., 0], np.cos(theta.astype(np.float64)), atol=2e-7)
    np.testing.assert_allclose(cos_sin[..., 1], np.sin(theta.astype(np.float64)), atol=2e-7)


def test_16_byte_units_choice():
    """f32 always; f16/bf16 only for small interleaved problems (decode), unless forced;
    16-byte alignment, and strides and dims in whole units, are required."""
    def layout(shape, element, offset=0, units16=None, rotary_dim=None, pairing=INTERLEAVED):
        plan = RopePlan.select(RopeDescriptor(*shape, element=element, rotary_dim=rotary_dim,
                                              pairing=pairing))
        plan.units16 = units16
        view = TensorMut(0x10000 + offset * element.byte_width, shape,
                         contiguous_strides(shape), "<f2", element.byte_width, None)
        return plan._layout(view, view)[0]

    assert layout((64, 32, 1, 128), F16) == "interleaved_16B"
    assert layout((64, 32, 1, 128), F16, pairing=HALF_SPLIT) == "half_split4"
    assert layout((64, 32, 1, 128), F32, pairing=HALF_SPLIT) == "half_split_16B"
    assert layout((8, 32, 2048, 128), F16) == "interleaved4"
    assert layout((8, 32, 2048, 128), F16, units16=True) == "interleaved_16B"
    assert layout((8, 32, 2048, 128), F32) == "interleaved_16B"
    assert layout((8, 32, 2048, 128), F32, units16=False) == "interleaved"
    assert layout((64, 32, 1, 128), F16, offset=4) == "interleaved4"  # 8-byte aligned
    assert layout((64, 32, 1, 12), F32, rotary_dim=8) == "interleaved_16B"
    assert layout((64, 32, 1, 12), F16, rotary_dim=8) == "interleaved4"  # 12 % 8 != 0


@pytest.mark.parametrize("pairing, rotary_dim, offset, layout_f16, layout_f32", [
    (INTERLEAVED, None, 0, "interleaved4", "interleaved_16B"),
    (INTERLEAVED, 6, 0, "interleaved", "interleaved"),
    (INTERLEAVED, 8, 2, "interleaved", "interleaved"),
    (INTERLEAVED, 8, 1, "pairs", "pairs"),
    (HALF_SPLIT, 8, 0, "half_split4", "half_split_16B"),
    (HALF_SPLIT, 12, 0, "half_split", "half_split"),
    (HALF_SPLIT, 6, 0, "pairs", "pairs"),
])
def test_layout_choice(pairing, rotary_dim, offset, layout_f16, layout_f32):
    """The widest unit the rotary dim, the pointers and the strides allow (so the tests
    above cover every layout: D = 12 with R = 12, 8, 6)."""
    shape = (2, 5, 3, 12)
    for element, want in ((F16, layout_f16), (F32, layout_f32)):
        plan = RopePlan.select(RopeDescriptor(*shape, element=element, pairing=pairing,
                                              rotary_dim=rotary_dim))
        base = to_device(np.zeros(2 * 5 * 3 * 12 + 4, dtype=element.storage_dtype))
        view = _view(base, offset, shape, contiguous_strides(shape))
        assert plan._layout(view, view) == (want, {"pairs": 1, "interleaved": 2,
                                                   "half_split": 2}.get(want, 4))


@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
def test_large_positions(rng, element, pairing):
    """Positions up to 10^6: accurate sincos keeps the error at the usual tolerance."""
    desc = RopeDescriptor(*SHAPE, element=element, pairing=pairing)
    positions = make_positions("per_sequence", SHAPE, rng, high=1_000_001)
    positions[0, 0] = 1_000_000
    check(desc, random_values(SHAPE, element, rng), positions)


@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
def test_backward_inverts_forward(rng, element, pairing):
    desc = RopeDescriptor(*SHAPE, element=element, pairing=pairing, rotary_dim=8)
    x = random_values(SHAPE, element, rng)
    positions = make_positions("shared", SHAPE, rng)
    y = run_plan(desc, x, positions)
    back = from_storage(run_plan(desc, y, positions, inverse=True), element)
    rtol, atol = TOLERANCE[element]
    # two roundings to the storage type, each relative to the pair norm (<= 2 * 2)
    assert_close(back, from_storage(x, element), 2 * rtol, 2 * atol * 4, "round trip")


# The simulator computes with NumPy scalars, which warn on inf·0 and inf − inf (the GPU
# just produces the IEEE NaN, which is what the test checks).
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
def test_nan_and_inf(rng, element, pairing):
    """NaN and ±inf go through the formula (NaN spreads to the partner; inf·0 = NaN at
    θ = 0); copied features keep their bits."""
    desc = RopeDescriptor(*SHAPE, element=element, pairing=pairing, rotary_dim=8)
    x64 = from_storage(random_values(SHAPE, element, rng), element)
    x64[0, 0, 0, 0] = np.nan
    x64[0, 1, 0, 3] = np.inf
    x64[1, 0, 1, 2] = -np.inf
    x64[1, 1, 2, 5] = np.inf
    x64[1, 2, 2, 4] = -np.inf
    x64[0, 2, 1, 10] = np.nan  # copied tail
    x64[1, 3, 0, 11] = -np.inf
    x = to_storage(x64, element)
    check(desc, x, make_positions("none", SHAPE, rng))
    check(desc, x, make_positions("shared", SHAPE, rng), inverse=True)


@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("force_pairs", [False, True], ids=["units", "pairs"])
def test_identity_at_position_zero_keeps_bits(rng, element, force_pairs):
    """θ = 0 for every pair: finite values come back bit for bit (the f16/bf16 unpack and
    pack round-trip exactly, subnormals included), except that -0 may become +0."""
    shape = (1, 2, 2, 8)
    x64 = from_storage(random_values(shape, element, rng), element)
    tiny = {F16: 2.0 ** -24, BF16: 2.0 ** -133, F32: 2.0 ** -149, F64: 2.0 ** -1074}[element]
    x64[0, 0, 0, :4] = [tiny, -3 * tiny, 1023 * tiny, 0.0]
    x = to_storage(x64, element)
    desc = RopeDescriptor(*shape, element=element, pairing=INTERLEAVED)
    got = run_plan(desc, x, np.zeros(2, dtype=np.int64), force_pairs=force_pairs)
    np.testing.assert_array_equal(from_storage(got, element), from_storage(x, element))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf·0
@pytest.mark.parametrize("force_pairs", [False, True], ids=["units", "pairs"])
def test_every_f16_bit_pattern_survives_the_identity(force_pairs):
    """θ = 0 on pairs (v, 0): y[2i] = fma(v, 1, -0) = v for every f16 bit pattern (every
    pattern on a GPU, a spread sample in the simulator): the unit path's bit reinterpretation
    and the hardware conversions lose nothing (subnormals, ±inf; NaN stays NaN)."""
    patterns = np.arange(1 << 16, dtype=np.uint32)
    if SIMULATOR:
        patterns = np.unique(np.concatenate([patterns[::997], [0, 1, 0x3FF, 0x400, 0x7BFF,
                                                              0x7C00, 0x7C01, 0x7E00, 0x8000,
                                                              0x8001, 0xFBFF, 0xFC00]]))
    values = patterns.astype(np.uint16).view(np.float16)
    count = len(values)
    x = np.zeros((1, 1, count, 2), dtype=np.float16)
    x[0, 0, :, 0] = values
    desc = RopeDescriptor(1, 1, count, 2, element=F16)
    got = run_plan(desc, x, np.zeros(count, dtype=np.int64), force_pairs=force_pairs)
    first = got[0, 0, :, 0]
    nan = np.isnan(values)
    np.testing.assert_array_equal(first[~nan].view(np.uint16), values[~nan].view(np.uint16))
    assert np.isnan(first[nan]).all()


# -- layouts: strided q/k views, in place, misaligned -------------------------------------


def _view(base_device, offset, shape, strides, cls=TensorMut):
    """A [B, H, S, D] view into a flat device buffer (framework-neutral)."""
    whole = as_mut(base_device, "test", "base")
    return cls(whole.ptr + offset * whole.itemsize, shape, strides, whole.typestr,
               whole.itemsize, base_device)


@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
def test_qkv_views_in_place(rng, element, pairing):
    """q and k sliced out of one [B, S, 3, H, D] tensor, rotated in place; v untouched."""
    batch, heads, seq, dim = SHAPE
    fused = random_values((batch, seq, 3, heads, dim), element, rng)
    device = to_device(fused.reshape(-1))
    strides = (seq * 3 * heads * dim, dim, 3 * heads * dim, 1)  # [B, H, S, D] order
    positions = make_positions("per_sequence", SHAPE, rng)
    desc = RopeDescriptor(*SHAPE, element=element, pairing=pairing, rotary_dim=8)
    plan = RopePlan.select(desc)
    for which in (0, 1):
        view = _view(device, which * heads * dim, SHAPE, strides)
        plan.run(RopeArgs(view, view, to_device(positions)))
    got = from_storage(to_host(device).reshape(fused.shape), element)
    fused64 = from_storage(fused, element)
    for which in (0, 1):
        x64 = fused64[:, :, which].transpose(0, 2, 1, 3)
        y64, theta = rope_reference(x64, positions, 10000.0, 8, pairing, False, element)
        rtol, atol = tolerance(element, x64, theta)
        assert_close(got[:, :, which].transpose(0, 2, 1, 3),
                     expected_storage_values(y64, element), rtol, atol, f"qkv[{which}]")
    np.testing.assert_array_equal(got[:, :, 2], fused64[:, :, 2])


@pytest.mark.parametrize("element", [F16, F32], ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
def test_strided_out_of_place_and_misaligned(rng, element, pairing):
    """Output with padded strides, input at an odd element offset (element path)."""
    batch, heads, seq, dim = SHAPE
    x_host = random_values(SHAPE, element, rng)
    x_base = np.concatenate([random_values((1,), element, rng), x_host.reshape(-1)])
    x_dev = to_device(x_base)
    x_view = _view(x_dev, 1, SHAPE, (heads * seq * dim, seq * dim, dim, 1))
    y_strides = (heads * seq * (dim + 4), dim + 4, heads * (dim + 4), 1)
    y_dev = to_device(poisoned((batch * seq * heads * (dim + 4),), element))
    y_view = _view(y_dev, 0, SHAPE, y_strides)
    positions = make_positions("shared", SHAPE, rng)
    desc = RopeDescriptor(*SHAPE, element=element, pairing=pairing, rotary_dim=8)
    RopePlan.select(desc).run(RopeArgs(x_view, y_view, to_device(positions)))
    y_all = to_host(y_dev)
    got = np.lib.stride_tricks.as_strided(
        y_all, SHAPE, tuple(s * y_all.itemsize for s in y_strides))
    x64 = from_storage(x_host, element)
    y64, theta = rope_reference(x64, positions, 10000.0, 8, pairing, False, element)
    rtol, atol = tolerance(element, x64, theta)
    assert_close(from_storage(got, element), expected_storage_values(y64, element), rtol, atol,
                 "strided")
    padding = y_all.reshape(batch, seq, heads, dim + 4)[..., dim:]
    assert np.isnan(from_storage(padding, element)).all(), "padding was written"


@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("force_pairs", [False, True], ids=["units", "pairs"])
def test_in_place_contiguous(rng, element, force_pairs):
    x_host = random_values(SHAPE, element, rng)
    device = to_device(x_host)
    desc = RopeDescriptor(*SHAPE, element=element, pairing=HALF_SPLIT, rotary_dim=8)
    plan = RopeBackwardPlan.select(RopeBackwardDescriptor.of(desc), forward=desc)
    plan.force_pairs = force_pairs
    plan.run(RopeBackwardArgs(device, device))
    x64 = from_storage(x_host, element)
    y64, theta = rope_reference(x64, None, 10000.0, 8, HALF_SPLIT, True, element)
    rtol, atol = tolerance(element, x64, theta)
    assert_close(from_storage(to_host(device), element), expected_storage_values(y64, element),
                 rtol, atol, "in place")


@pytest.mark.parametrize("shape", [(0, 2, 3, 8), (2, 0, 3, 8), (2, 2, 0, 8), (2, 2, 3, 0)])
def test_empty_is_a_no_op(shape):
    desc = RopeDescriptor(*shape, element=F32)
    # (an empty simulator array reports strides of 0, which as_mut takes for self-overlap;
    # a view with dense strides over a small poisoned buffer stands in for it)
    buffer = to_device(poisoned((4,), F32))
    dense = contiguous_strides(shape)
    RopePlan.select(desc).run(RopeArgs(to_device(np.ones(shape, np.float32)),
                                       _view(buffer, 0, shape, dense)))
    assert np.isnan(to_host(buffer)).all()


def test_sku_and_guarantee():
    plan = RopePlan.select(RopeDescriptor(1, 1, 1, 2, element=BF16, pairing=HALF_SPLIT))
    assert plan.sku.category is OpCategory.ATTENTION
    assert plan.sku.op == AttentionKind.ROPE
    assert plan.sku.layout == "half_split"
    assert plan.precision_guarantee.deterministic
    assert plan.precision_guarantee.accumulator is F32
    assert RopePlan.select(RopeDescriptor(1, 1, 1, 2, element=F64)).sku.precision_guarantee \
        .accumulator is F64
    assert plan.workspace_size == 0
    assert {e for e, _ in ROPE_KERNELS} == set(FLOAT_ELEMENTS)


# -- rejections: raised before anything is written ----------------------------------------


@pytest.mark.parametrize("kwargs, exc, text", [
    (dict(head_dim=7), InvalidProblem, "head_dim"),
    (dict(base=0.0), InvalidProblem, "base"),
    (dict(base=-2.0), InvalidProblem, "base"),
    (dict(base=float("inf")), InvalidProblem, "base"),
    (dict(base=float("nan")), InvalidProblem, "base"),
    (dict(rotary_dim=5), InvalidProblem, "rotary_dim"),
    (dict(rotary_dim=10), InvalidProblem, "rotary_dim"),
    (dict(rotary_dim=-2), InvalidProblem, "rotary_dim"),
    (dict(batch_size=-1), InvalidProblem, "batch_size"),
    (dict(element=ElementKind.I32), Unsupported, "element"),
    (dict(pairing="interleaved"), InvalidProblem, "pairing"),
])
def test_descriptor_rejections(kwargs, exc, text):
    fields = dict(batch_size=1, num_heads=2, seq_len=3, head_dim=8, element=F32)
    fields.update(kwargs)
    prefix = "" if text == "element" else "desc."
    with pytest.raises(exc, match=f"RopePlan: {prefix}{text}"):
        RopePlan.select(RopeDescriptor(**fields))
    with pytest.raises(exc, match=f"RopeBackwardPlan: {prefix}{text}"):
        RopeBackwardPlan.select(RopeBackwardDescriptor(**fields))


@pytest.mark.parametrize("field, value", [("base", 500.0), ("pairing", HALF_SPLIT),
                                          ("rotary_dim", 4), ("seq_len", 4)])
def test_backward_descriptor_must_match_forward(field, value):
    forward = RopeDescriptor(1, 2, 3, 8, element=F32)
    fields = dict(batch_size=1, num_heads=2, seq_len=3, head_dim=8, element=F32)
    fields[field] = value
    with pytest.raises(InvalidProblem, match=f"RopeBackwardPlan: desc.{field}"):
        RopeBackwardPlan.select(RopeBackwardDescriptor(**fields), forward=forward)
    RopeBackwardPlan.select(RopeBackwardDescriptor.of(forward), forward=forward)


def _rejects(args_builder, exc, text, inverse=False):
    shape = (2, 2, 3, 8)
    desc = RopeDescriptor(*shape, element=F32)
    plan = RopeBackwardPlan.select(RopeBackwardDescriptor.of(desc)) if inverse \
        else RopePlan.select(desc)
    y = to_device(poisoned(shape, F32))
    x = to_device(np.ones(shape, np.float32))
    with pytest.raises(exc, match=text):
        plan.run(args_builder(x, y))
    assert np.isnan(to_host(y)).all(), "the output was written before the rejection"


def test_rejects_wrong_positions_shape_and_dtype():
    bad = [np.zeros(4, np.int64), np.zeros((2, 4), np.int64), np.zeros((1, 3), np.int64),
           np.zeros((2, 3, 1), np.int64)]
    for positions in bad:
        _rejects(lambda x, y, p=positions: RopeArgs(x, y, to_device(p)), InvalidProblem,
                 "RopePlan: positions has shape")
    _rejects(lambda x, y: RopeArgs(x, y, to_device(np.zeros(3, np.int32))), InvalidProblem,
             "RopePlan: positions has typestr")
    _rejects(lambda x, y: RopeBackwardArgs(x, y, to_device(np.zeros(3, np.float64))),
             InvalidProblem, "RopeBackwardPlan: positions has typestr", inverse=True)


def test_rejects_shape_rank_and_dtype_mismatch():
    _rejects(lambda x, y: RopeArgs(to_device(np.ones((2, 2, 3, 6), np.float32)), y),
             InvalidProblem, "RopePlan: x has shape")
    _rejects(lambda x, y: RopeArgs(to_device(np.ones((2, 2, 3, 8, 1), np.float32)), y),
             InvalidProblem, "RopePlan: x has shape")
    _rejects(lambda x, y: RopeArgs(to_device(np.ones((6, 8), np.float32)), y),
             InvalidProblem, "RopePlan: x has shape")
    _rejects(lambda x, y: RopeArgs(to_device(np.ones((2, 2, 3, 8), np.float64)), y),
             InvalidProblem, "RopePlan: x has typestr")
    _rejects(lambda x, y: RopeBackwardArgs(x, to_device(np.ones((2, 2, 3, 4), np.float32))),
             InvalidProblem, "RopeBackwardPlan: dx has shape", inverse=True)


def test_rejects_innermost_stride_and_partial_overlap():
    shape = (2, 2, 3, 8)
    strides = (2 * 3 * 16, 3 * 16, 16, 2)  # every other element of a (2, 2, 3, 16) buffer
    base = to_device(np.ones(2 * 2 * 3 * 16, np.float32))
    _rejects(lambda x, y: RopeArgs(_view(base, 0, shape, strides), y), InvalidProblem,
             r"RopePlan: x.strides\[3\] = 2 must be 1")
    _rejects(lambda x, y: RopeArgs(x, _view(base, 0, shape, strides)), InvalidProblem,
             r"RopePlan: y.strides\[3\] = 2 must be 1")
    flat = to_device(poisoned((2 * 2 * 3 * 8 + 2,), F32))
    contiguous = (2 * 3 * 8, 3 * 8, 8, 1)
    with pytest.raises(InvalidProblem, match="RopePlan: y overlaps x"):
        RopePlan.select(RopeDescriptor(*shape, element=F32)).run(
            RopeArgs(_view(flat, 0, shape, contiguous), _view(flat, 2, shape, contiguous)))
    assert np.isnan(to_host(flat)).all()


def test_rejects_wrong_descriptor_type():
    desc = RopeDescriptor(1, 1, 1, 2, element=F32)
    with pytest.raises(InvalidProblem, match="RopeBackwardPlan: desc is a RopeDescriptor"):
        RopeBackwardPlan.select(desc)
    with pytest.raises(InvalidProblem, match="RopePlan: desc is a RopeBackwardDescriptor"):
        RopePlan.select(RopeBackwardDescriptor.of(desc))


# -- GPU: PyTorch, autograd, torch views, > 2^31 elements --------------------------------


def torch_rope(torch, x, positions, base, rotary_dim, pairing):
    """PyTorch RoPE (f32 math, like HF/NeoX with a correctly rounded inv_freq)."""
    batch, _, seq, _ = x.shape
    pairs = torch.arange(rotary_dim // 2, device=x.device, dtype=torch.float64)
    inv_freq = (base ** (-(2.0 * pairs) / rotary_dim)).float()
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    pos = positions.expand(batch, seq).float()
    theta = pos[:, :, None] * inv_freq  # [B, S, R/2]
    cos, sin = theta.cos()[:, None], theta.sin()[:, None]
    xf = x.float()
    rot, rest = xf[..., :rotary_dim], xf[..., rotary_dim:]
    if pairing is INTERLEAVED:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    else:
        a, b = rot[..., : rotary_dim // 2], rot[..., rotary_dim // 2:]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    return torch.cat([out, rest], dim=-1).to(x.dtype)


TORCH_DTYPES = {F16: "float16", BF16: "bfloat16", F32: "float32"}


@pytest.mark.gpu
@pytest.mark.parametrize("element", [F16, BF16, F32], ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
@pytest.mark.parametrize("rotary_dim", [None, 32], ids=["full", "R32"])
def test_against_torch_and_autograd(element, pairing, rotary_dim):
    torch = torch_or_skip()
    dtype = getattr(torch, TORCH_DTYPES[element])
    shape = (2, 8, 65, 64)
    rotary = rotary_dim or shape[3]
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    positions = torch.randint(0, 100_000, (shape[0], shape[2]), device="cuda")
    desc = RopeDescriptor(*shape, element=element, pairing=pairing, rotary_dim=rotary_dim)
    y = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    RopePlan.select(desc).run(RopeArgs(x, y, positions))
    expected = torch_rope(torch, x, positions, 10000.0, rotary, pairing)
    rtol, atol = TOLERANCE[element]
    scale = float(x.detach().abs().max())
    # torch rounds the rotation once too; both sides differ from exact by one rounding
    torch.testing.assert_close(y.float(), expected.float(), rtol=2 * rtol, atol=2 * atol * scale)
    grad = torch.randn_like(y)
    expected.backward(grad)
    dx = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    RopeBackwardPlan.select(RopeBackwardDescriptor.of(desc), forward=desc).run(
        RopeBackwardArgs(grad, dx, positions), stream=torch.cuda.current_stream())
    torch.testing.assert_close(dx.float(), x.grad.float(), rtol=2 * rtol,
                               atol=2 * atol * float(grad.abs().max()))


@pytest.mark.gpu
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
def test_torch_qkv_views_in_place(pairing):
    torch = torch_or_skip()
    batch, seq, heads, dim = 2, 33, 4, 64
    qkv = torch.randn(batch, seq, 3, heads, dim, device="cuda", dtype=torch.bfloat16)
    original = qkv.clone()
    q = qkv[:, :, 0].transpose(1, 2)  # [B, H, S, D], strides (S*3*H*D, D, 3*H*D, 1)
    k = qkv[:, :, 1].transpose(1, 2)
    positions = torch.arange(seq, device="cuda") + 1000
    plan = RopePlan.select(RopeDescriptor(batch, heads, seq, dim, element=BF16,
                                          pairing=pairing))
    plan.run(RopeArgs(q, q, positions))
    plan.run(RopeArgs(k, k, positions))
    for which in (0, 1):
        x = original[:, :, which].transpose(1, 2)
        expected = torch_rope(torch, x, positions, 10000.0, dim, pairing)
        torch.testing.assert_close(qkv[:, :, which].transpose(1, 2).float(), expected.float(),
                                   rtol=1.6e-2, atol=1.6e-2 * float(x.abs().max()))
    assert torch.equal(qkv[:, :, 2], original[:, :, 2])


@pytest.mark.gpu
def test_direct_and_dispatcher_launches_agree(rng):
    from baracuda_numba.launch import set_launch_mode

    desc = RopeDescriptor(*SHAPE, element=BF16, pairing=HALF_SPLIT, rotary_dim=8)
    x = random_values(SHAPE, BF16, rng)
    positions = make_positions("per_sequence", SHAPE, rng)
    direct = run_plan(desc, x, positions)
    set_launch_mode("dispatcher")
    try:
        dispatched = run_plan(desc, x, positions)
    finally:
        set_launch_mode("direct")
    np.testing.assert_array_equal(direct, dispatched)


@pytest.mark.gpu
def test_more_than_2_31_elements_in_place():
    """2^31 + 2·128 f16 elements rotated in place; spot-check rows at both ends."""
    torch = torch_or_skip()
    dim = 128
    seq = (1 << 31) // dim + 2
    shape = (1, 1, seq, dim)
    x = torch.empty(shape, device="cuda", dtype=torch.float16)
    x.uniform_(-2, 2)
    rows = [0, 1, seq // 2, seq - 2, seq - 1]
    before = x[0, 0, rows].float().cpu().numpy().astype(np.float64)
    desc = RopeDescriptor(*shape, element=F16, pairing=HALF_SPLIT)
    RopePlan.select(desc).run(RopeArgs(x, x))
    after = x[0, 0, rows].float().cpu().numpy().astype(np.float64)
    reference, _ = rope_reference(before[None, None], np.array(rows), 10000.0, dim, HALF_SPLIT,
                                  False, F16)
    rtol, atol = TOLERANCE[F16]
    assert_close(after, expected_storage_values(reference[0, 0], F16), rtol, atol * 2, "2^31")


@pytest.mark.gpu
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
def test_torch_fast_path_repeats_checks_that_depend_on_pointers(pairing):
    """A layout seen before skips the array checks (memo on shape/strides/dtype/alignment),
    but new tensors of that layout are still rotated correctly, aliasing x and y is still
    rejected before any launch, and in place (same pointer) still works."""
    torch = torch_or_skip()
    shape = (2, 4, 5, 32)
    n = 2 * 4 * 5 * 32
    plan = RopePlan.select(RopeDescriptor(*shape, element=F32, pairing=pairing))
    positions = torch.arange(5, device="cuda") * 7
    for _ in range(3):  # fresh tensors, same layout: the memo path after the first call
        x = torch.randn(shape, device="cuda")
        y = torch.full(shape, float("nan"), device="cuda")
        plan.run(RopeArgs(x, y, positions))
        expected = torch_rope(torch, x, positions, 10000.0, 32, pairing)
        torch.testing.assert_close(y, expected, rtol=2e-6, atol=2e-6 * float(x.abs().max()))
    buffer = torch.randn(3 * n, device="cuda")
    x = buffer[:n].view(shape)
    plan.run(RopeArgs(x, buffer[n:2 * n].view(shape), positions))  # memo for this layout
    overlapping = buffer[8:8 + n].view(shape)  # same layout key (32-byte offset), aliases x
    before = buffer.clone()
    with pytest.raises(InvalidProblem, match="overlaps"):
        plan.run(RopeArgs(x, overlapping, positions))
    torch.cuda.synchronize()
    assert torch.equal(buffer, before)  # nothing was launched
    # in place (y is x: its own memo), then in place through a second view of the same
    # address (not memoised): each call rotates once more
    for same in (lambda t: t, lambda t: t, lambda t: t.view(shape), lambda t: t.view(shape)):
        original = x.clone()
        plan.run(RopeArgs(x, same(x), positions))
        expected = torch_rope(torch, original, positions, 10000.0, 32, pairing)
        torch.testing.assert_close(x, expected, rtol=2e-6,
                                   atol=2e-6 * float(original.abs().max()))


@pytest.mark.gpu
def test_more_than_2_31_elements_table_and_tile():
    """2^31 + 2^22 f16 elements ([129, 128, 1024, 128]) in place: rope_flat and rope_table
    (positions absent), then rope_tile (forced, positions [B, S]) on the result; spot-checks of the
    first and last planes against the float64 reference."""
    torch = torch_or_skip()
    shape = (129, 128, 1024, 128)
    x = torch.empty(shape, device="cuda", dtype=torch.float16)
    x.uniform_(-2, 2)
    planes = [(0, 0), (0, 127), (128, 0), (128, 127)]
    rows = [0, 1, 511, 1022, 1023]

    def sample():
        return np.stack([x[b, h, rows].float().cpu().numpy() for b, h in planes])[:, None]

    def expect(before, positions):
        reference, _ = rope_reference(before.astype(np.float64), positions, 10000.0, 128,
                                      INTERLEAVED, False, F16)
        return expected_storage_values(reference, F16)

    rtol, atol = TOLERANCE[F16]
    plan = RopePlan.select(RopeDescriptor(*shape, element=F16))
    before = sample()
    view = as_mut(x, "test", "x")
    assert plan._flat_fits(view, view)
    plan.run(RopeArgs(x, x))
    assert plan._table is not None  # the table path ran (rope_flat)
    assert_close(sample(), expect(before, np.array(rows)), rtol, atol * 2, "flat, 2^31")
    plan.table_flat = False  # rope_table
    plan.retune()
    before = sample()
    plan.run(RopeArgs(x, x))
    assert_close(sample(), expect(before, np.array(rows)), rtol, atol * 2, "table, 2^31")
    positions = torch.randint(0, 100_000, (shape[0], shape[2]), device="cuda")
    plan.tile = True
    plan.angle_table = False
    plan.retune()
    before = sample()
    plan.run(RopeArgs(x, x, positions))
    pos = positions.cpu().numpy()[[b for b, _ in planes]][:, rows]
    got = sample()
    for k in range(len(planes)):
        assert_close(got[k], expect(before[k:k + 1], pos[k:k + 1])[0], rtol, atol * 2,
                     f"tile, 2^31, plane {planes[k]}")


@pytest.mark.gpu
def test_first_run_in_a_cuda_graph_capture_leaves_the_table_for_later():
    """A plan's first run captured into a CUDA graph cannot build the angle table (no
    allocation, no synchronisation while capturing): it takes the rows kernels, the graph
    replays correctly, and the next run outside the capture builds the table, with the
    same bits."""
    torch = torch_or_skip()
    shape = (2, 4, 33, 64)
    plan = RopePlan.select(RopeDescriptor(*shape, element=F32, pairing=HALF_SPLIT))
    x = torch.randn(shape, device="cuda")
    y = torch.full(shape, float("nan"), device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        plan.run(RopeArgs(x, y), stream=stream)
    assert plan._table is None
    x.normal_()
    graph.replay()
    torch.cuda.synchronize()
    expected = torch_rope(torch, x, None, 10000.0, 64, HALF_SPLIT)
    torch.testing.assert_close(y, expected, rtol=2e-6, atol=2e-6 * float(x.abs().max()))
    z = torch.full(shape, float("nan"), device="cuda")
    plan.run(RopeArgs(x, z))
    torch.cuda.synchronize()
    assert plan._table is not None
    assert torch.equal(z, y)
