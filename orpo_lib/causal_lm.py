"""The fused ORPO loss of a Hugging Face causal LM on a TRL-style batch, with TRL's semantics and metric names.

TRL's batch convention (``ORPOTrainer``), for a causal LM on a concatenated batch (chosen rows, then
rejected rows, each of T positions):

* the odds ratio sees the response: ``labels`` (-100 on the prompt and the padding), shifted;
* the NLL sees prompt and response: ``input_ids`` where ``attention_mask`` is 1, shifted;
* position t predicts token t + 1, so the loss takes ``hidden[:, :-1]`` against ``labels[:, 1:]``.

``orpo_targets`` builds the two label tensors, ``logit_options`` reads how the model turns its head's output
into logits from its config, ``check_head`` runs the model once to confirm that the fused loss computes the
model's own logits, ``fused_orpo_loss_for_batch`` runs the model's decoder and the fused loss on its LM head
through the model's own call (``install_fused_forward``), inside whatever distributed wrapper holds it, and
``trl_metrics`` names the metrics as TRL logs them. Nothing here needs TRL itself;
``orpo_lib.trl.FusedORPOTrainer`` (the ``trl`` extra) is ORPOTrainer on top of it.
"""

import contextlib
import dataclasses
import types

import torch

from .fused import fused_linear_orpo_loss
from .logit_transform import logit_transform
from .output import ORPOOutput

IGNORE_INDEX = -100  # TRL's label padding


def orpo_targets(input_ids, attention_mask, labels):
    """(target, nll_target) for ``hidden[:, :-1]``: the response labels, and the prompt + response tokens."""
    nll_target = torch.where(attention_mask[:, 1:] == 1, input_ids[:, 1:], IGNORE_INDEX)
    return labels[:, 1:], nll_target


# Config attributes that change a causal LM's logits after its head, as transformers 5.24's modeling files use
# them (the model's text config holds them in multimodal models). Each maps a value to logit_scale or
# logit_softcap; None means the model leaves its logits alone.
LOGIT_SCALES = {
    "logit_scale": lambda v, model_type: v,  # Cohere, Cohere2, Cohere2-MoE: logits * logit_scale
    # Granite (all its variants) and MiniCPM3 divide by logits_scaling (MiniCPM3 its hidden states: no bias, the
    # same); HyperCLOVAX multiplies by it
    "logits_scaling": lambda v, model_type: v if model_type.startswith("hyperclovax") else 1.0 / v,
    "lm_head_multiplier": lambda v, model_type: v,  # Falcon-H1
    "output_multiplier": lambda v, model_type: v,  # Muse (then soft-capped)
    "logits_mup_width_multiplier": lambda v, model_type: 1.0 / v,  # Inkling divides its hidden states
}
LOGIT_SOFTCAPS = ("final_logit_softcapping",  # Gemma-2, Gemma-3, Gemma-3n, Gemma-4, VaultGemma, NanoChat, ...
                  "logits_soft_cap",  # RecurrentGemma
                  "output_logit_soft_cap")  # xLSTM


def logit_options(model) -> dict:
    """``logit_scale`` and ``logit_softcap`` for ``fused_linear_orpo_loss``, read from the model's config
    (``LOGIT_SCALES``, ``LOGIT_SOFTCAPS``); the model's own forward multiplies first, then caps."""
    config = model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(config, "model_type", "") or ""
    scale = 1.0
    for name, to_scale in LOGIT_SCALES.items():
        value = getattr(config, name, None)
        if value is not None:
            scale *= to_scale(float(value), model_type)
    caps = [float(getattr(config, name)) for name in LOGIT_SOFTCAPS if getattr(config, name, None) is not None]
    options = dict(logit_scale=scale, logit_softcap=caps[0] if caps else None)
    try:
        logit_transform(**options)
    except ValueError as e:
        raise NotImplementedError(f"the model's config gives logits the fused loss cannot compute: {e}") from None
    return options


def check_supported(model) -> None:
    """Refuse, before any work, a model whose logits the fused loss cannot form from its decoder and its head."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise NotImplementedError("fused ORPO supports decoder-only models; this model is an encoder-decoder")
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or {name for name, _ in head.named_parameters()} - {"weight", "bias"}:
        # (an adapter on the head, or a head with parameters of its own, such as a learned logit scale per token)
        raise NotImplementedError(f"the model's LM head is a {type(head).__name__} with parameters "
                                  f"{sorted(name for name, _ in head.named_parameters())}: the fused loss computes "
                                  "hidden @ weight.T + bias and trains weight and bias alone")


PROBE_TOKENS = 16


def gathered_parameters(model):
    """A context in which the model's parameters are whole: DeepSpeed ZeRO-3 partitions them as the model is
    built (``from_pretrained`` under a ZeRO-3 config), and gathers them only inside its engine's forward."""
    partitioned = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not partitioned:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(partitioned)


