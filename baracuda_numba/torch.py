"""PyTorch integration: ``torch.library`` custom ops with fake (meta) kernels and autograd.

Every op here is registered as ``baracuda::<name>``, so ``torch.compile`` treats it as one
opaque node (no graph break), and its ``register_fake`` gives shapes to the tracer. The
CUDA implementation calls :mod:`baracuda_numba.ops`, which launches on torch's current
stream and allocates with torch's caching allocator, so the ops can be captured in CUDA
graphs. Backward formulas are the backward plans (``ScanBackwardPlan``,
``ReduceBackwardPlan``, ``RopeBackwardPlan``, the fractional-max-pool gather), fed with
the tensors the seeds say they need.

In eager mode the public functions skip the ``torch.library`` dispatcher (about 100 µs of
host time per call on the H100 machine, 2026-11-22) and go through an equivalent
``torch.autograd.Function``; under ``torch.compile`` they call the custom ops.

Importing this module imports torch; ``import baracuda_numba`` alone does not.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from . import ops
from .types import ReduceKind, ScanKind

__all__ = [
    "amax", "amin", "argmax", "argmin", "cummax", "cummin", "cumprod", "cumsum",
    "fractional_max_pool2d", "fractional_max_pool3d", "logcumsumexp", "logsumexp", "mean",
    "norm", "prod", "rope", "std", "sum", "var", "write_slice_",
]

_LIB = "baracuda"
_compiling = torch.compiler.is_compiling

# -- scans ---------------------------------------------------------------------------------

# kind -> (saves x, saves y)
_SCAN_SAVES = {
    ScanKind.CUMSUM: (False, False),
    ScanKind.CUMPROD: (True, True),
    ScanKind.CUMMAX: (True, False),
    ScanKind.CUMMIN: (True, False),
    ScanKind.LOG_CUMSUM_EXP: (True, True),
}


@torch.library.custom_op(f"{_LIB}::scan", mutates_args=())
def _scan_op(x: Tensor, kind: int, dim: int, reverse: bool) -> tuple[Tensor, Tensor]:
    return _scan_impl(x, kind, dim, reverse)


@_scan_op.register_fake
def _(x: Tensor, kind: int, dim: int, reverse: bool) -> tuple[Tensor, Tensor]:
    if ScanKind(kind) in (ScanKind.CUMMAX, ScanKind.CUMMIN):
        return torch.empty_like(x), torch.empty_like(x, dtype=torch.int64)
    return torch.empty_like(x), x.new_empty((0,), dtype=torch.int64)


@torch.library.custom_op(f"{_LIB}::scan_backward", mutates_args=())
def _scan_backward_op(dy: Tensor, x: Tensor | None, y: Tensor | None, kind: int, dim: int,
                      reverse: bool) -> Tensor:
    return ops.scan_backward(ScanKind(kind), dy, dim, x=x, y=y, reverse=reverse)


@_scan_backward_op.register_fake
def _(dy: Tensor, x: Tensor | None, y: Tensor | None, kind: int, dim: int,
      reverse: bool) -> Tensor:
    return torch.empty_like(dy)


def _scan_setup(ctx, inputs, output) -> None:
    x, kind, dim, reverse = inputs
    saves_x, saves_y = _SCAN_SAVES[ScanKind(kind)]
    ctx.kind, ctx.dim, ctx.reverse = kind, dim, reverse
    ctx.save_for_backward(x if saves_x else None, output[0] if saves_y else None)


def _scan_backward(ctx, grad_y: Tensor, grad_indices: Tensor):
    x, y = ctx.saved_tensors
    dx = _scan_backward_op(grad_y, x, y, ctx.kind, ctx.dim, ctx.reverse)
    return dx, None, None, None


_scan_op.register_autograd(_scan_backward, setup_context=_scan_setup)


class _ScanFunction(torch.autograd.Function):
    """Eager twin of ``baracuda::scan`` (same forward, same backward plan)."""

    @staticmethod
    def forward(x, kind, dim, reverse):
        return _scan_impl(x, kind, dim, reverse)

    setup_context = staticmethod(_scan_setup)

    @staticmethod
    def backward(ctx, grad_y, grad_indices):
        x, y = ctx.saved_tensors
        dx = ops.scan_backward(ScanKind(ctx.kind), grad_y, ctx.dim, x=x, y=y,
                               reverse=ctx.reverse)
        return dx, None, None, None


def _scan_impl(x: Tensor, kind: int, dim: int, reverse: bool) -> tuple[Tensor, Tensor]:
    scan_kind = ScanKind(kind)
    if scan_kind in (ScanKind.CUMMAX, ScanKind.CUMMIN):
        values, indices = ops._scan(scan_kind, x, dim, reverse, None, True)
        return values, indices
    return ops._scan(scan_kind, x, dim, reverse, None, False), _NO_INDICES(x)


def _NO_INDICES(x: Tensor) -> Tensor:  # noqa: N802
    return x.new_empty((0,), dtype=torch.int64)


def _needs_grad(x: Tensor) -> bool:
    return x.requires_grad and torch.is_grad_enabled()


def _scan(x: Tensor, kind: ScanKind, dim: int, reverse: bool) -> tuple[Tensor, Tensor]:
    if _compiling():
        return _scan_op(x, int(kind), dim, reverse)
    if not _needs_grad(x):
        return _scan_impl(x, int(kind), dim, reverse)
    return _ScanFunction.apply(x, int(kind), dim, reverse)


def cumsum(x: Tensor, dim: int, *, reverse: bool = False) -> Tensor:
    """``torch.cumsum`` (f32 accumulation for halves); ``reverse`` scans from the end."""
    return _scan(x, ScanKind.CUMSUM, dim, reverse)[0]


def cumprod(x: Tensor, dim: int, *, reverse: bool = False) -> Tensor:
    """``torch.cumprod``; the gradient is exact when ``x`` has zeros."""
    return _scan(x, ScanKind.CUMPROD, dim, reverse)[0]


def logcumsumexp(x: Tensor, dim: int, *, reverse: bool = False) -> Tensor:
    """``torch.logcumsumexp`` (all -inf prefix -> -inf)."""
    return _scan(x, ScanKind.LOG_CUMSUM_EXP, dim, reverse)[0]


def cummax(x: Tensor, dim: int, *, reverse: bool = False) -> tuple[Tensor, Tensor]:
    """``torch.cummax``: (values, indices); NaN propagates."""
    return _scan(x, ScanKind.CUMMAX, dim, reverse)


def cummin(x: Tensor, dim: int, *, reverse: bool = False) -> tuple[Tensor, Tensor]:
    """``torch.cummin``: (values, indices); NaN propagates."""
    return _scan(x, ScanKind.CUMMIN, dim, reverse)


# -- reductions ----------------------------------------------------------------------------

_NO_SAVED = (ReduceKind.SUM, ReduceKind.MEAN)


@torch.library.custom_op(f"{_LIB}::reduce", mutates_args=())
def _reduce_op(x: Tensor, kind: int, dim: int, correction: int) -> Tensor:
    return ops._reduce(ReduceKind(kind), x, dim, True, correction, None)


@_reduce_op.register_fake
def _(x: Tensor, kind: int, dim: int, correction: int) -> Tensor:
    shape = list(x.shape)
    shape[dim % x.dim()] = 1
    return x.new_empty(shape)


@torch.library.custom_op(f"{_LIB}::reduce_backward", mutates_args=())
def _reduce_backward_op(dy: Tensor, x: Tensor | None, y: Tensor | None,
                        input_shape: Sequence[int], kind: int, dim: int,
                        correction: int) -> Tensor:
    return ops.reduce_backward(ReduceKind(kind), dy, input_shape, dim, x=x, y=y,
                               correction=correction)


@_reduce_backward_op.register_fake
def _(dy: Tensor, x: Tensor | None, y: Tensor | None, input_shape: Sequence[int], kind: int,
      dim: int, correction: int) -> Tensor:
    return dy.new_empty(list(input_shape))


def _reduce_setup(ctx, inputs, output) -> None:
    x, kind, dim, correction = inputs
    ctx.kind, ctx.dim, ctx.correction = kind, dim % x.dim(), correction
    ctx.input_shape = list(x.shape)
    if ReduceKind(kind) in _NO_SAVED:
        ctx.save_for_backward(None, None)
    else:
        ctx.save_for_backward(x, output)


def _reduce_backward(ctx, grad: Tensor):
    x, y = ctx.saved_tensors
    dx = _reduce_backward_op(grad, x, y, ctx.input_shape, ctx.kind, ctx.dim, ctx.correction)
    return dx, None, None, None


_reduce_op.register_autograd(_reduce_backward, setup_context=_reduce_setup)


class _ReduceFunction(torch.autograd.Function):
    """Eager twin of ``baracuda::reduce``."""

    @staticmethod
    def forward(x, kind, dim, correction):
        return ops._reduce(ReduceKind(kind), x, dim, True, correction, None)

    setup_context = staticmethod(_reduce_setup)

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        dx = ops.reduce_backward(ReduceKind(ctx.kind), grad, ctx.input_shape, ctx.dim, x=x, y=y,
                                 correction=ctx.correction)
        return dx, None, None, None


def _reduce(kind: ReduceKind, x: Tensor, dim: int, keepdim: bool, correction: int = 1) -> Tensor:
    if _compiling():
        y = _reduce_op(x, int(kind), dim, correction)
    elif not _needs_grad(x):
        y = ops._reduce(kind, x, dim, True, correction, None)
    else:
        y = _ReduceFunction.apply(x, int(kind), dim, correction)
    return y if keepdim else y.squeeze(dim)


def sum(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:  # noqa: A001
    return _reduce(ReduceKind.SUM, x, dim, keepdim)


def mean(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.MEAN, x, dim, keepdim)


def amax(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    """Max over ``dim``; its gradient is split equally across ties (JAX's rule)."""
    return _reduce(ReduceKind.MAX, x, dim, keepdim)


def amin(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.MIN, x, dim, keepdim)


def prod(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.PROD, x, dim, keepdim)


def norm(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.NORM2, x, dim, keepdim)


def logsumexp(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.LOG_SUM_EXP, x, dim, keepdim)


def var(x: Tensor, dim: int, *, correction: int = 1, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.VAR, x, dim, keepdim, correction)


def std(x: Tensor, dim: int, *, correction: int = 1, keepdim: bool = False) -> Tensor:
    return _reduce(ReduceKind.STD, x, dim, keepdim, correction)


@torch.library.custom_op(f"{_LIB}::arg_reduce", mutates_args=())
def _arg_reduce_op(x: Tensor, kind: int, dim: int) -> Tensor:
    return ops._arg_reduce(ReduceKind(kind), x, dim, True, None)


@_arg_reduce_op.register_fake
def _(x: Tensor, kind: int, dim: int) -> Tensor:
    shape = list(x.shape)
    shape[dim % x.dim()] = 1
    return x.new_empty(shape, dtype=torch.int64)


def _arg_reduce(kind: ReduceKind, x: Tensor, dim: int, keepdim: bool) -> Tensor:
    if _compiling():
        y = _arg_reduce_op(x, int(kind), dim)
    else:
        y = ops._arg_reduce(kind, x.detach(), dim, True, None)
    return y if keepdim else y.squeeze(dim)


def argmax(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _arg_reduce(ReduceKind.ARGMAX, x, dim, keepdim)


def argmin(x: Tensor, dim: int, *, keepdim: bool = False) -> Tensor:
    return _arg_reduce(ReduceKind.ARGMIN, x, dim, keepdim)


# -- rotary embedding ----------------------------------------------------------------------


@torch.library.custom_op(f"{_LIB}::rope", mutates_args=())
def _rope_op(x: Tensor, positions: Tensor | None, base: float, pairing: str, rotary_dim: int,
             backward: bool) -> Tensor:
    return _rope_impl(x, positions, base, pairing, rotary_dim, backward)


@_rope_op.register_fake
def _(x: Tensor, positions: Tensor | None, base: float, pairing: str, rotary_dim: int,
      backward: bool) -> Tensor:
    return torch.empty_like(x)


def _rope_setup(ctx, inputs, output) -> None:
    _, positions, ctx.base, ctx.pairing, ctx.rotary_dim, ctx.backward = inputs
    ctx.save_for_backward(positions)


def _rope_backward(ctx, grad: Tensor):
    (positions,) = ctx.saved_tensors
    dx = _rope_op(grad, positions, ctx.base, ctx.pairing, ctx.rotary_dim, not ctx.backward)
    return dx, None, None, None, None, None


_rope_op.register_autograd(_rope_backward, setup_context=_rope_setup)


def _rope_impl(x: Tensor, positions: Tensor | None, base: float, pairing: str,
               rotary_dim: int, backward: bool) -> Tensor:
    if x.dim() == 4 and x.shape[-1] > 1 and x.stride(-1) != 1:
        # The plans need unit stride along the features; gradients flowing back through a
        # transpose often lack it.
        x = x.contiguous()
    rotary = None if rotary_dim <= 0 else rotary_dim
    fn = ops.rope_backward if backward else ops.rope
    return fn(x, positions=positions, base=base, pairing=pairing, rotary_dim=rotary)


class _RopeFunction(torch.autograd.Function):
    """Eager twin of ``baracuda::rope``."""

    @staticmethod
    def forward(x, positions, base, pairing, rotary_dim, backward):
        return _rope_impl(x, positions, base, pairing, rotary_dim, backward)

    setup_context = staticmethod(_rope_setup)

    @staticmethod
    def backward(ctx, grad):
        (positions,) = ctx.saved_tensors
        dx = _rope_impl(grad, positions, ctx.base, ctx.pairing, ctx.rotary_dim,
                        not ctx.backward)
        return dx, None, None, None, None, None


def rope(x: Tensor, *, positions: Tensor | None = None, base: float = 10000.0,
         pairing: str = "interleaved", rotary_dim: int | None = None) -> Tensor:
    """Rotary embedding of ``x`` ``[B, H, S, D]``; ``pairing`` 'interleaved' (GPT-J) or
    'half_split' (NeoX/Llama ``rotate_half``)."""
    if _compiling():
        return _rope_op(x, positions, float(base), pairing, rotary_dim or 0, False)
    if not _needs_grad(x):
        return _rope_impl(x, positions, float(base), pairing, rotary_dim or 0, False)
    return _RopeFunction.apply(x, positions, float(base), pairing, rotary_dim or 0, False)


# -- fractional max pooling ----------------------------------------------------------------


@torch.library.custom_op(f"{_LIB}::fractional_max_pool", mutates_args=())
def _fmp_op(x: Tensor, kernel_size: Sequence[int], output_size: Sequence[int],
            random_samples: Tensor, placement: str) -> tuple[Tensor, Tensor]:
    dims = x.dim() - 2
    return ops._fmp(dims, x, list(kernel_size), list(output_size), random_samples, placement,
                    None)


@_fmp_op.register_fake
def _(x: Tensor, kernel_size: Sequence[int], output_size: Sequence[int],
      random_samples: Tensor, placement: str) -> tuple[Tensor, Tensor]:
    shape = list(x.shape[:2]) + list(output_size)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64)


@torch.library.custom_op(f"{_LIB}::fractional_max_pool_backward", mutates_args=())
def _fmp_backward_op(dy: Tensor, indices: Tensor, input_shape: Sequence[int],
                     kernel_size: Sequence[int], placement: str) -> Tensor:
    dims = dy.dim() - 2
    return ops._fmp_backward(dims, dy, indices, list(input_shape), list(kernel_size),
                             placement, None)


@_fmp_backward_op.register_fake
def _(dy: Tensor, indices: Tensor, input_shape: Sequence[int], kernel_size: Sequence[int],
      placement: str) -> Tensor:
    return dy.new_empty(list(input_shape))


def _fmp_setup(ctx, inputs, output) -> None:
    x, kernel_size, _, _, placement = inputs
    ctx.input_shape, ctx.kernel_size, ctx.placement = list(x.shape), list(kernel_size), placement
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])


