"""Probe (GPU): what the strip width alone costs the column register-resident gradient.

The stash kernel (``reduce_backward_cols_stash``) holds a strip of 64 bytes of every row
of [4096, 4096] (256 KB: 16 words a thread in registers, 16 in shared memory, 1024
threads, one block per SM), then writes it back: f32 Max / Var along axis 0 reach 74 % of
copy, where the word column kernel, reading 2 KB of a row per block, reaches 91 % for Prod.
This copy kernel does only the stash kernel's memory work, the same 256 KB a block, for
strips of 64 / 128 / 256 / 512 bytes over 4096 / 2048 / 1024 / 512 rows (wider strips
split the rows between blocks, as a cluster of blocks sharing a strip would), against
torch's ``copy_`` of the same bytes, in the same rounds:

    PYTHONPATH=.:scripts python scripts/probe_strip_width.py [rounds] [short | split]

``short``: the same for short columns instead ([256, 2^20], the rows of the benchmark's
[256, 1e6] along axis 0: a strip's 256 rows in registers, 16 a thread, blocks of 16 lanes
a column word), with and without the block barrier between loads and stores.

``split``: [4096, 4096] in the strip kernel's blocks (``reduce_backward_cols_strip``: 256
threads, 32 rows a thread in registers), each strip's rows cut into parts of one block,
the blocks numbered strip by strip (as a kernel whose parts meet would take them) or part
by part; and the part-major 256-byte items in a persistent grid taking tickets.
"""

from __future__ import annotations

import itertools
import sys

import torch
from bench import Context, measure_copy_gbps
from numba import cuda, types, uint64

from baracuda_numba.kernels.reduce import (
    REG_COL_STASH,
    REG_COL_WORDS,
    REG_COLS_BLOCK,
    REG_COLS_STASH_BYTES,
)
from baracuda_numba.launch import Kernel

# the stash kernel's shape: words a thread holds in registers, and again in shared memory
HELD = REG_COL_WORDS
assert REG_COL_STASH == HELD, "the copy parks as many words as it holds in registers"
BLOCK = REG_COLS_BLOCK
STASH_BYTES = REG_COLS_STASH_BYTES


