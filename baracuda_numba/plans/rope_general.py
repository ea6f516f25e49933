"""The RoPE plans' general path (any strides and layouts; k with q in one launch;
positions, cu_seqlens, inv_freq, cos/sin tables, destination rows): its argument views and
checks and its cached ``rope_rows`` launch, a base class of the plans in ``plans/rope.py``."""

from __future__ import annotations

import math
from typing import Any

from ..arrays import TensorMut, TensorRef, as_mut, as_ref, flat_span
from ..debug import debug_enabled
from ..errors import InvalidProblem
from ..kernels.rope import ANGLES_BASE, ANGLES_INV_FREQ, ANGLES_TABLE, TABLE_KINDS
from ..streams import stream_handle
from ..types import ElementKind, RopeAngleSource, RopeLayout
from .base import fail
from .rope_sources import (
    _SIDE_UNITS,
    _TABLE_TYPESTRS,
    _check_overlap,
    _debug_check_offsets,
    _debug_check_range,
    _index_view,
    _wide,
    _words,
)


class RopeGeneralPath:
    """The general path of ``_RopeBase`` (which supplies ``_layout`` and ``_bind_rows``)."""

    def _run_general(self, args: Any, stream: Any) -> None:
        """Check every array, then one ``rope_rows`` launch for q and k together."""
        tensors, arrays, sources = self._general_views(args)
        handle = stream_handle(stream)
        (x, y, shape), *rest = tensors
        k = (rest[0][0], rest[0][1], rest[0][2][1], None) if rest else None
        if not math.prod(shape) and (k is None or not math.prod(rest[0][2])):
            return
        launch = self._general_launch(x, y, shape, arrays, sources, k=k)
        pointers = tuple(0 if a is None else a.ptr for a in arrays)
        k_pointers = (0, 0) if k is None else (k[0].ptr, k[1].ptr)
        launch(handle, x.ptr, y.ptr, *pointers, *k_pointers)

    def _general_launch(self, x: TensorRef, y: TensorMut, shape: tuple[int, int, int, int],
                        arrays: tuple[Any, ...], sources: tuple[int, ...],
                        pos_args: tuple[int, int, int, int] | None = None,
                        y_span: int | None = None,
                        k: tuple[Any, Any, int, int | None] | None = None) -> Any:
        """The cached ``rope_rows`` launch for one layout of (x, y) and the side arrays
        (``pos_args``: the positions' (words, batch stride, sequence stride, present), by
        default from ``arrays[0]``; ``y_span``: y's extent in elements where its rows are
        placed by a destination index; ``k``: (x_k, y_k, heads, y_k's span or None) in the
        same launch)."""
        layout, width = self._layout(x, y, units16_ok=False)
        k_key = None
        if k is not None:  # the narrower of the two tensors' layouts
            k_layout, k_width = self._layout(k[0], k[1], units16_ok=False)
            if k_width < width:
                layout, width = k_layout, k_width
            k_key = (k[2], k[0].strides, k[1].strides, (k[0].ptr | k[1].ptr) & 15,
                     k[0].ptr == k[1].ptr, k[3])
        extents = tuple(0 if a is None else _words(a, unit)
                        for a, unit in zip(arrays[1:], _SIDE_UNITS))
        pos = arrays[0]
        if pos_args is None:
            pos_args = (0, 0, 0, 0) if pos is None else _general_positions(pos)
        key = (shape, x.strides, y.strides, (x.ptr | y.ptr) & 15, x.ptr == y.ptr, layout,
               pos_args, extents, sources, y_span, k_key)
        launch = self._general_launches.get(key)
        if launch is None:
            bound = self._bind_rows(x, y, shape, layout, width, pos_args, sources, extents,
                                    y_span, k)
            launch = _nothing if bound is None else getattr(bound, "fast", bound)
            if len(self._general_launches) > 64:
                self._general_launches.clear()
            self._general_launches[key] = launch
        return launch

    def _logical(self, array: Any, arg: str, heads: int, write: bool) -> Any:
        """A view of q/k-shaped ``array`` as [B, H, S, D] (``desc.layout``'s axes
        permuted; THD as [1, H, T, D]), after the shape, dtype and innermost-stride
        checks."""
        desc = self.descriptor
        batch, _, seq, dim = desc.batch_size, heads, desc.seq_len, desc.head_dim
        layout = desc.layout
        shape = {RopeLayout.BHSD: (batch, heads, seq, dim),
                 RopeLayout.BSHD: (batch, seq, heads, dim),
                 RopeLayout.THD: (seq, heads, dim)}[layout]
        view = (as_mut if write else as_ref)(array, self.name, arg, desc.element, shape)
        if dim > 1 and view.numel and view.strides[-1] != 1:
            fail(self.name, InvalidProblem, f"{arg}.strides[{len(shape) - 1}]",
                 f"= {view.strides[-1]} must be 1 (pairs are read along the feature axis)")
        st = view.strides
        if layout is RopeLayout.BSHD:
            shape, strides = (batch, heads, seq, dim), (st[0], st[2], st[1], st[3])
        elif layout is RopeLayout.THD:
            shape, strides = (1, heads, seq, dim), (0, st[1], st[0], st[2])
        else:
            strides = st
        return type(view)(view.ptr, shape, strides, view.typestr, view.itemsize, view.owner)

    def _general_views(self, args: Any) -> tuple[list, tuple, tuple[int, ...]]:
        """((x, y, logical shape) per tensor; (positions, cu_seqlens, inv_freq, cos, sin,
        destination index) views or None; the ``ROPE_SOURCES`` tuple), every check done."""
        desc = self.descriptor
        name = self.name
        fields_ = tuple(getattr(args, f) for f in type(args).__slots__)
        source, dest, positions, k_in, k_out, inv_freq, cos, sin, cu_seqlens = fields_
        tensors = []
        heads_k = desc.num_kv_heads
        pairs = [(self._in_name, self._out_name, source, dest, desc.num_heads)]
        k_name = "k" if self._inverse == 0 else "dk"
        if heads_k:
            if k_in is None or k_out is None:
                fail(name, InvalidProblem, k_name, f"and {k_name}_out are required when "
                     f"desc.num_kv_heads = {heads_k} > 0")
            pairs.append((k_name, f"{k_name}_out", k_in, k_out, heads_k))
        elif k_in is not None or k_out is not None:
            fail(name, InvalidProblem, k_name, "is given but desc.num_kv_heads = 0")
        for in_name, out_name, a, b, heads in pairs:
            x = self._logical(a, in_name, heads, False)
            y = self._logical(b, out_name, heads, True)
            _check_overlap(name, x, y, in_name, out_name, self._itemsize)
            tensors.append((x, y, x.shape))
        seq = desc.seq_len
        thd = desc.layout is RopeLayout.THD
        cu = None
        if cu_seqlens is not None:
            if not thd:
                fail(name, InvalidProblem, "cu_seqlens", "is only for desc.layout = THD")
            cu = _index_view(name, "cu_seqlens", cu_seqlens, (desc.batch_size + 1,))
            if desc.batch_size and cu.strides[0] != 1:
                fail(name, InvalidProblem, "cu_seqlens.strides[0]",
                     f"= {cu.strides[0]} must be 1")
            if debug_enabled():
                _debug_check_offsets(name, cu, seq)
        pos = None
        if positions is not None:
            if cu is not None:
                shapes = ((desc.batch_size,),)
            elif thd:
                shapes = ((seq,),)
            else:
                shapes = ((seq,), (desc.batch_size, seq))
            pos = _index_view(name, "positions", positions, *shapes)
        inv = cos_view = sin_view = None
        angles = desc.angles
        half = self._rotary // 2
        if angles is RopeAngleSource.INV_FREQ:
            if inv_freq is None:
                fail(name, InvalidProblem, "inv_freq", "is required (desc.angles = INV_FREQ)")
            inv = as_ref(inv_freq, name, "inv_freq", ElementKind.F32, (half,))
            if half > 1 and inv.strides[0] != 1:
                fail(name, InvalidProblem, "inv_freq.strides[0]", f"= {inv.strides[0]} must be 1")
        elif inv_freq is not None:
            fail(name, InvalidProblem, "inv_freq", f"is given but desc.angles = {angles.name}")
        table = (0,) * 6
        if angles in (RopeAngleSource.COS_SIN_CACHE, RopeAngleSource.COS_SIN_GATHERED):
            cos_view, sin_view, table = self._cos_sin(cos, sin, pos, cu)
        elif cos is not None or sin is not None:
            fail(name, InvalidProblem, "cos", f"is given but desc.angles = {angles.name}")
        source_kind = {RopeAngleSource.BASE: ANGLES_BASE,
                       RopeAngleSource.INV_FREQ: ANGLES_INV_FREQ}.get(angles, ANGLES_TABLE)
        sources = (_wide(pos), 0, 0 if cu is None else desc.batch_size, _wide(cu),
                   source_kind) + table[:5] + (0,) * 14
        return tensors, (pos, cu, inv, cos_view, sin_view, None), sources

    def _cos_sin(self, cos: Any, sin: Any, pos: Any, cu: Any) -> tuple[Any, Any, tuple]:
        """Views of the cos/sin tables and (kind, batch, sequence, position, column
        strides) for ``ROPE_SOURCES``; a cache must cover every position the host knows."""
        desc, name = self.descriptor, self.name
        if cos is None or sin is None:
            fail(name, InvalidProblem, "cos", f"and sin are required (desc.angles = "
                 f"{desc.angles.name})")
        cos_view = as_ref(cos, name, "cos")
        sin_view = as_ref(sin, name, "sin")
        kind = _TABLE_TYPESTRS.get(cos_view.typestr)
        if kind is None:
            fail(name, InvalidProblem, "cos", f"has dtype {cos_view.typestr}; it must be f16, "
                 "bf16, f32 or f64")
        if (sin_view.typestr != cos_view.typestr or sin_view.shape != cos_view.shape
                or sin_view.strides != cos_view.strides):
            fail(name, InvalidProblem, "sin", "must have cos's dtype, shape and strides")
        shape, st = cos_view.shape, cos_view.strides
        rotary = self._rotary
        width = shape[-1] if shape else -1
        if width not in (rotary, rotary // 2) or not shape:
            fail(name, InvalidProblem, "cos", f"has shape {shape}; its last axis must be "
                 f"rotary_dim = {rotary} or rotary_dim / 2 = {rotary // 2}")
        column = st[-1] * (2 if width == rotary and not self._half_split else 1)
        seq, batch = desc.seq_len, desc.batch_size
        if desc.angles is RopeAngleSource.COS_SIN_CACHE:
            if len(shape) != 2:
                fail(name, InvalidProblem, "cos", f"has shape {shape}; a cache is [S_max, "
                     f"{rotary} | {rotary // 2}]")
            if pos is None and cu is None and shape[0] < seq:
                fail(name, InvalidProblem, "cos", f"has {shape[0]} rows; positions up to "
                     f"{seq - 1} need seq_len = {seq}")
            if debug_enabled():
                _debug_check_range(name, "positions", pos, 0, shape[0])
            return cos_view, sin_view, (TABLE_KINDS[kind], 0, 0, st[0], column, 0)
        thd = desc.layout is RopeLayout.THD
        if thd and len(shape) == 2 and shape[0] == seq:
            return cos_view, sin_view, (TABLE_KINDS[kind], 0, st[0], 0, column, 0)
        if len(shape) == 2 and shape[0] == seq and not thd:
            return cos_view, sin_view, (TABLE_KINDS[kind], 0, st[0], 0, column, 0)
        if len(shape) == 3 and shape[1] == seq and shape[0] in (1, batch):
            stride_b = st[0] if shape[0] == batch and batch > 1 else 0
            return cos_view, sin_view, (TABLE_KINDS[kind], stride_b, st[1], 0, column, 0)
        fail(name, InvalidProblem, "cos", f"has shape {shape}; gathered tables are "
             f"[1 | B, S, {rotary} | {rotary // 2}] = [1 | {batch}, {seq}, ...]"
             + (" or [T, ...]" if thd else ""))
        raise AssertionError  # unreachable: fail raises


def _positions_args(pos: TensorRef | None) -> tuple[int, int, int, int]:
    """The kernels' positions arguments: (flat extent, batch stride, sequence stride,
    present); a ``[S]`` tensor has batch stride 0."""
    if pos is None:
        return 0, 0, 0, 0
    pos_b, pos_s = pos.strides if len(pos.shape) == 2 else (0, pos.strides[0])
    return flat_span(pos.shape, pos.strides), pos_b, pos_s, 1


def _general_positions(pos: Any) -> tuple[int, int, int, int]:
    """(extent in 32-bit words, batch stride, sequence stride, present) of positions."""
    extent, pos_b, pos_s, present = _positions_args(pos)
    return extent * pos.itemsize // 4, pos_b, pos_s, present


def _nothing(*_: Any) -> None:
    """The memoised launch of an in-place call with nothing to rotate."""
