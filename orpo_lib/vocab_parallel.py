"""The fused ORPO loss over a vocabulary-sharded LM head (tensor parallel), through torch.distributed.

Each rank of the process group holds a contiguous slice of the head's rows, W_r = W[v_r, v_r + V_r),
rank order giving the slices' order; the slices may have any sizes (a vocabulary that does not divide
into equal shards is fine). Every rank gets the same hidden states and the same labels, in global ids.

Per chunk of the token rows some target needs, each rank runs the library's kernels on its own logits X·W_rᵀ, with the target
ids that fall in its shard (-1 elsewhere): ``row_stats_kernel`` gives its partial log-sum-exp, the
target logits it holds and its logit sums. Two all-gathers combine them, summed in rank order so that
every rank gets the same bits and the result does not depend on the backend's reduction order:

* each row's local log-sum-exp (4 bytes per row from each rank), for the global maximum;
* each row's exp(lse_r − max), target logit, NLL target logit and logit sum (16 bytes per row).

Then the global log-sum-exp and log-probs, and the pair terms, are computed identically everywhere. The
gradient pass computes the logits of every chunk but the last (still in the buffer) again, rewrites them
into the rank's columns of dL/dlogits with the global statistics, and forms dW_r += Gᵀ·X (this rank's
shard, float32, no communication) and the chunk's partial dX = G·W_r in float32, which one more
all-gather sums over the ranks (4·H bytes per row from each rank) before its one rounding to the input
dtype. Every rank must make the same calls with the same arguments but its shard, gradients included, or
the collectives wait for each other forever.

A target's log-prob is its logit minus the global log-sum-exp, so a near-certain token's log p is
rounded to within an ulp of the log-sum-exp rather than computed as −log1p(others) as in one process.
"""

import torch
import torch.distributed as dist

from . import schedule
from .chunked import backward, dropped, gemms, planning, steps
from .chunked.steps import Block, GradSums, TokenStats
from .logit_transform import logit_transform
from .output import ORPOOutput, output_from_metrics
from .validation import check_arguments, check_options, count_tokens, on_device


def _gathered(tensor, group) -> list:
    """Every rank's ``tensor``, in rank order."""
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return parts


def _rank_order_sum(tensor, group):
    """The sum over ranks, added in rank order: the same bits on every rank, whatever the backend."""
    parts = _gathered(tensor, group)
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    return total


def shard_starts(shard_rows: int, group, device) -> tuple[int, int]:
    """(first global id of this rank's shard, global vocabulary size), from every rank's shard size."""
    sizes = [int(n) for n in _gathered(torch.tensor([shard_rows], device=device), group)]
    if min(sizes) < 1:
        raise ValueError(f"vocab_parallel_orpo_loss: every rank needs at least one row of the head, got shards "
                         f"of {sizes} rows")
    rank = dist.get_rank(group)
    return sum(sizes[:rank]), sum(sizes)


def _local_ids(ids, start: int, rows: int, elsewhere: int):
    """Global target ids (-1: none) as this shard's columns; an id in another shard becomes ``elsewhere``:
    -1 for ``row_stats_kernel`` (no column of the row to read), ``rows`` for ``row_grads_kernel``, where an
    id >= 0 means that the token counts, and no column of this shard is ``rows``."""
    local = torch.where((ids >= start) & (ids < start + rows), ids - start, elsewhere)
    return torch.where(ids >= 0, local, -1).to(torch.int32).view(-1)


def _combine_row_stats(stats: TokenStats, target_local, nll_local, has_target, has_nll, group) -> None:
    """Overwrite each rank's per-shard row statistics with the global ones."""
    lse_local = stats.lse.clone()
    row_max = torch.stack(_gathered(lse_local, group)).amax(0)
    owned = torch.stack([torch.exp(lse_local - row_max),
                         torch.where(target_local >= 0, stats.logp + lse_local, 0.0),  # the logits this rank holds
                         torch.where(nll_local >= 0, stats.nll_logp + lse_local, 0.0),
                         stats.logit_sum])
    exp_sum, target_logit, nll_logit, logit_sum = _rank_order_sum(owned, group)
    stats.lse.copy_(row_max + torch.log(exp_sum))
    stats.logp.copy_(torch.where(has_target, target_logit - stats.lse, 0.0))
    stats.nll_logp.copy_(torch.where(has_nll, nll_logit - stats.lse, 0.0))
    stats.logit_sum.copy_(logit_sum)


