"""``FusedORPOTrainer``: TRL's ``ORPOTrainer`` with the fused loss (needs the ``trl`` extra: ``pip install -e .[trl]``).

Same loss, gradients and logged metrics as ``trl.experimental.orpo.ORPOTrainer``, without the (B, T, V)
logits; the batch convention is TRL's (see ``orpo_lib.causal_lm``).
"""

from accelerate.utils import DistributedType
from trl.experimental.orpo import ORPOTrainer

from .causal_lm import causal_lm_inside, check_head, fused_orpo_loss_for_batch, install_fused_forward, trl_metrics


class FusedORPOTrainer(ORPOTrainer):
    """``ORPOTrainer`` whose loss is ``fused_orpo_loss_for_batch``: the same loss, gradients and logged metrics,
    without the (B, T, V) logits. Decoder-only models; one process, DDP, FSDP2 or DeepSpeed ZeRO (stages 2 and 3
    tested), with or without a PEFT adapter.

    The loss is computed inside the model's forward (``causal_lm.install_fused_forward``), called through the
    trainer's wrapped model, so the distributed wrappers gather parameters and reduce gradients as they do for
    the stock loss. When the trainer is built it checks, with one forward of the model on a 16-token probe
    (``causal_lm.check_head``), that the fused loss computes the model's own logits (a scaled or soft-capped head
    included), and refuses what it cannot train before any step: another head, a layout other than those above,
    a router's auxiliary loss."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        check_layout(self.accelerator)
        if self.aux_loss_enabled:
            raise NotImplementedError("fused ORPO does not add a router auxiliary loss (output_router_logits)")
        causal = causal_lm_inside(self.model)
        self.logit_options = check_head(causal)
        install_fused_forward(causal)

    def get_batch_loss_metrics(self, model, batch, train_eval="train"):
        concatenated = self.concatenated_inputs(batch, is_encoder_decoder=self.is_encoder_decoder,
                                                padding_value=self.padding_value, device=self.accelerator.device)
        out = fused_orpo_loss_for_batch(model, concatenated["concatenated_input_ids"],
                                        concatenated["concatenated_attention_mask"],
                                        concatenated["concatenated_labels"], beta=self.beta,
                                        options=self.logit_options)
        prefix = "eval_" if train_eval == "eval" else ""
        metrics = {f"{prefix}{name}": self.accelerator.gather_for_metrics(value.detach()).mean().item()
                   for name, value in trl_metrics(out).items()}
        return out.loss, metrics


# The layouts whose training equals stock ORPOTrainer's in tests/distributed/test_trainer_layouts.py.
LAYOUTS = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.FSDP,
           DistributedType.DEEPSPEED)


def check_layout(accelerator) -> None:
    """Refuse, before any step, a process layout whose training with the fused loss has not been checked."""
    state = accelerator.state
    if state.distributed_type not in LAYOUTS:
        raise NotImplementedError(f"FusedORPOTrainer trains in one process, with DDP, FSDP2 or DeepSpeed ZeRO, "
                                  f"not under {state.distributed_type.value}")
    if state.distributed_type == DistributedType.FSDP and state.fsdp_plugin.fsdp_version != 2:
        raise NotImplementedError("FusedORPOTrainer supports FSDP2 (fsdp_config={'fsdp_version': 2}), not FSDP1")
    parallelism = getattr(state, "parallelism_config", None)
    if parallelism is not None and any(getattr(parallelism, f"{dim}_enabled", False) for dim in ("tp", "cp", "sp")):
        # (tensor parallelism shards the head's vocabulary, context parallelism the sequence: the loss needs both)
        raise NotImplementedError(f"FusedORPOTrainer shards data and parameters only, not {parallelism}")
