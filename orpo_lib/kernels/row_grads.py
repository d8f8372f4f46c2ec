"""Row gradients: once the pair coefficients are known, one program per row rewrites its logits in
place into dL/dlogits (one read, one write).

The target columns are set from the precise log-probs that ``row_stats_kernel`` saved, so nothing
cancels when p ≈ 1. The kernel needs only the row's saved log-sum-exp, so it serves as well logits
recomputed in a second pass.

``row_logp_grads`` runs the same kernel before the pair coefficients are known: it writes
d log p(y) / dlogits = onehot(y) - P (0 where the token does not count), which the one-pass schedule
scales by its sequence's coefficient only after the GEMMs.

``grad_coefficients`` writes, from the same formulas (``row_coefficients``), what a GEMM that forms G as it
loads the logits needs of each row instead of the rewritten buffer (``gluon_grad_gemm``).
"""

from .. import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

import torch
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
def row_coefficients(target, nll_target, token, logp_ptr, nll_logp_ptr, seq_coef_ptr, nll_tokens, seq_len,
                     LOGP_GRAD: tl.constexpr):
    # G = a·onehot(y) + b·onehot(y') - s·P with a = dL/dlogp(y), b = dL/dlogp(y'), s = a + b, for the
    # model's logits; the head's output gets G times their slope (the chain rule). For one row or a block
    # of them; returns (y', a, b, s, G[y], G[y']), y' = -1 under LOGP_GRAD (a = 1, no NLL term).
    acc = logp_ptr.dtype.element_ty
    if LOGP_GRAD:
        nll_target = tl.full(target.shape, -1, tl.int32)
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
    return nll_target, a, b, s, target_grad, nll_grad


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
    nll_target, a, b, s, target_grad, nll_grad = row_coefficients(
        target, nll_target, token, logp_ptr, nll_logp_ptr, seq_coef_ptr, nll_tokens, seq_len, LOGP_GRAD)
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


@triton.jit
def grad_coefficients_kernel(
    target_ptr,  # (C,) int32, as row_grads_kernel's
    nll_target_ptr,
    token_ptr,
    logp_ptr,
    nll_logp_ptr,
    lse_ptr,
    seq_coef_ptr,
    coef_ptr,  # (4, C) fp32 out, per row: lse·log2(e) (+inf where s = 0), -s, G at column 1, G at column 2
    column_ptr,  # (2, C) int32 out, per row: column 1 = y, column 2 = y' unless y' = y (-1: none)
    C,
    nll_tokens,
    seq_len,
    BLOCK: tl.constexpr,
    LOGP_GRAD: tl.constexpr,
):
    # G = -s·P + G[y]·onehot(y) + G[y']·onehot(y') off its two target columns: what a GEMM that forms G
    # from the logits as it loads them (kernels.gluon_grad_gemm) needs of each row.
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_rows = rows < C
    target = tl.load(target_ptr + rows, mask=in_rows, other=-1)
    nll_target = tl.load(nll_target_ptr + rows, mask=in_rows, other=-1)
    token = tl.load(token_ptr + rows, mask=in_rows, other=0)  # row 0's statistics stand in past the end
    nll_target, a, b, s, target_grad, nll_grad = row_coefficients(
        target, nll_target, token, logp_ptr, nll_logp_ptr, seq_coef_ptr, nll_tokens, seq_len, LOGP_GRAD)
    # exp(z - lse) = exp2(z·log2 e - shift); a row without a softmax term (s = 0) gets exp2(-inf) = 0
    shift = tl.where(s != 0, tl.load(lse_ptr + token) * 1.4426950408889634, float("inf"))
    second = tl.where(nll_target == target, -1, nll_target)
    tl.store(coef_ptr + rows, shift, mask=in_rows)
    tl.store(coef_ptr + C + rows, -s, mask=in_rows)
    tl.store(coef_ptr + 2 * C + rows, tl.where(target >= 0, target_grad, 0.0), mask=in_rows)
    tl.store(coef_ptr + 3 * C + rows, tl.where(second >= 0, nll_grad, 0.0), mask=in_rows)
    tl.store(column_ptr + rows, target, mask=in_rows)
    tl.store(column_ptr + C + rows, second, mask=in_rows)


def grad_coefficients(target, nll_target, token, logp, nll_logp, lse, seq_coef, *, nll_tokens: int, seq_len: int,
                      logp_grad: bool = False):
    """Each row's G = -s·P + (its two target columns), as ``row_grads_kernel`` would write it (the identity
    transform), for a GEMM that forms G as it loads the logits: ``(coefficients, columns)``, (4, C) float32
    (lse·log2(e), or +inf where s = 0; -s; G at column 1; G at column 2) and (2, C) int32 (the columns, -1 where
    none; column 2 is y' unless y' = y). ``logp_grad``: d log p(y) / dlogits, as ``row_logp_grads``."""
    rows = target.shape[0]
    coefficients = torch.empty(4, rows, device=target.device, dtype=torch.float32)
    columns = torch.empty(2, rows, device=target.device, dtype=torch.int32)
    if logp_grad:  # no NLL target, coefficient, NLL count or sequence length is read: the target's and 1s stand in
        nll_target, nll_logp, seq_coef, nll_tokens, seq_len = target, logp, lse, 1, 1
    block = 256
    grad_coefficients_kernel[(triton.cdiv(rows, block),)](
        target, nll_target, token, logp, nll_logp, lse, seq_coef, coefficients, columns, rows, nll_tokens, seq_len,
        BLOCK=block, LOGP_GRAD=logp_grad)
    return coefficients, columns
