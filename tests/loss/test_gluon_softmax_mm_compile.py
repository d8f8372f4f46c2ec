"""The softmax-times-W Gluon kernel compiles for sm_90a without a GPU, with the loads and the softmax in
the default partition and a 64×256 wgmma in each of two MMA warpgroups; its operand rules need no GPU.
Whether it is correct is tests/gpu/test_gluon_softmax_mm.py's job."""

import re

import pytest
import torch

from conftest import compile_in_fresh_process

gluon_softmax_mm = pytest.importorskip("orpo_lib.kernels.gluon_softmax_mm",
                                       reason="needs triton.experimental.gluon (triton 3.6)")

H200_SMEM_BYTES = 232448  # 227 KiB of opt-in shared memory per block on sm_90


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_compiles_with_the_softmax_beside_two_mma_warpgroups(out_dtype):
    kernel = compile_in_fresh_process("gluon_softmax_mm", f"compile_for_target(out_dtype={out_dtype})")
    ttgir, ptx = kernel["ttgir"], kernel["ptx"]
    default = ttgir[ttgir.index("default {"):ttgir.index("partition0(")]
    mma = [ttgir[ttgir.index("partition0("):ttgir.index("partition1(")], ttgir[ttgir.index("partition1("):]]
    assert "async_tma_copy_global_to_local" in default and "math.exp2" in default
    assert "warp_group_dot " not in default
    assert all("ttng.warp_group_dot " in part and "num_warps(4)" in part for part in mma)
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.\w+", ptx)) == {"wgmma.mma_async.sync.aligned.m64n256k16"}
    assert kernel["num_warps"] == 12 and kernel["shared"] <= H200_SMEM_BYTES


def _operands(rows=64, vocab=256, size=32, dtype=torch.bfloat16):
    return (torch.empty(rows, vocab, dtype=dtype), torch.empty(size, vocab, dtype=dtype), torch.empty(rows),
            torch.empty(rows), torch.empty(rows, size, dtype=torch.float32))


@pytest.mark.parametrize("change,match", [
    (lambda o: (o[0].float(), o[1].float(), *o[2:]), "must both be bfloat16 or float16"),
    (lambda o: (o[0], o[1][:, :128], *o[2:]), r"need logits \(C, V\) and weight_t \(H, V\)"),
    (lambda o: (o[0], o[1], o[2][:10], *o[3:]), r"lse must be a contiguous \(64,\) float32"),
    (lambda o: (*o[:3], o[3].double(), o[4]), r"row_scale must be a contiguous \(64,\) float32"),
    (lambda o: (*o[:4], o[4][:, :16]), r"out must be \(64, 32\)"),
    (lambda o: (o[0][:, :250], o[1][:, :250], *o[2:]), "K=250 must be a multiple of 8"),
])
def test_operand_rules(change, match):
    with pytest.raises(ValueError, match=match):
        gluon_softmax_mm.check_supported(*change(_operands()))
