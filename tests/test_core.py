"""Core pieces: types, errors, array views, streams, driver fallbacks, launch paths, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
from conftest import SIMULATOR, cupy_or_skip, torch_or_skip
from numba import cuda, float32

import baracuda_numba as bn
from baracuda_numba import ops
from baracuda_numba.arrays import as_mut, as_ref, contiguous_strides, flat_span
from baracuda_numba.errors import (
    BaracudaError,
    BufferTooSmall,
    DriverError,
    InvalidProblem,
    MisalignedOperand,
    Unsupported,
    WorkspaceTooSmall,
)
from baracuda_numba.streams import stream_handle
from baracuda_numba.testing import bf16_bits_to_f32, f32_to_bf16_bits, to_device
from baracuda_numba.types import ElementKind, KernelSku, PlanPreference, ScanKind


def test_element_kinds_match_upstream_widths():
    widths = {ElementKind.F16: 2, ElementKind.BF16: 2, ElementKind.F32: 4, ElementKind.F64: 8,
              ElementKind.COMPLEX32: 8, ElementKind.COMPLEX64: 16, ElementKind.S4: 1,
              ElementKind.BOOL: 1, ElementKind.I64: 8, ElementKind.U32: 4}
    for kind, width in widths.items():
        assert kind.byte_width == width, kind
    assert ElementKind.COMPLEX32.storage_dtype == np.complex64
    assert ElementKind.COMPLEX64.storage_dtype == np.complex128
    assert ElementKind.S4.storage_bits == 4 and ElementKind.S4.is_subbyte
    assert ElementKind.from_dtype("torch.bfloat16") is ElementKind.BF16
    assert ElementKind.from_dtype(np.dtype("float32")) is ElementKind.F32
    assert int(ScanKind.LOG_CUMSUM_EXP) == 4
    with pytest.raises(ValueError):
        ElementKind.from_dtype("float128")


def test_error_hierarchy():
    for exc in (Unsupported, InvalidProblem, BufferTooSmall, MisalignedOperand,
                WorkspaceTooSmall, DriverError):
        assert issubclass(exc, BaracudaError)
    assert issubclass(InvalidProblem, ValueError)
    err = BufferTooSmall("P: x", 10, 3)
    assert (err.needed, err.got) == (10, 3) and "needed 10" in str(err)
    assert DriverError("cuX", 700).code == 700


def test_frozen_dataclasses():
    pref = PlanPreference()
    assert pref.max_workspace_bytes is None and pref.prefer_backend is None
    with pytest.raises(AttributeError):
        pref.max_workspace_bytes = 3  # type: ignore[misc]
    assert "precision_guarantee" in KernelSku.__dataclass_fields__


def test_bf16_round_to_nearest_even():
    values = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf, -np.inf, 3.0e38],
                      dtype=np.float32)
    bits = f32_to_bf16_bits(values)
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0); 1 + 3*2^-8 rounds up.
    assert bf16_bits_to_f32(bits).tolist()[:4] == [1.0, 1.0, 1.015625, -2.5]
    assert np.isinf(bf16_bits_to_f32(bits)[4:6]).all()
    assert np.isnan(bf16_bits_to_f32(f32_to_bf16_bits(np.float32("nan"))))


def test_views_shapes_strides_and_flat_span():
    host = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    dev = to_device(host)
    ref = as_ref(dev, "P", "x", ElementKind.F32, (2, 3, 4))
    assert ref.shape == (2, 3, 4) and ref.strides == (12, 4, 1) and ref.is_contiguous()
    assert contiguous_strides((2, 0, 3)) == (3, 3, 1)
    assert flat_span((2, 3), (10, 2)) == 15 and flat_span((0, 3), (3, 1)) == 0
    with pytest.raises(InvalidProblem, match="P: x has typestr '<f4'"):
        as_ref(dev, "P", "x", ElementKind.F16)
    with pytest.raises(InvalidProblem, match=r"P: x has shape \(2, 3, 4\)"):
        as_ref(dev, "P", "x", ElementKind.F32, (2, 4, 3))
    with pytest.raises(InvalidProblem, match="P: y cannot be used"):
        as_ref(object(), "P", "y")


def test_misaligned_strides_rejected():
    class Fake:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (1024, False),
                                    "strides": (6,), "version": 3}

    with pytest.raises(MisalignedOperand, match="not multiples of the item size 4"):
        as_ref(Fake(), "P", "x")


def test_overlapping_output_rejected():
    class Fake:
        __cuda_array_interface__ = {"shape": (4, 4), "typestr": "<f4", "data": (1024, False),
                                    "strides": (4, 4), "version": 3}

    assert as_ref(Fake(), "P", "x").strides == (1, 1)  # fine as an input (it only reads)
    with pytest.raises(InvalidProblem, match="overlap"):
        as_mut(Fake(), "P", "y")


def test_readonly_interface_rejected_as_output():
    class Fake:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (1024, True),
                                    "strides": None, "version": 3}

    assert as_ref(Fake(), "P", "x").ptr == 1024
    with pytest.raises(InvalidProblem, match="P: y is read-only"):
        as_mut(Fake(), "P", "y")


def test_stream_normalisation():
    class Torchy:
        cuda_stream = 1234

    class Proto:
        def __cuda_stream__(self):
            return (0, 77)

    assert stream_handle(None) == 0 and stream_handle(5) == 5
    stream = Torchy()
    assert stream_handle(stream) == 1234 and stream_handle(stream) == 1234
    assert stream_handle(Proto()) == 77
    with pytest.raises(TypeError, match="not a CUDA stream"):
        stream_handle("nope")


def test_workspace_checks():
    from baracuda_numba.plans.base import Plan

    plan = Plan(None, None, None, workspace_size=64)  # type: ignore[arg-type]
    with pytest.raises(WorkspaceTooSmall):
        plan.check_workspace(None)
    with pytest.raises(WorkspaceTooSmall) as info:
        plan.check_workspace(to_device(np.zeros(8, np.uint8)))
    assert info.value.needed == 64 and info.value.got == 8
    assert plan.check_workspace(to_device(np.zeros(64, np.uint8))) != 0
    with pytest.raises(Unsupported, match="max_workspace_bytes"):
        Plan(None, None, PlanPreference(max_workspace_bytes=8), workspace_size=64)  # type: ignore[arg-type]


def test_package_import_is_lazy():
    code = ("import sys, baracuda_numba; "
            "print(any(m in sys.modules for m in ('numba', 'torch', 'cupy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_check_cli_runs_and_reports(tmp_path):
    report = tmp_path / "check.json"
    env = dict(os.environ)
    result = subprocess.run([sys.executable, "-m", "baracuda_numba.check", "--plans",
                             "write_slice", "--dtypes", "F16", "--json", str(report)],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    first = result.stdout.splitlines()[0]
    assert ("simulator" in first) == SIMULATOR
    data = json.loads(report.read_text())
    assert data["results"] and all(r["passed"] for r in data["results"])
    assert all(r["dtype"] == "F16" for r in data["results"])


def test_lazy_attributes():
    assert bn.WriteSlicePlan.name == "WriteSlicePlan"
    with pytest.raises(AttributeError):
        bn.NoSuchThing  # noqa: B018


@pytest.mark.gpu
def test_torch_extraction_and_cpu_rejection():
    torch = torch_or_skip()
    t = torch.randn(3, 5, device="cuda", requires_grad=True)[:, ::2]
    ref = as_ref(t, "P", "x", ElementKind.F32)
    assert ref.ptr == t.data_ptr() and ref.strides == (5, 2) and ref.shape == (3, 3)
    b = torch.zeros(2, 2, device="cuda", dtype=torch.bfloat16)
    assert as_ref(b, "P", "x", ElementKind.BF16).typestr == "<V2"
    with pytest.raises(InvalidProblem, match="CPU"):
        as_ref(torch.zeros(2), "P", "x")
    stream = torch.cuda.Stream()
    assert stream_handle(stream) == stream.cuda_stream


CUBIN_SNIPPET = r"""
import numpy as np
from numba import cuda, float32
import baracuda_numba as bn
dest = cuda.to_device(np.zeros((4, 8), np.float32))
plan = bn.WriteSlicePlan.select(bn.WriteSliceDescriptor((4, 8), (2, 3), ((1, 3), (2, 5)),
                                                        bn.ElementKind.F32))
