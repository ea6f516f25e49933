"""The Max/Min gradient's tie masks: finding tied elements in packed words and rewriting
the tied words of dx from the masks (rows and columns).
"""


from dataclasses import dataclass
from typing import Any

from numba import cuda, int32, int64, uint32, uint64

from ...types import ElementKind
from ..common import compiled_for_sm90
from .words import VEC_LOADS, VECTOR, tie_mask_iters

#: Tie masks the rewrite pass of the Max/Min gradient loads at once, per kernel (one
#: dependent load per mask before: a lane walks ~30 masks of a 1e6-long row split in two).
#: The column kernel loaded 2 (one split's masks) until its first pass had grown past 80
#: registers anyway; it now takes the masks of every split a block walks as one list, 8 in
#: flight (``_col_tied_rewriter``, in a kernel of its own since: the
#: REDUCE_BACKWARD_COLS_REWRITE_KERNELS).
#: (Measurements: docs/design/reduce.md, "Measured constants".)
REWRITE_MASKS_ROWS = 8
REWRITE_MASKS_COLS = 8


@dataclass(frozen=True)
class TieWords:
    """Device functions finding the Max/Min gradient's ties in a packed word of f16/bf16
    values without unpacking it (``VectorSpec.eq_mask``: one ``set.eq`` per two values,
    where unpacking, comparing and packing take 2-3 instructions per value), for a word
    ``yw`` of the extremes (``pack`` of the W y values: exact, as each is an element):

    * ``splat(v, values)``: the word of W copies of ``v`` rounded to the element kind
      (``values``: W scratch slots);
    * ``mask(w, yw)``: the bits of each element of ``w`` equal to its y set (IEEE ==, as
      ``_elem_ties``: ``VectorSpec.eq_mask``);
    * ``count(m)``: the number of elements in mask ``m``;
    * ``select(m, cw, zw)``: the elements of ``m`` from ``cw``, the others from ``zw``
      (the gradient word: ``cw`` of the coefficients where x ties, ``zw`` of ``c - c``);
    * ``usable()``: whether ``mask`` compiles for the target (bf16's ``set.eq`` needs
      sm_90; a constant once the target is known, so the path not taken is not in the
      PTX: sm_80 keeps the unpacked comparisons)."""

    splat: Any
    mask: Any
    count: Any
    select: Any
    usable: Any  # () -> whether mask works on the target (bf16: sm_90+)


