"""RopePlan / RopeBackwardPlan against a plain NumPy float64 reference (and, on a GPU,
against PyTorch implementations of both pairings and torch.autograd).

The reference is exact (float64 θ = pos · base^(-2i/R), cos and sin in float64): the
kernel reduces θ modulo 2π in f64 and rounds the reduced angle once to f32 (at most half an
ulp of π: 1.2e-7 rad at any position), then sincosf (2 ulp), the f32 rotation and one
rounding to the storage type remain.

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
from baracuda_numba.plans.rope_kv_cache import (
    RopeKvCacheAppendArgs,
    RopeKvCacheAppendDescriptor,
    RopeKvCacheAppendPlan,
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
    RopeAngleSource,
    RopeLayout,
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
    """float64 RoPE of float64 ``x`` [B, H, S, D] (θ exact; ``element`` unused)."""
    batch, _, seq, _ = x.shape
    pairs = np.arange(rotary_dim // 2)
    inv_freq = np.float64(base) ** (-(2.0 * pairs) / rotary_dim)
    if positions is None:
        pos = np.broadcast_to(np.arange(seq), (batch, seq))
    else:
        pos = np.broadcast_to(np.asarray(positions), (batch, seq))
    theta = pos[:, :, None].astype(np.float64) * inv_freq
    cos, sin = np.cos(theta), np.sin(theta)
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
             heads_per_thread=None, units16=None, path=None, grid_limits=None):
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
    if grid_limits is not None:  # (grid_x_limit, grid_yz_limit)
        plan.grid_x_limit, plan.grid_yz_limit = grid_limits
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
    assert plan.choice(view, view).layout.endswith("_16B")
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
        assert plan.choice(view, view, None).path == "table" and plan.choice(view, view).flat
        plan.run(RopeBackwardArgs(x_dev, x_dev) if inverse else RopeArgs(x_dev, x_dev))
        np.testing.assert_array_equal(to_host(x_dev).view(np.uint8),
                                      expected.view(np.uint8), f"in place, planes {planes}")
    check(desc, x, None, inverse, path="table")


def test_flat_table_kernel_choice():
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
        return plan.choice(x, y).flat

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
    block = rope_plans.FLAT_BLOCK[4]
    for planes in (1, 2, 4):  # 6 planes of 64 units, ceil(6 / planes) groups of them
        threads = -(-6 // planes) * 64
        assert fits(flat_planes_per_thread=planes, grid_x_limit=-(-threads // block)), planes
        assert not fits(flat_planes_per_thread=planes,
                        grid_x_limit=-(-threads // block) - 1), planes


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
    assert plan.choice(view, view, pos).path == "tile"
    assert plan.choice(view, view, pos).tile_heads_per_block == 2
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
    assert plan.choice(view, view, pos).path == "tile"
    assert plan.choice(view, view, pos).tile_heads_per_block == 1
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
            return plan.choice(x_view, y_view).layout.endswith("_16B")
        return plan.choice(x_view, y_view, pos).path == path

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
def test_table_grid_stride_loops_and_tile_fallback(rng, pairing, limits):
    """Grids capped below the problem (CUDA's limits on huge problems): the table kernel's
    blocks walk several planes; the tile kernel (one tile per block) is not taken, and the
    rows kernels it falls back to give the same bits."""
    desc = RopeDescriptor(*SHAPE16, element=F32, pairing=pairing, rotary_dim=16)
    plan = RopePlan.select(desc)
    plan.tile = True
    plan.grid_x_limit, plan.grid_yz_limit = limits
    view = TensorMut(0x10000, SHAPE16, contiguous_strides(SHAPE16), "<f4", 4, None)
    assert plan.choice(view, view, object()).path == "rows"
    x = random_values(SHAPE16, F32, rng)
    positions = make_positions("per_sequence", SHAPE16, rng)
    expected = run_plan(desc, x, positions, force_pairs=True)
    np.testing.assert_array_equal(
        run_plan(desc, x, positions, path="tile", grid_limits=limits), expected)
    expected = run_plan(desc, x, None, force_pairs=True)
    for path in ("table", "tile"):
        np.testing.assert_array_equal(
            run_plan(desc, x, None, path=path, grid_limits=limits), expected, path)


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
        return plan.choice(view, view, object() if positions else None).path

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
        assert plan.choice(view, view, object()).path == expected


def test_angle_table_is_built_once():
    """The table is built at the first run that takes it and kept (retune included)."""
    shape = (1, 2, 3, 8)
    plan = RopePlan.select(RopeDescriptor(*shape, element=F32))
    assert plan.built_angle_table is None
    x = to_device(np.ones(shape, dtype=np.float32))
    plan.run(RopeArgs(x, x))
    table = plan.built_angle_table
    assert table is not None and table.shape == (2 * 3 * 4,)
    plan.retune()
    plan.run(RopeArgs(x, x))
    assert plan.built_angle_table is table
    cos_sin = to_host(table).reshape(3, 4, 2)
    theta = np.arange(3)[:, None] * 10000.0 ** (-(2.0 * np.arange(4)) / 8)
    # the reduced angle rounded once to f32 (<= 1.2e-7 rad) and sincosf's 2 ulp
    np.testing.assert_allclose(cos_sin[..., 0], np.cos(theta), atol=2e-7)
    np.testing.assert_allclose(cos_sin[..., 1], np.sin(theta), atol=2e-7)


def test_16_byte_units_choice():
    """f32 always; f16/bf16 only for small interleaved problems (decode), unless forced;
    16-byte alignment, and strides and dims in whole units, are required."""
    def layout(shape, element, offset=0, units16=None, rotary_dim=None, pairing=INTERLEAVED):
        plan = RopePlan.select(RopeDescriptor(*shape, element=element, rotary_dim=rotary_dim,
                                              pairing=pairing))
        plan.units16 = units16
        view = TensorMut(0x10000 + offset * element.byte_width, shape,
                         contiguous_strides(shape), "<f2", element.byte_width, None)
        return plan.choice(view, view).layout

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
        chosen = plan.choice(view, view)
        assert (chosen.layout, chosen.width) == (want, {"pairs": 1, "interleaved": 2,
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
    _rejects(lambda x, y: RopeArgs(x, y, to_device(np.zeros(3, np.int16))), InvalidProblem,
             "RopePlan: positions has dtype")
    _rejects(lambda x, y: RopeBackwardArgs(x, y, to_device(np.zeros(3, np.float64))),
             InvalidProblem, "RopeBackwardPlan: positions has dtype", inverse=True)


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


# -- angles at long positions (issue 53) ---------------------------------------------------


def storage_ulp(values, element):
    """One unit in the last place of the storage type at each value (f16: 10 mantissa
    bits, bf16: 7; subnormal floors)."""
    bits, floor = {F16: (10, -14), BF16: (7, -126)}[element]
    exponent = np.floor(np.log2(np.maximum(np.abs(values), 2.0 ** floor)))
    return 2.0 ** (exponent - bits)


def pair_magnitude(x, rotary_dim, pairing):
    """|a| + |b| of each rotated pair (a, b), at both of its positions: the scale of the f32
    rounding in a·cos − b·sin, which cancellation can leave far above the result itself."""
    if pairing is INTERLEAVED:
        first, second = slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)
    else:
        first, second = slice(0, rotary_dim // 2), slice(rotary_dim // 2, rotary_dim)
    magnitude = np.zeros_like(x)
    total = np.abs(x[..., first]) + np.abs(x[..., second])
    magnitude[..., first] = total
    magnitude[..., second] = total
    return magnitude


@pytest.mark.parametrize("element", [F16, BF16, F32], ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
@pytest.mark.parametrize("path", [None, "rows"], ids=["auto", "rows"])
def test_long_positions_against_exact_angles(rng, element, pairing, path):
    """Positions up to 2^20 against the float64 θ: f32 within 4e-6 absolute for unit-normal
    x; f16/bf16 within one rounding (1 ulp) of the exact result plus the f32 arithmetic's
    own error, a few f32 ulps of |a| + |b| (it shows where a·cos − b·sin cancels to a
    subnormal result); forward and backward."""
    shape = (1, 2, 4, 16)
    positions = np.array([999_999, 1 << 20, 65_535, (1 << 20) - 1], dtype=np.int64)
    x_host = to_storage(rng.standard_normal(shape), element)
    x64 = from_storage(x_host, element)
    for inverse in (False, True):
        desc = RopeDescriptor(*shape, element=element, pairing=pairing)
        got = from_storage(run_plan(desc, x_host, positions, inverse, path=path), element)
        y64, _ = rope_reference(x64, positions, 10000.0, 16, pairing, inverse, element)
        if element is F32:
            assert_close(got, y64, 0.0, 4e-6, f"f32 {pairing.name} inverse={inverse}")
        else:
            error = np.abs(got - y64)
            f32_error = 4 * np.finfo(np.float32).eps * pair_magnitude(x64, 16, pairing)
            bad = error > storage_ulp(y64, element) + f32_error
            assert not bad.any(), (element.name, np.argwhere(bad)[:4], got[bad][:4],
                                   y64[bad][:4])


# -- inv_freq, cos/sin, q and k, BSHD / THD, int32 positions, cu_seqlens (issue 55) --------

LAYOUTS = {"BHSD": RopeLayout.BHSD, "BSHD": RopeLayout.BSHD, "THD": RopeLayout.THD}


def to_layout(x_bhsd, layout):
    """[B, H, S, D] as ``layout`` (THD: B must be 1)."""
    if layout is RopeLayout.BSHD:
        return np.ascontiguousarray(x_bhsd.transpose(0, 2, 1, 3))
    if layout is RopeLayout.THD:
        return np.ascontiguousarray(x_bhsd[0].transpose(1, 0, 2))
    return x_bhsd


def from_layout(x, layout):
    if layout is RopeLayout.BSHD:
        return x.transpose(0, 2, 1, 3)
    if layout is RopeLayout.THD:
        return x.transpose(1, 0, 2)[None]
    return x


def table_reference(x64, cos, sin, pairing, rotary, inverse):
    """RoPE of [B, H, S, D] with per-(b, s) tables ``cos``/``sin`` [B, S, R/2] (float64)."""
    cos, sin = cos[:, None], (-sin if inverse else sin)[:, None]
    y = x64.copy()
    if pairing is INTERLEAVED:
        first, second = slice(0, rotary, 2), slice(1, rotary, 2)
    else:
        first, second = slice(0, rotary // 2), slice(rotary // 2, rotary)
    a, b = x64[..., first], x64[..., second]
    y[..., first] = a * cos - b * sin
    y[..., second] = b * cos + a * sin
    return y


# (layout, angles, table width (R or R/2) and dtype, positions dtype, kv heads, element)
GENERAL_CASES = [
    ("BHSD", "inv_freq", None, np.int32, 2, F32),
    ("BSHD", "inv_freq", None, np.int64, 1, BF16),
    ("BSHD", "gathered", ("R", BF16), None, 2, F16),
    ("BHSD", "gathered", ("R/2", F32), np.int64, 0, F64),
    ("THD", "cache", ("R/2", F16), np.int32, 2, BF16),
    ("BSHD", "cache", ("R", F64), np.int64, 2, F32),
]


@pytest.mark.parametrize("case", GENERAL_CASES, ids=lambda c: "-".join(map(str, c[:3])))
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
def test_general_path_matches_reference(rng, case, pairing):
    """q and k (GQA) in one run against the float64 reference, for each angle source,
    layout and positions dtype; forward and backward; poisoned outputs."""
    layout_name, angles, table, pos_dtype, kv_heads, element = case
    layout = LAYOUTS[layout_name]
    batch, heads, seq, dim, rotary = (1 if layout is RopeLayout.THD else 2), 4, 3, 12, 8
    base = 500.0
    q_host = random_values((batch, heads, seq, dim), element, rng)
    k_host = random_values((batch, kv_heads, seq, dim), element, rng)
    positions = rng.integers(0, 40, size=(seq,) if layout is RopeLayout.THD else (batch, seq))
    inv64 = base ** (-(2.0 * np.arange(rotary // 2)) / rotary)
    run_args, kind = {}, RopeAngleSource.BASE
    pos_arg = None if pos_dtype is None else positions.astype(pos_dtype)
    pos_bs = np.broadcast_to(np.arange(seq) if pos_dtype is None else positions, (batch, seq))
    if angles == "inv_freq":
        kind = RopeAngleSource.INV_FREQ
        inv32 = inv64.astype(np.float32)
        run_args["inv_freq"] = to_device(inv32)
        theta = pos_bs[..., None] * inv32.astype(np.float64)
        cos64, sin64 = np.cos(theta), np.sin(theta)
    else:
        width, table_element = table
        rows = 48
        if angles == "cache":
            kind = RopeAngleSource.COS_SIN_CACHE
            theta = np.arange(rows)[:, None] * inv64
        else:
            kind = RopeAngleSource.COS_SIN_GATHERED
            theta = pos_bs[..., None] * inv64  # [B, S, R/2]
        cos_t, sin_t = np.cos(theta), np.sin(theta)
        if width == "R":
            widen = (lambda t: np.concatenate([t, t], -1)) if pairing is HALF_SPLIT \
                else (lambda t: np.repeat(t, 2, -1))
            cos_t, sin_t = widen(cos_t), widen(sin_t)
        cos_s, sin_s = to_storage(cos_t, table_element), to_storage(sin_t, table_element)
        run_args.update(cos=to_device(cos_s), sin=to_device(sin_s))
        cos_v, sin_v = from_storage(cos_s, table_element), from_storage(sin_s, table_element)
        if width == "R":
            cos_v, sin_v = (cos_v[..., : rotary // 2], sin_v[..., : rotary // 2]) \
                if pairing is HALF_SPLIT else (cos_v[..., 0::2], sin_v[..., 0::2])
        if angles == "cache":
            cos64, sin64 = cos_v[pos_bs], sin_v[pos_bs]
        else:
            cos64, sin64 = np.broadcast_to(cos_v, (batch, seq, rotary // 2)), \
                np.broadcast_to(sin_v, (batch, seq, rotary // 2))
    for inverse in (False, True):
        desc = RopeDescriptor(batch, heads, seq, dim, element=element, pairing=pairing,
                              rotary_dim=rotary, base=base, num_kv_heads=kv_heads,
                              layout=layout, angles=kind)
        plan = (RopeBackwardPlan.select(RopeBackwardDescriptor.of(desc)) if inverse
                else RopePlan.select(desc))
        q = to_device(to_layout(q_host, layout))
        q_out = to_device(poisoned(to_layout(q_host, layout).shape, element))
        extra = {}
        if kv_heads:
            k_out = to_device(poisoned(to_layout(k_host, layout).shape, element))
            extra = {"dk" if inverse else "k": to_device(to_layout(k_host, layout)),
                     "dk_out" if inverse else "k_out": k_out}
        cls = RopeBackwardArgs if inverse else RopeArgs
        plan.run(cls(q, q_out, None if pos_arg is None else to_device(pos_arg),
                     **extra, **run_args))
        outs = [(q_out, q_host)] + ([(k_out, k_host)] if kv_heads else [])
        for out, source in outs:
            got = from_storage(from_layout(to_host(out), layout), element)
            x64 = from_storage(source, element)
            want = table_reference(x64, cos64, sin64, pairing, rotary, inverse)
            rtol, atol = tolerance(element, x64, 0.0)
            assert_close(got, expected_storage_values(want, element), rtol, atol,
                         f"{case} {pairing.name} inverse={inverse}")


@pytest.mark.parametrize("pos_dtype", [np.int32, np.int64])
def test_packed_sequences_with_cu_seqlens(rng, pos_dtype):
    """THD with cu_seqlens: positions restart per sequence (plus per-sequence offsets when
    given); an empty sequence in the middle; q and k."""
    tokens, heads, dim = 6, 2, 8
    cu = np.array([0, 2, 2, 6], dtype=pos_dtype)
    offsets = np.array([7, 0, 1000], dtype=pos_dtype)
    x_host = random_values((1, heads, tokens, dim), F32, rng)
    k_host = random_values((1, 1, tokens, dim), F32, rng)
    desc = RopeDescriptor(3, heads, tokens, dim, element=F32, pairing=HALF_SPLIT,
                          num_kv_heads=1, layout=RopeLayout.THD)
    plan = RopePlan.select(desc)
    for given in (None, offsets):
        y = to_device(poisoned((tokens, heads, dim), F32))
        k_out = to_device(poisoned((tokens, 1, dim), F32))
        plan.run(RopeArgs(to_device(to_layout(x_host, RopeLayout.THD)), y,
                          None if given is None else to_device(given),
                          k=to_device(to_layout(k_host, RopeLayout.THD)), k_out=k_out,
                          cu_seqlens=to_device(cu)))
        pos = np.array([0, 1, 0, 1, 2, 3]) + (0 if given is None else np.array(
            [7, 7, 1000, 1000, 1000, 1000]))
        for out, source in ((y, x_host), (k_out, k_host)):
            want, _ = rope_reference(source, pos, 10000.0, dim, HALF_SPLIT, False, F32)
            assert_close(from_layout(to_host(out), RopeLayout.THD), want, *TOLERANCE[F32],
                         f"cu_seqlens offsets={given is not None}")


def test_general_rejections():
    """Bad input raises before any launch and leaves the output untouched."""
    shape = (2, 4, 3, 8)
    x = to_device(np.ones(shape, np.float32))

    def rejects(desc_kwargs, args_kwargs, text, positions=None):
        desc = RopeDescriptor(*shape, element=F32, **desc_kwargs)
        y_host = poisoned(shape, F32)
        y = to_device(y_host)
        with pytest.raises(InvalidProblem, match=text):
            RopePlan.select(desc).run(RopeArgs(x, y, positions, **args_kwargs))
        np.testing.assert_array_equal(to_host(y).view(np.uint32), y_host.view(np.uint32))

    cache = RopeAngleSource.COS_SIN_CACHE
    short = to_device(np.ones((2, 4), np.float32))  # 2 rows < seq_len 3
    rejects({"angles": cache}, {"cos": short, "sin": short}, "cos has 2 rows")
    wide = to_device(np.ones((8, 6), np.float32))
    rejects({"angles": cache}, {"cos": wide, "sin": wide}, "last axis must be rotary_dim")
    rejects({"angles": cache}, {"cos": to_device(np.ones((8, 4), np.float32))}, "cos and sin")
    rejects({"angles": RopeAngleSource.INV_FREQ}, {}, "inv_freq is required")
    rejects({}, {"inv_freq": to_device(np.ones(4, np.float32))}, "desc.angles = BASE")
    rejects({}, {"cu_seqlens": to_device(np.zeros(3, np.int32))}, "only for desc.layout")
    rejects({"num_kv_heads": 2}, {}, "k and k_out are required")
    rejects({}, {"k": x, "k_out": x}, "num_kv_heads = 0")
    rejects({"layout": RopeLayout.BSHD}, {}, "x has shape")
    rejects({}, {}, "positions has dtype", to_device(np.zeros(3, np.float32)))
    with pytest.raises(InvalidProblem, match="must divide num_heads"):
        RopePlan.select(RopeDescriptor(*shape, element=F32, num_kv_heads=3))
    thd = RopeDescriptor(2, 4, 3, 8, element=F32, layout=RopeLayout.THD)
    with pytest.raises(InvalidProblem, match="cu_seqlens has shape"):
        RopePlan.select(thd).run(RopeArgs(to_device(np.ones((3, 4, 8), np.float32)),
                                          to_device(np.ones((3, 4, 8), np.float32)),
                                          cu_seqlens=to_device(np.zeros(2, np.int32))))


def test_rotary_dim_zero_copies():
    """rotary_dim = 0 rotates nothing: the output is x, bit for bit."""
    shape = (1, 2, 3, 8)
    x_host = random_values(shape, F32, np.random.default_rng(1))
    got = run_plan(RopeDescriptor(*shape, element=F32, rotary_dim=0), x_host,
                   np.array([5, 6, 7]))
    np.testing.assert_array_equal(got.view(np.uint32), x_host.view(np.uint32))


# -- fused rotate-and-append to a KV cache -----------------------------------------------


def _cache_case(rng, element, pairing, paged, layout=RopeLayout.BHSD):
    batch, heads, kv, length, dim = 2, 4, 2, 2, 8
    q = random_values((batch, heads, length, dim), element, rng)
    k = random_values((batch, kv, length, dim), element, rng)
    v = random_values((batch, kv, length, dim), element, rng)
    if paged:
        pages, page = 3, 2
        caches = [random_values((pages, page, kv, dim), element, rng) for _ in range(2)]
        slots = np.array([[5, 0], [-1, 3]], dtype=np.int64)  # -1: a padding token
        positions = np.array([[9, 10], [3, 4]], dtype=np.int64)
        extra = dict(slot_mapping=slots, positions=positions)
        desc_extra = dict(page_size=page, num_pages=pages)
    else:
        caches = [random_values((batch, kv, 6, dim), element, rng) for _ in range(2)]
        offsets = np.array([1, 4], dtype=np.int32)
        positions = offsets[:, None].astype(np.int64) + np.arange(length)
        extra = dict(cache_offsets=offsets)
        desc_extra = dict(max_cache_len=6)
    desc = RopeKvCacheAppendDescriptor(batch, heads, kv, length, dim, element=element,
                                       pairing=pairing, layout=layout, **desc_extra)
    return desc, (q, k, v), caches, positions, extra


def _expected_cache(element, pairing, tensors, caches, positions, extra, paged):
    """RopePlan on q and k at ``positions``, then the rows placed as WriteSlicePlan would."""
    q, k, v = tensors
    rotated = []
    for x in (q, k):
        desc = RopeDescriptor(*x.shape, element=element, pairing=pairing)
        rotated.append(run_plan(desc, x, positions))
    k_cache, v_cache = (c.copy() for c in caches)
    for b in range(q.shape[0]):
        for l_ in range(q.shape[2]):
            if paged:
                slot = extra["slot_mapping"][b, l_]
                if slot >= 0:
                    page, row = divmod(int(slot), k_cache.shape[1])
                    k_cache[page, row] = rotated[1][b, :, l_]
                    v_cache[page, row] = v[b, :, l_]
            else:
                at = extra["cache_offsets"][b] + l_
                k_cache[b, :, at] = rotated[1][b, :, l_]
                v_cache[b, :, at] = v[b, :, l_]
    return rotated[0], k_cache, v_cache


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
def test_kv_cache_append_is_rope_then_write(rng, paged, pairing):
    """Bit-identical to RopePlan followed by the cache write, q returned rotated; a
    negative slot is skipped."""
    element = BF16
    desc, tensors, caches, positions, extra = _cache_case(rng, element, pairing, paged)
    q_out = to_device(poisoned(tensors[0].shape, element))
    k_cache, v_cache = (to_device(c) for c in caches)
    RopeKvCacheAppendPlan.select(desc).run(RopeKvCacheAppendArgs(
        *(to_device(t) for t in (tensors[0],)), q_out, *(to_device(t) for t in tensors[1:]),
        k_cache, v_cache, **{name: to_device(a) for name, a in extra.items()}))
    q_want, k_want, v_want = _expected_cache(element, pairing, tensors, caches, positions,
                                             extra, paged)
    np.testing.assert_array_equal(to_host(q_out), q_want)
    np.testing.assert_array_equal(to_host(k_cache), k_want)
    np.testing.assert_array_equal(to_host(v_cache), v_want)


def test_kv_cache_append_rejections_and_debug_switch(rng):
    from baracuda_numba import debug_enabled, set_debug

    desc, tensors, caches, _, extra = _cache_case(rng, F16, HALF_SPLIT, False)
    plan = RopeKvCacheAppendPlan.select(desc)
    q, k, v = (to_device(t) for t in tensors)
    k_cache, v_cache = (to_device(c) for c in caches)
    with pytest.raises(InvalidProblem, match="cache_offsets is required"):
        plan.run(RopeKvCacheAppendArgs(q, q, k, v, k_cache, v_cache))
    with pytest.raises(InvalidProblem, match="k_cache has shape"):
        plan.run(RopeKvCacheAppendArgs(q, q, k, v, q, v_cache,
                                       cache_offsets=to_device(extra["cache_offsets"])))
    with pytest.raises(InvalidProblem, match="THD needs a paged cache"):
        RopeKvCacheAppendPlan.select(RopeKvCacheAppendDescriptor(
            1, 4, 2, 2, 8, element=F16, max_cache_len=6, layout=RopeLayout.THD))
    with pytest.raises(InvalidProblem, match="must divide num_heads"):
        RopeKvCacheAppendPlan.select(RopeKvCacheAppendDescriptor(
            1, 4, 3, 2, 8, element=F16, max_cache_len=6))
    # an offset whose run of L positions leaves the cache: skipped, or raised under debug
    late = to_device(np.array([1, 5], dtype=np.int32))  # 5 + 1 = 6 = max_cache_len
    before = to_host(k_cache).copy()
    plan.run(RopeKvCacheAppendArgs(q, to_device(poisoned(tensors[0].shape, F16)), k, v,
                                   k_cache, v_cache, cache_offsets=late))
    after = to_host(k_cache)
    # position 6 of (b=1, h=0) would be position 0 of (b=1, h=1): left alone
    np.testing.assert_array_equal(after[1, 1, 0], before[1, 1, 0])
    np.testing.assert_array_equal(after[1, :, :5], before[1, :, :5])
    assert not np.array_equal(after[1, :, 5], before[1, :, 5])
    was = debug_enabled()
    set_debug(True)
    snapshot = to_host(k_cache).copy()
    try:
        with pytest.raises(InvalidProblem, match="cache_offsets holds 5"):
            plan.run(RopeKvCacheAppendArgs(q, q, k, v, k_cache, v_cache, cache_offsets=late))
    finally:
        set_debug(was)
    np.testing.assert_array_equal(to_host(k_cache), snapshot)


# -- scaling helpers -------------------------------------------------------------------------


def test_scaling_helpers_follow_their_formulas():
    from baracuda_numba import rope_scaling as rs

    default = 10000.0 ** (-np.arange(0, 64, 2) / 64)
    np.testing.assert_allclose(rs.default_inv_freq(64), default, rtol=6e-8)
    np.testing.assert_allclose(rs.linear_inv_freq(64, 10000.0, 4.0), default / 4, rtol=6e-8)
    # dynamic NTK: unchanged up to the trained length; base grows past it
    np.testing.assert_array_equal(rs.dynamic_ntk_inv_freq(64, 10000.0, 2.0, 4096, 1000),
                                  rs.default_inv_freq(64))
    grown = 10000.0 * (2.0 * 8192 / 4096 - 1) ** (64 / 62)
    np.testing.assert_allclose(rs.dynamic_ntk_inv_freq(64, 10000.0, 2.0, 4096, 8192),
                               grown ** (-np.arange(0, 64, 2) / 64), rtol=6e-8)
    # llama3: high frequencies kept, low ones divided by the factor, a blend between
    llama = rs.llama3_inv_freq(128, 500000.0, 8.0, 1.0, 4.0, 8192)
    base = rs.default_inv_freq(128, 500000.0)
    wavelength = 2 * np.pi / base.astype(np.float64)
    np.testing.assert_array_equal(llama[wavelength < 8192 / 4], base[wavelength < 8192 / 4])
    np.testing.assert_allclose(llama[wavelength > 8192], base[wavelength > 8192] / 8, rtol=1e-7)
    middle = (wavelength >= 2048) & (wavelength <= 8192)
    assert middle.any() and np.all(llama[middle] <= base[middle])
    # YaRN at factor 1 is the default schedule with attention factor 1
    inv, factor = rs.yarn_inv_freq(64, 10000.0, 1.0, 4096)
    np.testing.assert_allclose(inv, rs.default_inv_freq(64), rtol=6e-8)
    assert factor == 1.0
    inv, factor = rs.yarn_inv_freq(64, 10000.0, 4.0, 4096)
    assert factor == pytest.approx(0.1 * np.log(4.0) + 1)
    assert inv[0] == rs.default_inv_freq(64)[0] and inv[-1] == pytest.approx(
        rs.default_inv_freq(64)[-1] / 4, rel=1e-6)
    with pytest.raises(InvalidProblem, match="rotary_dim"):
        rs.default_inv_freq(7)
    with pytest.raises(InvalidProblem, match="high_freq_factor"):
        rs.llama3_inv_freq(64, 10000.0, 8.0, 4.0, 1.0, 8192)


def test_functional_layer_q_and_k_and_cache_write(rng):
    """``ops.rope(x, k=...)`` returns both, ``rotary_dim=0`` returns x's values,
    ``ops.rope_backward`` inverts, ``ops.rope_cache_write`` appends."""
    import baracuda_numba.ops as ops

    q = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)  # [B, S, H, D]
    k = rng.standard_normal((2, 3, 1, 8)).astype(np.float32)
    inv = (10000.0 ** (-np.arange(0, 8, 2) / 8)).astype(np.float32)
    q_out, k_out = ops.rope(to_device(q), k=to_device(k), inv_freq=to_device(inv),
                            layout="BSHD", pairing="half_split")
    dq, dk = ops.rope_backward(q_out, dk=k_out, inv_freq=to_device(inv), layout="BSHD",
                               pairing="half_split")
    assert_close(to_host(dq), q, 0.0, 1e-6, "q round trip")
    assert_close(to_host(dk), k, 0.0, 1e-6, "k round trip")
    np.testing.assert_array_equal(to_host(ops.rope(to_device(q), rotary_dim=0)), q)
    with pytest.raises(InvalidProblem, match="layout"):
        ops.rope(to_device(q), layout="SBHD")
    k_cache, v_cache = to_device(np.zeros((2, 1, 8, 8), np.float32)), \
        to_device(np.zeros((2, 1, 8, 8), np.float32))
    k_bhsd = np.ascontiguousarray(k.transpose(0, 2, 1, 3))
    ops.rope_cache_write(to_device(np.ascontiguousarray(q.transpose(0, 2, 1, 3))),
                         to_device(k_bhsd), to_device(k_bhsd), k_cache, v_cache,
                         cache_offsets=to_device(np.array([0, 4])))
    np.testing.assert_array_equal(to_host(v_cache)[1, 0, 4:7], k_bhsd[1, 0])


# -- GPU: PyTorch, autograd, torch views, > 2^31 elements --------------------------------


def torch_rope(torch, x, positions, base, rotary_dim, pairing):
    """PyTorch RoPE: θ, cos and sin in f64 (exact, as the plans' contract), rounded to f32,
    then the rotation in f32 as HF/NeoX."""
    batch, _, seq, _ = x.shape
    pairs = torch.arange(rotary_dim // 2, device=x.device, dtype=torch.float64)
    inv_freq = base ** (-(2.0 * pairs) / rotary_dim)
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    pos = positions.expand(batch, seq).double()
    theta = pos[:, :, None] * inv_freq  # [B, S, R/2]
    cos, sin = theta.cos().float()[:, None], theta.sin().float()[:, None]
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
    assert plan.choice(view, view).flat
    plan.run(RopeArgs(x, x))
    assert plan.built_angle_table is not None  # the table path ran (rope_flat)
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
    assert plan.built_angle_table is None
    x.normal_()
    graph.replay()
    torch.cuda.synchronize()
    expected = torch_rope(torch, x, None, 10000.0, 64, HALF_SPLIT)
    torch.testing.assert_close(y, expected, rtol=2e-6, atol=2e-6 * float(x.abs().max()))
    z = torch.full(shape, float("nan"), device="cuda")
    plan.run(RopeArgs(x, z))
    torch.cuda.synchronize()
    assert plan.built_angle_table is not None
    assert torch.equal(z, y)


# -- GPU: the general path against HF, flash-attn's formula and Liger's shapes ------------


def hf_cos_sin(torch, positions, inv_freq, dtype, scaling=1.0):
    """HF's rotary embedding output: cos/sin ``[B, S, R]`` = cat(freqs, freqs), in f32 from
    an f64 θ (so both sides see the same angles), then cast to ``dtype``."""
    freqs = positions.double()[..., None] * inv_freq.double()
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("heads", [(32, 8), (8, 8), (6, 2)], ids=str)
def test_q_and_k_against_hf_apply_rotary_pos_emb(dtype_name, heads):
    """``bt.rope(q, k=k, cos=, sin=)`` (HF-gathered tables, half-split) equals HF's
    ``apply_rotary_pos_emb`` up to one rounding each; gradients through both match."""
    torch = torch_or_skip()
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    import baracuda_numba.torch as bt

    dtype = getattr(torch, dtype_name)
    (hq, hk), batch, seq, dim = heads, 2, 77, 128
    q = torch.randn(batch, hq, seq, dim, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(batch, hk, seq, dim, device="cuda", dtype=dtype, requires_grad=True)
    positions = torch.randint(0, 1 << 17, (batch, seq), device="cuda")
    inv_freq = torch.tensor(10000.0 ** (-np.arange(0, dim, 2) / dim), device="cuda")
    cos, sin = hf_cos_sin(torch, positions, inv_freq, dtype)
    q_ref, k_ref = llama.apply_rotary_pos_emb(q, k, cos, sin)
    q_out, k_out = bt.rope(q, k=k, cos=cos, sin=sin, pairing="half_split")
    element = {torch.bfloat16: BF16, torch.float16: F16, torch.float32: F32}[dtype]
    rtol, atol = TOLERANCE[element]
    for got, want, x in ((q_out, q_ref, q), (k_out, k_ref, k)):
        torch.testing.assert_close(got.float(), want.float(), rtol=2 * rtol,
                                   atol=2 * atol * float(x.detach().abs().max()))
    grad_q, grad_k = torch.randn_like(q_out), torch.randn_like(k_out)
    ours = torch.autograd.grad((q_out, k_out), (q, k), (grad_q, grad_k))
    theirs = torch.autograd.grad((q_ref, k_ref), (q, k), (grad_q, grad_k))
    for got, want in zip(ours, theirs):
        torch.testing.assert_close(got.float(), want.float(), rtol=2 * rtol,
                                   atol=2 * atol * 4.0 * float(want.abs().max()))


def flash_attn_rotary_reference(torch, x, cos, sin, interleaved):
    """flash-attn's ``apply_rotary_emb_torch``, reimplemented: x ``[..., S, H, D]``, cos/sin
    ``[S, R/2]``; the first R features rotated, the rest passed through."""
    rotary = cos.shape[-1] * 2
    rot, rest = x[..., :rotary].float(), x[..., rotary:]
    if interleaved:
        cos_r = cos.float().repeat_interleave(2, dim=-1)[:, None]
        sin_r = sin.float().repeat_interleave(2, dim=-1)[:, None]
        a, b = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((-b, a), dim=-1).flatten(-2)
    else:
        cos_r = torch.cat([cos, cos], -1).float()[:, None]
        sin_r = torch.cat([sin, sin], -1).float()[:, None]
        a, b = rot[..., : rotary // 2], rot[..., rotary // 2:]
        rotated = torch.cat((-b, a), dim=-1)
    return torch.cat([(rot * cos_r + rotated * sin_r).to(x.dtype), rest], dim=-1)


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [False, True], ids=["half_split", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [64, 32], ids=["full", "partial"])
def test_varlen_against_flash_attn_formula(interleaved, rotary_dim):
    """Packed [T, H, D] with cu_seqlens and a [S_max, R/2] cache, partial rotary, both
    pairings: flash-attn's reference formula per sequence."""
    torch = torch_or_skip()
    import baracuda_numba.ops as bops

    lengths = [5, 0, 300, 1, 129]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), device="cuda",
                      dtype=torch.int32)
    tokens, heads, dim = int(cu[-1]), 6, 64
    x = torch.randn(tokens, heads, dim, device="cuda", dtype=torch.float16)
    k = torch.randn(tokens, 2, dim, device="cuda", dtype=torch.float16)
    theta = torch.arange(512, device="cuda", dtype=torch.float64)[:, None] * (
        10000.0 ** (-torch.arange(0, rotary_dim, 2, device="cuda").double() / rotary_dim))
    cos, sin = theta.cos().float(), theta.sin().float()
    pairing = "interleaved" if interleaved else "half_split"
    got, got_k = bops.rope(x, k=k, cos=cos, sin=sin, layout="THD", cu_seqlens=cu,
                           pairing=pairing, rotary_dim=rotary_dim)
    for t_in, t_out in ((x, got), (k, got_k)):
        for i, length in enumerate(lengths):
            start = int(cu[i])
            part = t_in[start:start + length]
            want = flash_attn_rotary_reference(torch, part, cos[:length], sin[:length],
                                               interleaved)
            torch.testing.assert_close(t_out[start:start + length].float(), want.float(),
                                       rtol=2e-3, atol=2e-3 * (1 + float(
                                           part.abs().amax()) if part.numel() else 1.0))


