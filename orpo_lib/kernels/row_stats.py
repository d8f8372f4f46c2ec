"""Row statistics: one program per row of a chunk of logits, one read of it.

An online log-sum-exp over the vocabulary, the log-probs of the two targets (the odds-ratio target
``y`` and the NLL target ``y'``) and the row sum of logits, written at the row's token index. The
log-sum-exp is kept for ``row_grads_kernel``, which turns the row into its gradient later.
"""

from .. import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

import triton
import triton.language as tl

from ..logit_transform import IDENTITY, LogitTransform
from .numerics import log1p, model_logits_args, model_logits_flags, model_logits_only
from .row_layout import RowLaunch, block_v, rows_of, this_row


@triton.jit
def log_probs(row_max, other_sum, target_logit, nll_logit, target, nll_target):
    # From a row's max and its sum of exp(logit - max) without the target's term: the log-sum-exp and
    # the log-probs of the two targets (-1: none). A near-certain target gets log p = -log1p(others)
    # instead of a rounded 0.
    target_rel = target_logit - row_max  # <= 0; exactly 0 when the target is the maximum
    target_term = tl.exp(tl.where(target >= 0, target_rel, float("-inf")))  # 0 without a target
    lse = row_max + tl.log(other_sum + target_term)
    logp = target_rel - log1p(other_sum + (target_term - 1.0))
    nll_logp = tl.where(nll_target == target, logp, nll_logit - lse)
    return lse, logp, nll_logp


