"""The gradient GEMMs, which form G from the logits inside dX = G·W and dW = Gᵀ·X, against torch's GEMMs on the
G that row_grads_kernel writes (CPU: Triton interpreter)."""

import re

import pytest
import torch
from conftest import compile_in_fresh_process

from orpo_lib import kernels

TOL = {torch.float16: dict(rtol=2e-3, atol=1e-4), torch.float32: dict(rtol=1e-5, atol=1e-6),
       torch.float64: dict(rtol=1e-12, atol=1e-13)}


def chunk_problem(dtype, rows=70, vocab=300, size=40, seed=0):
    """A chunk of logits in a dtype, its row statistics, and two sequences' rows in shuffled token order."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 4)
    logits[1, 7] = 60.0  # a near-certain target: its column must not cancel to 0
    logits = logits.to(dtype)
    target = torch.randint(0, vocab, (rows,), generator=gen, dtype=torch.int32)
    target[1] = 7
    target[::9] = -1
    nll_target = torch.where(torch.rand(rows, generator=gen) < 0.5, target,
                             torch.randint(0, vocab, (rows,), generator=gen, dtype=torch.int32)).to(torch.int32)
    nll_target[::7] = -1
    token = torch.randperm(rows, generator=gen)
    stats_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    logp, nll_logp, logit_sum, lse = (torch.zeros(rows, dtype=stats_dtype) for _ in range(4))
    kernels.row_stats(logits, target, nll_target, token, logp, nll_logp, logit_sum, lse)
    x = torch.randn(rows, size, generator=gen).to(dtype)
    weight = torch.randn(vocab, size, generator=gen).to(dtype)
    seq_coef = torch.tensor([-0.3, 0.2], dtype=stats_dtype)
    return dict(logits=logits, target=target, nll_target=nll_target, token=token, logp=logp, nll_logp=nll_logp,
                lse=lse, seq_coef=seq_coef, seq_len=(rows + 1) // 2, nll_tokens=23, x=x, weight=weight)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_gemms_on_the_logits_equal_gemms_on_the_gradient(dtype):
    """dX rows scattered to their tokens, dW added to a sum, the bias gradient, each times a device scale."""
    p = chunk_problem(dtype)
    rows, vocab = p["logits"].shape
    size = p["x"].shape[1]
    grads = p["logits"].clone()
    kernels.row_grads(grads, p["target"], p["nll_target"], p["token"], p["logp"], p["nll_logp"], p["lse"],
                      p["seq_coef"], nll_tokens=p["nll_tokens"], seq_len=p["seq_len"])
    coefs = kernels.row_coefficients(p["target"], p["nll_target"], p["token"], p["logp"], p["nll_logp"], p["lse"],
                                     p["seq_coef"], nll_tokens=p["nll_tokens"], seq_len=p["seq_len"])
    scale = torch.tensor(2.5, dtype=p["lse"].dtype)
    g = grads.double()

    dx = torch.full((rows + 5, size), float("nan"), dtype=dtype)  # rows that no block row maps to stay as they are
    out_rows = p["token"] + 5
    kernels.grad_dx(p["logits"], p["weight"], coefs, p["target"], p["nll_target"], dx, out_rows=out_rows, scale=scale)
    torch.testing.assert_close(dx[out_rows].double(), 2.5 * g @ p["weight"].double(), **TOL[dtype])
    assert dx[:5].isnan().all()

    gen = torch.Generator().manual_seed(2)
    x_all = torch.randn(rows + 3, size, generator=gen, dtype=torch.float64).to(dtype)
    x_rows = torch.randperm(rows + 3, generator=gen)[:rows]
    start = torch.randn(vocab, size, generator=gen, dtype=p["lse"].dtype)
    dw, db = start.clone(), torch.ones(vocab, dtype=p["lse"].dtype)
    kernels.grad_dw(p["logits"], x_all, coefs, p["target"], p["nll_target"], dw, x_rows=x_rows, db=db,
                    accumulate=True, scale=scale)
    torch.testing.assert_close(dw.double(), start.double() + 2.5 * g.t() @ x_all[x_rows].double(), **TOL[dtype])
    torch.testing.assert_close(db.double(), 1 + 2.5 * g.sum(0), **TOL[dtype])

    db_alone = torch.zeros(vocab, dtype=p["lse"].dtype)  # the bias gradient as Gᵀ·1, without dW
    kernels.grad_dw(p["logits"], p["logits"].new_ones(rows, 1), coefs, p["target"], p["nll_target"],
                    db_alone.view(-1, 1), accumulate=True)
    torch.testing.assert_close(db_alone.double(), g.sum(0), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gemms_on_the_logits_of_d_log_p(dtype):
    """With the one-pass coefficients (a = 1, no NLL term), G is d log p(y) / dlogits, as row_logp_grads writes it:
    the target column exact where p ≈ 1, rows without a target 0."""
    p = chunk_problem(dtype, seed=1)
    grads = p["logits"].clone()
    kernels.row_logp_grads(grads, p["target"], p["token"], p["logp"], p["lse"])
    coefs = kernels.row_coefficients(p["target"], p["target"], p["token"], p["logp"], p["logp"], p["lse"],
                                     p["seq_coef"], nll_tokens=1, seq_len=1, logp_grad=True)
    dx = torch.empty(p["x"].shape, dtype=dtype)
    kernels.grad_dx(p["logits"], p["weight"], coefs, p["target"], p["target"], dx)
    torch.testing.assert_close(dx.double(), grads.double() @ p["weight"].double(), **TOL[dtype])
    dw = torch.empty(p["weight"].shape, dtype=dtype)
    kernels.grad_dw(p["logits"], p["x"], coefs, p["target"], p["target"], dw)
    torch.testing.assert_close(dw.double(), grads.double().t() @ p["x"].double(), **TOL[dtype])


H100_SMEM_BYTES = 232448  # 227 KiB of opt-in shared memory per block on sm_90


@pytest.mark.parametrize("gemm", ["dx", "dw"])
def test_compiles_to_wgmma_with_g_from_registers(gemm):
    """For bf16 with the GPU tiles, sm_90a (no GPU needed): each GEMM is a wgmma m64n256k16 whose A operand is
    G in registers (four 32-bit registers, not a shared-memory descriptor), within the shared memory of a block."""
    kernel = compile_in_fresh_process("grad_gemms", f"compile_for_target({gemm!r})", interpret=False)
    mma = re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16\s*\{[^}]*\},\s*(\{[^}]*\}|%rd\d+)",
                    kernel["ptx"])
    assert mma is not None and mma.group(1).startswith("{") and mma.group(1).count("%r") == 4
    assert kernel["num_warps"] == 8 and kernel["shared"] <= H100_SMEM_BYTES
