"""One call of the chunked loss as data flow: the row order, the blocks of logits, and the step functions.

How one block of C token rows is processed (G is dL/dlogits, P the softmax, X the block's hidden rows):

1. ``logits = X @ W.T (+ bias)`` into a C×V buffer (cuBLAS), whose rows are a multiple of 16 columns wide; at
   an odd vocabulary each GEMM over the buffer's columns is two (``gemm_head``): W's first rows, a multiple of 16,
   and a 16-row copy of the rest with zero rows up to the buffer's width, so that every load is aligned. (The
   padding columns hold zeros, which stay zeros through steps 2 to 4.)
2. ``row_stats_kernel`` reads it once: log-sum-exp, target log-probs and logit sums per row. None of
   this depends on the other sequence of the pair.
3. ``pair_terms_kernel``, once every row of the chunk's pairs has its log-prob: each sequence's mean
   log-prob, the odds ratio, and per token ``a = dL/dlogp`` of the odds-ratio target and ``b`` of the
   NLL target, so that ``G = a·onehot(y) + b·onehot(y') - (a + b)·P``.
4. ``row_grads_kernel`` rewrites the buffer in place into G (one read, one write), its two target
   columns from the float32 log-probs so that nothing cancels when p ≈ 1.
5. ``dX = G @ W`` and ``dW += G.T @ X``: the GEMMs see the gradient exactly as the materialising
   baseline would, rounded once to the input dtype. Both take G's rows with their padding columns, so that
   every dimension is aligned: dW's sum then has a zero row per padding column, left out at the end.

After the last block, ``call_terms_kernel`` forms the loss and the metrics vector in one launch.

A pair longer than a chunk is split into blocks (``schedule.plan_passes`` decides how). In one pass,
where every token the odds ratio counts has its target id as NLL id (or there is no NLL term), G = c·U
on each sequence's response rows, with U = d log p(y) / dlogits = onehot(y) - P and one coefficient c
per sequence (a, plus b on the chosen one). Each such block goes through steps 1, 2 and 4 with c = 1, and
its GEMMs at once, into ``PairSums``: Q = U·W in float32 for its rows and, per sequence, Σ Uᵀ·X and Σ U.
The chosen sequence's NLL-only rows (TRL's prompt: the odds ratio ignores them), which come before its
response rows, have G = b·(onehot(y') - P) with b = -1/N known before any GEMM: their blocks go through
steps 1, 2, 4 and 5 at once, into the call's sums. At the pair's end step 3 gives the two coefficients,
and dX = c·Q (rounded once), dW += c_c·Σ_c + c_r·Σ_r. Otherwise the pair takes two passes: steps 1 and 2
for every block, then 3, then each block's logits again for 4 and 5.

Without gradients on an H200 (``schedule.statistics_in_gemm``), steps 1 and 2 are one Gluon kernel
(``kernels.gluon_row_stats``) that reduces each tile of logits inside the GEMM: there is no buffer.

When every row fits in one block (``schedule.single_block``, decided from shapes) and there are more rows
than ``schedule.early_rows`` (``schedule.overlaps_read_backs``), the logits of that many first rows are
queued before the label counts are read back (``early_logits``): the block's rows begin with them whatever
the counts turn out to be, so the GPU works while the host reads the counts and plans. This holds with or
without gradients, but not where a call without them may take its statistics from inside the GEMM.

``forward`` returns the loss terms and what backward needs. With several blocks, that is the unscaled
sums dX, dW and dbias, which ``backward`` multiplies by the upstream gradient into new tensors. With one
block it is G itself: backward runs step 5, dW with the upstream gradient as the GEMM's scale factor and
dX (where the block overlaps its read-backs) in float32 scaled on the device, so every gradient is rounded
once. Either way the saved tensors are only read, so a second backward through a retained graph gives the
same gradients again.
"""

from dataclasses import dataclass

import torch

from . import kernels, schedule
from ._triton_mode import INTERPRET
from .logit_transform import IDENTITY, LogitTransform
from .validation import TokenCounts, copy_to_host


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


# ---- the plan -----------------------------------------------------------------------------------

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
            groups = gradient_groups(hidden, vocab, counts, opts, pair_rows, rows)
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


def gradient_groups(hidden, vocab: int, counts: TokenCounts, opts: Options, pair_rows: list, chunk_rows: int) -> list:
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


