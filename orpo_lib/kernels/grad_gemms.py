"""The gradient GEMMs reading the logits: dX = G·W and dW = Gᵀ·X with G formed tile by tile in registers.

G = a·onehot(y) + b·onehot(y') - s·softmax(z), s = a + b, depends on a row's logits z only through
exp(z - lse): each GEMM loads a tile of logits, turns it into G with the row's log-sum-exp and three
per-row numbers, rounds it to the inputs' dtype as a stored G would be, and feeds it to ``tl.dot``
(on Hopper a wgmma whose A operand comes from registers). No pass then rewrites the logits into G,
which costs one read and one write of every logit (4 of the 6 bytes per logit the row kernels move,
and at H = 1024 about 10 % of the three GEMMs' time), and the logits stay as they are, so that a
second backward could read them again. The price is one exp per logit per output tile of 256 columns
in each GEMM: 2·256 multiply-adds per exp, half the exp unit's rate at the tensor cores' (Hopper).

``row_coefficients_kernel`` writes the per-row numbers once per block of rows: lse, -s, and the values
of the two target columns, set from the precise log-probs as ``row_grads_kernel`` sets them, so that
nothing cancels when p ≈ 1. ``scale`` (a device scalar, e.g. backward's upstream gradient) multiplies
each result before its one rounding.

Not used by the loss yet: whether these beat ``row_grads`` + cuBLAS on a GPU is what
``python -m orpo_lib.workbook.bench --sweeps grad_gemms`` measures, one chunk's parts timed alone.
"""

from .. import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

import torch
import triton
import triton.language as tl

from .._triton_mode import INTERPRET
from .numerics import expm1
from .offline_compile import compile_kernel

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x·log2 e), which is what the hardware has
COEFS = ("lse", "neg_s", "target_grad", "nll_grad")  # row_coefficients_kernel's outputs, in row order


