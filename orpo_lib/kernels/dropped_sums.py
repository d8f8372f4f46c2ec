"""Dropped rows' sums: per half of the batch (chosen, rejected), the float32 sum of the rows of hidden whose
tokens no target needs. Their logits are needed only in their sum over the vocabulary (the logit-mean
metrics), which is linear in the row: the sum row stands for them all (``chunked``'s dropped-token logit
sums). One launch where a masked product took some seven small torch ops.
"""

from .. import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

import torch
import triton
import triton.language as tl


@triton.jit
def dropped_row_sums_kernel(
    hidden_ptr,  # (B, T, H)
    stride_b, stride_t, stride_h,
    target_ids_ptr,  # (B*T,) int32, -1 where the odds ratio does not count the token
    nll_ids_ptr,  # (B*T,) int32, -1 where the NLL does not count it
    out_ptr,  # (2, H) float32 out (float64 for float64 inputs)
    T,
    H,
    half_tokens,  # B/2 * T
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    half = tl.program_id(1)
    in_cols = cols < H
    acc_dtype = out_ptr.dtype.element_ty  # float32, or float64 for float64 inputs
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=acc_dtype)
    for start in range(0, half_tokens, BLOCK_T):
        t = half * half_tokens + start + tl.arange(0, BLOCK_T)
        in_half = start + tl.arange(0, BLOCK_T) < half_tokens
        dropped = in_half & (tl.load(target_ids_ptr + t, mask=in_half, other=0) < 0) & (
            tl.load(nll_ids_ptr + t, mask=in_half, other=0) < 0)
        rows = hidden_ptr + (t // T).to(tl.int64) * stride_b + (t % T).to(tl.int64) * stride_t
        acc += tl.load(rows[:, None] + cols[None, :] * stride_h, mask=dropped[:, None] & in_cols[None, :],
                       other=0.0).to(acc_dtype)  # only dropped rows are read
    tl.store(out_ptr + half * H + cols, tl.sum(acc, axis=0), mask=in_cols)


def dropped_row_sums(hidden, target_ids, nll_ids):
    """(2, H) float32 (float64 for float64 inputs): per half, the sum of the rows of hidden (B, T, H) whose
    tokens neither id tensor (B, T) int32 counts (-1)."""
    batch, seq, size = hidden.shape
    out = hidden.new_empty(2, size, dtype=torch.promote_types(hidden.dtype, torch.float32))
    block_h = min(triton.next_power_of_2(size), 64)
    dropped_row_sums_kernel[(triton.cdiv(size, block_h), 2)](
        hidden, *hidden.stride(), target_ids, nll_ids, out, seq, size, batch // 2 * seq,
        BLOCK_T=64, BLOCK_H=block_h, num_warps=4,
    )
    return out
