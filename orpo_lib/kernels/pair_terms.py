"""Pair terms: one program per pair, once every token of the pair has its log-prob: the two sequences'
mean token log-probs, the odds-ratio loss and log-odds in float64, and dL/dlogp of each of their
tokens (the same formulas as ``pairs.odds_ratio_terms``, which the materialising baseline uses).

Call terms: one program, once every pair has its terms: the loss and every metric of ``output.METRICS``
(the means over pairs and over tokens). One launch instead of some twenty small torch ops, each of which
costs the host 10-20 µs, which a small call's GPU waits for.
"""

from .. import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

import triton
import triton.language as tl

from ..output import METRICS
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


@triton.jit
def call_terms_kernel(
    pair_loss_ptr,  # (B/2,) fp64 from pair_terms_kernel
    log_odds_ptr,  # (B/2,) fp64
    seq_logp_ptr,  # (B,) fp32 (fp64 for float64 inputs, as every per-token input and output here)
    nll_logp_ptr,  # (B*T,) log p(nll target), 0 where ignored
    logit_sum_ptr,  # (B*T,) sum of each row's logits (0 for a dropped token)
    dropped_sums_ptr,  # (2,) the dropped tokens' logit sums, chosen half and rejected half (read if HAS_DROPPED)
    loss_ptr,  # () out
    metrics_ptr,  # (len(METRICS) + B,) out: METRICS, then the chosen rewards, then the rejected ones
    pairs,
    half_tokens,  # B/2 * T
    nll_tokens,  # NLL tokens of the chosen half (at least 1)
    logits_per_half,  # B/2 * T * V
    BETA: tl.constexpr,
    COMPUTE_NLL: tl.constexpr,
    HAS_DROPPED: tl.constexpr,
    N_METRICS: tl.constexpr,
    BLOCK_P: tl.constexpr,  # >= B/2
    BLOCK_T: tl.constexpr,
):
    acc = loss_ptr.dtype.element_ty
    p = tl.arange(0, BLOCK_P)
    in_p = p < pairs
    # per pair, in float64 as the pair terms were formed, rounded once at the end
    pair_loss = tl.load(pair_loss_ptr + p, mask=in_p, other=0.0)
    log_odds = tl.load(log_odds_ptr + p, mask=in_p, other=0.0)
    log_sigmoid = tl.minimum(log_odds, 0.0) - log1p(tl.exp(-tl.abs(log_odds)))
    or_loss = (tl.sum(pair_loss, axis=0) / pairs).to(acc)
    log_odds_ratio = (tl.sum(tl.where(in_p, log_sigmoid, 0.0), axis=0) / pairs).to(acc)
    log_odds_chosen = (tl.sum(log_odds, axis=0) / pairs).to(acc)
    beta = tl.full((), BETA, acc)
    chosen_rewards = beta * tl.load(seq_logp_ptr + p, mask=in_p, other=0.0)
    rejected_rewards = beta * tl.load(seq_logp_ptr + pairs + p, mask=in_p, other=0.0)
    accuracy = tl.sum((in_p & (chosen_rewards > rejected_rewards)).to(acc), axis=0) / pairs
    margin = tl.sum(chosen_rewards - rejected_rewards, axis=0) / pairs
    # per token, over each half
    offs = tl.arange(0, BLOCK_T)
    nll_sums = tl.zeros([BLOCK_T], dtype=acc)
    chosen_sums = tl.zeros([BLOCK_T], dtype=acc)
    rejected_sums = tl.zeros([BLOCK_T], dtype=acc)
    for start in range(0, half_tokens, BLOCK_T):
        t = start + offs
        in_half = t < half_tokens
        nll_sums += tl.load(nll_logp_ptr + t, mask=in_half, other=0.0)  # (the rejected half has no NLL tokens)
        chosen_sums += tl.load(logit_sum_ptr + t, mask=in_half, other=0.0)
        rejected_sums += tl.load(logit_sum_ptr + half_tokens + t, mask=in_half, other=0.0)
    chosen_logits = tl.sum(chosen_sums, axis=0)
    rejected_logits = tl.sum(rejected_sums, axis=0)
    if HAS_DROPPED:
        chosen_logits += tl.load(dropped_sums_ptr)
        rejected_logits += tl.load(dropped_sums_ptr + 1)
    nll_loss = -tl.sum(nll_sums, axis=0) / nll_tokens
    if not COMPUTE_NLL:
        nll_loss = tl.zeros((), dtype=acc)
    tl.store(loss_ptr, nll_loss + or_loss)
    values = (nll_loss, or_loss, log_odds_ratio, log_odds_chosen, accuracy, margin, chosen_logits / logits_per_half,
              rejected_logits / logits_per_half)
    for i in tl.static_range(N_METRICS):
        tl.store(metrics_ptr + i, values[i])
    tl.store(metrics_ptr + N_METRICS + p, chosen_rewards, mask=in_p)
    tl.store(metrics_ptr + N_METRICS + pairs + p, rejected_rewards, mask=in_p)


def call_terms(pair_loss, log_odds, seq_logp, nll_logp, logit_sum, dropped_sums, *, nll_tokens: int, vocab: int,
               beta: float, compute_nll: bool):
    """Launch ``call_terms_kernel``: the loss (0-d) and the metrics vector (``output.METRICS``, then the B/2
    chosen and B/2 rejected rewards), in seq_logp's dtype. ``dropped_sums``: (2,) or None (no token dropped)."""
    batch, tokens = seq_logp.shape[0], nll_logp.shape[0]
    loss = seq_logp.new_empty(())
    metrics = seq_logp.new_empty(len(METRICS) + batch)
    call_terms_kernel[(1,)](
        pair_loss, log_odds, seq_logp, nll_logp, logit_sum, logit_sum if dropped_sums is None else dropped_sums,
        loss, metrics, batch // 2, tokens // 2, max(nll_tokens, 1), tokens // 2 * vocab,
        BETA=beta, COMPUTE_NLL=compute_nll, HAS_DROPPED=dropped_sums is not None, N_METRICS=len(METRICS),
        BLOCK_P=triton.next_power_of_2(batch // 2), BLOCK_T=min(triton.next_power_of_2(tokens // 2), 1024),
        num_warps=4,
    )
    return loss, metrics