def _fmp_backward(ctx, grad_y: Tensor, grad_indices: Tensor):
    (indices,) = ctx.saved_tensors
    dx = _fmp_backward_op(grad_y, indices, ctx.input_shape, ctx.kernel_size, ctx.placement)
    return dx, None, None, None, None


_fmp_op.register_autograd(_fmp_backward, setup_context=_fmp_setup)


class _FmpFunction(torch.autograd.Function):
    """Eager twin of ``baracuda::fractional_max_pool``."""

    @staticmethod
    def forward(x, kernel_size, output_size, random_samples, placement):
        return ops._fmp(x.dim() - 2, x, list(kernel_size), list(output_size), random_samples,
                        placement, None)

    setup_context = staticmethod(_fmp_setup)

    @staticmethod
    def backward(ctx, grad_y, grad_indices):
        (indices,) = ctx.saved_tensors
        dx = ops._fmp_backward(grad_y.dim() - 2, grad_y, indices, ctx.input_shape,
                               ctx.kernel_size, ctx.placement, None)
        return dx, None, None, None, None


def _fmp(x: Tensor, size: list[int], output_size: list[int], random_samples: Tensor,
         placement: str) -> tuple[Tensor, Tensor]:
    if _compiling():
        return _fmp_op(x, size, output_size, random_samples, placement)
    return _FmpFunction.apply(x, size, output_size, random_samples, placement)


