"""A float64 reference of the ORPO loss, written straight from the definition and differentiated by autograd.

Independent of the kernels and of ``pairs.py``: it is what the tests and the derivation notebook
compare against. Slow and memory-hungry by design.
"""

import math

import torch


def orpo_loss_reference(hidden, weight, target, bias=None, *, beta=0.1, ignore_index=-100, nll_target=None,
                        compute_nll_loss=True, logit_scale=1.0, logit_softcap=None) -> dict:
    """Loss and metrics in float64. Differentiable with respect to the float64 tensors it is given.
    The logits are ``cap·tanh(scale·z / cap)`` of z = hidden @ weight.T + bias (``scale·z`` without a cap).

    Pass float64 leaf tensors to get float64 gradients (``hidden.double().requires_grad_()``).
    """
    hidden, weight = hidden.double(), weight.double()
    bias = None if bias is None else bias.double()
    pairs = hidden.shape[0] // 2
    logits = logit_scale * (hidden @ weight.T + (0.0 if bias is None else bias))
    if logit_softcap is not None:
        logits = logit_softcap * torch.tanh(logits / logit_softcap)
    log_probs = torch.log_softmax(logits, dim=-1)

    def token_logps(labels):
        valid = labels != ignore_index
        safe = torch.where(valid, labels, 0).long()
        return torch.where(valid, log_probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1), 0.0), valid

    logps, valid = token_logps(target)
    seq_logps = logps.sum(1) / valid.sum(1)
    chosen, rejected = seq_logps[:pairs], seq_logps[pairs:]

    # log(1 - e^x) for x < 0: pairs.log1mexp written again, because this is what the tests hold the baseline
    # (which uses pairs.py) and the kernels to
    def log1mexp(x):
        return torch.where(x > -math.log(2), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))

    log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
    log_sigmoid = torch.nn.functional.logsigmoid(log_odds)
    or_loss = -beta * log_sigmoid.mean()
    if compute_nll_loss:
        nll_logps, nll_valid = token_logps(target if nll_target is None else nll_target)
        nll_loss = -nll_logps[:pairs].sum() / nll_valid[:pairs].sum()
    else:
        nll_loss = torch.zeros((), dtype=torch.float64)
    chosen_rewards, rejected_rewards = beta * chosen.detach(), beta * rejected.detach()
    return {
        "loss": nll_loss + or_loss,
        "nll_loss": nll_loss.detach(),
        "or_loss": or_loss.detach(),
        "chosen_logps": chosen.detach(),
        "rejected_logps": rejected.detach(),
        "log_odds_ratio": log_sigmoid.detach().mean(),
        "log_odds_chosen": log_odds.detach().mean(),
        "chosen_rewards": chosen_rewards,
        "rejected_rewards": rejected_rewards,
        "reward_accuracy": (chosen_rewards > rejected_rewards).double().mean(),
        "reward_margin": (chosen_rewards - rejected_rewards).mean(),
        "chosen_logits_mean": logits[:pairs].detach().mean(),
        "rejected_logits_mean": logits[pairs:].detach().mean(),
    }