def _tie_words(element: ElementKind) -> TieWords:
    """The ``TieWords`` of an element kind with ``VectorSpec.eq_mask`` (f16, bf16)."""
    vec = VECTOR[element]
    pack, W = vec.pack, vec.width
    SM90_ONLY = element is ElementKind.BF16
    LOG_BITS = uint32((64 // W).bit_length() - 1)  # bits per element, log 2

    @cuda.jit(device=True, inline=True)
    def splat(v, values):
        for e in range(W):
            values[e] = v
        return pack(values)

    @cuda.jit(device=True, inline=True)
    def count(m):
        return int32(uint32(cuda.popc(m)) >> LOG_BITS)

    @cuda.jit(device=True, inline=True)
    def select(m, cw, zw):
        return (cw & m) | (zw & ~m)

    @cuda.jit(device=True, inline=True)
    def usable():
        return compiled_for_sm90() if SM90_ONLY else True

    return TieWords(splat, vec.eq_mask, count, select, usable)


def _mask_rewriter(element: ElementKind) -> Any:
    """Device function: the tied words of one tie mask ``m`` of the Max/Min gradient's tie
    count after dx (bit ``q * W + e``: element e of the mask's word q, at ``first_word + q
    * word_span``), rewritten without reading x. Element e of such a word is ``cfs[e]``
    (dy / count) where it ties, else ``cfs[e] - cfs[e]``: what the first pass wrote there
    and at every word left alone (0, or NaN for a non-finite dy), as ``_elem_ties``. The
    tied words are visited lowest bit first (the lowest set bit's index is the population
    count below it), so a mask without ties costs one test."""
    vec = VECTOR[element]
    W, LOG_W, pack, store_word = vec.width, vec.log_width, vec.pack, vec.store_word
    WORD_BITS = uint64((1 << W) - 1)

    @cuda.jit(device=True, inline=True)
    def rewrite_mask(dx, dxv, m, cfs, first_word, word_span, results, shift):
        while m != 0:
            low = m & (~m + uint64(1))
            q = uint32(cuda.popc(low - uint64(1))) >> uint32(LOG_W)  # word in mask
            at = uint64(q << uint32(LOG_W))
            bits = (m >> at) & WORD_BITS
            m &= ~(WORD_BITS << at)
            for e in range(W):
                c = cfs[e]
                results[e] = c if (bits >> uint64(e)) & uint64(1) != 0 else c - c
            store_word(dx, dxv, first_word + int64(q) * word_span, pack(results), shift)

    return rewrite_mask


def _tied_word_rewriter(element: ElementKind, batch: int) -> Any:
    """Device function: the rewrite pass of the Max/Min gradient's tie count after dx for
    one lane's word loop (``batches`` iterations of VEC_LOADS words; word ``first_word +
    (it * VEC_LOADS + u) * word_span``): the words holding a tie, from the lane's tie masks
    (mask g at ``mask_at + g * mask_span``, bit ``(r * VEC_LOADS + u) * W + e`` for
    iteration ``g * MASK_ITERS + r``), by ``_mask_rewriter``. ``batch`` masks are loaded
    at once."""
    W = VECTOR[element].width
    rewrite_mask = _mask_rewriter(element)
    MASK_ITERS = tie_mask_iters(W)
    MASK_WORDS = MASK_ITERS * VEC_LOADS

    @cuda.jit(device=True, inline=True)
    def rewrite_tied(dx, dxv, stat_k, mask_at, mask_span, cfs, first_word, word_span,
                     batches, results, shift):
        groups = (batches + MASK_ITERS - 1) // MASK_ITERS
        masks = cuda.local.array(batch, uint64)
        g = int64(0)
        while g < groups:
            for b in range(batch):  # every mask load of the batch in flight
                if g + b < groups:
                    masks[b] = uint64(stat_k[uint64(mask_at + (g + b) * mask_span)])
            for b in range(batch):
                if g + b < groups:
                    rewrite_mask(dx, dxv, masks[b], cfs,
                                 first_word + (g + b) * MASK_WORDS * word_span, word_span,
                                 results, shift)
            g += batch

    return rewrite_tied


def _col_mask_layout(element: ElementKind) -> tuple[Any, Any]:
    """Device functions ``(mask_groups, mask_at)``: where the column word gradient's tie
    masks lie, for the first pass that writes them and the rewrite that reads them.
    ``mask_groups(chunk_len, lanes)``: the masks one lane holds of a full split (one per
    ``tie_mask_iters`` word-loop iterations of VEC_LOADS words). ``mask_at(masks_at,
    split, groups, g, lanes, lane, out_words, ow)``: the slot of mask ``g`` of (split,
    lane, output word ``ow``), ``masks_at + ((split * groups + g) * lanes + lane) *
    out_words + ow``: consecutive output words (a block's slots) are consecutive, and mask
    g + 1 lies ``lanes * out_words`` after mask g. (``plans.reduce.geometry._tie_slots``
    sizes the same layout.)"""
    MASK_ITERS = tie_mask_iters(VECTOR[element].width)

    @cuda.jit(device=True, inline=True)
    def mask_groups(chunk_len, lanes):
        step = int64(VEC_LOADS) * lanes
        return ((chunk_len + step - 1) // step + MASK_ITERS - 1) // MASK_ITERS

    @cuda.jit(device=True, inline=True)
    def mask_at(masks_at, split, groups, g, lanes, lane, out_words, ow):
        return masks_at + ((split * groups + g) * lanes + lane) * out_words + ow

    return mask_groups, mask_at


def _col_tied_rewriter(element: ElementKind, batch: int) -> Any:
    """Device function: the rewrite pass of the column word gradient's tie count after dx
    for one (lane, output word) over every split its block walks (``split0``,
    ``split0 + split_step``,... below ``n_splits``): the masks of all those splits are
    taken as one list, ``batch`` loads in flight at once (one split's masks, 2-4, left
    the loads waiting on each other). Mask g of (split, lane, ow) lies at ``masks_at +
    ((split * groups + g) * lanes + lane) * out_words + ow`` (``groups`` masks a full split:
    ``_col_mask_layout``); a split's lane ``lane`` starts at row ``split * chunk_len +
    lane`` and holds only the masks of its own batches (the last split may be short)."""
    W = VECTOR[element].width
    rewrite_mask = _mask_rewriter(element)
    mask_groups, mask_at = _col_mask_layout(element)
    MASK_ITERS = tie_mask_iters(W)
    MASK_WORDS = MASK_ITERS * VEC_LOADS

    @cuda.jit(device=True, inline=True)
    def lane_masks(split, lane, step, chunk_len, extent):
        i = split * chunk_len + lane
        end = min(extent, split * chunk_len + chunk_len)
        batches = (end - i + step - 1) // step
        return (batches + MASK_ITERS - 1) // MASK_ITERS if i < end else int64(0)

    @cuda.jit(device=True, inline=True)
    def rewrite_tied_cols(dx, dxv, stat_k, masks_at, lanes, lane, ow, out_words, chunk_len,
                          extent, axis_words, split0, split_step, n_splits, cfs, results):
        # (split, g) walked by counters: no division in the loop (an int64 division is a
        # call of ~60 instructions, and the pass is instruction bound)
        step = int64(VEC_LOADS) * lanes
        groups = mask_groups(chunk_len, lanes)
        last = n_splits - 1
        last_groups = lane_masks(last, lane, step, chunk_len, extent)
        word_span = lanes * axis_words
        mask_words = MASK_WORDS * word_span
        masks = cuda.local.array(batch, uint64)
        split = split0
        g = int64(0)
        while split < n_splits:
            s = split
            h = g
            for b in range(batch):  # every mask load of the batch in flight
                m = uint64(0)
                if s < n_splits and h < (groups if s != last else last_groups):
                    m = uint64(stat_k[uint64(
                        mask_at(masks_at, s, groups, h, lanes, lane, out_words, ow))])
                masks[b] = m
                h += 1
                if h == groups:
                    h = int64(0)
                    s += split_step
            for b in range(batch):
                if masks[b] != 0:
                    first = (split * chunk_len + lane) * axis_words + ow + g * mask_words
                    rewrite_mask(dx, dxv, masks[b], cfs, first, word_span, results, 0)
                g += 1
                if g == groups:
                    g = int64(0)
                    split += split_step

    return rewrite_tied_cols


