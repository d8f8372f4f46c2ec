"""The materialising baseline: ORPO the way TRL's ORPOTrainer computes it, with full float32 logits."""

import torch

from .logit_transform import logit_transform
from .output import ORPOOutput, orpo_output
from .pairs import OddsRatioLoss
from .validation import check_arguments, check_options, count_tokens


def orpo_loss_baseline(hidden, weight, target, bias=None, *, beta=0.1, ignore_index=-100, nll_target=None,
                       compute_nll_loss=True, logit_scale=1.0, logit_softcap=None) -> ORPOOutput:
    """ORPO loss through the full (B, T, V) logits, upcast to float32 (float64 stays) before log_softmax.

    Same arguments and semantics as ``fused_linear_orpo_loss``; memory grows with B·T·V.
    """
    check_arguments(hidden, weight, target, bias, nll_target)
    check_options(beta=beta, ignore_index=ignore_index, compute_nll_loss=compute_nll_loss)
    transform = logit_transform(logit_scale, logit_softcap)
    counts = count_tokens(target, nll_target, weight.shape[0], ignore_index, compute_nll_loss)
    pairs = hidden.shape[0] // 2
    logits = torch.nn.functional.linear(hidden, weight, bias)
    logits = transform(logits.to(torch.promote_types(logits.dtype, torch.float32)))  # float32, float64 stays
    log_probs = logits.log_softmax(-1)

    def token_logps(labels, valid):
        picked = log_probs.gather(-1, torch.where(valid, labels, 0).long().unsqueeze(-1)).squeeze(-1)
        return torch.where(valid, picked, 0.0)

    seq_logps = token_logps(target, counts.target_valid).sum(1) / counts.tokens_per_seq.to(logits.dtype)
    or_loss, log_odds = OddsRatioLoss.apply(seq_logps[:pairs], seq_logps[pairs:], float(beta))
    if compute_nll_loss:
        nll_labels = target if nll_target is None else nll_target
        nll_loss = -token_logps(nll_labels, counts.nll_valid).sum() / counts.nll_tokens
    else:
        nll_loss = torch.zeros((), device=hidden.device, dtype=logits.dtype)
    with torch.no_grad():
        logits_means = logits.view(2, -1).mean(1)
    return orpo_output(nll_loss + or_loss, nll_loss, or_loss, seq_logps[:pairs], seq_logps[pairs:], log_odds,
                       beta=beta, chosen_logits_mean=logits_means[0], rejected_logits_mean=logits_means[1])
