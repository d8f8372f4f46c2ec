"""Triton kernels for the row work of the chunked ORPO loss.

A chunk of logits (C rows × V) sits in one buffer written by the logits GEMM. Two kernels touch it:

* ``row_stats_kernel`` — one program per row, one read: an online log-sum-exp over the
  vocabulary, the log-probs of the two targets and the row sum of logits.
* ``row_grads_kernel`` — once the pair coefficients are known, one program per row rewrites it in
  place into dL/dlogits (one read, one write), the target columns set from the precise float32
  log-probs. The same kernel serves logits recomputed in a second pass: it needs only the saved
  log-sum-exp.
* ``scale_kernel`` — backward's upstream gradient on the finished sums: ``out = g·x`` in one pass into a
  new tensor, the float32 dW sum cast to the weight dtype as it is stored. (torch's multiply by a 0-d device
  tensor takes an unvectorised path: on the H200 it spent 2.4 ms on the 128256×4096 float32 dW.)
"""

from dataclasses import dataclass

from . import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

import triton
import triton.language as tl


@triton.jit
def _log1p(x):
    # log(1 + x) without losing a tiny x to rounding (Goldberg's trick; tl has no log1p).
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.log(u) * (x / tl.where(u == 1.0, 1.0, u - 1.0)))


@triton.jit
def _this_row(row, logits_ptr, stride_row, target_ptr, nll_target_ptr, token_ptr):
    # A row of the chunk: its address, its two target ids and its index among the B*T tokens.
    return (logits_ptr + stride_row.to(tl.int64) * row, tl.load(target_ptr + row), tl.load(nll_target_ptr + row),
            tl.load(token_ptr + row))


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
    BLOCK_V: tl.constexpr,
    SLOT: tl.constexpr,  # adjacent columns that share a running max and sum (stats_slot(BLOCK_V))
):
    _row_stats(tl.program_id(0), logits_ptr, stride_row, target_ptr, nll_target_ptr, token_ptr, logp_ptr, nll_logp_ptr,
               logit_sum_ptr, lse_ptr, V, BLOCK_V, SLOT)


@triton.jit
def _row_stats(row, logits_ptr, stride_row, target_ptr, nll_target_ptr, token_ptr, logp_ptr, nll_logp_ptr,
               logit_sum_ptr, lse_ptr, V, BLOCK_V: tl.constexpr, SLOT: tl.constexpr):
    row_ptr, target, nll_target, token = _this_row(row, logits_ptr, stride_row, target_ptr, nll_target_ptr, token_ptr)
    acc = lse_ptr.dtype.element_ty  # float32, or float64 for float64 inputs
    has_target = target >= 0
    has_nll = nll_target >= 0
    target_logit = tl.load(row_ptr + target, mask=has_target, other=0.0).to(acc)
    nll_logit = tl.load(row_ptr + nll_target, mask=has_nll, other=0.0).to(acc)

    # Online log-sum-exp. The target's own term is left out of the sum so that a near-certain
    # target (the row maximum) gets log p = -log1p(sum of the others) rather than a rounded 0.
    # The partial block at the end of the row goes first, with masks; the whole blocks then need
    # none, and only the one holding the target compares columns.
    offs = tl.arange(0, BLOCK_V)
    tail = V // BLOCK_V * BLOCK_V
    cols = tail + offs
    in_row = cols < V
    x = tl.load(row_ptr + cols, mask=in_row, other=float("-inf")).to(acc)
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
        block = next_x.to(acc)
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

    lse, logp, nll_logp = _log_probs(row_max, other_sum, target_logit, nll_logit, target, nll_target)
    tl.store(logp_ptr + token, tl.where(has_target, logp, 0.0))
    tl.store(nll_logp_ptr + token, tl.where(has_nll, nll_logp, 0.0))
    tl.store(logit_sum_ptr + token, logit_sum)
    tl.store(lse_ptr + token, lse)


@triton.jit
def _log_probs(row_max, other_sum, target_logit, nll_logit, target, nll_target):
    # From a row's max and its sum of exp(logit - max) without the target's term: the log-sum-exp and
    # the log-probs of the two targets (-1: none). A near-certain target gets log p = -log1p(others)
    # instead of a rounded 0.
    target_rel = target_logit - row_max  # <= 0; exactly 0 when the target is the maximum
    target_term = tl.exp(tl.where(target >= 0, target_rel, float("-inf")))  # 0 without a target
    lse = row_max + tl.log(other_sum + target_term)
    logp = target_rel - _log1p(other_sum + (target_term - 1.0))
    nll_logp = tl.where(nll_target == target, logp, nll_logit - lse)
    return lse, logp, nll_logp


