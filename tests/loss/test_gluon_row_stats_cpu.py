"""The statistics GEMM without a GPU: its Gluon kernel compiles for sm_90a, and the fold of its per-tile
partials (plain Triton, run by the interpreter) gives what row_stats_kernel gives from the whole row.
Whether the epilogue computes those partials right is tests/gpu/test_gluon_row_stats.py's job."""

import re

import pytest
import torch

from orpo_lib import kernels
from orpo_lib.kernels.row_stats import fold_row_stats

from conftest import compile_in_fresh_process

gluon_row_stats = pytest.importorskip("orpo_lib.kernels.gluon_row_stats",
                                      reason="needs triton.experimental.gluon (triton 3.6)")

H200_SMEM_BYTES = 232448


@pytest.mark.parametrize("store_logits", [False, True])
def test_compiles_for_sm90a(store_logits):
    kernel = compile_in_fresh_process("gluon_row_stats", f"compile_for_target(store_logits={store_logits})")
    ptx = kernel["ptx"]
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16", ptx)) >= 2  # 2 warpgroups
    assert "ex2.approx" in ptx and "cp.async.bulk.tensor" in ptx  # the epilogue's exp, the TMA loads
    assert kernel["shared"] <= H200_SMEM_BYTES


def partials_of(logits, target, block_n):
    """What the epilogue writes, computed from a whole logits chunk: (3, tiles, C) max, sum of exp without
    the target, logit sum per column tile, and the two target logits (float32)."""
    rows, vocab = logits.shape
    tiles = -(-vocab // block_n)
    z = torch.full((rows, tiles * block_n), float("-inf"))
    z[:, :vocab] = logits.float()
    z = z.view(rows, tiles, block_n)
    tile_max = z.max(2).values
    cols = torch.arange(tiles * block_n).view(tiles, block_n)
    terms = torch.exp(z - tile_max[..., None]).masked_fill(cols == target[:, None, None].long(), 0.0)
    logit_sums = torch.where(z.isinf(), 0.0, z).sum(2)
    return torch.stack([tile_max.T, terms.sum(2).T, logit_sums.T]).contiguous()


@pytest.mark.parametrize("rows,vocab,block_n", [(37, 1000, 128), (130, 256, 128), (5, 8, 128), (300, 4000, 64)])
def test_fold_equals_row_stats(rows, vocab, block_n):
    gen = torch.Generator().manual_seed(rows * vocab)
    logits = (3 * torch.randn(rows, vocab, generator=gen)).to(torch.bfloat16).float()
    target = torch.randint(0, vocab, (rows,), generator=gen, dtype=torch.int32)
    target[::4] = -1
    target[1::5] = vocab - 1
    nll_target = torch.where(torch.arange(rows) % 3 == 0, torch.randint(0, vocab, (rows,), generator=gen), target)
    nll_target = nll_target.to(torch.int32)
    nll_target[2::7] = -1
    token = torch.randperm(2 * rows, generator=gen)[:rows]
    pick = lambda ids: logits.gather(1, ids.clamp(min=0).long()[:, None])[:, 0]
    folded = [torch.full((2 * rows,), float("nan")) for _ in range(4)]
    fold_row_stats(partials_of(logits, target, block_n), pick(target), pick(nll_target), target, nll_target, token,
                   *folded, block_rows=16, block_tiles=4)
    whole = [torch.full((2 * rows,), float("nan")) for _ in range(4)]
    kernels.row_stats(logits, target, nll_target, token, *whole)
    for name, got, ref in zip(["logp", "nll_logp", "logit_sum", "lse"], folded, whole):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4, equal_nan=True, msg=name)
    assert torch.isnan(folded[0]).sum() == rows  # only the chunk's own tokens are written


H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("capability,device,dtype,bias,hidden,vocab,rows,expected", [
    ((9, 0), H200, torch.bfloat16, False, 4096, 128256, 8192, True),
    ((9, 0), H200, torch.float16, False, 1024, 151936, 16384, True),
    ((9, 0), H100, torch.bfloat16, False, 4096, 128256, 16384, False),  # measured slower on an H100
    ((9, 0), "NVIDIA GH200 480GB", torch.bfloat16, False, 4096, 128256, 16384, False),  # not measured
    ((9, 0), H200, torch.bfloat16, False, 4096, 128256, 2048, False),  # measured slower with few rows
    ((9, 0), H200, torch.bfloat16, False, 4096, 32000, 16384, False),  # measured no faster at V = 32000
    ((9, 0), H200, torch.bfloat16, True, 4096, 128256, 16384, False),  # the epilogue adds no bias
    ((9, 0), H200, torch.float32, False, 4096, 128256, 16384, False),
    ((9, 0), H200, torch.bfloat16, False, 4100, 128256, 16384, False),  # rows TMA cannot address
    ((9, 0), H200, torch.bfloat16, False, 4096, 100277, 16384, True),  # an odd vocabulary: nothing of V columns is stored
    ((8, 0), H200, torch.bfloat16, False, 4096, 128256, 16384, False),  # no wgmma before Hopper
    ((10, 0), H200, torch.bfloat16, False, 4096, 128256, 16384, False),
    (None, H200, torch.bfloat16, False, 4096, 128256, 16384, False),
])
def test_statistics_in_gemm_only_where_measured_faster(capability, device, dtype, bias, hidden, vocab, rows, expected):
    from orpo_lib import schedule

    assert schedule.statistics_in_gemm(capability, device, dtype, bias, hidden, vocab, rows) is expected


def test_cpu_calls_keep_the_logits_buffer():
    from orpo_lib.chunked import planning

    opts = planning.Options(0.1, True, None, True, False, False, False, False)
    hidden, weight = torch.empty(2, 3, 8, dtype=torch.bfloat16), torch.empty(70000, 8, dtype=torch.bfloat16)
    assert not planning.statistics_in_gemm(hidden, weight, None, None, opts)  # (on the CPU the counts are never consulted)
