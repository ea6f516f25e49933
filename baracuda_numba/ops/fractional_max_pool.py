"""Functional fractional max pooling (2-D and 3-D) and its backward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidProblem
from ..plans.fractional_max_pool import (
    FractionalMaxPool2dBwArgs,
    FractionalMaxPool2dDescriptor,
    FractionalMaxPool2dFwArgs,
    FractionalMaxPool2dPlan,
    FractionalMaxPool3dBwArgs,
    FractionalMaxPool3dDescriptor,
    FractionalMaxPool3dFwArgs,
    FractionalMaxPool3dPlan,
    FractionalPlacement,
)
from ..types import ElementKind
from ._core import call_site, plan_for

__all__ = [
    "fractional_max_pool2d", "fractional_max_pool2d_backward", "fractional_max_pool3d",
    "fractional_max_pool3d_backward",
]


def _placement(placement: FractionalPlacement | str) -> FractionalPlacement:
    if isinstance(placement, FractionalPlacement):
        return placement
    return FractionalPlacement[placement.upper()]


# spatial dims -> (plan, descriptor, forward args, backward args)
_FMP_CLASSES = {
    2: (FractionalMaxPool2dPlan, FractionalMaxPool2dDescriptor, FractionalMaxPool2dFwArgs,
        FractionalMaxPool2dBwArgs),
    3: (FractionalMaxPool3dPlan, FractionalMaxPool3dDescriptor, FractionalMaxPool3dFwArgs,
        FractionalMaxPool3dBwArgs),
}


def _fmp_plan(dims: int, shape: tuple[int, ...], window: tuple[int, ...],
              out: tuple[int, ...], element: ElementKind, where: FractionalPlacement) -> Any:
    plan_class, desc_class, _, _ = _FMP_CLASSES[dims]
    return plan_for(("fmp", dims, shape, window, out, element, where),
                    lambda: plan_class.select(desc_class(*shape, *window, *out, element,
                                                         placement=where)))


def _fmp(dims: int, x: Any, kernel_size: Sequence[int] | int, output_size: Sequence[int],
         random_samples: Any, placement: Any, stream: Any) -> tuple[Any, Any]:
    window = _window(kernel_size, dims)
    output_size = tuple(output_size)

    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        if len(shape) != dims + 2:
            raise InvalidProblem(f"fractional_max_pool{dims}d: x must have rank {dims + 2}, "
                                 f"got shape {shape}")
        out = tuple(int(o) for o in output_size)
        plan = _fmp_plan(dims, shape, window, out, element, _placement(placement))
        return plan, ((shape[:2] + out, element), (shape[:2] + out, ElementKind.I64)), 0

    plan, (alloc_y, alloc_indices), current, *_ = call_site(
        x, ("fmp", dims, window, output_size, placement), make)
    y, indices = alloc_y(x), alloc_indices(x)
    plan.run_fw(_FMP_CLASSES[dims][2](x, y, indices, random_samples),
                stream=current() if stream is None else stream)
    return y, indices


def _window(kernel_size: Sequence[int] | int, dims: int) -> tuple[int, ...]:
    return (int(kernel_size),) * dims if isinstance(kernel_size, int) \
        else tuple(int(k) for k in kernel_size)


def _fmp_backward(dims: int, dy: Any, indices: Any, input_shape: Sequence[int],
                  kernel_size: Sequence[int] | int, placement: Any, stream: Any) -> Any:
    window = _window(kernel_size, dims)
    input_shape = tuple(input_shape)

    def make(dy_shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        shape = tuple(int(s) for s in input_shape)
        plan = _fmp_plan(dims, shape, window, dy_shape[2:], element, _placement(placement))
        return plan, ((shape, element),), 0

    plan, (alloc_dx,), current, *_ = call_site(
        dy, ("fmp_bw", dims, input_shape, window, placement), make)
    dx = alloc_dx(dy)
    plan.run_bw(_FMP_CLASSES[dims][3](dy, indices, dx),
                stream=current() if stream is None else stream)
    return dx


def fractional_max_pool2d(x: Any, kernel_size: Sequence[int] | int, output_size: Sequence[int],
                          random_samples: Any, *, placement: Any = "baracuda",
                          stream: Any = None) -> tuple[Any, Any]:
    """Fractional max pooling of NCHW ``x``: ``(y, indices)``, indices int64 offsets into
    the whole input. ``random_samples``: f32 ``[N, C, 2]`` uniforms in [0, 1)."""
    return _fmp(2, x, kernel_size, output_size, random_samples, placement, stream)


def fractional_max_pool3d(x: Any, kernel_size: Sequence[int] | int, output_size: Sequence[int],
                          random_samples: Any, *, placement: Any = "baracuda",
                          stream: Any = None) -> tuple[Any, Any]:
    """3-D sibling of :func:`fractional_max_pool2d` (NCDHW, samples ``[N, C, 3]``)."""
    return _fmp(3, x, kernel_size, output_size, random_samples, placement, stream)


def fractional_max_pool2d_backward(dy: Any, indices: Any, input_shape: Sequence[int],
                                   kernel_size: Sequence[int] | int, *,
                                   placement: Any = "baracuda", stream: Any = None) -> Any:
    """``dx`` of :func:`fractional_max_pool2d`: deterministic, every element written."""
    return _fmp_backward(2, dy, indices, input_shape, kernel_size, placement, stream)


def fractional_max_pool3d_backward(dy: Any, indices: Any, input_shape: Sequence[int],
                                   kernel_size: Sequence[int] | int, *,
                                   placement: Any = "baracuda", stream: Any = None) -> Any:
    """``dx`` of :func:`fractional_max_pool3d`."""
    return _fmp_backward(3, dy, indices, input_shape, kernel_size, placement, stream)