plan.run(bn.WriteSliceArgs(dest, cuda.to_device(np.full((2, 3), 7, np.float32))))
out = dest.copy_to_host()
assert (out[1:3, 2:5] == 7).all() and out.sum() == 42, out
print("ok")
"""


@pytest.mark.gpu
def test_cubin_cache_round_trip(tmp_path):
    """A second process loads the kernels from the package's cubin cache and still runs
    them correctly."""
    env = dict(os.environ, BARACUDA_CACHE_DIR=str(tmp_path))
    for attempt in range(2):
        result = subprocess.run([sys.executable, "-c", CUBIN_SNIPPET], env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0 and "ok" in result.stdout, result.stderr
        assert list(tmp_path.glob("*.cubin")), f"attempt {attempt}: nothing cached"


def _dynamic_shared_kernel(out, n):
    """Each block stages ``n`` floats in dynamic shared memory and writes them back in
    reverse: correct only if the whole buffer exists."""
    buf = cuda.shared.array(0, float32)
    tid = cuda.threadIdx.x
    i = tid
    while i < n:
        buf[i] = np.float32(i)
        i += cuda.blockDim.x
    cuda.syncthreads()
    i = tid
    while i < n:
        out[i] = buf[n - 1 - i]
        i += cuda.blockDim.x


def test_dynamic_shared_above_48k():
    """``Kernel.allow_dynamic_shared`` opts a kernel in to more than 48 KiB of dynamic
    shared memory; a launch with 96 KiB then runs (on the GPU; the simulator takes any
    size) and sees all of it."""
    from numba import types

    from baracuda_numba.launch import Kernel, flat

    kernel = Kernel("test_dynamic_shared", _dynamic_shared_kernel,
                    (flat(types.float32), types.int64), register=False)
    n = 96 * 1024 // 4 if not SIMULATOR else 256
    out = to_device(np.zeros(n, np.float32))
    kernel.allow_dynamic_shared(n * 4)
    bound = kernel.bind(1, 256 if not SIMULATOR else 32, ((0, n), n), shared_bytes=n * 4)
    bound(0, as_mut(out, "test", "out").ptr)
    cuda.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), np.arange(n, dtype=np.float32)[::-1])


def test_cooperative_launch():
    """``Kernel.bind(..., cooperative=True)``: the launch goes through
    ``cuLaunchCooperativeKernel`` with one pointer per parameter and runs; on the GPU a
    grid larger than the device holds at once fails with a driver error naming the call
    (it never waits). The simulator runs it through the dispatcher."""
    from numba import types

    from baracuda_numba import driver
    from baracuda_numba.errors import BaracudaError
    from baracuda_numba.launch import Kernel, flat

    kernel = Kernel("test_cooperative", _dynamic_shared_kernel,
                    (flat(types.float32), types.int64), register=False)
    n = 1000 if not SIMULATOR else 64
    block = 256 if not SIMULATOR else 32
    out = to_device(np.zeros(n, np.float32))
    bound = kernel.bind(1, block, ((0, n), n), shared_bytes=n * 4, cooperative=True)
    if not SIMULATOR:
        assert bound.fast.__globals__["call"] is driver.libcuda().cuLaunchCooperativeKernel
        assert bound.params_address and not bound.extra
    bound(0, as_mut(out, "test", "out").ptr)
    cuda.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), np.arange(n, dtype=np.float32)[::-1])
    if not SIMULATOR:
        too_many = kernel.resident_blocks(block) + 1
        with pytest.raises(BaracudaError, match="cuLaunchCooperativeKernel"):
            kernel.bind(too_many, block, ((0, n), n), shared_bytes=n * 4,
                        cooperative=True)(0, as_mut(out, "test", "out").ptr)


def test_pointer_launcher_writes_pointers_then_calls_the_driver():
    """The generated launcher of BoundLaunch.fast (the three driver bindings, faked): pointers
    land in their slots before the one cuLaunchKernel call, with the launch shape and the
    parameter block fixed at bind time; the dispatcher flag reroutes; a failing CUresult
    goes to ``failed`` with the same arguments."""
    import ctypes
    import threading

    from baracuda_numba import driver

    calls = []
    slots = [ctypes.c_uint64(0), ctypes.c_uint64(0)]

    def cu_launch(*args):
        calls.append((args, [s.value for s in slots]))
        return (calls_result[0],)

    class FakeBindings:
        cuLaunchKernel = staticmethod(cu_launch)

        @staticmethod
        def CUfunction(handle):  # noqa: N802 (the driver's name)
            return ("CUfunction", handle)

    class FakeCupyError(Exception):
        def __init__(self, status):
            self.status = status

    def cupy_launch(*args):
        code = cu_launch(*args)[0]
        if code:
            raise FakeCupyError(code)

    FakeCupy = type("FakeCupyDriver", (), {"launchKernel": staticmethod(cupy_launch),
                                           "CUDADriverError": FakeCupyError})
    fake_lib = type("Lib", (), {"cuLaunchKernel": staticmethod(lambda *a: cu_launch(*a)[0])})
    calls_result = [0]
    rerouted, failures = [], []
    direct = [True]
    for backend, binding in (("cupy", FakeCupy), ("bindings", FakeBindings),
                             ("ctypes", fake_lib())):
        calls.clear()
        launch = driver.pointer_launcher(
            0x1234, (3, 2, 1), (128, 1, 1), 48, 0, 0xBEEF, slots, threading.Lock(), direct,
            lambda *a: rerouted.append(a), lambda *a: failures.append(a),
            binding=(backend, binding))
        launch(7, 0x1000, 0x2000)
        args, written = calls[-1]
        function = ("CUfunction", 0x1234) if backend == "bindings" else 0x1234
        params = None if backend == "ctypes" else 0
        assert args == (function, 3, 2, 1, 128, 1, 1, 48, 7, params, 0xBEEF)
        assert written == [0x1000, 0x2000]
        calls_result[0] = 700
        launch(9, 0x3000, 0x4000)
        assert failures[-1] == (700, 9, 0x3000, 0x4000)
        calls_result[0] = 0
        direct[0] = False
        launch(5, 1, 2)
        assert rerouted[-1] == (5, 1, 2) and len(calls) == 2
        direct[0] = True
        # order: the launcher takes a memo's arrays (a0, a1, a2) and reorders them itself
        taking = driver.pointer_launcher(
            0x1234, (3, 2, 1), (128, 1, 1), 48, 0, 0xBEEF, slots, threading.Lock(), direct,
            lambda *a: rerouted.append(a), lambda *a: failures.append(a), ("a2", "0"), 3,
            binding=(backend, binding))
        taking(4, 0x10, 0x20, 0x30)
        assert calls[-1][1] == [0x30, 0] and calls[-1][0][8] == 4
        direct[0] = False
        taking(6, 0x10, 0x20, 0x30)
        assert rerouted[-1] == (6, 0x30, 0)
        direct[0] = True


def test_replay_launcher_maps_recorded_pointers_to_arguments():
    """plans.base.replay_launcher: a recorded launch sequence replays with new array
    pointers in the same roles (0 stays 0); two arrays at one address or a pointer that is
    no array's give None (no memo)."""
    from baracuda_numba.plans.base import replay_launcher

    seen = []

    class Bound:
        def __init__(self, name):
            self.fast = lambda stream, *p: seen.append((name, stream, p))

    first, second = Bound("first"), Bound("second")
    calls = [(first, (0x100, 0x100, 0x200, 0)), (second, (0x200, 0x300, 0))]
    replay = replay_launcher(calls, (0x100, 0x200, 0x300, 0))
    replay(5, 0xA00, 0xB00, 0xC00, 0)
    assert seen == [("first", 5, (0xA00, 0xA00, 0xB00, 0)), ("second", 5, (0xB00, 0xC00, 0))]
    assert replay_launcher(calls, (0x100, 0x100, 0x300, 0)) is None  # aliasing arrays
    assert replay_launcher([(first, (0x108,))], (0x100,)) is None  # a derived pointer
    # inside the workspace (array 1, 64 bytes): its pointer plus the same offset
    replay = replay_launcher([(first, (0x100, 0x200, 0x230))], (0x100, 0x200), (1, 64))
    replay(6, 0xA00, 0xE00)
    assert seen[-1] == ("first", 6, (0xA00, 0xE00, 0xE30))
    assert replay_launcher([(first, (0x240,))], (0x100, 0x200), (1, 64)) is None  # past it
    assert replay_launcher([(first, (0x110,))], (0x100, 0x200), (1, 64)) is None  # another's