# ---- per-token statistics -----------------------------------------------------------------------

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


# ---- one block ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    span: tuple  # (start, end) of its rows in the row order
    tokens: torch.Tensor  # (C,) flattened token index of each row
    x: torch.Tensor | None  # (C, H) the rows of hidden (None: a single block, whose GEMMs of x wait for backward)
    logits: torch.Tensor | None  # (C, V) view of the buffer: logits, then G (None: no buffer)
    target: torch.Tensor  # (C,) int32, -1 where ignored
    nll_target: torch.Tensor  # (C,) int32, -1 where ignored


def new_logits_buffer(rows: int, vocab: int, like):
    """A (rows, vocab) logits buffer in ``like``'s dtype whose rows start on 16-byte boundaries
    (``schedule.logits_row_columns``): a view of a slightly wider buffer where the vocabulary is not a multiple
    of 16."""
    return like.new_empty(rows, schedule.logits_row_columns(vocab))[:, :vocab]


def with_padding(logits):
    """The rows of a ``new_logits_buffer`` view with their padding columns: a contiguous (rows, padded) tensor, as
    a custom op's output must be (the compiler takes its strides from the fake implementation's)."""
    return logits.as_strided((logits.shape[0], logits.stride(0)), (logits.stride(0), 1))


@dataclass(frozen=True)
class Head:
    """W and bias as the GEMMs over the logits buffer's columns take them (``gemm_head``)."""

    weight: torch.Tensor  # W's rows for the buffer's first columns, a multiple of 16 of them (a view)
    bias: torch.Tensor | None = None
    tail: torch.Tensor | None = None  # (16, H) at an odd vocabulary: W's last rows, then zero rows (a copy)
    tail_bias: torch.Tensor | None = None


def gemm_head(weight, bias) -> Head:
    """W and bias split where the vocabulary is not a multiple of 16: its first rows, a multiple of 16, and a
    16-row copy of the rest with zero rows (and zero bias) up to the buffer's row width
    (``schedule.logits_row_columns``). Each GEMM over the buffer's columns is then two, each of whose dimensions is a
    multiple of 16: at an odd vocabulary cuBLAS runs the logits and dX GEMMs six to eight times slower otherwise (at
    8192×1024×50257 on an H100 the logits GEMM took 8.66 against 1.30 ms and the dX GEMM 5.97 against 0.95 ms,
    aligned-rows-2026-12-06-h100-2ac8dd8.json). At a vocabulary that is a multiple of 16: W and bias whole."""
    vocab = weight.shape[0]
    columns = schedule.logits_row_columns(vocab)
    if columns == vocab:
        return Head(weight, bias)
    main = columns - 16
    tail = weight.new_zeros(16, weight.shape[1])
    tail[:vocab - main] = weight[main:]
    if bias is None:
        return Head(weight[:main], None, tail)
    return Head(weight[:main], bias[:main], tail, torch.cat([bias[main:], bias.new_zeros(columns - vocab)]))


def linear_into(out, x, head: Head):
    """out = x @ W.T (+ bias), for ``out`` a view of the logits buffer: the GEMMs write whole rows of the buffer,
    zeros in its padding columns. Returns out."""
    rows = with_padding(out)
    main = head.weight.shape[0]
    _linear(rows[:, :main], x, head.weight, head.bias)
    if head.tail is not None:
        _linear(rows[:, main:], x, head.tail, head.tail_bias)
    return out


def _linear(out, x, weight, bias):
    if bias is None:
        torch.mm(x, weight.t(), out=out)
    else:
        torch.addmm(bias, x, weight.t(), out=out)


def grads_times_head(grads, head: Head, out):
    """out = G·W for ``grads`` the buffer's whole rows (with their padding columns), the products summed in float32
    (or out's dtype) and rounded once to out's dtype; at an odd vocabulary through a float32 sum of ``head``'s two
    GEMMs. Returns out."""
    if head.tail is None:
        return mm_into(out, grads, head.weight)
    main = head.weight.shape[0]
    acc_dtype = stats_dtype(out.dtype)
    acc = out if out.dtype == acc_dtype else out.new_empty(out.shape, dtype=acc_dtype)
    mm_into(acc, grads[:, :main], head.weight)
    accumulate_mm(acc, grads[:, main:], head.tail)
    return out if acc is out else out.copy_(acc)


