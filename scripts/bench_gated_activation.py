"""Benchmark section ``gated_activation``: SwiGLU / GeGLU forward, backward and
forward+backward on Llama-sized MLP activations, against torch eager, ``torch.compile``
(default mode, compiled before timing) and Liger-Kernel (``LigerSiLUMulFunction``,
``LigerGELUMulFunction``: tanh GeGLU) where installed.

Rows: ``[tokens, I]`` outputs; "two tensors" = gate and up ``[tokens, I]``; "one tensor" =
x ``[tokens, 2I]`` holding ``[gate | up]`` (torch and Liger take ``x.chunk(2, -1)``): the
issue's bf16 ``[8192, 14336]``, ``[16384, 28672]`` (one tensor), ``[4096, 11008]`` and f32
``[8192, 14336]``.
Bytes counted: forward = gate + up read, y written (3 · N · itemsize); backward = dy,
gate, up read, dgate, dup written (5 · N · itemsize); forward+backward = the sum. Each row
also times ``copy_`` of the same bytes in the same run (``copy`` column of the note: our
time over the copy's, the issue's 85 % target being copy/ours >= 0.85).
``GATED_BENCH_ONLY=swiglu`` (or geglu) limits the kinds.
"""

from __future__ import annotations

import os
from typing import Any

from baracuda_numba import torch as bt
from baracuda_numba.plans.gated_activation import (
    GatedActivationArgs,
    GatedActivationBackwardArgs,
    GatedActivationBackwardPlan,
    GatedActivationDescriptor,
    GatedActivationPlan,
)
from baracuda_numba.types import ElementKind, GatedActivationKind

K = GatedActivationKind
#: (tokens, I, one tensor, dtype): the issue's rows (Llama-3-8B, Llama-2-7B intermediates)
SHAPES = [(8192, 14336, False, "bfloat16"), (16384, 14336, True, "bfloat16"),
          (4096, 11008, False, "bfloat16"), (8192, 14336, False, "float32")]
#: (label, kind, approximate, torch formula name, Liger class name)
KINDS = [("SwiGLU", K.SWIGLU, "none", "silu", "LigerSiLUMulFunction"),
         ("GeGLU tanh", K.GEGLU, "tanh", "gelu_tanh", "LigerGELUMulFunction"),
         ("GeGLU erf", K.GEGLU, "none", "gelu", None)]


_COMPILED: dict[str, Any] = {}


def _formula(torch: Any, name: str) -> Any:
    F = torch.nn.functional
    if name == "silu":
        return lambda g, u: F.silu(g) * u
    if name == "gelu_tanh":
        return lambda g, u: F.gelu(g, approximate="tanh") * u
    return lambda g, u: F.gelu(g) * u


def _liger(name: str | None) -> Any:
    if name is None:
        return None
    try:
        if name == "LigerSiLUMulFunction":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction as found
        else:
            from liger_kernel.ops.geglu import LigerGELUMulFunction as found
    except Exception:  # noqa: BLE001 - not installed: no Liger column
        return None
    return found.apply


def _print_row(ctx: Any) -> None:
    """Echo the last row (and append it to ``$GATED_BENCH_ROWS`` when set): a run cut
    short still shows the rows measured so far."""
    row = ctx.rows[-1]
    line = (f"{row['case']} | {row['dtype']} | {row['us']:.1f} µs | "
            f"{row['pct_copy'] or 0:.0f} % copy | torch {row['torch_us'] or 0:.1f} | "
            f"{row['note']}")
    print("  " + line, flush=True)
    rows_file = os.environ.get("GATED_BENCH_ROWS")
    if rows_file:
        with open(rows_file, "a") as out:
            out.write(f"| {line} |\n")


def _times(ctx: Any, fns: dict[str, Any], sets: int) -> dict[str, float]:
    names = [n for n, f in fns.items() if f is not None]
    found = ctx.time_gpu_many([fns[n] for n in names], sets=sets, warmup=3, iters=15)
    return dict(zip(names, found))


def _note(times: dict[str, float], ours: float) -> str:
    parts = [f"{name} {us:.1f}" for name, us in times.items() if name != "ours"]
    parts.append(f"copy/ours {times['copy'] / ours:.2f}")
    return "µs: " + ", ".join(parts)


