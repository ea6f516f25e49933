"""Several GPUs in one process (baracuda_numba.devices): the device checks of every plan's
``run``, the plan bound to its device, kernels loaded per context, the launch retry in
another thread's or device's context, and the functional layer launching on the input's
device.

On the CPU the devices are stand-ins: ``devices.pointer_device`` is replaced by a map
from pointers to device ordinals, and the simulator's current device is the one
``devices.on`` sets. The GPU tests at the end use real devices.
"""

from __future__ import annotations

import ctypes
import threading
import types as pytypes

import numpy as np
import pytest
from conftest import SIMULATOR, torch_or_skip

from baracuda_numba import arrays, devices, driver, launch, ops, streams
from baracuda_numba.errors import DriverError, InvalidProblem
from baracuda_numba.plans import base
from baracuda_numba.plans.scan import ScanArgs, ScanDescriptor, ScanPlan
from baracuda_numba.testing import poisoned, random_values
from baracuda_numba.types import ElementKind, ScanKind

SHAPE = (3, 33)
ELEMENT = ElementKind.F32

#: Tests whose devices are faked over the simulator's host arrays (a real GPU has one
#: device here and real device arrays; the gpu tests below cover it).
simulated = pytest.mark.skipif(not SIMULATOR, reason="fakes devices over simulator arrays")


@pytest.fixture
def several():
    """The several-device path forced on for the test (and restored), with a fresh
    functional-layer cache on both sides."""
    ops.clear_plan_cache()
    previous = devices.force_several_devices(True)
    yield
    devices.force_several_devices(previous)
    ops.clear_plan_cache()


@pytest.fixture
def placed(monkeypatch):
    """``place(array, device)``: say that ``array``'s memory is on ``device`` (every other
    pointer: the device current when it is asked, as a fresh allocation would be)."""
    where: dict[int, int] = {}
    monkeypatch.setattr(arrays, "pointer_device",
                        lambda pointer: where.get(pointer, devices.current_device()))

    def place(array, device):
        host = array if isinstance(array, np.ndarray) else array._ary  # simulator's arrays
        pointer = host.ctypes.data
        where[pointer] = device
        return array

    place.where = where
    return place


@pytest.fixture
def launched_on(monkeypatch):
    """The current device at each kernel launch (the simulator launches through Numba's
    dispatcher: ``Kernel._launch_dispatcher``)."""
    seen: list[int] = []
    original = launch.Kernel._launch_dispatcher

    def recording(self, *args, **kwargs):
        seen.append(devices.current_device())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(launch.Kernel, "_launch_dispatcher", recording)
    return seen


def scan_plan():
    return ScanPlan.select(ScanDescriptor(ScanKind.CUMSUM, SHAPE, 1, element=ELEMENT))


def assert_cumsum(y, x):
    """``y`` is the f32 row cumsum of ``x``: within f32 rounding of each step (a bound
    on the running sum of magnitudes, not on the sum, which may cancel to near 0)."""
    exact = np.cumsum(x.astype(np.float64), axis=1)
    bound = SHAPE[1] * np.finfo(np.float32).eps * np.cumsum(np.abs(x.astype(np.float64)), 1)
    assert (np.abs(np.asarray(y, np.float64) - exact) <= bound).all()


def inputs(rng):
    x = random_values(SHAPE, ELEMENT, rng)
    return x, poisoned(SHAPE, ELEMENT)


# -- the decision -------------------------------------------------------------------------


@simulated
def test_one_device_process_wraps_nothing_and_reads_no_device(monkeypatch, rng):
    """With one device (the simulator), a plan's ``run`` is the class's own method and no
    device of an array or stream is read."""
    previous = devices.force_several_devices(False)
    try:
        def boom(*_):
            raise AssertionError("a device was read in a one-device process")

        monkeypatch.setattr(base, "array_device", boom)
        monkeypatch.setattr(base, "stream_device", boom)
        plan = scan_plan()
        assert plan.device is None and "run" not in vars(plan)
        x, y = inputs(rng)
        plan.run(ScanArgs(x, y))
        assert_cumsum(y, x)
    finally:
        devices.force_several_devices(previous)


