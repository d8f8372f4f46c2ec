"""A chunk group's schedule: the order in which its blocks go through the steps (``steps``).

The driver hands each ``schedule.ChunkGroup`` of the plan to one of three functions, with the block whose logits
are already in the buffer (``ready``, or None):

* ``statistics_only`` — no gradients: step 2 of each block, from the buffer or from inside the logits GEMM;
* ``two_passes`` — whole pairs in one block, or one pair in several: step 2 of every block, the pair terms, then
  each block's logits again (but the last one's) for steps 4 and 5 into the call's ``GradSums``;
* ``one_pass`` — one pair, each block once: the NLL-only blocks' G straight into the call's sums, the response
  blocks' U = d log p(y) / dlogits into the pair's sums, which the pair's two coefficients, known after its last
  block, scale into the call's sums.
"""

from dataclasses import dataclass

import torch

from .. import kernels
from . import gemms, planning, steps
from .gemms import Head
from .steps import Block, Call, GradSums

__all__ = ["one_pass", "statistics_only", "two_passes"]


def statistics_only(call: Call, group, ready: Block | None) -> None:
    """No gradients: the row statistics of each block, from its logits in the buffer or, with no buffer
    (``planning.statistics_in_gemm``), from inside the logits GEMM."""
    if call.buffer is not None:
        for span in group.blocks:
            steps.row_stats(steps.block_at(call, span, ready), call.stats, call.opts.transform)
        return
    from ..kernels.gluon_row_stats import logits_row_stats  # Gluon: imported only where Hopper runs it
    for span in group.blocks:
        block = steps.make_block(span, planning.block_rows(call.plan, span, call.hidden), None, call.row_tokens,
                                 call.counts, call.plan.token_order)
        logits_row_stats(block.x, call.head.weight, block.target, block.nll_target, block.tokens, call.stats.logp,
                         call.stats.nll_logp, call.stats.logit_sum, call.stats.lse)


def two_passes(call: Call, group, sums: GradSums | None, ready: Block | None) -> None:
    """Whole pairs in one block, or one pair in two passes: statistics of every block, then the pair terms,
    then each block's gradient (``sums`` None: a single block, whose GEMMs wait for backward)."""
    for span in group.blocks:
        block = steps.block_at(call, span, ready)
        steps.row_stats(block, call.stats, call.opts.transform)
    steps.group_pair_terms(call, group)
    # The buffer holds the last block's logits: take the blocks last to first, so that only the
    # others have their logits computed again.
    for span in reversed(group.blocks):
        block = steps.block_at(call, span, block)
        steps.row_grads(block, call.stats, call.nll_tokens, call.seq, call.opts.transform)
        if sums is not None:
            steps.add_block_grads(sums, block, call.head, call.plan.token_order)


@dataclass
class _PairSums:
    """The gradient GEMMs of a pair's response rows in one pass, before its two coefficients (None: not needed)."""

    dx_rows: torch.Tensor | None  # (response rows, H) Q = U·W of each row, in the statistics dtype
    dw: list  # [chosen, rejected] (padded V, H) Σ Uᵀ·X in the dW sum dtype, each made by its sequence's first block
    db: torch.Tensor | None  # (2, V) Σ U of the chosen and of the rejected sequence


def _new_pair_sums(call: Call, group, sums: GradSums) -> _PairSums:
    rows, size = group.blocks[-1][1] - group.response_start, call.hidden.shape[2]
    dtype, device = call.stats.lse.dtype, call.hidden.device
    dx_rows = torch.empty(rows, size, device=device, dtype=dtype) if sums.dx is not None else None
    db = torch.zeros(2, call.buffer.shape[1], device=device, dtype=dtype) if sums.db is not None else None
    return _PairSums(dx_rows, [None, None], db)


