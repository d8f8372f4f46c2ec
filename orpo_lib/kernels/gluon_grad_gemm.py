"""dX = G·W with the gradient G formed from the logits as the GEMM loads them (Gluon, Hopper): no pass
rewrites the logits buffer into G.

For a row with log-sum-exp ``lse``, coefficient ``s`` and target columns y, y' (``row_grads.row_coefficients``),
G = -s·P off the two target columns and G[y], G[y'] on them, P = exp(z - lse). The K loop (K is the vocabulary)
takes each (64 rows × 64 columns) tile of logits from shared memory into the registers of the warpgroup that
multiplies it, forms P there (one exp2 per element, exp2(z·log2 e - lse·log2 e), no comparison) and hands it to
``warpgroup_mma`` as its register A operand against W's (64 × BLOCK_N) tile in shared memory. After the loop the
target columns' P comes back out exactly (diag(-P[y]) times W's rows at y, gathered into shared memory: bf16
products, summed in float32), each row is scaled by -s, and G at the target columns comes in at its exact value
(expm1 of the saved log-probs, as ``row_grads_kernel`` writes it; one more such wgmma per column). G is rounded
once, to the inputs' dtype, as the buffer path rounds it; the scale -s is applied in float32.

Two partitions, one MMA warpgroup each: each takes 64 of a tile's 128 rows, and they share its W tile; warpgroup
0 also issues the TMA loads of a 3-stage ring of (128 × 64) logits tiles and (64 × BLOCK_N) W tiles, two steps
ahead of the step both multiply. (A producer partition of its own would make 12 warps, which launch at 168
registers at most, and ptxas then serialises the register-operand wgmmas.) The grid is persistent over (128 ×
BLOCK_N) output tiles in grouped order (``gluon_pipeline.tile_coords``), so that concurrently running tiles share
logits and W tiles in L2.

The logits buffer is read through a TMA descriptor of V columns on its padded row stride: TMA zero-fills the
columns past V and W's rows past V, so those products add nothing (their P is finite), and rows past C get
P = 0 (their exponent shift is +inf). Every output tile is summed by one warpgroup in a fixed order: the result
is bitwise reproducible. Importing the module launches nothing and needs no GPU.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .gluon_pipeline import (TORCH_TO_GL, accumulator_layout, alloc_barriers, alloc_counting_barriers, check_operand,
                             num_sms, tile_coords)
from .offline_compile import compile_kernel

__all__ = ["BLOCK_N", "check_supported", "compile_for_target", "grad_times_weight", "grad_times_weight_kernel"]

LOG2E = gl.constexpr(1.4426950408889634)


# --------------------------------------------------------------------------------------------------
# Device side
# --------------------------------------------------------------------------------------------------

@gluon.jit
def _load_step(z_desc, w_desc, z_bufs, w_bufs, ready_bars, empty_bars, j, num_pid_m, num_pid_n, k_tiles,
               GROUP_M: gl.constexpr):
    """Issue the TMA loads of the program's K step j (over all its tiles: tile j // k_tiles of its sequence, step
    j % k_tiles of that tile's K loop) into stage j % STAGES, once both warpgroups are done with that stage."""
    STAGES: gl.constexpr = z_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = z_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = z_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[1]
    pid_m, pid_n = tile_coords(gl.program_id(0) + (j // k_tiles) * gl.num_programs(0), num_pid_m, num_pid_n, GROUP_M)
    k = (j % k_tiles) * BLOCK_K
    s = j % STAGES
    # A fresh mbarrier counts as having completed the phase before phase 0: the first STAGES loads go through.
    mbarrier.wait(empty_bars.index(s), ((j // STAGES) & 1) ^ 1)
    bar = ready_bars.index(s)
    mbarrier.expect(bar, z_desc.block_type.nbytes + w_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(z_desc, [pid_m * BLOCK_M, k], bar, z_bufs.index(s))
    tma.async_copy_global_to_shared(w_desc, [k, pid_n * BLOCK_N], bar, w_bufs.index(s))


@gluon.jit
def _softmax_term(z, shift):
    # P = exp(z - lse) = exp2(z·log2 e - lse·log2 e), rounded to the inputs' dtype: in the K loop and again for
    # the target columns after it, the same instructions, so that the value taken back out is the one added.
    return gl.exp2(gl.fma(z.to(gl.float32), LOG2E, -shift))


@gluon.jit
def _add_target_rows(acc, gather_smem, w_ptr, columns_left, column, value, a_layout: gl.constexpr):
    """acc += diag(value) · W[column, the tile's columns] for the warpgroup's rows (column -1: nothing): W's rows
    at the columns gathered into ``gather_smem`` (64 columns at a time), then one synchronous wgmma with K = the
    warpgroup's rows. ``column`` (int64 offsets into W: row · stride + the tile's first column, -1 for none) is in
    the gather layout, ``value`` in ``a_layout``'s rows."""
    WG_M: gl.constexpr = gather_smem.type.shape[0]
    BLOCK_N: gl.constexpr = gather_smem.type.shape[1]
    SLICE: gl.constexpr = 64
    gather_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16-byte loads along W's rows
    gl.thread_barrier()  # every warp of the group is done with the buffer's previous wgmma
    for j in gl.static_range(BLOCK_N // SLICE):
        n = j * SLICE + gl.arange(0, SLICE, layout=gl.SliceLayout(0, gather_layout))
        w_rows = gl.load(w_ptr + column[:, None] + n[None, :], mask=(column >= 0)[:, None] & (n < columns_left)[None, :],
                         other=0.0)
        gather_smem.slice(j * SLICE, SLICE, dim=1).store(w_rows)
    fence_async_shared()  # the generic-proxy stores before the wgmma's async-proxy reads
    gl.thread_barrier()
    r = gl.arange(0, WG_M, layout=gl.SliceLayout(1, a_layout))
    k = gl.arange(0, WG_M, layout=gl.SliceLayout(0, a_layout))
    diag = gl.where(r[:, None] == k[None, :], value[:, None], 0.0).to(gather_smem.dtype)
    return warpgroup_mma(diag, gather_smem, acc)


@gluon.jit
def _grad_mma_partition(z_desc, w_desc, z_bufs, w_bufs, gather_bufs, ready_bars, empty_bars, z_ptr, stride_z, w_ptr,
                        stride_w, coef_ptr, column_ptr, out_ptr, stride_out, M, N, num_pid_m, num_pid_n, k_tiles,
                        GROUP_M: gl.constexpr, WG: gl.constexpr):
    """MMA warpgroup WG: rows WG·64 to WG·64 + 63 of each (128 × BLOCK_N) tile of dX. Warpgroup 0 also issues the
    loads, STAGES - 1 steps ahead of the step both multiply."""
    STAGES: gl.constexpr = z_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = z_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = w_bufs.type.shape[2]
    WG_M: gl.constexpr = BLOCK_M // 2
    mma_layout: gl.constexpr = accumulator_layout(BLOCK_N)
    # P as wgmma's register operand: 16-bit elements, two per 32-bit register
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    a_row_layout: gl.constexpr = gl.SliceLayout(1, a_layout)
    gather_row_layout: gl.constexpr = gl.SliceLayout(1, gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))
    c_row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    c_col_layout: gl.constexpr = gl.SliceLayout(0, mma_layout)
    gather_smem = gather_bufs.index(WG)
    num_tiles = num_pid_m * num_pid_n
    steps = gl.cdiv(num_tiles - gl.program_id(0), gl.num_programs(0)) * k_tiles  # this program's K steps
    if WG == 0:
        for j in range(gl.minimum(STAGES - 1, steps)):
            _load_step(z_desc, w_desc, z_bufs, w_bufs, ready_bars, empty_bars, j, num_pid_m, num_pid_n, k_tiles,
                       GROUP_M)
    it = 0  # k-steps consumed so far, over all this program's tiles: stage = it % STAGES
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        first_row = pid_m * BLOCK_M + WG * WG_M
        off_n = pid_n * BLOCK_N
        rows = first_row + gl.arange(0, WG_M, layout=a_row_layout)
        in_rows = rows < M
        shift = gl.load(coef_ptr + rows, mask=in_rows, other=float("inf"))
        # The K loop: acc = P·W over every column, the target columns' included.
        acc = gl.zeros((WG_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
        for ki in range(k_tiles):
            s = it % STAGES
            mbarrier.wait(ready_bars.index(s), (it // STAGES) & 1)
            z = z_bufs.index(s).slice(WG * WG_M, WG_M, dim=0).load(a_layout)
            p = _softmax_term(z, shift[:, None]).to(z_bufs.dtype)
            # While this step's wgmma runs, the next step's P is formed; waiting with one group outstanding
            # means the previous step's is done with its stage, which goes back to the producer.
            acc = warpgroup_mma(p, w_bufs.index(s), acc, is_async=True)
            acc, p = warpgroup_mma_wait(num_outstanding=1, deps=(acc, p))
            mbarrier.arrive(empty_bars.index((it + STAGES - 1) % STAGES), pred=ki > 0)
            if WG == 0:  # into the stage just freed (once the other warpgroup has freed it too)
                if it + STAGES - 1 < steps:
                    _load_step(z_desc, w_desc, z_bufs, w_bufs, ready_bars, empty_bars, it + STAGES - 1, num_pid_m,
                               num_pid_n, k_tiles, GROUP_M)
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty_bars.index((it + STAGES - 1) % STAGES))  # the last step's stage (k_tiles >= 1)

        # The target columns: their P taken back out exactly (bf16 products, summed in float32), the rows
        # scaled by -s, then G at the columns added, rounded once as the buffer path rounds it.
        g_rows = first_row + gl.arange(0, WG_M, layout=gather_row_layout)
        for c in gl.static_range(2):
            column = gl.load(column_ptr + c * M + rows, mask=in_rows, other=-1)
            z_t = gl.load(z_ptr + rows.to(gl.int64) * stride_z + column, mask=column >= 0, other=0.0)
            p_t = gl.where(column >= 0, _softmax_term(z_t, shift).to(z_bufs.dtype), 0.0)
            g_column = gl.load(column_ptr + c * M + g_rows, mask=g_rows < M, other=-1)
            w_at = gl.where(g_column >= 0, g_column.to(gl.int64) * stride_w + off_n, -1)
            acc = _add_target_rows(acc, gather_smem, w_ptr, N - off_n, w_at, -p_t, a_layout)
        c_rows = first_row + gl.arange(0, WG_M, layout=c_row_layout)
        acc = acc * gl.load(coef_ptr + M + c_rows, mask=c_rows < M, other=0.0)[:, None]
        for c in gl.static_range(2):
            g_column = gl.load(column_ptr + c * M + g_rows, mask=g_rows < M, other=-1)
            w_at = gl.where(g_column >= 0, g_column.to(gl.int64) * stride_w + off_n, -1)
            g_t = gl.load(coef_ptr + (2 + c) * M + rows, mask=in_rows, other=0.0)
            acc = _add_target_rows(acc, gather_smem, w_ptr, N - off_n, w_at, g_t, a_layout)
        # The tile's store, once per K loop over the whole vocabulary: straight from the accumulator's layout.
        c_cols = off_n + gl.arange(0, BLOCK_N, layout=c_col_layout)
        out = out_ptr + c_rows.to(gl.int64)[:, None] * stride_out + c_cols[None, :]
        gl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(c_rows < M)[:, None] & (c_cols < N)[None, :])


@gluon.jit(do_not_specialize=["M", "N", "K"])
def grad_times_weight_kernel(z_desc, z_ptr, stride_z, w_desc, w_ptr, stride_w, coef_ptr, column_ptr, out_ptr,
                             stride_out, M, N, K,
                             STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    BLOCK_M: gl.constexpr = z_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = z_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[1]
    z_bufs = gl.allocate_shared_memory(z_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], z_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_K, BLOCK_N], w_desc.layout)
    # one per warpgroup: W's rows at its 64 rows' target columns (W's tile layout: the swizzle depends on the rows' width)
    gather_bufs = gl.allocate_shared_memory(w_desc.dtype, [2, BLOCK_M // 2, BLOCK_N], w_desc.layout)
    ready_bars = alloc_barriers(STAGES)  # warpgroup 0's expect (+ tx bytes)
    empty_bars = alloc_counting_barriers(STAGES, 2)  # both warpgroups' releases
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    # Two partitions, one MMA warpgroup each (the default is the kernel's 4 warps). No producer partition: with one,
    # the kernel launches 12 warps at 168 registers at most, and ptxas serialises the register-operand wgmmas.
    gl.warp_specialize([
        (_grad_mma_partition, (z_desc, w_desc, z_bufs, w_bufs, gather_bufs, ready_bars, empty_bars, z_ptr, stride_z,
                               w_ptr, stride_w, coef_ptr, column_ptr, out_ptr, stride_out, M, N, num_pid_m, num_pid_n,
                               k_tiles, GROUP_M, 0)),
        (_grad_mma_partition, (z_desc, w_desc, z_bufs, w_bufs, gather_bufs, ready_bars, empty_bars, z_ptr, stride_z,
                               w_ptr, stride_w, coef_ptr, column_ptr, out_ptr, stride_out, M, N, num_pid_m, num_pid_n,
                               k_tiles, GROUP_M, 1)),
    ], [4], [256])


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------

# 128 rows (64 per warpgroup) × 256 columns of dX per tile, 64 vocabulary entries per K step, 3 stages:
# 3 × (16 + 32) KiB of ring and 2 × 32 KiB of gather buffers, 208 KiB of shared memory in all. One exp2
# per element of P per tile: 1 per 512 FLOPs of the GEMM at BLOCK_N = 256.
BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M = 128, 256, 64, 3, 8


def check_supported(logits, weight, out) -> None:
    """Raise ValueError unless this kernel can take these operands: logits (C, V) and weight (V, H) both bf16 or
    fp16, out (C, H) float32 or the inputs' dtype, each addressable by TMA."""
    if logits.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != logits.dtype:
        raise ValueError(f"grad_times_weight: logits and weight must both be bfloat16 or float16, got {logits.dtype} "
                         f"and {weight.dtype}")
    if logits.dim() != 2 or weight.dim() != 2 or logits.shape[1] != weight.shape[0]:
        raise ValueError(f"grad_times_weight: need logits (C, V) and weight (V, H), got {tuple(logits.shape)} and "
                         f"{tuple(weight.shape)}")
    rows, hidden = logits.shape[0], weight.shape[1]
    if out.dtype not in (torch.float32, logits.dtype) or tuple(out.shape) != (rows, hidden):
        raise ValueError(f"grad_times_weight: out must be {(rows, hidden)} float32 or {logits.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    # TMA reads logits and W: each row stride 16-byte aligned (the logits buffer's padded rows are; W's need H a
    # multiple of 8). V may be anything: TMA zero-fills past it. out is stored from registers.
    if min(rows, hidden, weight.shape[0]) < 1 or hidden % 8:
        raise ValueError(f"grad_times_weight: need C, V >= 1 and H a multiple of 8 (TMA reads W's rows), got "
                         f"C={rows} V={weight.shape[0]} H={hidden}")
    check_operand("grad_times_weight", "logits", logits)
    check_operand("grad_times_weight", "weight", weight)
    if out.stride(1) != 1:
        raise ValueError("grad_times_weight: out must have unit column stride")


def _launch_plan(logits, weight, coefficients, columns, out, programs):
    in_gl = TORCH_TO_GL[logits.dtype]
    z_desc = TensorDescriptor.from_tensor(
        logits, [BLOCK_M, BLOCK_K], gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], in_gl))
    w_desc = TensorDescriptor.from_tensor(
        weight, [BLOCK_K, BLOCK_N], gl.NVMMASharedLayout.get_default_for([BLOCK_K, BLOCK_N], in_gl))
    rows, vocab = logits.shape
    hidden = weight.shape[1]
    tiles = -(-rows // BLOCK_M) * -(-hidden // BLOCK_N)
    grid = (max(1, min(programs, tiles)), )
    # 8 warps: 256 registers each
    args = (z_desc, logits, logits.stride(0), w_desc, weight, weight.stride(0), coefficients, columns, out,
            out.stride(0), rows, hidden, vocab, STAGES, GROUP_M)
    return grid, args, {"num_warps": 4}


def grad_times_weight(logits, weight, coefficients, columns, out, *, num_programs=None):
    """out = G·W for G formed from ``logits`` (C, V) with ``row_grads.grad_coefficients``' (coefficients,
    columns) of its rows; weight (V, H); out (C, H), float32 or the inputs' dtype. Returns out."""
    check_supported(logits, weight, out)
    programs = num_programs or num_sms(logits.device)
    grid, args, opts = _launch_plan(logits, weight, coefficients, columns, out, programs)
    grad_times_weight_kernel[grid](*args, **opts)
    return out


def compile_for_target(*, in_dtype=torch.bfloat16, out_dtype=torch.float32, target=None):
    """Compile ``grad_times_weight_kernel`` to a cubin without a GPU (``offline_compile.compile_kernel``)."""
    rows, vocab, hidden = 1000, 776, 1000
    logits = torch.empty(rows, vocab, dtype=in_dtype)
    weight = torch.empty(vocab, hidden, dtype=in_dtype)
    out = torch.empty(rows, hidden, dtype=out_dtype)
    coefficients = torch.empty(4, rows, dtype=torch.float32)
    columns = torch.empty(2, rows, dtype=torch.int32)
    _, args, opts = _launch_plan(logits, weight, coefficients, columns, out, 132)
    return compile_kernel(grad_times_weight_kernel, args, opts, target)