@triton.jit
def row_stats_kernel(
    logits_ptr,  # (C, V) chunk of logits, only read
    stride_row,
    target_ptr,  # (C,) int32 odds-ratio target id, -1 where the token does not count
    nll_target_ptr,  # (C,) int32 NLL target id, -1 where the token does not count
    token_ptr,  # (C,) int64 index of each row in the flattened (B*T) per-token outputs
    logp_ptr,  # (B*T,) fp32 out: log p(target), 0 where ignored
    nll_logp_ptr,  # (B*T,) fp32 out: log p(nll target), 0 where ignored
    logit_sum_ptr,  # (B*T,) fp32 out: sum of the row's logits (for the logits-mean metric)
    lse_ptr,  # (B*T,) fp32 out: log-sum-exp of the row, for row_grads_kernel
    V,  # at least BLOCK_V
    inner, inner_rest, outer, outer_rest,  # the model's logits from the head's x (numerics.model_logits)
    BLOCK_V: tl.constexpr,
    SLOT: tl.constexpr,  # adjacent columns that share a running max and sum (stats_slot(BLOCK_V))
    SCALED: tl.constexpr,  # the model's logits are a multiple of x
    SOFTCAPPED: tl.constexpr,  # they are capped (SCALED is then not read)
):
    row_ptr, target, nll_target, token = this_row(tl.program_id(0), logits_ptr, stride_row, target_ptr,
                                                  nll_target_ptr, token_ptr)
    acc = lse_ptr.dtype.element_ty  # float32, or float64 for float64 inputs
    has_target = target >= 0
    has_nll = nll_target >= 0
    target_logit = model_logits_only(tl.load(row_ptr + target, mask=has_target, other=0.0).to(acc),
                                     inner, inner_rest, outer, outer_rest, SCALED, SOFTCAPPED)
    nll_logit = model_logits_only(tl.load(row_ptr + nll_target, mask=has_nll, other=0.0).to(acc),
                                  inner, inner_rest, outer, outer_rest, SCALED, SOFTCAPPED)

    # Online log-sum-exp. The target's own term is left out of the sum so that a near-certain
    # target (the row maximum) gets log p = -log1p(sum of the others) rather than a rounded 0.
    # The partial block at the end of the row goes first, with masks; the whole blocks then need
    # none, and only the one holding the target compares columns.
    offs = tl.arange(0, BLOCK_V)
    tail = V // BLOCK_V * BLOCK_V
    cols = tail + offs
    in_row = cols < V
    x = model_logits_only(tl.load(row_ptr + cols, mask=in_row, other=0.0).to(acc), inner, inner_rest, outer,
                          outer_rest, SCALED, SOFTCAPPED)
    x = tl.where(in_row, x, float("-inf"))
    tail_max = tl.max(x, axis=0)  # -inf when V is a multiple of BLOCK_V (an empty tail)
    tail_ref = tl.where(tail_max == float("-inf"), 0.0, tail_max)  # so that no -inf - -inf is ever formed
    tail_sum = tl.sum(tl.where(in_row & (cols != target), tl.exp(x - tail_ref), 0.0), axis=0)
    logit_sum = tl.sum(tl.where(in_row, x, 0.0), axis=0)

    # The whole blocks as (BLOCK_V / SLOT, SLOT) tiles: each slot of SLOT adjacent columns (one
    # thread's vector load) keeps its own running max and sum, so that a step reduces within threads
    # only; the slots are combined once, after the loop. The next block is loaded before the current
    # one is reduced, so a load is always in flight.
    slot = tl.arange(0, BLOCK_V // SLOT)[:, None] * SLOT + tl.arange(0, SLOT)[None, :]
    slot_max = tl.full([BLOCK_V // SLOT], float("-inf"), acc)
    slot_sum = tl.zeros([BLOCK_V // SLOT], acc)
    slot_logit_sum = tl.zeros([BLOCK_V // SLOT], acc)
    last_start = tail - BLOCK_V
    next_x = tl.load(row_ptr + slot)
    for start in range(0, tail, BLOCK_V):
        block = model_logits_only(next_x.to(acc), inner, inner_rest, outer, outer_rest, SCALED, SOFTCAPPED)
        # the last step reloads its own block rather than reading past the whole blocks
        next_x = tl.load(row_ptr + tl.minimum(start + BLOCK_V, last_start) + slot)
        new_max = tl.maximum(slot_max, tl.max(block, axis=1))
        terms = tl.exp(block - new_max[:, None])
        if (target >= start) & (target < start + BLOCK_V):
            terms = tl.where(start + slot != target, terms, 0.0)
        slot_sum = slot_sum * tl.exp(slot_max - new_max) + tl.sum(terms, axis=1)
        slot_logit_sum += tl.sum(block, axis=1)
        slot_max = new_max
    row_max = tl.maximum(tl.max(slot_max, axis=0), tail_max)
    other_sum = tl.sum(slot_sum * tl.exp(slot_max - row_max), axis=0) + tail_sum * tl.exp(tail_max - row_max)
    logit_sum += tl.sum(slot_logit_sum, axis=0)

    lse, logp, nll_logp = log_probs(row_max, other_sum, target_logit, nll_logit, target, nll_target)
    tl.store(logp_ptr + token, tl.where(has_target, logp, 0.0))
    tl.store(nll_logp_ptr + token, tl.where(has_nll, nll_logp, 0.0))
    tl.store(logit_sum_ptr + token, logit_sum)
    tl.store(lse_ptr + token, lse)


# Chosen from the H200 sweeps in figures/data (notebooks/04-kernel-tuning.ipynb): the best of
# row-kernel-launch-sweep-h200.json, and within noise of the best in later sweeps.
STATS_LAUNCH = RowLaunch(block_v=1024, num_warps=1)


def stats_slot(block: int) -> int:
    """Columns per slot of the running statistics: 8 (one 16-byte load of bf16), fewer in a tiny row."""
    return min(8, block)


def row_stats(logits, target, nll_target, token, logp, nll_logp, logit_sum, lse, *,
              transform: LogitTransform = IDENTITY, launch: RowLaunch = STATS_LAUNCH) -> None:
    """Launch ``row_stats_kernel`` over every row of ``logits`` (a (C, V) chunk of the head's output, unit column
    stride): the statistics of the model's logits, ``transform`` of it."""
    rows, vocab = rows_of(logits)
    block = block_v(vocab, launch)
    row_stats_kernel[(rows,)](
        logits, logits.stride(0), target, nll_target, token, logp, nll_logp, logit_sum, lse, vocab,
        *model_logits_args(transform), BLOCK_V=block, SLOT=stats_slot(block), **model_logits_flags(transform),
        num_warps=launch.num_warps,
    )


@triton.jit(do_not_specialize=["C", "TILES"])  # (a 1 would become a constant without its .to)
def fold_row_stats_kernel(
    partial_ptr,  # (3, TILES, C) fp32: per column tile, each row's max, sum of exp(logit - max) without the
    #               target's term, and logit sum (gluon_row_stats' epilogue)
    target_logit_ptr,  # (C,) fp32 the target's logit, read only where the row has a target
    nll_logit_ptr,  # (C,) fp32 the NLL target's logit, likewise
    target_ptr, nll_target_ptr, token_ptr,  # as row_stats_kernel's
    logp_ptr, nll_logp_ptr, logit_sum_ptr, lse_ptr,  # (B*T,) fp32 out, as row_stats_kernel's
    C, TILES,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_TILES: tl.constexpr,
):
    # BLOCK_ROWS adjacent rows per program, so that each tile's partials are one contiguous load.
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    in_rows = rows < C
    read_rows = tl.minimum(rows, C - 1)  # rows past the chunk read its last row's partials, and store nothing
    plane = TILES.to(tl.int64) * C
    row_max = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
    other_sum = tl.zeros([BLOCK_ROWS], tl.float32)
    logit_sum = tl.zeros([BLOCK_ROWS], tl.float32)
    for start in range(0, TILES, BLOCK_TILES):
        tiles = start + tl.arange(0, BLOCK_TILES)
        mask = (tiles < TILES)[:, None]
        at = tiles.to(tl.int64)[:, None] * C + read_rows[None, :]
        tile_max = tl.load(partial_ptr + at, mask=mask, other=float("-inf"))
        tile_sum = tl.load(partial_ptr + plane + at, mask=mask, other=0.0)
        logit_sum += tl.sum(tl.load(partial_ptr + 2 * plane + at, mask=mask, other=0.0), axis=0)
        new_max = tl.maximum(row_max, tl.max(tile_max, axis=0))
        # every row has a finite maximum from its first tile on
        other_sum = other_sum * tl.exp(row_max - new_max) + tl.sum(tile_sum * tl.exp(tile_max - new_max[None, :]), axis=0)
        row_max = new_max
    target = tl.load(target_ptr + rows, mask=in_rows, other=-1)
    nll_target = tl.load(nll_target_ptr + rows, mask=in_rows, other=-1)
    token = tl.load(token_ptr + rows, mask=in_rows, other=0)
    target_logit = tl.load(target_logit_ptr + rows, mask=in_rows & (target >= 0), other=0.0)
    nll_logit = tl.load(nll_logit_ptr + rows, mask=in_rows & (nll_target >= 0), other=0.0)
    lse, logp, nll_logp = log_probs(row_max, other_sum, target_logit, nll_logit, target, nll_target)
    tl.store(logp_ptr + token, tl.where(target >= 0, logp, 0.0), mask=in_rows)
    tl.store(nll_logp_ptr + token, tl.where(nll_target >= 0, nll_logp, 0.0), mask=in_rows)
    tl.store(logit_sum_ptr + token, logit_sum, mask=in_rows)
    tl.store(lse_ptr + token, lse, mask=in_rows)


def fold_row_stats(partials, target_logit, nll_logit, target, nll_target, token, logp, nll_logp, logit_sum, lse,
                   *, block_rows: int = 128, block_tiles: int = 8) -> None:
    """Launch ``fold_row_stats_kernel``: a (3, tiles, C) float32 block of partials into the per-token outputs."""
    _, tiles, rows = partials.shape
    fold_row_stats_kernel[(triton.cdiv(rows, block_rows),)](
        partials, target_logit, nll_logit, target, nll_target, token, logp, nll_logp, logit_sum, lse, rows, tiles,
        BLOCK_ROWS=block_rows, BLOCK_TILES=block_tiles,
    )
