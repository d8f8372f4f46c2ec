"""The compiled kernels on a CUDA device (skipped without one; the H200 benchmark run executes them)."""

import pytest
import torch

import orpo_lib
from conftest import (ON_HOPPER, make_problem, plan_of, reference_with_grads, rel_err, run_with_grads, split_passes,
                      with_trl_labels)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
hopper_only = ON_HOPPER[-1]  # the Gluon kernels' tests


def errors(out, grads, ref, ref_grads):
    errs = {"loss": rel_err(out.loss.detach(), ref["loss"].detach())}
    errs.update({name: rel_err(grads[name], grad) for name, grad in ref_grads.items()})
    return errs


@pytest.mark.parametrize("shape", [(4, 256, 512, 32003), (2, 1000, 256, 50257)])
@pytest.mark.parametrize("chunk_size", [None, 700])
@pytest.mark.parametrize("ignored_fraction", [0.25, 0.0])  # rows in pair order (some dropped); in token order
def test_bf16_no_worse_than_baseline(shape, chunk_size, ignored_fraction):
    """bf16 on the GPU: errors against float64 within 1.5× the materialising baseline's on the same inputs."""
    batch, seq, hidden, vocab = shape
    problem = make_problem(batch, seq, hidden, vocab, dtype=torch.bfloat16, device="cuda", with_bias=True,
                           with_nll_target=True, logit_scale=4.0, seed=seq,
                           ignored_fraction=ignored_fraction)
    ref, ref_grads = reference_with_grads(problem)
    fused = errors(*run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, chunk_size=chunk_size), ref, ref_grads)
    baseline = errors(*run_with_grads(orpo_lib.orpo_loss_baseline, problem), ref, ref_grads)
    for name in fused:
        assert fused[name] <= max(1.5 * baseline[name], 1e-3), (name, fused, baseline)


@pytest.mark.parametrize("ignored_fraction", [0.25, 0.0])
def test_bf16_overlapped_single_block_no_worse_than_baseline(monkeypatch, ignored_fraction):
    """A single block whose first 256 rows' logits run before the label counts come back and the rest after
    (with the dropped tokens' sum rows), and whose backward scales dX on the device: bf16 errors against
    float64, the logit means included, within 1.5× the materialising baseline's."""
    from orpo_lib import schedule

    monkeypatch.setattr(schedule, "early_rows", lambda *args: 256)
    problem = make_problem(4, 256, 512, 32003, dtype=torch.bfloat16, device="cuda", with_bias=True,
                           with_nll_target=True, logit_scale=4.0, seed=257, ignored_fraction=ignored_fraction)
    ref, ref_grads = reference_with_grads(problem)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, upstream=0.75)
    fused = errors(out, {k: g / 0.75 for k, g in grads.items()}, ref, ref_grads)
    base_out, base_grads = run_with_grads(orpo_lib.orpo_loss_baseline, problem, upstream=0.75)
    baseline = errors(base_out, {k: g / 0.75 for k, g in base_grads.items()}, ref, ref_grads)
    for name in ("chosen_logits_mean", "rejected_logits_mean"):
        fused[name] = abs(getattr(out, name).double().item() - ref[name].item())
        baseline[name] = abs(getattr(base_out, name).double().item() - ref[name].item())
    for name in fused:
        assert fused[name] <= max(1.5 * baseline[name], 1e-3), (name, fused, baseline)


