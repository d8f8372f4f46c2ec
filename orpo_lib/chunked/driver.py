"""The forward of one call: the plan, the first block's logits, every chunk group's passes, the loss terms.

``forward`` makes the plan (``planning.make_plan``), queues the first block's logits GEMM before it allocates the
call's state (``steps.new_call``), so that the GPU is busy while the host sets up, hands each chunk group to its
schedule (``passes``), adds the dropped tokens' logit sums (``dropped``) and forms the loss and the metrics
(``steps.call_terms``). It returns a ``Forward``: the loss terms, and what backward reads (the summed gradients of
several blocks, or a single block's G).

A single block may begin earlier still: ``early_logits`` queues the logits of its first rows before the label
counts are read back (``fused`` decides where that pays), and ``forward`` computes the rest of its rows' logits
after them, with the dropped tokens' sum rows appended to that GEMM.
"""

from dataclasses import dataclass

import torch

from .. import schedule
from ..logit_transform import LogitTransform
from ..validation import TokenCounts
from . import dropped, gemms, passes, planning, steps
from .gemms import Head
from .planning import Options, Plan
from .steps import GradSums

__all__ = ["EarlyLogits", "Forward", "early_logits", "forward"]


@dataclass(frozen=True)
class Forward:
    """The loss and metrics, and what backward needs (``sums`` with several blocks, ``logit_grads`` with one)."""

    loss: torch.Tensor  # 0-d, in the statistics dtype
    metrics: torch.Tensor  # output.METRICS, then the chosen and the rejected rewards (kernels.call_terms)
    seq_logp: torch.Tensor  # (B,) chosen sequences, then rejected ones
    sums: GradSums | None = None
    logit_grads: torch.Tensor | None = None  # (kept, padded V) G of the single block, in its first V columns
    row_tokens: torch.Tensor | None = None  # (kept,) its rows' token indices; None in token order


@dataclass(frozen=True)
class EarlyLogits:
    """A single block's first logits, queued before the label counts are read back."""

    buffer: torch.Tensor  # (B*T, V): room for every row a single block can hold
    rows: int  # its first ``rows`` rows hold the logits of the first rows of the kept-row order
    head: Head  # for the rest of the block's GEMMs


def early_logits(hidden, weight, bias, kept_order) -> EarlyLogits:
    """The logits of the first ``schedule.early_rows`` entries of the kept-row order (the kept tokens in token
    order, then zeros: kernels.label_stats), which the single block's rows begin with whatever the counts
    turn out to be: in token order when no token is dropped, in that order otherwise."""
    batch, seq, size = hidden.shape
    rows = min(batch * seq, schedule.early_rows(size, weight.shape[0]))
    buffer = gemms.new_logits_buffer(batch * seq, weight.shape[0], hidden)
    head = gemms.gemm_head(weight, bias)
    gemms.linear_into(buffer[:rows], planning.gather_rows(hidden, kept_order[:rows]), head)
    return EarlyLogits(buffer, rows, head)


def _finish_early_logits(early: EarlyLogits, plan: Plan, rows: int, hidden, bias, counts: TokenCounts,
                         transform: LogitTransform):
    """The single block's ``rows`` logits, those after the early ones computed now; with dropped tokens also
    their logit sums per half, from rows appended to the same GEMM (``dropped.dropped_sum_rows``), or None where
    no GEMM follows the early rows, the buffer has no room for those rows or the transform has a cap."""
    start, dropped_sums = early.rows, None
    if rows > start:
        x = planning.block_rows(plan, (start, rows), hidden)
        with_sums = plan.dropped and transform.linear and rows + dropped.DROPPED_SUM_ROWS <= len(early.buffer)
        if with_sums:
            x = torch.cat([x, dropped.dropped_sum_rows(hidden, counts)])
        gemms.linear_into(early.buffer[start:start + len(x)], x, early.head)
        if with_sums:
            dropped_sums = dropped.dropped_logit_sums_from(early.buffer[rows:rows + dropped.DROPPED_SUM_ROWS], bias,
                                                           counts, hidden.shape, transform)
    return early.buffer[:rows], dropped_sums


def forward(hidden, weight, bias, counts: TokenCounts, opts: Options, early: EarlyLogits | None = None) -> Forward:
    plan = planning.make_plan(hidden, weight.shape[0], counts, opts)
    dropped_sums = None  # (2,) the dropped tokens' logit sums per half, where a logits GEMM gives them
    if planning.statistics_in_gemm(hidden, weight, bias, sum(counts.kept_per_seq), opts):  # no logits buffer at all
        call = steps.new_call(hidden, Head(weight, bias), counts, opts, plan, None)
        sums = ready = None
    else:
        first_span = plan.groups[0].blocks[0]
        if early is None:
            head = gemms.gemm_head(weight, bias)
            buffer = gemms.new_logits_buffer(plan.buffer_rows, weight.shape[0], hidden)
            x, logits = steps.block_logits(plan, first_span, buffer, hidden, head)
        else:  # a single block (its x is read again in backward)
            head, buffer, x = early.head, early.buffer, None
            logits, dropped_sums = _finish_early_logits(early, plan, first_span[1], hidden, bias, counts,
                                                        opts.transform)
        # the first GEMM is queued: the GPU is busy while the host finishes the setup
        call = steps.new_call(hidden, head, counts, opts, plan, buffer)
        sums = steps.new_grad_sums(hidden, weight, plan, opts) if opts.needs_grad and not opts.single_block else None
        ready = steps.make_block(first_span, x, logits, call.row_tokens, counts, plan.token_order)
        del x, logits  # the first block holds them, and frees its gathered rows when the next block is made
    for group in plan.groups:
        if not opts.needs_grad:
            passes.statistics_only(call, group, ready)
        elif group.one_pass:
            passes.one_pass(call, group, sums, ready)
        else:
            passes.two_passes(call, group, sums, ready)
        ready = None
    if not opts.needs_grad:  # with gradients, the chunk groups computed them pair by pair
        steps.pair_terms(call.stats, counts, 0, hidden.shape[0] // 2, hidden.shape[1], opts.beta)
    if plan.dropped and dropped_sums is None:
        if opts.transform.linear:
            dropped_sums = dropped.dropped_logit_sums(hidden, weight, bias, counts, opts.transform)
        else:
            dropped.capped_dropped_logit_sums(call, weight.shape[0])
    loss, metrics = steps.call_terms(call.stats, counts, dropped_sums, weight.shape[0], opts.beta,
                                     opts.compute_nll_loss)
    if opts.single_block and opts.needs_grad:  # the single block fills the buffer (up to its kept rows)
        return Forward(loss, metrics, call.stats.seq_logp,
                       logit_grads=gemms.with_padding(call.buffer[:plan.buffer_rows]), row_tokens=plan.row_tokens)
    return Forward(loss, metrics, call.stats.seq_logp, sums=sums)
