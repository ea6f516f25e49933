"""Benchmark harness: ``python scripts/bench.py [--only FAMILY ...] [--out DIR] [--sweep]``.

Needs a GPU, torch and (optionally) CuPy. Each op family has a section module
``scripts/bench_<family>.py`` with ``bench(ctx: Context) -> None`` that adds rows via
``ctx.row(...)``. Every section is timed in the same process as a fresh measurement of
the device-to-device copy bandwidth (the ceiling for memory-bound ops).

Timing: CUDA events around each call after a warm-up, median of many runs; inputs larger
than L2 are rotated (several input sets, used in turn) so L2 does not serve them; never
zeros. Host time: a loop of ``plan.run`` calls measured with the wall clock, then one
synchronise.

Output:

* data: ``benchmarks/results/<gpu-slug>/<YYYY-MM-DD>.csv`` (or ``<out>/results/...`` when
  ``--out`` is given), one line per row or note with the family, the row's figures, the
  device and the versions; a rerun of a family on the same day replaces that family's lines;
* tables, generated from that data: ``<out>/benchmarks/<family>.md`` per section, and
  ``<out>/BENCHMARKS.md`` rebuilt from all section files (so sections measured in separate
  runs stay side by side, each with its own device, date and versions).
  ``--render`` regenerates them from the latest CSV of each family without a GPU.

A run stopped by SIGTERM (``timeout`` on a time-limited machine) still writes the rows of
the section it was in, with a note saying where it stopped, and exits with status 1.

Tuning rows (a non-default kernel variant, a constant swept) run only with ``--sweep``
(``ctx.sweep``) and are added with ``ctx.row(..., tuning=True)``: they go to the CSV only,
never to the published tables, which show the kernels the plans choose, the copy ceiling,
torch and torch.compile.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib
import os
import pathlib
import platform
import re
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

L2_ROTATE_BYTES = 256 << 20  # rotate input sets until they span this much (several L2s)
# GPU spin before each timed call, long enough to hide the host's launch time (torch.compile's
# guards included) behind it; docs/design/launch.md has the measurement that sized it.
SPIN_CYCLES = 1_000_000
#: Spin cycles per µs (about the SM clock in MHz; a faster clock makes the spin shorter,
#: which the factor 2 on the host time covers).
SPIN_CYCLES_PER_US = 2000
#: Columns of the CSV results, in order. ``kind``: ``row`` (published), ``tuning`` (a
#: ``--sweep`` row, CSV only) or ``note`` (a line under the table, in ``note``).
CSV_FIELDS = ("family", "kind", "case", "dtype", "us", "gbps", "pct_copy", "torch_us",
              "speedup", "note", "copy_gbps", "device", "date", "versions")
_FLOAT_FIELDS = ("us", "gbps", "pct_copy", "torch_us", "speedup")


@dataclass
class Context:
    """What a section needs: torch, the copy ceiling, timing helpers, the rows."""

    family: str
    torch: Any
    copy_gbps: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    last_host_loop_us: float = 0.0
    #: True under ``--sweep``: a section may then add tuning rows (``row(..., tuning=True)``).
    sweep: bool = False

    def time_gpu(self, fn: Callable[[int], None], sets: int = 1, warmup: int = 5,
                 iters: int = 50) -> float:
        """Median device time in µs of ``fn(i)`` (``i`` selects the rotated input set).

        A GPU spin (``torch.cuda._sleep``, ~0.5 ms or twice the call's host time) is queued
        before the start event, so the host's launch time (Python + driver) is hidden behind
        it and the events bracket only device work: without it, a 20 µs host launch shows
        up as 20 µs of "kernel"."""
        return self.time_gpu_many([fn], sets, warmup, iters)[0]

    def time_gpu_many(self, fns: Sequence[Callable[[int], None]], sets: int = 1,
                      warmup: int = 5, iters: int = 50) -> list[float]:
        """``time_gpu`` of each of ``fns``, interleaved: every iteration times each function
        once, in turn, so a drift of the GPU's clocks or of the machine over the
        measurement affects all of them alike (this package's kernel against torch's:
        neither is measured first). The input sets rotate call by call, so no call finds
        the previous call's input in L2. The spin before each call lasts at least twice the
        host time of a warmup call (the largest of the functions' medians, within 10 ms): a
        forward+backward through autograd can take more host time than the default spin
        hides, and the row would then read host time."""
        torch = self.torch
        calls = 0
        host: list[list[float]] = [[] for _ in fns]
        for _ in range(warmup):
            for fn, spent in zip(fns, host):
                torch.cuda.synchronize()
                began = time.perf_counter()
                fn(calls % sets)
                spent.append((time.perf_counter() - began) * 1e6)
                calls += 1
        torch.cuda.synchronize()
        host_us = min(max((statistics.median(spent) for spent in host if spent), default=0.0),
                      10_000.0)
        spin = max(SPIN_CYCLES, int(2 * host_us * SPIN_CYCLES_PER_US))
        times: list[list[float]] = [[] for _ in fns]
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        for _ in range(iters):
            for fn, spent in zip(fns, times):
                torch.cuda._sleep(spin)
                start.record()
                fn(calls % sets)
                end.record()
                end.synchronize()
                spent.append(start.elapsed_time(end) * 1e3)
                calls += 1
        return [statistics.median(spent) for spent in times]

    def time_host(self, fn: Callable[[], None], calls: int = 10000) -> float:
        """Host µs per call, measured two ways, reporting the smaller:

        * the issue's method: ``calls`` back-to-back calls by wall clock, then one sync
          (once the launch queue fills, this measures device time per call, not host);
        * bursts of 100 calls after a sync, timed without waiting for the GPU (the queue
          never fills), median over bursts: the host cost alone."""
        torch = self.torch
        for _ in range(100):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        loop = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
        bursts = []
        for _ in range(max(10, calls // 200)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(100):
                fn()
            bursts.append((time.perf_counter() - t0) / 100 * 1e6)
        torch.cuda.synchronize()
        self.last_host_loop_us = loop
        return min(loop, statistics.median(bursts))

    def time_host_many(self, fns: dict[str, Callable[[], None]], rounds: int = 5,
                       bursts: int = 20, wall: bool = False) -> dict[str, float]:
        """Host µs per call of each ``fns`` entry, measured round-robin: in each of
        ``rounds`` rounds every entry gets the median over ``bursts`` bursts of 100 calls
        (each burst started on an idle GPU, so the launch queue never fills); an entry's
        figure is its best round. The GPU machine's CPU speed drifts by tens of percent
        within a minute, so host times measured one after another are not comparable;
        interleaved like this, ratios between entries are. ``wall``: each burst's time ends
        after its work is done on the GPU (wall-clock per call, what a decode step waits
        for: the larger of the host and the device time of a call)."""
        torch = self.torch
        for fn in fns.values():
            for _ in range(100):
                fn()
        torch.cuda.synchronize()
        best = dict.fromkeys(fns, float("inf"))
        for _ in range(rounds):
            for label, fn in fns.items():
                times = []
                for _ in range(bursts):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(100):
                        fn()
                    if wall:
                        torch.cuda.synchronize()
                    times.append((time.perf_counter() - t0) / 100 * 1e6)
                torch.cuda.synchronize()
                best[label] = min(best[label], statistics.median(times))
        return best

    def sets_for(self, bytes_per_set: int) -> int:
        """How many input sets to rotate so the working set exceeds L2."""
        return max(1, min(8, -(-L2_ROTATE_BYTES // max(bytes_per_set, 1))))

    def row(self, case: str, dtype: str, us: float, moved_bytes: int | None = None,
            torch_us: float | None = None, note: str = "", *, tuning: bool = False) -> None:
        """One result row: µs, GB/s and % of copy bandwidth (if bytes given), ratio vs torch.

        ``tuning=True`` marks a row that times a non-default variant: it is written to the
        CSV results only, never to the published tables."""
        gbps = moved_bytes / us / 1e3 if moved_bytes else None
        self.rows.append({
            "case": case, "dtype": dtype, "us": us, "gbps": gbps,
            "pct_copy": (100 * gbps / self.copy_gbps) if gbps and self.copy_gbps else None,
            "torch_us": torch_us,
            "speedup": (torch_us / us) if torch_us else None, "note": note,
            "tuning": tuning,
        })


def measure_copy_gbps(torch: Any) -> float:
    """Device-to-device copy bandwidth (bytes read + written) with torch ``copy_``."""
    nbytes = 1 << 30
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ctx = Context("copy", torch)
    us = ctx.time_gpu(lambda i: dst.copy_(src), warmup=3, iters=20)
    return 2 * nbytes / us / 1e3


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def render(ctx: Context, device: str, versions: str, date: str | None = None,
           previous: tuple[dict[tuple[str, str], float], str] | None = None) -> str:
    """The markdown section of ``ctx``'s published rows (tuning rows left out) and notes;
    ``previous`` (µs by (case, dtype), and its date): the last earlier run on the same GPU
    model, shown beside each row so that a regression is seen."""
    today = date or datetime.date.today().isoformat()
    before, when = previous if previous and previous[0] else ({}, "")
    lines = [f"## {ctx.family}", "",
             f"{device}, {today}; {versions}; copy ceiling measured in the same run: "
             f"{ctx.copy_gbps:.0f} GB/s.", ""]
    extra = f" {when} µs |" if before else ""
    lines.append(f"| case | dtype | µs |{extra} GB/s | % copy | torch µs | speed vs torch | note |")
    lines.append("|---|---|---:|" + ("---:|" if before else "") + "---:|---:|---:|---:|---|")
    for r in ctx.rows:
        if r.get("tuning"):
            continue
        old = f" {_fmt(before.get((r['case'], r['dtype'])), '.2f')} |" if before else ""
        lines.append(f"| {r['case']} | {r['dtype']} | {r['us']:.2f} |{old} "
                     f"{_fmt(r['gbps'], '.0f')} | "
                     f"{_fmt(r['pct_copy'], '.0f')} | {_fmt(r['torch_us'], '.2f')} | "
                     f"{_fmt(r['speedup'], '.2f')}{'x' if r['speedup'] else ''} | {r['note']} |")
    lines += [""] + [f"- {n}" for n in ctx.notes] + [""]
    return "\n".join(lines)


def previous_run(results: pathlib.Path, family: str, slug: str,
                 before: str) -> tuple[dict[tuple[str, str], float], str]:
    """µs by (case, dtype) of ``family``'s last run on GPU ``slug`` dated before ``before``
    (empty if none), and that run's date."""
    for path in sorted((results / slug).glob("*.csv"), key=lambda p: p.stem, reverse=True):
        if path.stem >= before:
            continue
        with path.open(newline="") as handle:
            rows = {(line["case"], line["dtype"]): float(line["us"])
                    for line in csv.DictReader(handle)
                    if line["family"] == family and line["kind"] == "row" and line["us"]}
        if rows:
            return rows, path.stem
    return {}, ""


def rebuild_index(docs: pathlib.Path) -> None:
    sections = sorted((docs / "benchmarks").glob("*.md"))
    parts = ["# Benchmarks", "",
             "Generated by `scripts/bench.py` (one section per op family, each measured on "
             "the GPU named in it, with the copy bandwidth measured in the same run). "
             "Speed vs torch > 1 means baracuda_numba is faster.", "",
             "Timing method: device µs are medians of CUDA-event-timed single calls, each "
             "behind a GPU spin queued before the start event so that the host's launch "
             "time is not counted. The figures are also kept as data, one CSV per GPU and "
             "date under `benchmarks/results/`; tuning sweeps (`--sweep`) go there only. "
             "Host µs (host section, decode rows) are per-call wall-clock times measured "
             "round-robin against the PyTorch reference in the same run.", ""]
    parts += [s.read_text() for s in sections]
    (docs / "BENCHMARKS.md").write_text("\n".join(parts))


def gpu_slug(device: str) -> str:
    """``NVIDIA H200`` -> ``nvidia-h200``: the device name as a folder name."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "unknown-gpu"


def write_csv(results: pathlib.Path, ctx: Context, device: str, versions: str) -> pathlib.Path:
    """Write ``ctx``'s rows (tuning rows included) to ``results/<gpu>/<date>.csv``.

    Lines of other families already in that file are kept; this family's are replaced."""
    today = datetime.date.today().isoformat()
    path = results / gpu_slug(device) / f"{today}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    kept: list[dict[str, str]] = []
    if path.exists():
        with path.open(newline="") as handle:
            kept = [line for line in csv.DictReader(handle) if line.get("family") != ctx.family]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(kept)
        common = dict(family=ctx.family, copy_gbps=f"{ctx.copy_gbps:.1f}", device=device,
                      date=today, versions=versions)
        for r in ctx.rows:
            line = {key: ("" if r.get(key) is None else r.get(key)) for key in CSV_FIELDS}
            line.update(common, kind="tuning" if r.get("tuning") else "row")
            writer.writerow(line)
        for text in ctx.notes:
            writer.writerow(dict(common, kind="note", note=text))
    return path


def read_results(results: pathlib.Path) -> dict[str, tuple[Context, str, str, str]]:
    """The latest results of every family found under ``results/<gpu>/<date>.csv``:
    family -> (a Context holding its rows and notes, device, versions, date)."""
    latest: dict[str, tuple[Context, str, str, str]] = {}
    files = sorted(results.glob("*/*.csv"), key=lambda path: (path.stem, path.parent.name))
    for path in files:
        with path.open(newline="") as handle:
            lines = list(csv.DictReader(handle))
        contexts: dict[str, Context] = {}
        for line in lines:
            family = line["family"]
            ctx = contexts.get(family)
            if ctx is None:
                ctx = contexts[family] = Context(family, None, float(line["copy_gbps"] or 0))
                latest[family] = (ctx, line["device"], line["versions"], line["date"])
            if line["kind"] == "note":
                ctx.notes.append(line["note"])
                continue
            row: dict[str, Any] = {key: (float(line[key]) if line[key] else None)
                                   for key in _FLOAT_FIELDS}
            row.update(case=line["case"], dtype=line["dtype"], note=line["note"],
                       tuning=line["kind"] == "tuning")
            ctx.rows.append(row)
    return latest


def render_results(results: pathlib.Path, out: pathlib.Path,
                   only: Sequence[str] | None = None) -> list[str]:
    """Rewrite ``out/benchmarks/<family>.md`` from the latest CSV results of each family
    (those in ``only``, if given) and rebuild ``out/BENCHMARKS.md``; returns the families."""
    (out / "benchmarks").mkdir(parents=True, exist_ok=True)
    done = []
    for family, (ctx, device, versions, date) in sorted(read_results(results).items()):
        if only and family not in only:
            continue
        previous = previous_run(results, family, gpu_slug(device), date)
        (out / "benchmarks" / f"{family}.md").write_text(
            render(ctx, device, versions, date, previous))
        done.append(family)
    rebuild_index(out)
    return done


def families() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in (ROOT / "scripts").glob("bench_*.py"))


class Stopped(BaseException):
    """SIGTERM during a run (``timeout`` on a time-limited machine): the rows measured so
    far are still written (a BaseException, so the sections' ``except Exception`` guards
    let it through)."""


def _stop(signum: int, frame: Any) -> None:
    raise Stopped(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="families to run")
    parser.add_argument("--workloads", action="store_true",
                        help="the workloads section (real model shapes): --only workloads")
    parser.add_argument("--out", default=None,
                        help="docs folder to write (default: the repository's docs/)")
    parser.add_argument("--results", default=None,
                        help="CSV results folder (default: benchmarks/results/ of the "
                             "repository, or <out>/results when --out is given)")
    parser.add_argument("--sweep", action="store_true",
                        help="also run the sections' tuning rows (written to the CSV only)")
    parser.add_argument("--render", action="store_true",
                        help="no GPU: regenerate the tables from the CSV results and stop")
    options = parser.parse_args(argv)
    if options.workloads:
        options.only = [*(options.only or []), "workloads"]
    out = pathlib.Path(options.out) if options.out else ROOT / "docs"
    if options.results:
        results = pathlib.Path(options.results)
    else:
        results = out / "results" if options.out else ROOT / "benchmarks" / "results"
    if options.render:
        print("rendered:", ", ".join(render_results(results, out, options.only)) or "nothing")
        return 0
    import numba
    import numba_cuda
    import numpy
    import torch

    (out / "benchmarks").mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    versions = (f"torch {torch.__version__}, numba {numba.__version__}, numba-cuda "
                f"{numba_cuda.__version__}, numpy {numpy.__version__}, "
                f"Python {platform.python_version()}")
    try:
        import cupy

        versions += f", cupy {cupy.__version__}"
    except ImportError:
        pass
    signal.signal(signal.SIGTERM, _stop)
    stopped = False
    for family in options.only or families():
        module = importlib.import_module(f"bench_{family}")
        ctx = Context(family, torch, sweep=options.sweep)
        ctx.copy_gbps = measure_copy_gbps(torch)
        print(f"[{family}] copy ceiling {ctx.copy_gbps:.0f} GB/s", flush=True)
        try:
            module.bench(ctx)
        except (Stopped, KeyboardInterrupt) as why:
            stopped = True
            ctx.notes.append(f"This run was stopped ({type(why).__name__}: {why}) after "
                             f"{len(ctx.rows)} row(s); the section's other rows were not "
                             "measured.")
        today = datetime.date.today().isoformat()
        text = render(ctx, device, versions, today,
                      previous_run(results, family, gpu_slug(device), today))
        print(text, flush=True)
        (out / "benchmarks" / f"{family}.md").write_text(text)
        print(f"[{family}] results: {write_csv(results, ctx, device, versions)}", flush=True)
        if os.environ.get("OUT"):
            pathlib.Path(os.environ["OUT"], f"bench_{family}.md").write_text(text)
        if stopped:
            break
    rebuild_index(out)
    return 1 if stopped else 0


if __name__ == "__main__":
    sys.exit(main())
