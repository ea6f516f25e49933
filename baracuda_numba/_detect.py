"""Pick the GPU or the Numba CUDA simulator *before* Numba is imported (no Numba here)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os


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
    Returns whether the simulator will be used. Must run before Numba is imported (only
    the test harness and ``baracuda-check`` call this)."""
    if "NUMBA_ENABLE_CUDASIM" not in os.environ and not gpu_present():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