def block_rows(plan: Plan, span, hidden):
    """The block's rows of hidden: a view in token order, a gather otherwise."""
    start, end = span
    return hidden_rows(hidden)[start:end] if plan.token_order else gather_rows(hidden, plan.row_tokens[start:end])


def block_logits(plan: Plan, span, buffer, hidden, head: Head):
    """The block's rows of hidden, and their logits in the buffer."""
    x = block_rows(plan, span, hidden)
    return x, linear_into(buffer[: span[1] - span[0]], x, head)


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
    db = torch.zeros(weight.shape[0], device=hidden.device, dtype=stats_dtype(hidden.dtype)) if opts.grad_bias else None
    dw_dtype = dw_sum_dtype(hidden.dtype, opts.fp32_weight_grad) if opts.grad_weight else None
    return GradSums(dx, db, dw_dtype)


def add_block_grads(sums: GradSums, block: Block, head: Head, token_order: bool) -> None:
    """dX rows, dW and dbias of a block whose buffer holds G."""
    grad, padded = block.logits, with_padding(block.logits)
    if sums.dx is not None:
        if token_order:
            grads_times_head(padded, head, sums.dx[block.span[0]:block.span[1]])
        else:
            rows = grads_times_head(padded, head, sums.dx.new_empty(len(block.tokens), sums.dx.shape[1]))
            sums.dx.index_copy_(0, block.tokens, rows)
    if sums.dw_dtype is not None:
        if sums.dw is None:
            sums.dw = _mm(padded.t(), block.x, sums.dw_dtype)
        else:
            accumulate_mm(sums.dw, padded.t(), block.x)
    if sums.db is not None:
        sums.db += grad.sum(0, dtype=sums.db.dtype)


def _mm(a, b, out_dtype):
    """a @ b as a new tensor of ``out_dtype`` (products summed in float32 whatever the operand dtype)."""
    return mm_into(a.new_empty(a.shape[0], b.shape[1], dtype=out_dtype), a, b)


def accumulate_mm(acc, a, b):
    """acc += a @ b, accumulating in acc's dtype."""
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    elif a.is_cuda:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))


def mm_into(out, a, b):
    """out = a @ b, the products summed in float32 (or out's dtype) and rounded once to out's dtype; returns out."""
    if a.dtype == out.dtype:
        return torch.mm(a, b, out=out)
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=out.dtype, out=out)
    return torch.mm(a.to(out.dtype), b.to(out.dtype), out=out)


# ---- the steps of one call ----------------------------------------------------------------------

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
    stats = new_token_stats(batch, seq, stats_dtype(hidden.dtype), hidden.device)
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


def statistics_only(call: Call, group, ready: Block | None) -> None:
    """No gradients: the row statistics of each block, from its logits in the buffer or, with no buffer
    (``statistics_in_gemm``), from inside the logits GEMM."""
    if call.buffer is not None:
        for span in group.blocks:
            row_stats(block_at(call, span, ready), call.stats, call.opts.transform)
        return
    from .kernels.gluon_row_stats import logits_row_stats  # Gluon: imported only where Hopper runs it
    for span in group.blocks:
        block = make_block(span, block_rows(call.plan, span, call.hidden), None, call.row_tokens, call.counts,
                           call.plan.token_order)
        logits_row_stats(block.x, call.head.weight, block.target, block.nll_target, block.tokens, call.stats.logp,
                         call.stats.nll_logp, call.stats.logit_sum, call.stats.lse)


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


def two_passes(call: Call, group, sums: GradSums | None, ready: Block | None) -> None:
    """Whole pairs in one block, or one pair in two passes: statistics of every block, then the pair terms,
    then each block's gradient (``sums`` None: a single block, whose GEMMs wait for backward)."""
    for span in group.blocks:
        block = block_at(call, span, ready)
        row_stats(block, call.stats, call.opts.transform)
    group_pair_terms(call, group)
    # The buffer still holds the last block's logits: take the blocks last to first, so that only the
    # others have their logits computed again.
    for span in reversed(group.blocks):
        block = block_at(call, span, block)
        row_grads(block, call.stats, call.nll_tokens, call.seq, call.opts.transform)
        if sums is not None:
            add_block_grads(sums, block, call.head, call.plan.token_order)


