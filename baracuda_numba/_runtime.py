"""Whether kernels run on a GPU or in the Numba CUDA simulator.

The simulator is chosen by ``NUMBA_ENABLE_CUDASIM=1`` *before* Numba is imported
(``baracuda-check`` and the test suite set it when no GPU is present).

Under the simulator this module also makes ``cuda.shared.array`` race-free (see
:func:`_shared_array`) and replaces the block manager's busy-polling barrier with one
that waits on a condition (see :class:`_Block`).
"""

from __future__ import annotations

import sys
import threading

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
    simulator failures once seen with a 0.2 ms GIL switch interval went with the
    warp-level shuffle barrier of ``kernels.common``). ``dict.setdefault`` is atomic
    under the GIL. The key comes from the caller's frame rather than
    ``traceback.extract_stack`` (which also reads every frame's source line): the same
    key, at a fraction of the cost.
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


class _Block:
    """The barrier state of one simulated block, for numba-cuda 0.30's ``BlockManager``.

    numba-cuda runs each CUDA thread of a block as a Python thread and finds the moment
    every live thread waits in ``syncthreads`` by polling all of them in a loop
    (``is_alive`` and a flag per thread) that competes for the GIL with the threads it
    waits for: in a barrier-heavy kernel the block spends most of its time there (a
    reduce gradient test: 5 million ``is_alive`` calls, about 17 ms per CUDA thread).
    Here a thread that arrives counts itself under one lock; the last of the live threads
    to arrive (or to exit, leaving the others all waiting) releases the barrier, and the
    block manager sleeps until every thread has exited or one has raised. The rule is
    numba-cuda's: a barrier opens when every thread still running waits at one.

    With no poller to starve, Python's default GIL switch interval (5 ms) is the fastest
    measured (the harness had set 0.2 ms to shorten the poller's turns; with this
    barrier, 0.05 / 0.2 / 1 / 5 / 20 ms took 62 / 61 / 57 / 33-38 / 40 s on one set of
    barrier-heavy tests, where numba-cuda's manager had taken 3-8x longer).
    """

    def __init__(self, threads: int):
        self.lock = threading.Lock()
        self.opened = threading.Condition(self.lock)  # the barrier: waiting threads
        self.settled = threading.Condition(self.lock)  # the manager: all exited or failed
        self.live = threads
        self.waiting = 0
        self.generation = 0
        self.failed = None

    def _open_if_all_wait(self):  # holds the lock
        if self.waiting and self.waiting == self.live:
            self.waiting = 0
            self.generation += 1
            self.opened.notify_all()

    def wait(self, thread):
        with self.lock:
            generation = self.generation
            self.waiting += 1
            self._open_if_all_wait()
            while self.generation == generation and not thread.abort:
                self.opened.wait()

    def exited(self, thread):
        with self.lock:
            self.live -= 1
            if thread.exception is not None and self.failed is None:
                self.failed = thread
            self._open_if_all_wait()
            if self.live == 0 or self.failed is not None:
                self.settled.notify()

    def abort(self, threads):
        with self.lock:
            for thread in threads:
                thread.abort = True
            self.opened.notify_all()


def _syncthreads(self):
    """``BlockThread.syncthreads`` on :class:`_Block` (numba-cuda's abort checks kept)."""
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads call")
    self._manager._baracuda_block.wait(self)
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads clear")


def _block_thread_run(self):
    try:
        _simulator_thread_run(self)  # records an exception in ``self.exception``
    finally:
        self._manager._baracuda_block.exited(self)


def _block_manager_run(self, grid_point, *args):
    """``BlockManager.run`` on :class:`_Block`: start the block's threads, sleep until
    they have all exited or one has raised, and raise the first exception."""
    from numba.cuda.simulator.kernel import BlockThread

    def target():
        self._f(*args)

    points = list(np.ndindex(*self._block_dim))
    block = self._baracuda_block = _Block(len(points))
    threads = [BlockThread(target, self, grid_point, point, self._debug)
               for point in points]
    for thread in threads:
        thread.start()
    with block.lock:
        while block.live and block.failed is None:
            block.settled.wait()
        failed = block.failed
    if failed is not None:
        block.abort(threads)  # waiting threads raise out of their barrier
        raise failed.exception[0].with_traceback(failed.exception[1])
    for thread in threads:
        thread.join()


if SIMULATOR:
    from numba.cuda.simulator import kernel as _kernel
    from numba.cuda.simulator import kernelapi as _kernelapi

    _kernelapi.FakeCUDAShared.array = _shared_array
    _simulator_thread_run = _kernel.BlockThread.run
    _kernel.BlockThread.run = _block_thread_run
    _kernel.BlockThread.syncthreads = _syncthreads
    _kernel.BlockManager.run = _block_manager_run

__all__ = ["SIMULATOR"]