@triton.jit
def _expm1(x):
    # exp(x) - 1 for x <= 0. Near 0, Kahan's trick keeps a tiny x from rounding away (tl has no expm1);
    # below -1/2 the plain difference has no cancellation, and the trick would fail where exp(x) is a
    # float32 subnormal (x < -87.3: its log is no longer x), so the plain form is used there.
    u = tl.exp(x)
    ratio = (u - 1.0) * x / tl.log(tl.where((u == 1.0) | (u == 0.0), 0.5, u))
    return tl.where(x < -0.5, u - 1.0, tl.where(u == 1.0, x, ratio))


@triton.jit
def _target_columns(grad, cols, target, nll_target, target_grad, nll_grad):
    # the two target columns of a block of G; the target's last, as it holds the y' = y case
    grad = tl.where(cols == nll_target, nll_grad, grad)
    return tl.where(cols == target, target_grad, grad)


@triton.jit
def row_grads_kernel(
    logits_ptr,  # (C, V) chunk of logits, rewritten in place into dL/dlogits
    stride_row,
    target_ptr,  # (C,) int32 odds-ratio target id, -1 where ignored
    nll_target_ptr,  # (C,) int32 NLL target id, -1 where ignored
    token_ptr,  # (C,) int64 index of each row in the flattened (B*T) per-token arrays
    logp_ptr,  # (B*T,) fp32 log p(target), from row_stats_kernel
    nll_logp_ptr,  # (B*T,) fp32 log p(nll target)
    lse_ptr,  # (B*T,) fp32 log-sum-exp of each row (fp64 for float64 inputs, like the two above)
    seq_coef_ptr,  # (B,) fp32 dL/dlogp of each odds-ratio token of the sequence
    nll_tokens,  # NLL tokens in the batch: each one's dL/dlogp is -1 / nll_tokens (an int, exact in any dtype)
    seq_len,
    V,  # at least BLOCK_V
    BLOCK_V: tl.constexpr,
):
    _row_grads(tl.program_id(0), logits_ptr, stride_row, target_ptr, nll_target_ptr, token_ptr, logp_ptr, nll_logp_ptr,
               lse_ptr, seq_coef_ptr, nll_tokens, seq_len, V, BLOCK_V)