@pytest.mark.parametrize("batch,ignored_fraction,labels", [
    (2, 0.0, "nll on the target"), (2, 0.25, "nll on the target"), (4, 0.25, "nll on the target"),
    (2, 0.0, "trl"), (4, 0.0, "trl"),  # the NLL on prompt and response, the odds ratio on the response
])
def test_one_pass_bf16_no_worse_than_baseline(monkeypatch, batch, ignored_fraction, labels):
    """Pairs longer than the automatic chunk take one pass (the NLL on the odds ratio's tokens, or TRL's labels,
    whose prompt rows count for the NLL alone): bf16 errors against float64 within 1.5× the baseline's, and the
    same bits twice."""
    from orpo_lib import schedule

    problem = make_problem(batch, 1500, 256, 50257, dtype=torch.bfloat16, device="cuda", with_bias=True,
                           logit_scale=4.0, seed=batch, ignored_fraction=ignored_fraction)
    if labels == "trl":  # prompts of 300 to 900 rows (900: two NLL-only blocks), some padding
        problem = with_trl_labels(problem, [900, 300, 500, 700][:batch], [0, 120, 40, 0][:batch], seed=batch)
    monkeypatch.setattr(schedule, "LOGITS_BUDGET_BYTES", 700 * 50257 * 2)  # 700-row blocks
    assert split_passes(plan_of(problem)) == [1] * (batch // 2)
    ref, ref_grads = reference_with_grads(problem)
    first = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem)
    fused = errors(*first, ref, ref_grads)
    baseline = errors(*run_with_grads(orpo_lib.orpo_loss_baseline, problem), ref, ref_grads)
    for name in fused:
        assert fused[name] <= max(1.5 * baseline[name], 1e-3), (name, fused, baseline)
    second = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem)
    assert torch.equal(first[0].loss, second[0].loss)
    assert all(torch.equal(first[1][k], second[1][k]) for k in first[1])


@pytest.mark.parametrize("chunk_size", [None, 100, 2048])
def test_fp32_matches_reference(chunk_size):
    problem = make_problem(4, 300, 256, 30011, device="cuda", with_bias=True, with_nll_target=True, seed=1)
    ref, ref_grads = reference_with_grads(problem)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, chunk_size=chunk_size)
    for name, err in errors(out, grads, ref, ref_grads).items():
        assert err < 1e-3, name  # cuBLAS may use TF32-free fp32; 1e-3 leaves room for the default GEMM path


def test_deterministic_bitwise():
    problem = make_problem(4, 512, 512, 32000, dtype=torch.bfloat16, device="cuda", ignored_fraction=0.3, seed=2)
    first_out, first = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, chunk_size=600)
    second_out, second = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, chunk_size=600)
    assert torch.equal(first_out.loss, second_out.loss)
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_peak_memory_is_bounded_by_the_chunk():
    """Peak over inputs: one chunk of logits + fp32 dW accumulator + dW + dX, not the B·T·V logits."""
    batch, seq, hidden, vocab, chunk = 8, 1024, 1024, 32000, 1024
    problem = make_problem(batch, seq, hidden, vocab, dtype=torch.bfloat16, device="cuda", ignored_fraction=0.0)
    hidden_t = problem["hidden"].requires_grad_()
    weight = problem["weight"].requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    orpo_lib.fused_linear_orpo_loss(hidden_t, weight, problem["target"], chunk_size=chunk).loss.backward()
    torch.cuda.synchronize()
    over = torch.cuda.max_memory_allocated() - before
    bound = chunk * vocab * 2 + vocab * hidden * (4 + 2) + batch * seq * hidden * 2 + chunk * hidden * 16 + (8 << 20)
    assert over <= bound, (over / 2**20, bound / 2**20)
    assert over < batch * seq * vocab * 2  # far below the materialised bf16 logits alone


def test_cpu_tensors_need_the_interpreter():
    problem = make_problem()
    for loss_fn in (orpo_lib.fused_linear_orpo_loss, orpo_lib.orpo_loss_baseline):
        with pytest.raises(ValueError, match="TRITON_INTERPRET"):
            loss_fn(problem["hidden"], problem["weight"], problem["target"])


