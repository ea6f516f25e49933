"""Pick the GPU or the Numba CUDA simulator *before* Numba is imported (no Numba here)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

#: Python's GIL switch interval under the simulator, in seconds (the default is 5 ms). The
#: simulator runs each CUDA thread of a block as a Python thread, and its block manager
#: polls them in a busy loop that holds the GIL for a whole interval at a time; a block of
#: 192 threads that meets barriers (``syncthreads``, and the simulator's warp shuffles)
#: then waits in that loop most of the time. At 0.2 ms, barrier-heavy tests run 3-4x
#: faster (measured on a 2-core CI-class machine; 0.1-0.2 ms is the sweet spot, shorter
#: costs more in switching).
SIMULATOR_SWITCH_INTERVAL = 2e-4


def gpu_present() -> bool:
    """True if the CUDA driver loads and reports at least one device."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
        if lib.cuInit(0) != 0:
            return False
        count = ctypes.c_int(0)
        return lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    except OSError:
        return False


def use_simulator_without_gpu() -> bool:
    """Set ``NUMBA_ENABLE_CUDASIM=1`` if no GPU is present (and the caller did not choose).
    Returns whether the simulator will be used. Must run before Numba is imported.

    For the simulator it also sets the process's GIL switch interval to
    :data:`SIMULATOR_SWITCH_INTERVAL` (only the test harness and ``baracuda-check`` call
    this)."""
    if "NUMBA_ENABLE_CUDASIM" not in os.environ and not gpu_present():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    if simulator:
        sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL)
    return simulator
