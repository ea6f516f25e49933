"""Every registered kernel signature compiles to PTX for sm_90, and every kernel body for
sm_80 (no GPU needed).

The simulator ignores signatures, so this is what proves the real kernels type-check.
Runs in a subprocess without the simulator (NVVM comes from numba-cuda's cu12/cu13 extra).
sm_90 gets every signature; sm_80, the oldest architecture the plans target
(``ArchSku.SM80``), gets one signature of every kernel name (the part before ``[``) and
one bf16 signature of every kernel name that has one (the conversions and inline PTX that
need sm_80): every body, at a fraction of the compile time.

The compile is one process that runs beside the rest of the suite: ``conftest.py`` starts
it right after collection (:func:`start`) and moves this test to the end of the run, where
it only waits for the result. CI has 2 cores: the simulator tests take one, the compile
the other. Run alone (or under xdist) the test starts the process itself.
"""

from __future__ import annotations

import os
import subprocess
import sys

# Every kernel's parameters go to the driver as one packed buffer (cuLaunchKernel's
# ``extra``): its struct must have one field per PTX parameter, of the same size (every
# field is a scalar at its natural alignment, so equal sizes mean equal offsets).
_CHECK_PACKED = r"""
import re


def check_packed_layouts(ptx):
    sizes = {"q": 8, "Q": 8, "d": 8, "i": 4, "I": 4, "f": 4, "?": 1}
    by_name = {k.name: k for k in registered_kernels()}
    for name, text in ptx.items():
        kernel = by_name[name]
        assert kernel._packable, f"{name}: a parameter type has no packed format"
        entry = text[text.index(".entry"):]
        declared = re.findall(r"\.param\s+\.[a-z]+(\d+)\s+\S+?(\[\d+\])?\s*[,)]",
                              entry[:entry.index(")") + 1])
        assert all(not count for _, count in declared), f"{name}: an aggregate parameter"
        fields = [sizes[c] for c in kernel._packed.format.lstrip("@")]
        assert [int(bits) // 8 for bits, _ in declared] == fields, name
    print(f"packed layouts match the PTX parameters of {len(ptx)} kernels", flush=True)
"""

SCRIPT = _CHECK_PACKED + r"""
from baracuda_numba.launch import compile_all_ptx, registered_kernels
kernels = registered_kernels()
assert len(kernels) == len({k.name for k in kernels}), "kernel names must be unique"
every = {k.name for k in kernels}
sample = {}
for k in kernels:
    base = k.name.split("[")[0]
    sample.setdefault(base, k.name)
    if "BF16" in k.name.upper():
        sample.setdefault(base + "[bf16]", k.name)
for cc, chosen in (((9, 0), every), ((8, 0), set(sample.values()))):
    ptx = compile_all_ptx(cc, only=lambda k: k.name in chosen)
    assert set(ptx) == chosen, sorted(chosen - set(ptx))
    for name, text in ptx.items():
        assert ".entry" in text, name
    print(f"compiled {len(ptx)} signatures for sm_{cc[0]}{cc[1]}", flush=True)
    if cc == (9, 0):
        check_packed_layouts(ptx)
"""


_process: subprocess.Popen | None = None


def start() -> None:
    """Start the compile process (once); its output is read by the test."""
    global _process
    if _process is None:
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
        _process = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env)


def test_every_signature_compiles_to_ptx():
    start()
    out, err = _process.communicate(timeout=3600)
    assert _process.returncode == 0, f"{out}\n{err}"
    assert "compiled" in out and "sm_90" in out and "sm_80" in out, out
    assert "packed layouts match" in out, out
