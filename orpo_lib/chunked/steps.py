"""One block's steps, and the state of the call they read and write.

A ``Call`` holds what every step reads: the inputs, the plan, the logits buffer and the per-token statistics
(``TokenStats``, written by the row kernels and the pair terms). A ``Block`` is a span of the row order with its
rows of hidden, its logits in the buffer and its target ids. Per block, in order: ``block_at`` (its logits, unless
the buffer holds them already), ``row_stats`` (step 2), then, once its pairs have their terms (``pair_terms``, step
3), ``row_grads`` (step 4, the buffer rewritten into G) and ``add_block_grads`` (step 5, G's GEMMs into the
call's ``GradSums``). ``call_terms`` forms the loss and the metrics from the statistics at the end.
"""

from dataclasses import dataclass

import torch

from .. import kernels
from ..logit_transform import LogitTransform
from ..validation import TokenCounts
from . import gemms, planning
from .gemms import Head
from .planning import Options, Plan

__all__ = ["Block", "Call", "GradSums", "TokenStats", "add_block_grads", "block_at", "block_logits", "call_terms",
           "group_pair_terms", "make_block", "new_call", "new_grad_sums", "new_token_stats", "pair_terms",
           "row_grads", "row_stats"]


@dataclass(frozen=True)
class TokenStats:
    """What the row kernels and pair_terms_kernel write, per token, sequence and pair."""

    logp: torch.Tensor  # (B*T,) log p(target), 0 where ignored
    nll_logp: torch.Tensor  # (B*T,) log p(nll target), 0 where ignored
    logit_sum: torch.Tensor  # (B*T,) sum of the row's logits
    lse: torch.Tensor  # (B*T,) log-sum-exp of the row
    seq_logp: torch.Tensor  # (B,) mean token log-prob of each sequence
    seq_coef: torch.Tensor  # (B,) dL/dlogp of each odds-ratio token of the sequence
    log_odds: torch.Tensor  # (B/2,) float64
    pair_loss: torch.Tensor  # (B/2,) float64, -beta * logsigmoid(log_odds)


