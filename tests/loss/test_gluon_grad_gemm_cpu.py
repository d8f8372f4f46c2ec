"""The dX GEMM that forms G as it loads the logits, without a GPU: its Gluon kernel compiles for sm_90a with P as
the register operand of wgmmas that ptxas keeps asynchronous; the per-row coefficients it reads (plain Triton, run
by the interpreter) and the arithmetic it does with them give exactly the G that row_grads_kernel writes. Whether
the kernel computes it is tests/gpu/test_gluon_grad_gemm.py's job."""

import math
import re
import subprocess

import pytest
import torch

from orpo_lib import kernels
from orpo_lib.kernels.row_grads import grad_coefficients

from conftest import compile_in_fresh_process

gluon_grad_gemm = pytest.importorskip("orpo_lib.kernels.gluon_grad_gemm",
                                      reason="needs triton.experimental.gluon (triton 3.6)")

H200_SMEM_BYTES = 232448


@pytest.mark.parametrize("in_dtype,out_dtype", [("bfloat16", "float32"), ("bfloat16", "bfloat16"),
                                                ("float16", "float32")])
def test_compiles_with_p_as_the_register_operand(in_dtype, out_dtype, tmp_path):
    kernel = compile_in_fresh_process(
        "gluon_grad_gemm", f"compile_for_target(in_dtype=torch.{in_dtype}, out_dtype=torch.{out_dtype})")
    ptx = kernel["ptx"]
    ab = "bf16.bf16" if in_dtype == "bfloat16" else "f16.f16"
    # A from registers ({...}), B by descriptor: 4 k16 steps per K step in each of the two warpgroups' loops
    register_a = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.{ab} \{{[^}}]*\}}, \{{%r", ptx)
    assert len(register_a) >= 8
    assert "ex2.approx" in ptx and "cp.async.bulk.tensor" in ptx
    assert kernel["num_warps"] == 8 and kernel["shared"] <= H200_SMEM_BYTES
    assert_wgmmas_not_serialised(ptx, tmp_path)


def assert_wgmmas_not_serialised(ptx, tmp_path):
    """ptxas serialises the wgmmas (no overlap of the operand's exp2 with the MMAs) when registers run short, and
    says so: triton's bundled ptxas, run on the kernel's PTX."""
    from triton import knobs

    (tmp_path / "k.ptx").write_text(ptx)
    done = subprocess.run([knobs.nvidia.ptxas.path, "-arch=sm_90a", "-v", str(tmp_path / "k.ptx"), "-o",
                           str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "serialized" not in done.stderr, done.stderr


def rows_problem(rows, vocab, seed, *, confident_rows=()):
    """A chunk of float32 logits with its row statistics, as the loss has them when it forms G: targets with -1,
    NLL targets that differ and NLL-only rows, some rows whose target has p ≈ 1."""
    gen = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(rows, vocab, generator=gen)
    target = torch.randint(0, vocab, (rows,), generator=gen, dtype=torch.int32)
    nll_target = target.clone()
    nll_target[::3] = torch.randint(0, vocab, (len(nll_target[::3]),), generator=gen, dtype=torch.int32)
    target[::5] = -1  # some of them NLL-only rows
    nll_target[1::4] = -1
    target[2], nll_target[2] = -1, -1  # a row that counts for neither
    for r in confident_rows:
        logits[r, target[r].clamp(min=0)] = 40.0
    seq_len = 8
    token = torch.randperm(2 * rows, generator=gen)[:rows]
    batch = -(-2 * rows // seq_len)
    seq_coef = torch.randn(batch, generator=gen)
    stats = [torch.zeros(batch * seq_len) for _ in range(4)]  # logp, nll_logp, logit_sum, lse
    kernels.row_stats(logits, target, nll_target, token, *stats)
    return dict(logits=logits, target=target, nll_target=nll_target, token=token, logp=stats[0], nll_logp=stats[1],
                lse=stats[3], seq_coef=seq_coef, seq_len=seq_len)


def kernel_arithmetic(logits, coefficients, columns):
    """What grad_times_weight_kernel multiplies W by, in float64: P = exp2(z·log2 e - shift) at every column, the
    two target columns' P taken back out, times -s, and G at the two columns added."""
    shift, neg_s, *values = coefficients.double()
    p = torch.exp2(logits.double() * math.log2(math.e) - shift[:, None])
    rows = torch.arange(logits.shape[0])
    for column in columns:
        has = column >= 0
        p[rows[has], column[has].long()] = 0.0
    grad = neg_s[:, None] * p
    for column, value in zip(columns, values):
        has = column >= 0
        grad[rows[has], column[has].long()] += value[has]
    return grad


@pytest.mark.parametrize("rows,vocab", [(37, 300), (130, 1001), (5, 16)])
def test_coefficients_give_the_gradient_row_grads_writes(rows, vocab):
    prob = rows_problem(rows, vocab, seed=rows * vocab, confident_rows=(0, 3, 4))
    nll_tokens = int((prob["nll_target"] >= 0).sum())
    ids = (prob["target"], prob["nll_target"], prob["token"], prob["logp"], prob["nll_logp"], prob["lse"],
           prob["seq_coef"])
    coefficients, columns = grad_coefficients(*ids, nll_tokens=nll_tokens, seq_len=prob["seq_len"])
    grad = prob["logits"].clone()
    kernels.row_grads(grad, *ids, nll_tokens=nll_tokens, seq_len=prob["seq_len"])
    torch.testing.assert_close(kernel_arithmetic(prob["logits"], coefficients, columns), grad.double(), rtol=1e-5,
                               atol=1e-7)
    # the rows that count for nothing, and the columns: y, and y' only where it differs from y
    assert coefficients[0, 2] == float("inf") and coefficients[1, 2] == 0
    target, nll_target = prob["target"], prob["nll_target"]
    assert torch.equal(columns[0], target)
    assert torch.equal(columns[1], torch.where(nll_target == target, -1, nll_target))


def test_logp_coefficients_give_what_row_logp_grads_writes():
    prob = rows_problem(64, 777, seed=5, confident_rows=(1, ))
    coefficients, columns = grad_coefficients(prob["target"], prob["nll_target"], prob["token"], prob["logp"],
                                              prob["nll_logp"], prob["lse"], prob["seq_coef"], nll_tokens=7,
                                              seq_len=prob["seq_len"], logp_grad=True)
    grad = prob["logits"].clone()
    kernels.row_logp_grads(grad, prob["target"], prob["token"], prob["logp"], prob["lse"])
    torch.testing.assert_close(kernel_arithmetic(prob["logits"], coefficients, columns), grad.double(), rtol=1e-5,
                               atol=1e-7)
    assert (columns[1] == -1).all()  # no NLL term


@pytest.mark.parametrize("logits,weight,out,match", [
    ((8, 64, torch.float32), (64, 16, torch.bfloat16), (8, 16, torch.float32), "both be bfloat16 or float16"),
    ((8, 64, torch.bfloat16), (64, 16, torch.float16), (8, 16, torch.float32), "both be bfloat16 or float16"),
    ((8, 64, torch.bfloat16), (65, 16, torch.bfloat16), (8, 16, torch.float32), r"need logits \(C, V\)"),
    ((8, 64, torch.bfloat16), (64, 16, torch.bfloat16), (8, 16, torch.float16), "out must be"),
    ((8, 64, torch.bfloat16), (64, 16, torch.bfloat16), (8, 15, torch.float32), "out must be"),
    ((8, 64, torch.bfloat16), (64, 12, torch.bfloat16), (8, 12, torch.float32), "H a multiple of 8"),
    ((8, 64, torch.bfloat16), (64, 16, torch.bfloat16), (8, 16, torch.float32), "CUDA tensor"),
])
def test_bad_operands_are_named(logits, weight, out, match):
    make = lambda rows, cols, dtype: torch.zeros(rows, cols, dtype=dtype)
    with pytest.raises(ValueError, match=match):
        gluon_grad_gemm.check_supported(make(*logits), make(*weight), make(*out))


def test_dw_compiles_with_the_transposed_logits_as_the_register_operand(tmp_path):
    kernel = compile_in_fresh_process("gluon_grad_gemm", "compile_for_target(dw=True)")
    ptx = kernel["ptx"]
    register_a = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16 \{[^}]*\}, \{%r", ptx)
    assert len(register_a) >= 8
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx  # Gᵀ read from the logits tile, transposed
    assert kernel["num_warps"] == 8 and kernel["shared"] <= H200_SMEM_BYTES
    assert_wgmmas_not_serialised(ptx, tmp_path)


@pytest.mark.parametrize("vocab", [1001, 776])  # 776: the last tile's second warpgroup starts past V
def test_target_pairs_by_column_give_the_gradient_row_grads_writes(vocab):
    """dW's K loop adds -s·P at every (row, column); each target pair then replaces it by G there. Found through
    the sorted pairs and their 64-column segments, that is row_grads' G."""
    rows = 130
    prob = rows_problem(rows, vocab, seed=11, confident_rows=(0, 5))
    nll_tokens = int((prob["nll_target"] >= 0).sum())
    ids = (prob["target"], prob["nll_target"], prob["token"], prob["logp"], prob["nll_logp"], prob["lse"],
           prob["seq_coef"])
    coefficients, columns = grad_coefficients(*ids, nll_tokens=nll_tokens, seq_len=prob["seq_len"])
    column, row, value, starts = gluon_grad_gemm.target_pairs(coefficients, columns, vocab)
    assert len(starts) == 2 * -(-vocab // 128) + 1 and starts[0] == 0  # a segment per warpgroup of every tile
    assert int(starts[-1]) == int((columns >= 0).sum())  # every pair in a segment, the rows without one past them
    assert torch.equal(column[: int(starts[-1])], column[: int(starts[-1])].sort().values)
    shift, neg_s = coefficients[:2].double()
    grad = neg_s[:, None] * torch.exp2(prob["logits"].double() * math.log2(math.e) - shift[:, None])
    for block in range(len(starts) - 1):
        for k in range(int(starts[block]), int(starts[block + 1])):
            assert block * 64 <= column[k] < (block + 1) * 64
            grad[row[k], column[k]] = value[k].double()
    expected = prob["logits"].clone()
    kernels.row_grads(expected, *ids, nll_tokens=nll_tokens, seq_len=prob["seq_len"])
    torch.testing.assert_close(grad, expected.double(), rtol=1e-5, atol=1e-7)


def test_bad_dw_operands_are_named():
    logits = torch.zeros(8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"need logits \(C, V\) and hidden \(C, H\)"):
        gluon_grad_gemm.check_supported_dw(logits, torch.zeros(9, 16, dtype=torch.bfloat16), torch.zeros(64, 16))
    with pytest.raises(ValueError, match=r"out must be \(64, 16\)"):
        gluon_grad_gemm.check_supported_dw(logits, torch.zeros(8, 16, dtype=torch.bfloat16), torch.zeros(8, 16))
