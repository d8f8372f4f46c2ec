"""Fused linear + ORPO loss: the loss and its gradients in chunks, never materialising (B*T, V) logits.

How one chunk of C token rows is processed (G is dL/dlogits, P the softmax, X the chunk's hidden rows):

1. ``logits = X @ W.T (+ bias)`` into a C×V buffer (cuBLAS).
2. ``row_stats_kernel`` reads it once: log-sum-exp, target log-probs and logit sums per row. None of
   this depends on the other sequence of the pair.
3. ``pair_terms_kernel``, once every row of the chunk's pairs has its log-prob: each sequence's mean
   log-prob, the odds ratio, and per token ``a = dL/dlogp`` of the odds-ratio target and ``b`` of the
   NLL target, so that ``G = a·onehot(y) + b·onehot(y') - (a + b)·P``.
4. ``row_grads_kernel`` rewrites the buffer in place into G (one read, one write), its two target
   columns from the float32 log-probs so that nothing cancels when p ≈ 1.
5. ``dX = G @ W`` and ``dW += G.T @ X``: the GEMMs see the gradient exactly as the materialising
   baseline would, rounded once to the input dtype.

So the buffer is read twice and written once between the GEMMs. Chunks hold whole (chosen,
rejected) pairs, because a token's gradient depends on its pair; a pair longer than the chunk is
processed in two passes (statistics of every block, then each block's logits, but the one still in
the buffer, computed again and turned into G from the saved log-sum-exp). Tokens no target needs are
dropped before any GEMM. The gradients are formed during forward; backward only applies the upstream
gradient. When one block holds every row, its gradient waits for backward instead, so that the
upstream gradient goes into G and every gradient is rounded once.
"""

from dataclasses import dataclass

import torch

from . import kernels, sequence_kernels
from .output import ORPOOutput, orpo_output
from .validation import TokenCounts, check_arguments, count_tokens

# Rows per chunk by default: large enough that every GEMM runs at full rate, small enough that
# the C×V buffer stays near 1 GiB at V = 128K in bf16. A pair longer than this gets a chunk of its own.
DEFAULT_CHUNK_ROWS = 4096
# The most bytes of logits the automatic choice lets exist at once.
LOGITS_BUDGET_BYTES = 8 << 30


@dataclass
class ChunkGroup:
    """Whole pairs [first_pair, end_pair) whose rows [blocks[0][0], blocks[-1][1]) are processed together."""

    first_pair: int
    end_pair: int
    blocks: list  # (start_row, end_row) ranges of at most chunk_rows rows; more than one → two passes


def plan_chunks(pair_rows: list, chunk_rows: int) -> list:
    """Pack pairs greedily into groups of at most ``chunk_rows`` rows; split a pair that alone exceeds it
    into the fewest blocks of at most ``chunk_rows`` rows, all of (nearly) the same size."""
    groups, first_pair, first_row, row = [], 0, 0, 0
    for pair, rows in enumerate(pair_rows):
        if row > first_row and row - first_row + rows > chunk_rows:
            groups.append(ChunkGroup(first_pair, pair, [(first_row, row)]))
            first_pair, first_row = pair, row
        row += rows
        if row - first_row > chunk_rows:  # this pair alone: blocks of equal size, none a small remainder
            block_rows = -(-(row - first_row) // -(-(row - first_row) // chunk_rows))
            blocks = [(r, min(r + block_rows, row)) for r in range(first_row, row, block_rows)]
            groups.append(ChunkGroup(first_pair, pair + 1, blocks))
            first_pair, first_row = pair + 1, row
    if row > first_row:
        groups.append(ChunkGroup(first_pair, len(pair_rows), [(first_row, row)]))
    return groups


def auto_chunk_rows(largest_pair_rows: int, total_rows: int, vocab: int, itemsize: int, device: torch.device,
                    accumulator_rows: int = 0) -> int:
    """``DEFAULT_CHUNK_ROWS``, or one whole pair if longer, within the logits budget (and a quarter of free memory).

    Several chunks accumulate dW in a float32 tensor that costs as much memory as ``accumulator_rows``
    rows of logits; when every row fits in a chunk plus that many, they go in one block instead, which
    needs no more memory and skips the accumulation and the final conversion.
    """
    budget = LOGITS_BUDGET_BYTES
    if device.type == "cuda":
        budget = min(budget, torch.cuda.mem_get_info(device)[0] // 4)
    fitting_rows = max(1, budget // (vocab * itemsize))
    return min(wanted_chunk_rows(largest_pair_rows, total_rows, accumulator_rows), fitting_rows)


def wanted_chunk_rows(largest_pair_rows: int, total_rows: int, accumulator_rows: int = 0) -> int:
    """``auto_chunk_rows`` before any memory cap."""
    rows = max(DEFAULT_CHUNK_ROWS, largest_pair_rows)
    return total_rows if total_rows <= rows + accumulator_rows else rows


def accumulator_rows(hidden_size: int, itemsize: int, fp32_weight_grad: bool) -> int:
    """Rows of logits (V entries of ``itemsize`` bytes each) that take the memory a float32 dW accumulator
    needs beyond dW itself (V×H×(4 − itemsize) bytes); 0 when dW accumulates in its own dtype."""
    if not fp32_weight_grad or itemsize >= 4:
        return 0
    return hidden_size * (4 - itemsize) // itemsize


def _mm(a, b, out_dtype=torch.float32):
    """a @ b with an ``out_dtype`` result (products accumulate in float32 whatever the operand dtype)."""
    if a.dtype == out_dtype:
        return torch.mm(a, b)
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=out_dtype)
    return torch.mm(a.to(out_dtype), b.to(out_dtype))


def _addmm_(acc, a, b):
    """acc += a @ b, accumulating in acc's dtype."""
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    elif a.is_cuda:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))