def _forward(hidden, weight, target, nll_target, group, beta, ignore_index, compute_nll_loss, chunk_size,
             grad_hidden, grad_weight, transform):
    start, vocab = shard_starts(weight.shape[0], group, hidden.device)
    counts = count_tokens(target, nll_target, vocab, ignore_index, compute_nll_loss)  # global ids: same on every rank
    batch, seq, size = hidden.shape
    tokens, shard = batch * seq, weight.shape[0]
    target_ids, nll_ids = counts.target_ids.view(-1), counts.nll_ids.view(-1)
    target_local, nll_local = _local_ids(target_ids, start, shard, -1), _local_ids(nll_ids, start, shard, -1)
    # (the gradient pass: a token counts on every rank, whichever shard holds its column)
    target_grad_ids, nll_grad_ids = _local_ids(target_ids, start, shard, shard), _local_ids(nll_ids, start, shard, shard)
    stats = steps.new_token_stats(batch, seq, planning.stats_dtype(hidden.dtype), hidden.device)
    # The rows some target needs, in token order (a token neither target counts is left out of every GEMM, but
    # for a cap: its logit sum then needs its logits, and it goes through the GEMMs with no target).
    any_dropped = sum(counts.kept_per_seq) < tokens and transform.linear
    row_tokens = (counts.kept_mask.view(-1).nonzero().squeeze(1) if any_dropped
                  else torch.arange(tokens, device=hidden.device))
    kept, rows = len(row_tokens), chunk_size or schedule.DEFAULT_CHUNK_ROWS
    spans = [(r, min(r + rows, kept)) for r in range(0, kept, rows)]
    buffer = gemms.new_logits_buffer(spans[0][1] - spans[0][0], shard, hidden)
    flat = None if any_dropped else planning.hidden_rows(hidden)  # hidden's rows in place, where its strides allow

    def block(span, target, nll_target, logits_ready=False):
        tokens_here = row_tokens[span[0]:span[1]]
        x = planning.gather_rows(hidden, tokens_here) if flat is None else flat[span[0]:span[1]]
        logits = buffer[: span[1] - span[0]]
        if not logits_ready:
            torch.mm(x, weight.t(), out=logits)
        return Block(span, tokens_here, x, logits, target[tokens_here], nll_target[tokens_here])

    for span in spans:
        steps.row_stats(block(span, target_local, nll_local), stats, transform)
    _combine_row_stats(stats, target_local, nll_local, target_ids >= 0, nll_ids >= 0, group)
    steps.pair_terms(stats, counts, 0, batch // 2, seq, beta)
    dx = (hidden.new_zeros if any_dropped else hidden.new_empty)(tokens, size) if grad_hidden else None
    dw = weight.new_zeros(weight.shape, dtype=planning.dw_sum_dtype(weight.dtype, True)) if grad_weight else None
    if grad_hidden or grad_weight:
        # last chunk first: its logits are still in the buffer, the others are computed again
        for span in reversed(spans):
            b = block(span, target_grad_ids, nll_grad_ids, logits_ready=span == spans[-1])
            steps.row_grads(b, stats, max(counts.nll_tokens, 1), seq, transform)
            if grad_hidden:  # the chunk's dX rows in float32, summed over the ranks, rounded once
                partial = gemms.mm_into(b.x.new_empty(b.x.shape, dtype=stats.lse.dtype), b.logits, weight)
                dx.index_copy_(0, b.tokens, _rank_order_sum(partial, group).to(dx.dtype))
            if grad_weight:
                gemms.accumulate_mm(dw, b.logits.t(), b.x)
    dx = dx.view(hidden.shape) if grad_hidden else None
    dropped_sums = None
    if any_dropped:  # the dropped rows' logits of this shard, summed without computing them
        dropped_sums = _rank_order_sum(dropped.dropped_logit_sums(hidden, weight, None, counts, transform), group)
    loss, metrics = steps.call_terms(stats, counts, dropped_sums, vocab, beta, compute_nll_loss)
    return (loss, metrics, stats.seq_logp), dx, dw


class _VocabParallelORPO(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, nll_target, options):
        with on_device(hidden.device):
            terms, dx, dw = _forward(hidden, weight, target, nll_target, *options)
        ctx.save_for_backward(dx, dw)  # only read in backward: a retained graph can run it again
        ctx.shapes_and_dtype = hidden.shape, weight.shape[0], weight.dtype
        loss, *metrics = terms
        ctx.mark_non_differentiable(*metrics)
        return loss, *metrics

    @staticmethod
    def backward(ctx, grad_loss, *_metrics):
        dx, dw = ctx.saved_tensors
        shape, vocab, weight_dtype = ctx.shapes_and_dtype
        sums = GradSums(dx, None, None if dw is None else dw.dtype, dw)
        with on_device(grad_loss.device):
            grad_hidden, grad_weight, _ = backward.backward_from_sums(grad_loss.to(planning.stats_dtype(weight_dtype)),
                                                                      sums, shape, vocab, weight_dtype)
        return grad_hidden, grad_weight, None, None, None


def vocab_parallel_orpo_loss(hidden, weight_shard, target, *, process_group=None, beta=0.1, ignore_index=-100,
                             nll_target=None, compute_nll_loss=True, chunk_size=None, logit_scale=1.0,
                             logit_softcap=None) -> ORPOOutput:
    """ORPO loss of ``hidden @ W.T`` where each rank of ``process_group`` (default: the world) holds a slice
    ``weight_shard`` (V_r, H) of W's rows, in rank order. hidden, target and nll_target are as for
    ``fused_linear_orpo_loss``, the same on every rank, with global token ids. Every rank returns the same
    loss and metrics; ``hidden`` gets the full dX on every rank, ``weight_shard`` its own slice of dW.
    Every rank must call it with the same arguments but the shard; no bias. chunk_size: token rows per
    chunk of logits (default ``schedule.DEFAULT_CHUNK_ROWS``); logit_scale, logit_softcap as for
    ``fused_linear_orpo_loss``."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("vocab_parallel_orpo_loss needs an initialised torch.distributed process group")
    check_arguments(hidden, weight_shard, target, None, nll_target)
    check_options(beta=beta, ignore_index=ignore_index, compute_nll_loss=compute_nll_loss, chunk_size=chunk_size,
                  fp32_weight_grad=True)
    transform = logit_transform(logit_scale, logit_softcap)
    group = process_group or dist.group.WORLD
    grad_on = torch.is_grad_enabled()  # (inside the Function's forward it is off)
    options = (group, float(beta), int(ignore_index), compute_nll_loss, chunk_size, grad_on and hidden.requires_grad,
               grad_on and weight_shard.requires_grad, transform)
    return output_from_metrics(*_VocabParallelORPO.apply(hidden, weight_shard, target, nll_target, options))