LIGER_SHAPES = [(1, 128, 32, 32, 64), (2, 128, 32, 32, 64), (1, 128, 32, 8, 64),
                (2, 128, 32, 8, 64), (3, 423, 73, 213, 92), (3, 423, 73, 155, 92)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", LIGER_SHAPES, ids=str)
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float32"])
def test_liger_shapes(shape, dtype_name):
    """Liger-Kernel's rope test shapes (batch, seq, q heads, kv heads, head dim), HF
    tables; kv heads that do not divide q's are rotated in a call of their own."""
    torch = torch_or_skip()
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    import baracuda_numba.torch as bt

    batch, seq, hq, hk, dim = shape
    dtype = getattr(torch, dtype_name)
    q = torch.randn(batch, seq, hq, dim, device="cuda", dtype=dtype).transpose(1, 2)
    k = torch.randn(batch, seq, hk, dim, device="cuda", dtype=dtype).transpose(1, 2)
    positions = torch.arange(seq, device="cuda")[None].expand(batch, seq)
    inv_freq = torch.tensor(10000.0 ** (-np.arange(0, dim, 2) / dim), device="cuda")
    cos, sin = hf_cos_sin(torch, positions, inv_freq, dtype)
    q_ref, k_ref = llama.apply_rotary_pos_emb(q, k, cos, sin)
    if hq % hk == 0:
        q_out, k_out = bt.rope(q, k=k, cos=cos, sin=sin, pairing="half_split")
    else:
        q_out = bt.rope(q, cos=cos, sin=sin, pairing="half_split")
        k_out = bt.rope(k, cos=cos, sin=sin, pairing="half_split")
    tol = 1.6e-2 if dtype is torch.bfloat16 else 2e-6
    for got, want, x in ((q_out, q_ref, q), (k_out, k_ref, k)):
        torch.testing.assert_close(got.float(), want.float(), rtol=tol,
                                   atol=tol * float(x.abs().max()))


@pytest.mark.gpu
def test_torch_rope_under_compile_and_rotary_dim_zero():
    torch = torch_or_skip()
    import baracuda_numba.torch as bt

    q = torch.randn(2, 8, 33, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, 33, 64, device="cuda", dtype=torch.bfloat16)
    inv = torch.tensor(10000.0 ** (-np.arange(0, 64, 2) / 64), device="cuda",
                       dtype=torch.float32)

    def f(q, k):
        return bt.rope(q, k=k, inv_freq=inv, pairing="half_split")

    eager = f(q, k)
    compiled = torch.compile(f, fullgraph=True)(q, k)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    assert torch.equal(bt.rope(q, rotary_dim=0), q)


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("length", [1, 37], ids=["decode", "prefill"])
def test_kv_cache_append_bit_identical_to_rope_then_write_slice(paged, length):
    """Llama-3-8B heads: the fused plan against RopePlan followed by WriteSlicePlan (one
    window per sequence), bit for bit."""
    torch = torch_or_skip()
    import baracuda_numba.ops as bops

    batch, hq, hk, dim, max_len = 8, 32, 8, 128, 256
    dtype = torch.bfloat16
    q = torch.randn(batch, hq, length, dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, hk, length, dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, hk, length, dim, device="cuda", dtype=dtype)
    offsets = torch.randint(0, max_len - length + 1, (batch,), device="cuda")
    positions = offsets[:, None] + torch.arange(length, device="cuda")
    q_want = bops.rope(q, positions=positions, pairing="half_split")
    k_rot = bops.rope(k, positions=positions, pairing="half_split")
    if paged:
        page = 16
        pages = batch * max_len // page
        k_cache = torch.randn(pages, page, hk, dim, device="cuda", dtype=dtype)
        v_cache = torch.randn_like(k_cache)
        perm = torch.randperm(pages, device="cuda").view(batch, max_len // page)
        slots = perm.gather(1, (positions // page)) * page + positions % page
        k_want, v_want = k_cache.clone(), v_cache.clone()
        k_want.view(-1, hk, dim)[slots.flatten()] = k_rot.transpose(1, 2).reshape(-1, hk, dim)
        v_want.view(-1, hk, dim)[slots.flatten()] = v.transpose(1, 2).reshape(-1, hk, dim)
        q_out = bops.rope_cache_write(q, k, v, k_cache, v_cache, slot_mapping=slots,
                                      positions=positions, pairing="half_split")
    else:
        from baracuda_numba.plans.write_slice import (
            WriteSliceArgs,
            WriteSliceDescriptor,
            WriteSlicePlan,
        )

        k_cache = torch.randn(batch, hk, max_len, dim, device="cuda", dtype=dtype)
        v_cache = torch.randn_like(k_cache)
        k_want, v_want = k_cache.clone(), v_cache.clone()
        for b in range(batch):
            at = int(offsets[b])
            for src, dst in ((k_rot, k_want), (v, v_want)):
                desc = WriteSliceDescriptor((batch, hk, max_len, dim), (1, hk, length, dim),
                                            ((b, b + 1), (0, hk), (at, at + length), (0, dim)),
                                            element=BF16)
                WriteSlicePlan.select(desc).run(WriteSliceArgs(dst, src[b:b + 1]))
        q_out = bops.rope_cache_write(q, k, v, k_cache, v_cache, cache_offsets=offsets,
                                      pairing="half_split")
    torch.cuda.synchronize()
    assert torch.equal(q_out.view(torch.int16), q_want.view(torch.int16))
    assert torch.equal(k_cache.view(torch.int16), k_want.view(torch.int16))
    assert torch.equal(v_cache.view(torch.int16), v_want.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("in_place", [False, True], ids=["q_out", "in_place"])
def test_kv_cache_append_replay_matches_checked_path(in_place):
    """A repeated layout replays the stored launches (LayoutMemo) with each call's own
    pointers: fresh tensors every call, results equal to the checked path's (debug
    switch on: every call checked); an overlapping q_out is still refused."""
    torch = torch_or_skip()
    from baracuda_numba import debug_enabled, set_debug

    batch, hq, hk, dim, max_len = 4, 8, 2, 64, 32
    dtype = torch.bfloat16
    desc = RopeKvCacheAppendDescriptor(batch, hq, hk, 1, dim, max_cache_len=max_len,
                                       element=BF16, pairing=HALF_SPLIT)
    plan = RopeKvCacheAppendPlan.select(desc)

    def call(seed, debug):
        g = torch.Generator(device="cuda").manual_seed(seed)
        q = torch.randn(batch, hq, 1, dim, device="cuda", dtype=dtype, generator=g)
        k, v = (torch.randn(batch, hk, 1, dim, device="cuda", dtype=dtype, generator=g)
                for _ in range(2))
        caches = [torch.randn(batch, hk, max_len, dim, device="cuda", dtype=dtype,
                              generator=g) for _ in range(2)]
        offsets = torch.randint(0, max_len, (batch,), device="cuda", generator=g)
        q_out = q if in_place else torch.full_like(q, float("nan"))
        was = debug_enabled()
        set_debug(debug)
        try:
            plan.run(RopeKvCacheAppendArgs(q, q_out, k, v, *caches, cache_offsets=offsets))
        finally:
            set_debug(was)
        return [t.view(torch.int16) for t in (q_out, *caches)]

    for seed in range(4):  # the first call stores the layout, the others replay it
        fast, checked = call(seed, False), call(seed, True)
        for a, b in zip(fast, checked):
            assert torch.equal(a, b)
    # q_out one row past q in one buffer (same layout as the stored one): refused
    buf = torch.randn(batch * hq * dim + dim, device="cuda", dtype=dtype)
    q, q_out = (buf[at:at + batch * hq * dim].view(batch, hq, 1, dim) for at in (0, dim))
    k = torch.randn(batch, hk, 1, dim, device="cuda", dtype=dtype)
    caches = [torch.zeros(batch, hk, max_len, dim, device="cuda", dtype=dtype)
              for _ in range(2)]
    offsets = torch.zeros(batch, dtype=torch.int64, device="cuda")
    with pytest.raises(InvalidProblem, match="overlaps"):
        plan.run(RopeKvCacheAppendArgs(q, q_out, k, k, *caches, cache_offsets=offsets))


@pytest.mark.gpu
def test_scaling_helpers_against_transformers():
    """Each helper against HF transformers' ROPE_INIT_FUNCTIONS (f32 there: rtol 1e-6)."""
    torch_or_skip()
    utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import LlamaConfig

    from baracuda_numba import rope_scaling as rs

    cases = [
        ("linear", {"factor": 4.0}, lambda: rs.linear_inv_freq(128, 500000.0, 4.0)),
        ("dynamic", {"factor": 2.0}, lambda: rs.dynamic_ntk_inv_freq(128, 500000.0, 2.0,
                                                                     8192, 8192)),
        ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192},
         lambda: rs.llama3_inv_freq(128, 500000.0, 8.0, 1.0, 4.0, 8192)),
        ("yarn", {"factor": 4.0, "original_max_position_embeddings": 8192},
         lambda: rs.yarn_inv_freq(128, 500000.0, 4.0, 8192)),
    ]
    for kind, params, ours in cases:
        scaling = {"rope_type": kind, **params}
        try:
            config = LlamaConfig(head_dim=128, hidden_size=4096, num_attention_heads=32,
                                 rope_theta=500000.0, max_position_embeddings=8192,
                                 rope_scaling=scaling)
            inv, factor = utils.ROPE_INIT_FUNCTIONS[kind](config, "cpu")
        except Exception as error:  # transformers' config API moves between versions
            pytest.skip(f"transformers' {kind} helper not callable here: {error}")
        got = ours()
        got_inv, got_factor = got if isinstance(got, tuple) else (got, 1.0)
        # HF forms base^(2i/R) in f32: the exponent's rounding times ln(base) (13 for
        # 500000) is about 1.3e-6 relative, plus f32 pow and the ramp's arithmetic
        np.testing.assert_allclose(got_inv, inv.double().cpu().numpy(), rtol=1e-5,
                                   err_msg=kind)
        assert got_factor == pytest.approx(float(factor), rel=1e-6), kind


# -- q and k together from cos/sin tables: ``rope_qk`` (kernels/rope_qk.py) ----------------

# (q heads, kv heads, batch, heads per thread (None: from the size), fused qkv storage)
QK_CASES = [(4, 1, 2, None, False), (8, 1, 1, 3, True), (8, 2, 2, 6, False),
            (8, 1, 2, None, True)]


def _qk_tables(rng, batch, seq, dim, pairing, element, cache):
    """cos/sin of random angles, width D (half-split: cat(f, f); interleaved:
    repeat_interleave): gathered [B, S, D], or a cache [S + 3, D] with positions."""
    rows = seq + 3 if cache else None
    theta = rng.uniform(-4, 4, size=(rows,) if cache else (batch, seq))[..., None] \
        * rng.uniform(0.1, 1.0, size=dim // 2)
    widen = (lambda t: np.concatenate([t, t], -1)) if pairing is HALF_SPLIT \
        else (lambda t: np.repeat(t, 2, -1))
    return to_storage(widen(np.cos(theta)), element), to_storage(widen(np.sin(theta)), element)


def _qk_run(plan, inverse, q_in, q_out, k_in, k_out, cos, sin, positions):
    cls = RopeBackwardArgs if inverse else RopeArgs
    plan.run(cls(q_in, q_out, positions, k_in, k_out, cos=cos, sin=sin))


@pytest.mark.parametrize("case", QK_CASES, ids=lambda c: "q{}k{}b{}h{}{}".format(
    *c[:4], "-qkv" if c[4] else ""))
@pytest.mark.parametrize("cache", [False, True], ids=["gathered", "cache"])
@pytest.mark.parametrize("element", [F16, F32], ids=lambda e: e.name)
@pytest.mark.parametrize("pairing", [INTERLEAVED, HALF_SPLIT], ids=lambda p: p.name)
def test_qk_kernel_bit_identical_to_general(rng, case, cache, element, pairing):
    """``rope_qk`` (HF layout [B, S, H, D], GQA, gathered or cached cos/sin, q and k
    optionally sliced out of one fused qkv tensor) gives the bits of the general
    ``rope_rows`` launch, forward and backward; outputs poisoned; v untouched."""
    q_heads, kv_heads, batch, per_thread, fused = case
    seq, dim = 2, 32
    heads = q_heads + 2 * kv_heads if fused else None
    cos_h, sin_h = _qk_tables(rng, batch, seq, dim, pairing, element, cache)
    cos, sin = to_device(cos_h), to_device(sin_h)
    positions = to_device(rng.integers(0, seq + 3, size=(batch, seq)).astype(np.int32)) \
        if cache else None
    angles = RopeAngleSource.COS_SIN_CACHE if cache else RopeAngleSource.COS_SIN_GATHERED
    desc = RopeDescriptor(batch, q_heads, seq, dim, element=element, pairing=pairing,
                          num_kv_heads=kv_heads, layout=RopeLayout.BSHD, angles=angles)
    for inverse in (False, True):
        results = []
        for qk_kernel in (None, False):
            plan = (RopeBackwardPlan.select(RopeBackwardDescriptor.of(desc)) if inverse
                    else RopePlan.select(desc))
            plan.qk_kernel = qk_kernel
            plan.qk_heads_per_thread = per_thread
            if fused:  # q, k, v of [B, S, Hq + 2 Hk, D]; q and k rotated in place
                host = random_values((batch, seq, heads, dim), element,
                                     np.random.default_rng(7))
                device = to_device(host.reshape(-1))
                strides = (seq * heads * dim, heads * dim, dim, 1)
                q = _view(device, 0, (batch, seq, q_heads, dim), strides)
                k = _view(device, q_heads * dim, (batch, seq, kv_heads, dim), strides)
                _qk_run(plan, inverse, q, q, k, k, cos, sin, positions)
                got = to_host(device).reshape(host.shape)
                np.testing.assert_array_equal(got[:, :, q_heads + kv_heads:],
                                              host[:, :, q_heads + kv_heads:])
                results.append(got[:, :, :q_heads + kv_heads])
            else:
                q_h = random_values((batch, seq, q_heads, dim), element,
                                    np.random.default_rng(8))
                k_h = random_values((batch, seq, kv_heads, dim), element,
                                    np.random.default_rng(9))
                q_out = to_device(poisoned(q_h.shape, element))
                k_out = to_device(poisoned(k_h.shape, element))
                _qk_run(plan, inverse, to_device(q_h), q_out, to_device(k_h), k_out, cos,
                        sin, positions)
                results.append(np.concatenate([to_host(q_out), to_host(k_out)], axis=2))
            assert plan.qk_path.last_kernel == ("rope_qk" if qk_kernel is None
                                                else "rope_rows")
        ours, general = results
        assert not np.isnan(from_storage(ours, element)).any()
        np.testing.assert_array_equal(ours.view(np.uint8), general.view(np.uint8),
                                      f"inverse={inverse}")


def test_qk_kernel_matches_reference_and_falls_back(rng):
    """``rope_qk`` against the float64 table reference (B = 2, GQA 4, BHSD), then layouts
    it does not take (a table of another dtype, a misaligned q) run ``rope_rows``."""
    batch, q_heads, kv_heads, seq, dim = 2, 4, 1, 3, 16
    cos_h, sin_h = _qk_tables(rng, batch, seq, dim, HALF_SPLIT, F32, False)
    desc = RopeDescriptor(batch, q_heads, seq, dim, element=F32, pairing=HALF_SPLIT,
                          num_kv_heads=kv_heads, angles=RopeAngleSource.COS_SIN_GATHERED)
    plan = RopePlan.select(desc)
    q_h = random_values((batch, q_heads, seq, dim), F32, rng)
    k_h = random_values((batch, kv_heads, seq, dim), F32, rng)
    q_out = to_device(poisoned(q_h.shape, F32))
    k_out = to_device(poisoned(k_h.shape, F32))
    plan.run(RopeArgs(to_device(q_h), q_out, None, to_device(k_h), k_out,
                      cos=to_device(cos_h), sin=to_device(sin_h)))
    assert plan.qk_path.last_kernel == "rope_qk"
    half = dim // 2
    for out, x in ((q_out, q_h), (k_out, k_h)):
        want = table_reference(x.astype(np.float64), cos_h[..., :half].astype(np.float64),
                               sin_h[..., :half].astype(np.float64), HALF_SPLIT, dim, False)
        assert_close(to_host(out), want, *TOLERANCE[F32], "rope_qk vs reference")
    plan.run(RopeArgs(to_device(q_h), q_out, None, to_device(k_h), k_out,
                      cos=to_device(cos_h.astype(np.float16)),
                      sin=to_device(sin_h.astype(np.float16))))
    assert plan.qk_path.last_kernel == "rope_rows"
    shifted = to_device(np.concatenate([np.zeros(1, np.float32), q_h.reshape(-1)]))
    q_view = _view(shifted, 1, q_h.shape, contiguous_strides(q_h.shape), TensorMut)
    plan.run(RopeArgs(q_view, q_out, None, to_device(k_h), k_out, cos=to_device(cos_h),
                      sin=to_device(sin_h)))
    assert plan.qk_path.last_kernel == "rope_rows"


def test_qk_heads_per_thread_choice():
    """QK_HEAD_BATCH heads a thread for prefill; halved for decode-sized launches."""
    from baracuda_numba.kernels.rope.qk import QK_HEAD_BATCH
    from baracuda_numba.plans.rope_qk import qk_heads_per_thread

    def per_thread(rows, q_heads, kv_heads, items=8):
        return qk_heads_per_thread(rows, lambda n: -(-q_heads // n) - (-kv_heads // n), items)

    assert per_thread(2048, 32, 8) == QK_HEAD_BATCH  # 8B prefill 2k: 163840 threads
    assert per_thread(8192, 64, 8) == QK_HEAD_BATCH
    assert per_thread(256, 64, 8) == 2  # 70B decode B = 256
    assert per_thread(1, 32, 8) == 1  # decode B = 1: 320 threads of one head