# ---- a pair in one pass -------------------------------------------------------------------------

@dataclass
class PairSums:
    """The gradient GEMMs of a pair's response rows in one pass, before its two coefficients (None: not needed)."""

    dx_rows: torch.Tensor | None  # (response rows, H) Q = U·W of each row, in the statistics dtype
    dw: list  # [chosen, rejected] (padded V, H) Σ Uᵀ·X in the dW sum dtype, each made by its sequence's first block
    db: torch.Tensor | None  # (2, V) Σ U of the chosen and of the rejected sequence


def new_pair_sums(call: Call, group, sums: GradSums) -> PairSums:
    rows, size = group.blocks[-1][1] - group.response_start, call.hidden.shape[2]
    dtype, device = call.stats.lse.dtype, call.hidden.device
    dx_rows = torch.empty(rows, size, device=device, dtype=dtype) if sums.dx is not None else None
    db = torch.zeros(2, call.buffer.shape[1], device=device, dtype=dtype) if sums.db is not None else None
    return PairSums(dx_rows, [None, None], db)


def one_pass(call: Call, group, sums: GradSums, ready: Block | None) -> None:
    """One pair, each block once. The NLL-only rows, first, become their final G (the NLL's coefficient is
    known), whose GEMMs add to ``sums`` at once; the response rows become U = d log p(y) / dlogits, whose
    GEMMs add to the pair's sums; the pair's coefficients, known after its last block, then scale those
    into ``sums``."""
    pair = new_pair_sums(call, group, sums)
    for span in group.blocks:
        block = block_at(call, span, ready)
        row_stats(block, call.stats, call.opts.transform)
        if span[0] < group.response_start:  # no odds-ratio target: row_grads needs no sequence coefficient yet
            row_grads(block, call.stats, call.nll_tokens, call.seq, call.opts.transform)
            add_block_grads(sums, block, call.head, call.plan.token_order)
        else:
            kernels.row_logp_grads(block.logits, block.target, block.tokens, call.stats.logp, call.stats.lse,
                                   transform=call.opts.transform)
            add_to_pair_sums(pair, block, group, call.head, sums.dw_dtype)
    group_pair_terms(call, group)
    add_pair_sums(sums, pair, pair_scales(call, group.first_pair), call, group)


def add_to_pair_sums(pair: PairSums, block: Block, group, head: Head, dw_dtype) -> None:
    """A block's GEMMs on U, into its rows of Q and its sequence's sums (no block straddles the two)."""
    grad, padded, side = block.logits, with_padding(block.logits), int(block.span[0] >= group.rejected_start)
    if pair.dx_rows is not None:
        first = group.response_start
        grads_times_head(padded, head, pair.dx_rows[block.span[0] - first:block.span[1] - first])
    if dw_dtype is not None:
        if pair.dw[side] is None:
            pair.dw[side] = _mm(padded.t(), block.x, dw_dtype)
        else:
            accumulate_mm(pair.dw[side], padded.t(), block.x)
    if pair.db is not None:
        pair.db[side] += grad.sum(0, dtype=pair.db.dtype)


def pair_scales(call: Call, pair: int) -> torch.Tensor:
    """(2,) the coefficient c of the pair's chosen and rejected sequence, so that G = c·U on their rows: the
    odds ratio's dL/dlogp, plus the NLL term's -1/N on the chosen rows."""
    pairs = call.hidden.shape[0] // 2
    scales = call.stats.seq_coef[pair::pairs].clone()  # sequences pair and pair + pairs: a view, no index to copy
    if call.opts.compute_nll_loss:
        scales[0] -= 1.0 / call.nll_tokens
    return scales


def add_pair_sums(sums: GradSums, pair: PairSums, scales, call: Call, group) -> None:
    """dX rows = c·Q, dW += c_c·Σ_c + c_r·Σ_r, dbias += c_c·Σ_c + c_r·Σ_r."""
    if sums.dx is not None:
        add_pair_dx(sums.dx, pair.dx_rows, scales, call, group)
    if sums.dw_dtype is not None:
        chosen, rejected = pair.dw
        # the call's first dW sum (no earlier pair's, no NLL-only block's) takes the place of the chosen sequence's
        if sums.dw is None:
            sums.dw = kernels.pair_sum(chosen, rejected, scales, out=chosen, accumulate=False)
        else:
            kernels.pair_sum(chosen, rejected, scales, out=sums.dw, accumulate=True)
    if sums.db is not None:
        sums.db += scales @ pair.db


