"""The plan of one call, fixed before the first GEMM: its options, its dtypes, which rows go through the logits
buffer together and in which order.

``make_plan`` takes hidden's shape, the label counts (``validation.TokenCounts``) and the ``Options`` and returns a
``Plan``: the chunk groups (``schedule.ChunkGroup``: whole pairs in one block, or one pair in several blocks, in one
pass or two), the row order (hidden's rows in order, or the kept tokens in pair order) and the buffer's rows. The
step functions read a block's rows of hidden through ``block_rows``; ``statistics_in_gemm`` says whether a call
without gradients needs no buffer at all.
"""

from dataclasses import dataclass

import torch

from .. import schedule
from .._triton_mode import INTERPRET
from ..logit_transform import IDENTITY, LogitTransform
from ..validation import TokenCounts

__all__ = ["Options", "Plan", "block_rows", "dw_sum_dtype", "gather_rows", "hidden_rows", "make_plan",
           "statistics_in_gemm", "stats_dtype"]


@dataclass(frozen=True)
class Options:
    beta: float
    compute_nll_loss: bool
    chunk_size: int | None
    fp32_weight_grad: bool
    grad_hidden: bool
    grad_weight: bool
    grad_bias: bool
    single_block: bool  # schedule.single_block: every row in one block, whose gradient GEMMs (if any) wait for backward
    transform: LogitTransform = IDENTITY  # the model's logits from the head's output (the row kernels apply it)

    @property
    def needs_grad(self) -> bool:
        return self.grad_hidden or self.grad_weight or self.grad_bias


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of every reduction and per-token statistic: float32, or float64 for float64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def dw_sum_dtype(dtype: torch.dtype, fp32_weight_grad: bool) -> torch.dtype:
    """The dtype dW is summed in over several blocks: float32 (float64 stays), or the weight's own."""
    return torch.promote_types(dtype, torch.float32) if fp32_weight_grad else dtype


def hidden_rows(hidden):
    """A (B*T, H) view of hidden for fast row gathers, or None when its strides allow none."""
    batch, seq, size = hidden.shape
    if hidden.stride(1) == size * hidden.stride(2) and hidden.stride(0) == seq * hidden.stride(1):
        return hidden.view(batch * seq, size)
    return None


def gather_rows(hidden, tokens):
    """The rows of hidden at flattened token indices."""
    flat = hidden_rows(hidden)
    if flat is not None:
        return flat.index_select(0, tokens)
    return hidden[tokens // hidden.shape[1], tokens % hidden.shape[1]]


@dataclass(frozen=True)
class Plan:
    """Which rows go through the buffer together, and in which order; fixed before the first GEMM."""

    groups: list  # schedule.ChunkGroup: whole pairs in one block, or one pair in several (one pass or two)
    row_tokens: torch.Tensor | None  # (kept,) flattened token index of each row; None: token order
    dropped: bool  # some tokens no target needs are left out of every GEMM
    buffer_rows: int

    @property
    def token_order(self) -> bool:
        """Rows are hidden's rows in order: a block reads hidden and writes dX in place."""
        return self.row_tokens is None


def make_plan(hidden, vocab: int, counts: TokenCounts, opts: Options) -> Plan:
    batch, seq, size = hidden.shape
    pairs, tokens = batch // 2, batch * seq
    kept_rows = sum(counts.kept_per_seq)
    pair_rows = [counts.kept_per_seq[i] + counts.kept_per_seq[i + pairs] for i in range(pairs)]
    if opts.single_block:
        groups = [schedule.ChunkGroup(0, pairs, [(0, kept_rows)])]
    else:
        extra = schedule.accumulator_rows(size, hidden.element_size(), opts.fp32_weight_grad) if opts.grad_weight else 0
        rows = opts.chunk_size or schedule.auto_chunk_rows(max(pair_rows), kept_rows, vocab, hidden.element_size(),
                                                           hidden.device, extra)
        if opts.needs_grad:
            groups = _gradient_groups(hidden, vocab, counts, opts, pair_rows, rows)
        else:  # statistics need no whole pairs
            groups = [schedule.ChunkGroup(0, 0, [(r, min(r + rows, kept_rows))]) for r in range(0, kept_rows, rows)]
    dropped = kept_rows < tokens
    buffer_rows = max(end - start for g in groups for start, end in g.blocks)
    # A group needs its pairs' rows together, in any order. Token order serves when no token is dropped
    # and one group holds every pair (or no pairs are needed).
    if not dropped and hidden_rows(hidden) is not None and (not opts.needs_grad or len(groups) == 1):
        return Plan(groups, None, False, buffer_rows)
    # pair order (chosen i, then rejected i), without the tokens no target needs: written by the label check
    return Plan(groups, counts.kept_order, dropped, buffer_rows)


def _gradient_groups(hidden, vocab: int, counts: TokenCounts, opts: Options, pair_rows: list, chunk_rows: int) -> list:
    """Whole pairs in chunks of ``chunk_rows``; a pair longer than that in one pass where it can, else in two."""
    size = hidden.shape[2]
    sum_itemsize = dw_sum_dtype(hidden.dtype, opts.fp32_weight_grad).itemsize
    nll_only_rows = counts.nll_only_per_seq[: len(pair_rows)]  # the chosen sequences' (the rejected have none)
    pair_bytes = [schedule.one_pass_bytes(rows, size, vocab, nll_only_rows=nll_only, sum_itemsize=sum_itemsize,
                                          stats_itemsize=stats_dtype(hidden.dtype).itemsize,
                                          grad_hidden=opts.grad_hidden, grad_weight=opts.grad_weight,
                                          grad_bias=opts.grad_bias) for rows, nll_only in zip(pair_rows, nll_only_rows)]
    one_pass = schedule.choose_one_pass(schedule.eligible_pairs(counts.one_pass_blockers), pair_bytes,
                                        schedule.one_pass_budget(opts.chunk_size, hidden.device))
    chosen_rows = counts.kept_per_seq[: len(pair_rows)]  # a pair's chosen rows come first in either row order
    return schedule.plan_passes(schedule.plan_chunks(pair_rows, chunk_rows), chosen_rows, nll_only_rows, one_pass,
                                schedule.one_pass_block_rows(chunk_rows))


def block_rows(plan: Plan, span, hidden):
    """The block's rows of hidden: a view in token order, a gather otherwise."""
    start, end = span
    return hidden_rows(hidden)[start:end] if plan.token_order else gather_rows(hidden, plan.row_tokens[start:end])


def statistics_in_gemm(hidden, weight, bias, rows: int, opts: Options) -> bool:
    """``schedule.statistics_in_gemm`` for these tensors and ``rows`` kept rows, with the alignment TMA needs of
    their rows."""
    if opts.needs_grad or not opts.transform.identity or not hidden.is_cuda or INTERPRET:
        return False
    aligned = weight.stride(1) == 1 and all(t.data_ptr() % 16 == 0 and (t.stride(-2) * t.element_size()) % 16 == 0
                                            for t in (hidden, weight))
    return aligned and hidden.stride(-1) == 1 and schedule.statistics_in_gemm(
        torch.cuda.get_device_capability(hidden.device), torch.cuda.get_device_name(hidden.device), hidden.dtype,
        bias is not None, hidden.shape[-1], weight.shape[0], rows)