def test_store_replay_and_written_pairs(array_types):
    """plans.base.store_replay: the checked path's launches replay through the memo with a
    later call's pointers, an in-place output taking its input's pointer (``aliases``); an
    output overlapping an input falls back to the checked path; a launch pointer that is
    no argument's stores nothing. written_pairs: every written array against every other,
    minus the in-place pairs."""
    from baracuda_numba.plans.base import LAUNCHED, LayoutMemo, store_replay, written_pairs

    assert written_pairs(4, (1, 3)) == ((0, 1), (0, 3), (1, 2), (1, 3), (2, 3))
    assert written_pairs(4, (1, 3), ((0, 1), (2, 3))) == ((0, 3), (1, 2), (1, 3))
    array_types(_FakeTensor, _FakeCupy)
    seen = []

    def bound(stream, *pointers):
        seen.append((stream, pointers))

    def array(ptr):  # a CuPy stand-in (as_ref reads its numpy dtype)
        return _FakeCupy(ptr, (4,), (4,), np.dtype("float32"))

    names = ("x", "y", "k", "k_out")
    x, y, k, k_out = (array(ptr) for ptr in (0x1000, 0x2000, 0x3000, 0x4000))
    memo = LayoutMemo(4, written_pairs(4, (1, 3)))
    key = memo.launch(None, None, x, y, k, k_out)
    store_replay(memo, key, "Plan", names, (x, y, k, k_out),
                 [(bound, (0x1000, 0x2000, 0, 0x3000, 0x4000))])
    moved = [array(ptr) for ptr in (0x5000, 0x6000, 0x7000, 0x8000)]
    assert memo.launch(3, None, *moved) is LAUNCHED
    assert seen == [(3, (0x5000, 0x6000, 0, 0x7000, 0x8000))]
    overlapping = array(0x5008)  # y two elements into x
    assert memo.launch(3, None, moved[0], overlapping, *moved[2:]) not in (None, LAUNCHED)
    # in place (y is x): y's pointer comes from x
    in_place = LayoutMemo(4, written_pairs(4, (1, 3), ((0, 1),)))
    key = in_place.launch(None, None, x, x, k, k_out)
    store_replay(in_place, key, "Plan", names, (x, x, k, k_out),
                 [(bound, (0x1000, 0x1000, 0x3000, 0x4000))], aliases=(1,))
    assert in_place.launch(None, None, moved[0], moved[0], *moved[2:]) is LAUNCHED
    assert seen[-1] == (0, (0x5000, 0x5000, 0x7000, 0x8000))
    # a pointer no argument has (a derived view): nothing stored
    other = LayoutMemo(4, written_pairs(4, (1, 3)))
    key = other.launch(None, None, x, y, k, k_out)
    store_replay(other, key, "Plan", names, (x, y, k, k_out), [(bound, (0x1010,))])
    assert other.layout_count == 0


