"""Bad input gets a clear error naming the argument, before any work, from every implementation."""

import pytest
import torch

import orpo_lib
from conftest import make_problem

LOSSES = [orpo_lib.fused_linear_orpo_loss, orpo_lib.orpo_loss_baseline]


def call(loss_fn, problem, **overrides):
    args = dict(problem)
    args.update(overrides)
    hidden, weight, target, bias = args.pop("hidden"), args.pop("weight"), args.pop("target"), args.pop("bias")
    return loss_fn(hidden, weight, target, bias, **args)


def bad_cases():
    p = make_problem(4, 5, 16, 37, with_bias=True, with_nll_target=True)
    b, t, h, v = 4, 5, 16, 37
    no_target_seq = p["target"].clone()
    no_target_seq[2] = -100
    no_nll = p["nll_target"].clone()
    no_nll[: b // 2] = -100
    too_large = p["target"].clone()
    too_large[0, -1] = v
    return [
        ("odd batch", dict(hidden=p["hidden"][:3], target=p["target"][:3], nll_target=p["nll_target"][:3]),
         ValueError, "batch must be even"),
        ("hidden 2-D", dict(hidden=p["hidden"][0]), ValueError, "hidden must be 3-D"),
        ("hidden size", dict(weight=torch.randn(v, h + 1)), ValueError, "hidden size"),
        ("target shape", dict(target=p["target"][:, :-1]), ValueError, "target must have shape"),
        ("target float", dict(target=p["target"].float()), TypeError, "target must be an integer"),
        ("target id >= V", dict(target=too_large), ValueError, "target holds 1 token id"),
        ("hidden integer", dict(hidden=p["hidden"].long()), TypeError, "hidden must be a floating-point"),
        ("target id < 0", dict(target=torch.full((b, t), -5)), ValueError, "target holds"),
        ("nll_target id", dict(nll_target=torch.full((b, t), v + 3)), ValueError, "nll_target holds"),
        ("nll_target shape", dict(nll_target=p["nll_target"][:2]), ValueError, "nll_target must have shape"),
        ("empty sequence", dict(target=no_target_seq), ValueError, r"no tokens other than ignore_index=-100 in sequence\(s\) \[2\]"),
        ("no NLL tokens", dict(nll_target=no_nll), ValueError, "nll_target has no tokens"),
        ("weight dtype", dict(weight=p["weight"].double()), TypeError, "weight dtype"),
        ("bias dtype", dict(bias=p["bias"].double()), TypeError, "bias dtype"),
        ("bias shape", dict(bias=p["bias"][:-1]), ValueError, "bias must have shape"),
        ("weight not a tensor", dict(weight=[[1.0]]), TypeError, "weight must be a torch.Tensor"),
        ("beta not a number", dict(beta="0.1"), TypeError, "beta must be a real number"),
        ("beta a bool", dict(beta=True), TypeError, "beta must be a real number"),
        ("beta NaN", dict(beta=float("nan")), ValueError, "beta must be finite"),
        ("beta infinite", dict(beta=float("inf")), ValueError, "beta must be finite"),
        ("ignore_index None", dict(ignore_index=None), TypeError, "ignore_index must be an int"),
        ("ignore_index float", dict(ignore_index=-100.0), TypeError, "ignore_index must be an int"),
        ("compute_nll_loss not a bool", dict(compute_nll_loss=1), TypeError, "compute_nll_loss must be a bool"),
        ("weight first, as in Liger", dict(hidden=p["weight"], weight=p["hidden"]), ValueError,
         "hidden comes first"),
    ]


@pytest.mark.parametrize("loss_fn", LOSSES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name, overrides, error, message", bad_cases(), ids=[c[0] for c in bad_cases()])
def test_bad_input_is_named(loss_fn, name, overrides, error, message):
    problem = make_problem(4, 5, 16, 37, with_bias=True, with_nll_target=True)
    with pytest.raises(error, match=message):
        call(loss_fn, problem, **overrides)


def test_no_nll_tokens_is_fine_without_the_nll_term():
    problem = make_problem(4, 5, 16, 37, with_nll_target=True)
    problem["nll_target"][:2] = -100
    out = call(orpo_lib.fused_linear_orpo_loss, problem, compute_nll_loss=False)
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("chunk_size, error", [(0, ValueError), (-4, ValueError), (2.5, TypeError), (True, TypeError)])
def test_chunk_size_must_be_a_positive_int(chunk_size, error):
    problem = make_problem(4, 5, 16, 37)
    with pytest.raises(error, match="chunk_size"):
        call(orpo_lib.fused_linear_orpo_loss, problem, chunk_size=chunk_size)
    with pytest.raises(error, match="chunk_size"):
        orpo_lib.FusedLinearORPOLoss(chunk_size=chunk_size)


@pytest.mark.parametrize("flag", [None, 0, "False"])
def test_fp32_weight_grad_must_be_a_bool(flag):
    problem = make_problem(4, 5, 16, 37)
    with pytest.raises(TypeError, match="fp32_weight_grad must be a bool"):
        call(orpo_lib.fused_linear_orpo_loss, problem, fp32_weight_grad=flag)


def test_options_are_keyword_only():
    """Liger's constructor takes (ignore_index, beta, ...) by position: here that is an error, not beta=-100."""
    problem = make_problem(4, 5, 16, 37)
    with pytest.raises(TypeError):
        orpo_lib.FusedLinearORPOLoss(-100, 0.1)
    with pytest.raises(TypeError):
        orpo_lib.fused_linear_orpo_loss(problem["hidden"], problem["weight"], problem["target"], None, 0.1)
    with pytest.raises(TypeError):
        orpo_lib.orpo_loss_baseline(problem["hidden"], problem["weight"], problem["target"], None, 0.1)
    with pytest.raises(TypeError):
        orpo_lib.FusedLinearORPOLoss()(problem["hidden"], problem["weight"], problem["target"], None,
                                       problem["target"])


@pytest.mark.parametrize("options", [dict(beta=float("nan")), dict(ignore_index=None), dict(chunk_size=0)])
def test_bad_options_fail_before_any_kernel(monkeypatch, options):
    from orpo_lib import validation

    monkeypatch.setattr(validation, "label_stats", lambda *a, **k: pytest.fail("a kernel ran before the check"))
    problem = make_problem(4, 5, 16, 37)
    with pytest.raises((TypeError, ValueError)):
        call(orpo_lib.fused_linear_orpo_loss, problem, **options)


def test_device_mismatch_is_named():
    problem = make_problem(4, 5, 16, 37)
    meta_weight = problem["weight"].to("meta")
    with pytest.raises(ValueError, match="weight is on meta"):
        call(orpo_lib.fused_linear_orpo_loss, problem, weight=meta_weight)


def test_errors_come_before_any_work():
    """A bad label is found before anything runs: nothing of the inputs is touched, no grad is left behind."""
    problem = make_problem(4, 5, 16, 37)
    hidden = problem["hidden"].clone().requires_grad_()
    bad = problem["target"].clone()
    bad[1, 1] = 1000
    with pytest.raises(ValueError):
        orpo_lib.fused_linear_orpo_loss(hidden, problem["weight"], bad)
    assert hidden.grad is None and torch.equal(hidden.detach(), problem["hidden"])


def test_kernels_launch_on_the_tensors_device():
    """Triton launches on the current CUDA device: the ops make the inputs' device current (an LM head on
    another GPU than the current one, as a model split over GPUs has it); on the CPU nothing changes."""
    from orpo_lib.validation import on_device

    guard = on_device(torch.device("cuda", 1))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    with on_device(torch.device("cpu")):
        pass