@pytest.mark.parametrize("fullgraph", [False, True])
def test_compiled_equals_eager_on_cuda(fullgraph):
    """The shape where torch.compile once traced into the Triton launches and changed the loss (bf16, 2×256,
    H=1024, V=32000): compiled and eager now agree, the loss and the gradients bitwise."""
    torch._dynamo.reset()
    problem = make_problem(2, 256, 1024, 32000, dtype=torch.bfloat16, device="cuda", seed=21)

    def step(hidden, weight, target):
        out = orpo_lib.fused_linear_orpo_loss(hidden, weight, target)
        return out.loss, out.reward_margin, out.chosen_logits_mean

    compiled = torch.compile(step, fullgraph=fullgraph)
    results = []
    for fn in (step, compiled, compiled):
        hidden = problem["hidden"].clone().requires_grad_()
        weight = problem["weight"].clone().requires_grad_()
        values = fn(hidden, weight, problem["target"])
        values[0].backward()
        results.append((values, hidden.grad, weight.grad))
    for values, dx, dw in results[1:]:
        # the loss and the gradients come out of the custom ops: bitwise; the metrics are formed from the
        # op's outputs by code the compiler may fuse, so they may differ by rounding
        assert torch.equal(values[0], results[0][0][0])
        for a, b in zip(values[1:], results[0][0][1:]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        assert torch.equal(dx, results[0][1]) and torch.equal(dw, results[0][2])


@pytest.mark.parametrize("logp", [-87.0, -95.0, -103.5])
def test_subnormal_target_probability_on_cuda(logp):
    weight = torch.eye(2, device="cuda")
    hidden = torch.tensor([[[0.0, logp]], [[0.0, -1.0]]], device="cuda")
    problem = dict(hidden=hidden, weight=weight, bias=None, target=torch.tensor([[1], [1]], device="cuda"),
                   nll_target=None)
    ref, ref_grads = reference_with_grads(problem, beta=1.0, compute_nll_loss=False)
    out, grads = run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, beta=1.0, compute_nll_loss=False)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name].double().cpu(), grad.cpu(), rtol=2e-6, atol=0)


@pytest.mark.parametrize("chunk_size", [None, 300])
def test_second_backward_on_cuda(chunk_size):
    problem = make_problem(4, 256, 512, 32003, dtype=torch.bfloat16, device="cuda", with_bias=True, seed=22)
    leaves = [problem[k].clone().requires_grad_() for k in ("hidden", "weight", "bias")]
    loss = orpo_lib.fused_linear_orpo_loss(*leaves[:2], problem["target"], leaves[2], chunk_size=chunk_size).loss
    loss.backward(retain_graph=True)
    first = [leaf.grad.clone() for leaf in leaves]
    loss.backward()
    for leaf, grad in zip(leaves, first):
        assert torch.equal(leaf.grad, 2 * grad)


def test_gradcheck_float64_on_cuda():
    problem = make_problem(2, 5, 6, 11, dtype=torch.float64, device="cuda", with_bias=True, with_nll_target=True)
    inputs = tuple(problem[k].clone().requires_grad_() for k in ("hidden", "weight", "bias"))

    def loss(hidden, weight, bias):
        return orpo_lib.fused_linear_orpo_loss(hidden, weight, problem["target"], bias,
                                               nll_target=problem["nll_target"], chunk_size=3).loss
    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_training_loop_on_cuda():
    """A small random Llama (transformers, bf16) trained 5 AdamW steps with the fused loss and with the
    materialising baseline, from the same weights and TRL-style batch: the same loss trajectory within bf16."""
    transformers = pytest.importorskip("transformers")
    from orpo_lib.causal_lm import orpo_targets

    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)
    gen = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, 32000, (4, 256), generator=gen).cuda()
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 200:] = attention_mask[3, 150:] = 0
    labels = torch.where(attention_mask == 1, input_ids, -100)
    labels[:, :64] = -100
    target, nll_target = orpo_targets(input_ids, attention_mask, labels)
    trajectories = []
    for loss_fn in (orpo_lib.fused_linear_orpo_loss, orpo_lib.orpo_loss_baseline):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(5):
            hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            out = loss_fn(hidden[:, :-1], model.lm_head.weight, target, nll_target=nll_target, beta=0.1)
            optimizer.zero_grad()
            out.loss.backward()
            optimizer.step()
            losses.append(out.loss.item())
        trajectories.append(losses)
    assert trajectories[0] == pytest.approx(trajectories[1], rel=2e-2)
    assert trajectories[0][-1] < trajectories[0][0]


@pytest.fixture
def statistics_gemm_anywhere(monkeypatch):
    """schedule.statistics_in_gemm's thresholds are about speed, not correctness: here this Hopper GPU, whatever
    its name, and any row count take the statistics GEMM."""
    from orpo_lib import schedule

    monkeypatch.setattr(schedule, "STATS_GEMM_MIN_ROWS", 0)
    monkeypatch.setattr(schedule, "STATS_GEMM_GPUS", tuple(torch.cuda.get_device_name().split()))


