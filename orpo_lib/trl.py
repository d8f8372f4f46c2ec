"""``FusedORPOTrainer``: TRL's ``ORPOTrainer`` with the fused loss (needs the ``trl`` extra: ``pip install -e .[trl]``).

Same loss, gradients and logged metrics as ``trl.experimental.orpo.ORPOTrainer``, without the (B, T, V)
logits; the batch convention is TRL's (see ``orpo_lib.causal_lm``).
"""

from trl.experimental.orpo import ORPOTrainer

from .causal_lm import check_head, fused_orpo_loss_for_batch, trl_metrics


class FusedORPOTrainer(ORPOTrainer):
    """``ORPOTrainer`` whose loss is ``fused_orpo_loss_for_batch``: the same loss, gradients and logged metrics,
    without the (B, T, V) logits. Decoder-only models, one process.

    When it is built it checks, with one forward of the model on a 16-token probe (``causal_lm.check_head``),
    that the fused loss computes the model's own logits (a scaled or soft-capped head included), and refuses
    what it cannot train before any step: another head, several processes, a router's auxiliary loss."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.accelerator.num_processes > 1:
            # Outside its DistributedDataParallel wrapper the decoder's gradients are never all-reduced: the
            # replicas would drift apart silently.
            raise NotImplementedError(
                f"FusedORPOTrainer runs in one process, not {self.accelerator.num_processes}: it calls the decoder "
                "outside the model's distributed wrapper, so gradients would not be synchronised. For data parallel "
                "training, wrap a module whose forward returns fused_linear_orpo_loss(...).loss in "
                "DistributedDataParallel (tests/distributed/test_data_parallel.py)")
        if self.aux_loss_enabled:
            raise NotImplementedError("fused ORPO does not add a router auxiliary loss (output_router_logits)")
        self.logit_options = check_head(self.accelerator.unwrap_model(self.model))

    def get_batch_loss_metrics(self, model, batch, train_eval="train"):
        concatenated = self.concatenated_inputs(batch, is_encoder_decoder=self.is_encoder_decoder,
                                                padding_value=self.padding_value, device=self.accelerator.device)
        out = fused_orpo_loss_for_batch(self.accelerator.unwrap_model(model), concatenated["concatenated_input_ids"],
                                        concatenated["concatenated_attention_mask"],
                                        concatenated["concatenated_labels"], beta=self.beta,
                                        options=self.logit_options)
        prefix = "eval_" if train_eval == "eval" else ""
        metrics = {f"{prefix}{name}": self.accelerator.gather_for_metrics(value.detach()).mean().item()
                   for name, value in trl_metrics(out).items()}
        return out.loss, metrics