@triton.jit
def row_coefficients_kernel(
    target_ptr,  # (C,) int32 odds-ratio target id of each row, -1 where ignored
    nll_target_ptr,  # (C,) int32 NLL target id, -1 where ignored
    token_ptr,  # (C,) int64 index of each row among the B*T tokens
    logp_ptr, nll_logp_ptr, lse_ptr,  # (B*T,) from row_stats_kernel
    seq_coef_ptr,  # (B,) dL/dlogp of each odds-ratio token of the sequence
    coef_ptr,  # (4, C) out, in row order: COEFS
    nll_tokens,  # the NLL term's normaliser (an int, exact in any dtype)
    seq_len,
    C,
    BLOCK: tl.constexpr,
    LOGP_GRAD: tl.constexpr,  # True: a = 1 and no NLL term, G = d log p(y) / dlogits
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_rows = rows < C
    target = tl.load(target_ptr + rows, mask=in_rows, other=-1)
    token = tl.load(token_ptr + rows, mask=in_rows, other=0)
    acc = lse_ptr.dtype.element_ty
    if LOGP_GRAD:
        nll_target = tl.full([BLOCK], -1, tl.int32)
        a = tl.where(target >= 0, 1.0, 0.0).to(acc)
    else:
        nll_target = tl.load(nll_target_ptr + rows, mask=in_rows, other=-1)
        a = tl.where(target >= 0, tl.load(seq_coef_ptr + token // seq_len, mask=in_rows, other=0.0), 0.0)
    b = tl.where(nll_target >= 0, tl.full([BLOCK], -1.0, acc) / nll_tokens, 0.0)
    s = a + b
    # as row_grads_kernel: G[y] = -(s·expm1(log p_y) + b) (b dropped when y' = y), G[y'] = -(s·expm1(log p_y') + a)
    logp = tl.load(logp_ptr + token, mask=in_rows, other=0.0)
    nll_logp = tl.load(nll_logp_ptr + token, mask=in_rows, other=0.0)
    target_grad = -(s * expm1(logp) + tl.where(nll_target == target, 0.0, b))
    nll_grad = -(s * expm1(nll_logp) + a)
    tl.store(coef_ptr + rows, tl.load(lse_ptr + token, mask=in_rows, other=0.0), mask=in_rows)
    tl.store(coef_ptr + C + rows, -s, mask=in_rows)
    tl.store(coef_ptr + 2 * C + rows, target_grad, mask=in_rows)
    tl.store(coef_ptr + 3 * C + rows, nll_grad, mask=in_rows)


@triton.jit
def _row_values(coef_ptr, target_ptr, nll_target_ptr, rows, in_rows, C):
    lse = tl.load(coef_ptr + rows, mask=in_rows, other=0.0)
    neg_s = tl.load(coef_ptr + C + rows, mask=in_rows, other=0.0)
    target_grad = tl.load(coef_ptr + 2 * C + rows, mask=in_rows, other=0.0)
    nll_grad = tl.load(coef_ptr + 3 * C + rows, mask=in_rows, other=0.0)
    target = tl.load(target_ptr + rows, mask=in_rows, other=-1)
    nll_target = tl.load(nll_target_ptr + rows, mask=in_rows, other=-1)
    return lse, neg_s, target_grad, nll_grad, target, nll_target


@triton.jit
def _grad_tile(z, cols, lse, neg_s, target_grad, nll_grad, target, nll_target):
    # G of a (rows, columns) tile of logits; the target's column last, as it holds the y' = y case.
    if lse.dtype == tl.float64:
        g = neg_s[:, None] * tl.exp(z.to(tl.float64) - lse[:, None])
    else:
        g = neg_s[:, None] * tl.exp2(z.to(tl.float32) * LOG2E - lse[:, None] * LOG2E)
    g = tl.where(cols[None, :] == nll_target[:, None], nll_grad[:, None], g)
    return tl.where(cols[None, :] == target[:, None], target_grad[:, None], g)


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr):
    if a.dtype.primitive_bitwidth == 16:
        if UPCAST:  # the interpreter's bf16 arithmetic is wrong: the products in float32 there (exact either way)
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        return tl.dot(a, b, acc)
    # float32 as cuBLAS computes it (no TF32); float64 summed in float64
    return tl.dot(a, b, acc, input_precision="ieee", out_dtype=acc.dtype)


@triton.jit
def _tile_ids(pid, num_m, num_n, GROUP_M: tl.constexpr):
    # grouped order: GROUP_M row blocks advance along N together, sharing the B operand's tiles in L2
    per_group = GROUP_M * num_n
    first_m = pid // per_group * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_m, (pid % per_group) // group_m


@triton.jit
def grad_dx_kernel(
    z_ptr, stride_z,  # (C, V) logits of the block
    w_ptr, stride_w, stride_wh,  # (V, H) weight
    dx_ptr, stride_dx,  # out: dX rows, at out_row of each block row
    out_row_ptr,  # (C,) int64 row of dx for each block row (ROWS_IN_ORDER: row i -> i)
    coef_ptr, target_ptr, nll_target_ptr,  # row_coefficients_kernel's (4, C), the (C,) int32 target ids
    scale_ptr,  # 0-d scale of the result (HAS_SCALE)
    C, H, V,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ROWS_IN_ORDER: tl.constexpr, HAS_SCALE: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_m, pid_n = _tile_ids(tl.program_id(0), tl.cdiv(C, BLOCK_M), tl.cdiv(H, BLOCK_N), GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    in_rows = rows < C
    in_n = offs_n < H
    lse, neg_s, target_grad, nll_grad, target, nll_target = _row_values(coef_ptr, target_ptr, nll_target_ptr, rows,
                                                                         in_rows, C)
    z_ptrs = z_ptr + rows[:, None].to(tl.int64) * stride_z + offs_k[None, :]
    w_ptrs = w_ptr + offs_k[:, None].to(tl.int64) * stride_w + offs_n[None, :] * stride_wh
    acc = tl.zeros([BLOCK_M, BLOCK_N], coef_ptr.dtype.element_ty)  # float32, float64 for float64 inputs
    for k in range(0, tl.cdiv(V, BLOCK_K)):
        cols = k * BLOCK_K + offs_k
        in_k = cols < V
        z = tl.load(z_ptrs, mask=in_rows[:, None] & in_k[None, :], other=float("-inf"))  # exp(-inf) = 0
        w = tl.load(w_ptrs, mask=in_k[:, None] & in_n[None, :], other=0.0)
        g = _grad_tile(z, cols, lse, neg_s, target_grad, nll_grad, target, nll_target)
        acc = _dot(g.to(w.dtype), w, acc, UPCAST)
        z_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_w
    if HAS_SCALE:
        acc *= tl.load(scale_ptr)
    out_rows = rows if ROWS_IN_ORDER else tl.load(out_row_ptr + rows, mask=in_rows, other=0)
    out = dx_ptr + out_rows[:, None].to(tl.int64) * stride_dx + offs_n[None, :]
    tl.store(out, acc.to(dx_ptr.dtype.element_ty), mask=in_rows[:, None] & in_n[None, :])


@triton.jit
def grad_dw_kernel(
    z_ptr, stride_z,  # (C, V) logits of the block
    x_ptr, stride_x, stride_xh,  # hidden rows: x_row of each block row
    x_row_ptr,  # (C,) int64 row of x for each block row (ROWS_IN_ORDER: row i -> i)
    dw_ptr, stride_dw,  # (V, H) out, or added to (ACCUMULATE)
    db_ptr,  # (V,) added to: the bias gradient, the sum of G's rows (HAS_BIAS)
    coef_ptr, target_ptr, nll_target_ptr,
    scale_ptr,
    C, H, V,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ROWS_IN_ORDER: tl.constexpr, HAS_SCALE: tl.constexpr, UPCAST: tl.constexpr, ACCUMULATE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    # a tile of dW: vocabulary rows offs_m, hidden columns offs_n, summed over the block's rows k
    pid_m, pid_n = _tile_ids(tl.program_id(0), tl.cdiv(V, BLOCK_M), tl.cdiv(H, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    in_m = offs_m < V
    in_n = offs_n < H
    acc = tl.zeros([BLOCK_M, BLOCK_N], coef_ptr.dtype.element_ty)  # float32, float64 for float64 inputs
    bias_acc = tl.zeros([BLOCK_M], coef_ptr.dtype.element_ty)
    for k in range(0, tl.cdiv(C, BLOCK_K)):
        rows = k * BLOCK_K + offs_k
        in_rows = rows < C
        lse, neg_s, target_grad, nll_grad, target, nll_target = _row_values(coef_ptr, target_ptr, nll_target_ptr,
                                                                             rows, in_rows, C)
        x_rows = rows if ROWS_IN_ORDER else tl.load(x_row_ptr + rows, mask=in_rows, other=0)
        z = tl.load(z_ptr + rows[:, None].to(tl.int64) * stride_z + offs_m[None, :],
                    mask=in_rows[:, None] & in_m[None, :], other=float("-inf"))
        x = tl.load(x_ptr + x_rows[:, None].to(tl.int64) * stride_x + offs_n[None, :] * stride_xh,
                    mask=in_rows[:, None] & in_n[None, :], other=0.0)
        g = _grad_tile(z, offs_m, lse, neg_s, target_grad, nll_grad, target, nll_target).to(x.dtype)
        acc = _dot(tl.trans(g), x, acc, UPCAST)
        if HAS_BIAS:
            bias_acc += tl.sum(g.to(bias_acc.dtype), axis=0)
    if HAS_SCALE:
        scale = tl.load(scale_ptr)
        acc *= scale
        bias_acc *= scale
    out = dw_ptr + offs_m[:, None].to(tl.int64) * stride_dw + offs_n[None, :]
    mask = in_m[:, None] & in_n[None, :]
    if ACCUMULATE:
        acc += tl.load(out, mask=mask, other=0.0)
    tl.store(out, acc.to(dw_ptr.dtype.element_ty), mask=mask)
    if HAS_BIAS:
        bias_mask = in_m & (pid_n == 0)  # one column of tiles adds the bias gradient
        bias_acc += tl.load(db_ptr + offs_m, mask=bias_mask, other=0.0)
        tl.store(db_ptr + offs_m, bias_acc.to(db_ptr.dtype.element_ty), mask=bias_mask)


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) for 16-bit inputs on the GPU, both GEMMs. 128×256 tiles:
# two warpgroups each hold a 64×256 float32 accumulator (255 registers, none spilled for dX at sm_90a; the
# dW kernel with a float32 sum and the bias spills 184 bytes), and each G element formed feeds 2·256 FLOPs.
GPU_LAUNCH = (128, 256, 64, 8, 3)
# float32 and float64 operands: a tile that fits the registers and shared memory (these are not the fast path)
WIDE_LAUNCH = (64, 64, 32, 4, 2)
INTERPRETER_LAUNCH = (128, 128, 128, 4, 1)  # few, large blocks: the interpreter pays per op, not per element
COEF_BLOCK = 256


def row_coefficients(target, nll_target, token, logp, nll_logp, lse, seq_coef, *, nll_tokens: int, seq_len: int,
                     logp_grad: bool = False) -> torch.Tensor:
    """(4, C) in the statistics dtype, the COEFS of each row of a block (``logp_grad``: of d log p(y) / dlogits)."""
    rows = target.shape[0]
    coefs = torch.empty(len(COEFS), rows, device=target.device, dtype=lse.dtype)
    if rows:
        row_coefficients_kernel[(triton.cdiv(rows, COEF_BLOCK),)](
            target, nll_target, token, logp, nll_logp, lse, seq_coef, coefs, nll_tokens, seq_len, rows,
            BLOCK=COEF_BLOCK, LOGP_GRAD=logp_grad,
        )
    return coefs


def _tiles(dtype):
    if INTERPRET:
        return INTERPRETER_LAUNCH
    return GPU_LAUNCH if dtype.itemsize == 2 else WIDE_LAUNCH


def _dx_launch(logits, weight, coefs, target, nll_target, dx, out_rows, scale):
    rows, vocab = logits.shape
    size = weight.shape[1]
    bm, bn, bk, warps, stages = _tiles(logits.dtype)
    grid = (triton.cdiv(rows, bm) * triton.cdiv(size, bn),)
    args = (logits, logits.stride(0), weight, weight.stride(0), weight.stride(1), dx, dx.stride(0),
            out_rows if out_rows is not None else dx, coefs, target, nll_target, scale if scale is not None else coefs,
            rows, size, vocab)
    opts = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, ROWS_IN_ORDER=out_rows is None,
                HAS_SCALE=scale is not None, UPCAST=INTERPRET, num_warps=warps, num_stages=stages)
    return grid, args, opts


def _dw_launch(logits, x, coefs, target, nll_target, dw, x_rows, db, accumulate, scale):
    rows, vocab = logits.shape
    size = x.shape[1]
    bm, bn, bk, warps, stages = _tiles(logits.dtype)
    grid = (triton.cdiv(vocab, bm) * triton.cdiv(size, bn),)
    args = (logits, logits.stride(0), x, x.stride(0), x.stride(1), x_rows if x_rows is not None else x, dw,
            dw.stride(0), db if db is not None else dw, coefs, target, nll_target,
            scale if scale is not None else coefs, rows, size, vocab)
    opts = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, ROWS_IN_ORDER=x_rows is None,
                HAS_SCALE=scale is not None, UPCAST=INTERPRET, ACCUMULATE=accumulate, HAS_BIAS=db is not None,
                num_warps=warps, num_stages=stages)
    return grid, args, opts


def grad_dx(logits, weight, coefs, target, nll_target, dx, *, out_rows=None, scale=None) -> None:
    """dx[out_rows] = scale · G·W (rows in order without ``out_rows``), each element rounded once."""
    if logits.shape[0]:
        grid, args, opts = _dx_launch(logits, weight, coefs, target, nll_target, dx, out_rows, scale)
        grad_dx_kernel[grid](*args, **opts)


def grad_dw(logits, x, coefs, target, nll_target, dw, *, x_rows=None, db=None, accumulate=False, scale=None) -> None:
    """dw (+)= scale · Gᵀ·x[x_rows] (+= with ``accumulate``) and db += scale · Σ G (rows in order without
    ``x_rows``). ``dw`` (V, 1) with ``x`` a column of ones is the bias gradient alone."""
    grid, args, opts = _dw_launch(logits, x, coefs, target, nll_target, dw, x_rows, db, accumulate, scale)
    grad_dw_kernel[grid](*args, **opts)


def compile_for_target(gemm="dx", *, target=None):
    """Compile ``grad_dx_kernel`` (``gemm="dx"``) or ``grad_dw_kernel`` (float32 sum, bias) for bf16 with the GPU
    tiles, without a GPU (``offline_compile.compile_kernel``: needs TRITON_INTERPRET=0 when the kernels were
    defined)."""
    rows, size, vocab = 1024, 512, 2048  # runtime arguments, specialised only on divisibility by 16, as real shapes are
    logits = torch.empty(rows, vocab, dtype=torch.bfloat16)
    coefs = torch.empty(len(COEFS), rows)
    ids = torch.empty(rows, dtype=torch.int32)
    rows_of = torch.empty(rows, dtype=torch.int64)
    if gemm == "dx":
        kernel = grad_dx_kernel
        _, args, opts = _dx_launch(logits, torch.empty(vocab, size, dtype=torch.bfloat16), coefs, ids, ids,
                                   torch.empty(rows, size, dtype=torch.bfloat16), rows_of, torch.empty(()))
    else:
        kernel = grad_dw_kernel
        _, args, opts = _dw_launch(logits, torch.empty(rows, size, dtype=torch.bfloat16), coefs, ids, ids,
                                   torch.empty(vocab, size), None, torch.empty(vocab), True, torch.empty(()))
    return compile_kernel(kernel, args, opts, target)