def add_pair_dx(dx, dx_rows, scales, call: Call, group) -> None:
    """Each row of Q times its sequence's coefficient, rounded once into dX's dtype and rows."""
    start, end = group.response_start, group.blocks[-1][1]
    chosen = group.rejected_start - start
    out = dx[start:end] if call.plan.token_order else dx.new_empty(end - start, dx.shape[1])
    kernels.scale(dx_rows[:chosen], scales[0], out=out[:chosen])
    kernels.scale(dx_rows[chosen:], scales[1], out=out[chosen:])
    if not call.plan.token_order:
        dx.index_copy_(0, call.row_tokens[start:end], out)


# ---- forward and backward -----------------------------------------------------------------------

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
    buffer = new_logits_buffer(batch * seq, weight.shape[0], hidden)
    head = gemm_head(weight, bias)
    linear_into(buffer[:rows], gather_rows(hidden, kept_order[:rows]), head)
    return EarlyLogits(buffer, rows, head)


def finish_early_logits(early: EarlyLogits, plan: Plan, rows: int, hidden, bias, counts: TokenCounts,
                        transform: LogitTransform):
    """The single block's ``rows`` logits, those after the early ones computed now; with dropped tokens also
    their logit sums per half, from rows appended to the same GEMM (``dropped_sum_rows``), or None where no
    GEMM follows the early rows, the buffer has no room for those rows or the transform has a cap."""
    start, dropped_sums = early.rows, None
    if rows > start:
        x = block_rows(plan, (start, rows), hidden)
        with_sums = plan.dropped and transform.linear and rows + DROPPED_SUM_ROWS <= len(early.buffer)
        if with_sums:
            x = torch.cat([x, dropped_sum_rows(hidden, counts)])
        linear_into(early.buffer[start:start + len(x)], x, early.head)
        if with_sums:
            dropped_sums = dropped_logit_sums_from(early.buffer[rows:rows + DROPPED_SUM_ROWS], bias, counts,
                                                   hidden.shape, transform)
    return early.buffer[:rows], dropped_sums