class _FakeTensor:
    """Stands for a CUDA ``torch.Tensor`` (the attributes ``layout_signature`` reads)."""

    def __init__(self, ptr, shape, strides, dtype="f32", is_cuda=True):
        self._ptr, self.shape, self._strides = ptr, shape, strides
        self.dtype, self.is_cuda = dtype, is_cuda

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._strides


class _FakeCupy:
    """Stands for a CuPy array: ``data.ptr``, byte ``strides``, ``itemsize`` and CuPy's
    ``_c_contiguous`` flag (extents of 1 skipped, as CuPy does)."""

    def __init__(self, ptr, shape, strides, dtype="float32"):
        self.data = types.SimpleNamespace(ptr=ptr)
        self.shape, self.strides, self.dtype = shape, strides, dtype
        self.itemsize = 8 if dtype == "float64" else 4
        step, dense = self.itemsize, True
        for n, stride in zip(reversed(shape), reversed(strides)):
            dense = dense and (n == 1 or stride == step)
            step *= n
        self._c_contiguous = dense or 0 in shape


def test_layout_signature_keys_and_pointers(array_types):
    """arrays.layout_signature (generated per number of arrays): the key holds shape,
    strides, dtype and pointer mod 16 of each tensor or CuPy array (None for an absent
    one), the pointers come back in order (0 for None), and anything but a CUDA tensor
    or CuPy array of the registered types gives None."""
    from baracuda_numba import arrays

    array_types(_FakeTensor, _FakeCupy)
    a = _FakeTensor(0x1004, (2, 3), (3, 1))
    b = _FakeTensor(0x2000, (3,), (1,), "bf16")
    key, pointers = arrays.layout_signature((a, None, b))
    assert key == (((2, 3), (3, 1), "f32", 4), None, ((3,), (1,), "bf16", 0))
    assert pointers == [0x1004, 0, 0x2000]
    assert arrays.layout_signature((a,)) == ((((2, 3), (3, 1), "f32", 4),), [0x1004])
    assert arrays.layout_signature((a, _FakeTensor(0x10, (1,), (1,), is_cuda=False))) is None
    assert arrays.layout_signature((a, object())) is None
    other = _FakeTensor(0x1014, (2, 3), (3, 1))  # same layout key, another address
    assert arrays.layout_signature((other, None, b))[0] == key
    c = _FakeCupy(0x3008, (2, 3), (12, 4))
    assert arrays.layout_signature((c, a)) == (
        (((2, 3), (12, 4), "float32", 8), ((2, 3), (3, 1), "f32", 4)), [0x3008, 0x1004])


def test_layout_memo_launch_and_lookup(array_types):
    """LayoutMemo: a stored layout launches with the stream handle and the pointers and
    returns LAUNCHED; a new layout, other ``extra``, or overlapping arrays that must be
    disjoint return the key without launching; arrays of other types return None."""
    from baracuda_numba.plans.base import LAUNCHED, LayoutMemo

    array_types(_FakeTensor, _FakeCupy)
    seen = []
    memo = LayoutMemo(3, ((1, 0),))
    x = _FakeTensor(0x1000, (4,), (1,))
    y = _FakeCupy(0x2000, (4,), (4,))
    key = memo.launch(None, "e", x, y, None)
    assert key is not None and key is not LAUNCHED and not seen
    assert memo.lookup((x, y, None), "e") == (key, None)
    memo.store(key, lambda *a: seen.append(a), (16, 16, 0))
    assert memo.launch(None, "e", x, y, None) is LAUNCHED
    assert memo.launch(7, "e", x, y, None) is LAUNCHED
    assert seen == [(0, 0x1000, 0x2000, 0), (7, 0x1000, 0x2000, 0)]
    assert memo.lookup((x, y, None), "e")[1][1] == (0x1000, 0x2000, 0)
    assert memo.launch(None, "other", x, y, None) not in (None, LAUNCHED)
    # y on x's bytes: the pair (1, 0) must be disjoint, so the checked path runs
    assert memo.launch(None, "e", x, _FakeCupy(0x1000, (4,), (4,)), None) == key
    assert memo.launch(None, "e", x, _FakeCupy(0x1010, (4,), (4,)), None) is LAUNCHED
    assert memo.launch(None, "e", x, object(), None) is None
    assert len(seen) == 3
    memo.clear()
    assert memo.launch(None, "e", x, y, None) == key


