"""The experiments' own kernels, on the CPU: a recorded GPU result is only as good as what it timed."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import stats_gemm  # noqa: E402



@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_bias,separate_nll", [(False, True), (True, False)])
def test_statistics_epilogue_matches_float64(dtype, with_bias, separate_nll):
    """Log-probs, log-sum-exp and logit sums of X @ W.T (+ b) from the tile partials, at awkward sizes."""
    gen = torch.Generator().manual_seed(3)
    rows, hidden, vocab = 70, 48, 517  # neither a multiple of the interpreter's 32×64 tiles
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    weight = (torch.randn(vocab, hidden, generator=gen) * 2 / hidden ** 0.5).to(dtype)
    bias = (torch.randn(vocab, generator=gen) * 0.5).to(dtype) if with_bias else None
    weight[7] = (x[0].double() * 30 / x[0].double().norm() ** 2).to(dtype)  # row 0's target logit ≈ 30, the rest O(1):
    # log p ≈ -1e-9, which only -log1p(others) keeps (lse - logit would round to 0)
    target = torch.randint(0, vocab, (rows,), generator=gen, dtype=torch.int32)
    target[0], target[::5][1:], target[3] = 7, -1, vocab - 1
    nll_target = target.clone()
    nll_target[rows // 2:] = -1
    if separate_nll:
        nll_target[1::3] = torch.randint(0, vocab, (len(nll_target[1::3]),), generator=gen, dtype=torch.int32)
    token = torch.randperm(rows, generator=gen)
    outputs = [torch.full((rows,), float("nan")) for _ in range(4)]  # logp, nll_logp, logit_sum, lse
    workspace = stats_gemm.workspace(rows, vocab, x.device)
    stats_gemm.tile_stats(x, weight, bias, target, nll_target, workspace, separate_nll=separate_nll)
    stats_gemm.combine(workspace, rows, vocab, target, nll_target, token, *outputs)

    logits = x.double() @ weight.double().T + (bias.double() if with_bias else 0.0)
    log_probs = torch.log_softmax(logits, dim=1)

    def picked(ids):
        return torch.where(ids >= 0, log_probs.gather(1, ids.clamp(min=0).long()[:, None])[:, 0], 0.0)
    expected = [picked(target), picked(nll_target), logits.sum(1), torch.logsumexp(logits, 1)]
    for name, out, want in zip(("logp", "nll_logp", "logit_sum", "lse"), outputs, expected):
        assert torch.allclose(out[token].double(), want, rtol=1e-5, atol=1e-4), name
    assert -1e-6 < log_probs[0, 7] < 0
    assert outputs[0][token[0]].item() == pytest.approx(log_probs[0, 7].item(), rel=1e-3)