@dataclass
class _Block:
    span: tuple  # (start, end) of its rows in the row order
    rows: torch.Tensor  # (C,) flattened token index of each row
    x: torch.Tensor  # (C, H) the rows of hidden
    logits: torch.Tensor  # (C, V) view of the chunk buffer
    target: torch.Tensor  # (C,) int32, -1 where ignored
    nll_target: torch.Tensor  # (C,) int32, -1 where ignored


class ChunkedORPO:
    """One call of the fused loss: forward() runs the chunks, backward(g) finishes the gradients."""

    def __init__(self, hidden, weight, bias, counts: TokenCounts, *, beta,
                 compute_nll_loss, chunk_size, fp32_weight_grad, needs_grad):
        self.hidden, self.weight, self.bias = hidden, weight, bias
        self.beta, self.compute_nll_loss = beta, compute_nll_loss
        self.grad_hidden, self.grad_weight, self.grad_bias = needs_grad
        self.needs_grad = any(needs_grad)
        batch, seq, hidden_size = hidden.shape
        self.batch, self.seq, self.pairs = batch, seq, batch // 2
        vocab = weight.shape[0]
        device, dtype = hidden.device, hidden.dtype
        tokens = batch * seq

        # Only what the first GEMM needs comes before it: the GPU has no work until then, so every host
        # step here is time lost. The rest of the setup follows that GEMM (_allocate_outputs).
        self.counts = counts
        self.target = counts.target_ids.view(-1)
        self.nll_target = counts.nll_ids.view(-1)
        self.nll_tokens = counts.nll_tokens
        self.nll_coef = -1.0 / counts.nll_tokens if compute_nll_loss else 0.0  # dL/dlogp of each NLL token

        kept_rows = sum(counts.kept_per_seq)
        self.dropped = kept_rows < tokens
        pair_rows = [counts.kept_per_seq[i] + counts.kept_per_seq[i + self.pairs] for i in range(self.pairs)]
        extra_rows = accumulator_rows(hidden_size, hidden.element_size(), fp32_weight_grad) if self.grad_weight else 0
        chunk_rows = chunk_size or auto_chunk_rows(max(pair_rows), kept_rows, vocab, hidden.element_size(),
                                                   device, extra_rows)
        if self.needs_grad:
            self.groups = plan_chunks(pair_rows, chunk_rows)
        else:  # statistics need no whole pairs
            self.groups = [ChunkGroup(0, 0, [(r, min(r + chunk_rows, kept_rows))]) for r in range(0, kept_rows, chunk_rows)]
        self.single_block = sum(len(g.blocks) for g in self.groups) == 1

        # A (B*T, H) view of hidden for fast row gathers, when its strides allow one.
        self.hidden_rows = hidden.view(tokens, hidden_size) if hidden.stride(1) == hidden_size * hidden.stride(2) \
            and hidden.stride(0) == seq * hidden.stride(1) else None
        # The order of the rows: a group needs its pairs' rows together, in any order. When no token is
        # dropped and one group holds every pair (or no pairs are needed), token order serves: each block
        # is then a range of hidden's rows, read in place, and its dX rows are written in place.
        self.token_order = not self.dropped and self.hidden_rows is not None and \
            (not self.needs_grad or len(self.groups) == 1)
        self.row_tokens = None  # token order: made after the first GEMM, which reads hidden's rows in place
        if not self.token_order:  # pair order (chosen i, then rejected i), without the tokens no target needs
            pair_order = torch.arange(tokens, device=device).view(2, self.pairs, seq).transpose(0, 1).reshape(-1)
            if self.dropped:  # kept rows first, by a stable sort: their number is known, so no read-back
                self.kept_mask = counts.target_valid | counts.nll_valid
                kept = self.kept_mask.view(-1)[pair_order].to(torch.uint8)  # (CUDA sorts bool only since torch 2.6)
                pair_order = pair_order[torch.argsort(kept, descending=True, stable=True)[:kept_rows]]
            self.row_tokens = pair_order
        largest_block = max(end - start for g in self.groups for start, end in g.blocks)
        self.buffer = torch.empty(largest_block, vocab, device=device, dtype=dtype)
        self.logp = None  # the per-token and per-sequence outputs: _allocate_outputs
        self.dw = None
        self.dw_dtype = torch.float32 if fp32_weight_grad else dtype
        self.pending = None

    def _allocate_outputs(self) -> None:
        """The rest of the setup, once the first GEMM keeps the GPU busy."""
        tokens, device = self.batch * self.seq, self.hidden.device
        if self.row_tokens is None:
            self.row_tokens = torch.arange(tokens, device=device)
        self.tokens_per_seq = self.counts.tokens_per_seq
        self.logp = torch.zeros(tokens, device=device, dtype=torch.float32)
        self.nll_logp = torch.zeros_like(self.logp)
        self.logit_sum = torch.zeros_like(self.logp)
        self.lse = torch.empty_like(self.logp)
        # Per sequence and per pair, from pair_terms_kernel.
        self.seq_logp = torch.empty(self.batch, device=device, dtype=torch.float32)
        self.seq_coef = torch.empty(self.batch, device=device, dtype=torch.float32)  # dL/dlogp of each of its tokens
        self.log_odds = torch.empty(self.pairs, device=device, dtype=torch.float64)
        self.pair_loss = torch.empty(self.pairs, device=device, dtype=torch.float64)
        self.dx = None
        if self.grad_hidden:
            alloc = torch.zeros if self.dropped else torch.empty  # dropped rows get no gradient rows
            self.dx = alloc(tokens, self.hidden.shape[2], device=device, dtype=self.hidden.dtype)
        self.db = torch.zeros(self.weight.shape[0], device=device, dtype=torch.float32) if self.grad_bias else None

    # ---- forward -----------------------------------------------------------------------------

    def forward(self):
        for group in self.groups:
            for span in group.blocks:
                block = self._logits(span)
                kernels.row_stats(**self._stats_args(block))
            if not self.needs_grad:
                continue
            self._pair_terms(group.first_pair, group.end_pair)
            # The buffer still holds the last block's logits: take the blocks last to first, so that
            # only the others (in a two-pass group) have their logits computed again.
            for i, span in enumerate(reversed(group.blocks)):
                if i > 0:
                    block = self._logits(span)
                if self.single_block:
                    self.pending = block  # finished in backward, where the upstream gradient is known
                else:
                    self._block_grads(block)
        if self.pending is None:  # the buffer is needed no longer
            self.buffer = None
        return self._metrics()

    def _logits(self, span) -> _Block:
        if self.token_order:
            x = self.hidden_rows[span[0]:span[1]]
        elif self.hidden_rows is not None:
            x = self.hidden_rows.index_select(0, self.row_tokens[span[0]:span[1]])
        else:
            rows = self.row_tokens[span[0]:span[1]]
            x = self.hidden[rows // self.seq, rows % self.seq]
        logits = self.buffer[: span[1] - span[0]]
        if self.bias is None:
            torch.mm(x, self.weight.t(), out=logits)
        else:
            torch.addmm(self.bias, x, self.weight.t(), out=logits)
        if self.logp is None:  # the first GEMM is queued: the GPU is busy while the host finishes the setup
            self._allocate_outputs()
        rows = self.row_tokens[span[0]:span[1]]
        rows_of = slice(*span) if self.token_order else rows  # a view in token order, a gather otherwise
        return _Block(span, rows, x, logits, self.target[rows_of], self.nll_target[rows_of])

    def _stats_args(self, block: _Block) -> dict:
        return dict(logits=block.logits, target=block.target, nll_target=block.nll_target, token=block.rows,
                    logp=self.logp, nll_logp=self.nll_logp, logit_sum=self.logit_sum, lse=self.lse)

    def _pair_terms(self, first_pair: int, end_pair: int) -> None:
        sequence_kernels.pair_terms(self.logp, self.tokens_per_seq, self.seq_logp, self.seq_coef, self.log_odds,
                                    self.pair_loss, first_pair=first_pair, end_pair=end_pair, seq_len=self.seq,
                                    beta=self.beta)

    def _block_grads(self, block: _Block, grad_scale=None) -> None:
        """Turn the block's logits into G = dL/dlogits (times ``grad_scale``) and add its dX rows, dW and dbias."""
        kernels.row_grads(block.logits, block.target, block.nll_target, block.rows, self.logp, self.nll_logp,
                          self.lse, self.seq_coef, nll_coef=self.nll_coef, seq_len=self.seq, grad_scale=grad_scale)
        grad = block.logits
        if self.grad_hidden:
            if self.token_order:
                torch.mm(grad, self.weight, out=self.dx[block.span[0]:block.span[1]])
            else:
                self.dx.index_copy_(0, block.rows, torch.mm(grad, self.weight))
        if self.grad_weight:
            if self.single_block:  # the whole dW in one GEMM, in the weight's dtype
                self.dw = torch.mm(grad.t(), block.x)
            elif self.dw is None:
                self.dw = _mm(grad.t(), block.x, self.dw_dtype)
            else:
                _addmm_(self.dw, grad.t(), block.x)
        if self.grad_bias:
            self.db += grad.sum(0, dtype=torch.float32)

    def _metrics(self):
        if not self.needs_grad:  # with gradients, the chunk groups computed them pair by pair
            self._pair_terms(0, self.pairs)
        c, r = self.seq_logp[:self.pairs], self.seq_logp[self.pairs:]
        log_odds = self.log_odds
        or_loss = self.pair_loss.mean().float()
        if self.compute_nll_loss:
            nll_loss = -self.nll_logp.sum() / self.nll_tokens
        else:
            nll_loss = torch.zeros((), device=c.device)
        loss = nll_loss + or_loss
        logit_sums = self.logit_sum.view(2, -1).sum(1)
        if self.dropped:
            logit_sums = logit_sums + self._dropped_logit_sums()
        logits_per_half = self.pairs * self.seq * self.weight.shape[0]
        means = logit_sums / logits_per_half
        return loss, nll_loss, or_loss, c, r, log_odds, means

    def _dropped_logit_sums(self):
        """Sum of the logits of the dropped rows, per half, without computing them: sum_v logits = h·sum_v W + sum(b)."""
        dropped = (~self.kept_mask).to(self.hidden.dtype)
        hidden_sums = torch.bmm(dropped.unsqueeze(1), self.hidden).view(2, self.pairs, -1).float().sum(1)
        sums = hidden_sums @ self.weight.sum(0, dtype=torch.float32)
        if self.bias is not None:
            sums = sums + dropped.view(2, -1).float().sum(1) * self.bias.sum(dtype=torch.float32)
        return sums

    # ---- backward ----------------------------------------------------------------------------

    def backward(self, grad_loss):
        grad_loss = grad_loss.float()
        if self.single_block:  # the upstream gradient goes into G itself: every gradient comes out scaled
            self._block_grads(self.pending, grad_scale=grad_loss)
        elif self.dx is not None:  # the blocks were done unscaled: scale dX here and, below, the dW and dbias sums
            kernels.scale(self.dx, grad_loss, out=self.dx)
        self.pending = self.buffer = None
        dw = self.dw
        if dw is not None and not self.single_block:  # a float32 sum is cast to the weight dtype as it is scaled
            out = dw if dw.dtype == self.weight.dtype else dw.new_empty(dw.shape, dtype=self.weight.dtype)
            dw = kernels.scale(dw, grad_loss, out=out)
        self.dw = None
        db = None
        if self.db is not None:
            db = (self.db if self.single_block else self.db * grad_loss).to(self.bias.dtype)
        dx = None if self.dx is None else self.dx.view(self.hidden.shape)
        return dx, dw, db


class _FusedLinearORPOFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, counts, options):
        run = ChunkedORPO(hidden, weight, bias, counts, **options)
        loss, nll_loss, or_loss, c, r, log_odds, logits_means = run.forward()
        ctx.run = run if run.needs_grad else None
        ctx.mark_non_differentiable(nll_loss, or_loss, c, r, log_odds, logits_means)
        return loss, nll_loss, or_loss, c, r, log_odds, logits_means

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, *_unused):
        if ctx.run is None:
            raise RuntimeError("fused_linear_orpo_loss: backward can run only once per forward")
        dx, dw, db = ctx.run.backward(grad_loss)
        ctx.run = None
        return dx, dw, db, None, None


