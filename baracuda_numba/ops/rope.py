"""Functional rotary position embedding, its backward, and the fused rotate-and-append to
a KV cache."""

from __future__ import annotations

from typing import Any

from .._frameworks import allocator, element_of
from ..errors import InvalidProblem
from ..plans.rope import (
    RopeArgs,
    RopeBackwardArgs,
    RopeBackwardDescriptor,
    RopeBackwardPlan,
    RopeDescriptor,
    RopePlan,
)
from ..plans.rope_kv_cache import (
    RopeKvCacheAppendArgs,
    RopeKvCacheAppendDescriptor,
    RopeKvCacheAppendPlan,
)
from ..types import ElementKind, RopeAngleSource, RopeLayout, RopePairing
from ._core import call_site, plan_for

__all__ = ["rope", "rope_backward", "rope_cache_write"]


def _pairing(pairing: RopePairing | str) -> RopePairing:
    if isinstance(pairing, RopePairing):
        return pairing
    return RopePairing[pairing.upper().replace("-", "_")]


def _layout(layout: RopeLayout | str) -> RopeLayout:
    if isinstance(layout, RopeLayout):
        return layout
    try:
        return RopeLayout[str(layout).upper()]
    except KeyError:
        raise InvalidProblem(f"rope: layout = {layout!r} must be 'BHSD', 'BSHD' or "
                             "'THD'") from None


def _angles(inv_freq: Any, cos: Any, sin: Any) -> RopeAngleSource:
    """INV_FREQ for ``inv_freq``; cos/sin of rank 2 are a cache indexed by position
    (``[S_max, R | R/2]``), of rank 3 gathered per token (``[1 | B, S, R | R/2]``)."""
    if inv_freq is not None:
        if cos is not None or sin is not None:
            raise InvalidProblem("rope: give inv_freq or cos/sin, not both")
        return RopeAngleSource.INV_FREQ
    if cos is None and sin is None:
        return RopeAngleSource.BASE
    if cos is None or sin is None:
        raise InvalidProblem("rope: cos and sin go together")
    return RopeAngleSource.COS_SIN_CACHE if len(cos.shape) == 2 \
        else RopeAngleSource.COS_SIN_GATHERED


def _geometry(shape: tuple[int, ...], layout: RopeLayout, cu_seqlens: Any,
              fn: str) -> tuple[int, int, int, int]:
    """(B, H, S, D) of a q/k-shaped array in ``layout`` (THD: B = cu_seqlens' sequences)."""
    rank = 3 if layout is RopeLayout.THD else 4
    if len(shape) != rank:
        raise InvalidProblem(f"{fn}: x must be {layout.name} (rank {rank}), got shape {shape}")
    if layout is RopeLayout.THD:
        batch = 1 if cu_seqlens is None else int(cu_seqlens.shape[0]) - 1
        return batch, shape[1], shape[0], shape[2]
    if layout is RopeLayout.BSHD:
        return shape[0], shape[2], shape[1], shape[3]
    return shape[0], shape[1], shape[2], shape[3]


def _rope(backward: bool, x: Any, k: Any, positions: Any, base: float, pairing: Any,
          rotary_dim: int | None, inplace: bool, stream: Any, inv_freq: Any, cos: Any,
          sin: Any, layout: Any, cu_seqlens: Any) -> Any:
    fn = "rope_backward" if backward else "rope"
    order = _layout(layout)
    angles = _angles(inv_freq, cos, sin)
    k_shape = None if k is None else tuple(int(s) for s in k.shape)
    cu_len = None if cu_seqlens is None else int(cu_seqlens.shape[0])

    def make(shape: tuple[int, ...], element: ElementKind) -> tuple[Any, tuple, int]:
        batch, heads, seq, dim = _geometry(shape, order, cu_seqlens, fn)
        kv = 0
        if k_shape is not None:
            kv = _geometry(k_shape, order, cu_seqlens, fn)[1]
        options = dict(base=float(base), element=element, pairing=_pairing(pairing),
                       rotary_dim=rotary_dim, num_kv_heads=kv, layout=order, angles=angles)
        key = ("rope_bw" if backward else "rope", batch, heads, seq, dim,
               tuple(sorted(options.items(), key=lambda item: item[0])))
        if backward:
            plan = plan_for(key, lambda: RopeBackwardPlan.select(RopeBackwardDescriptor(
                batch, heads, seq, dim, **options)))
        else:
            plan = plan_for(key, lambda: RopePlan.select(RopeDescriptor(
                batch, heads, seq, dim, **options)))
        return plan, (None if inplace else (shape, element),), 0

    plan, (alloc_y,), current, *_ = call_site(
        x, ("rope", backward, base, pairing, rotary_dim, inplace, order, angles, k_shape,
            cu_len), make)
    y = x if alloc_y is None else alloc_y(x)
    k_out = None
    if k is not None:
        k_out = k if inplace else allocator(k, k_shape, element_of(k))(k)
    cls = RopeBackwardArgs if backward else RopeArgs
    args = cls(x, y, positions, k, k_out, inv_freq, cos, sin, cu_seqlens)
    plan.run(args, stream=current() if stream is None else stream)
    return y if k is None else (y, k_out)


