"""TRL's ORPOTrainer and a Hugging Face training loop, with the fused loss in place of the logits (CPU)."""

import types

import pytest
import torch

trl = pytest.importorskip("trl", reason="the trl extra: pip install -e .[trl]")
transformers = pytest.importorskip("transformers")

import orpo_lib  # noqa: E402
from orpo_lib import causal_lm  # noqa: E402
from orpo_lib.causal_lm import check_head, fused_orpo_loss_for_batch, logit_options, orpo_targets  # noqa: E402
from orpo_lib.trl import FusedORPOTrainer, check_layout  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402
from trl.experimental.orpo import ORPOTrainer  # noqa: E402

from tiny_hf import HEADS, WORDS, tiny_llama, tiny_model, trainer  # noqa: E402


@pytest.mark.parametrize("kind", HEADS)
def test_loss_and_metrics_equal_orpotrainer_on_the_same_batch(tmp_path, kind):
    """TRL's own materialising computation and the fused one: loss, the 11 logged metrics and every gradient,
    for plain, soft-capped and scaled heads."""
    model = tiny_model(kind)
    reference, fused = trainer(ORPOTrainer, model, tmp_path), trainer(FusedORPOTrainer, model, tmp_path)
    batch = next(iter(reference.get_train_dataloader()))
    loss_ref, metrics_ref = reference.get_batch_loss_metrics(model, batch)
    loss_ref.backward()
    grads_ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss, metrics = fused.get_batch_loss_metrics(model, batch)
    loss.backward()
    assert len(metrics) == 11 and metrics.keys() == metrics_ref.keys()
    assert loss.item() == pytest.approx(loss_ref.item(), rel=1e-5)
    for name, value in metrics_ref.items():
        assert metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    for (name, p), grad in zip(model.named_parameters(), grads_ref):
        torch.testing.assert_close(p.grad, grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("kind", ["llama", "gemma2", "granite", "cohere"])
def test_trainer_runs_match_orpotrainer(tmp_path, kind):
    """Three optimiser steps of each trainer from the same initial model: the same logged losses, gradient
    norms and metrics, and the same parameters at the end."""
    histories, parameters = [], []
    for cls in (ORPOTrainer, FusedORPOTrainer):
        run = trainer(cls, tiny_model(kind, seed=3), tmp_path / cls.__name__)
        run.train()
        histories.append([entry for entry in run.state.log_history if "loss" in entry])
        parameters.append(dict(run.model.named_parameters()))
    assert len(histories[0]) == len(histories[1]) == 3
    for ref, fused in zip(*histories):
        assert fused.keys() == ref.keys()
        for name in ("loss", "grad_norm", *(k for k in ref if "/" in k or k.startswith(("nll", "log_odds")))):
            assert fused[name] == pytest.approx(ref[name], rel=1e-3, abs=1e-6), name
    for name, p in parameters[0].items():
        torch.testing.assert_close(parameters[1][name], p, rtol=1e-4, atol=1e-6, msg=name)


def test_training_loop_with_fused_and_baseline_losses():
    """A plain loop (AdamW, 4 steps) on a tiny random Llama: the fused loss and the materialising baseline give
    the same loss trajectory, from the same TRL-style batch (prompt masked, padded rows)."""
    gen = torch.Generator().manual_seed(7)
    batch, seq, vocab = 4, 12, len(WORDS) + 4
    input_ids = torch.randint(4, vocab, (batch, seq), generator=gen)
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    attention_mask[1, 9:] = attention_mask[3, 7:] = 0  # padding
    labels = torch.where(attention_mask == 1, input_ids, -100)
    labels[:, :4] = -100  # the prompt
    trajectories = {}
    for name, loss_fn in (("fused", orpo_lib.fused_linear_orpo_loss), ("baseline", orpo_lib.orpo_loss_baseline)):
        model = tiny_llama(seed=5)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(4):
            hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            target, nll_target = orpo_targets(input_ids, attention_mask, labels)
            out = loss_fn(hidden[:, :-1], model.lm_head.weight, target, nll_target=nll_target, beta=0.5)
            optimizer.zero_grad()
            out.loss.backward()
            optimizer.step()
            losses.append(out.loss.item())
        trajectories[name] = losses
    assert trajectories["fused"] == pytest.approx(trajectories["baseline"], rel=1e-4)
    assert trajectories["fused"][-1] < trajectories["fused"][0]  # it trains


def test_bf16_autocast_runs_the_head_in_bf16():
    """Under autocast (transformers' Trainer turns it on with bf16=True, its default) the LM-head GEMMs run in
    bf16 as F.linear's would; float32 parameters get float32 gradients; the result is the baseline's within bf16."""
    model = tiny_llama()
    ids = torch.randint(4, 100, (4, 12), generator=torch.Generator().manual_seed(2))
    results = []
    for loss_fn in (orpo_lib.fused_linear_orpo_loss, orpo_lib.orpo_loss_baseline):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = model.model(input_ids=ids).last_hidden_state
            out = loss_fn(hidden[:, :-1], model.lm_head.weight, ids[:, 1:], beta=0.1)
        out.loss.backward()
        assert out.loss.dtype == torch.float32 and model.lm_head.weight.grad.dtype == torch.float32
        results.append((out.loss.item(), model.lm_head.weight.grad.clone()))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-2)
    assert (results[0][1] - results[1][1]).norm() < 2e-2 * results[1][1].norm()


