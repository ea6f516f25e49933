"""torch twins of the the in-place window write."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .. import ops
from ._core import LIB, compiling

__all__ = ["write_slice_"]

@torch.library.custom_op(f"{LIB}::write_slice_", mutates_args=("dest",))
def _write_slice_op(dest: Tensor, source: Tensor, offsets: Sequence[int]) -> None:
    ops.write_slice(dest, source, list(offsets))


@_write_slice_op.register_fake
def _(dest: Tensor, source: Tensor, offsets: Sequence[int]) -> None:
    return None


def write_slice_(dest: Tensor, source: Tensor, offsets: Sequence[int]) -> Tensor:
    """``dest[o_0:o_0+n_0, ...] = source`` in place (non-differentiable); returns ``dest``."""
    if compiling():
        _write_slice_op(dest, source, list(offsets))
    else:
        ops.write_slice(dest, source, offsets)
    return dest
