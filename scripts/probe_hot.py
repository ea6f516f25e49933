"""Hot layout against dict path (GPU only; a probe, session 8).

Same process, same plans: ``plan.run`` with the memo's hot layout, then with the memo's
dict path (``memo.launch = memo._slow``), for WriteSlice, ScanBackward and
FractionalMaxPool with torch tensors and CuPy arrays, next to one torch op. Bursts of 100
calls between synchronises, median of 30 bursts, 5 interleaved rounds (best and median
printed). Then what CuPy's layout attributes cost (``timeit``).
"""

from __future__ import annotations

import statistics
import time
import timeit

import cupy as cp
import torch

import baracuda_numba as bn

F32 = bn.ElementKind.F32


def _cases(lib: str) -> dict:
    """name -> (memo, zero-argument run) for one framework's arrays."""
    if lib == "torch":
        def arr(shape, dtype=torch.float32):
            return torch.zeros(shape, device="cuda", dtype=dtype)
        i64 = torch.int64
    else:
        def arr(shape, dtype=cp.float32):
            return cp.zeros(shape, dtype=dtype)
        i64 = cp.int64
    ws = bn.WriteSlicePlan.select(bn.WriteSliceDescriptor((4, 8, 16), (4, 2, 8),
                                                          ((0, 4), (3, 5), (4, 12)), F32))
    dest, source = arr((4, 8, 16)), arr((4, 2, 8))
    scan_bw = bn.ScanBackwardPlan.select(bn.ScanBackwardDescriptor(
        bn.ScanKind.CUMPROD, (4, 64), 1, element=F32))
    grads = [arr((4, 64)) for _ in range(4)]
    fmp = bn.FractionalMaxPool2dPlan.select(bn.FractionalMaxPool2dDescriptor.new(
        2, 3, 9, 9, 2, 2, 5, 5, F32))
    pool = arr((2, 3, 9, 9)), arr((2, 3, 5, 5)), arr((2, 3, 5, 5), i64), arr((2, 3, 2))
    return {
        "write_slice": (ws._memo, lambda: ws.run(bn.WriteSliceArgs(dest, source))),
        "scan_bw": (scan_bw._memo, lambda: scan_bw.run(bn.ScanBackwardArgs(*grads))),
        "fmp": (fmp._memo_fw, lambda: fmp.run_fw(bn.FractionalMaxPool2dFwArgs(*pool))),
    }


def _burst(fn, calls: int = 100, bursts: int = 30) -> float:
    """Median µs per call over ``bursts`` bursts of ``calls`` calls, each from an idle GPU."""
    times = []
    for _ in range(bursts):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    cases = {f"{lib} {name}": case for lib in ("torch", "cupy")
             for name, case in _cases(lib).items()}
    for name, (memo, fn) in cases.items():
        for _ in range(3):  # checked path, dict hit (made hot), hot
            fn()
        print(name, "hot" if memo.launch is not memo._slow else "NOT HOT")
    z = torch.zeros(32, device="cuda")
    results: dict[str, list[float]] = {}
    for _ in range(5):
        results.setdefault("torch add_", []).append(_burst(lambda: z.add_(1.0)))
        for name, (memo, fn) in cases.items():
            hot = memo.launch
            results.setdefault(name + " hot", []).append(_burst(fn))
            memo.launch = memo._slow
            results.setdefault(name + " dict", []).append(_burst(fn))
            memo.launch = hot
    for name, values in results.items():
        print(f"{name:24s} best {min(values):.2f}  median {statistics.median(values):.2f}")
    a = cp.zeros((4, 64), dtype=cp.float32)
    names = {"a": a, "C": cp.ndarray, "S": a.shape, "T": a.strides, "D": a.dtype}
    for statement in ("a.data.ptr", "a.shape", "a.strides", "a.dtype", "type(a) is C",
                      "(a.shape, a.strides, a.dtype, a.data.ptr & 15)",
                      "a.shape == S and a.strides == T and a.dtype is D"):
        best = min(timeit.repeat(statement, globals=names, number=200000, repeat=5))
        print(f"{best / 200000 * 1e9:7.1f} ns  {statement}")


if __name__ == "__main__":
    main()