@hopper_only
@pytest.mark.parametrize("labels", ["nll on the target", "trl"])
@pytest.mark.parametrize("chunk_size", [None, 300])
def test_eval_statistics_in_gemm(monkeypatch, statistics_gemm_anywhere, labels, chunk_size):
    """Without gradients on Hopper at a large vocabulary, the row statistics come from inside the logits GEMM
    (no logits buffer): loss and metrics within 1.5× the materialising baseline's error against float64, equal
    to the buffer path's up to bf16 rounding of single logits, the same bits twice; bad labels still raise."""
    from orpo_lib.chunked import planning

    problem = make_problem(4, 700, 512, 65536 + 7, dtype=torch.bfloat16, device="cuda", logit_scale=4.0, seed=5,
                           ignored_fraction=0.25)
    if labels == "trl":
        problem = with_trl_labels(problem, [200, 350, 100, 500], [0, 50, 20, 0], seed=5)
    taken = []
    real = planning.statistics_in_gemm
    monkeypatch.setattr(planning, "statistics_in_gemm", lambda *a: taken.append(real(*a)) or taken[-1])
    ref = orpo_lib.orpo_loss_reference(problem["hidden"].double(), problem["weight"].double(), problem["target"],
                                       nll_target=problem["nll_target"])

    def run():
        with torch.no_grad():
            return orpo_lib.fused_linear_orpo_loss(problem["hidden"], problem["weight"], problem["target"],
                                                   nll_target=problem["nll_target"], chunk_size=chunk_size)
    in_gemm, again = run(), run()
    assert taken == [True, True]
    with torch.no_grad():
        baseline = orpo_lib.orpo_loss_baseline(problem["hidden"], problem["weight"], problem["target"],
                                               nll_target=problem["nll_target"])
    monkeypatch.setattr(planning, "statistics_in_gemm", lambda *a: False)
    buffered = run()
    # Relative errors, but absolute ones for the logit means: a mean of logits of either sign is near 0.
    err = {"abs": lambda a, b: (torch.as_tensor(a).double().cpu() - torch.as_tensor(b).double().cpu()).abs().max().item(),
           "rel": rel_err}
    errs = {}
    for name, kind in [("loss", "rel"), ("nll_loss", "rel"), ("or_loss", "rel"), ("chosen_logps", "rel"),
                       ("rejected_logps", "rel"), ("log_odds_ratio", "rel"), ("chosen_logits_mean", "abs"),
                       ("rejected_logits_mean", "abs")]:
        got = getattr(in_gemm, name)
        errs[name] = (err[kind](got, ref[name]), err[kind](getattr(baseline, name), ref[name]),
                      err[kind](got, getattr(buffered, name)))
        assert torch.equal(got, getattr(again, name)), name
    for name, (to_float64, baseline_to_float64, to_buffer_path) in errs.items():
        assert to_float64 <= max(1.5 * baseline_to_float64, 1e-4) and to_buffer_path < 1e-3, (name, errs)
    bad = problem["target"].clone()
    bad[1, 3] = problem["weight"].shape[0]
    monkeypatch.setattr(planning, "statistics_in_gemm", real)
    with torch.no_grad(), pytest.raises(ValueError, match="outside"):
        orpo_lib.fused_linear_orpo_loss(problem["hidden"], problem["weight"], bad)


@hopper_only
def test_compiled_eval_with_statistics_in_gemm(statistics_gemm_anywhere):
    """A call without gradients inside torch.compile takes the statistics GEMM as eager does: the same loss."""
    torch._dynamo.reset()
    problem = make_problem(4, 700, 512, 65536 + 7, dtype=torch.bfloat16, device="cuda", logit_scale=4.0, seed=9)

    def step(hidden, weight, target):
        with torch.no_grad():
            out = orpo_lib.fused_linear_orpo_loss(hidden, weight, target)
        return out.loss, out.log_odds_ratio

    eager = step(problem["hidden"], problem["weight"], problem["target"])
    compiled = torch.compile(step, fullgraph=True)(problem["hidden"], problem["weight"], problem["target"])
    assert torch.equal(eager[0], compiled[0])
    torch.testing.assert_close(eager[1], compiled[1], rtol=1e-6, atol=1e-7)


