"""Whether kernels run on a GPU or in the Numba CUDA simulator.

The simulator is chosen by ``NUMBA_ENABLE_CUDASIM=1`` *before* Numba is imported
(``baracuda-check`` and the test suite set it when no GPU is present).

Under the simulator this module also makes ``cuda.shared.array`` race-free (see
:func:`_shared_array`).
"""

from __future__ import annotations

import sys

import numpy as np
from numba.cuda import config as _numba_cuda_config

SIMULATOR: bool = bool(_numba_cuda_config.ENABLE_CUDASIM)


def _shared_array(self, shape, dtype, alignment=None):
    """``FakeCUDAShared.array`` of numba-cuda 0.30 without its check-then-set race.

    The simulator runs each CUDA thread as a Python thread and gives every thread of a
    launch the same array for one ``cuda.shared.array`` call site, kept in a dict keyed by
    (file, line). numba-cuda looks the key up, allocates on a miss and then stores; a
    thread switch between the two lets two threads each store their own array, so the
    block no longer shares it (a stress test did not reproduce it; the sporadic
    simulator failures seen with a 0.2 ms GIL switch interval went with the warp-level
    shuffle barrier of ``kernels.common``). ``dict.setdefault`` is atomic under the GIL.
    The key comes from the caller's frame rather than ``traceback.extract_stack`` (which
    also reads every frame's source line): the same key, at a fraction of the cost.
    """
    from numba.cuda import types
    from numba.cuda.np import numpy_support

    if alignment is not None:
        raise RuntimeError("Array alignment is not supported in cudasim")
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    if shape == 0:  # dynamic shared memory: one buffer for every such call
        count = self._dynshared_size // dtype.itemsize
        return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
    frame = sys._getframe(1)
    caller = (frame.f_code.co_filename, frame.f_lineno)
    found = self._allocations.get(caller)
    if found is None:
        found = self._allocations.setdefault(caller, np.empty(shape, dtype))
    return found


if SIMULATOR:
    from numba.cuda.simulator import kernelapi as _kernelapi

    _kernelapi.FakeCUDAShared.array = _shared_array

__all__ = ["SIMULATOR"]
