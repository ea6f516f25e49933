"""Whether kernels run on a GPU or in the Numba CUDA simulator.

The simulator is chosen by ``NUMBA_ENABLE_CUDASIM=1`` *before* Numba is imported
(``baracuda-check`` and the test suite set it when no GPU is present).
"""

from __future__ import annotations

from numba.cuda import config as _numba_cuda_config

SIMULATOR: bool = bool(_numba_cuda_config.ENABLE_CUDASIM)

__all__ = ["SIMULATOR"]