def fractional_max_pool2d(x: Tensor, kernel_size: Sequence[int] | int,
                          output_size: Sequence[int], random_samples: Tensor, *,
                          placement: str = "baracuda") -> tuple[Tensor, Tensor]:
    """(y, indices) with indices int64 offsets into the whole input; deterministic
    backward. ``placement='torch'`` matches ``F.fractional_max_pool2d``'s windows."""
    size = [kernel_size] * 2 if isinstance(kernel_size, int) else list(kernel_size)
    return _fmp(x, size, list(output_size), random_samples, placement)


def fractional_max_pool3d(x: Tensor, kernel_size: Sequence[int] | int,
                          output_size: Sequence[int], random_samples: Tensor, *,
                          placement: str = "baracuda") -> tuple[Tensor, Tensor]:
    size = [kernel_size] * 3 if isinstance(kernel_size, int) else list(kernel_size)
    return _fmp(x, size, list(output_size), random_samples, placement)


# -- write_slice (in place) ----------------------------------------------------------------


@torch.library.custom_op(f"{_LIB}::write_slice_", mutates_args=("dest",))
def _write_slice_op(dest: Tensor, source: Tensor, offsets: Sequence[int]) -> None:
    ops.write_slice(dest, source, list(offsets))


@_write_slice_op.register_fake
def _(dest: Tensor, source: Tensor, offsets: Sequence[int]) -> None:
    return None


def write_slice_(dest: Tensor, source: Tensor, offsets: Sequence[int]) -> Tensor:
    """``dest[o_0:o_0+n_0, ...] = source`` in place (non-differentiable); returns ``dest``."""
    if _compiling():
        _write_slice_op(dest, source, list(offsets))
    else:
        ops.write_slice(dest, source, offsets)
    return dest