@simulated
def test_forced_mode_wraps_run_and_binds_the_current_device(several):
    plan = scan_plan()
    assert plan.device == 0 and "run" in vars(plan)
    with devices.on(1):
        assert devices.current_device() == 1
        other = scan_plan()
    assert devices.current_device() == 0
    assert other.device == 1


# -- the checks, before any launch ---------------------------------------------------------


@simulated
def test_arrays_on_two_devices_raise_naming_them_and_write_nothing(several, placed, rng,
                                                                    launched_on):
    plan = scan_plan()
    x, y = inputs(rng)
    placed(x, 0)
    placed(y, 1)
    with pytest.raises(InvalidProblem, match=r"ScanPlan: arrays and stream must be on one "
                                             r"device, got x on device 0; y on device 1"):
        plan.run(ScanArgs(x, y))
    assert np.isnan(y).all() and launched_on == []


@simulated
def test_stream_on_another_device_raises(several, placed, rng, launched_on):
    plan = scan_plan()
    x, y = inputs(rng)
    stream = pytypes.SimpleNamespace(device=pytypes.SimpleNamespace(index=3), cuda_stream=7)
    with pytest.raises(InvalidProblem, match=r"x, y on device 0; stream on device 3"):
        plan.run(ScanArgs(x, y), stream)
    assert np.isnan(y).all() and launched_on == []


@simulated
def test_arrays_on_another_device_than_the_plan_raise(several, placed, rng, launched_on):
    plan = scan_plan()  # device 0
    x, y = inputs(rng)
    placed(x, 2)
    placed(y, 2)
    with pytest.raises(InvalidProblem, match=r"ScanPlan: x, y on device 2, but this plan was "
                                             r"selected on device 0"):
        plan.run(ScanArgs(x, y))
    assert np.isnan(y).all() and launched_on == []


@simulated
def test_a_plan_of_another_device_runs_there_whatever_the_current_one(several, placed, rng,
                                                                       launched_on):
    with devices.on(1):
        plan = scan_plan()
    x, y = inputs(rng)
    placed(x, 1)
    placed(y, 1)
    plan.run(ScanArgs(x, y))
    assert_cumsum(y, x)
    assert launched_on and set(launched_on) == {1}
    assert devices.current_device() == 0


def test_checked_arrays_and_the_message(several, monkeypatch):
    """What the check reads (every field of the args, the items of a tuple field, the
    workspace; None left out, numbers skipped by the device lookup) and how it names
    them; a plan's bound device is kept where nothing has a device."""
    from dataclasses import dataclass
    from typing import Any

    @dataclass(frozen=True)
    class Args:
        x: Any
        items: tuple
        n: int = 5
        absent: Any = None

    a, b, w = object(), object(), object()
    pairs = base._named_arrays(Args(a, (b,)), w)
    assert pairs == [("x", a), ("items[0]", b), ("n", 5), ("workspace", w)]
    table = {id(a): 0, id(b): 1, id(w): 1}
    monkeypatch.setattr(base, "array_device", lambda array: table.get(id(array)))
    with pytest.raises(InvalidProblem, match=r"P: arrays and stream must be on one device, "
                                             r"got x on device 0; items\[0\], workspace on "
                                             r"device 1"):
        base.check_devices("P", pairs, None, None)
    assert base.check_devices("P", [("x", b)], None, 1) == 1
    assert base.check_devices("P", [("n", 5)], None, 4) == 4


@simulated
def test_array_and_stream_devices_of_each_framework(placed):
    """The device readers: a ``__cuda_array_interface__`` object by its pointer, a
    TensorRef by its owner, default streams none, framework streams their own."""
    from baracuda_numba.arrays import as_ref

    class Interface:
        __cuda_array_interface__ = {"data": (0x5000, False), "shape": (4,),
                                    "typestr": "<f4", "version": 3}

    placed.where[0x5000] = 3
    assert arrays.array_device(Interface()) == 3
    host = placed(np.zeros(4, np.float32), 2)
    assert arrays.array_device(as_ref(host, "P", "x")) == 2
    assert arrays.array_device(None) is None and arrays.array_device(7) is None
    assert streams.stream_device(None) is None and streams.stream_device(0) is None
    torch_like = pytypes.SimpleNamespace(device=pytypes.SimpleNamespace(index=1))
    cupy_like = pytypes.SimpleNamespace(device_id=2)
    assert streams.stream_device(torch_like) == 1 and streams.stream_device(cupy_like) == 2


