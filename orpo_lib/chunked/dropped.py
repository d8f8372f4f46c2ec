"""The logit sums of the dropped tokens (those no target needs, left out of every GEMM), which the logit-mean
metrics count.

A dropped token's logits are needed only in their sum over the vocabulary, which is linear in its row of
hidden: the logits of a row holding the sum of a half's dropped rows sum to that half's dropped logits. A
single block appends such rows (``dropped_sum_rows``) to the GEMM of its rows after the early ones, and forms
them while the early rows' GEMM runs: they cost no pass over W, and ``dropped_logit_sums_from`` reads the sums off
their logits. Elsewhere ``dropped_logit_sums`` sums W's rows instead, which reads all of W (0.37 ms at V=128256,
H=4096 on an H100, 4% of a 2×1024 step). A soft cap makes a row's logit
sum nonlinear in the row: ``capped_dropped_logit_sums`` computes the dropped tokens' logits, a chunk at a time.
Each returns (2,) sums per half, chosen then rejected, for ``steps.call_terms``, or writes them per token.
"""

import torch

from .. import kernels
from ..logit_transform import IDENTITY, LogitTransform
from ..validation import TokenCounts
from . import gemms, planning
from .steps import Call

__all__ = ["DROPPED_SUM_ROWS", "capped_dropped_logit_sums", "dropped_logit_sums",
           "dropped_logit_sums_from", "dropped_sum_rows"]

DROPPED_SUM_ROWS = 4  # per half, the sum rounded to hidden's dtype, then what the rounding left out


def dropped_sum_rows(hidden, counts: TokenCounts):
    """(DROPPED_SUM_ROWS, H) in hidden's dtype: the per-half sums of the dropped rows (kernels.dropped_row_sums)
    rounded to hidden's dtype, then what that rounding left out, so that the rows' logits together keep the
    sums' precision."""
    sums = kernels.dropped_row_sums(hidden, counts.target_ids, counts.nll_ids)
    rounded = sums.to(hidden.dtype)
    return torch.cat([rounded, (sums - rounded).to(hidden.dtype)])


def dropped_logit_sums_from(sum_logits, bias, counts: TokenCounts, hidden_shape, transform: LogitTransform):
    """(2,) the dropped tokens' logit sums per half, from the head's outputs for ``dropped_sum_rows``: each half's
    two rows took the bias once each, each dropped token takes it once; times the scale (linear transforms only)."""
    sums = sum_logits.sum(1, dtype=planning.stats_dtype(sum_logits.dtype)).view(2, 2).sum(0)  # rounded part + rest
    sums = sums if bias is None else sums + _dropped_bias_sums(bias, counts, hidden_shape, taken=2)
    return transform.scale * sums


def dropped_logit_sums(hidden, weight, bias, counts: TokenCounts, transform: LogitTransform = IDENTITY):
    """The dropped tokens' logit sums per half where no GEMM gives them (several blocks, no buffer, a vocabulary
    shard): sum_v logits = scale·(h·sum_v W + sum(b)), which reads all of W. (Linear transforms only.)"""
    sums = kernels.dropped_row_sums(hidden, counts.target_ids, counts.nll_ids) @ weight.sum(
        0, dtype=planning.stats_dtype(hidden.dtype))
    sums = sums if bias is None else sums + _dropped_bias_sums(bias, counts, hidden.shape, taken=0)
    return transform.scale * sums


_CAPPED_DROPPED_ROWS = 1024  # the most dropped rows whose logits exist at once (at V=128256 in bf16, 0.25 GiB)


def capped_dropped_logit_sums(call: Call, vocab: int) -> None:
    """With a cap a row's logit sum is not linear in the row: the dropped tokens' logits are computed, a chunk at
    a time, and ``row_stats_kernel`` (no target) writes each one's sum where a kept token's goes."""
    dropped = (~call.counts.kept_mask).view(-1).nonzero().squeeze(1)
    rows = min(len(dropped), _CAPPED_DROPPED_ROWS)
    buffer = gemms.new_logits_buffer(rows, vocab, call.hidden)
    no_target = torch.full((rows,), -1, dtype=torch.int32, device=call.hidden.device)
    for start in range(0, len(dropped), rows):
        tokens = dropped[start:start + rows]
        logits = gemms.linear_into(buffer[:len(tokens)], planning.gather_rows(call.hidden, tokens), call.head)
        kernels.row_stats(logits, no_target[:len(tokens)], no_target[:len(tokens)], tokens, call.stats.logp,
                          call.stats.nll_logp, call.stats.logit_sum, call.stats.lse, transform=call.opts.transform)


def _dropped_bias_sums(bias, counts: TokenCounts, hidden_shape, taken: int):
    """(2,) per half, sum(b) times its dropped tokens less the ``taken`` times its sum rows took it already."""
    pairs, seq = hidden_shape[0] // 2, hidden_shape[1]
    kept = counts.kept_per_seq
    bias_sum = bias.sum(dtype=planning.stats_dtype(bias.dtype))
    return torch.stack([bias_sum * (pairs * seq - sum(half) - taken) for half in (kept[:pairs], kept[pairs:])])