def test_layout_memo_hot_layout_matches_the_dict_path(array_types):
    """LayoutMemo's hot layout (one torch ``TensorGuards`` call instead of per-tensor key
    reads): it launches exactly where the dict path would for the stored key, and falls
    back to the dict path for another shape, stride, dtype, pointer residue mod 16,
    ``requires_grad``, ``extra``, None pattern, overlap of a disjoint pair, or a
    non-tensor. CPU tensors stand for CUDA ones (the guard compares dispatch keys, so a
    CPU guard only passes CPU tensors); clear() drops the hot layout."""
    torch = pytest.importorskip("torch")
    from baracuda_numba.plans.base import LAUNCHED, LayoutMemo

    try:
        torch._C._dynamo.guards.TensorGuards  # noqa: B018 (the class the hot layout uses)
    except AttributeError:
        pytest.skip("this torch has no TensorGuards")
    array_types(torch.Tensor)
    seen, slow = [], []
    memo = LayoutMemo(3, ((1, 0),))

    def dict_path(*a):  # stands for the dict path behind the hot layout
        return slow.append(a) or "slow"

    memo.launch = dict_path
    x = torch.zeros(64)[4:36].view(4, 8)  # pointer residue 0 (the storage is aligned)
    y = torch.zeros(4, 8)
    key = ((tuple(x.shape), x.stride(), x.dtype, x.data_ptr() & 15), (tuple(y.shape),
           y.stride(), y.dtype, y.data_ptr() & 15), None), "e"
    memo.make_hot(key, lambda *a: seen.append(a), (128, 128, 0), x, y, None)
    assert memo.launch is not dict_path
    assert memo.launch(None, "e", x, y, None) is LAUNCHED
    assert memo.launch(5, "e", y, x, None) is LAUNCHED  # same layouts, other pointers
    assert seen == [(0, x.data_ptr(), y.data_ptr(), 0), (5, y.data_ptr(), x.data_ptr(), 0)]
    big = torch.zeros(80)
    misses = [
        ("e", torch.zeros(8, 4), y, None),  # shape
        ("e", torch.zeros(8, 4).t(), y, None),  # strides
        ("e", x.double(), y, None),  # dtype
        ("e", big[1:33].view(4, 8), y, None),  # residue 4, not 0
        ("e", x, torch.zeros(4, 8, requires_grad=True), None),
        ("f", x, y, None),  # extra
        ("e", x, y, torch.zeros(1)),  # None pattern
        ("e", x, x, None),  # y on x's bytes: the pair (1, 0) must be disjoint
        ("e", big[32:64].view(4, 8), big[36:68].view(4, 8), None),  # partial overlap
        ("e", x, y.numpy(), None),  # not a tensor
    ]
    for extra, *args in misses:
        assert memo.launch(None, extra, *args) == "slow"
    assert len(seen) == 2 and len(slow) == len(misses)
    # adjacent but disjoint: the hot layout launches
    assert memo.launch(None, "e", big[32:64].view(4, 8), big[0:32].view(4, 8), None) \
        is LAUNCHED
    # a CuPy layout made hot too tests first, then falls back to the torch one
    array_types(cupy_array=_FakeCupy)
    cx, cy = _FakeCupy(0x1000, (4, 8), (32, 4)), _FakeCupy(0x2000, (4, 8), (32, 4))
    layout = ((4, 8), (32, 4), "float32", 0)
    torch_hot = memo.launch
    memo.make_hot(((layout, layout, None), "e"), lambda *a: seen.append(a), (128, 128, 0),
                  cx, cy, None)
    assert memo.launch is not torch_hot and not memo.promoting
    assert memo.launch(None, "e", cx, cy, None) is LAUNCHED
    assert seen[-1] == (0, 0x1000, 0x2000, 0)
    assert memo.launch(None, "e", x, y, None) is LAUNCHED
    assert seen[-1] == (0, x.data_ptr(), y.data_ptr(), 0)
    assert memo.launch(None, "e", x.double(), y, None) == "slow"
    memo.clear()
    assert not memo.hot and memo.promoting


def test_layout_memo_hot_layout_for_cupy_arrays(array_types):
    """LayoutMemo promotes a CuPy layout after its first dict hit: later calls compare
    shape, strides, dtype and pointer residue inline (no key to build) and launch; any
    difference, a None pattern change, an overlap or another type goes to the dict
    path, which still finds the stored layouts. clear() drops the hot layout."""
    from baracuda_numba.plans.base import LAUNCHED, LayoutMemo

    array_types(_FakeTensor, _FakeCupy)
    seen = []
    memo = LayoutMemo(3, ((1, 0),))
    x, y = _FakeCupy(0x1000, (2, 4), (16, 4)), _FakeCupy(0x2000, (2, 4), (16, 4))
    key = memo.launch(None, "e", x, y, None)
    memo.store(key, lambda *a: seen.append(a), (32, 32, 0))
    slow = memo.launch
    assert memo.launch(None, "e", x, y, None) is LAUNCHED  # dict hit, then promoted
    assert memo.launch is not slow
    assert memo.launch(3, "e", _FakeCupy(0x3010, (2, 4), (16, 4)), y, None) is LAUNCHED
    assert seen[-1] == (3, 0x3010, 0x2000, 0)
    misses = [
        ("e", _FakeCupy(0x1000, (4, 2), (8, 4)), y, None),  # shape and strides
        ("e", _FakeCupy(0x1000, (2, 4), (4, 8)), y, None),  # strides
        ("e", _FakeCupy(0x1000, (2, 4), (16, 4), "float64"), y, None),  # dtype
        ("e", _FakeCupy(0x1004, (2, 4), (16, 4)), y, None),  # residue
        ("f", x, y, None),  # extra
        ("e", x, y, _FakeCupy(0x4000, (1,), (4,))),  # None pattern
        ("e", x, _FakeCupy(0x1010, (2, 4), (16, 4)), None),  # y inside x's span
        ("e", x, _FakeTensor(0x2000, (2, 4), (4, 1)), None),  # another type
    ]
    for extra, *args in misses:
        assert memo.launch(None, extra, *args) is not LAUNCHED
    assert len(seen) == 2  # the dict hit that promoted the layout, one hot launch
    # a second stored layout still launches through the dict path behind the hot one
    other = _FakeCupy(0x5000, (2, 4), (4, 8))
    memo.store(memo.launch(None, "e", other, y, None), lambda *a: seen.append(a), (32, 32, 0))
    assert memo.launch(None, "e", other, y, None) is LAUNCHED and seen[-1][1] == 0x5000
    memo.clear()
    assert memo.launch is slow
    # a C-contiguous layout with every extent >= 2: the flag stands for the strides
    dense = LayoutMemo(2)
    x, y = _FakeCupy(0x1000, (2, 4), (16, 4)), _FakeCupy(0x2000, (2, 3), (12, 4))
    key = dense.launch(None, None, x, y)
    dense.store(key, lambda *a: seen.append(a), (32, 24))
    dense.launch(None, None, x, y)
    assert dense.hot
    assert dense.launch(None, None, _FakeCupy(0x3000, (2, 4), (16, 4)), y) is LAUNCHED
    for other in (_FakeCupy(0x1000, (2, 4), (32, 4)),  # rows apart: not contiguous
                  _FakeCupy(0x1000, (4, 2), (8, 4)),  # contiguous, other shape
                  _FakeCupy(0x1000, (2, 4), (16, 4), "float64")):
        assert dense.launch(None, None, other, y) is not LAUNCHED
    # extents of 1 leave strides free in CuPy's flag: such layouts compare strides
    ones = LayoutMemo(1)
    row = _FakeCupy(0x1000, (1, 4), (16, 4))
    ones.store(ones.launch(None, None, row), lambda *a: seen.append(a), (16,))
    ones.launch(None, None, row)
    assert ones.hot
    odd = _FakeCupy(0x1000, (1, 4), (64, 4))
    assert odd._c_contiguous and ones.launch(None, None, odd) is not LAUNCHED