LOGIT_TRANSFORMS = {"scaled": dict(logit_scale=0.125), "capped": dict(logit_softcap=2.0),
                    "scaled and capped": dict(logit_scale=3.0, logit_softcap=1.5)}


@pytest.mark.parametrize("transform", LOGIT_TRANSFORMS.values(), ids=LOGIT_TRANSFORMS)
@pytest.mark.parametrize("path", ["single block", "overlapped single block", "several blocks", "one pass", "no grad"])
def test_bf16_logit_transforms_no_worse_than_baseline(monkeypatch, transform, path):
    """Scaled and soft-capped logits (head outputs of std 4, so that the caps saturate) in every schedule: bf16
    errors against float64, the logit means included, within 1.5× the materialising baseline's."""
    from orpo_lib import schedule

    problem = make_problem(4, 256, 512, 32003, dtype=torch.bfloat16, device="cuda", with_bias=True,
                           with_nll_target=path != "one pass", logit_scale=4.0, seed=31, ignored_fraction=0.25)
    options = dict(transform)
    if path == "overlapped single block":
        monkeypatch.setattr(schedule, "early_rows", lambda *args: 256)
    elif path == "several blocks":
        options["chunk_size"] = 300
    elif path == "one pass":
        problem = with_trl_labels(problem, [100, 60, 30, 120], [0, 20, 40, 0], seed=32)
        monkeypatch.setattr(schedule, "LOGITS_BUDGET_BYTES", 300 * 32003 * 2)
        assert split_passes(plan_of(problem)) == [1, 1]
    ref, ref_grads = reference_with_grads(problem, **transform)
    if path == "no grad":
        with torch.no_grad():
            outs = [fn(problem["hidden"], problem["weight"], problem["target"], problem["bias"],
                       nll_target=problem["nll_target"], **transform)
                    for fn in (orpo_lib.fused_linear_orpo_loss, orpo_lib.orpo_loss_baseline)]
        runs = [(out, {}) for out in outs]
    else:
        runs = [run_with_grads(orpo_lib.fused_linear_orpo_loss, problem, **options),
                run_with_grads(orpo_lib.orpo_loss_baseline, problem, **transform)]
    (fused, baseline) = [errors(out, grads, ref, {k: ref_grads[k] for k in grads}) for out, grads in runs]
    for errs, (out, _) in zip((fused, baseline), runs):
        errs["chosen_logps"] = rel_err(out.chosen_logps, ref["chosen_logps"])
        for name in ("chosen_logits_mean", "rejected_logits_mean"):  # absolute: a mean of either sign is near 0
            errs[name] = abs(getattr(out, name).double().item() - ref[name].item())
    for name in fused:
        assert fused[name] <= max(1.5 * baseline[name], 1e-3), (name, fused, baseline)


@hopper_only
def test_eval_with_a_logit_transform_keeps_the_buffer(monkeypatch, statistics_gemm_anywhere):
    """The statistics GEMM reduces the head's logits as they are: a call with a scale or a cap takes the buffer
    path, where the row kernels apply them, even where the GEMM would be taken otherwise."""
    from orpo_lib.chunked import planning

    problem = make_problem(4, 700, 512, 65536 + 7, dtype=torch.bfloat16, device="cuda", logit_scale=4.0, seed=6)
    taken = []
    real = planning.statistics_in_gemm
    monkeypatch.setattr(planning, "statistics_in_gemm", lambda *a: taken.append(real(*a)) or taken[-1])
    ref = orpo_lib.orpo_loss_reference(problem["hidden"].double(), problem["weight"].double(), problem["target"],
                                       logit_softcap=2.0)
    with torch.no_grad():
        plain = orpo_lib.fused_linear_orpo_loss(problem["hidden"], problem["weight"], problem["target"])
        capped = orpo_lib.fused_linear_orpo_loss(problem["hidden"], problem["weight"], problem["target"],
                                                 logit_softcap=2.0)
    assert taken == [True, False]
    assert rel_err(capped.loss, ref["loss"]) < 1e-2 and rel_err(plain.loss, ref["loss"]) > 1e-2
