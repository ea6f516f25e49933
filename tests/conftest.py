"""Shared test configuration: simulator choice, markers, the dtype x shape grid and the
tolerance table (one place each).

The simulator is chosen before Numba is imported: with no GPU, ``NUMBA_ENABLE_CUDASIM=1``.
"""

from __future__ import annotations

import os
import sys

from baracuda_numba._detect import use_simulator_without_gpu

SIMULATOR = use_simulator_without_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from baracuda_numba.testing import TOLERANCE  # noqa: E402,F401  (re-exported for tests)
from baracuda_numba.types import ElementKind  # noqa: E402

#: Float kinds every numeric family covers.
FLOAT_ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32, ElementKind.F64)

#: Lengths around the usual block sizes (n-1, n, n+1 of 32 and 256) and one odd length; the
#: simulator (about 0.2 ms per thread) gets the warp edges only.
EDGE_LENGTHS = (31, 32, 33, 7) if SIMULATOR else (31, 32, 33, 255, 256, 257, 1000)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--ptx-all", action="store_true",
                     help="test_ptx: compile every kernel signature for sm_90, not CI's "
                          "sample (same as BARACUDA_PTX_ALL=1)")
    parser.addoption("--several-devices", action="store_true",
                     help="run every plan through the several-device path (device checks, "
                          "launches in the arrays' device context) even where one device "
                          "is visible: devices.force_several_devices()")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--ptx-all"):
        os.environ["BARACUDA_PTX_ALL"] = "1"  # read by test_ptx.start and its processes
    if config.getoption("--several-devices"):
        from baracuda_numba import devices

        devices.force_several_devices(True)


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _overlap_ptx_compile(config, items)
    skip_gpu = pytest.mark.skip(reason="needs a GPU (running in the Numba CUDA simulator)")
    skip_sim = pytest.mark.skip(reason="simulator-only test")
    for item in items:
        if SIMULATOR and "gpu" in item.keywords:
            item.add_marker(skip_gpu)
        if not SIMULATOR and "simulator" in item.keywords:
            item.add_marker(skip_sim)


def _overlap_ptx_compile(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the PTX compile of ``test_ptx`` beside the other tests (it takes one core for
    most of the run): start its process now and move the test, which waits for it, last.
    Under xdist every worker collects every test in one order and the tests are handed
    out in that order: there the compile test goes first instead, so the worker that gets
    it starts the compile at once and waits while the other worker runs the tests."""
    ptx = [item for item in items if item.module.__name__.endswith("test_ptx")]
    if not ptx or len(ptx) == len(items):
        return
    if hasattr(config, "workerinput"):
        items[:] = ptx + [item for item in items if item not in ptx]
        return
    ptx[0].module.start()
    items[:] = [item for item in items if item not in ptx] + ptx


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A run stopped early (``-x``, Ctrl-C) leaves no compile process behind."""
    module = sys.modules.get("test_ptx") or sys.modules.get("tests.test_ptx")
    if module is not None:
        module.stop()


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh, unseeded inputs every run (a correct kernel passes on any valid input)."""
    return np.random.default_rng()


def torch_or_skip():
    """The torch module on a GPU machine with torch installed (else skip)."""
    if SIMULATOR:
        pytest.skip("needs a GPU")
    return pytest.importorskip("torch")


def cupy_or_skip():
    if SIMULATOR:
        pytest.skip("needs a GPU")
    return pytest.importorskip("cupy")


@pytest.fixture
def array_types():
    """``use(torch_tensor=..., cupy_array=...)``: the classes the layout keys take for torch
    tensors and CuPy arrays (``arrays.set_array_types``; one left out keeps its class),
    restored after the test."""
    from baracuda_numba import arrays

    saved = arrays.array_types()
    keep = object()

    def use(torch_tensor=keep, cupy_array=keep):
        torch_now, cupy_now = arrays.array_types()
        arrays.set_array_types(torch_now if torch_tensor is keep else torch_tensor,
                               cupy_now if cupy_array is keep else cupy_array)

    yield use
    arrays.set_array_types(*saved)
