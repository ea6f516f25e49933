"""Every registered kernel signature compiles to PTX for sm_80 and sm_90 (no GPU needed).

The simulator ignores signatures, so this is what proves the real kernels type-check.
Runs in a subprocess without the simulator (NVVM comes from numba-cuda's cu12/cu13 extra).
"""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = r"""
import sys
from baracuda_numba.launch import compile_all_ptx, registered_kernels
cc = (int(sys.argv[1]), int(sys.argv[2]))
kernels = registered_kernels()
ptx = compile_all_ptx(cc)
assert len(ptx) == len({k.name for k in kernels}), "kernel names must be unique"
for name, text in ptx.items():
    assert ".entry" in text, name
print(f"compiled {len(ptx)} signatures for sm_{cc[0]}{cc[1]}")
"""


def test_every_signature_compiles_to_ptx_for_sm80_and_sm90():
    """Both compute capabilities compile concurrently (one process each: CI has 2 cores)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    processes = {cc: subprocess.Popen([sys.executable, "-c", SCRIPT, str(cc[0]), str(cc[1])],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env)
                 for cc in ((8, 0), (9, 0))}
    for cc, process in processes.items():
        out, err = process.communicate(timeout=2400)
        assert process.returncode == 0, f"sm_{cc[0]}{cc[1]}:\n{out}\n{err}"
        assert "compiled" in out, out
