"""torch twins of the fractional max pooling (2-D and 3-D)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..ops.fractional_max_pool import _fmp as _fmp_call
from ..ops.fractional_max_pool import _fmp_backward as _fmp_backward_call
from ._core import LIB, compiling

__all__ = ["fractional_max_pool2d", "fractional_max_pool3d"]

@torch.library.custom_op(f"{LIB}::fractional_max_pool", mutates_args=())
def _fmp_op(x: Tensor, kernel_size: Sequence[int], output_size: Sequence[int],
            random_samples: Tensor, placement: str) -> tuple[Tensor, Tensor]:
    dims = x.dim() - 2
    return _fmp_call(dims, x, list(kernel_size), list(output_size), random_samples, placement,
                    None)


@_fmp_op.register_fake
def _(x: Tensor, kernel_size: Sequence[int], output_size: Sequence[int],
      random_samples: Tensor, placement: str) -> tuple[Tensor, Tensor]:
    shape = list(x.shape[:2]) + list(output_size)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64)


@torch.library.custom_op(f"{LIB}::fractional_max_pool_backward", mutates_args=())
def _fmp_backward_op(dy: Tensor, indices: Tensor, input_shape: Sequence[int],
                     kernel_size: Sequence[int], placement: str) -> Tensor:
    dims = dy.dim() - 2
    return _fmp_backward_call(dims, dy, indices, list(input_shape), list(kernel_size),
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
        return _fmp_call(x.dim() - 2, x, list(kernel_size), list(output_size), random_samples,
                        placement, None)

    setup_context = staticmethod(_fmp_setup)

    @staticmethod
    def backward(ctx, grad_y, grad_indices):
        (indices,) = ctx.saved_tensors
        dx = _fmp_backward_call(grad_y.dim() - 2, grad_y, indices, ctx.input_shape,
                               ctx.kernel_size, ctx.placement, None)
        return dx, None, None, None, None


def _fmp(x: Tensor, size: list[int], output_size: list[int], random_samples: Tensor,
         placement: str) -> tuple[Tensor, Tensor]:
    if compiling():
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
