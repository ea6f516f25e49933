"""``RopeKvCacheAppendPlan``: rotate q and k, append k (rotated) and v to a KV cache.

Upstream's ``KvCacheAppendPlan`` (contiguous cache, per-sample ``cache_offsets``) and
``PagedKvAppendPlan`` (paged cache) with RoPE fused into the append of k::

    q_out[b, h, l]                      = rope(q[b, h, l], pos(b, l))
    k_cache[b, h, cache_offsets[b] + l] = rope(k[b, h, l], pos(b, l))     (contiguous)
    v_cache[b, h, cache_offsets[b] + l] = v[b, h, l]
    k_cache[slot // P, slot % P, h]     = rope(k[b, h, l], pos(b, l))     (paged, with
    v_cache[slot // P, slot % P, h]     = v[b, h, l]                  slot = slot_mapping[b, l])

with ``pos(b, l) = positions[b, l]`` if given, else ``cache_offsets[b] + l`` (contiguous).
The caches are ``[B, H_kv, S_max, D]`` (contiguous; any strides, innermost 1) or
``[num_pages, page_size, H_kv, D]`` (vLLM's layout; pages and slots one stride apart);
q/k/v are ``[B, H, L, D]``, ``[B, L, H, D]`` or packed ``[T, H, D]`` (paged only) as
``desc.layout`` says. The rotation is ``RopePlan``'s (same kernel body, same angles), so
the cache holds the bits ``RopePlan`` followed by ``WriteSlicePlan`` would write.

Targets outside the cache (``cache_offsets[b] + l`` not in ``[0, S_max)``, a slot not in
``[0, num_pages · page_size)``, e.g. vLLM's ``-1`` for padding tokens) are skipped, as
upstream's ``KvCacheAppendPlan`` skips them; the offsets and slots live on the device, so
``BARACUDA_DEBUG=1`` copies them to the host and raises ``InvalidProblem`` instead.
Two launches of ``rope_rows`` (q with k, whose rows the index places; then v, copied);
deterministic, no workspace.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..arrays import as_mut, flat_span
from ..debug import debug_enabled
from ..errors import InvalidProblem
from ..streams import stream_handle
from ..types import (
    ElementKind,
    PlanPreference,
    RopeAngleSource,
    RopeLayout,
    RopePairing,
)
from .base import LAUNCHED, LayoutMemo, Plan, fail, plan_args, store_replay, written_pairs
from .rope import ROPE_DEFAULT_BASE, RopeArgs, RopeDescriptor, RopePlan
from .rope_sources import _debug_check_range, _index_view, _wide

__all__ = ["RopeKvCacheAppendArgs", "RopeKvCacheAppendDescriptor", "RopeKvCacheAppendPlan"]

#: The args' arrays in field order (the memo's arrays); q_out, k_cache and v_cache are
#: written, so each must be disjoint from every other array (q_out may be q itself).
_FIELDS = ("q", "q_out", "k", "v", "k_cache", "v_cache", "cache_offsets", "slot_mapping",
           "positions", "inv_freq", "cos", "sin")
_WRITTEN = (1, 4, 5)


@dataclass(frozen=True, slots=True)
class RopeKvCacheAppendDescriptor:
    """q ``[B, num_heads, new_len, D]`` and k / v ``[B, num_kv_heads, new_len, D]`` (in
    ``layout``'s axis order; ``THD``: ``new_len`` = T tokens, ``batch_size`` 1); a
    contiguous cache of ``max_cache_len`` positions, or (``page_size`` > 0) a paged cache
    of ``num_pages`` pages; RoPE fields as :class:`~baracuda_numba.plans.rope.RopeDescriptor`."""

    batch_size: int
    num_heads: int
    num_kv_heads: int
    new_len: int
    head_dim: int
    max_cache_len: int = field(default=0, kw_only=True)
    page_size: int = field(default=0, kw_only=True)
    num_pages: int = field(default=0, kw_only=True)
    base: float = field(default=ROPE_DEFAULT_BASE, kw_only=True)
    element: ElementKind = field(kw_only=True)
    pairing: RopePairing = field(default=RopePairing.INTERLEAVED, kw_only=True)
    rotary_dim: int | None = field(default=None, kw_only=True)
    layout: RopeLayout = field(default=RopeLayout.BHSD, kw_only=True)
    angles: RopeAngleSource = field(default=RopeAngleSource.BASE, kw_only=True)


@plan_args
class RopeKvCacheAppendArgs:
    """q is read and ``q_out`` written (may be q); k and v are read; ``k_cache`` /
    ``v_cache`` written at ``cache_offsets`` ([B], contiguous) or ``slot_mapping`` ([B, L]
    or [T], paged), int32 or int64; ``positions`` as ``RopeArgs``' (required for a paged
    cache); ``inv_freq`` / ``cos`` / ``sin`` as ``desc.angles`` says."""

    q: Any
    q_out: Any
    k: Any
    v: Any
    k_cache: Any
    v_cache: Any
    cache_offsets: Any = None
    slot_mapping: Any = None
    positions: Any = None
    inv_freq: Any = None
    cos: Any = None
    sin: Any = None


class RopeKvCacheAppendPlan(Plan):
    """See the module docstring."""

    name = "RopeKvCacheAppendPlan"

    @classmethod
    def select(cls, desc: RopeKvCacheAppendDescriptor,
               pref: PlanPreference | None = None) -> RopeKvCacheAppendPlan:
        if not isinstance(desc, RopeKvCacheAppendDescriptor):
            fail(cls.name, InvalidProblem, "desc", f"is a {type(desc).__name__}, not a "
                 "RopeKvCacheAppendDescriptor")
        for name in ("num_kv_heads", "max_cache_len", "page_size", "num_pages"):
            value = getattr(desc, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                fail(cls.name, InvalidProblem, f"desc.{name}",
                     f"= {value!r} must be a non-negative int")
        paged = desc.page_size > 0
        if not paged and desc.max_cache_len < 1 and desc.new_len:
            fail(cls.name, InvalidProblem, "desc.max_cache_len",
                 f"= {desc.max_cache_len} must be >= 1 (or give page_size for a paged cache)")
        if paged and desc.num_pages < 1:
            fail(cls.name, InvalidProblem, "desc.num_pages",
                 f"= {desc.num_pages} must be >= 1 for a paged cache")
        if not paged and desc.layout is RopeLayout.THD:
            fail(cls.name, InvalidProblem, "desc.layout",
                 "= THD needs a paged cache (slot_mapping addresses each token)")
        if desc.num_kv_heads < 1 and desc.new_len:
            fail(cls.name, InvalidProblem, "desc.num_kv_heads", "must be >= 1")
        common = dict(base=desc.base, element=desc.element, pairing=desc.pairing,
                      rotary_dim=desc.rotary_dim, layout=desc.layout, angles=desc.angles)
        # q's engine (the k heads given so that select checks that they divide q's)
        rope = RopePlan.select(RopeDescriptor(desc.batch_size, desc.num_heads, desc.new_len,
                                              desc.head_dim, num_kv_heads=desc.num_kv_heads,
                                              **common), pref)
        return cls(desc, rope, pref)

    def __init__(self, desc: RopeKvCacheAppendDescriptor, rope: RopePlan,
                 pref: PlanPreference | None) -> None:
        super().__init__(desc, rope.sku, pref)
        # q (with k in its launch) and the v copy (nothing rotated): RopePlan's engine
        self._rope = RopePlan.select(replace(rope.descriptor, num_kv_heads=0), pref)
        self._v = RopePlan.select(replace(rope.descriptor, num_heads=desc.num_kv_heads,
                                          num_kv_heads=0, rotary_dim=0,
                                          angles=RopeAngleSource.BASE), pref)
        self._paged = desc.page_size > 0
        # a layout seen before skips the checks (decode calls); in place (q_out is q) has
        # its own memo, without the q / q_out disjointness test
        self._memo = LayoutMemo(len(_FIELDS), written_pairs(len(_FIELDS), _WRITTEN))
        self._memo_in_place = LayoutMemo(len(_FIELDS),
                                         written_pairs(len(_FIELDS), _WRITTEN, ((0, 1),)))

    def can_implement(self, args: RopeKvCacheAppendArgs) -> tuple[Any, ...]:
        """Every check; returns the launches: (engine, x, y, shape, side arrays, sources,
        positions arguments, y's span, k's (x_k, y_k, heads, span) or None)."""
        desc, name = self.descriptor, self.name
        rope = self._rope
        q_args = RopeArgs(args.q, args.q_out, args.positions, inv_freq=args.inv_freq,
                          cos=args.cos, sin=args.sin)
        if self._paged and args.positions is None and desc.angles in (
                RopeAngleSource.BASE, RopeAngleSource.INV_FREQ,
                RopeAngleSource.COS_SIN_CACHE):
            fail(name, InvalidProblem, "positions", "is required with a paged cache")
        # q's checks and the angle arrays (through the q-only engine)
        tensors, arrays, sources = rope._general_views(q_args)
        kv_heads = desc.num_kv_heads
        k = rope._logical(args.k, "k", kv_heads, False)
        v = rope._logical(args.v, "v", kv_heads, False)
        batch, _, length, dim = k.shape
        if self._paged:
            pages, page = desc.num_pages, desc.page_size
            cache_shape = (pages, page, kv_heads, dim)
            limit = pages * page
        else:
            cache_shape = (desc.batch_size, kv_heads, desc.max_cache_len, dim)
            limit = desc.max_cache_len
        caches = []
        for arg, array in (("k_cache", args.k_cache), ("v_cache", args.v_cache)):
            cache = as_mut(array, name, arg, desc.element, cache_shape)
            st = cache.strides
            if dim > 1 and cache.numel and st[3] != 1:
                fail(name, InvalidProblem, f"{arg}.strides[3]", f"= {st[3]} must be 1")
            if self._paged and st[0] != page * st[1] and pages > 1:
                fail(name, InvalidProblem, f"{arg}.strides[0]", f"= {st[0]} must be "
                     f"page_size * strides[1] = {page * st[1]} (slots one stride apart)")
            caches.append(cache)
        if self._paged:
            if args.slot_mapping is None:
                fail(name, InvalidProblem, "slot_mapping", "is required with a paged cache")
            shapes = (((length,),) if desc.layout is RopeLayout.THD
                      else ((batch, length),))
            dest = _index_view(name, "slot_mapping", args.slot_mapping, *shapes)
            dest_b, dest_s = dest.strides if len(dest.shape) == 2 else (0, dest.strides[0])
            plus_s = 0
        else:
            if args.cache_offsets is None:
                fail(name, InvalidProblem, "cache_offsets", "is required with a contiguous "
                     "cache")
            dest = _index_view(name, "cache_offsets", args.cache_offsets, (batch,))
            dest_b, dest_s, plus_s = dest.strides[0], 0, 1
        if debug_enabled():
            if self._paged:  # negative slots are padding tokens, skipped
                _debug_check_range(name, "slot_mapping", dest, -(1 << 62), limit)
            else:  # every target cache_offsets[b] + l inside the cache
                _debug_check_range(name, "cache_offsets", dest, 0, limit - length + 1)
        pos_args = None
        arrays = arrays[:5] + (dest,)
        if args.positions is None and not self._paged:
            # positions = cache_offsets[b] + l
            arrays = (dest,) + arrays[1:]
            pos_args = (flat_span(dest.shape, dest.strides) * dest.itemsize // 4,
                        dest.strides[0], 0, 1)
            sources = (_wide(dest), 1) + sources[2:]
        x, y, shape = tensors[0]
        targets = []
        for cache in caches:
            if self._paged:  # row (b, l) -> slot; within a slot the heads at strides[2]
                strides, y_dest = (0, cache.strides[2], 0, 1), cache.strides[1]
            else:
                strides, y_dest = cache.strides[:3] + (1,), cache.strides[2]
            targets.append((type(cache)(cache.ptr, k.shape, strides, cache.typestr,
                                        cache.itemsize, cache.owner),
                            flat_span(cache.shape, cache.strides)))
        placing = (_wide(dest), dest_b, dest_s, y_dest, plus_s, limit)
        # q and k in one launch, the index placing k's rows (has_dest 2)
        launches = [(rope, x, y, shape, arrays, sources[:10] + (2,) + placing + sources[17:],
                     pos_args, None, (k, targets[0][0], kv_heads, targets[0][1]))]
        # v copied (nothing rotated, no angles read), the index placing its rows
        copy_sources = sources[:4] + (0,) * 6 + (1,) + placing + sources[17:]
        launches.append((self._v, v, targets[1][0], v.shape, arrays, copy_sources, pos_args,
                         targets[1][1], None))
        return tuple(launches)

    def run(self, args: RopeKvCacheAppendArgs, stream: Any = None,
            workspace: Any = None) -> None:
        """q and k (into its cache) in one launch, then v into its cache, on ``stream``.

        Fast path for torch tensors and CuPy arrays (``LayoutMemo``): a layout seen before
        skips the checks and replays the launches with this call's pointers; the written
        arrays' disjointness is tested per call. Under ``BARACUDA_DEBUG`` every call takes
        the checked path (it reads the offsets / slots)."""
        arrays = tuple(getattr(args, name) for name in _FIELDS)
        memo = self._memo_in_place if args.q is args.q_out else self._memo
        memo_key = None if debug_enabled() else memo.launch(stream, None, *arrays)
        if memo_key is LAUNCHED:
            return
        launches = self.can_implement(args)
        handle = stream_handle(stream)
        calls = []
        for engine, x, y, shape, side, sources, pos_args, y_span, k in launches:
            if x.numel == 0 and (k is None or k[0].numel == 0):
                continue
            launch = engine._general_launch(x, y, shape, side, sources, pos_args, y_span, k)
            pointers = (x.ptr, y.ptr, *(0 if a is None else a.ptr for a in side),
                        *((0, 0) if k is None else (k[0].ptr, k[1].ptr)))
            launch(handle, *pointers)
            calls.append((launch, pointers))
        store_replay(memo, memo_key, self.name, _FIELDS, arrays, calls,
                     (1,) if memo is self._memo_in_place else ())