def _cupy_memo_cases(cp):
    """(name, plan, run(outputs), fresh outputs(), inputs) per family for the CuPy memo
    test: every plan kind with a layout memo, on small shapes."""
    f32 = ElementKind.F32
    rng = cp.random.default_rng(7)
    x = rng.standard_normal((6, 40), dtype=cp.float32) * 0.1 + 1
    dy = rng.standard_normal((6, 40), dtype=cp.float32)
    cases = []
    plain = bn.PlanPreference(max_workspace_bytes=0)  # the memo serves runs without one
    scan = bn.ScanPlan.select(bn.ScanDescriptor(ScanKind.CUMPROD, (6, 40), 1, element=f32),
                              plain)
    y_fw = cp.cumprod(x, axis=1)
    scan_bw = bn.ScanBackwardPlan.select(bn.ScanBackwardDescriptor(
        ScanKind.CUMPROD, (6, 40), 1, element=f32), plain)
    cases.append(("scan", scan, lambda out: scan.run(bn.ScanArgs(x, out[0])), [(6, 40)]))
    cases.append(("scan_bw", scan_bw,
                  lambda out: scan_bw.run(bn.ScanBackwardArgs(dy, out[0], x, y_fw)),
                  [(6, 40)]))
    red = bn.ReducePlan.select(bn.ReduceDescriptor(bn.ReduceKind.SUM, (6, 40), 1, f32), plain)
    cases.append(("reduce", red, lambda out: red.run(bn.ReduceArgs(x, out[0])), [(6, 1)]))
    var = x.var(axis=1, ddof=1, keepdims=True)
    red_bw = bn.ReduceBackwardPlan.select(bn.ReduceBackwardDescriptor(
        bn.ReduceKind.VAR, (6, 40), 1, f32), plain)
    dvar = dy[:, :1].copy()
    cases.append(("reduce_bw", red_bw,
                  lambda out: red_bw.run(bn.ReduceBackwardArgs(dvar, out[0], x, var)),
                  [(6, 40)]))
    pool_x = rng.standard_normal((2, 3, 9, 9), dtype=cp.float32)
    samples = rng.random((2, 3, 2), dtype=cp.float32)
    fmp = bn.FractionalMaxPool2dPlan.select(bn.FractionalMaxPool2dDescriptor.new(
        2, 3, 9, 9, 2, 2, 5, 5, f32))
    cases.append(("fmp", fmp, lambda out: fmp.run_fw(bn.FractionalMaxPool2dFwArgs(
        pool_x, out[0], out[1], samples)), [(2, 3, 5, 5), ((2, 3, 5, 5), cp.int64)]))
    q = rng.standard_normal((2, 3, 4, 8), dtype=cp.float32)
    positions = cp.arange(4, dtype=cp.int64) * 1000
    rope = bn.RopePlan.select(bn.RopeDescriptor(2, 3, 4, 8, element=f32))
    cases.append(("rope", rope, lambda out: rope.run(bn.RopeArgs(q, out[0], positions)),
                  [(2, 3, 4, 8)]))
    source = rng.standard_normal((4, 2, 8), dtype=cp.float32)
    ws = bn.WriteSlicePlan.select(bn.WriteSliceDescriptor((4, 8, 16), (4, 2, 8),
                                                          ((0, 4), (3, 5), (4, 12)), f32))
    cases.append(("write_slice", ws, lambda out: ws.run(bn.WriteSliceArgs(out[0], source)),
                  [(4, 8, 16)]))
    return cases


@pytest.mark.gpu
def test_cupy_memo_matches_the_checked_path():
    """CuPy arrays take the plans' layout memos too: for every plan kind, the first run
    (checked path) and two more with fresh outputs of the same layout (memo path) write
    bit-identical results; an overlapping output with a memoised layout is still rejected
    before any launch."""
    cp = cupy_or_skip()
    for name, plan, run, shapes in _cupy_memo_cases(cp):
        results = []
        for _ in range(3):
            outs = []
            for spec in shapes:
                shape, dtype = spec if isinstance(spec[1], type) else (spec, cp.float32)
                # write_slice writes a window: the rest keeps a finite poison
                poison = -7 if dtype == cp.int64 or name == "write_slice" else cp.nan
                outs.append(cp.full(shape, poison, dtype=dtype))
            run(outs)
            results.append(outs)
        assert plan.layout_memos[0].layout_count == 1, name
        assert all(bool(cp.isfinite(out).all()) for out in results[0]), name
        for outs in results[1:]:
            for got, first in zip(outs, results[0]):
                assert cp.array_equal(got, first), name
    # the memoised ScanBackward layout with dx on x's bytes: rejected, nothing written
    _, scan_bw, _, _ = _cupy_memo_cases(cp)[1]
    x = cp.ones((6, 40), dtype=cp.float32)
    dy = cp.ones((6, 40), dtype=cp.float32)
    scan_bw.run(bn.ScanBackwardArgs(dy, cp.empty_like(x), x, cp.ones_like(x)))
    with pytest.raises(InvalidProblem, match="dx"):
        scan_bw.run(bn.ScanBackwardArgs(dy, x, x, cp.ones_like(x)))
    assert bool((x == 1).all())
    # the hot CuPy layout (contiguous) must not take a same-shape column-major x
    x = cp.random.default_rng(3).random((6, 40), dtype=cp.float32) + 0.5
    y = cp.cumprod(x, axis=1)
    dx = cp.empty_like(x)
    for _ in range(3):
        scan_bw.run(bn.ScanBackwardArgs(dy, dx, x, y))
    assert scan_bw.layout_memos[0].hot
    fortran = cp.asfortranarray(x)
    dx_f = cp.full_like(x, cp.nan)
    scan_bw.run(bn.ScanBackwardArgs(dy, dx_f, fortran, y))
    assert cp.allclose(dx_f, dx, rtol=1e-6, atol=1e-6 * float(cp.abs(dx).max()))