@triton.jit
def _row_grads(row, logits_ptr, stride_row, target_ptr, nll_target_ptr, token_ptr, logp_ptr, nll_logp_ptr, lse_ptr,
               seq_coef_ptr, nll_tokens, seq_len, V, BLOCK_V: tl.constexpr):
    row_ptr, target, nll_target, token = _this_row(row, logits_ptr, stride_row, target_ptr, nll_target_ptr, token_ptr)
    acc = lse_ptr.dtype.element_ty
    # G = a·onehot(y) + b·onehot(y') - s·P with a = dL/dlogp(y), b = dL/dlogp(y'), s = a + b.
    a = tl.where(target >= 0, tl.load(seq_coef_ptr + token // seq_len), 0.0)
    b = tl.where(nll_target >= 0, tl.full((), -1.0, acc) / nll_tokens, 0.0)
    s = a + b
    # The target columns from expm1(log p) = p - 1, so that nothing cancels when p ≈ 1:
    # G[y] = a - s·p_y = -(s·expm1(log p_y) + b), or -s·expm1(log p_y) when y' = y (then a + b = s);
    # G[y'] = -(s·expm1(log p_y') + a).
    target_grad = -(s * _expm1(tl.load(logp_ptr + token)) + tl.where(nll_target == target, 0.0, b))
    nll_grad = -(s * _expm1(tl.load(nll_logp_ptr + token)) + a)
    lse = tl.load(lse_ptr + token)
    neg_s = -s
    out_dtype = logits_ptr.dtype.element_ty

    # Whole blocks without masks (only a block holding a target compares columns), then the tail.
    offs = tl.arange(0, BLOCK_V)
    tail = V // BLOCK_V * BLOCK_V
    for start in range(0, tail, BLOCK_V):
        x = tl.load(row_ptr + start + offs)
        grad = neg_s * tl.exp(x.to(acc) - lse)
        if ((target >= start) & (target < start + BLOCK_V)) | ((nll_target >= start) & (nll_target < start + BLOCK_V)):
            grad = _target_columns(grad, start + offs, target, nll_target, target_grad, nll_grad)
        tl.store(row_ptr + start + offs, grad.to(out_dtype))
    cols = tail + offs
    in_row = cols < V
    x = tl.load(row_ptr + cols, mask=in_row, other=float("-inf"))  # exp(-inf) = 0: nothing overflows
    grad = _target_columns(neg_s * tl.exp(x.to(acc) - lse), cols, target, nll_target, target_grad, nll_grad)
    tl.store(row_ptr + cols, grad.to(out_dtype), mask=in_row)


@dataclass(frozen=True)
class RowLaunch:
    """Launch configuration of a row kernel (one program per row)."""

    block_v: int  # vocabulary entries per loop step
    num_warps: int


# Chosen from the H200 sweeps in figures/data (notebooks/03-kernel-tuning.ipynb); the statistics kernel's
# was the best of row-stats-slots-sweep-2026-12-03-h200.json, and within noise of the best in later sweeps.
STATS_LAUNCH = RowLaunch(block_v=1024, num_warps=1)
GRADS_LAUNCH = RowLaunch(block_v=8192, num_warps=16)


def _block_v(vocab: int, launch: RowLaunch) -> int:
    # a power of two no larger than the row, so that every row has at least one whole block
    return min(launch.block_v, 1 << (vocab.bit_length() - 1))


def stats_slot(block_v: int) -> int:
    """Columns per slot of row_stats' running statistics: 8 (one 16-byte load of bf16), fewer in a tiny row."""
    return min(8, block_v)


def _rows_of(logits):
    if logits.stride(1) != 1:
        raise ValueError("logits chunk must have unit stride along the vocabulary")
    return logits.shape


def row_stats(logits, target, nll_target, token, logp, nll_logp, logit_sum, lse, *,
              launch: RowLaunch = STATS_LAUNCH) -> None:
    """Launch ``row_stats_kernel`` over every row of ``logits`` (a (C, V) chunk, unit column stride)."""
    rows, vocab = _rows_of(logits)
    block_v = _block_v(vocab, launch)
    row_stats_kernel[(rows,)](
        logits, logits.stride(0), target, nll_target, token, logp, nll_logp, logit_sum, lse, vocab,
        BLOCK_V=block_v, SLOT=stats_slot(block_v), num_warps=launch.num_warps,
    )


def row_grads(logits, target, nll_target, token, logp, nll_logp, lse, seq_coef, *, nll_tokens: int, seq_len: int,
              launch: RowLaunch = GRADS_LAUNCH) -> None:
    """Launch ``row_grads_kernel``: every row of ``logits`` rewritten into dL/dlogits (``nll_tokens``: the NLL
    term's normaliser; rows without an NLL target, -1, ignore it)."""
    rows, vocab = _rows_of(logits)
    row_grads_kernel[(rows,)](
        logits, logits.stride(0), target, nll_target, token, logp, nll_logp, lse, seq_coef, nll_tokens, seq_len, vocab,
        BLOCK_V=_block_v(vocab, launch), num_warps=launch.num_warps,
    )


@triton.jit
def scale_kernel(x_ptr, scale_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < n
    scale = tl.load(scale_ptr)  # float32, or float64 for float64 inputs: the product is formed in its dtype
    x = tl.load(x_ptr + offs, mask=in_range).to(scale.dtype)
    tl.store(out_ptr + offs, (x * scale).to(out_ptr.dtype.element_ty), mask=in_range)


def scale(x, scale_by, out):
    """``out = scale_by * x`` for contiguous tensors of the same shape (``out`` may be ``x``); ``scale_by`` is a
    0-d float32 (or float64) tensor; the product is formed in its dtype and rounded once to ``out``'s dtype.
    Returns ``out``."""
    if not (x.is_contiguous() and out.is_contiguous() and x.shape == out.shape):
        raise ValueError("scale needs contiguous x and out of the same shape")
    block = 4096
    scale_kernel[(triton.cdiv(x.numel(), block),)](x, scale_by, out, x.numel(), BLOCK=block, num_warps=8)
    return out