def forward(hidden, weight, bias, counts: TokenCounts, opts: Options, early: EarlyLogits | None = None) -> Forward:
    plan = make_plan(hidden, weight.shape[0], counts, opts)
    dropped_sums = None  # (2,) the dropped tokens' logit sums per half, where a logits GEMM gives them
    if statistics_in_gemm(hidden, weight, bias, sum(counts.kept_per_seq), opts):  # no logits buffer at all
        call = new_call(hidden, Head(weight, bias), counts, opts, plan, None)
        sums = ready = None
    else:
        first_span = plan.groups[0].blocks[0]
        if early is None:
            head = gemm_head(weight, bias)
            buffer = new_logits_buffer(plan.buffer_rows, weight.shape[0], hidden)
            x, logits = block_logits(plan, first_span, buffer, hidden, head)
        else:  # a single block (its x is read again in backward)
            head, buffer, x = early.head, early.buffer, None
            logits, dropped_sums = finish_early_logits(early, plan, first_span[1], hidden, bias, counts,
                                                       opts.transform)
        # the first GEMM is queued: the GPU is busy while the host finishes the setup
        call = new_call(hidden, head, counts, opts, plan, buffer)
        sums = new_grad_sums(hidden, weight, plan, opts) if opts.needs_grad and not opts.single_block else None
        ready = make_block(first_span, x, logits, call.row_tokens, counts, plan.token_order)
        del x, logits  # the first block holds them, and frees its gathered rows when the next block is made
    for group in plan.groups:
        if not opts.needs_grad:
            statistics_only(call, group, ready)
        elif group.one_pass:
            one_pass(call, group, sums, ready)
        else:
            two_passes(call, group, sums, ready)
        ready = None
    if not opts.needs_grad:  # with gradients, the chunk groups computed them pair by pair
        pair_terms(call.stats, counts, 0, hidden.shape[0] // 2, hidden.shape[1], opts.beta)
    if plan.dropped and dropped_sums is None:
        if opts.transform.linear:
            dropped_sums = dropped_logit_sums(hidden, weight, bias, counts, opts.transform)
        else:
            capped_dropped_logit_sums(call, weight.shape[0])
    loss, metrics = call_terms(call.stats, counts, dropped_sums, weight.shape[0], opts.beta, opts.compute_nll_loss)
    if opts.single_block and opts.needs_grad:  # the single block fills the buffer (up to its kept rows)
        return Forward(loss, metrics, call.stats.seq_logp, logit_grads=with_padding(call.buffer[:plan.buffer_rows]),
                       row_tokens=plan.row_tokens)
    return Forward(loss, metrics, call.stats.seq_logp, sums=sums)


def call_terms(stats: TokenStats, counts: TokenCounts, dropped_sums, vocab: int, beta: float,
               compute_nll_loss: bool) -> tuple:
    """The loss and the metrics vector (kernels.call_terms). ``dropped_sums``: (2,) the dropped tokens' logit
    sums per half, which the mean logits count too (None: no token dropped)."""
    return kernels.call_terms(stats.pair_loss, stats.log_odds, stats.seq_logp, stats.nll_logp, stats.logit_sum,
                              dropped_sums, nll_tokens=counts.nll_tokens, vocab=vocab, beta=beta,
                              compute_nll=compute_nll_loss)


# ---- the logits of dropped tokens, for the logit-mean metrics -------------------------------------
# A dropped token's logits are needed only in their sum over the vocabulary, which is linear in its row of
# hidden: the logits of a row holding the sum of a half's dropped rows sum to that half's dropped logits. A
# single block appends such rows to the GEMM of its rows after the early ones, and forms them while the early
# rows' GEMM runs: they cost no pass over W. Summing W's rows instead reads all of W (0.37 ms at V=128256,
# H=4096 on an H100, 4% of a 2×1024 step: host-gaps-2026-12-06-h100-b39e6cb.txt).

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
    sums = sum_logits.sum(1, dtype=stats_dtype(sum_logits.dtype)).view(2, 2).sum(0)  # rounded part + rest
    sums = sums if bias is None else sums + dropped_bias_sums(bias, counts, hidden_shape, taken=2)
    return transform.scale * sums


def dropped_logit_sums(hidden, weight, bias, counts: TokenCounts, transform: LogitTransform = IDENTITY):
    """The dropped tokens' logit sums per half where no GEMM gives them (several blocks, no buffer, a vocabulary
    shard): sum_v logits = scale·(h·sum_v W + sum(b)), which reads all of W. (Linear transforms only.)"""
    sums = kernels.dropped_row_sums(hidden, counts.target_ids, counts.nll_ids) @ weight.sum(
        0, dtype=stats_dtype(hidden.dtype))
    sums = sums if bias is None else sums + dropped_bias_sums(bias, counts, hidden.shape, taken=0)
    return transform.scale * sums


CAPPED_DROPPED_ROWS = 1024  # the most dropped rows whose logits exist at once (at V=128256 in bf16, 0.25 GiB)


def capped_dropped_logit_sums(call: Call, vocab: int) -> None:
    """With a cap a row's logit sum is no longer linear in the row: the dropped tokens' logits are computed, a
    chunk at a time, and ``row_stats_kernel`` (no target) writes each one's sum where a kept token's goes."""
    dropped = (~call.counts.kept_mask).view(-1).nonzero().squeeze(1)
    rows = min(len(dropped), CAPPED_DROPPED_ROWS)
    buffer = new_logits_buffer(rows, vocab, call.hidden)
    no_target = torch.full((rows,), -1, dtype=torch.int32, device=call.hidden.device)
    for start in range(0, len(dropped), rows):
        tokens = dropped[start:start + rows]
        logits = linear_into(buffer[:len(tokens)], gather_rows(call.hidden, tokens), call.head)
        kernels.row_stats(logits, no_target[:len(tokens)], no_target[:len(tokens)], tokens, call.stats.logp,
                          call.stats.nll_logp, call.stats.logit_sum, call.stats.lse, transform=call.opts.transform)


def dropped_bias_sums(bias, counts: TokenCounts, hidden_shape, taken: int):
    """(2,) per half, sum(b) times its dropped tokens less the ``taken`` times its sum rows took it already."""
    pairs, seq = hidden_shape[0] // 2, hidden_shape[1]
    kept = counts.kept_per_seq
    bias_sum = bias.sum(dtype=stats_dtype(bias.dtype))
    return torch.stack([bias_sum * (pairs * seq - sum(half) - taken) for half in (kept[:pairs], kept[pairs:])])


def backward_from_sums(grad_loss, sums: GradSums, hidden_shape, vocab: int, weight_dtype):
    """Several blocks: the upstream gradient times the saved sums, into new tensors (dW: (vocab, H), bias: (vocab,),
    in the weight dtype)."""
    dx = dw = db = None
    if sums.dx is not None:
        dx = kernels.scale(sums.dx, grad_loss, out=torch.empty_like(sums.dx)).view(hidden_shape)
    if sums.dw is not None:  # a float32 sum is cast to the weight dtype as it is scaled; its padding rows left out
        rows = sums.dw[:vocab]
        dw = kernels.scale(rows, grad_loss, out=rows.new_empty(rows.shape, dtype=weight_dtype))
    if sums.db is not None:
        db = (sums.db * grad_loss).to(weight_dtype)
    return dx, dw, db


def backward_from_logit_grads(grad_loss, hidden, weight, logit_grads, row_tokens, *, grad_hidden: bool,
                              grad_weight: bool, grad_bias: bool):
    """One block: dX = g·G·W, dW = g·Gᵀ·X, dbias = g·Σ G, with G as forward left it (``logit_grads``: its rows
    with their padding columns, zeros, which the dX GEMMs take with ``gemm_head``'s zero rows and the dW GEMM
    turns into zero rows of its result, left out).

    cuBLAS applies the upstream gradient g to dW as the GEMM's scale factor, which it takes from the host.
    Where the GEMMs are long enough (``schedule.overlaps_read_backs``), g's copy to the host is queued first,
    then the dX GEMM, which needs g only on the device (its float32 result is scaled by a kernel): the GPU
    runs that GEMM while the host waits for g. Otherwise g is read back first and scales both GEMMs. Each
    gradient is rounded once, and G stays as it is for another backward.
    """
    batch, seq, size = hidden.shape
    overlap = schedule.overlaps_read_backs(batch * seq, size, weight.shape[0])
    copied = copy_to_host(grad_loss) if overlap and grad_weight else None  # waited for at the dW GEMM
    scale = None if overlap else grad_loss.item()
    dx = dw = db = None
    if grad_hidden:
        head = gemm_head(weight, None)
        if overlap or head.tail is not None:  # (an odd vocabulary's two GEMMs sum in float32 anyway)
            rows = scaled_on_device(grad_loss, logit_grads, head)
        else:
            rows = _scaled_mm(logit_grads, head.weight, scale)
        dx = token_rows(rows, row_tokens, hidden).view(hidden.shape)
    if grad_weight:
        x = hidden_rows(hidden) if row_tokens is None else gather_rows(hidden, row_tokens)
        dw = _scaled_mm(logit_grads.t(), x, copied().item() if overlap else scale)[:weight.shape[0]]
    if grad_bias:
        grads = logit_grads[:, :weight.shape[0]]
        db = (grads.sum(0, dtype=stats_dtype(hidden.dtype)) * grad_loss).to(hidden.dtype)
    return dx, dw, db


def scaled_on_device(grad_loss, grads, head: Head):
    """g · G·W in G's dtype: the GEMMs in float32 (a temporary, freed on return), then scaled by g on the device
    and rounded once."""
    unscaled = grads_times_head(grads, head, grads.new_empty(grads.shape[0], head.weight.shape[1],
                                                              dtype=grad_loss.dtype))
    return kernels.scale(unscaled, grad_loss, out=grads.new_empty(unscaled.shape))


def token_rows(rows, row_tokens, hidden):
    """(B*T, H): the block's rows (in token order where ``row_tokens`` is None) at their tokens, 0 elsewhere."""
    if row_tokens is None:
        return rows
    return hidden.new_zeros(hidden.shape[0] * hidden.shape[1], hidden.shape[2]).index_copy_(0, row_tokens, rows)


def _scaled_mm(a, b, scale: float):
    """scale · (a @ b), the scale applied by the GEMM before its one rounding."""
    out = a.new_empty(a.shape[0], b.shape[1])
    return torch.addmm(out, a, b, beta=0, alpha=scale, out=out)  # beta = 0: out's contents are never read