def _memo_workspace_cases(torch):
    """(name, plan, run(outputs, workspace), output shapes) of plans whose layout needs a
    workspace (the split of few long lines): scan and reduce, forward and backward."""
    rng = torch.Generator(device="cuda").manual_seed(5)
    shape = (2, 1 << 20)
    x = torch.rand(shape, device="cuda", generator=rng) + 0.5
    dy = torch.rand(shape, device="cuda", generator=rng)
    f32 = ElementKind.F32
    cases = []
    scan = bn.ScanPlan.select(bn.ScanDescriptor(ScanKind.CUMSUM, shape, 1, element=f32))
    cases.append(("scan", scan, lambda out, ws: scan.run(bn.ScanArgs(x, out[0]),
                                                         workspace=ws), [shape]))
    scan_bw = bn.ScanBackwardPlan.select(bn.ScanBackwardDescriptor(
        ScanKind.LOG_CUMSUM_EXP, shape, 1, element=f32))
    cases.append(("scan_bw", scan_bw, lambda out, ws: scan_bw.run(
        bn.ScanBackwardArgs(dy, out[0], x, torch.logcumsumexp(x, 1)), workspace=ws),
        [shape]))
    for kind in (bn.ReduceKind.SUM, bn.ReduceKind.VAR, bn.ReduceKind.MAX,
                 bn.ReduceKind.LOG_SUM_EXP):
        plan = bn.ReducePlan.select(bn.ReduceDescriptor(kind, shape, 1, f32))
        cases.append((f"reduce {kind.name}", plan, lambda out, ws, plan=plan: plan.run(
            bn.ReduceArgs(x, out[0]), workspace=ws), [(2, 1)]))
    for kind in (bn.ReduceKind.VAR, bn.ReduceKind.MAX):
        plan = bn.ReduceBackwardPlan.select(bn.ReduceBackwardDescriptor(kind, shape, 1, f32))
        saved = x.var(1, keepdim=True) if kind is bn.ReduceKind.VAR else x.amax(1, True)
        cases.append((f"reduce_bw {kind.name}", plan, lambda out, ws, plan=plan, s=saved:
                      plan.run(bn.ReduceBackwardArgs(dy[:, :1].contiguous(), out[0], x, s),
                               workspace=ws), [shape]))
    return cases


@pytest.mark.gpu
def test_torch_memo_with_a_workspace():
    """A plan whose layout needs a workspace keeps a layout memo too, the workspace one
    more of its arrays: repeated runs with a fresh workspace each call replay the checked
    path's launches (bit-identical results, one memoised layout); a smaller workspace is
    another layout and still raises WorkspaceTooSmall before anything is written; the
    functional layer's launch for the same layout writes the same bits."""
    torch = torch_or_skip()
    for name, plan, run, shapes in _memo_workspace_cases(torch):
        assert plan.workspace_size > 0, name
        results = []
        for _ in range(4):
            outs = [torch.full(shape, float("nan"), device="cuda") for shape in shapes]
            run(outs, torch.full((plan.workspace_size,), 255, dtype=torch.uint8,
                                 device="cuda"))
            results.append(outs)
        torch.cuda.synchronize()
        memo = plan.layout_memos[0]
        assert memo.layout_count == 1, name
        assert all(bool(torch.isfinite(out).all()) for out in results[0]), name
        for outs in results[1:]:
            for got, first in zip(outs, results[0]):
                assert torch.equal(got, first), name
        small = torch.empty((plan.workspace_size - 1,), dtype=torch.uint8, device="cuda")
        outs = [torch.full(shape, float("nan"), device="cuda") for shape in shapes]
        with pytest.raises(WorkspaceTooSmall):
            run(outs, small)
        torch.cuda.synchronize()
        assert all(bool(torch.isnan(out).all()) for out in outs), name
    x = torch.rand((2, 1 << 20), device="cuda") + 0.5
    first = ops.cumsum(x, 1)
    for _ in range(3):
        assert torch.equal(ops.cumsum(x, 1), first)
    assert ops.cache_info()["launches"], "the functional layer kept no launch"
    total = ops.logsumexp(x, 1)
    for _ in range(3):
        assert torch.equal(ops.logsumexp(x, 1), total)


@pytest.mark.gpu
def test_torch_hot_layout_falls_back_on_any_change():
    """A plan's memo makes its first repeated torch layout hot (one TensorGuards call);
    other layouts after that (transposed storage, one element past an aligned pointer)
    still give the right gradient, and an aliased output or a wrong dtype is still
    rejected before any launch. Reference: torch.autograd of cumprod in float64."""
    torch = torch_or_skip()
    plan = bn.ScanBackwardPlan.select(bn.ScanBackwardDescriptor(
        ScanKind.CUMPROD, (6, 40), 1, element=ElementKind.F32),
        bn.PlanPreference(max_workspace_bytes=0))  # the memo serves runs without one
    x = torch.rand(6, 40, device="cuda") + 0.5
    dy = torch.randn(6, 40, device="cuda")
    as_ref(x, "test", "x")  # finds torch.Tensor: a process's first tensor has no memo key

    def reference(x, dy):
        x64 = x.double().requires_grad_()
        return torch.autograd.grad(torch.cumprod(x64, 1), x64, dy.double())[0]

    expected = reference(x, dy)
    # each term of dx[i] = sum_j dy[j] prod_{k<=j, k!=i} x[k] carries up to 40 f32
    # roundings: bound the error by 2 * 40 * 2^-24 times the sum of the terms' magnitudes
    bound = 80 * 2.0**-24 * reference(x.abs(), dy.abs()) + 1e-30

    def gradient(x):
        dx = torch.full((6, 40), float("nan"), device="cuda")
        plan.run(bn.ScanBackwardArgs(dy, dx, x, torch.cumprod(x, 1)))
        return dx

    def close(dx):
        return bool(((dx.double() - expected).abs() <= bound).all())

    memo = plan.layout_memos[0]
    assert close(gradient(x)) and not memo.hot  # checked path, stored
    assert close(gradient(x)) and memo.hot  # dict hit, made hot
    assert close(gradient(x))  # hot
    hot = memo.launch
    transposed = x.t().contiguous().t()
    shifted = torch.empty(6 * 40 + 1, device="cuda")[1:].view(6, 40)
    shifted.copy_(x)
    for other in (transposed, shifted, transposed, shifted):
        assert close(gradient(other))
    assert memo.launch is hot and close(gradient(x))
    y = torch.cumprod(x, 1)
    x_before = x.clone()
    with pytest.raises(InvalidProblem, match="dx"):
        plan.run(bn.ScanBackwardArgs(dy, x, x, y))  # dx on x's bytes
    with pytest.raises(InvalidProblem):
        plan.run(bn.ScanBackwardArgs(dy.double(), torch.empty_like(x), x, y))
    assert torch.equal(x, x_before)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cupy", "bindings", "ctypes"])