def rope(x: Any, *, k: Any = None, positions: Any = None, base: float = 10000.0,
         inv_freq: Any = None, cos: Any = None, sin: Any = None,
         pairing: RopePairing | str = RopePairing.INTERLEAVED, rotary_dim: int | None = None,
         layout: RopeLayout | str = "BHSD", cu_seqlens: Any = None, inplace: bool = False,
         stream: Any = None) -> Any:
    """Rotary position embedding of ``x`` (``layout``: ``[B, H, S, D]``, ``[B, S, H, D]``
    or packed ``[T, H, D]``; last axis stride 1, other axes any stride), and of ``k``
    (same layout, kv heads dividing x's) in the same run: then ``(x_out, k_out)``.

    Angles from ``base``, or ``inv_freq`` (f32 ``[R/2]``), or ``cos``/``sin`` (any float
    dtype; rank 2: a cache ``[S_max, R | R/2]`` indexed by position, rank 3: gathered per
    token ``[1 | B, S, R | R/2]``). ``positions``: int32/int64 ``[S]`` or ``[B, S]``
    (``THD``: ``[T]``, or per-sequence offsets ``[B]`` with ``cu_seqlens``), default
    ``s`` (``THD`` with ``cu_seqlens`` int32/int64 ``[B + 1]``: the index in the
    sequence)."""
    return _rope(False, x, k, positions, base, pairing, rotary_dim, inplace, stream,
                 inv_freq, cos, sin, layout, cu_seqlens)


def rope_backward(dy: Any, *, dk: Any = None, positions: Any = None, base: float = 10000.0,
                  inv_freq: Any = None, cos: Any = None, sin: Any = None,
                  pairing: RopePairing | str = RopePairing.INTERLEAVED,
                  rotary_dim: int | None = None, layout: RopeLayout | str = "BHSD",
                  cu_seqlens: Any = None, inplace: bool = False, stream: Any = None) -> Any:
    """Gradient of :func:`rope`: the rotation of ``dy`` (and ``dk``) by ``-theta``."""
    return _rope(True, dy, dk, positions, base, pairing, rotary_dim, inplace, stream,
                 inv_freq, cos, sin, layout, cu_seqlens)


def rope_cache_write(q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, *,
                     cache_offsets: Any = None, slot_mapping: Any = None,
                     positions: Any = None, base: float = 10000.0, inv_freq: Any = None,
                     cos: Any = None, sin: Any = None,
                     pairing: RopePairing | str = RopePairing.INTERLEAVED,
                     rotary_dim: int | None = None, layout: RopeLayout | str = "BHSD",
                     inplace: bool = False, stream: Any = None) -> Any:
    """Rotate q and k, write rotated k and v into the caches; returns rotated q.

    Contiguous caches ``[B, H_kv, S_max, D]`` take ``cache_offsets`` (int32/int64 ``[B]``:
    the new tokens land at ``cache_offsets[b] + l``, the default positions); paged caches
    ``[num_pages, page_size, H_kv, D]`` take ``slot_mapping`` (``[B, L]``, or ``[T]`` for
    ``THD``; negative slots are skipped) and ``positions``. See
    :class:`~baracuda_numba.plans.rope_kv_cache.RopeKvCacheAppendPlan`."""
    order = _layout(layout)
    angles = _angles(inv_freq, cos, sin)
    shape = tuple(int(s) for s in q.shape)
    batch, heads, length, dim = _geometry(shape, order, None, "rope_cache_write")
    kv = _geometry(tuple(int(s) for s in k.shape), order, None, "rope_cache_write")[1]
    paged = slot_mapping is not None
    cache_shape = tuple(int(s) for s in k_cache.shape)
    if len(cache_shape) != 4:
        raise InvalidProblem(f"rope_cache_write: k_cache must have rank 4, got {cache_shape}")
    element = element_of(q)
    extra = (dict(page_size=cache_shape[1], num_pages=cache_shape[0]) if paged
             else dict(max_cache_len=cache_shape[2]))
    options = dict(base=float(base), element=element, pairing=_pairing(pairing),
                   rotary_dim=rotary_dim, layout=order, angles=angles, **extra)
    key = ("rope_cache", batch, heads, kv, length, dim,
           tuple(sorted(options.items(), key=lambda item: item[0])))
    plan = plan_for(key, lambda: RopeKvCacheAppendPlan.select(RopeKvCacheAppendDescriptor(
        batch, heads, kv, length, dim, **options)), q)
    q_out = q if inplace else allocator(q, shape, element)(q)
    if stream is None:
        from .._frameworks import stream_source

        stream = stream_source(q)()
    plan.run(RopeKvCacheAppendArgs(q, q_out, k, v, k_cache, v_cache, cache_offsets,
                                   slot_mapping, positions, inv_freq, cos, sin), stream=stream)
    return q_out