def _shape_rows(ctx: Any, tokens: int, width: int, one_tensor: bool, dtype_name: str,
                kinds: list[tuple]) -> None:
    torch = ctx.torch
    dtype = getattr(torch, dtype_name)
    element = ElementKind.from_dtype(dtype)
    numel = tokens * width
    itemsize = torch.empty((), dtype=dtype).element_size()
    sets = ctx.sets_for(5 * numel * itemsize)
    xs = [(torch.rand(tokens, 2 * width, device="cuda") * 4 - 2).to(dtype)
          for _ in range(sets)]
    dys = [(torch.rand(tokens, width, device="cuda") * 4 - 2).to(dtype) for _ in range(sets)]
    if one_tensor:
        halves = [x.chunk(2, -1) for x in xs]
    else:
        halves = [(x[:, :width].contiguous(), x[:, width:].contiguous()) for x in xs]
        del xs[:]
    form = "one tensor" if one_tensor else "two tensors"
    y = torch.empty(tokens, width, device="cuda", dtype=dtype)
    copy_src = torch.empty(4 * numel, device="cuda", dtype=dtype).uniform_(-1, 1)
    copy_dst = torch.empty_like(copy_src)
    data = dict(tokens=tokens, width=width, one_tensor=one_tensor, dtype_name=dtype_name,
                element=element, itemsize=itemsize, sets=sets, xs=xs, dys=dys, halves=halves,
                form=form, y=y, copy_src=copy_src, copy_dst=copy_dst)
    for kind_row in kinds:
        _kind_rows(ctx, torch, data, *kind_row)
    del xs, dys, halves, copy_src, copy_dst, y, data
    torch.cuda.empty_cache()


