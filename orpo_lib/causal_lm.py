"""The fused ORPO loss of a Hugging Face causal LM on a TRL-style batch, with TRL's semantics and metric names.

TRL's batch convention (``ORPOTrainer``), for a causal LM on a concatenated batch (chosen rows, then
rejected rows, each of T positions):

* the odds ratio sees the response: ``labels`` (-100 on the prompt and the padding), shifted;
* the NLL sees prompt and response: ``input_ids`` where ``attention_mask`` is 1, shifted;
* position t predicts token t + 1, so the loss takes ``hidden[:, :-1]`` against ``labels[:, 1:]``.

``orpo_targets`` builds the two label tensors, ``fused_orpo_loss_for_batch`` runs the model's decoder
and the fused loss on its LM head, and ``trl_metrics`` names the metrics as TRL logs them. Nothing here
needs TRL itself; ``orpo_lib.trl.FusedORPOTrainer`` (the ``trl`` extra) is ORPOTrainer on top of it.
"""

import torch

from .fused import fused_linear_orpo_loss
from .output import ORPOOutput

IGNORE_INDEX = -100  # TRL's label padding


def orpo_targets(input_ids, attention_mask, labels):
    """(target, nll_target) for ``hidden[:, :-1]``: the response labels, and the prompt + response tokens."""
    nll_target = torch.where(attention_mask[:, 1:] == 1, input_ids[:, 1:], IGNORE_INDEX)
    return labels[:, 1:], nll_target


def _check_supported(model) -> None:
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise NotImplementedError("fused ORPO supports decoder-only models; this model is an encoder-decoder")
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(config, name, None) not in (None, 1.0):
            raise NotImplementedError(f"the model's config sets {name}={getattr(config, name)}: its logits are not "
                                      "hidden @ lm_head.weight.T, which is what the fused loss computes")


def fused_orpo_loss_for_batch(model, input_ids, attention_mask, labels, *, beta: float,
                              chunk_size=None) -> ORPOOutput:
    """TRL's ORPO loss of a causal LM on a concatenated batch, through the decoder and the fused LM-head loss.

    ``model`` is a Hugging Face causal LM (``get_decoder()`` gives the transformer, whose last hidden state
    is what the LM head reads; ``get_output_embeddings()`` the head).
    """
    _check_supported(model)
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    target, nll_target = orpo_targets(input_ids, attention_mask, labels)
    return fused_linear_orpo_loss(hidden[:, :-1], head.weight, target, head.bias, beta=beta,
                                  ignore_index=IGNORE_INDEX, nll_target=nll_target, chunk_size=chunk_size)


def trl_metrics(out: ORPOOutput) -> dict:
    """The 11 metrics ORPOTrainer logs, by TRL's names, before TRL's gather-and-mean across processes."""
    return {
        "rewards/chosen": out.chosen_rewards,
        "rewards/rejected": out.rejected_rewards,
        "rewards/accuracies": (out.chosen_rewards > out.rejected_rewards).float(),
        "rewards/margins": out.chosen_rewards - out.rejected_rewards,
        "logps/rejected": out.rejected_logps,
        "logps/chosen": out.chosen_logps,
        "logits/rejected": out.rejected_logits_mean,
        "logits/chosen": out.chosen_logits_mean,
        "nll_loss": out.nll_loss,
        "log_odds_ratio": out.log_odds_ratio,
        "log_odds_chosen": out.log_odds_chosen,
    }
