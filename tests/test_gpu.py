"""The compiled kernels on a CUDA device (skipped without one; the H200 benchmark run executes them)."""

import pytest
import torch

import orpo_lib
from conftest import make_problem, reference_with_grads, rel_err, run_with_grads

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


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