def _hold_copy(py_name: str, hold: bool = True) -> Kernel:
    HOLD = hold

    def hold_copy(x, y, row_words, strip_words, strips):
        """Block b copies words [s * strip_words, (s + 1) * strip_words) of rows
        [r0, r0 + 2 * HELD * lanes) (s = b % strips, r0 from b // strips): every load
        first (HELD words a thread to registers, HELD to shared memory), a block barrier,
        then every store. Without ``hold``: HELD loads and their stores, twice (no
        shared memory, no barrier)."""
        stash = cuda.shared.array(0, uint64)
        regs = cuda.local.array(HELD, uint64)
        tid = cuda.threadIdx.x
        lanes = uint64(cuda.blockDim.x) // uint64(strip_words)
        b = uint64(cuda.blockIdx.x)
        col = (b % uint64(strips)) * uint64(strip_words) + uint64(tid) % uint64(strip_words)
        r0 = (b // uint64(strips)) * uint64(2 * HELD) * lanes \
            + uint64(tid) // uint64(strip_words)
        if not HOLD:
            for half in range(2):
                for k in range(HELD):
                    regs[k] = x[(r0 + uint64(half * HELD + k) * lanes) * uint64(row_words)
                                + col]
                for k in range(HELD):
                    y[(r0 + uint64(half * HELD + k) * lanes) * uint64(row_words) + col] = \
                        regs[k]
            return
        for k in range(HELD):
            regs[k] = x[(r0 + uint64(k) * lanes) * uint64(row_words) + col]
        for k in range(HELD):
            stash[k * BLOCK + tid] = x[(r0 + uint64(HELD + k) * lanes) * uint64(row_words)
                                       + col]
        cuda.syncthreads()
        for k in range(HELD):
            y[(r0 + uint64(k) * lanes) * uint64(row_words) + col] = regs[k]
        for k in range(HELD):
            y[(r0 + uint64(HELD + k) * lanes) * uint64(row_words) + col] = \
                stash[k * BLOCK + tid]

    words = types.Array(types.uint64, 1, "C")
    kernel = Kernel(py_name, hold_copy, (words, words, types.int64, types.int64,
                                         types.int64), register=False, max_registers=64)
    return kernel.allow_dynamic_shared(STASH_BYTES) if hold else kernel


def _run(ctx: Context, kernels: dict[str, Kernel], dtype: torch.dtype, name: str,
         rounds: int) -> None:
    """Times torch's ``copy_`` and each copy kernel at each strip width, interleaved."""
    x, y, row_words, stream, fns, labels = _buffers((4096, 4096), dtype)
    for (kind, kernel), strip_bytes in itertools.product(kernels.items(), (64, 128, 256, 512)):
        strip_words = strip_bytes // 8
        rows = 2 * HELD * (BLOCK // strip_words)
        strips = row_words // strip_words
        blocks = strips * (x.shape[0] // rows)
        shared = STASH_BYTES if kind == "hold" else 0
        bound = kernel.bind(blocks, BLOCK, ((0, x.numel() * x.element_size() // 8),
                                            (0, y.numel() * y.element_size() // 8),
                                            row_words, strip_words, strips), shared)
        _add_copy(fns, labels, f"{kind} {strip_bytes} B x {rows} rows, {blocks} blocks",
                  bound, stream, x, y)
    _time_rounds(ctx, fns, labels, f"{name} [4096, 4096]", x, rounds, iters=30)


def _buffers(shape: tuple[int, int], dtype: torch.dtype) -> tuple:
    """x (random), y, the words of a row, the stream, and the timed calls so far (torch's
    ``copy_`` of x) with their labels."""
    x = torch.randn(*shape, device="cuda").to(dtype)
    y = torch.empty_like(x)
    ref = torch.empty_like(x)
    row_words = x.shape[1] * x.element_size() // 8
    return (x, y, row_words, torch.cuda.current_stream().cuda_stream,
            [lambda i: ref.copy_(x)], ["torch copy_"])


def _add_copy(fns: list, labels: list[str], label: str, bound: object, stream: int,
              x: torch.Tensor, y: torch.Tensor, ctl: torch.Tensor | None = None) -> None:
    """Append a bound copy kernel (x to y; ``ctl``: its ticket counter, passed after y and
    zero again after each launch) to the timed calls, after checking its copy."""
    more = () if ctl is None else (ctl.data_ptr(),)
    fns.append(lambda i, f=bound.fast: f(stream, x.data_ptr(), y.data_ptr(), *more))
    labels.append(label)
    y.zero_()
    fns[-1](0)
    torch.cuda.synchronize()
    assert torch.equal(y, x), label
    assert ctl is None or not ctl.any(), label


def _time_rounds(ctx: Context, fns: list, labels: list[str], title: str, x: torch.Tensor,
                 rounds: int, iters: int) -> None:
    """Time the calls alternately, ``rounds`` times; µs and % of copy (x read, y written)."""
    nbytes = 2 * x.numel() * x.element_size()
    for _ in range(rounds):
        times = ctx.time_gpu_many(fns, warmup=3, iters=iters)
        print(f"{title}: " + "; ".join(
            f"{label} {us:.2f} µs ({nbytes / us / 1e3 / ctx.copy_gbps * 100:.0f} %)"
            for label, us in zip(labels, times)), flush=True)


def _short_copy(py_name: str, barrier: bool, held: int = HELD) -> Kernel:
    BARRIER = barrier
    HELD_ROWS = held

    def short_copy(x, y, row_words, strip_words, strips, strip_major):
        """Block b copies words [b * strip_words, (b + 1) * strip_words) of every row:
        thread t holds rows t // strip_words + k * lanes (k < HELD) of its column word in
        registers, all loads first, then (after a block barrier where ``barrier``) every
        store: the memory work of the column register-resident gradient of short columns
        (``reduce_backward_cols_reg_small``, HELD * lanes rows). With more blocks than
        ``strips``, block b takes part ``b // strips`` of the rows (HELD * lanes rows a
        part) of strip ``b % strips``, or with ``strip_major`` part ``b % parts`` of strip
        ``b // parts``."""
        regs = cuda.local.array(HELD_ROWS, uint64)
        tid = uint64(cuda.threadIdx.x)
        lanes = uint64(cuda.blockDim.x) // uint64(strip_words)
        b = uint64(cuda.blockIdx.x)
        parts = uint64(cuda.gridDim.x) // uint64(strips)
        strip, part = (b // parts, b % parts) if strip_major else (b % uint64(strips),
                                                                     b // uint64(strips))
        col = strip * uint64(strip_words) + tid % uint64(strip_words)
        lane = part * uint64(HELD_ROWS) * lanes + tid // uint64(strip_words)
        for k in range(HELD_ROWS):
            regs[k] = x[(lane + uint64(k) * lanes) * uint64(row_words) + col]
        if BARRIER:
            cuda.syncthreads()
        for k in range(HELD_ROWS):
            y[(lane + uint64(k) * lanes) * uint64(row_words) + col] = regs[k]

    words = types.Array(types.uint64, 1, "C")
    return Kernel(py_name, short_copy, (words, words, types.int64, types.int64, types.int64,
                                        types.int64),
                  register=False, max_registers=64 if held == HELD else 128)


def _run_short(ctx: Context, dtype: torch.dtype, name: str, rounds: int) -> None:
    """Short columns: [HELD * 16, 2^20] (the rows of the benchmark's [256, 1e6] along axis
    0), strips of 64 / 128 / 256 / 512 bytes, with and without the block barrier, against
    torch's ``copy_``."""
    rows = HELD * 16
    x, y, row_words, stream, fns, labels = _buffers((rows, 1 << 20), dtype)
    for barrier in (True, False):
        kernel = _short_copy("short_copy" if barrier else "short_copy_nobar", barrier)
        for strip_bytes in (64, 128, 256, 512):
            strip_words = strip_bytes // 8
            strips = row_words // strip_words
            bound = kernel.bind(strips, strip_words * 16, (
                (0, x.numel() * x.element_size() // 8), (0, y.numel() * y.element_size() // 8),
                row_words, strip_words, strips, 0), 0)
            _add_copy(fns, labels, f"{'held' if barrier else 'no barrier'} {strip_bytes} B",
                      bound, stream, x, y)
    _time_rounds(ctx, fns, labels, f"{name} [{rows}, 2^20]", x, rounds, iters=10)


def _ticket_copy(py_name: str) -> Kernel:
    HELD_ROWS = 32

    def ticket_copy(x, y, row_words, strip_words, strips, ctl):
        """``short_copy``'s part-major split (held 32) as a persistent grid: each block
        takes items (part ``t // strips`` of strip ``t % strips``) in ticket order
        (``ctl[0]``), the next ticket taken after the item's loads and a block barrier (as
        ``reduce_backward_cols_hold`` takes it after its wait); the last block to finish
        zeroes ``ctl`` for the next launch."""
        shared_t = cuda.shared.array(1, types.int64)
        regs = cuda.local.array(HELD_ROWS, uint64)
        tid = uint64(cuda.threadIdx.x)
        lanes = uint64(cuda.blockDim.x) // uint64(strip_words)
        n = uint64(strips) * (uint64(x.shape[0]) // uint64(row_words)
                              // (uint64(HELD_ROWS) * lanes))
        if tid == 0:
            shared_t[0] = cuda.atomic.add(ctl, 0, types.int64(1))
        cuda.syncthreads()
        t = uint64(shared_t[0])
        while t < n:
            strip, part = t % uint64(strips), t // uint64(strips)
            col = strip * uint64(strip_words) + tid % uint64(strip_words)
            lane = part * uint64(HELD_ROWS) * lanes + tid // uint64(strip_words)
            for k in range(HELD_ROWS):
                regs[k] = x[(lane + uint64(k) * lanes) * uint64(row_words) + col]
            cuda.syncthreads()
            if tid == 0:
                shared_t[0] = cuda.atomic.add(ctl, 0, types.int64(1))
            for k in range(HELD_ROWS):
                y[(lane + uint64(k) * lanes) * uint64(row_words) + col] = regs[k]
            cuda.syncthreads()
            t = uint64(shared_t[0])
        if tid == 0 and cuda.atomic.add(ctl, 1, types.int64(1)) == cuda.gridDim.x - 1:
            ctl[0] = 0
            ctl[1] = 0

    words = types.Array(types.uint64, 1, "C")
    return Kernel(py_name, ticket_copy, (words, words, types.int64, types.int64, types.int64,
                                         types.Array(types.int64, 1, "C")),
                  register=False, max_registers=128)


def _run_split(ctx: Context, dtype: torch.dtype, name: str, rounds: int) -> None:
    """[4096, 4096] in the strip kernel's blocks (256 threads, 32 rows a thread: 256 rows a
    part at 256-byte strips, 512 at 128-byte), strip-major and part-major, against
    torch's ``copy_``."""
    x, y, row_words, stream, fns, labels = _buffers((4096, 4096), dtype)
    kernel = _short_copy("split_copy", True, 32)
    for strip_bytes, strip_major in itertools.product((128, 256, 512), (1, 0)):
        strip_words = strip_bytes // 8
        strips = row_words // strip_words
        parts = x.shape[0] // (32 * (256 // strip_words))
        bound = kernel.bind(strips * parts, 256, (
            (0, x.numel() * x.element_size() // 8), (0, y.numel() * y.element_size() // 8),
            row_words, strip_words, strips, strip_major), 0)
        _add_copy(fns, labels, f"{strip_bytes} B x {parts} parts"
                  f"{' strip-major' if strip_major else ''}", bound, stream, x, y)
    # the same part-major items of 256-byte strips in a persistent grid of resident blocks
    ticket = _ticket_copy("ticket_copy")
    ctl = torch.zeros(2, dtype=torch.int64, device="cuda")
    grid = ticket.resident_blocks(256)
    bound = ticket.bind(grid, 256, (
        (0, x.numel() * x.element_size() // 8), (0, y.numel() * y.element_size() // 8),
        row_words, 32, row_words // 32, (0, 2)), 0)
    _add_copy(fns, labels, f"256 B tickets, grid {grid}", bound, stream, x, y, ctl)
    _time_rounds(ctx, fns, labels, f"{name} [4096, 4096] split", x, rounds, iters=30)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = Context("strips", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    if "short" in sys.argv[2:]:
        for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            _run_short(ctx, dtype, name, rounds)
        return
    if "split" in sys.argv[2:]:
        for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            _run_split(ctx, dtype, name, rounds)
        return
    kernels = {"hold": _hold_copy("hold_copy"), "stream": _hold_copy("stream_copy", False)}
    for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        _run(ctx, kernels, dtype, name, rounds)


if __name__ == "__main__":
    main()