def test_adapter_equals_the_plain_call():
    model = tiny_llama()
    input_ids = torch.randint(4, 100, (2, 10))
    attention_mask = torch.ones_like(input_ids)
    labels = input_ids.clone()
    labels[:, :3] = -100
    out = fused_orpo_loss_for_batch(model, input_ids, attention_mask, labels, beta=0.1)
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    want = orpo_lib.fused_linear_orpo_loss(hidden[:, :-1], model.lm_head.weight, labels[:, 1:], beta=0.1,
                                           nll_target=input_ids[:, 1:])
    assert torch.equal(out.loss, want.loss)


@pytest.mark.parametrize("kind, options", [
    ("llama", dict(logit_scale=1.0, logit_softcap=None)), ("gemma2", dict(logit_scale=1.0, logit_softcap=0.15)),
    ("granite", dict(logit_scale=0.125, logit_softcap=None)), ("cohere", dict(logit_scale=0.0625, logit_softcap=None)),
    ("falcon_h1", dict(logit_scale=0.5, logit_softcap=None))])
def test_the_config_gives_the_logit_options_the_probe_confirms(kind, options):
    model = tiny_model(kind)
    assert logit_options(model) == options
    assert check_head(model) == options
    assert model.training  # the probe's eval mode is undone


def test_the_probe_names_an_unknown_multiplier(monkeypatch):
    """A head whose logits orpo_lib does not know how to form is refused, with the multiplier it would take."""
    model = tiny_model("granite")
    monkeypatch.delitem(causal_lm.LOGIT_SCALES, "logits_scaling")
    with pytest.raises(NotImplementedError, match=r"multiplier of hidden @ weight.T \+ bias would be 0\.125"):
        check_head(model)


def test_gemma2_at_its_default_cap_and_cohere_are_trained_not_refused(tmp_path):
    for kind, config in (("gemma2", dict(final_logit_softcapping=30.0)), ("cohere", {})):
        model = tiny_model(kind)
        model.config.update(config)
        assert trainer(FusedORPOTrainer, model, tmp_path).logit_options == logit_options(model)


def test_a_head_with_parameters_of_its_own_is_refused_when_the_trainer_is_built(tmp_path):
    model = tiny_llama()
    model.lm_head.register_parameter("logit_scale", torch.nn.Parameter(torch.ones(model.config.vocab_size)))
    with pytest.raises(NotImplementedError, match="trains weight and bias alone"):
        trainer(FusedORPOTrainer, model, tmp_path)


def test_an_unchecked_process_layout_is_refused_when_the_trainer_is_built(tmp_path, monkeypatch):
    """Layouts whose training with the fused loss no test has checked: a clear error before any step."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    built = AcceleratorState.__init__

    def on_xla(self, *args, **kwargs):
        built(self, *args, **kwargs)
        self.distributed_type = DistributedType.XLA
    monkeypatch.setattr(AcceleratorState, "__init__", on_xla)
    with pytest.raises(NotImplementedError, match="DDP, FSDP2 or DeepSpeed ZeRO, not under XLA"):
        trainer(FusedORPOTrainer, tiny_llama(), tmp_path)


def test_fsdp1_is_refused():
    fsdp1 = types.SimpleNamespace(state=types.SimpleNamespace(distributed_type=DistributedType.FSDP,
                                                              fsdp_plugin=types.SimpleNamespace(fsdp_version=1)))
    with pytest.raises(NotImplementedError, match="FSDP2 .* not FSDP1"):
        check_layout(fsdp1)


def test_the_fused_forward_keeps_the_models_own_and_a_copy_keeps_its_own():
    """Once taught the fused loss, the model's forward without labels is its own, bit for bit; a second install
    changes nothing; a deep copy's forward runs the copy's weights, not the original's."""
    import copy

    model = tiny_llama()
    ids = torch.randint(4, 100, (2, 10), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    own = model(input_ids=ids, attention_mask=mask).logits
    labels = ids.clone()
    labels[:, :3] = -100
    first = fused_orpo_loss_for_batch(model, ids, mask, labels, beta=0.1)
    forward = model.forward
    causal_lm.install_fused_forward(model)
    assert model.forward == forward
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, own)
    assert torch.equal(model.lm_head(torch.ones(3, 32)), torch.nn.functional.linear(torch.ones(3, 32),
                                                                                    model.lm_head.weight))
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.lm_head.weight.mul_(2)
    assert not torch.equal(fused_orpo_loss_for_batch(twin, ids, mask, labels, beta=0.1).loss, first.loss)
    assert torch.equal(fused_orpo_loss_for_batch(model, ids, mask, labels, beta=0.1).loss, first.loss)


def test_the_loss_goes_through_the_wrapper_it_is_given():
    """fused_orpo_loss_for_batch calls the model it is given (the trainer's wrapped model), not the model inside it:
    a wrapper's forward sees the call."""
    model = tiny_llama()
    calls = []

    class Wrapper(torch.nn.Module):  # (like DistributedDataParallel: the model is .module)
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args, **kwargs):
            calls.append(sorted(kwargs))
            return self.module(*args, **kwargs)
    ids = torch.randint(4, 100, (2, 10), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[:, :3] = -100
    wrapped = fused_orpo_loss_for_batch(Wrapper(model), ids, torch.ones_like(ids), labels, beta=0.1)
    plain = fused_orpo_loss_for_batch(model, ids, torch.ones_like(ids), labels, beta=0.1)
    assert calls == [["attention_mask", "orpo_labels", "orpo_loss_kwargs", "use_cache"]]
    assert torch.equal(wrapped.loss, plain.loss)