def test_each_launcher_binding_runs_kernels(monkeypatch, backend):
    """Each ``cuLaunchKernel`` binding of ``driver.pointer_launcher`` (CuPy's typed
    wrapper, ``cuda.bindings``, ctypes) launches a bound kernel with its pointers on the
    given stream, and the generated launcher really calls that binding."""
    from numba import types

    from baracuda_numba import driver
    from baracuda_numba.launch import Kernel, flat

    if SIMULATOR:
        pytest.skip("needs a GPU")
    monkeypatch.setenv("BARACUDA_LAUNCHER", backend)
    driver.launcher.cache_clear()
    try:
        kind, binding = driver.launcher()
        if kind != backend:
            pytest.skip(f"{backend} is not installed")
        kernel = Kernel("test_launcher_binding", _dynamic_shared_kernel,
                        (flat(types.float32), types.int64), register=False)
        n = 1000
        out = to_device(np.zeros(n, np.float32))
        kernel.allow_dynamic_shared(n * 4)
        bound = kernel.bind(1, 256, ((0, n), n), shared_bytes=n * 4)
        called = bound.fast.__globals__["call"]
        expected = binding.launchKernel if kind == "cupy" else binding.cuLaunchKernel
        assert called is expected
        stream = cuda.stream()
        bound.fast(stream_handle(stream), as_mut(out, "test", "out").ptr)
        stream.synchronize()
        np.testing.assert_array_equal(out.copy_to_host(),
                                      np.arange(n, dtype=np.float32)[::-1])
    finally:
        monkeypatch.delenv("BARACUDA_LAUNCHER")
        driver.launcher.cache_clear()


@pytest.mark.simulator
def test_simulator_shuffles_wait_for_their_warp_only():
    """The simulator's shuffle stand-in synchronises the 32 lanes of a warp, not the block:
    warp 0 shuffles before a ``syncthreads`` that warp 1 reaches directly, and warp 1 must
    still see what warp 0 wrote before that barrier (a block barrier inside the shuffle
    would have released warp 1 early). Also a partial last warp (40 threads)."""
    from baracuda_numba.kernels.common import shfl_xor

    @cuda.jit
    def kernel(out):
        shared = cuda.shared.array(1, np.int64)
        tid = cuda.threadIdx.x
        if tid == 0:
            shared[0] = -1
        cuda.syncthreads()
        if tid < 32:
            value = shfl_xor(np.int64(tid), 1)
            if tid == 0:
                shared[0] = value + 100
        cuda.syncthreads()
        out[tid] = shared[0]
        out[tid + 64] = shfl_xor(np.int64(tid), 1)  # warp 1: lanes 32..39 only

    for _ in range(3):
        out = np.full(128, -7, np.int64)
        kernel[1, 40](out)
        np.testing.assert_array_equal(out[:40], 101)
        np.testing.assert_array_equal(out[64:104], np.arange(40) ^ 1)


@pytest.mark.simulator
def test_simulator_barrier_counts_live_threads_and_raises():
    """The simulator's block barrier (``_runtime._Block``): it opens when every thread
    still running waits at it, so threads that returned early do not hold it;
    ``syncthreads_count`` counts the threads that reach it; an exception in one thread
    reaches the caller (the others, waiting at a barrier, are released) and the next
    launch runs normally."""

    @cuda.jit
    def kernel(out, fail):
        shared = cuda.shared.array(64, np.float64)
        tid = cuda.threadIdx.x
        shared[tid] = tid + 1000 * cuda.blockIdx.x
        cuda.syncthreads()
        if tid == 5 and fail[0] == cuda.blockIdx.x:
            raise ValueError("thread 5 fails")
        if tid < 24:  # most of warp 0 leaves
            return
        cuda.syncthreads()
        counted = cuda.syncthreads_count(tid % 3 == 0)
        out[cuda.blockIdx.x, tid] = shared[87 - tid] + counted

    grid = (3, 64)
    out = np.full(grid, -7.0)
    kernel[grid](out, np.array([-1]))
    expected = (87 - np.arange(24, 64)) + 1000 * np.arange(3)[:, None] + 14
    np.testing.assert_array_equal(out[:, 24:], expected)
    np.testing.assert_array_equal(out[:, :24], -7.0)
    with pytest.raises(ValueError, match="thread 5 fails"):
        kernel[grid](np.zeros(grid), np.array([1]))
    out[:] = -7.0
    kernel[grid](out, np.array([-1]))
    np.testing.assert_array_equal(out[:, 24:], expected)


def test_lazy_table_builds_an_entry_on_first_lookup():
    """A LazyTable reads as the whole table without building; a lookup builds one entry
    once; values() builds the rest; an unknown key is a KeyError, get() gives None."""
    from baracuda_numba.launch import LazyTable

    built = []
    table = LazyTable([("a", 1), ("b", 2)], lambda key: built.append(key) or key[1] * 10)
    assert len(table) == 2 and list(table) == [("a", 1), ("b", 2)] and ("b", 2) in table
    assert built == []
    assert table["a", 1] == 10 and table["a", 1] == 10 and built == [("a", 1)]
    assert table.get(("z", 0)) is None and ("z", 0) not in table
    with pytest.raises(KeyError):
        table["z", 0]
    assert table.values() == [10, 20] and built == [("a", 1), ("b", 2)]