# -- kernels loaded per context -------------------------------------------------------------


@pytest.fixture
def fake_contexts(monkeypatch):
    """A kernel's load path with stand-ins for the driver: ``state.context`` is the
    current context, each ``load_function`` returns a new handle and records where."""
    state = pytypes.SimpleNamespace(context=0xA, loads=[], several=True)
    monkeypatch.setattr(launch, "SIMULATOR", False)
    monkeypatch.setattr(devices, "current_context", lambda: state.context)
    monkeypatch.setattr(devices, "several", lambda: state.several)
    capability = pytypes.SimpleNamespace(device=pytypes.SimpleNamespace(
        compute_capability=(9, 0)))
    monkeypatch.setattr(launch, "cuda", pytypes.SimpleNamespace(
        current_context=lambda: capability))
    monkeypatch.setattr(launch, "cubin_path", lambda kernel, cc: None)
    monkeypatch.setattr(launch.cubin_cache, "lookup_or_fill",
                        lambda path, build: ((b"entry", b"cubin"), False))

    def load_function(cubin, name):
        state.loads.append(state.context)
        return 0x1000 + len(state.loads)

    monkeypatch.setattr(launch, "load_function", load_function)
    return state


def _kernel():
    from numba import types

    return launch.Kernel("fake", lambda a: None, [types.Array(types.float32, 1, "A")],
                         register=False)


def test_several_devices_load_a_kernel_once_per_context(fake_contexts):
    kernel = _kernel()
    assert kernel.resolved() == (0x1001, 0xA)
    fake_contexts.context = 0xB
    assert kernel.function == 0x1002 and kernel.resolved() == (0x1002, 0xB)
    fake_contexts.context = 0xA
    assert kernel.function == 0x1001
    assert fake_contexts.loads == [0xA, 0xB] and kernel.loaded


def test_one_device_keeps_one_handle_and_asks_no_context(fake_contexts, monkeypatch):
    fake_contexts.several = False
    kernel = _kernel()
    assert kernel.function == 0x1001

    def boom():
        raise AssertionError("the current context was asked for")

    monkeypatch.setattr(devices, "current_context", boom)
    assert kernel.function == 0x1001 and kernel.resolved() == (0x1001, 0xA)
    assert fake_contexts.loads == [0xA]


# -- the launch retry --------------------------------------------------------------------------


BOUND, OTHER = 0xB0, 0xC0


@pytest.fixture
def fake_driver(monkeypatch):
    """A context stack per test and a ``cuLaunchKernel`` stand-in that succeeds only while
    the bound context is current (``state.refuse``: fail every launch)."""
    state = pytypes.SimpleNamespace(stack=[], launches=[], refuse=False, calls=[])

    def current():
        return state.stack[-1] if state.stack else 0

    def set_current(context):
        state.calls.append(("set", context))
        if state.stack:
            state.stack[-1] = context
        else:
            state.stack.append(context)

    def push(context):
        state.calls.append(("push", context))
        state.stack.append(context)

    def pop():
        state.calls.append(("pop",))
        state.stack.pop()

    for name, fn in (("context_current", current), ("context_set_current", set_current),
                     ("context_push", push), ("context_pop", pop)):
        monkeypatch.setattr(driver, name, fn)

    def cu_launch(function, *args):
        state.launches.append((current(), args[7], [s.value for s in state.slots]))
        if state.refuse:
            return driver.CU_ERROR_INVALID_CONTEXT
        return 0 if current() == BOUND else driver.CU_ERROR_INVALID_CONTEXT

    state.slots = [ctypes.c_uint64(0), ctypes.c_uint64(0)]
    lib = type("Lib", (), {"cuLaunchKernel": staticmethod(cu_launch)})()
    holder = {}

    def failed(code, stream, *pointers):
        driver.retry_launch(code, BOUND, holder["launch"].attempt, (stream, *pointers),
                            "cuLaunchKernel(fake)")

    holder["launch"] = driver.pointer_launcher(
        0x1234, (1, 1, 1), (32, 1, 1), 0, 0, 0xBEEF, state.slots, threading.Lock(), [True],
        lambda *a: None, failed, binding=("ctypes", lib))
    state.launch = holder["launch"]
    return state


