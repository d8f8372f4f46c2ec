"""The odds-ratio part of ORPO: from per-sequence log-probs to the loss and its gradients.

Everything here works on (B/2,) vectors, so it is cheap. The materialising baseline uses it
through autograd; the chunked loss runs the same formulas in ``kernels.pair_terms.pair_terms_kernel``
(one launch instead of dozens of small ops), and the tests hold the two to each other, so that both
define the loss at the edges (certain sequences) the same way.
"""

import math

import torch

# Sequence log-probs are capped here before log(1 - p): a sequence the model is certain of
# (log-prob exactly 0 in float32) then has a large finite log-odds instead of +inf, and the
# gradients (which grow like 1/|log p| for the rejected side) stay inside float range.
LOGP_CAP = -1e-30


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, accurate on both sides of -ln 2 (Mächler 2012)."""
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def odds_ratio_terms(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, beta: float):
    """The odds-ratio loss of each pair and its derivatives with respect to both log-probs.

    Returns ``(pair_loss, log_odds, d_chosen, d_rejected)``, all (pairs,) float64 tensors, where
    ``pair_loss = -beta * logsigmoid(log_odds)`` and ``d_*`` are its derivatives (the loss is the
    mean over the batch's pairs: callers divide by the number of pairs). Computed in float64: the
    vectors are tiny. The derivatives are taken at the capped log-probs (see ``LOGP_CAP``), so a
    capped sequence still receives its gradient.
    """
    c = chosen_logps.double().clamp(max=LOGP_CAP)
    r = rejected_logps.double().clamp(max=LOGP_CAP)
    log_odds = (c - r) - (log1mexp(c) - log1mexp(r))
    pair_loss = -beta * torch.nn.functional.logsigmoid(log_odds)
    # d logsigmoid(lo) / d lo = sigmoid(-lo);  d lo / dc = 1 / (1 - e^c);  d lo / dr = -1 / (1 - e^r)
    slope = -beta * torch.sigmoid(-log_odds)
    d_chosen = slope / -torch.expm1(c)
    d_rejected = -slope / -torch.expm1(r)
    return pair_loss, log_odds, d_chosen, d_rejected


class OddsRatioLoss(torch.autograd.Function):
    """Mean odds-ratio loss over pairs as a differentiable op, for code that builds the loss with autograd."""

    @staticmethod
    def forward(ctx, chosen_logps, rejected_logps, beta):
        pair_loss, log_odds, d_chosen, d_rejected = odds_ratio_terms(chosen_logps, rejected_logps, beta)
        n_pairs = pair_loss.numel()
        ctx.save_for_backward(d_chosen / n_pairs, d_rejected / n_pairs)
        ctx.mark_non_differentiable(log_odds)
        return pair_loss.mean().to(chosen_logps.dtype), log_odds

    @staticmethod
    def backward(ctx, grad_loss, _grad_log_odds):
        d_chosen, d_rejected = ctx.saved_tensors
        scale = grad_loss.double()
        return (d_chosen * scale).to(grad_loss.dtype), (d_rejected * scale).to(grad_loss.dtype), None