def _kind_rows(ctx: Any, torch: Any, data: dict, label: str, kind: K, approximate: str,
               formula_name: str, liger_name: str | None) -> None:
    """Forward, backward and forward+backward rows of one kind on one shape."""
    tokens, width, one_tensor = data["tokens"], data["width"], data["one_tensor"]
    xs, dys, halves, y = data["xs"], data["dys"], data["halves"], data["y"]
    copy_src, copy_dst, sets = data["copy_src"], data["copy_dst"], data["sets"]
    numel, itemsize, form = tokens * width, data["itemsize"], data["form"]
    formula = _formula(torch, formula_name)
    compiled = _COMPILED.get(formula_name)
    if compiled is None:  # one per formula: later shapes reuse its (dynamic) graph
        compiled = _COMPILED[formula_name] = torch.compile(_formula(torch, formula_name))
    liger = _liger(liger_name)
    split = -1 if one_tensor else None
    shape = (tokens, 2 * width) if one_tensor else (tokens, width)
    desc = GatedActivationDescriptor(kind, shape, split, data["element"],
                                     approximate=approximate)
    fw = GatedActivationPlan.select(desc)
    bw = GatedActivationBackwardPlan.select(desc)
    if one_tensor:
        fw_args = [GatedActivationArgs(x, y) for x in xs]
        dx = torch.empty_like(xs[0])
        bw_args = [GatedActivationBackwardArgs(dy, x, dx) for dy, x in zip(dys, xs)]
    else:
        fw_args = [GatedActivationArgs(y=y, gate=g, up=u) for g, u in halves]
        dg, du = torch.empty_like(y), torch.empty_like(y)
        bw_args = [GatedActivationBackwardArgs(dy, gate=g, up=u, dgate=dg, dup=du)
                   for dy, (g, u) in zip(dys, halves)]
    compiled(*halves[0])  # compile before timing
    fw_copy, bw_copy = copy_src[: 3 * numel // 2], copy_src[: 5 * numel // 2]
    times = _times(ctx, {
        "ours": lambda i: fw.run(fw_args[i]),
        "torch": lambda i: formula(*halves[i]),
        "compile": lambda i: compiled(*halves[i]),
        "liger": None if liger is None else lambda i: liger(*halves[i]),
        "copy": lambda i: copy_dst[: 3 * numel // 2].copy_(fw_copy),
    }, sets)
    ctx.row(f"{label} forward [{tokens}, {width}] {form}", data["dtype_name"], times["ours"],
            3 * numel * itemsize, times["torch"], _note(times, times["ours"]))
    _print_row(ctx)
    times = _times(ctx, {
        "ours": lambda i: bw.run(bw_args[i]),
        "copy": lambda i: copy_dst[: 5 * numel // 2].copy_(bw_copy),
    }, sets)
    ctx.row(f"{label} backward [{tokens}, {width}] {form}", data["dtype_name"], times["ours"],
            5 * numel * itemsize, None, _note(times, times["ours"]))
    _print_row(ctx)
    _forward_backward(ctx, torch, label, kind, approximate, formula, compiled, liger,
                      halves, xs, dys, one_tensor, tokens, width, form, data["dtype_name"],
                      itemsize, sets, copy_src, copy_dst)


def _forward_backward(ctx: Any, torch: Any, label: str, kind: K, approximate: str,
                      formula: Any, compiled: Any, liger: Any, halves: list, xs: list,
                      dys: list, one_tensor: bool, tokens: int, width: int, form: str,
                      dtype_name: str, itemsize: int, sets: int, copy_src: Any,
                      copy_dst: Any) -> None:
    """Forward + backward through autograd: ours via ``baracuda_numba.torch``."""
    ours_fn = {K.SWIGLU: bt.swiglu,
               K.GEGLU: lambda g, u=None: bt.geglu(g, u, approximate)}[kind]
    if one_tensor:
        leaves = [x.detach().requires_grad_() for x in xs]
        inputs = [(leaf,) for leaf in leaves]
        split = [leaf.chunk(2, -1) for leaf in leaves]
    else:
        leaves = [tuple(t.detach().requires_grad_() for t in pair) for pair in halves]
        inputs = leaves
        split = leaves

    # Liger's backward writes the gradients over its saved (contiguous) inputs: its own
    # copies, so the others keep their inputs
    liger_leaves = [tuple(t.detach().clone().requires_grad_() for t in pair)
                    for pair in (split if not one_tensor else [(x,) for x in xs])]
    liger_split = liger_leaves if not one_tensor else [lv[0].chunk(2, -1)
                                                       for lv in liger_leaves]

    def grads(fn: Any, args: tuple, wrt: Any, dy: Any) -> None:
        torch.autograd.grad(fn(*args), wrt, dy)

    def wrt(i: int) -> Any:
        return inputs[i]

    fns = {
        "ours": lambda i: grads(ours_fn, inputs[i], wrt(i), dys[i]),
        "torch": lambda i: grads(formula, split[i], wrt(i), dys[i]),
        "compile": lambda i: grads(compiled, split[i], wrt(i), dys[i]),
        "liger": None if liger is None else lambda i: grads(liger, liger_split[i],
                                                            liger_leaves[i], dys[i]),
        "copy": lambda i: copy_dst.copy_(copy_src),
    }
    grads(compiled, split[0], wrt(0), dys[0])  # compile the backward before timing
    times = _times(ctx, fns, sets)
    ctx.row(f"{label} forward+backward [{tokens}, {width}] {form}", dtype_name,
            times["ours"], 8 * tokens * width * itemsize, times["torch"],
            _note(times, times["ours"]))
    _print_row(ctx)


def bench(ctx: Any) -> None:
    only = os.environ.get("GATED_BENCH_ONLY", "").lower()
    # kind by kind (SwiGLU first), so a run cut short keeps the most wanted rows
    for kind_row in KINDS:
        if only and only not in kind_row[0].lower():
            continue
        for tokens, width, one_tensor, dtype_name in SHAPES:
            if kind_row[0] == "GeGLU erf" and (tokens, width) != SHAPES[0][:2]:
                continue  # erf: the first shapes only
            try:
                _shape_rows(ctx, tokens, width, one_tensor, dtype_name, [kind_row])
            except Exception as exc:  # noqa: BLE001 - record, keep going
                ctx.notes.append(f"{kind_row[0]} [{tokens}, {width}] {dtype_name}: "
                                 f"{type(exc).__name__}: {str(exc)[:200]}")
                print(f"  failed: {exc!r}", flush=True)
    ctx.notes.append("The note's µs are medians of the same interleaved run (torch eager, "
                     "torch.compile default mode, Liger-Kernel, and copy_ of the same "
                     "bytes: a copy_ of 1.5 N, 2.5 N and 4 N elements for the forward, "
                     "backward and forward+backward rows).")
