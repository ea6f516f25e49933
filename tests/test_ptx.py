"""Every registered kernel signature compiles to PTX for sm_80 and sm_90 (no GPU needed).

The simulator ignores signatures, so this is what proves the real kernels type-check.
Runs in a subprocess without the simulator (NVVM comes from numba-cuda's cu12/cu13 extra).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)], ids=["sm_80", "sm_90"])
def test_every_signature_compiles_to_ptx(cc):
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["NUMBA_ENABLE_CUDASIM"] = "0"
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(cc[0]), str(cc[1])],
                            capture_output=True, text=True, env=env, timeout=1500)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "compiled" in result.stdout
