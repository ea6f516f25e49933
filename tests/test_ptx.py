"""Every kernel body compiles to PTX for sm_90 and sm_80 (no GPU needed).

The simulator ignores signatures, so this is what proves the real kernels type-check.
Runs in a subprocess without the simulator (NVVM comes from numba-cuda's cu12/cu13 extra).

CI's time is a budget (CONTRIBUTING.md, "CI's time budget"), so CI compiles a sample that
still reaches every kernel body: per body (the kernel name before ``[``; the configurations
of one factory share its source, and the simulator tests run each of them) one f32
signature and one 16-bit signature (bf16, else f16) for sm_90, or the first signature
where it has neither; for sm_80, the oldest architecture the plans target
(``ArchSku.SM80``), one signature of every kernel name (the part before ``[``): its bf16
one where it has one (the conversions and inline PTX that need sm_80).
``BARACUDA_PTX_ALL=1`` or ``pytest --ptx-all`` compiles every signature for sm_90 instead;
the GPU-side ``precompile`` compiles every signature anyway.

The compile runs beside the rest of the suite, in two processes that take the signatures
from the two ends of one list, each claiming a signature (a file created exclusively in a
shared folder) before compiling it: ``conftest.py`` starts them right after collection
(:func:`start`) and moves this test to the end of the run, where it only waits for them;
under xdist (CI runs ``-n 2``) it moves this test first instead, so one worker starts the
processes at once and waits for them while the other runs the simulator tests.
CI has 2 cores: the simulator tests take one and the first process the other; the second
process runs at idle priority (``SCHED_IDLE``: only on a core nothing else is ready to
use; the tests still ran somewhat slower beside it, where two processes at nice 10 slowed
them about 3x: CONTRIBUTING.md), and once the simulator tests end it has a core of its
own. Run alone (or under xdist) the test starts the processes itself.
"""

from __future__ import annotations

