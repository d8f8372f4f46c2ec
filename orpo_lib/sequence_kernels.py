"""Triton kernels for the per-sequence work around the chunks: one launch each instead of dozens of
small torch ops, which at small shapes cost more than the row kernel.

* ``label_stats_kernel`` — one program per sequence: checks the label ids, counts the tokens each
  target uses and writes the int32 ids the row kernels read (-1 where a token does not count).
* ``pair_terms_kernel`` — one program per pair: the two sequences' mean token log-probs, the
  odds-ratio loss and log-odds, and dL/dlogp of each of their tokens (the same float64 formulas as
  ``pairs.odds_ratio_terms``, which the materialising baseline uses).
"""

from . import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

import torch
import triton
import triton.language as tl

from .kernels import _expm1, _log1p
from .pairs import LOGP_CAP

# label_stats_kernel's per-sequence outputs, in column order
LABEL_STATS = ("target_tokens", "kept_tokens", "nll_tokens", "bad_target_ids", "bad_nll_ids")


@triton.jit
def label_stats_kernel(
    target_ptr,  # (B, T) integer labels of the odds-ratio target
    nll_target_ptr,  # (B, T) integer labels of the NLL term (may be target_ptr itself)
    stride_tb, stride_tt, stride_nb, stride_nt,
    target_ids_ptr,  # (B, T) int32 out: the label, or -1 where the token does not count
    nll_ids_ptr,  # (B, T) int32 out: the same for the NLL term (chosen half only)
    stats_ptr,  # (B, 5) int32 out: the LABEL_STATS of each sequence
    T,
    V,
    ignore_index,
    pairs,  # B / 2: sequences below it are chosen responses
    COMPUTE_NLL: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    seq = tl.program_id(0)
    offs = tl.arange(0, BLOCK_T)
    n_target = tl.zeros([BLOCK_T], dtype=tl.int32)
    n_kept = tl.zeros([BLOCK_T], dtype=tl.int32)
    n_nll = tl.zeros([BLOCK_T], dtype=tl.int32)
    bad_target = tl.zeros([BLOCK_T], dtype=tl.int32)
    bad_nll = tl.zeros([BLOCK_T], dtype=tl.int32)
    for start in range(0, T, BLOCK_T):
        t = start + offs
        in_seq = t < T
        target = tl.load(target_ptr + seq * stride_tb + t * stride_tt, mask=in_seq).to(tl.int64)
        nll_target = tl.load(nll_target_ptr + seq * stride_nb + t * stride_nt, mask=in_seq).to(tl.int64)
        target_counts = in_seq & (target != ignore_index)
        nll_counts = in_seq & (nll_target != ignore_index) & (seq < pairs) & COMPUTE_NLL
        tl.store(target_ids_ptr + seq * T + t, tl.where(target_counts, target, -1).to(tl.int32), mask=in_seq)
        tl.store(nll_ids_ptr + seq * T + t, tl.where(nll_counts, nll_target, -1).to(tl.int32), mask=in_seq)
        n_target += target_counts.to(tl.int32)
        n_kept += (target_counts | nll_counts).to(tl.int32)
        n_nll += nll_counts.to(tl.int32)
        bad_target += (target_counts & ((target < 0) | (target >= V))).to(tl.int32)
        bad_nll += (nll_counts & ((nll_target < 0) | (nll_target >= V))).to(tl.int32)
    tl.store(stats_ptr + seq * 5 + 0, tl.sum(n_target, axis=0))
    tl.store(stats_ptr + seq * 5 + 1, tl.sum(n_kept, axis=0))
    tl.store(stats_ptr + seq * 5 + 2, tl.sum(n_nll, axis=0))
    tl.store(stats_ptr + seq * 5 + 3, tl.sum(bad_target, axis=0))
    tl.store(stats_ptr + seq * 5 + 4, tl.sum(bad_nll, axis=0))


def label_stats(target, nll_target, vocab: int, ignore_index: int, compute_nll: bool):
    """Launch ``label_stats_kernel``: int32 ids (-1 where a token does not count) and (B, 5) LABEL_STATS."""
    batch, seq = target.shape
    nll_target = target if nll_target is None else nll_target
    target_ids, nll_ids = torch.empty(2, batch, seq, device=target.device, dtype=torch.int32)  # one allocation
    stats = torch.empty(batch, len(LABEL_STATS), device=target.device, dtype=torch.int32)
    label_stats_kernel[(batch,)](
        target, nll_target, target.stride(0), target.stride(1), nll_target.stride(0), nll_target.stride(1),
        target_ids, nll_ids, stats, seq, vocab, ignore_index, batch // 2,
        COMPUTE_NLL=compute_nll, BLOCK_T=min(triton.next_power_of_2(seq), 1024), num_warps=4,
    )
    return target_ids, nll_ids, stats


@triton.jit
def _log1mexp(x):
    # log(1 - exp(x)) for x < 0, accurate on both sides of -ln 2 (Mächler 2012); each branch gets
    # an argument clamped to its own side, so the one not taken never evaluates log(0)
    ln_half = -0.6931471805599453
    return tl.where(x > ln_half, tl.log(-_expm1(tl.maximum(x, ln_half))), _log1p(-tl.exp(tl.minimum(x, ln_half))))


@triton.jit
def pair_terms_kernel(
    logp_ptr,  # (B*T,) fp32 log p(target) of every token, 0 where ignored
    tokens_per_seq_ptr,  # (B,) fp32 odds-ratio tokens of each sequence
    seq_logp_ptr,  # (B,) fp32 out: mean token log-prob of each sequence (this and the logps fp64 for float64 inputs)
    seq_coef_ptr,  # (B,) fp32 out: dL/dlogp of each odds-ratio token of the sequence
    log_odds_ptr,  # (B/2,) fp64 out
    pair_loss_ptr,  # (B/2,) fp64 out: -beta * logsigmoid(log_odds)
    first_pair,
    pairs,  # B / 2
    T,
    BETA: tl.constexpr,  # a compile-time constant: a float argument would arrive as float32
    LOGP_CAP: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    pair = first_pair + tl.program_id(0)
    rejected = pair + pairs
    offs = tl.arange(0, BLOCK_T)
    acc = seq_logp_ptr.dtype.element_ty  # float32, or float64 for float64 inputs
    chosen_sums = tl.zeros([BLOCK_T], dtype=acc)
    rejected_sums = tl.zeros([BLOCK_T], dtype=acc)
    for start in range(0, T, BLOCK_T):
        t = start + offs
        chosen_sums += tl.load(logp_ptr + pair * T + t, mask=t < T, other=0.0)
        rejected_sums += tl.load(logp_ptr + rejected * T + t, mask=t < T, other=0.0)
    chosen_tokens = tl.load(tokens_per_seq_ptr + pair)
    rejected_tokens = tl.load(tokens_per_seq_ptr + rejected)
    chosen_logp = tl.sum(chosen_sums, axis=0) / chosen_tokens
    rejected_logp = tl.sum(rejected_sums, axis=0) / rejected_tokens
    tl.store(seq_logp_ptr + pair, chosen_logp)
    tl.store(seq_logp_ptr + rejected, rejected_logp)

    # The odds ratio in float64, at log-probs capped just below 0 (see pairs.LOGP_CAP).
    cap = tl.full((), LOGP_CAP, tl.float64)  # tl.full keeps the constants' float64 values exactly
    beta = tl.full((), BETA, tl.float64)
    c = tl.minimum(chosen_logp.to(tl.float64), cap)
    r = tl.minimum(rejected_logp.to(tl.float64), cap)
    log_odds = (c - r) - (_log1mexp(c) - _log1mexp(r))
    # logsigmoid(z) = min(z, 0) - log1p(e^-|z|);  sigmoid(-z) = e^-|z| / (1 + e^-|z|) for z >= 0, 1 / (1 + e^-|z|) else
    e = tl.exp(-tl.abs(log_odds))
    pair_loss = -beta * (tl.minimum(log_odds, 0.0) - _log1p(e))
    slope = -beta * tl.where(log_odds >= 0, e, 1.0) / (1.0 + e)
    # d log_odds / dc = 1 / (1 - e^c),  d log_odds / dr = -1 / (1 - e^r); the loss is the mean over pairs
    chosen_coef = (slope / -_expm1(c) / pairs).to(acc) / chosen_tokens
    rejected_coef = (-slope / -_expm1(r) / pairs).to(acc) / rejected_tokens
    tl.store(seq_coef_ptr + pair, chosen_coef)
    tl.store(seq_coef_ptr + rejected, rejected_coef)
    tl.store(log_odds_ptr + pair, log_odds)
    tl.store(pair_loss_ptr + pair, pair_loss)


def pair_terms(logp, tokens_per_seq, seq_logp, seq_coef, log_odds, pair_loss, *, first_pair: int, end_pair: int,
               seq_len: int, beta: float) -> None:
    """Launch ``pair_terms_kernel`` for pairs [first_pair, end_pair), writing their entries of the outputs."""
    pairs = tokens_per_seq.shape[0] // 2
    pair_terms_kernel[(end_pair - first_pair,)](
        logp, tokens_per_seq, seq_logp, seq_coef, log_odds, pair_loss, first_pair, pairs, seq_len,
        BETA=beta, LOGP_CAP=LOGP_CAP, BLOCK_T=min(triton.next_power_of_2(seq_len), 1024), num_warps=4,
    )
