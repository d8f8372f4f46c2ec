"""Scaled and soft-capped logits (Cohere, Granite, Falcon-H1, Gemma-2): the fused loss, the baseline and the
float64 reference agree on the loss, every metric and every gradient, in every schedule; tanh's saturation
stays finite and exact; gradcheck; torch.compile; bad options are refused."""

import math

import pytest
import torch

import orpo_lib
from orpo_lib import schedule
from orpo_lib.logit_transform import LogitTransform
from conftest import make_problem, plan_of, reference_with_grads, rel_err, run_with_grads, split_passes, with_trl_labels
from test_loss import TOLERANCE, assert_matches_reference

TRANSFORMS = {
    "Granite's 1/8": dict(logit_scale=0.125),
    "a multiplier of 3": dict(logit_scale=3.0),
    "a cap": dict(logit_softcap=1.5),
    "a multiplier, then a cap": dict(logit_scale=2.5, logit_softcap=0.8),
}


def check(problem, transform, tol=TOLERANCE[torch.float32], **options):
    ref, ref_grads = reference_with_grads(problem, **transform)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, **transform, **options)
    assert_matches_reference(out, grads, ref, ref_grads, tol)
    return out


@pytest.mark.parametrize("transform", TRANSFORMS.values(), ids=TRANSFORMS)
@pytest.mark.parametrize("chunk_size", [None, 5])  # one block; several, two passes per pair
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_matches_reference(transform, chunk_size, with_bias):
    # logits of std 4 before the transform: a cap of 1.5 or 0.8 saturates many of them
    problem = make_problem(4, 7, 48, 517, with_bias=with_bias, with_nll_target=True, logit_scale=4.0, seed=3)
    check(problem, transform, chunk_size=chunk_size)


@pytest.mark.parametrize("transform", TRANSFORMS.values(), ids=TRANSFORMS)
def test_dropped_tokens_count_in_the_logit_means(transform):
    """Tokens neither target counts are left out of the GEMMs; their logits still count in the logit means (a
    cap makes those nonlinear in the rows: they are computed)."""
    problem = make_problem(4, 9, 48, 517, ignored_fraction=0.4, logit_scale=4.0, seed=8)
    for chunk_size in (None, 6):
        out = check(problem, transform, chunk_size=chunk_size)
        assert plan_of(problem, chunk_size).dropped


@pytest.mark.parametrize("transform", TRANSFORMS.values(), ids=TRANSFORMS)
def test_one_pass_pairs_with_trl_labels(monkeypatch, transform):
    """A pair longer than a chunk in one pass: G = c·U holds for the head's output too (U times the slope)."""
    problem = with_trl_labels(make_problem(2, 13, 48, 517, logit_scale=4.0, seed=4), [3, 5], [0, 2], seed=5)
    monkeypatch.setattr(schedule, "LOGITS_BUDGET_BYTES", 5 * 517 * 4)
    assert split_passes(plan_of(problem)) == [1]
    check(problem, transform)


@pytest.mark.parametrize("transform", TRANSFORMS.values(), ids=TRANSFORMS)
@pytest.mark.parametrize("chunk_size", [None, 5])
def test_without_gradients(transform, chunk_size):
    problem = make_problem(4, 7, 48, 517, with_bias=True, logit_scale=4.0, seed=6)
    ref = orpo_lib.orpo_loss_reference(problem["hidden"], problem["weight"], problem["target"], problem["bias"],
                                       **transform)
    with torch.no_grad():
        out = orpo_lib.fused_linear_orpo_loss(problem["hidden"], problem["weight"], problem["target"],
                                              problem["bias"], chunk_size=chunk_size, **transform)
    for name in ("loss", "chosen_logps", "rejected_logps", "chosen_logits_mean", "rejected_logits_mean"):
        assert rel_err(getattr(out, name), ref[name]) < TOLERANCE[torch.float32], name


@pytest.mark.parametrize("transform", TRANSFORMS.values(), ids=TRANSFORMS)
def test_baseline_matches_reference(transform):
    problem = make_problem(4, 7, 48, 517, with_bias=True, with_nll_target=True, logit_scale=4.0, seed=7)
    ref, ref_grads = reference_with_grads(problem, **transform)
    out, grads = run_with_grads(orpo_lib.orpo_loss_baseline, problem, **transform)
    assert_matches_reference(out, grads, ref, ref_grads, TOLERANCE[torch.float32])


def test_the_reference_is_the_models_forward():
    """Cohere multiplies its head's output, Gemma-2 caps it as cap·tanh(z / cap): the reference with the options
    equals the reference of a head that already gives those logits (a scaled W and bias), or the models' own
    three lines."""
    p = make_problem(4, 7, 48, 517, dtype=torch.float64, with_bias=True, logit_scale=4.0, seed=9)
    scaled = orpo_lib.orpo_loss_reference(p["hidden"], p["weight"], p["target"], p["bias"], logit_scale=0.3)
    folded = orpo_lib.orpo_loss_reference(p["hidden"], 0.3 * p["weight"], p["target"], 0.3 * p["bias"])
    for name in ("loss", "chosen_logps", "chosen_logits_mean"):
        assert rel_err(scaled[name], folded[name]) < 1e-14, name
    z = p["hidden"] @ p["weight"].T + p["bias"]
    gemma = torch.tanh(z / 30.0) * 30.0  # transformers' Gemma2ForCausalLM: / cap, tanh, * cap
    assert rel_err(LogitTransform(1.0, 30.0)(z), gemma) < 1e-15
    capped = orpo_lib.orpo_loss_reference(p["hidden"], p["weight"], p["target"], p["bias"], logit_softcap=30.0)
    assert rel_err(capped["chosen_logits_mean"], gemma[:2].mean()) < 1e-14


