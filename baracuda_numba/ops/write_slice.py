"""Functional write_slice: the KV-cache style window assignment."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..plans.write_slice import WriteSliceArgs, WriteSliceDescriptor, WriteSlicePlan
from ..types import ElementKind
from ._core import call_site, plan_for

__all__ = ["write_slice"]


def write_slice(dest: Any, source: Any, offsets: Sequence[int], *, stream: Any = None) -> Any:
    """``dest[o_0:o_0+n_0, ..., o_k:o_k+n_k] = source`` in place (``n = source.shape``);
    returns ``dest``. Bit-exact; any strides."""
    offsets = tuple(offsets)

    def make(dest_shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        source_shape = tuple(int(s) for s in source.shape)
        starts = tuple(int(o) for o in offsets)
        ranges = tuple((o, o + n) for o, n in zip(starts, source_shape))
        return plan_for(("write_slice", dest_shape, source_shape, starts, element),
                        lambda: WriteSlicePlan.select(WriteSliceDescriptor(
                            dest_shape, source_shape, ranges, element))), (), 0

    site = call_site(dest, ("write_slice", source.shape, offsets), make)
    site.plan.run(WriteSliceArgs(dest, source), stream=site.stream() if stream is None
                  else stream)
    return dest
