"""Row gradients: once the pair coefficients are known, one program per row rewrites its logits in
place into dL/dlogits (one read, one write).

The target columns are set from the precise log-probs that ``row_stats_kernel`` saved, so nothing
cancels when p ≈ 1. The kernel needs only the row's saved log-sum-exp, so it serves as well logits
recomputed in a second pass.

``row_logp_grads`` runs the same kernel before the pair coefficients are known: it writes
d log p(y) / dlogits = onehot(y) - P (0 where the token does not count), which the one-pass schedule
scales by its sequence's coefficient only after the GEMMs.
"""

from .. import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

import triton
import triton.language as tl

from ..logit_transform import IDENTITY, LogitTransform
from .numerics import expm1, model_logits, model_logits_args, model_logits_flags
from .row_layout import RowLaunch, block_v, rows_of, this_row


@triton.jit
def target_columns(grad, cols, target, nll_target, target_grad, nll_grad):
    # the two target columns of a block of G; the target's last, as it holds the y' = y case
    grad = tl.where(cols == nll_target, nll_grad, grad)
    return tl.where(cols == target, target_grad, grad)


@triton.jit
def row_grads_kernel(
    logits_ptr,  # (C, V) chunk of logits, rewritten in place into dL/dlogits
    stride_row,
    target_ptr,  # (C,) int32 odds-ratio target id, -1 where ignored
    nll_target_ptr,  # (C,) int32 NLL target id, -1 where ignored
    token_ptr,  # (C,) int64 index of each row in the flattened (B*T) per-token arrays
    logp_ptr,  # (B*T,) fp32 log p(target), from row_stats_kernel
    nll_logp_ptr,  # (B*T,) fp32 log p(nll target)
    lse_ptr,  # (B*T,) fp32 log-sum-exp of each row (fp64 for float64 inputs, like the two above)
    seq_coef_ptr,  # (B,) fp32 dL/dlogp of each odds-ratio token of the sequence
    nll_tokens,  # NLL tokens in the batch: each one's dL/dlogp is -1 / nll_tokens (an int, exact in any dtype)
    seq_len,
    V,  # at least BLOCK_V
    inner, inner_rest, outer, outer_rest,  # the model's logits from the head's x (numerics.model_logits)
    BLOCK_V: tl.constexpr,
    LOGP_GRAD: tl.constexpr,  # True: a = 1 and no NLL term (d log p(y) / dlogits); seq_coef is not read
    SCALED: tl.constexpr,
    SOFTCAPPED: tl.constexpr,
):
    row_ptr, target, nll_target, token = this_row(tl.program_id(0), logits_ptr, stride_row, target_ptr,
                                                  nll_target_ptr, token_ptr)
    acc = lse_ptr.dtype.element_ty
    # G = a·onehot(y) + b·onehot(y') - s·P with a = dL/dlogp(y), b = dL/dlogp(y'), s = a + b, for the
    # model's logits; the head's output gets G times their slope (the chain rule).
    if LOGP_GRAD:
        nll_target = tl.full((), -1, tl.int32)
        a = tl.where(target >= 0, tl.full((), 1.0, acc), 0.0)
    else:
        a = tl.where(target >= 0, tl.load(seq_coef_ptr + token // seq_len), 0.0)
    b = tl.where(nll_target >= 0, tl.full((), -1.0, acc) / nll_tokens, 0.0)
    s = a + b
    # The target columns from expm1(log p) = p - 1, so that nothing cancels when p ≈ 1:
    # G[y] = a - s·p_y = -(s·expm1(log p_y) + b), or -s·expm1(log p_y) when y' = y (then a + b = s);
    # G[y'] = -(s·expm1(log p_y') + a).
    target_grad = -(s * expm1(tl.load(logp_ptr + token)) + tl.where(nll_target == target, 0.0, b))
    nll_grad = -(s * expm1(tl.load(nll_logp_ptr + token)) + a)
    lse = tl.load(lse_ptr + token)
    neg_s = -s
    out_dtype = logits_ptr.dtype.element_ty

    # Whole blocks without masks (only a block holding a target compares columns), then the tail.
    offs = tl.arange(0, BLOCK_V)
    tail = V // BLOCK_V * BLOCK_V
    for start in range(0, tail, BLOCK_V):
        logit, slope = model_logits(tl.load(row_ptr + start + offs).to(acc), inner, inner_rest, outer, outer_rest,
                                    SCALED, SOFTCAPPED)
        grad = neg_s * tl.exp(logit - lse)
        if ((target >= start) & (target < start + BLOCK_V)) | ((nll_target >= start) & (nll_target < start + BLOCK_V)):
            grad = target_columns(grad, start + offs, target, nll_target, target_grad, nll_grad)
        tl.store(row_ptr + start + offs, (grad * slope).to(out_dtype))
    cols = tail + offs
    in_row = cols < V
    logit, slope = model_logits(tl.load(row_ptr + cols, mask=in_row, other=0.0).to(acc), inner, inner_rest, outer,
                                outer_rest, SCALED, SOFTCAPPED)
    grad = target_columns(neg_s * tl.exp(logit - lse), cols, target, nll_target, target_grad, nll_grad)
    tl.store(row_ptr + cols, (grad * slope).to(out_dtype), mask=in_row)


# Chosen from the H200 launch sweeps in figures/data (notebooks/04-kernel-tuning.ipynb).
GRADS_LAUNCH = RowLaunch(block_v=8192, num_warps=16)


def row_grads(logits, target, nll_target, token, logp, nll_logp, lse, seq_coef, *, nll_tokens: int, seq_len: int,
              transform: LogitTransform = IDENTITY, launch: RowLaunch = GRADS_LAUNCH) -> None:
    """Launch ``row_grads_kernel``: every row of ``logits`` (the head's output) rewritten into dL/dlogits of the
    head, for the model's logits ``transform`` of it (``nll_tokens``: the NLL term's normaliser; rows without an
    NLL target, -1, ignore it)."""
    rows, vocab = rows_of(logits)
    row_grads_kernel[(rows,)](
        logits, logits.stride(0), target, nll_target, token, logp, nll_logp, lse, seq_coef, nll_tokens, seq_len, vocab,
        *model_logits_args(transform), BLOCK_V=block_v(vocab, launch), LOGP_GRAD=False,
        **model_logits_flags(transform), num_warps=launch.num_warps,
    )


def row_logp_grads(logits, target, token, logp, lse, *, transform: LogitTransform = IDENTITY,
                   launch: RowLaunch = GRADS_LAUNCH) -> None:
    """Launch ``row_grads_kernel`` with ``LOGP_GRAD``: every row of ``logits`` rewritten into
    d log p(target) / dlogits = onehot(target) - softmax (times the transform's slope), or 0 where the target is -1."""
    rows, vocab = rows_of(logits)
    # LOGP_GRAD reads no NLL target, coefficient, NLL count or sequence length: the target's and 1s stand in
    row_grads_kernel[(rows,)](
        logits, logits.stride(0), target, target, token, logp, logp, lse, lse, 1, 1, vocab,
        *model_logits_args(transform), BLOCK_V=block_v(vocab, launch), LOGP_GRAD=True,
        **model_logits_flags(transform), num_warps=launch.num_warps,
    )
