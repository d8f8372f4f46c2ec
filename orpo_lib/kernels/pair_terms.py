"""Pair terms: one program per pair, once every token of the pair has its log-prob: the two sequences'
mean token log-probs, the odds-ratio loss and log-odds in float64, and dL/dlogp of each of their
tokens (the same formulas as ``pairs.odds_ratio_terms``, which the materialising baseline uses).
"""

from .. import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

import triton
import triton.language as tl

from ..pairs import LOGP_CAP
from .numerics import expm1, log1mexp, log1p


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
    log_odds = (c - r) - (log1mexp(c) - log1mexp(r))
    # logsigmoid(z) = min(z, 0) - log1p(e^-|z|);  sigmoid(-z) = e^-|z| / (1 + e^-|z|) for z >= 0, 1 / (1 + e^-|z|) else
    e = tl.exp(-tl.abs(log_odds))
    pair_loss = -beta * (tl.minimum(log_odds, 0.0) - log1p(e))
    slope = -beta * tl.where(log_odds >= 0, e, 1.0) / (1.0 + e)
    # d log_odds / dc = 1 / (1 - e^c),  d log_odds / dr = -1 / (1 - e^r); the loss is the mean over pairs
    chosen_coef = (slope / -expm1(c) / pairs).to(acc) / chosen_tokens
    rejected_coef = (-slope / -expm1(r) / pairs).to(acc) / rejected_tokens
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
