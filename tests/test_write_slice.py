"""WriteSlicePlan: bit-exact window writes, every path, every element width, rejections."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SIMULATOR, cupy_or_skip, torch_or_skip

from baracuda_numba import (
    BackendKind,
    BufferTooSmall,
    ElementKind,
    InvalidProblem,
    PlanPreference,
    Unsupported,
    WriteSliceArgs,
    WriteSliceDescriptor,
    WriteSlicePlan,
)
from baracuda_numba.launch import set_launch_mode
from baracuda_numba.plans.write_slice import WRITE_SLICE_ELEMENTS
from baracuda_numba.testing import random_values, to_device, to_host


def reference(dest: np.ndarray, source: np.ndarray, ranges, nibble: bool = False) -> np.ndarray:
    """NumPy: dest with the window replaced by source (storage units)."""
    out = dest.copy()
    window = [slice(s, e) for s, e in ranges]
    if nibble:
        window[-1] = slice(ranges[-1][0] // 2, ranges[-1][1] // 2)
    out[tuple(window)] = source
    return out


def bits_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape
    mismatch = np.argwhere(a.view(np.uint8).reshape(a.shape + (-1,)) !=
                           b.view(np.uint8).reshape(b.shape + (-1,)))
    assert mismatch.size == 0, f"first byte mismatches at {mismatch[:5].tolist()}"


def storage_shape(shape, element):
    return tuple(shape[:-1]) + (shape[-1] // 2,) if element.is_subbyte else tuple(shape)


def run_case(dest_shape, ranges, element, rng, force_kernel=False, pref=None):
    source_shape = tuple(e - s for s, e in ranges)
    dest_host = random_values(storage_shape(dest_shape, element), element, rng)
    source_host = random_values(storage_shape(source_shape, element), element, rng)
    plan = WriteSlicePlan.select(WriteSliceDescriptor(dest_shape, source_shape, ranges, element),
                                 pref)
    plan.force_kernel = force_kernel
    dest = to_device(dest_host)
    plan.run(WriteSliceArgs(dest, to_device(source_host)))
    bits_equal(to_host(dest), reference(dest_host, source_host, ranges, element.is_subbyte))
    return plan


CASES = [
    # (dest_shape, ranges): whole dest, chunk on axis 0, one partial inner axis (2-D copy),
    # interior box (kernel), rank 1 partial, odd extents.
    ((3, 4, 6), ((0, 3), (0, 4), (0, 6))),
    ((5, 4, 6), ((1, 4), (0, 4), (0, 6))),
    ((2, 5, 4), ((0, 2), (3, 4), (0, 4))),
    ((4, 5, 6), ((1, 3), (2, 5), (1, 5))),
    ((33,), ((7, 30),)),
    ((3, 7, 5), ((0, 3), (1, 6), (2, 5))),
]

ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32, ElementKind.F64, ElementKind.S8,
            ElementKind.BOOL, ElementKind.COMPLEX32, ElementKind.COMPLEX64, ElementKind.I64,
            ElementKind.FP8_E4M3, ElementKind.U32)


@pytest.mark.parametrize("element", ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("dest_shape,ranges", CASES)
def test_paths_bit_exact(dest_shape, ranges, element, rng):
    run_case(dest_shape, ranges, element, rng)


@pytest.mark.parametrize("dest_shape,ranges", CASES[1:4])
def test_kernel_path_matches(dest_shape, ranges, rng):
    for element in (ElementKind.F16, ElementKind.COMPLEX64, ElementKind.U8):
        run_case(dest_shape, ranges, element, rng, force_kernel=True)


@pytest.mark.parametrize("element", (ElementKind.S4, ElementKind.U4), ids=lambda e: e.name)
def test_nibbles(element, rng):
    run_case((3, 8), ((1, 3), (2, 6)), element, rng)
    run_case((4, 6), ((1, 2), (0, 6)), element, rng)


def test_rank8_and_edges(rng):
    shape = (2, 1, 3, 2, 1, 2, 3, 4)
    ranges = ((1, 2), (0, 1), (1, 3), (0, 2), (0, 1), (0, 1), (1, 3), (0, 4))
    run_case(shape, ranges, ElementKind.F32, rng)
    run_case(shape, ranges, ElementKind.BF16, rng, force_kernel=True)


def test_empty_window_writes_nothing(rng):
    dest_host = random_values((4, 5), ElementKind.F32, rng)
    plan = WriteSlicePlan.select(WriteSliceDescriptor((4, 5), (0, 5), ((2, 2), (0, 5)),
                                                      ElementKind.F32))
    dest = to_device(dest_host)
    plan.run(WriteSliceArgs(dest, to_device(np.zeros((0, 5), np.float32))))
    bits_equal(to_host(dest), dest_host)


def test_strided_dest_and_source(rng):
    """Non-contiguous views go to the kernel and stay exact."""
    big_dest = random_values((6, 10, 8), ElementKind.F32, rng)
    big_source = random_values((4, 6, 9), ElementKind.F32, rng)
    dest_dev = to_device(big_dest)
    source_dev = to_device(big_source)
    dest_view = dest_dev[::2, 1:9, ::2]  # shape (3, 8, 4), strides (160, 8, 2)
    source_view = source_dev[1:3, ::2, 2:8:2]  # shape (2, 3, 3)
    ranges = ((1, 3), (2, 5), (0, 3))
    plan = WriteSlicePlan.select(WriteSliceDescriptor((3, 8, 4), (2, 3, 3), ranges,
                                                      ElementKind.F32))
    plan.run(WriteSliceArgs(dest_view, source_view))
    expected = big_dest.copy()
    expected[::2, 1:9, ::2][1:3, 2:5, 0:3] = big_source[1:3, ::2, 2:8:2]
    bits_equal(to_host(dest_dev), expected)


def test_broadcast_source(rng):
    """A 0-stride (broadcast) source is read as many times as needed."""
    from baracuda_numba.arrays import TensorRef

    row = random_values((1, 6), ElementKind.F32, rng)
    dev = to_device(row)
    ref = TensorRef(to_ref_ptr(dev), (4, 6), (0, 1), "<f4", 4, dev)
    dest_host = random_values((5, 6), ElementKind.F32, rng)
    dest = to_device(dest_host)
    plan = WriteSlicePlan.select(WriteSliceDescriptor((5, 6), (4, 6), ((1, 5), (0, 6)),
                                                      ElementKind.F32))
    plan.run(WriteSliceArgs(dest, ref))
    expected = dest_host.copy()
    expected[1:5] = row
    bits_equal(to_host(dest), expected)


def to_ref_ptr(device_array) -> int:
    from baracuda_numba.arrays import as_ref

    return as_ref(device_array, "test", "x").ptr


def test_flat_buffer_accepted_and_too_small_rejected(rng):
    plan = WriteSlicePlan.select(WriteSliceDescriptor((4, 6), (2, 6), ((1, 3), (0, 6)),
                                                      ElementKind.F32))
    dest_host = random_values((24,), ElementKind.F32, rng)
    source_host = random_values((2, 6), ElementKind.F32, rng)
    dest = to_device(dest_host)
    plan.run(WriteSliceArgs(dest, to_device(source_host)))
    expected = dest_host.copy().reshape(4, 6)
    expected[1:3] = source_host
    bits_equal(to_host(dest).reshape(4, 6), expected)
    small = to_device(dest_host[:23].copy())
    with pytest.raises(BufferTooSmall) as info:
        plan.run(WriteSliceArgs(small, to_device(source_host)))
    assert info.value.needed == 24 and info.value.got == 23
    bits_equal(to_host(small), dest_host[:23])


# -- rejections: each raises before anything is written ----------------------------------


def desc(dest_shape=(4, 6), source_shape=(2, 6), ranges=((1, 3), (0, 6)),
         element=ElementKind.F32):
    return WriteSliceDescriptor(dest_shape, source_shape, ranges, element)


@pytest.mark.parametrize("bad,exc,words", [
    (dict(dest_shape=(), source_shape=(), ranges=()), InvalidProblem, "rank 0"),
    (dict(dest_shape=(1,) * 9, source_shape=(1,) * 9, ranges=((0, 1),) * 9), Unsupported,
     "rank 9"),
    (dict(ranges=((3, 5), (0, 6))), InvalidProblem, "ranges[0] = (3, 5)"),
    (dict(ranges=((2, 1), (0, 6))), InvalidProblem, "ranges[0] = (2, 1)"),
    (dict(source_shape=(3, 6)), InvalidProblem, "source_shape[0] = 3"),
    (dict(dest_shape=(4, -6)), InvalidProblem, "dest_shape[1]"),
    (dict(element=ElementKind.BIN), Unsupported, "BIN"),
    (dict(element=ElementKind.S4, ranges=((1, 3), (1, 5)), source_shape=(2, 4)), Unsupported,
     "even"),
    (dict(element=ElementKind.U4, dest_shape=(4, 7), source_shape=(2, 7),
          ranges=((1, 3), (0, 7))), Unsupported, "even"),
    (dict(source_shape=(2, 6, 1)), InvalidProblem, "ranks"),
])
def test_select_rejects(bad, exc, words):
    with pytest.raises(exc) as info:
        WriteSlicePlan.select(desc(**bad))
    assert "WriteSlicePlan" in str(info.value) and words in str(info.value)


def _dest_source(rng, dest_dtype=np.float32, source_dtype=np.float32):
    dest_host = random_values((4, 6), ElementKind.F32, rng).astype(dest_dtype)
    source_host = random_values((2, 6), ElementKind.F32, rng).astype(source_dtype)
    return dest_host, to_device(dest_host), to_device(source_host)


@pytest.mark.parametrize("which", ["dest_dtype", "source_dtype", "dest_shape", "source_shape",
                                   "overlap"])
def test_run_rejects_and_writes_nothing(which, rng):
    plan = WriteSlicePlan.select(desc())
    dest_host, dest, source = _dest_source(
        rng, np.float64 if which == "dest_dtype" else np.float32,
        np.float16 if which == "source_dtype" else np.float32)
    target = dest
    if which == "dest_shape":
        dest_host = random_values((4, 7), ElementKind.F32, rng)
        target = dest = to_device(dest_host)
    if which == "source_shape":
        source = to_device(np.ones((3, 6), np.float32))
    if which == "overlap":
        from baracuda_numba.arrays import TensorMut

        target = TensorMut(to_ref_ptr(dest), (4, 6), (1, 1), "<f4", 4, dest)
    with pytest.raises(InvalidProblem) as info:
        plan.run(WriteSliceArgs(target, source))
    assert "WriteSlicePlan" in str(info.value)
    bits_equal(to_host(dest), dest_host)


@pytest.mark.simulator
def test_readonly_dest_rejected(rng):
    plan = WriteSlicePlan.select(desc())
    dest_host = random_values((4, 6), ElementKind.F32, rng)
    frozen = dest_host.copy()
    frozen.flags.writeable = False
    with pytest.raises(InvalidProblem, match="read-only"):
        plan.run(WriteSliceArgs(frozen, to_device(np.ones((2, 6), np.float32))))
    bits_equal(frozen, dest_host)


def test_driver_2d_copy_on_request(rng):
    """One partial axis goes through cuMemcpy2D when the caller prefers driver copies."""
    pref = PlanPreference(prefer_backend=BackendKind.DRIVER_COPY)
    for element in (ElementKind.F16, ElementKind.COMPLEX64):
        plan = run_case((2, 5, 4), ((0, 2), (3, 4), (0, 4)), element, rng, pref=pref)
        assert plan.sku.backend is BackendKind.DRIVER_COPY
    assert run_case((2, 5, 4), ((0, 2), (3, 4), (0, 4)), ElementKind.F16,
                    rng).sku.backend is BackendKind.BESPOKE


def test_sku_reports_path():
    assert WriteSlicePlan.select(desc()).sku.backend is BackendKind.DRIVER_COPY
    box = desc(dest_shape=(4, 6), source_shape=(2, 3), ranges=((1, 3), (1, 4)))
    plan = WriteSlicePlan.select(box)
    assert plan.sku.backend is BackendKind.BESPOKE
    assert plan.precision_guarantee.deterministic and plan.workspace_size == 0
    assert set(WRITE_SLICE_ELEMENTS) == set(ElementKind) - {ElementKind.BIN}


# -- GPU only: frameworks, streams, launch paths, graphs, > 2^31 elements ----------------


TORCH_DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "bool", "complex64"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_tensors_on_a_side_stream(dtype):
    torch = torch_or_skip()
    tdtype = getattr(torch, dtype)
    element = ElementKind.from_dtype(tdtype)
    dest = (torch.randn(6, 10, 8, device="cuda") * 10).to(tdtype)
    source = (torch.randn(2, 10, 3, device="cuda") * 10).to(tdtype)
    expected = dest.clone()
    expected[3:5, :, 4:7] = source
    plan = WriteSlicePlan.select(WriteSliceDescriptor((6, 10, 8), (2, 10, 3),
                                                      ((3, 5), (0, 10), (4, 7)), element))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        plan.run(WriteSliceArgs(dest, source), stream=stream)
    stream.synchronize()
    assert torch.equal(dest.view(torch.uint8) if dtype != "bool" else dest,
                       expected.view(torch.uint8) if dtype != "bool" else expected)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32", "int8", "bool", "complex64", "float64"])
def test_cupy_arrays(dtype):
    cp = cupy_or_skip()
    element = ElementKind.from_dtype(dtype)
    dest = (cp.random.standard_normal((5, 7, 9)) * 10).astype(dtype)
    source = (cp.random.standard_normal((5, 2, 9)) * 10).astype(dtype)
    expected = dest.copy()
    expected[:, 3:5, :] = source
    plan = WriteSlicePlan.select(WriteSliceDescriptor((5, 7, 9), (5, 2, 9),
                                                      ((0, 5), (3, 5), (0, 9)), element))
    plan.run(WriteSliceArgs(dest, source), stream=cp.cuda.Stream.null)
    cp.cuda.Device().synchronize()
    assert bool((dest.view(cp.uint8) == expected.view(cp.uint8)).all())


@pytest.mark.gpu
def test_strided_torch_views_and_requires_grad():
    torch = torch_or_skip()
    base = torch.randn(8, 16, 12, device="cuda", dtype=torch.bfloat16)
    dest = base[::2, 2:14, ::3]  # (4, 12, 4) non-contiguous
    source = torch.randn(12, 5, 4, device="cuda", requires_grad=True).to(torch.bfloat16)
    source = source.transpose(0, 1)[1:4]  # (3, 12, 4) non-contiguous, requires grad
    expected = base.clone()
    expected[::2, 2:14, ::3][1:4] = source.detach()
    plan = WriteSlicePlan.select(WriteSliceDescriptor((4, 12, 4), (3, 12, 4),
                                                      ((1, 4), (0, 12), (0, 4)),
                                                      ElementKind.BF16))
    plan.run(WriteSliceArgs(dest, source))
    torch.cuda.synchronize()
    assert torch.equal(base.view(torch.int16), expected.view(torch.int16))


@pytest.mark.gpu
def test_direct_and_dispatcher_launches_agree(rng):
    for mode in ("dispatcher", "direct"):
        set_launch_mode(mode)
        try:
            for dest_shape, ranges in CASES[1:4]:
                for element in (ElementKind.F16, ElementKind.F64, ElementKind.COMPLEX64):
                    run_case(dest_shape, ranges, element, rng, force_kernel=True)
        finally:
            set_launch_mode("direct")


@pytest.mark.gpu
def test_cuda_graph_capture_replays():
    torch = torch_or_skip()
    cache = torch.zeros(4, 2, 16, 8, device="cuda", dtype=torch.float16)
    token = torch.empty(4, 2, 1, 8, device="cuda", dtype=torch.float16)
    plans = [WriteSlicePlan.select(WriteSliceDescriptor((4, 2, 16, 8), (4, 2, 1, 8),
                                                        ((0, 4), (0, 2), (p, p + 1), (0, 8)),
                                                        ElementKind.F16)) for p in range(3)]
    box = WriteSlicePlan.select(WriteSliceDescriptor((4, 2, 16, 8), (4, 2, 1, 4),
                                                     ((0, 4), (0, 2), (5, 6), (2, 6)),
                                                     ElementKind.F16))
    small = torch.empty(4, 2, 1, 4, device="cuda", dtype=torch.float16)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=stream):
        for plan in plans:
            plan.run(WriteSliceArgs(cache, token), stream=stream)
        box.run(WriteSliceArgs(cache, small), stream=stream)
    for step in range(2):
        token.normal_()
        small.normal_()
        cache.zero_()
        graph.replay()
        torch.cuda.synchronize()
        expected = torch.zeros_like(cache)
        for p in range(3):
            expected[:, :, p:p + 1] = token
        expected[:, :, 5:6, 2:6] = small
        assert torch.equal(cache, expected), f"replay {step}"


@pytest.mark.gpu
def test_more_than_2_31_elements():
    """64-bit index arithmetic: a window ending past element 2^31 of a 2^31+ tensor."""
    torch = torch_or_skip()
    rows, cols = 65537, 32768  # 2^31 + 32768 int8 elements (2 GiB)
    dest = torch.zeros(rows, cols, device="cuda", dtype=torch.int8)
    source = torch.randint(-100, 100, (3, cols - 8), device="cuda", dtype=torch.int8)
    desc_ = WriteSliceDescriptor((rows, cols), (3, cols - 8), ((rows - 3, rows), (5, cols - 3)),
                                 ElementKind.S8)
    plan = WriteSlicePlan.select(desc_)
    plan.run(WriteSliceArgs(dest, source))
    torch.cuda.synchronize()
    assert torch.equal(dest[rows - 3:, 5:cols - 3], source)
    assert int(dest[:rows - 3].abs().sum()) == 0 and int(dest[rows - 3:, :5].abs().sum()) == 0
    view = dest[:, ::2]  # strided dest: the kernel path with > 2^31 addressed span
    plan2 = WriteSlicePlan.select(WriteSliceDescriptor((rows, cols // 2), (2, 4),
                                                       ((rows - 2, rows), (100, 104)),
                                                       ElementKind.S8))
    patch = torch.full((2, 4), 7, device="cuda", dtype=torch.int8)
    plan2.run(WriteSliceArgs(view, patch))
    torch.cuda.synchronize()
    assert torch.equal(dest[rows - 2:, 200:208:2], patch)
    del dest


def test_simulator_flag_matches_environment():
    import os

    assert SIMULATOR == (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1")


@pytest.mark.gpu
@pytest.mark.parametrize("force_kernel", [False, True], ids=["copy", "kernel"])
def test_torch_fast_path_with_fresh_tensors(force_kernel):
    """After the first run a layout goes through the memo (no array checks); fresh
    tensors of the same layout must still land in the right window, and a tensor of
    another layout (or dtype) must still be checked and rejected."""
    torch = torch_or_skip()
    plan = WriteSlicePlan.select(WriteSliceDescriptor((6, 10, 8), (2, 10, 8),
                                                      ((3, 5), (0, 10), (0, 8)),
                                                      ElementKind.F32))
    plan.force_kernel = force_kernel
    for _ in range(3):
        dest = torch.randn(6, 10, 8, device="cuda")
        source = torch.randn(2, 10, 8, device="cuda")
        expected = dest.clone()
        expected[3:5] = source
        plan.run(WriteSliceArgs(dest, source))
        assert torch.equal(dest, expected)
    with pytest.raises(InvalidProblem, match="typestr"):
        plan.run(WriteSliceArgs(dest, source.double()))
    with pytest.raises(InvalidProblem, match="shape"):
        plan.run(WriteSliceArgs(dest, source[:, :, :4]))