def one_pass(call: Call, group, sums: GradSums, ready: Block | None) -> None:
    """One pair, each block once. The NLL-only rows, first, become their final G (the NLL's coefficient is
    known), whose GEMMs add to ``sums`` at once; the response rows become U = d log p(y) / dlogits, whose
    GEMMs add to the pair's sums; the pair's coefficients, known after its last block, then scale those
    into ``sums``."""
    pair = _new_pair_sums(call, group, sums)
    for span in group.blocks:
        block = steps.block_at(call, span, ready)
        steps.row_stats(block, call.stats, call.opts.transform)
        if span[0] < group.response_start:  # no odds-ratio target: row_grads needs no sequence coefficient yet
            steps.row_grads(block, call.stats, call.nll_tokens, call.seq, call.opts.transform)
            steps.add_block_grads(sums, block, call.head, call.plan.token_order)
        else:
            kernels.row_logp_grads(block.logits, block.target, block.tokens, call.stats.logp, call.stats.lse,
                                   transform=call.opts.transform)
            _add_to_pair_sums(pair, block, group, call.head, sums.dw_dtype)
    steps.group_pair_terms(call, group)
    _add_pair_sums(sums, pair, _pair_scales(call, group.first_pair), call, group)


def _add_to_pair_sums(pair: _PairSums, block: Block, group, head: Head, dw_dtype) -> None:
    """A block's GEMMs on U, into its rows of Q and its sequence's sums (no block straddles the two)."""
    grad, padded, side = block.logits, gemms.with_padding(block.logits), int(block.span[0] >= group.rejected_start)
    if pair.dx_rows is not None:
        first = group.response_start
        gemms.grads_times_head(padded, head, pair.dx_rows[block.span[0] - first:block.span[1] - first])
    if dw_dtype is not None:
        if pair.dw[side] is None:
            pair.dw[side] = gemms.mm(padded.t(), block.x, dw_dtype)
        else:
            gemms.accumulate_mm(pair.dw[side], padded.t(), block.x)
    if pair.db is not None:
        pair.db[side] += grad.sum(0, dtype=pair.db.dtype)


def _pair_scales(call: Call, pair: int) -> torch.Tensor:
    """(2,) the coefficient c of the pair's chosen and rejected sequence, so that G = c·U on their rows: the
    odds ratio's dL/dlogp, plus the NLL term's -1/N on the chosen rows."""
    pairs = call.hidden.shape[0] // 2
    scales = call.stats.seq_coef[pair::pairs].clone()  # sequences pair and pair + pairs: a view, no index to copy
    if call.opts.compute_nll_loss:
        scales[0] -= 1.0 / call.nll_tokens
    return scales


def _add_pair_sums(sums: GradSums, pair: _PairSums, scales, call: Call, group) -> None:
    """dX rows = c·Q, dW += c_c·Σ_c + c_r·Σ_r, dbias += c_c·Σ_c + c_r·Σ_r."""
    if sums.dx is not None:
        _add_pair_dx(sums.dx, pair.dx_rows, scales, call, group)
    if sums.dw_dtype is not None:
        chosen, rejected = pair.dw
        # the call's first dW sum (no earlier pair's, no NLL-only block's) takes the place of the chosen sequence's
        if sums.dw is None:
            sums.dw = kernels.pair_sum(chosen, rejected, scales, out=chosen, accumulate=False)
        else:
            kernels.pair_sum(chosen, rejected, scales, out=sums.dw, accumulate=True)
    if sums.db is not None:
        sums.db += scales @ pair.db


def _add_pair_dx(dx, dx_rows, scales, call: Call, group) -> None:
    """Each row of Q times its sequence's coefficient, rounded once into dX's dtype and rows."""
    start, end = group.response_start, group.blocks[-1][1]
    chosen = group.rejected_start - start
    out = dx[start:end] if call.plan.token_order else dx.new_empty(end - start, dx.shape[1])
    kernels.scale(dx_rows[:chosen], scales[0], out=out[:chosen])
    kernels.scale(dx_rows[chosen:], scales[1], out=out[chosen:])
    if not call.plan.token_order:
        dx.index_copy_(0, call.row_tokens[start:end], out)