@torch.no_grad()
def check_head(model) -> dict:
    """Run the model once on a probe of ``PROBE_TOKENS`` tokens (one forward, no gradients, its logits
    ``PROBE_TOKENS`` × V) and check that its own logits are what the fused loss computes from its decoder's
    last hidden state, its head and ``logit_options``; returns those options. Raises NotImplementedError,
    naming what differs, for a model whose logits are something else."""
    check_supported(model)
    options = logit_options(model)
    head = model.get_output_embeddings()
    training = model.training
    model.eval()  # (no dropout: the two forwards see the same network)
    try:
        with gathered_parameters(model):
            ids = torch.arange(PROBE_TOKENS, device=head.weight.device)[None] % head.weight.shape[0]
            mask = torch.ones_like(ids)
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
            hidden = model.get_decoder()(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            head_out = torch.nn.functional.linear(hidden, head.weight, head.bias).float()
    finally:
        model.train(training)
    ours = logit_transform(**options)(head_out)
    tolerance = 1e-4 if head.weight.dtype == torch.float32 else 2e-2  # (a half-precision model rounds its logits)
    if logits.shape != ours.shape:  # (a head of several outputs per position, say)
        raise NotImplementedError(f"the model's logits have shape {tuple(logits.shape)}, but its decoder and its "
                                  f"head give {tuple(ours.shape)} on a probe of {PROBE_TOKENS} tokens")
    error = ((logits - ours).norm() / logits.norm().clamp_min(1e-30)).item()
    if not error <= tolerance:
        fitted = ((logits * head_out).sum() / (head_out * head_out).sum().clamp_min(1e-30)).item()
        raise NotImplementedError(
            f"the model's logits are not what the fused loss computes from its decoder and its head with "
            f"{options} (read from its config): on a probe of {PROBE_TOKENS} tokens they differ by {error:.3g} "
            f"relative (allowed {tolerance:g}); a least-squares multiplier of hidden @ weight.T + bias would be "
            f"{fitted:.6g}. Its forward changes the logits in a way orpo_lib does not read from "
            f"{type(model.config).__name__}")
    return options


def fused_orpo_loss_for_batch(model, input_ids, attention_mask, labels, *, beta: float, chunk_size=None,
                              options=None) -> ORPOOutput:
    """TRL's ORPO loss of a causal LM on a concatenated batch, through the decoder and the fused LM-head loss.

    ``model`` is a Hugging Face causal LM (``get_decoder()`` gives the transformer, whose last hidden state
    is what the LM head reads; ``get_output_embeddings()`` the head), or that model inside its training wrappers
    (DistributedDataParallel, a DeepSpeed engine, a PEFT adapter; FSDP2 shards it in place). The call goes
    through ``model(...)``, so that each wrapper gathers its parameters and reduces its gradients as for the
    model's own forward (``install_fused_forward``). ``options``: the logit options as ``check_head`` returns
    them (None: ``logit_options``, not checked against the model's forward).
    """
    causal = causal_lm_inside(model)
    check_supported(causal)
    install_fused_forward(causal)
    options = logit_options(causal) if options is None else options
    fields = model(input_ids, attention_mask=attention_mask, use_cache=False, orpo_labels=labels,
                   orpo_loss_kwargs=dict(beta=beta, chunk_size=chunk_size, **options))
    return ORPOOutput(**fields)


def causal_lm_inside(model):
    """The Hugging Face causal LM inside its wrappers: DistributedDataParallel and DeepSpeed's engine keep it as
    ``.module``, PEFT behind ``get_base_model()``, ``torch.compile`` as ``_orig_mod``."""
    while True:
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif isinstance(getattr(model, "module", None), torch.nn.Module):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def install_fused_forward(model) -> None:
    """Give a causal LM, once, a forward that returns the fused ORPO loss when called with ``orpo_labels``.

    ``model(input_ids, attention_mask=..., orpo_labels=labels, orpo_loss_kwargs={...})`` runs the decoder, then
    the LM head's module with the targets, whose forward returns the fields of ``fused_linear_orpo_loss``'s
    ``ORPOOutput`` as a dict of tensors. Both are module calls, so the hooks of distributed wrappers run around
    them: FSDP2 all-gathers the root's parameters (the head's among them) and DeepSpeed ZeRO-3 the head's, and
    their backward hooks find the loss among the outputs. Without ``orpo_labels`` both forwards are the model's
    own. The forwards are bound methods on the instances, so a deep copy of the model keeps its own."""
    # (a mark of its own per module: a wrapper such as accelerate's autocast may wrap the forward itself, and
    # resizing the vocabulary gives the model a new head)
    for module, forward in ((model, _causal_lm_forward), (model.get_output_embeddings(), _head_forward)):
        if "_orpo_forward" not in vars(module):
            module.forward = module._orpo_forward = types.MethodType(forward, module)


def _causal_lm_forward(self, *args, orpo_labels=None, orpo_loss_kwargs=None, **kwargs):
    if orpo_labels is None:
        return type(self).forward(self, *args, **kwargs)
    input_ids = args[0] if args else kwargs.pop("input_ids")
    attention_mask = kwargs.pop("attention_mask")
    # (PEFT passes its unused arguments as None; the loss has no use for a cache or the model's own outputs)
    kwargs = {k: v for k, v in kwargs.items() if v is not None and k not in ("use_cache", "return_dict")}
    hidden = self.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                                **kwargs).last_hidden_state
    target, nll_target = orpo_targets(input_ids, attention_mask, orpo_labels)
    return self.get_output_embeddings()(hidden[:, :-1], orpo_target=target, orpo_nll_target=nll_target,
                                        **orpo_loss_kwargs)


def _head_forward(self, hidden, orpo_target=None, orpo_nll_target=None, **loss_kwargs):
    if orpo_target is None:
        return type(self).forward(self, hidden)
    out = fused_linear_orpo_loss(hidden, self.weight, orpo_target, self.bias, ignore_index=IGNORE_INDEX,
                                 nll_target=orpo_nll_target, **loss_kwargs)
    return {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}


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
