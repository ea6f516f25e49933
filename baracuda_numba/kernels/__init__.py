"""Device code only: ``@cuda.jit`` kernels and device functions, one module per op family.

Each module ends with its dtype table, from which its :class:`~baracuda_numba.launch.Kernel`
objects (one per registered signature) are built at import.
"""