def test_retry_same_context_launches_once(fake_driver):
    fake_driver.stack.append(BOUND)
    fake_driver.launch(5, 0x10, 0x20)
    assert fake_driver.launches == [(BOUND, 5, [0x10, 0x20])] and fake_driver.calls == []


def test_retry_thread_without_context_makes_the_bound_one_current(fake_driver):
    fake_driver.launch(5, 0x10, 0x20)
    assert [c for c, *_ in fake_driver.launches] == [0, BOUND]
    assert fake_driver.launches[-1] == (BOUND, 5, [0x10, 0x20])
    assert fake_driver.calls == [("set", BOUND)] and fake_driver.stack == [BOUND]
    fake_driver.launch(6, 0x30, 0x40)  # later launches from the thread need no retry
    assert fake_driver.launches[-1] == (BOUND, 6, [0x30, 0x40]) and len(fake_driver.calls) == 1


def test_retry_other_device_context_pushes_and_pops(fake_driver):
    fake_driver.stack.append(OTHER)
    fake_driver.launch(5, 0x10, 0x20)
    assert [c for c, *_ in fake_driver.launches] == [OTHER, BOUND]
    assert fake_driver.calls == [("push", BOUND), ("pop",)]
    assert fake_driver.stack == [OTHER]  # the caller's device is what it was


def test_retry_that_fails_raises_driver_error(fake_driver):
    fake_driver.refuse = True
    fake_driver.stack.append(OTHER)
    with pytest.raises(DriverError, match=r"cuLaunchKernel\(fake\) failed") as info:
        fake_driver.launch(5, 0x10, 0x20)
    assert info.value.code == driver.CU_ERROR_INVALID_CONTEXT
    assert len(fake_driver.launches) == 2 and fake_driver.stack == [OTHER]
    other = 700  # not a context error: raised at once, no retry
    with pytest.raises(DriverError):
        driver.retry_launch(other, BOUND, lambda: 0, (), "x")


def test_retry_in_place_when_the_bound_context_is_current(fake_driver):
    """A context error while the bound context is current (made current since the
    failed call) retries in place: no push."""
    fake_driver.stack.append(BOUND)
    driver.retry_launch(driver.CU_ERROR_INVALID_CONTEXT, BOUND, fake_driver.launch.attempt,
                        (9, 0x50, 0x60), "cuLaunchKernel(fake)")
    assert fake_driver.launches == [(BOUND, 9, [0x50, 0x60])] and fake_driver.calls == []


# -- the functional layer ----------------------------------------------------------------------


@pytest.fixture
def allocations(monkeypatch, placed):
    """Numba allocations recorded on the device current when they are made."""
    from numba import cuda

    original = cuda.device_array

    def device_array(*args, **kwargs):
        array = original(*args, **kwargs)
        placed(array, devices.current_device())
        return array

    monkeypatch.setattr(cuda, "device_array", device_array)
    return placed


@simulated
def test_ops_run_on_the_input_device_whatever_the_current_one(several, allocations, rng,
                                                              launched_on):
    x = allocations(random_values(SHAPE, ELEMENT, rng), 1)
    with devices.on(0):
        y = ops.cumsum(x, 1)
    assert_cumsum(y.copy_to_host(), x)
    assert launched_on and set(launched_on) == {1}
    assert arrays.array_device(y) == 1 and devices.current_device() == 0
    plans = [key for key in ops._core._plans.keys() if key[0][0] == "scan"]
    assert plans and all(key[1] == 1 for key in plans)
    # the same call with an input on device 0 gets its own plan and site
    x0 = allocations(random_values(SHAPE, ELEMENT, rng), 0)
    launched_on.clear()
    with devices.on(1):
        ops.cumsum(x0, 1)
    assert set(launched_on) == {0}
    assert sorted(key[1] for key in ops._core._plans.keys() if key[0][0] == "scan") == [0, 1]


def test_torch_layer_runs_on_the_input_device():
    """The torch layer calls ops (see test_ops_run_on_the_input_device...); on a GPU with
    several devices this is test_gpu_plans_on_the_last_device."""
    torch = torch_or_skip()
    x = torch.randn(4, 8, device="cuda")
    import baracuda_numba.torch as bt

    with torch.cuda.device_of(x):
        expected = torch.cumsum(x, 1)
    torch.testing.assert_close(bt.cumsum(x, 1), expected)


