"""The result of an ORPO loss call: the differentiable loss and the metrics TRL logs."""

from dataclasses import dataclass, fields

import torch


@dataclass
class ORPOOutput:
    loss: torch.Tensor  # scalar, differentiable: nll_loss + or_loss (or or_loss alone); float32 (float64 inputs: float64)
    nll_loss: torch.Tensor  # token-mean NLL over the chosen half (0 when not computed)
    or_loss: torch.Tensor  # -beta * mean(logsigmoid(log_odds))
    chosen_logps: torch.Tensor  # (B/2,) length-averaged log-prob of each chosen sequence
    rejected_logps: torch.Tensor  # (B/2,)
    log_odds_ratio: torch.Tensor  # mean(logsigmoid(log_odds))
    log_odds_chosen: torch.Tensor  # mean(log_odds)
    chosen_rewards: torch.Tensor  # (B/2,) beta * chosen_logps
    rejected_rewards: torch.Tensor  # (B/2,) beta * rejected_logps
    reward_accuracy: torch.Tensor  # mean(chosen_rewards > rejected_rewards)
    reward_margin: torch.Tensor  # mean(chosen_rewards - rejected_rewards)
    chosen_logits_mean: torch.Tensor  # mean of every logit of the chosen rows, ignored positions included
    rejected_logits_mean: torch.Tensor

    def metrics(self) -> dict:
        """Every field but the loss, as Python numbers (vectors as lists)."""
        out = {}
        for f in fields(self):
            if f.name != "loss":
                value = getattr(self, f.name).detach().cpu()
                out[f.name] = value.item() if value.dim() == 0 else value.tolist()
        return out


# The scalar metrics in the order of the fused loss's metrics vector (kernels.call_terms), which holds the chosen
# rewards and then the rejected ones after them.
METRICS = ("nll_loss", "or_loss", "log_odds_ratio", "log_odds_chosen", "reward_accuracy", "reward_margin",
           "chosen_logits_mean", "rejected_logits_mean")


def output_from_metrics(loss, metrics, seq_logp) -> ORPOOutput:
    """The output of the fused loss: ``metrics`` (METRICS, then the rewards) and ``seq_logp`` (the chosen
    sequences', then the rejected ones') already formed on the device, as views of those two tensors."""
    pairs, scalars = seq_logp.shape[0] // 2, len(METRICS)
    return ORPOOutput(loss=loss, chosen_logps=seq_logp[:pairs], rejected_logps=seq_logp[pairs:],
                      chosen_rewards=metrics[scalars:scalars + pairs], rejected_rewards=metrics[scalars + pairs:],
                      **dict(zip(METRICS, metrics[:scalars].unbind())))


def orpo_output(loss, nll_loss, or_loss, chosen_logps, rejected_logps, log_odds, *, beta,
                chosen_logits_mean, rejected_logits_mean) -> ORPOOutput:
    """Assemble the output from the per-pair quantities; metrics are detached, in the loss's dtype."""
    dtype = loss.dtype
    c = chosen_logps.detach().to(dtype)
    r = rejected_logps.detach().to(dtype)
    log_odds = log_odds.detach()
    chosen_rewards, rejected_rewards = beta * c, beta * r
    return ORPOOutput(
        loss=loss,
        nll_loss=nll_loss.detach().to(dtype),
        or_loss=or_loss.detach().to(dtype),
        chosen_logps=c,
        rejected_logps=r,
        log_odds_ratio=torch.nn.functional.logsigmoid(log_odds).mean().to(dtype),
        log_odds_chosen=log_odds.mean().to(dtype),
        chosen_rewards=chosen_rewards,
        rejected_rewards=rejected_rewards,
        reward_accuracy=(chosen_rewards > rejected_rewards).to(dtype).mean(),
        reward_margin=(chosen_rewards - rejected_rewards).mean(),
        chosen_logits_mean=chosen_logits_mean.detach().to(dtype),
        rejected_logits_mean=rejected_logits_mean.detach().to(dtype),
    )
