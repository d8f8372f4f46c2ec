"""Pair sums: the one-pass schedule's per-sequence sums of a pair combined with the pair's coefficients,
``out = c_chosen·chosen + c_rejected·rejected (+ out)``, in one pass over the three V×H tensors.

Memory-bound either way; as one kernel it reads each tensor once and never forms a temporary, where
torch's multiply by a 0-d device tensor takes an unvectorised path (see ``scaling``) and the sum two more
passes.
"""

from .. import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

import triton
import triton.language as tl


@triton.jit
def pair_sum_kernel(
    chosen_ptr,  # (n,) the chosen sequence's sum
    rejected_ptr,  # (n,) the rejected sequence's sum
    scales_ptr,  # (2,) c_chosen, c_rejected (fp32, or fp64 for float64 inputs): the products are formed in it
    out_ptr,  # (n,) out (may be chosen_ptr itself)
    n,
    ACCUMULATE: tl.constexpr,  # add to out's contents instead of overwriting them
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < n
    chosen_scale = tl.load(scales_ptr)
    rejected_scale = tl.load(scales_ptr + 1)
    acc = chosen_scale.dtype
    total = (chosen_scale * tl.load(chosen_ptr + offs, mask=in_range).to(acc)
             + rejected_scale * tl.load(rejected_ptr + offs, mask=in_range).to(acc))
    if ACCUMULATE:
        total += tl.load(out_ptr + offs, mask=in_range).to(acc)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=in_range)


def pair_sum(chosen, rejected, scales, out, *, accumulate: bool):
    """``out = scales[0]·chosen + scales[1]·rejected``, plus out's contents with ``accumulate``, for contiguous
    tensors of one shape (``out`` may be ``chosen``); each element rounded once to out's dtype. Returns out."""
    if not all(t.is_contiguous() and t.shape == out.shape for t in (chosen, rejected, out)):
        raise ValueError("pair_sum needs contiguous chosen, rejected and out of the same shape")
    if scales.shape != (2,):
        raise ValueError(f"pair_sum needs 2 scales, got shape {tuple(scales.shape)}")
    block = 4096
    pair_sum_kernel[(triton.cdiv(out.numel(), block),)](chosen, rejected, scales, out, out.numel(),
                                                          ACCUMULATE=accumulate, BLOCK=block, num_warps=8)
    return out
