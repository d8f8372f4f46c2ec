"""The Gluon C = A·Bᵀ kernels on a Hopper GPU, against torch.matmul in float32 (skipped elsewhere).

Supported: bf16/fp16 A (M, K) and B (N, K), row-major; any M ≥ 1; K a multiple of 8; N a multiple of
8 for a bf16 C, of 4 for a float32 C (TMA's 16-byte row strides). Tiles need not divide the shape:
TMA zero-fills loads and clips stores at the edges. Anything else is a ValueError before launch.
"""

import pytest
import torch

from conftest import ON_HOPPER

pytestmark = ON_HOPPER

if torch.cuda.is_available():
    from orpo_lib.kernels import gluon_gemm

SHAPES = [
    (256, 256, 128),  # whole tiles
    (1000, 776, 1000),  # no dimension a multiple of its tile
    (37, 264, 72),  # fewer rows than one tile; the second K step is partial
    (130, 8, 8),  # one partial K step, a sliver of N
    (2048, 1032, 4096),  # many tiles per persistent program, long K
]


def reference(a, b):
    return a.float() @ b.float().T


@pytest.fixture(autouse=True)
def _exact_fp32_reference():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_matches_torch(shape, out_dtype):
    M, N, K = shape
    gen = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
    b = torch.randn(N, K, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=out_dtype)  # an unwritten tile shows as NaN
    gluon_gemm.gluon_matmul_abt(a, b, out_dtype, out=out)
    ref = reference(a, b)
    assert torch.isfinite(out).all()
    err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
    assert err < (1e-4 if out_dtype == torch.float32 else 1e-2), err  # a wrong tile is off by O(1)


def test_persistent_grid_sizes_agree():
    """One program for all tiles, and one per tile, give the bits the default grid gives."""
    a = torch.randn(520, 392, device="cuda").to(torch.bfloat16)
    b = torch.randn(648, 392, device="cuda").to(torch.bfloat16)
    runs = [gluon_gemm.gluon_matmul_abt(a, b, num_programs=p) for p in (None, 1, 10_000)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    torch.testing.assert_close(runs[0], reference(a, b), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("M,N,K,out_dtype,match", [
    (64, 64, 100, torch.float32, "K=100 must be a multiple of 8"),
    (64, 66, 64, torch.float32, "N=66 must be a multiple of 4"),
    (64, 68, 64, torch.bfloat16, "N=68 must be a multiple of 8"),
])
def test_unsupported_shapes_raise(M, N, K, out_dtype, match):
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(N, K, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match=match):
        gluon_gemm.gluon_matmul_abt(a, b, out_dtype)


def test_bad_operands_raise():
    a = torch.randn(64, 64, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match="unit column stride"):
        gluon_gemm.gluon_matmul_abt(a.T, a)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        gluon_gemm.gluon_matmul_abt(a.float(), a.float())
    with pytest.raises(ValueError, match="block_m must be 128"):
        gluon_gemm.gluon_matmul_abt(a, a, block_m=64)
