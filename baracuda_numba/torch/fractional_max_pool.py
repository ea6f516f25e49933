"""torch twins of the fractional max pooling (2-D and 3-D), with torch's signature and
conventions (``F.fractional_max_pool2d/3d``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import InvalidProblem
from ..ops.fractional_max_pool import _fmp as _fmp_call
from ..ops.fractional_max_pool import _fmp_backward as _fmp_backward_call
from ._core import LIB, EagerFunction, compiling

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


class _FmpFunction(EagerFunction):
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


def _pair(value: Sequence[int] | int, dims: int, name: str, fn: str) -> list[int]:
    values = [value] * dims if isinstance(value, int) else list(value)
    if len(values) != dims or not all(isinstance(v, int) and not isinstance(v, bool)
                                      for v in values):
        raise InvalidProblem(f"{fn}: {name} = {value!r} must be an int or {dims} ints")
    return values


def _pool(dims: int, x: Tensor, kernel_size: Sequence[int] | int,
          output_size: Sequence[int] | int | None,
          output_ratio: Sequence[float] | float | None, return_indices: bool,
          random_samples: Tensor | None, placement: str,
          plane_indices: bool) -> Tensor | tuple[Tensor, Tensor]:
    """torch's conventions around the plan: unbatched input, ``output_ratio``, samples in
    the input's dtype and torch's axis order (2-D: ``(w, h)``), indices into each plane."""
    fn = f"fractional_max_pool{dims}d"
    if x.dim() not in (dims + 1, dims + 2):
        raise InvalidProblem(f"{fn}: input must have rank {dims + 1} (unbatched) or "
                             f"{dims + 2}, got shape {tuple(x.shape)}")
    unbatched = x.dim() == dims + 1
    batched = x.unsqueeze(0) if unbatched else x
    size = _pair(kernel_size, dims, "kernel_size", fn)
    if output_size is None and output_ratio is None:
        raise InvalidProblem(f"{fn}: output_size or output_ratio must be given")
    if output_size is not None and output_ratio is not None:
        raise InvalidProblem(f"{fn}: give output_size or output_ratio, not both")
    if output_size is None:
        ratios = [float(output_ratio)] * dims if isinstance(output_ratio, (int, float)) \
            else [float(r) for r in output_ratio]
        if len(ratios) != dims or not all(0.0 < r < 1.0 for r in ratios):
            raise InvalidProblem(f"{fn}: output_ratio = {output_ratio!r} must be {dims} "
                                 "values in (0, 1)")
        out = [int(n * r) for n, r in zip(batched.shape[2:], ratios)]
    else:
        out = _pair(output_size, dims, "output_size", fn)
    n, c = batched.shape[0], batched.shape[1]
    if random_samples is None:
        random_samples = torch.rand(n, c, dims, dtype=x.dtype, device=x.device)
    elif tuple(random_samples.shape) != (n, c, dims) \
            or random_samples.dtype != x.dtype:
        raise InvalidProblem(
            f"{fn}: _random_samples must be [{n}, {c}, {dims}] of the input's dtype "
            f"{x.dtype} (torch's convention), got {list(random_samples.shape)} "
            f"{random_samples.dtype}")
    samples = random_samples.float()
    if dims == 2:  # torch orders its 2-D samples (w, h); the plan takes (h, w)
        samples = samples.flip(-1)
    y, indices = _fmp(batched, size, out, samples, placement)
    if plane_indices:  # torch: offsets into each (D x) H x W plane
        indices = indices.remainder(math.prod(batched.shape[2:]))
    if unbatched:
        y, indices = y.squeeze(0), indices.squeeze(0)
    return (y, indices) if return_indices else y


def fractional_max_pool2d(input: Tensor, kernel_size: Sequence[int] | int,  # noqa: A002
                          output_size: Sequence[int] | int | None = None,
                          output_ratio: Sequence[float] | float | None = None,
                          return_indices: bool = False,
                          _random_samples: Tensor | None = None, *,
                          placement: str = "torch",
                          plane_indices: bool = True) -> Tensor | tuple[Tensor, Tensor]:
    """``F.fractional_max_pool2d`` with torch's arguments and conventions (samples
    ``[N, C, 2]`` in the input's dtype ordered ``(w, h)``, indices into each ``H x W``
    plane, unbatched ``[C, H, W]`` input); the backward is deterministic.
    ``placement="baracuda"`` takes upstream's window formula instead, and
    ``plane_indices=False`` returns offsets into the whole input."""
    return _pool(2, input, kernel_size, output_size, output_ratio, return_indices,
                 _random_samples, placement, plane_indices)


def fractional_max_pool3d(input: Tensor, kernel_size: Sequence[int] | int,  # noqa: A002
                          output_size: Sequence[int] | int | None = None,
                          output_ratio: Sequence[float] | float | None = None,
                          return_indices: bool = False,
                          _random_samples: Tensor | None = None, *,
                          placement: str = "torch",
                          plane_indices: bool = True) -> Tensor | tuple[Tensor, Tensor]:
    """``F.fractional_max_pool3d`` with torch's arguments and conventions (samples
    ``[N, C, 3]`` in the input's dtype ordered ``(d, h, w)``, indices into each
    ``D x H x W`` volume, unbatched ``[C, D, H, W]`` input); options as
    :func:`fractional_max_pool2d`."""
    return _pool(3, input, kernel_size, output_size, output_ratio, return_indices,
                 _random_samples, placement, plane_indices)
