"""The experiments' own kernels, on the CPU: a recorded GPU result is only as good as what it timed."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import stats_gemm  # noqa: E402
import stream_overlap  # noqa: E402

from orpo_lib import kernels  # noqa: E402


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


def test_persistent_row_kernels_equal_the_library_kernels():
    """A few programs looping over the rows compute, row for row, what one program per row does (bitwise)."""
    gen = torch.Generator().manual_seed(5)
    rows, vocab, programs = 37, 1000, 5  # rows not a multiple of programs, vocab of no block size
    logits = torch.randn(rows, vocab, generator=gen) * 3
    target = torch.randint(0, vocab, (rows,), generator=gen, dtype=torch.int32)
    nll_target = torch.randint(0, vocab, (rows,), generator=gen, dtype=torch.int32)
    target[::4], nll_target[1::3] = -1, -1
    token = torch.randperm(rows, generator=gen)
    seq_len, seq_coef = 19, torch.rand(2, generator=gen)

    def stats():
        return [torch.full((rows,), float("nan")) for _ in range(4)]  # logp, nll_logp, logit_sum, lse

    want = stats()
    kernels.row_stats(logits, target, nll_target, token, *want)
    got = stats()
    block_v = kernels._block_v(vocab, kernels.STATS_LAUNCH)
    stream_overlap.persistent_row_stats_kernel[(programs,)](logits, vocab, target, nll_target, token, *got, rows, vocab,
                                                            BLOCK_V=block_v, SLOT=kernels.stats_slot(block_v))
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and not want[3].isnan().any()

    logp, nll_logp, _, lse = want
    want_grad, got_grad = logits.clone(), logits.clone()
    kernels.row_grads(want_grad, target, nll_target, token, logp, nll_logp, lse, seq_coef, nll_coef=-0.01,
                      seq_len=seq_len)
    stream_overlap.persistent_row_grads_kernel[(programs,)](
        got_grad, vocab, target, nll_target, token, logp, nll_logp, lse, seq_coef, -0.01, seq_len, rows, vocab,
        BLOCK_V=kernels._block_v(vocab, kernels.GRADS_LAUNCH))
    assert torch.equal(got_grad, want_grad) and not torch.equal(want_grad, logits)