def test_saturated_cap_is_finite_and_exact():
    """Head outputs a thousand times the cap: tanh is ±1 to float32 precision, its slope underflows to 0, and
    nothing overflows (exp(-2|u|) is the only exponential of u). The few outputs near 0, where the slope is not
    0, carry the float32 GEMM's rounding times 1/cap: the gradients are as close to float64 as the materialising
    baseline's, not closer."""
    problem = make_problem(4, 7, 48, 517, logit_scale=400.0, seed=10)
    cap = dict(logit_softcap=0.5)
    out = check(problem, cap, tol=1e-4)
    assert out.chosen_logits_mean.abs() <= 0.5
    _, ref_grads = reference_with_grads(problem, **cap)
    _, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, **cap)
    _, baseline_grads = run_with_grads(orpo_lib.orpo_loss_baseline, problem, **cap)
    for name, grad in ref_grads.items():
        assert rel_err(grads[name], grad) < 2 * rel_err(baseline_grads[name], grad) + 1e-6, name


def test_float64_to_float64_precision():
    """Float64 inputs get float64 constants in the kernels (each passed as two float32 parts)."""
    problem = make_problem(4, 7, 48, 517, dtype=torch.float64, with_bias=True, logit_scale=4.0, seed=11)
    for transform in TRANSFORMS.values():
        check(problem, transform, tol=1e-12)
        check(problem, transform, tol=1e-12, chunk_size=5)


def test_gradcheck():
    """Finite differences of the loss (a scale, then a cap) against its gradients (gradcheck's fast mode: a few
    random directions, which the interpreter can afford)."""
    p = make_problem(2, 3, 4, 11, dtype=torch.float64, with_bias=True, logit_scale=4.0, seed=12)
    leaves = [p[k].clone().requires_grad_() for k in ("hidden", "weight", "bias")]

    def loss(hidden, weight, bias):
        return orpo_lib.fused_linear_orpo_loss(hidden, weight, p["target"], bias, logit_scale=2.5,
                                               logit_softcap=0.8).loss
    assert torch.autograd.gradcheck(loss, leaves, eps=1e-6, atol=1e-8, fast_mode=True)


def test_compiled_equals_eager():
    torch._dynamo.reset()

    def loss_and_means(hidden, weight, target, bias):
        out = orpo_lib.fused_linear_orpo_loss(hidden, weight, target, bias, logit_scale=2.0, logit_softcap=1.0,
                                              chunk_size=5)
        return out.loss, out.chosen_logits_mean

    compiled = torch.compile(loss_and_means, fullgraph=True)
    problem = make_problem(4, 7, 48, 517, with_bias=True, logit_scale=4.0, seed=13)
    results = []
    for fn in (loss_and_means, compiled):
        leaves = [problem[k].clone().requires_grad_() for k in ("hidden", "weight", "bias")]
        loss, mean = fn(leaves[0], leaves[1], problem["target"], leaves[2])
        loss.backward()
        results.append((loss, mean, [leaf.grad for leaf in leaves]))
    (loss, mean, grads), (loss_c, mean_c, grads_c) = results
    assert torch.equal(loss, loss_c) and torch.equal(mean, mean_c)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_c))


def test_module_holds_the_options():
    problem = make_problem(4, 7, 48, 517, logit_scale=4.0, seed=14)
    module = orpo_lib.FusedLinearORPOLoss(logit_scale=0.5, logit_softcap=2.0)
    assert "logit_scale=0.5, logit_softcap=2.0" in repr(module)
    out = module(problem["hidden"], problem["weight"], problem["target"])
    want = orpo_lib.fused_linear_orpo_loss(problem["hidden"], problem["weight"], problem["target"], logit_scale=0.5,
                                           logit_softcap=2.0)
    assert torch.equal(out.loss, want.loss)


@pytest.mark.parametrize("options, error, match", [
    (dict(logit_scale=0.0), ValueError, "logit_scale must be positive and finite, got 0.0"),
    (dict(logit_scale=-1.0), ValueError, "logit_scale must be positive"),
    (dict(logit_scale=math.nan), ValueError, "logit_scale must be positive"),
    (dict(logit_scale="8"), TypeError, "logit_scale must be a real number, got str"),
    (dict(logit_scale=True), TypeError, "logit_scale must be a real number, got bool"),
    (dict(logit_softcap=0.0), ValueError, "logit_softcap must be positive and finite, got 0.0"),
    (dict(logit_softcap=math.inf), ValueError, "logit_softcap must be positive and finite, got inf"),
    (dict(logit_softcap=[30.0]), TypeError, "logit_softcap must be a real number or None, got list"),
])
def test_bad_options_are_refused_by_every_entry_point(options, error, match):
    problem = make_problem(2, 3, 8, 37, seed=15)
    args = (problem["hidden"], problem["weight"], problem["target"])
    for call in (lambda: orpo_lib.fused_linear_orpo_loss(*args, **options),
                 lambda: orpo_lib.orpo_loss_baseline(*args, **options),
                 lambda: orpo_lib.FusedLinearORPOLoss(**options)):
        with pytest.raises(error, match=match):
            call()
