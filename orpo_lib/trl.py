"""TRL's ORPO, fused: the same loss and logged metrics as ``trl.experimental.orpo.ORPOTrainer``, no logits.

Needs the ``trl`` extra (``pip install -e .[trl]``). TRL's batch convention, for a causal LM on a
concatenated batch (chosen rows, then rejected rows, each of T positions):

* the odds ratio sees the response: ``labels`` (-100 on the prompt and the padding), shifted;
* the NLL sees prompt and response: ``input_ids`` where ``attention_mask`` is 1, shifted;
* position t predicts token t + 1, so the loss takes ``hidden[:, :-1]`` against ``labels[:, 1:]``.

``orpo_targets`` builds the two label tensors, ``fused_orpo_loss_for_batch`` runs the model's decoder
and the fused loss on its LM head, ``trl_metrics`` names the metrics as TRL logs them, and
``FusedORPOTrainer`` is ORPOTrainer with its loss computed this way.
"""

import torch
from trl.experimental.orpo import ORPOTrainer

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


class FusedORPOTrainer(ORPOTrainer):
    """``ORPOTrainer`` whose loss is ``fused_orpo_loss_for_batch``: the same loss, gradients and logged metrics,
    without the (B, T, V) logits. Decoder-only models, one process (the decoder is called directly, outside
    any distributed wrapper of the model)."""

    def get_batch_loss_metrics(self, model, batch, train_eval="train"):
        if self.aux_loss_enabled:
            raise NotImplementedError("fused ORPO does not add a router auxiliary loss (output_router_logits)")
        concatenated = self.concatenated_inputs(batch, is_encoder_decoder=self.is_encoder_decoder,
                                                padding_value=self.padding_value, device=self.accelerator.device)
        out = fused_orpo_loss_for_batch(self.accelerator.unwrap_model(model), concatenated["concatenated_input_ids"],
                                        concatenated["concatenated_attention_mask"],
                                        concatenated["concatenated_labels"], beta=self.beta)
        prefix = "eval_" if train_eval == "eval" else ""
        metrics = {f"{prefix}{name}": self.accelerator.gather_for_metrics(value.detach()).mean().item()
                   for name, value in trl_metrics(out).items()}
        return out.loss, metrics