def fused_linear_orpo_loss(hidden, weight, target, bias=None, *, beta=0.1, ignore_index=-100, nll_target=None,
                           compute_nll_loss=True, chunk_size=None, fp32_weight_grad=True) -> ORPOOutput:
    """ORPO loss of ``hidden @ weight.T (+ bias)`` without materialising the logits.

    hidden: (B, T, H), rows [0, B/2) the chosen responses and [B/2, B) the rejected ones (pair i
    is rows i and i + B/2); weight: (V, H); target: (B, T) token ids, already shifted,
    ``ignore_index`` where a position does not count; nll_target: optional labels for the NLL term
    (default: ``target``); chunk_size: the most token rows whose logits exist at once (None: chosen
    from a memory budget); fp32_weight_grad: accumulate dW across chunks in float32 (False: in the
    weight's dtype, which saves V×H×4 bytes at some cost in precision).

    Gradients flow to hidden, weight and bias, each only if it requires grad.
    """
    check_arguments(hidden, weight, target, bias, nll_target, beta=beta, chunk_size=chunk_size)
    counts = count_tokens(target, nll_target, weight.shape[0], ignore_index, compute_nll_loss)
    grad_on = torch.is_grad_enabled()
    needs_grad = (grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
                  grad_on and bias is not None and bias.requires_grad)
    options = dict(beta=float(beta), compute_nll_loss=compute_nll_loss, chunk_size=chunk_size,
                   fp32_weight_grad=fp32_weight_grad, needs_grad=needs_grad)
    loss, nll_loss, or_loss, c, r, log_odds, logits_means = _FusedLinearORPOFunction.apply(
        hidden, weight, bias, counts, options)
    return orpo_output(loss, nll_loss, or_loss, c, r, log_odds, beta=beta,
                       chosen_logits_mean=logits_means[0], rejected_logits_mean=logits_means[1])


class FusedLinearORPOLoss(torch.nn.Module):
    """``fused_linear_orpo_loss`` with its options held by the module."""

    def __init__(self, beta=0.1, ignore_index=-100, compute_nll_loss=True, chunk_size=None, fp32_weight_grad=True):
        super().__init__()
        self.beta, self.ignore_index, self.compute_nll_loss = beta, ignore_index, compute_nll_loss
        self.chunk_size, self.fp32_weight_grad = chunk_size, fp32_weight_grad

    def forward(self, hidden, weight, target, bias=None, nll_target=None) -> ORPOOutput:
        return fused_linear_orpo_loss(hidden, weight, target, bias, beta=self.beta, ignore_index=self.ignore_index,
                                      nll_target=nll_target, compute_nll_loss=self.compute_nll_loss,
                                      chunk_size=self.chunk_size, fp32_weight_grad=self.fp32_weight_grad)

    def extra_repr(self) -> str:
        return (f"beta={self.beta}, ignore_index={self.ignore_index}, compute_nll_loss={self.compute_nll_loss}, "
                f"chunk_size={self.chunk_size}, fp32_weight_grad={self.fp32_weight_grad}")
