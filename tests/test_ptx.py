"""Every registered kernel signature compiles to PTX for sm_90, and every kernel body for
sm_80 (no GPU needed).

The simulator ignores signatures, so this is what proves the real kernels type-check.
Runs in subprocesses without the simulator (NVVM comes from numba-cuda's cu12/cu13 extra).
sm_90 gets every signature, split over two processes (CI has 2 cores); sm_80, the oldest
architecture the plans target (``ArchSku.SM80``), gets every bf16 kernel (the conversions
and inline PTX that need sm_80) and one signature of every other kernel name (the part
before ``[``): every body, at a fraction of the compile time.
"""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = r"""
import sys
from baracuda_numba.launch import compile_all_ptx, registered_kernels
cc = (int(sys.argv[1]), int(sys.argv[2]))
part, parts, sample = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "sample"
kernels = registered_kernels()
assert len(kernels) == len({k.name for k in kernels}), "kernel names must be unique"
if sample:
    first = {}
    for k in kernels:
        first.setdefault(k.name.split("[")[0], k.name)
    chosen = set(first.values()) | {k.name for k in kernels if "BF16" in k.name.upper()}
else:
    chosen = {k.name for k in kernels[part::parts]}
ptx = compile_all_ptx(cc, only=lambda k: k.name in chosen)
assert set(ptx) == chosen, sorted(chosen - set(ptx))
for name, text in ptx.items():
    assert ".entry" in text, name
print(f"compiled {len(ptx)} signatures for sm_{cc[0]}{cc[1]}")
"""


def test_every_signature_compiles_to_ptx():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    jobs = {("sm_90", "part 0"): ("9", "0", "0", "2", "all"),
            ("sm_90", "part 1"): ("9", "0", "1", "2", "all"),
            ("sm_80", "one per kernel"): ("8", "0", "0", "1", "sample")}
    processes = {label: subprocess.Popen([sys.executable, "-c", SCRIPT, *argv],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, env=env)
                 for label, argv in jobs.items()}
    for label, process in processes.items():
        out, err = process.communicate(timeout=3000)
        assert process.returncode == 0, f"{label}:\n{out}\n{err}"
        assert "compiled" in out, out
