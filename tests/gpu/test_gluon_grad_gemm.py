"""dX from the Gluon GEMM that forms G as it loads the logits, on a Hopper GPU: against row_grads + torch.mm on the
same logits buffer and against float64 (skipped elsewhere)."""

import pytest
import torch

from conftest import ON_HOPPER

pytestmark = ON_HOPPER

if torch.cuda.is_available():
    from orpo_lib import kernels
    from orpo_lib.chunked import gemms
    from orpo_lib.kernels import gluon_grad_gemm
    from orpo_lib.kernels.row_grads import grad_coefficients

SHAPES = [  # (rows, vocab, hidden)
    (1000, 776, 1000),  # nothing a multiple of its tile
    (37, 264, 72),  # fewer rows than a warpgroup's 64, H far below a tile's 256 columns
    (130, 8, 8),  # one partial K step, a vocabulary of 8
    (300, 1001, 264),  # an odd vocabulary: the buffer's rows are padded to 1008 columns
    (2048, 32000, 1024),  # many tiles per program
]


def problem(rows, vocab, size, seed, dtype=torch.bfloat16):
    """Hidden rows, W, their logits in a buffer as the loss makes it, and the row statistics and targets (with -1,
    NLL targets that differ, NLL-only rows, rows whose target has p ≈ 1)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(rows, size, device="cuda", generator=gen) / size ** 0.25).to(dtype)
    weight = (torch.randn(vocab, size, device="cuda", generator=gen) / size ** 0.25).to(dtype)
    logits = gemms.linear_into(gemms.new_logits_buffer(rows, vocab, x), x, gemms.gemm_head(weight, None))
    target = torch.randint(0, vocab, (rows,), device="cuda", generator=gen, dtype=torch.int32)
    nll_target = target.clone()
    nll_target[::3] = torch.randint(0, vocab, (len(nll_target[::3]),), device="cuda", generator=gen,
                                    dtype=torch.int32)
    target[::5] = -1
    nll_target[1::4] = -1
    logits[3::17].scatter_(1, target[3::17].clamp(min=0).long()[:, None], 30.0)  # p ≈ 1 at the target
    seq_len = 64
    token = torch.randperm(2 * rows, device="cuda", generator=gen)[:rows]
    batch = -(-2 * rows // seq_len)
    seq_coef = torch.randn(batch, device="cuda", generator=gen)
    stats = [torch.zeros(batch * seq_len, device="cuda") for _ in range(4)]
    kernels.row_stats(logits, target, nll_target, token, *stats)
    ids = (target, nll_target, token, stats[0], stats[1], stats[3], seq_coef)
    return x, weight, logits, ids, dict(nll_tokens=int((nll_target >= 0).sum()), seq_len=seq_len)


def buffer_grads(logits, ids, sizes, logp_grad=False):
    """G as the loss forms it today, row_grads rewriting the buffer (rounded to its dtype), and in float64 from
    float64 statistics of the same logits."""
    target, nll_target, token, logp, nll_logp, lse, seq_coef = ids
    exact = logits.double()
    stats = [torch.zeros_like(logp, dtype=torch.float64) for _ in range(4)]
    kernels.row_stats(exact, target, nll_target, token, *stats)
    today = logits.clone()
    for grad, (logp_of, nll_logp_of, lse_of, coef) in ((today, (logp, nll_logp, lse, seq_coef)),
                                                       (exact, (stats[0], stats[1], stats[3], seq_coef.double()))):
        if logp_grad:
            kernels.row_logp_grads(grad, target, token, logp_of, lse_of)
        else:
            kernels.row_grads(grad, target, nll_target, token, logp_of, nll_logp_of, lse_of, coef, **sizes)
    return today, exact


def buffer_path(logits, weight, ids, sizes, logp_grad=False):
    """G·W as the loss forms it today (a GEMM summing in float32), and in float64."""
    today, exact = buffer_grads(logits, ids, sizes, logp_grad)
    return gemms.mm(today, weight, torch.float32), exact @ weight.double()


def rel_err(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


def assert_as_accurate_as_the_buffer_path(out, today, exact):
    """The Gluon GEMM's result against the buffer path's (which rounds the same G to bf16 once, and sums in float32
    in another order) and against float64."""
    assert torch.isfinite(out).all()
    assert rel_err(out, exact) <= 1.25 * rel_err(today, exact) + 1e-6
    torch.testing.assert_close(out, today, rtol=2e-2, atol=2e-2 * today.abs().max().item())


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("logp_grad", [False, True])
def test_matches_the_buffer_path_and_float64(shape, logp_grad):
    rows, vocab, size = shape
    x, weight, logits, ids, sizes = problem(rows, vocab, size, seed=rows + vocab)
    coefficients, columns = grad_coefficients(*ids, **sizes, logp_grad=logp_grad)
    out = torch.full((rows, size), float("nan"), device="cuda")
    gluon_grad_gemm.grad_times_weight(logits, weight, coefficients, columns, out)
    assert_as_accurate_as_the_buffer_path(out, *buffer_path(logits, weight, ids, sizes, logp_grad))


def test_bitwise_repeatable_and_rounded_once_to_bf16():
    x, weight, logits, ids, sizes = problem(1000, 776, 1000, seed=3)
    coefficients, columns = grad_coefficients(*ids, **sizes)
    first, second = (gluon_grad_gemm.grad_times_weight(logits, weight, coefficients, columns,
                                                       torch.empty(1000, 1000, device="cuda")) for _ in range(2))
    assert torch.equal(first, second)
    rounded = gluon_grad_gemm.grad_times_weight(logits, weight, coefficients, columns,
                                                torch.empty(1000, 1000, device="cuda", dtype=torch.bfloat16))
    assert torch.equal(rounded, first.to(torch.bfloat16))


def test_fewer_programs_than_tiles():
    x, weight, logits, ids, sizes = problem(2048, 32000, 1024, seed=9)
    coefficients, columns = grad_coefficients(*ids, **sizes)
    every_sm = gluon_grad_gemm.grad_times_weight(logits, weight, coefficients, columns,
                                                 torch.empty(2048, 1024, device="cuda"))
    three = gluon_grad_gemm.grad_times_weight(logits, weight, coefficients, columns,
                                              torch.empty(2048, 1024, device="cuda"), num_programs=3)
    assert torch.equal(every_sm, three)  # each tile is summed in the same order whichever program takes it


def buffer_dw(logits, x, ids, sizes, logp_grad=False):
    """Gᵀ·X as the loss forms it today (a float32 sum over G), and in float64."""
    today, exact = buffer_grads(logits, ids, sizes, logp_grad)
    return gemms.mm(today.t(), x, torch.float32), exact.t() @ x.double()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("logp_grad", [False, True])
def test_dw_matches_the_buffer_path_and_float64(shape, logp_grad):
    rows, vocab, size = shape
    x, weight, logits, ids, sizes = problem(rows, vocab, size, seed=rows + 2 * vocab)
    coefficients, columns = grad_coefficients(*ids, **sizes, logp_grad=logp_grad)
    out = torch.full((vocab, size), float("nan"), device="cuda")
    gluon_grad_gemm.grad_t_times_hidden(logits, x, coefficients, columns, out)
    assert_as_accurate_as_the_buffer_path(out, *buffer_dw(logits, x, ids, sizes, logp_grad))


def test_dw_scales_accumulates_and_repeats_bitwise():
    x, weight, logits, ids, sizes = problem(1000, 776, 1000, seed=4)
    coefficients, columns = grad_coefficients(*ids, **sizes)
    once = gluon_grad_gemm.grad_t_times_hidden(logits, x, coefficients, columns, torch.empty(776, 1000, device="cuda"))
    again = gluon_grad_gemm.grad_t_times_hidden(logits, x, coefficients, columns, torch.empty(776, 1000, device="cuda"),
                                                num_programs=5)
    assert torch.equal(once, again)
    start = torch.randn(776, 1000, device="cuda")
    summed = gluon_grad_gemm.grad_t_times_hidden(logits, x, coefficients, columns, start.clone(), scale=0.5,
                                                 accumulate=True)
    assert torch.equal(summed, start + once * 0.5)  # the same float32 operations: scale·acc, then + out
    rounded = gluon_grad_gemm.grad_t_times_hidden(logits, x, coefficients, columns,
                                                  torch.empty(776, 1000, device="cuda", dtype=torch.bfloat16))
    assert torch.equal(rounded, once.to(torch.bfloat16))
