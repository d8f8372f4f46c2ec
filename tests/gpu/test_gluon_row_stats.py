"""The row statistics computed inside the Gluon logits GEMM, on a Hopper GPU, against ``row_stats`` on
the same logits and against float64 (skipped elsewhere)."""

import pytest
import torch

from conftest import ON_HOPPER

pytestmark = ON_HOPPER

if torch.cuda.is_available():
    from orpo_lib import kernels
    from orpo_lib.kernels import gluon_row_stats

SHAPES = [  # (rows, vocab, hidden)
    (1000, 776, 1000),  # nothing a multiple of its tile
    (37, 264, 72),  # fewer rows than a tile; the last column tile has one 64-column slice past the vocabulary
    (130, 8, 8),  # one partial K step, a vocabulary of 8
    (2048, 32000, 1024),  # many tiles per program
    (300, 1001, 72),  # an odd vocabulary: partials only (a stored logits buffer needs rows of 16 bytes)
]


def problem(rows, vocab, size, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(rows, size, device="cuda", generator=gen) / size ** 0.25).to(torch.bfloat16)
    weight = (torch.randn(vocab, size, device="cuda", generator=gen) / size ** 0.25).to(torch.bfloat16)
    target = torch.randint(0, vocab, (rows,), device="cuda", generator=gen, dtype=torch.int32)
    target[::5] = -1  # rows whose token does not count
    target[1::7] = vocab - 1  # the last column, in the last (partial) tile
    nll_target = target.clone()
    nll_target[::3] = torch.randint(0, vocab, (nll_target[::3].shape[0],), device="cuda", generator=gen,
                                    dtype=torch.int32)  # NLL targets that differ from the odds-ratio ones
    nll_target[2::11] = -1
    # rows written in a shuffled order into per-token outputs larger than the chunk
    token = torch.randperm(2 * rows, device="cuda", generator=gen)[:rows]
    return x, weight, target, nll_target, token


def outputs(tokens):
    """logp, nll_logp, logit_sum, lse per token, NaN until written."""
    return [torch.full((tokens,), float("nan"), device="cuda") for _ in range(4)]


def float64_stats(logits, target, nll_target):
    z = logits.double()
    lse = torch.logsumexp(z, 1)
    pick = lambda ids: torch.where(ids >= 0, z.gather(1, ids.clamp(min=0).long()[:, None])[:, 0] - lse, 0.0)
    return pick(target), pick(nll_target), z.sum(1), lse


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("store_logits", [False, True])
def test_matches_row_stats_of_the_same_logits(shape, store_logits):
    rows, vocab, size = shape
    x, weight, target, nll_target, token = problem(rows, vocab, size, seed=rows + vocab)
    logits = torch.full((rows, vocab), float("nan"), device="cuda", dtype=torch.bfloat16) if store_logits else None
    fused = outputs(2 * rows)
    if store_logits and vocab % 8:
        with pytest.raises(ValueError, match="multiple of 8"):
            gluon_row_stats.logits_row_stats(x, weight, target, nll_target, token, *fused, logits=logits)
        return
    gluon_row_stats.logits_row_stats(x, weight, target, nll_target, token, *fused, logits=logits)
    cublas_logits = x @ weight.T
    if store_logits:  # the same GEMM, rounded once: equal to cuBLAS's up to its summation order
        torch.testing.assert_close(logits.float(), cublas_logits.float(), rtol=1.6e-2, atol=1e-2)
    separate = outputs(2 * rows)
    kernels.row_stats(cublas_logits, target, nll_target, token, *separate)
    exact = float64_stats(cublas_logits, target, nll_target)
    for name, got, ref, ref64 in zip(["logp", "nll_logp", "logit_sum", "lse"], fused, separate, exact):
        got, ref = got[token], ref[token]
        assert torch.isfinite(got).all(), name
        # both read bf16 logits; they differ where cuBLAS and the Gluon GEMM round a logit differently
        tol = 2e-2 * (1 + ref64.abs().max().item()) if name == "logit_sum" else 2e-2
        assert (got.double() - ref64).abs().max().item() < tol, name
        torch.testing.assert_close(got, ref, rtol=1e-2, atol=tol, msg=name)
    untouched = torch.ones(2 * rows, dtype=torch.bool, device="cuda")
    untouched[token] = False
    assert all(torch.isnan(t[untouched]).all() for t in fused)  # only the rows' own tokens are written


def test_exact_where_the_gemm_is_exact():
    """Small integers: every logit is exact in bf16, so both paths see the same logits and must agree to
    float32 rounding; the target's column carries the row maximum (a near-certain token)."""
    rows, vocab, size = 300, 1000, 64
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randint(-2, 3, (rows, size), device="cuda", generator=gen).to(torch.bfloat16)
    weight = torch.randint(-2, 3, (vocab, size), device="cuda", generator=gen).to(torch.bfloat16)
    target = torch.randperm(vocab, device="cuda", generator=gen)[:rows].to(torch.int32)
    weight[target.long()] = x  # the target's logit is |x|², far above the rest: p ≈ 1
    nll_target = torch.flip(target, [0])
    token = torch.arange(rows, device="cuda")
    fused, separate = outputs(rows), outputs(rows)
    gluon_row_stats.logits_row_stats(x, weight, target, nll_target, token, *fused)
    kernels.row_stats(x @ weight.T, target, nll_target, token, *separate)
    for got, ref in zip(fused, separate):
        torch.testing.assert_close(got, ref, rtol=2e-6, atol=1e-6)
    assert (fused[0] <= 0).all() and (fused[0] > -1e-3).all()  # log p at or just below 0 (others may underflow)


def test_deterministic_and_independent_of_the_grid():
    x, weight, target, nll_target, token = problem(520, 1032, 392, seed=3)
    runs = []
    for programs in (None, 1, 10_000):
        out = outputs(1040)
        gluon_row_stats.logits_row_stats(x, weight, target, nll_target, token, *out, num_programs=programs)
        runs.append(out)
    assert all(torch.equal(a[token], b[token]) for run in runs[1:] for a, b in zip(runs[0], run))


def test_unsupported_operands_raise():
    x, weight, target, nll_target, token = problem(64, 64, 64, seed=1)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        gluon_row_stats.logits_row_stats(x.float(), weight.float(), target, nll_target, token, *outputs(128))
    with pytest.raises(ValueError, match="multiple of 8"):
        gluon_row_stats.logits_row_stats(x[:, :60], weight[:, :60], target, nll_target, token, *outputs(128))
    with pytest.raises(ValueError, match="logits must be"):
        gluon_row_stats.logits_row_stats(x, weight, target, nll_target, token, *outputs(128),
                                         logits=torch.empty(64, 63, device="cuda", dtype=torch.bfloat16))
