"""Fractional max pool: window placement (BARACUDA and PyTorch's), the candidate
outputs of an input coordinate, and the element conversions of the kernel table."""

from __future__ import annotations

import math

from numba import cuda, float32, float64, int64

PLACEMENT_BARACUDA = 0
PLACEMENT_TORCH = 1
#: The slot of every kernel's ``windows`` tuple that holds the half kernels' runtime bf16
#: flag (1: bf16 storage, 0: f16; unused by the f32/f64 kernels). Where a flag tested per
#: load costs instructions in an issue-bound walk, the kernel branches on it once into two
#: inlined copies with the flag a constant: the whole body of the row-caching forward, the
#: window walk of the looped forward, phases 2 and 3 of the listed backward (copies of
#: their whole bodies took more registers: fewer blocks per SM). The leader scatter and
#: the general kernels test it per load (the same register allocation as bf16-only).
WINDOWS_BF16 = 6

_BELOW_ONE = 0.99999994  # the largest f32 below 1


# -- window placement ------------------------------------------------------------------


@cuda.jit(device=True, inline=True)
def clamp_sample(alpha):
    """The sample clamped into [0, 1) (NaN -> 0), so every placement stays inside the
    backward's candidate ranges."""
    if not (alpha >= float32(0.0)):
        return float32(0.0)
    if alpha >= float32(1.0):
        return float32(_BELOW_ONE)
    return alpha


@cuda.jit(device=True, inline=True)
def baracuda_window_start(o, out, extent, window, alpha):
    """min(floor(o*max_start/(out-1) + alpha), max_start) exactly, alpha in [0, 1)
    (out == 1: floor(alpha*max_start))."""
    max_start = extent - window
    if max_start <= 0:
        return int64(0)
    a = float64(alpha)
    if out <= 1:
        span = float64(max_start)
        t = float64(math.floor(a * span))
        # a*span may round up onto an integer; the FMA gives the exact residual's sign.
        if cuda.fma(a, span, -t) < 0.0:
            t -= 1.0
        return int64(t)
    last = out - 1
    p = o * max_start
    q = p // last  # exact (and a 32-bit division when the operands fit, LLVM's bypass)
    r = p - q * last
    # floor(r/last + alpha) is 1 iff alpha*last >= last - r (exact sign via one FMA).
    if cuda.fma(a, float64(last), -float64(last - r)) >= 0.0:
        q += 1
    return min(q, max_start)


@cuda.jit(device=True, inline=True)
def torch_window_start_f32(o, out, extent, window, alpha):
    """PyTorch's CUDA ``get_interval`` with float accumulation (f16/bf16/f32 inputs)."""
    max_start = extent - window
    if o >= out - 1:
        return max_start
    sample = float32(alpha)
    step = float32(max_start) / float32(out - 1)
    start = int64(float32(float32(o) + sample) * step) - int64(sample * step)
    return max(int64(0), min(start, max_start))


@cuda.jit(device=True, inline=True)
def torch_window_start_f64(o, out, extent, window, alpha):
    """PyTorch's CUDA ``get_interval`` with double accumulation (f64 inputs)."""
    max_start = extent - window
    if o >= out - 1:
        return max_start
    sample = float64(alpha)
    step = float64(max_start) / float64(out - 1)
    start = int64((float64(o) + sample) * step) - int64(sample * step)
    return max(int64(0), min(start, max_start))


@cuda.jit(device=True, inline=True)
def count_base_at_most(value, count, max_start, last):
    """#{o in [0, count): o*max_start // last <= value}, max_start, last > 0."""
    if value < 0:
        return int64(0)
    return min(count, ((value + 1) * last + max_start - 1) // max_start)


@cuda.jit(device=True, inline=True)
def candidate_outputs(coord, extent, window, out, placement):
    """[first, end) of the outputs whose window may contain input ``coord`` for *any*
    sample in [0, 1): a superset of the true range, found without the samples.

    BARACUDA: start(o) is base(o) or base(o) + 1 (clamped), base(o) = o*max_start //
    (out-1), so the candidates are c - k <= base(o) <= c. TORCH: start(o) lies in
    [base(o) - floor(step) - 1, base(o + 1) + 1] (step = max_start/(out-1)), widened by
    ``slack`` for f32 rounding of large extents."""
    max_start = extent - window
    last = out - 1
    if max_start <= 0 or last <= 0:
        return int64(0), out
    if placement == PLACEMENT_BARACUDA:
        first = count_base_at_most(coord - window - 1, out, max_start, last)
        end = count_base_at_most(coord, out, max_start, last)
        return first, end
    slack = 1 + (max_start >> 20)
    end = count_base_at_most(coord + max_start // last + 1 + slack, out, max_start, last)
    below = coord - window - 1 - slack  # outputs with base(o + 1) <= below cannot reach
    first = int64(0)
    if below >= 0:
        first = max(int64(0), count_base_at_most(below, out + 1, max_start, last) - 1)
    return first, end


@cuda.jit(device=True, inline=True)
def _takes_over(best, value):
    """Whether ``value`` replaces the running max ``best``: strictly greater (ties keep the
    first), or NaN while ``best`` is not (the first NaN sticks)."""
    return best == best and (value > best or value != value)


# -- element conversions -----------------------------------------------------------------
# The kernels widen and narrow through ``load(raw, bf16)`` / ``store(value, bf16)``: for
# f16/bf16 (one "half" kernel, uint16 storage) ``half_to_f32`` / ``f32_to_half`` with the
# launch's runtime flag, for f32/f64 the identity (the flag unused).


@cuda.jit(device=True, inline=True)
def _same(value, bf16):
    return value