# -- on GPUs -----------------------------------------------------------------------------------


def _run_family_calls(torch, bt, device):
    """A few plans through the torch layer with inputs on ``device``: results and the
    torch references."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(4, 257, generator=gen).to(device)
    weight = torch.randn(257, generator=gen).to(device)
    q = torch.randn(1, 8, 1, 64, generator=gen).to(device)  # decode: one token
    positions = torch.tensor([37], device=device)
    results = {
        "cumsum": bt.cumsum(x, 1),
        "sum": bt.sum(x, 1),
        "rms_norm": bt.rms_norm(x, (257,), weight, eps=1e-6),
        "rope": bt.rope(q, positions=positions),
        "softmax": bt.softmax(x, 1),
    }
    variance = x.double().pow(2).mean(-1, keepdim=True)
    half = torch.arange(0, 64, 2, dtype=torch.float64, device=device)
    angles = positions.double()[:, None] * 10000.0 ** (-half / 64)
    cos, sin = torch.cos(angles), torch.sin(angles)
    even, odd = q.double()[..., 0::2], q.double()[..., 1::2]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1).flatten(-2)
    references = {
        "cumsum": torch.cumsum(x, 1), "sum": torch.sum(x, 1),
        "rms_norm": (x.double() * torch.rsqrt(variance + 1e-6) * weight.double()).float(),
        "rope": rotated.float(), "softmax": torch.softmax(x, 1),
    }
    return results, references


@pytest.mark.gpu
def test_gpu_plans_on_the_last_device():
    """With two or more GPUs: inputs on the last one while the current device is GPU 0;
    every result lands there and matches torch; mixing devices raises."""
    torch = torch_or_skip()
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    import baracuda_numba.torch as bt

    assert devices.several()
    last = torch.device("cuda", torch.cuda.device_count() - 1)
    torch.cuda.set_device(0)
    results, references = _run_family_calls(torch, bt, last)
    torch.cuda.synchronize(last)
    assert torch.cuda.current_device() == 0
    for name, result in results.items():
        assert result.device == last, name
        torch.testing.assert_close(result, references[name], rtol=2e-5, atol=2e-5, msg=name)
    x0 = torch.randn(3, 40, device="cuda:0")
    y = torch.full((3, 40), float("nan"), device=last)
    plan = ScanPlan.select(ScanDescriptor(ScanKind.CUMSUM, (3, 40), 1, element=ELEMENT))
    with pytest.raises(InvalidProblem, match=r"x on device 0; y on device"):
        plan.run(ScanArgs(x0, y))
    assert torch.isnan(y).all()


@pytest.mark.gpu
def test_gpu_checked_path_gives_the_same_bits():
    """On any GPU: the several-device path (forced on one GPU) gives the results of the
    one-device path bit for bit."""
    torch = torch_or_skip()
    import baracuda_numba.torch as bt

    device = torch.device("cuda", torch.cuda.current_device())
    ops.clear_plan_cache()
    plain, _ = _run_family_calls(torch, bt, device)
    previous = devices.force_several_devices(True)
    try:
        ops.clear_plan_cache()
        checked, references = _run_family_calls(torch, bt, device)
        checked_again, _ = _run_family_calls(torch, bt, device)  # memo / layout paths
    finally:
        devices.force_several_devices(previous)
        ops.clear_plan_cache()
    torch.cuda.synchronize()
    for name in plain:
        assert torch.equal(plain[name], checked[name]), name
        assert torch.equal(plain[name], checked_again[name]), name
        torch.testing.assert_close(checked[name], references[name], rtol=2e-5, atol=2e-5,
                                   msg=name)


@pytest.mark.gpu
def test_gpu_launch_from_a_new_thread():
    """A launch from a thread with no current context (the retry path) still runs on the
    plan's device."""
    torch = torch_or_skip()
    x = torch.randn(3, 40, device="cuda")
    expected = torch.cumsum(x, 1)
    out: list = []
    thread = threading.Thread(target=lambda: out.append(ops.cumsum(x, 1)))
    thread.start()
    thread.join()
    torch.cuda.synchronize()
    torch.testing.assert_close(out[0], expected)

