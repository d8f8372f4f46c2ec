"""The Gluon GEMM compiles for sm_90a down to a cubin without a GPU (triton's bundled ptxas), and its
shape rules need no GPU either. Whether it is correct is tests/gpu/test_gluon_gemm.py's job."""

import re

import pytest
import torch

from conftest import compile_in_fresh_process

gluon_gemm = pytest.importorskip("orpo_lib.kernels.gluon_gemm", reason="needs triton.experimental.gluon (triton 3.6)")
gluon_pipeline = pytest.importorskip("orpo_lib.kernels.gluon_pipeline")

H200_SMEM_BYTES = 232448  # 227 KiB of opt-in shared memory per block on sm_90


def _region(ttgir, start, end):
    return ttgir[ttgir.index(start):ttgir.index(end) if end else len(ttgir)]


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_compiles_with_wgmma_in_the_worker(out_dtype):
    kernel = compile_in_fresh_process("gluon_gemm", f"compile_for_target({out_dtype})")
    ttgir, ptx = kernel["ttgir"], kernel["ptx"]
    mma = _region(ttgir, "partition0(", "partition1(")
    load = _region(ttgir, "partition1(", None)
    assert "num_warps(4)" in mma and "ttng.warp_group_dot " in mma and "isAsync = true" in mma
    assert "num_warps(1)" in load and "async_tma_copy_global_to_local" in load
    assert "warp_group_dot " not in _region(ttgir, "default {", "partition0(")
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16", ptx)
    assert "setmaxnreg.inc.sync.aligned.u32" in ptx  # registers moved from the producer to the MMA warps
    assert kernel["num_warps"] == 12 and kernel["shared"] <= H200_SMEM_BYTES


@pytest.mark.parametrize("M,N,K,out_dtype,match", [
    (64, 64, 100, torch.float32, "K=100 must be a multiple of 8"),
    (64, 66, 64, torch.float32, "N=66 must be a multiple of 4"),
    (64, 68, 64, torch.bfloat16, "N=68 must be a multiple of 8"),
    (0, 64, 64, torch.float32, "empty problem"),
])
def test_shape_rules(M, N, K, out_dtype, match):
    with pytest.raises(ValueError, match=match):
        gluon_pipeline.check_tma_shapes("gluon_gemm", M, N, K, torch.bfloat16, out_dtype)
    gluon_pipeline.check_tma_shapes("gluon_gemm", 1000, 776, 1000, torch.bfloat16, out_dtype)  # awkward but supported