def new_token_stats(batch: int, seq: int, dtype: torch.dtype, device) -> TokenStats:
    per_token = torch.zeros(4, batch * seq, device=device, dtype=dtype)  # one allocation
    return TokenStats(*per_token, seq_logp=torch.empty(batch, device=device, dtype=dtype),
                      seq_coef=torch.empty(batch, device=device, dtype=dtype),
                      log_odds=torch.empty(batch // 2, device=device, dtype=torch.float64),
                      pair_loss=torch.empty(batch // 2, device=device, dtype=torch.float64))


def pair_terms(stats: TokenStats, counts: TokenCounts, first_pair: int, end_pair: int, seq: int, beta: float) -> None:
    kernels.pair_terms(stats.logp, counts.tokens_per_seq, stats.seq_logp, stats.seq_coef, stats.log_odds,
                      stats.pair_loss, first_pair=first_pair, end_pair=end_pair, seq_len=seq, beta=beta)


def call_terms(stats: TokenStats, counts: TokenCounts, dropped_sums, vocab: int, beta: float,
               compute_nll_loss: bool) -> tuple:
    """The loss and the metrics vector (kernels.call_terms). ``dropped_sums``: (2,) the dropped tokens' logit
    sums per half, which the mean logits count too (None: no token dropped)."""
    return kernels.call_terms(stats.pair_loss, stats.log_odds, stats.seq_logp, stats.nll_logp, stats.logit_sum,
                              dropped_sums, nll_tokens=counts.nll_tokens, vocab=vocab, beta=beta,
                              compute_nll=compute_nll_loss)


@dataclass(frozen=True)
class Block:
    span: tuple  # (start, end) of its rows in the row order
    tokens: torch.Tensor  # (C,) flattened token index of each row
    x: torch.Tensor | None  # (C, H) the rows of hidden (None: a single block, whose GEMMs of x wait for backward)
    logits: torch.Tensor | None  # (C, V) view of the buffer: logits, then G (None: no buffer)
    target: torch.Tensor  # (C,) int32, -1 where ignored
    nll_target: torch.Tensor  # (C,) int32, -1 where ignored


def block_logits(plan: Plan, span, buffer, hidden, head: Head):
    """The block's rows of hidden, and their logits in the buffer."""
    x = planning.block_rows(plan, span, hidden)
    return x, gemms.linear_into(buffer[: span[1] - span[0]], x, head)


def make_block(span, x, logits, row_tokens, counts: TokenCounts, token_order: bool) -> Block:
    tokens = row_tokens[span[0]:span[1]]
    ids_of = slice(*span) if token_order else tokens  # a view in token order, a gather otherwise
    return Block(span, tokens, x, logits, counts.target_ids.view(-1)[ids_of], counts.nll_ids.view(-1)[ids_of])


def row_stats(block: Block, stats: TokenStats, transform: LogitTransform) -> None:
    kernels.row_stats(block.logits, block.target, block.nll_target, block.tokens, stats.logp, stats.nll_logp,
                      stats.logit_sum, stats.lse, transform=transform)


def row_grads(block: Block, stats: TokenStats, nll_tokens: int, seq: int, transform: LogitTransform) -> None:
    kernels.row_grads(block.logits, block.target, block.nll_target, block.tokens, stats.logp, stats.nll_logp,
                      stats.lse, stats.seq_coef, nll_tokens=nll_tokens, seq_len=seq, transform=transform)


@dataclass
class GradSums:
    """dX, dW and dbias summed over the blocks, before the upstream gradient (None: not needed)."""

    dx: torch.Tensor | None  # (B*T, H) in hidden's dtype
    db: torch.Tensor | None  # (V,) in the statistics dtype
    dw_dtype: torch.dtype | None  # float32 (float64 for float64 inputs) or hidden's dtype; None: no dW
    dw: torch.Tensor | None = None  # (padded V, H): its first V rows, made by the first block


def new_grad_sums(hidden, weight, plan: Plan, opts: Options) -> GradSums:
    tokens, size = hidden.shape[0] * hidden.shape[1], hidden.shape[2]
    dx = None
    if opts.grad_hidden:
        alloc = torch.zeros if plan.dropped else torch.empty  # dropped rows get no gradient rows
        dx = alloc(tokens, size, device=hidden.device, dtype=hidden.dtype)
    db = (torch.zeros(weight.shape[0], device=hidden.device, dtype=planning.stats_dtype(hidden.dtype))
          if opts.grad_bias else None)
    dw_dtype = planning.dw_sum_dtype(hidden.dtype, opts.fp32_weight_grad) if opts.grad_weight else None
    return GradSums(dx, db, dw_dtype)


def add_block_grads(sums: GradSums, block: Block, head: Head, token_order: bool) -> None:
    """dX rows, dW and dbias of a block whose buffer holds G."""
    grad, padded = block.logits, gemms.with_padding(block.logits)
    if sums.dx is not None:
        if token_order:
            gemms.grads_times_head(padded, head, sums.dx[block.span[0]:block.span[1]])
        else:
            rows = gemms.grads_times_head(padded, head, sums.dx.new_empty(len(block.tokens), sums.dx.shape[1]))
            sums.dx.index_copy_(0, block.tokens, rows)
    if sums.dw_dtype is not None:
        if sums.dw is None:
            sums.dw = gemms.mm(padded.t(), block.x, sums.dw_dtype)
        else:
            gemms.accumulate_mm(sums.dw, padded.t(), block.x)
    if sums.db is not None:
        sums.db += grad.sum(0, dtype=sums.db.dtype)


@dataclass(frozen=True)
class Call:
    """What every step of one call reads: the inputs, the plan, the logits buffer and the per-token outputs."""

    hidden: torch.Tensor
    head: Head  # gemm_head's with a buffer (W and bias whole without one)
    counts: TokenCounts
    opts: Options
    plan: Plan
    buffer: torch.Tensor | None  # (buffer_rows, V); None: the statistics come from inside the logits GEMM
    stats: TokenStats
    row_tokens: torch.Tensor  # (kept,) flattened token index of each row, in either row order

    @property
    def nll_tokens(self) -> int:
        return max(self.counts.nll_tokens, 1)  # without the NLL term no row has an NLL target

    @property
    def seq(self) -> int:
        return self.hidden.shape[1]


def new_call(hidden, head: Head, counts: TokenCounts, opts: Options, plan: Plan, buffer) -> Call:
    batch, seq, _ = hidden.shape
    stats = new_token_stats(batch, seq, planning.stats_dtype(hidden.dtype), hidden.device)
    row_tokens = torch.arange(batch * seq, device=hidden.device) if plan.token_order else plan.row_tokens
    return Call(hidden, head, counts, opts, plan, buffer, stats, row_tokens)


def block_at(call: Call, span, ready: Block | None) -> Block:
    """The block of rows ``span``: ``ready`` if it is that one (its logits already in the buffer), else a new one."""
    if ready is not None and ready.span == span:
        return ready
    x, logits = block_logits(call.plan, span, call.buffer, call.hidden, call.head)
    return make_block(span, x, logits, call.row_tokens, call.counts, call.plan.token_order)


def group_pair_terms(call: Call, group) -> None:
    pair_terms(call.stats, call.counts, group.first_pair, group.end_pair, call.seq, call.opts.beta)
