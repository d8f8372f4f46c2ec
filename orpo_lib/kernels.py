"""Triton kernels for the row work of the chunked ORPO loss.

A chunk of logits (C rows × V) sits in one buffer written by the logits GEMM. Two kernels touch it:

* ``row_stats_kernel`` — one program per row: an online log-sum-exp over the vocabulary, the
  log-probs of the two targets and the row sum of logits; with ``WRITE_PROBS`` it then rewrites
  the row in place into softmax probabilities.
* ``target_grads_kernel`` — once the pair coefficients are known, computes each row's gradient
  scale and overwrites its (at most two) target columns with their entries, from the precise
  float32 log-probs.

The probabilities do not depend on the pair, so a row is finished in one visit; the pair enters
only through per-row scalars that the GEMMs apply to their small operands (see ``fused.py``).
"""

from dataclasses import dataclass

from ._triton_mode import INTERPRET  # decides compile vs interpret before @triton.jit runs

import torch
import triton
import triton.language as tl


@triton.jit
def _log1p(x):
    # log(1 + x) without losing a tiny x to rounding (Goldberg's trick; tl has no log1p).
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.log(u) * (x / tl.where(u == 1.0, 1.0, u - 1.0)))


@triton.jit
def row_stats_kernel(
    logits_ptr,  # (C, V) chunk of logits; rewritten into probabilities when WRITE_PROBS
    stride_row,
    target_ptr,  # (C,) int32 odds-ratio target id, -1 where the token does not count
    nll_target_ptr,  # (C,) int32 NLL target id, -1 where the token does not count
    token_ptr,  # (C,) int64 index of each row in the flattened (B*T) per-token outputs
    logp_ptr,  # (B*T,) fp32 out: log p(target), 0 where ignored
    nll_logp_ptr,  # (B*T,) fp32 out: log p(nll target), 0 where ignored
    logit_sum_ptr,  # (B*T,) fp32 out: sum of the row's logits (for the logits-mean metric)
    V,
    BLOCK_V: tl.constexpr,
    WRITE_PROBS: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    target = tl.load(target_ptr + row)
    nll_target = tl.load(nll_target_ptr + row)
    token = tl.load(token_ptr + row)
    has_target = target >= 0
    has_nll = nll_target >= 0
    target_logit = tl.load(row_ptr + target, mask=has_target, other=0.0).to(tl.float32)
    nll_logit = tl.load(row_ptr + nll_target, mask=has_nll, other=0.0).to(tl.float32)

    # Online log-sum-exp. The target's own term is left out of the sum so that a near-certain
    # target (the row maximum) gets log p = -log1p(sum of the others) rather than a rounded 0.
    # Sums stay per lane (one cross-warp reduction per step, for the max), and the next block is
    # loaded before the current one is reduced, so a load is always in flight.
    offs = tl.arange(0, BLOCK_V)
    row_max = float("-inf")
    other_sums = tl.zeros([BLOCK_V], dtype=tl.float32)
    logit_sums = tl.zeros([BLOCK_V], dtype=tl.float32)
    next_x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf"), eviction_policy="evict_last")
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        x = next_x.to(tl.float32)
        next_cols = cols + BLOCK_V
        next_x = tl.load(row_ptr + next_cols, mask=next_cols < V, other=float("-inf"), eviction_policy="evict_last")
        new_max = tl.maximum(row_max, tl.max(x, axis=0))
        terms = tl.where(cols != target, tl.exp(x - new_max), 0.0)
        other_sums = other_sums * tl.exp(row_max - new_max) + terms
        logit_sums += tl.where(cols < V, x, 0.0)
        row_max = new_max
    other_sum = tl.sum(other_sums, axis=0)
    logit_sum = tl.sum(logit_sums, axis=0)

    target_rel = target_logit - row_max  # <= 0; exactly 0 when the target is the maximum
    target_term = tl.where(has_target, tl.exp(target_rel), 0.0)
    lse = row_max + tl.log(other_sum + target_term)
    logp = target_rel - _log1p(other_sum + (target_term - 1.0))
    nll_logp = tl.where(nll_target == target, logp, nll_logit - lse)
    tl.store(logp_ptr + token, tl.where(has_target, logp, 0.0))
    tl.store(nll_logp_ptr + token, tl.where(has_nll, nll_logp, 0.0))
    tl.store(logit_sum_ptr + token, logit_sum)

    if WRITE_PROBS:
        for start in range(0, V, BLOCK_V):
            cols = start + offs
            in_row = cols < V
            x = tl.load(row_ptr + cols, mask=in_row, other=0.0, eviction_policy="evict_first")
            probs = tl.exp(x.to(tl.float32) - lse)
            tl.store(row_ptr + cols, probs.to(logits_ptr.dtype.element_ty), mask=in_row)


@triton.jit
def _expm1(x):
    # exp(x) - 1 for x <= 0 without losing a tiny x to rounding (Kahan's trick; tl has no expm1).
    u = tl.exp(x)
    ratio = (u - 1.0) * x / tl.log(tl.where((u == 1.0) | (u == 0.0), 0.5, u))
    return tl.where(u == 1.0, x, tl.where(u == 0.0, -1.0, ratio))


@triton.jit
def target_grads_kernel(
    logits_ptr,  # (C, V) chunk holding probabilities
    stride_row,
    target_ptr,  # (C,) int32 odds-ratio target id, -1 where ignored
    nll_target_ptr,  # (C,) int32 NLL target id, -1 where ignored
    token_ptr,  # (C,) int64 index of each row in the flattened (B*T) per-token arrays
    logp_ptr,  # (B*T,) fp32 log p(target) from row_stats_kernel
    nll_logp_ptr,  # (B*T,) fp32 log p(nll target)
    seq_coef_ptr,  # (B,) fp32 dL/dlogp of each odds-ratio token of the sequence
    row_scale_ptr,  # (C,) fp32 out: -s, the factor that turns Q into dL/dlogits
    nll_coef,  # dL/dlogp of each NLL token: -1 / (NLL tokens), 0 without the NLL term
    seq_len,
    C,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_chunk = rows < C
    target = tl.load(target_ptr + rows, mask=in_chunk, other=-1)
    nll_target = tl.load(nll_target_ptr + rows, mask=in_chunk, other=-1)
    token = tl.load(token_ptr + rows, mask=in_chunk, other=0)
    a = tl.where(target >= 0, tl.load(seq_coef_ptr + token // seq_len, mask=in_chunk, other=0.0), 0.0)
    b = tl.where(nll_target >= 0, nll_coef, 0.0)
    s = a + b  # a and b never have opposite signs, so s = 0 only where the row has no gradient
    inv_s = 1.0 / tl.where(s == 0.0, 1.0, s)
    ratio_a = a * inv_s  # the two ratios sum to 1 wherever s != 0
    ratio_b = b * inv_s
    # Q[y] = p_y - a/s (- b/s when both targets share the column), written as the other ratio plus
    # expm1(log p) = p - 1, so that nothing cancels when p ≈ 1 and the ratios ≈ 0 or 1.
    logp = tl.load(logp_ptr + token, mask=in_chunk, other=0.0)
    nll_logp = tl.load(nll_logp_ptr + token, mask=in_chunk, other=0.0)
    target_value = tl.where(nll_target == target, 0.0, ratio_b) + _expm1(logp)
    nll_value = ratio_a + _expm1(nll_logp)
    tl.store(row_scale_ptr + rows, -s, mask=in_chunk)
    row_ptr = logits_ptr + rows.to(tl.int64) * stride_row
    elem = logits_ptr.dtype.element_ty
    tl.store(row_ptr + target, target_value.to(elem), mask=in_chunk & (target >= 0))
    tl.store(row_ptr + nll_target, nll_value.to(elem), mask=in_chunk & (nll_target >= 0) & (nll_target != target))


@dataclass(frozen=True)
class RowLaunch:
    """Launch configuration of ``row_stats_kernel`` (one program per row)."""

    block_v: int  # vocabulary entries per loop step
    num_warps: int


# Chosen from the H200 sweeps in figures/data (notebooks/03-kernel-tuning.ipynb): statistics alone
# stream best with many small programs; with the probabilities, 32-warp programs that step 16K
# columns at a time measured best (likely because fewer rows are open at once, so more second
# reads hit L2; not measured directly).
STATS_LAUNCH = RowLaunch(block_v=2048, num_warps=4)
PROBS_LAUNCH = RowLaunch(block_v=16384, num_warps=32)


def row_stats(logits, target, nll_target, token, logp, nll_logp, logit_sum, *, write_probs: bool,
              launch: RowLaunch = None) -> None:
    """Launch ``row_stats_kernel`` over every row of ``logits`` (a (C, V) chunk, unit column stride)."""
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("logits chunk must have unit stride along the vocabulary")
    launch = launch or (PROBS_LAUNCH if write_probs else STATS_LAUNCH)
    row_stats_kernel[(rows,)](
        logits, logits.stride(0), target, nll_target, token, logp, nll_logp, logit_sum, vocab,
        BLOCK_V=min(triton.next_power_of_2(vocab), launch.block_v), WRITE_PROBS=write_probs,
        num_warps=launch.num_warps,
    )


def target_grads(logits, target, nll_target, token, logp, nll_logp, seq_coef, nll_coef: float, seq_len: int):
    """Launch ``target_grads_kernel``: each row's target columns of Q, and its scale -s (returned)."""
    rows = logits.shape[0]
    row_scale = torch.empty(rows, device=logits.device, dtype=torch.float32)
    block = 256
    target_grads_kernel[(triton.cdiv(rows, block),)](
        logits, logits.stride(0), target, nll_target, token, logp, nll_logp, seq_coef, row_scale, nll_coef,
        seq_len, rows, BLOCK=block, num_warps=4,
    )
    return row_scale
