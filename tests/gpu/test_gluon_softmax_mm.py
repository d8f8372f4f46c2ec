"""(row_scale · softmax) · W formed beside the MMAs (Gluon), on a Hopper GPU, against float64 (skipped
elsewhere): the softmax rounded to bf16 as the kernel rounds it, then the product in float64."""

import pytest
import torch

from conftest import ON_HOPPER

pytestmark = ON_HOPPER

if torch.cuda.is_available():
    from orpo_lib.kernels import gluon_softmax_mm

SHAPES = [  # (rows, vocab, hidden)
    (1000, 776, 520),  # nothing a multiple of its tile: partial row, K and column tiles
    (37, 264, 72),  # fewer rows than one tile, fewer columns than one
    (4096, 32000, 1024),  # more tiles than programs
]


def problem(rows, vocab, size, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(rows, vocab, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    logits[::7, 5] = 40.0  # near-certain tokens: one probability near 1 in the row
    weight = (torch.randn(vocab, size, device="cuda", generator=gen) / size ** 0.5).to(torch.bfloat16)
    lse = torch.logsumexp(logits.float(), 1)
    row_scale = -torch.rand(rows, device="cuda", generator=gen)
    return logits, weight, lse, row_scale


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_matches_float64(shape, out_dtype):
    rows, vocab, size = shape
    logits, weight, lse, row_scale = problem(rows, vocab, size, seed=rows + vocab)
    out = torch.full((rows, size), float("nan"), device="cuda", dtype=out_dtype)
    gluon_softmax_mm.scaled_softmax_mm(logits, weight.t().contiguous(), lse, row_scale, out)
    p = (row_scale[:, None] * torch.exp2(logits.float() * 1.4426950408889634 - lse[:, None] * 1.4426950408889634))
    ref = p.to(torch.bfloat16).double() @ weight.double()
    assert torch.isfinite(out).all()
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    # float32 sums of bf16 products (and, for a bf16 out, one rounding at the end)
    assert rel < (1e-5 if out_dtype == torch.float32 else 4e-3), rel
    again = torch.empty_like(out)
    gluon_softmax_mm.scaled_softmax_mm(logits, weight.t().contiguous(), lse, row_scale, again)
    assert torch.equal(out, again)  # deterministic: no atomics, a fixed order of K steps