import inspect
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
        assert kernel.packable, f"{name}: a parameter type has no packed format"
        entry = text[text.index(".entry"):]
        declared = re.findall(r"\.param\s+\.[a-z]+(\d+)\s+\S+?(\[\d+\])?\s*[,)]",
                              entry[:entry.index(")") + 1])
        assert all(not count for _, count in declared), f"{name}: an aggregate parameter"
        fields = [sizes[c] for c in kernel.packed_format.lstrip("@")]
        assert [int(bits) // 8 for bits, _ in declared] == fields, name
    print(f"packed layouts match the PTX parameters of {len(ptx)} kernels", flush=True)
"""

# Which signatures CI compiles (the module docstring). The compile subprocess runs the
# same functions: their source goes into its script (``_SAMPLE``).
_DTYPE_TOKENS = {"half", "f16", "bf16", "f32", "f64", "i32", "i64", "1b", "2b", "4b", "8b", "16b"}
_F32 = ("f32", "4b")
_HALF = ("half", "bf16", "f16", "2b")


def _split_name(name):
    """``base[tok,...]`` -> (configuration key, dtype token or None)."""
    base, _, rest = name.partition("[")
    tokens = [t for t in rest.rstrip("]").split(",") if t] if rest else []
    config = tuple(t for t in tokens if t.lower() not in _DTYPE_TOKENS)
    dtypes = [t.lower() for t in tokens if t.lower() in _DTYPE_TOKENS]
    return (base, config), (dtypes[0] if dtypes else None)


def sm90_sample(kernels):
    """Per kernel body (the name before ``[``), one f32 and one 16-bit signature (else the
    first one): configurations of one factory share their body's source, and the GPU-side
    ``precompile`` compiles every signature."""
    groups = {}
    for kernel in kernels:
        (base, _), dtype = _split_name(kernel.name)
        groups.setdefault(base, {}).setdefault(dtype, kernel)
    picked = []
    for by_dtype in groups.values():
        chosen = [next(by_dtype[d] for d in wanted if d in by_dtype)
                  for wanted in (_F32, _HALF) if any(d in by_dtype for d in wanted)]
        picked += chosen or [next(iter(by_dtype.values()))]
    return picked


def sm80_sample(kernels):
    """One signature per kernel name: its first bf16 (or f16/bf16 "half") signature, else
    its first."""
    sample = {}
    for kernel in kernels:
        base = kernel.name.split("[")[0]
        if base not in sample or (_split_name(kernel.name)[1] in ("bf16", "half")
                                  and _split_name(sample[base].name)[1] not in ("bf16", "half")):
            sample[base] = kernel
    return list(sample.values())


_SAMPLE = "\n".join([f"_DTYPE_TOKENS = {_DTYPE_TOKENS!r}", f"_F32 = {_F32!r}",
                      f"_HALF = {_HALF!r}"]
                     + [inspect.getsource(f) for f in (_split_name, sm90_sample, sm80_sample)])

SCRIPT = _CHECK_PACKED + _SAMPLE + r"""
import os
import sys

from baracuda_numba.launch import kernel_ptx, registered_kernels

claims, backward, everything = sys.argv[1], sys.argv[2] == "backward", sys.argv[3] == "all"
kernels = registered_kernels()
assert len(kernels) == len({k.name for k in kernels}), "kernel names must be unique"
# a job is a kernel and its architectures: one front-end compile serves both (kernel_ptx)
wanted = {}
for cc, sample in (((9, 0), kernels if everything else sm90_sample(kernels)),
                   ((8, 0), sm80_sample(kernels))):
    for kernel in sample:
        wanted.setdefault(kernel.name, (kernel, []))[1].append(cc)
jobs = list(wanted.values())
ptx = {(9, 0): {}, (8, 0): {}}
for at in reversed(range(len(jobs))) if backward else range(len(jobs)):
    try:  # claim the job: the other process skips it
        os.close(os.open(os.path.join(claims, str(at)), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        continue
    kernel, ccs = jobs[at]
    for cc, text in kernel_ptx(kernel, ccs).items():
        assert ".entry" in text, kernel.name
        ptx[cc][kernel.name] = text
for cc, done in ptx.items():
    total = sum(1 for _, ccs in jobs if cc in ccs)
    print(f"compiled {len(done)} of {total} signatures for sm_{cc[0]}{cc[1]} "
          f"({len(kernels)} registered)", flush=True)
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


def start(everything: bool = False) -> None:
    """Start the two compile processes (once); their output is read by the test.
    ``everything`` (or ``BARACUDA_PTX_ALL=1``): every signature for sm_90, not the sample."""
    global _claims
    if _processes:
        return
    everything = everything or os.environ.get("BARACUDA_PTX_ALL", "0") not in ("", "0")
    _claims = tempfile.TemporaryDirectory(prefix="baracuda-ptx-")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    for direction in ("forward", "backward"):
        _processes.append(subprocess.Popen(
            [sys.executable, "-c", SCRIPT, _claims.name, direction,
             "all" if everything else "sample"], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=_idle_priority if direction == "backward" and os.name == "posix"
            else None))


def stop() -> None:
    """Kill compile processes still running (a run stopped early)."""
    for process in _processes:
        if process.poll() is None:
            process.kill()
            process.communicate()


class _Named:
    def __init__(self, name):
        self.name = name


def test_ci_sample_reaches_every_body():
    """The sample rule on names: per kernel body f32 + bf16 (else f16, else the first),
    byte widths stand for dtypes, a name without brackets is its own body."""
    names = ["reduce[sum,f16]", "reduce[sum,bf16]", "reduce[sum,f32]", "reduce[sum,f64]",
             "reduce[max,f64]", "reduce[max,f16]", "scan[I64,sum,4]", "scan[I32,sum,2]",
             "scan[F64,sum,4]", "write[1B]", "write[2B]", "write[4B]", "write[8B]",
             "angles", "pool[F16,1x2x2]", "pool[F64,1x2x2]"]
    picked = [k.name for k in sm90_sample([_Named(n) for n in names])]
    assert picked == ["reduce[sum,f32]", "reduce[sum,bf16]", "scan[I64,sum,4]", "write[4B]",
                      "write[2B]", "angles", "pool[F16,1x2x2]"]
    old = [k.name for k in sm80_sample([_Named(n) for n in names])]
    assert old == ["reduce[sum,bf16]", "scan[I64,sum,4]", "write[1B]", "angles",
                   "pool[F16,1x2x2]"]


def test_every_kernel_body_compiles_to_ptx():
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
    assert totals["sm_90"] > 0 and totals["sm_80"] > 0, totals
