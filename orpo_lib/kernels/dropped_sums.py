"""Dropped rows' sums: per half of the batch (chosen, rejected), the float32 sum of the rows of hidden whose
tokens no target needs. Their logits are needed only in their sum over the vocabulary (the logit-mean
metrics), which is linear in the row: the sum row stands for them all (``chunked.dropped``). One launch, where a
masked product in torch is some seven small ops.
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
    out_ptr,  # (2, SPLITS, H) float32 out (float64 for float64 inputs): per half, each split's sum
    T,
    H,
    half_tokens,  # B/2 * T
    SPLIT_TOKENS: tl.constexpr,  # tokens of a half per program
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    half, split = tl.program_id(1), tl.program_id(2)
    in_cols = cols < H
    acc_dtype = out_ptr.dtype.element_ty  # float32, or float64 for float64 inputs
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=acc_dtype)
    end = tl.minimum((split + 1) * SPLIT_TOKENS, half_tokens)
    for start in range(split * SPLIT_TOKENS, end, BLOCK_T):
        t = half * half_tokens + start + tl.arange(0, BLOCK_T)
        in_half = start + tl.arange(0, BLOCK_T) < end
        dropped = in_half & (tl.load(target_ids_ptr + t, mask=in_half, other=0) < 0) & (
            tl.load(nll_ids_ptr + t, mask=in_half, other=0) < 0)
        rows = hidden_ptr + (t // T).to(tl.int64) * stride_b + (t % T).to(tl.int64) * stride_t
        acc += tl.load(rows[:, None] + cols[None, :] * stride_h, mask=dropped[:, None] & in_cols[None, :],
                       other=0.0).to(acc_dtype)  # only dropped rows are read
    tl.store(out_ptr + (half * tl.num_programs(2) + split) * H + cols, tl.sum(acc, axis=0), mask=in_cols)


# Tokens of a half per program: a long half is split, so that enough programs share it (each split's sum is
# added up after, in order).
SPLIT_TOKENS = 2048


def dropped_row_sums(hidden, target_ids, nll_ids):
    """(2, H) float32 (float64 for float64 inputs): per half, the sum of the rows of hidden (B, T, H) whose
    tokens neither id tensor (B, T) int32 counts (-1)."""
    batch, seq, size = hidden.shape
    half_tokens = batch // 2 * seq
    splits = triton.cdiv(half_tokens, SPLIT_TOKENS)
    out = hidden.new_empty(2, splits, size, dtype=torch.promote_types(hidden.dtype, torch.float32))
    block_h = min(triton.next_power_of_2(size), 64)
    dropped_row_sums_kernel[(triton.cdiv(size, block_h), 2, splits)](
        hidden, *hidden.stride(), target_ids, nll_ids, out, seq, size, half_tokens,
        SPLIT_TOKENS=SPLIT_TOKENS, BLOCK_T=64, BLOCK_H=block_h, num_warps=4,
    )
    return out[:, 0] if splits == 1 else out.sum(1)
