"""Every registered kernel signature compiles to PTX for sm_90, and every kernel body for
sm_80 (no GPU needed).

The simulator ignores signatures, so this is what proves the real kernels type-check.
Runs in a subprocess without the simulator (NVVM comes from numba-cuda's cu12/cu13 extra).
sm_90 gets every signature; sm_80, the oldest architecture the plans target
(``ArchSku.SM80``), gets one signature of every kernel name (the part before ``[``) and
one bf16 signature of every kernel name that has one (the conversions and inline PTX that
need sm_80): every body, at a fraction of the compile time.

The compile runs beside the rest of the suite, in two processes that take the signatures
from the two ends of one list, each claiming a signature (a file created exclusively in a
shared folder) before compiling it: ``conftest.py`` starts them right after collection
(:func:`start`) and moves this test to the end of the run, where it only waits for them.
CI has 2 cores: the simulator tests take one and the first process the other; the second
process runs at idle priority (``SCHED_IDLE``: only on a core nothing else is ready to
use; the tests still ran somewhat slower beside it, where two processes at nice 10 slowed
them about 3x: CONTRIBUTING.md), and once the simulator tests end it has a core of its
own. Run alone (or under xdist) the test starts the processes itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

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
import os
import sys

from baracuda_numba.launch import compile_all_ptx, registered_kernels

claims, backward = sys.argv[1], sys.argv[2] == "backward"
kernels = registered_kernels()
assert len(kernels) == len({k.name for k in kernels}), "kernel names must be unique"
sample = {}
for k in kernels:
    base = k.name.split("[")[0]
    sample.setdefault(base, k)
    if "BF16" in k.name.upper():
        sample.setdefault(base + "[bf16]", k)
jobs = [((9, 0), k) for k in kernels]
jobs += [((8, 0), k) for k in dict.fromkeys(sample.values())]
ptx = {(9, 0): {}, (8, 0): {}}
for at in reversed(range(len(jobs))) if backward else range(len(jobs)):
    try:  # claim the job: the other process skips it
        os.close(os.open(os.path.join(claims, str(at)), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        continue
    cc, kernel = jobs[at]
    text = compile_all_ptx(cc, only=lambda k: k is kernel)[kernel.name]
    assert ".entry" in text, kernel.name
    ptx[cc][kernel.name] = text
for cc, done in ptx.items():
    total = sum(1 for job_cc, _ in jobs if job_cc == cc)
    print(f"compiled {len(done)} of {total} signatures for sm_{cc[0]}{cc[1]}", flush=True)
check_packed_layouts(ptx[(9, 0)])
"""

#: The compile processes (see the module docstring) and the folder of their claims.
_processes: list[subprocess.Popen] = []
_claims: tempfile.TemporaryDirectory | None = None


def _idle_priority() -> None:
    """In the second compile process before it runs: the idle scheduling class, where
    Linux has it (else the lowest nice value)."""
    if hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    else:
        os.nice(19)


def start() -> None:
    """Start the two compile processes (once); their output is read by the test."""
    global _claims
    if _processes:
        return
    _claims = tempfile.TemporaryDirectory(prefix="baracuda-ptx-")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    for direction in ("forward", "backward"):
        _processes.append(subprocess.Popen(
            [sys.executable, "-c", SCRIPT, _claims.name, direction], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=_idle_priority if direction == "backward" and os.name == "posix"
            else None))


def stop() -> None:
    """Kill compile processes still running (a run stopped early)."""
    for process in _processes:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_every_signature_compiles_to_ptx():
    """Both processes succeed, and between them compile every job exactly once (each
    claims a job before compiling it, so no job twice; the counts add up to the jobs)."""
    start()
    compiled = {"sm_90": 0, "sm_80": 0}
    totals = {}
    for process in _processes:
        out, err = process.communicate(timeout=3600)
        assert process.returncode == 0, f"{out}\n{err}"
        assert "packed layouts match" in out, out
        for arch in compiled:
            counts = re.findall(rf"compiled (\d+) of (\d+) signatures for {arch}", out)
            assert len(counts) == 1, out
            compiled[arch] += int(counts[0][0])
            totals[arch] = int(counts[0][1])
    assert compiled == totals, (compiled, totals)
    assert totals["sm_90"] > totals["sm_80"] > 0, totals
