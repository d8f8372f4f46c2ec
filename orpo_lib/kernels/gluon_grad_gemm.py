"""dX = G·W and dW = Gᵀ·X with the gradient G formed from the logits as the GEMMs load them (Gluon, Hopper): no
pass rewrites the logits buffer into G.

For a row with log-sum-exp ``lse``, coefficient ``s`` and target columns y, y' (``row_grads.row_coefficients``),
G = -s·P off the two target columns and G[y], G[y'] on them, P = exp(z - lse). The K loop (K is the vocabulary)
takes each (64 rows × 64 columns) tile of logits from shared memory into the registers of the warpgroup that
multiplies it, forms P there (one exp2 per element, exp2(z·log2 e - lse·log2 e), no comparison) and hands it to
``warpgroup_mma`` as its register A operand against W's (64 × BLOCK_N) tile in shared memory. After the loop the
target columns' P comes back out exactly (diag(-P[y]) times W's rows at y, gathered into shared memory: bf16
products, summed in float32), each row is scaled by -s, and G at the target columns comes in at its exact value
(expm1 of the saved log-probs, as ``row_grads_kernel`` writes it; one more such wgmma per column). G is rounded
once, to the inputs' dtype, as the buffer path rounds it; the scale -s is applied in float32.

dW = Gᵀ·X (M = V, K = the chunk's rows) reads the same logits tiles transposed (``ldmatrix.trans``) as its register
A operand, -s·P per element (the row scale runs along K there), against the chunk's rows of hidden. Its target
columns are found by column: ``target_pairs`` sorts the (column, row) pairs by column, and each warpgroup takes
back out the G its K loop added at its pairs and adds the exact value, against hidden's rows gathered at them.

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

__all__ = ["BLOCK_N", "check_supported", "check_supported_dw", "compile_for_target", "grad_t_times_hidden",
           "grad_t_times_hidden_kernel", "grad_times_weight", "grad_times_weight_kernel", "target_pairs"]

LOG2E = gl.constexpr(1.4426950408889634)
# Gathered rows (64 × 64 at a time, 16-byte loads along the rows): a warp reads 4 rows of 64 columns
GATHER_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))


# --------------------------------------------------------------------------------------------------
# Device side
# --------------------------------------------------------------------------------------------------

@gluon.jit
def _load_step(a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, j, num_pid_m, num_pid_n, k_tiles,
               GROUP_M: gl.constexpr, A_ROWS_K: gl.constexpr):
    """Issue the TMA loads of the program's K step j (over all its tiles: tile j // k_tiles of its sequence, step
    j % k_tiles of that tile's K loop) into stage j % STAGES, once both warpgroups are done with that stage. B's
    tiles are (BLOCK_K, BLOCK_N); A's (BLOCK_M, BLOCK_K), or with ``A_ROWS_K`` (BLOCK_K, BLOCK_M): the logits read as
    Gᵀ's rows."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1] if A_ROWS_K else a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = b_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    pid_m, pid_n = tile_coords(gl.program_id(0) + (j // k_tiles) * gl.num_programs(0), num_pid_m, num_pid_n, GROUP_M)
    k = (j % k_tiles) * BLOCK_K
    s = j % STAGES
    # A fresh mbarrier counts as having completed the phase before phase 0: the first STAGES loads go through.
    mbarrier.wait(empty_bars.index(s), ((j // STAGES) & 1) ^ 1)
    bar = ready_bars.index(s)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    if A_ROWS_K:
        tma.async_copy_global_to_shared(a_desc, [k, pid_m * BLOCK_M], bar, a_bufs.index(s))
    else:
        tma.async_copy_global_to_shared(a_desc, [pid_m * BLOCK_M, k], bar, a_bufs.index(s))
    tma.async_copy_global_to_shared(b_desc, [k, pid_n * BLOCK_N], bar, b_bufs.index(s))


@gluon.jit
def _softmax_term(z, shift):
    # P = exp(z - lse) = exp2(z·log2 e - lse·log2 e): in the K loop and again for the target columns after it, the
    # same instructions, so that the value taken back out is the one added.
    return gl.exp2(gl.fma(z.to(gl.float32), LOG2E, -shift))


@gluon.jit
def _k_loop(a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, coef_ptr, rows, M, it, steps, num_pid_m,
            num_pid_n, k_tiles, GROUP_M: gl.constexpr, WG: gl.constexpr, TRANSPOSED: gl.constexpr,
            a_layout: gl.constexpr, mma_layout: gl.constexpr):
    """One tile's K loop on warpgroup WG: its (64 × BLOCK_N) accumulator of P·B (dX: rows ``rows`` of the logits, the
    exponent shift per row) or, ``TRANSPOSED``, of Gᵀ·B with G = -s·P (dW: the logits' columns WG·64 onwards of the
    tile, shift and -s per logits row, K). Returns (acc, it), ``it`` the program's K steps consumed so far."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_K: gl.constexpr = b_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = b_bufs.type.shape[2]
    WG_M: gl.constexpr = 64
    if not TRANSPOSED:
        row_shift = gl.load(coef_ptr + rows, mask=rows < M, other=float("inf"))
    acc = gl.zeros((WG_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
    for ki in range(k_tiles):
        s = it % STAGES
        if TRANSPOSED:  # per logits row, along K: its shift and -s (0 past the chunk: there P is 0 too)
            k_rows = ki * BLOCK_K + gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, a_layout))
            shift = gl.load(coef_ptr + k_rows, mask=k_rows < M, other=float("inf"))[None, :]
            neg_s = gl.load(coef_ptr + M + k_rows, mask=k_rows < M, other=0.0)[None, :]
        mbarrier.wait(ready_bars.index(s), (it // STAGES) & 1)
        if TRANSPOSED:
            z = a_bufs.index(s).slice(WG * WG_M, WG_M, dim=1).permute((1, 0)).load(a_layout)
            a = (neg_s * _softmax_term(z, shift)).to(a_bufs.dtype)
        else:
            z = a_bufs.index(s).slice(WG * WG_M, WG_M, dim=0).load(a_layout)
            a = _softmax_term(z, row_shift[:, None]).to(a_bufs.dtype)
        # While this step's wgmma runs, the next step's operand is formed; waiting with one group outstanding
        # means the previous step's is done with its stage, which goes back to the producer.
        acc = warpgroup_mma(a, b_bufs.index(s), acc, is_async=True)
        acc, a = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a))
        mbarrier.arrive(empty_bars.index((it + STAGES - 1) % STAGES), pred=ki > 0)
        if WG == 0:  # into the stage just freed (once the other warpgroup has freed it too)
            if it + STAGES - 1 < steps:
                _load_step(a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, it + STAGES - 1, num_pid_m,
                           num_pid_n, k_tiles, GROUP_M, TRANSPOSED)
        it += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(empty_bars.index((it + STAGES - 1) % STAGES))  # the last step's stage (k_tiles >= 1)
    return acc, it


@gluon.jit
def _first_loads(a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, steps, num_pid_m, num_pid_n, k_tiles,
                 GROUP_M: gl.constexpr, A_ROWS_K: gl.constexpr):
    """The ring's first STAGES - 1 steps, before warpgroup 0's K loops keep it that far ahead."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    for j in range(gl.minimum(STAGES - 1, steps)):
        _load_step(a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, j, num_pid_m, num_pid_n, k_tiles, GROUP_M,
                   A_ROWS_K)


@gluon.jit
def _gather_rows(gather_smem, base_ptr, offsets, columns_left):
    """Rows of a row-major matrix into ``gather_smem`` (64 columns at a time): row k from ``base_ptr + offsets[k]``
    (int64, the row's start plus the tile's first column; -1: a row of zeros), ``columns_left`` columns of it
    (zeros after). ``offsets`` is in ``GATHER_LAYOUT``'s rows."""
    BLOCK_N: gl.constexpr = gather_smem.type.shape[1]
    SLICE: gl.constexpr = 64
    gl.thread_barrier()  # every warp of the group is done with the buffer's previous wgmma
    for j in gl.static_range(BLOCK_N // SLICE):
        n = j * SLICE + gl.arange(0, SLICE, layout=gl.SliceLayout(0, GATHER_LAYOUT))
        values = gl.load(base_ptr + offsets[:, None] + n[None, :],
                         mask=(offsets >= 0)[:, None] & (n < columns_left)[None, :], other=0.0)
        gather_smem.slice(j * SLICE, SLICE, dim=1).store(values)
    fence_async_shared()  # the generic-proxy stores before the wgmma's async-proxy reads
    gl.thread_barrier()


@gluon.jit
def _scatter_mma(acc, gather_smem, row_of_k, value_of_k, a_layout: gl.constexpr):
    """acc[row_of_k[k]] += value_of_k[k] · gather_smem[k] for the 64 gathered rows k (a row of -1: none): one
    synchronous wgmma whose A is zero but for those entries. Both vectors are in ``a_layout``'s K slice."""
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, a_layout))
    select = gl.where(rows[:, None] == row_of_k[None, :], value_of_k[None, :], 0.0).to(gather_smem.dtype)
    return warpgroup_mma(select, gather_smem, acc)


@gluon.jit
def _store_tile(acc, out_ptr, stride_out, first_row, off_n, M, N, scale, ACCUMULATE: gl.constexpr,
                mma_layout: gl.constexpr):
    """out[rows, columns] = scale · acc (+ out, with ``ACCUMULATE``), straight from the accumulator's layout: once
    per K loop, so no shared-memory staging."""
    WG_M: gl.constexpr = acc.type.shape[0]
    BLOCK_N: gl.constexpr = acc.type.shape[1]
    rows = first_row + gl.arange(0, WG_M, layout=gl.SliceLayout(1, mma_layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_layout))
    out = out_ptr + rows.to(gl.int64)[:, None] * stride_out + cols[None, :]
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    value = acc * scale
    if ACCUMULATE:
        value += gl.load(out, mask=mask, other=0.0).to(gl.float32)
    gl.store(out, value.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _dx_partition(z_desc, w_desc, z_bufs, w_bufs, gather_bufs, ready_bars, empty_bars, z_ptr, stride_z, w_ptr,
                  stride_w, coef_ptr, column_ptr, out_ptr, stride_out, M, N, num_pid_m, num_pid_n, k_tiles,
                  GROUP_M: gl.constexpr, WG: gl.constexpr):
    """dX's MMA warpgroup WG: rows WG·64 to WG·64 + 63 of each (128 × BLOCK_N) tile. Warpgroup 0 also issues the
    loads, STAGES - 1 steps ahead of the step both multiply."""
    BLOCK_M: gl.constexpr = z_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = w_bufs.type.shape[2]
    WG_M: gl.constexpr = 64
    mma_layout: gl.constexpr = accumulator_layout(BLOCK_N)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    k_layout: gl.constexpr = gl.SliceLayout(0, a_layout)
    gather_smem = gather_bufs.index(WG)
    num_tiles = num_pid_m * num_pid_n
    steps = gl.cdiv(num_tiles - gl.program_id(0), gl.num_programs(0)) * k_tiles  # this program's K steps
    if WG == 0:
        _first_loads(z_desc, w_desc, z_bufs, w_bufs, ready_bars, empty_bars, steps, num_pid_m, num_pid_n, k_tiles,
                     GROUP_M, False)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        first_row = pid_m * BLOCK_M + WG * WG_M
        off_n = pid_n * BLOCK_N
        rows = first_row + gl.arange(0, WG_M, layout=gl.SliceLayout(1, a_layout))
        acc, it = _k_loop(z_desc, w_desc, z_bufs, w_bufs, ready_bars, empty_bars, coef_ptr, rows, M, it, steps,
                          num_pid_m, num_pid_n, k_tiles, GROUP_M, WG, False, a_layout, mma_layout)
        # The target columns: their P taken back out exactly (bf16 products, summed in float32), the rows scaled by
        # -s, then G at the columns added, rounded once as the buffer path rounds it. Row k of the warpgroup's rows
        # is row k of the scatter (a diagonal A) and of W's gathered rows.
        k_rows = first_row + gl.arange(0, WG_M, layout=k_layout)
        in_rows = k_rows < M
        g_rows = first_row + gl.arange(0, WG_M, layout=gl.SliceLayout(1, GATHER_LAYOUT))
        local = gl.arange(0, WG_M, layout=k_layout)
        shift = gl.load(coef_ptr + k_rows, mask=in_rows, other=float("inf"))
        for c in gl.static_range(2):
            column = gl.load(column_ptr + c * M + k_rows, mask=in_rows, other=-1)
            z_t = gl.load(z_ptr + k_rows.to(gl.int64) * stride_z + column, mask=column >= 0, other=0.0)
            p_t = gl.where(column >= 0, _softmax_term(z_t, shift).to(z_bufs.dtype).to(gl.float32), 0.0)
            g_column = gl.load(column_ptr + c * M + g_rows, mask=g_rows < M, other=-1)
            _gather_rows(gather_smem, w_ptr, gl.where(g_column >= 0, g_column.to(gl.int64) * stride_w + off_n, -1),
                         N - off_n)
            acc = _scatter_mma(acc, gather_smem, local, -p_t, a_layout)
        c_rows = first_row + gl.arange(0, WG_M, layout=gl.SliceLayout(1, mma_layout))
        acc = acc * gl.load(coef_ptr + M + c_rows, mask=c_rows < M, other=0.0)[:, None]
        for c in gl.static_range(2):
            g_column = gl.load(column_ptr + c * M + g_rows, mask=g_rows < M, other=-1)
            _gather_rows(gather_smem, w_ptr, gl.where(g_column >= 0, g_column.to(gl.int64) * stride_w + off_n, -1),
                         N - off_n)
            acc = _scatter_mma(acc, gather_smem, local, gl.load(coef_ptr + (2 + c) * M + k_rows, mask=in_rows,
                                                                  other=0.0), a_layout)
        _store_tile(acc, out_ptr, stride_out, first_row, off_n, M, N, 1.0, False, mma_layout)


@gluon.jit
def _dw_partition(z_desc, x_desc, z_bufs, x_bufs, gather_bufs, ready_bars, empty_bars, z_ptr, stride_z, x_ptr,
                  stride_x, coef_ptr, pair_column_ptr, pair_row_ptr, pair_value_ptr, pair_start_ptr, out_ptr,
                  stride_out, C, V, N, scale, num_pid_m, num_pid_n, k_tiles, GROUP_M: gl.constexpr,
                  ACCUMULATE: gl.constexpr, WG: gl.constexpr):
    """dW's MMA warpgroup WG: vocabulary rows WG·64 to WG·64 + 63 of each (128 × BLOCK_N) tile of dW = Gᵀ·X, K over
    the chunk's rows. Warpgroup 0 also issues the loads."""
    BLOCK_M: gl.constexpr = z_bufs.type.shape[2]
    BLOCK_N: gl.constexpr = x_bufs.type.shape[2]
    WG_M: gl.constexpr = 64
    mma_layout: gl.constexpr = accumulator_layout(BLOCK_N)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    k_layout: gl.constexpr = gl.SliceLayout(0, a_layout)
    gather_smem = gather_bufs.index(WG)
    num_tiles = num_pid_m * num_pid_n
    steps = gl.cdiv(num_tiles - gl.program_id(0), gl.num_programs(0)) * k_tiles
    if WG == 0:
        _first_loads(z_desc, x_desc, z_bufs, x_bufs, ready_bars, empty_bars, steps, num_pid_m, num_pid_n, k_tiles,
                     GROUP_M, True)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        first_column = pid_m * BLOCK_M + WG * WG_M  # of the logits: this warpgroup's first row of dW
        off_n = pid_n * BLOCK_N
        acc, it = _k_loop(z_desc, x_desc, z_bufs, x_bufs, ready_bars, empty_bars, coef_ptr, first_column, C, it,
                          steps, num_pid_m, num_pid_n, k_tiles, GROUP_M, WG, True, a_layout, mma_layout)
        # The target columns, as in dX but found by column: the (column, row) pairs sorted by column, of which those
        # in this warpgroup's 64 columns start at pair_start[its block], 64 pairs at a time. Each pair's G, as the
        # K loop rounded it, comes back out, and its exact value goes in, against X's row of the pair.
        block = first_column // WG_M
        end_pair = gl.load(pair_start_ptr + block + 1)
        for chunk in range(gl.load(pair_start_ptr + block), end_pair, WG_M):
            k_pairs = chunk + gl.arange(0, WG_M, layout=k_layout)
            in_pairs = k_pairs < end_pair
            column = gl.load(pair_column_ptr + k_pairs, mask=in_pairs, other=0)
            row = gl.load(pair_row_ptr + k_pairs, mask=in_pairs, other=0)
            g_pairs = chunk + gl.arange(0, WG_M, layout=gl.SliceLayout(1, GATHER_LAYOUT))
            g_row = gl.load(pair_row_ptr + g_pairs, mask=g_pairs < end_pair, other=-1)
            _gather_rows(gather_smem, x_ptr, gl.where(g_row >= 0, g_row.to(gl.int64) * stride_x + off_n, -1), N - off_n)
            z_t = gl.load(z_ptr + row.to(gl.int64) * stride_z + column, mask=in_pairs, other=0.0)
            shift = gl.load(coef_ptr + row, mask=in_pairs, other=float("inf"))
            neg_s = gl.load(coef_ptr + C + row, mask=in_pairs, other=0.0)
            g_t = (neg_s * _softmax_term(z_t, shift)).to(z_bufs.dtype).to(gl.float32)
            local = gl.where(in_pairs, column - first_column, -1)
            acc = _scatter_mma(acc, gather_smem, local, -g_t, a_layout)
            acc = _scatter_mma(acc, gather_smem, local, gl.load(pair_value_ptr + k_pairs, mask=in_pairs, other=0.0),
                               a_layout)
        _store_tile(acc, out_ptr, stride_out, first_column, off_n, V, N, scale, ACCUMULATE, mma_layout)


@gluon.jit(do_not_specialize=["M", "N", "K"])
def grad_times_weight_kernel(z_desc, z_ptr, stride_z, w_desc, w_ptr, stride_w, coef_ptr, column_ptr, out_ptr,
                             stride_out, M, N, K, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    """dX = G·W: M = the chunk's rows, N = H, K = V."""
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
        (_dx_partition, (z_desc, w_desc, z_bufs, w_bufs, gather_bufs, ready_bars, empty_bars, z_ptr, stride_z, w_ptr,
                         stride_w, coef_ptr, column_ptr, out_ptr, stride_out, M, N, num_pid_m, num_pid_n, k_tiles,
                         GROUP_M, 0)),
        (_dx_partition, (z_desc, w_desc, z_bufs, w_bufs, gather_bufs, ready_bars, empty_bars, z_ptr, stride_z, w_ptr,
                         stride_w, coef_ptr, column_ptr, out_ptr, stride_out, M, N, num_pid_m, num_pid_n, k_tiles,
                         GROUP_M, 1)),
    ], [4], [256])


@gluon.jit(do_not_specialize=["C", "V", "N", "scale"])
def grad_t_times_hidden_kernel(z_desc, z_ptr, stride_z, x_desc, x_ptr, stride_x, coef_ptr, pair_column_ptr,
                               pair_row_ptr, pair_value_ptr, pair_start_ptr, out_ptr, stride_out, C, V, N, scale,
                               STAGES: gl.constexpr, GROUP_M: gl.constexpr, ACCUMULATE: gl.constexpr):
    """dW = scale · Gᵀ·X (+ out): M = V, N = H, K = the chunk's rows C."""
    BLOCK_K: gl.constexpr = z_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = z_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = x_desc.block_type.shape[1]
    z_bufs = gl.allocate_shared_memory(z_desc.dtype, [STAGES, BLOCK_K, BLOCK_M], z_desc.layout)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_K, BLOCK_N], x_desc.layout)
    gather_bufs = gl.allocate_shared_memory(x_desc.dtype, [2, BLOCK_M // 2, BLOCK_N], x_desc.layout)
    ready_bars = alloc_barriers(STAGES)
    empty_bars = alloc_counting_barriers(STAGES, 2)
    num_pid_m = gl.cdiv(V, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(C, BLOCK_K)
    gl.warp_specialize([
        (_dw_partition, (z_desc, x_desc, z_bufs, x_bufs, gather_bufs, ready_bars, empty_bars, z_ptr, stride_z, x_ptr,
                         stride_x, coef_ptr, pair_column_ptr, pair_row_ptr, pair_value_ptr, pair_start_ptr, out_ptr,
                         stride_out, C, V, N, scale, num_pid_m, num_pid_n, k_tiles, GROUP_M, ACCUMULATE, 0)),
        (_dw_partition, (z_desc, x_desc, z_bufs, x_bufs, gather_bufs, ready_bars, empty_bars, z_ptr, stride_z, x_ptr,
                         stride_x, coef_ptr, pair_column_ptr, pair_row_ptr, pair_value_ptr, pair_start_ptr, out_ptr,
                         stride_out, C, V, N, scale, num_pid_m, num_pid_n, k_tiles, GROUP_M, ACCUMULATE, 1)),
    ], [4], [256])


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------

# 128 rows (64 per warpgroup) × 256 columns per tile, 64 of K per step, 3 stages: 3 × (16 + 32) KiB of ring and
# 2 × 32 KiB of gather buffers, 208 KiB of shared memory in all. One exp2 per element of G per tile: 1 per 512 FLOPs
# of the GEMM at BLOCK_N = 256.
BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M = 128, 256, 64, 3, 8
PAIR_BLOCK = 64  # columns per warpgroup tile of dW: the target pairs' segments


def _check(kernel, logits, other, other_name, other_dims, out, out_shape) -> None:
    """Raise ValueError unless ``logits`` (C, V) and ``other`` (the GEMM's B: W or the chunk's rows of hidden) are both
    bf16 or fp16 of the shapes the product needs, ``out`` of ``out_shape`` in float32 or their dtype, TMA can read the
    two (16-byte aligned rows: H a multiple of 8; V may be anything, the buffer's rows are padded) and out has unit
    column stride (it is stored from registers)."""
    if logits.dtype not in (torch.bfloat16, torch.float16) or other.dtype != logits.dtype:
        raise ValueError(f"{kernel}: logits and {other_name} must both be bfloat16 or float16, got {logits.dtype} and "
                         f"{other.dtype}")
    rows, vocab = logits.shape if logits.dim() == 2 else (None, None)
    if logits.dim() != 2 or other.dim() != 2 or other.shape[0] != (vocab if other_name == "weight" else rows):
        raise ValueError(f"{kernel}: need logits (C, V) and {other_name} {other_dims}, got {tuple(logits.shape)} and "
                         f"{tuple(other.shape)}")
    if out.dtype not in (torch.float32, logits.dtype) or tuple(out.shape) != out_shape:
        raise ValueError(f"{kernel}: out must be {out_shape} float32 or {logits.dtype}, got {tuple(out.shape)} "
                         f"{out.dtype}")
    if min(rows, vocab) < 1 or other.shape[1] % 8:
        raise ValueError(f"{kernel}: need C, V >= 1 and H a multiple of 8 (TMA reads {other_name}'s rows), got "
                         f"C={rows} V={vocab} H={other.shape[1]}")
    check_operand(kernel, "logits", logits)
    check_operand(kernel, other_name, other)
    if out.stride(1) != 1:
        raise ValueError(f"{kernel}: out must have unit column stride")


def check_supported(logits, weight, out) -> None:
    """Raise ValueError unless ``grad_times_weight`` can take these operands: logits (C, V) and weight (V, H) both
    bf16 or fp16, out (C, H) float32 or their dtype, each addressable by TMA."""
    _check("grad_times_weight", logits, weight, "weight", "(V, H)", out, (logits.shape[0], weight.shape[-1]))


def check_supported_dw(logits, hidden, out) -> None:
    """Raise ValueError unless ``grad_t_times_hidden`` can take these operands: logits (C, V) and hidden (C, H) both
    bf16 or fp16, out (V, H) float32 or their dtype, each addressable by TMA."""
    _check("grad_t_times_hidden", logits, hidden, "hidden", "(C, H)", out, (logits.shape[-1], hidden.shape[-1]))


def _layout(shape, dtype):
    return gl.NVMMASharedLayout.get_default_for(shape, TORCH_TO_GL[dtype])


def _descriptor(t, block):
    return TensorDescriptor.from_tensor(t, block, _layout(block, t.dtype))


def _grid(m, n, programs):
    return (max(1, min(programs, -(-m // BLOCK_M) * -(-n // BLOCK_N))), )


def _dx_launch(logits, weight, coefficients, columns, out, programs):
    """(grid, args, launch options) of ``grad_times_weight_kernel``: 8 warps, 256 registers each."""
    rows, vocab = logits.shape
    hidden = weight.shape[1]
    args = (_descriptor(logits, [BLOCK_M, BLOCK_K]), logits, logits.stride(0), _descriptor(weight, [BLOCK_K, BLOCK_N]),
            weight, weight.stride(0), coefficients, columns, out, out.stride(0), rows, hidden, vocab, STAGES, GROUP_M)
    return _grid(rows, hidden, programs), args, {"num_warps": 4}


def _dw_launch(logits, hidden, coefficients, pairs, out, scale, accumulate, programs):
    """(grid, args, launch options) of ``grad_t_times_hidden_kernel``."""
    rows, vocab = logits.shape
    size = hidden.shape[1]
    args = (_descriptor(logits, [BLOCK_K, BLOCK_M]), logits, logits.stride(0), _descriptor(hidden, [BLOCK_K, BLOCK_N]),
            hidden, hidden.stride(0), coefficients, *pairs, out, out.stride(0), rows, vocab, size, scale, STAGES,
            GROUP_M, accumulate)
    return _grid(vocab, size, programs), args, {"num_warps": 4}


def grad_times_weight(logits, weight, coefficients, columns, out, *, num_programs=None):
    """out = G·W for G formed from ``logits`` (C, V) with ``row_grads.grad_coefficients``' (coefficients,
    columns) of its rows; weight (V, H); out (C, H), float32 or the inputs' dtype. Returns out."""
    check_supported(logits, weight, out)
    grid, args, opts = _dx_launch(logits, weight, coefficients, columns, out, num_programs or num_sms(logits.device))
    grad_times_weight_kernel[grid](*args, **opts)
    return out


def target_pairs(coefficients, columns, vocab: int):
    """The rows' target columns for ``grad_t_times_hidden``, found by column: (column, row, G there) of every pair,
    sorted by column (a stable sort: the same order every call), and where the pairs of each 64 columns begin
    (int32, one per warpgroup's 64 columns of every tile, past V too, and one more). Rows without a column sort past
    every block; nothing is read back to the host."""
    rows = columns.shape[1]
    blocks = -(-vocab // BLOCK_M) * (BLOCK_M // PAIR_BLOCK)
    column = torch.where(columns >= 0, columns, blocks * PAIR_BLOCK).reshape(-1)
    column, order = torch.sort(column, stable=True)
    starts = torch.arange(0, blocks + 1, device=columns.device, dtype=column.dtype) * PAIR_BLOCK
    return (column, (order % rows).to(torch.int32), coefficients[2:4].reshape(-1)[order],
            torch.searchsorted(column, starts).to(torch.int32))


def grad_t_times_hidden(logits, hidden, coefficients, columns, out, *, scale=1.0, accumulate=False,
                        num_programs=None):
    """out = scale · Gᵀ·X (+ out with ``accumulate``) for G formed from ``logits`` (C, V) as ``grad_times_weight``
    forms it; hidden (C, H) the chunk's rows; out (V, H), float32 or the inputs' dtype. Returns out."""
    check_supported_dw(logits, hidden, out)
    pairs = target_pairs(coefficients, columns, logits.shape[1])
    grid, args, opts = _dw_launch(logits, hidden, coefficients, pairs, out, float(scale), accumulate,
                                  num_programs or num_sms(logits.device))
    grad_t_times_hidden_kernel[grid](*args, **opts)
    return out


def compile_for_target(*, dw=False, in_dtype=torch.bfloat16, out_dtype=torch.float32, target=None):
    """Compile ``grad_times_weight_kernel`` (or, ``dw``, ``grad_t_times_hidden_kernel`` accumulating into out) to a
    cubin without a GPU (``offline_compile.compile_kernel``)."""
    rows, vocab, size = 1000, 776, 1000
    logits = torch.empty(rows, vocab, dtype=in_dtype)
    coefficients = torch.empty(4, rows, dtype=torch.float32)
    columns = torch.empty(2, rows, dtype=torch.int32)
    if dw:
        hidden = torch.empty(rows, size, dtype=in_dtype)
        pairs = target_pairs(coefficients, columns.fill_(-1), vocab)
        _, args, opts = _dw_launch(logits, hidden, coefficients, pairs, torch.empty(vocab, size, dtype=out_dtype),
                                   0.5, True, 132)
        return compile_kernel(grad_t_times_hidden_kernel, args, opts, target)
    weight = torch.empty(vocab, size, dtype=in_dtype)
    _, args, opts = _dx_launch(logits, weight, coefficients, columns, torch.empty(rows, size, dtype=out_dtype), 132)
    return compile_kernel(grad_times_weight_kernel, args, opts, target)
