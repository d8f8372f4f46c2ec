"""The row statistics inside the logits GEMM (Gluon, Hopper): X·Wᵀ whose epilogue reduces each tile.

``gluon_pipeline``'s warp-specialised GEMM (a TMA producer warp filling a ring of X and W tiles) with two MMA
warpgroups that take turns at the K loop, each handing its finished 128×128 tile over in shared memory,
and an epilogue partition that reads the tile back, one row per thread, rounded to the inputs' dtype as
a stored logits buffer would be, and reduces each row to partial statistics while the MMAs go on. Per
(row, column tile):

* the tile's maximum logit, and the sum of exp(logit - maximum) over its columns except the target's;
* the sum of its logits;
* the target's and the NLL target's logit, written straight to per-row outputs by the one tile that
  holds each column.

A tile that holds no row's target and no column past the vocabulary (most of them) is reduced without a
single comparison. ``fold_row_stats`` (``row_stats.fold_row_stats_kernel``, plain Triton) combines a row's
partials into exactly what ``row_stats_kernel`` writes: log-sum-exp, the two log-probs and the logit sum
at the row's token index. With ``logits`` given, the epilogue also TMA-stores the tile there (the loss passes
none: a call with gradients keeps the logits buffer and the row kernels).

Partials cost 12 bytes per row and column tile (0.1 bytes per logit against 2 for a bf16 logits
buffer), so a call without gradients needs no logits buffer. Where it is used: ``schedule.statistics_in_gemm``.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .gluon_pipeline import (TORCH_TO_GL, alloc_barriers, alloc_ring, check_operand, check_operand_pair,
                             check_tma_shapes, load_partition, mma_to_smem_partition, num_sms, tile_coords)
from .offline_compile import compile_kernel
from .row_stats import fold_row_stats

__all__ = ["BLOCK_N", "check_supported", "compile_for_target", "logits_row_stats", "logits_row_stats_kernel",
           "new_partials"]

LOG2E = gl.constexpr(1.4426950408889634)  # exp(x) = exp2(x·log2 e), which is what the hardware has


# Row reductions through gl.reduce with these combine functions rather than gl.sum and gl.max, whose
# combine functions are plain @triton.jit ones: without a GPU those become interpreted functions, which
# the Gluon compiler cannot inline, and the kernel must still compile there (its CPU test).
@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _maximum(a, b):
    return gl.maximum(a, b)


@gluon.jit
def _row_sum(x):
    return gl.reduce(x, 1, _add)


@gluon.jit
def _tile_row_stats(c_smem, off_n, N, target, nll_target, layout: gl.constexpr, SLICE_N: gl.constexpr,
                    CHECKED: gl.constexpr):
    """One tile's per-row max, sum of exp(logit - max) without the target's term, logit sum, and the two
    target logits (0 where the target is not in the tile). Unless CHECKED, the caller knows that no row's
    target or NLL target is in the tile and that every column is in the vocabulary: no column is compared."""
    BLOCK_M: gl.constexpr = c_smem.type.shape[0]
    BLOCK_N: gl.constexpr = c_smem.type.shape[1]
    row_layout: gl.constexpr = gl.SliceLayout(1, layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, layout)
    run_max = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
    run_sum = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    logit_sum = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    target_logit = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    nll_logit = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    for j in gl.static_range(BLOCK_N // SLICE_N):
        z = c_smem.slice(j * SLICE_N, SLICE_N, dim=1).load(layout).to(gl.float32)
        if CHECKED:
            cols = off_n + j * SLICE_N + gl.arange(0, SLICE_N, layout=col_layout)
            in_vocab = (cols < N)[None, :]
            is_target = cols[None, :] == target[:, None]
            target_logit += _row_sum(gl.where(is_target, z, 0.0))
            nll_logit += _row_sum(gl.where(cols[None, :] == nll_target[:, None], z, 0.0))
            logit_sum += _row_sum(gl.where(in_vocab, z, 0.0))
            z = gl.where(in_vocab, z, float("-inf"))
        else:
            logit_sum += _row_sum(z)
        # The first slice always has a column in the vocabulary, so new_max is finite from there on; a slice
        # past the vocabulary's end adds exp(-inf) = 0.
        new_max = gl.maximum(run_max, gl.reduce(z, 1, _maximum))
        terms = gl.exp2((z - new_max[:, None]) * LOG2E)
        if CHECKED:
            terms = gl.where(is_target, 0.0, terms)
        run_sum = run_sum * gl.exp2((run_max - new_max) * LOG2E) + _row_sum(terms)
        run_max = new_max
    return run_max, run_sum, logit_sum, target_logit, nll_logit


@gluon.jit
def _row_stats_partition(c_bufs, c_ready_bars, c_empty_bars, logits_desc, target_ptr, nll_target_ptr, partial_ptr,
                         target_logit_ptr, nll_logit_ptr, M, N, num_pid_m, num_pid_n, GROUP_M: gl.constexpr,
                         SLICE_N: gl.constexpr):
    """The epilogue (default partition, 4 warps): each finished tile's per-row partial statistics."""
    NUM_WG: gl.constexpr = c_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = c_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = c_bufs.type.shape[2]
    # One row per thread, SLICE_N columns of it at a time (16-byte shared-memory reads): every row
    # reduction stays within a thread, no shuffles.
    layout: gl.constexpr = gl.BlockedLayout([1, SLICE_N], [32, 1], [4, 1], [1, 0])
    row_layout: gl.constexpr = gl.SliceLayout(1, layout)
    plane = gl.cdiv(N, BLOCK_N).to(gl.int64) * M  # partials: (3, column tiles, M) float32
    num_tiles = num_pid_m * num_pid_n
    t = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        rows = off_m + gl.arange(0, BLOCK_M, layout=row_layout)
        in_rows = rows < M
        target = gl.load(target_ptr + rows, mask=in_rows, other=-1)
        nll_target = gl.load(nll_target_ptr + rows, mask=in_rows, other=-1)
        target_here = in_rows & (target >= off_n) & (target < off_n + BLOCK_N)
        nll_here = in_rows & (nll_target >= off_n) & (nll_target < off_n + BLOCK_N)
        # Most tiles hold no row's target (about BLOCK_M / V of them do) and no column past the vocabulary:
        # those take the loop without a single comparison.
        checked = (off_n + BLOCK_N > N) | (gl.reduce((target_here | nll_here).to(gl.int32), 0, _maximum) > 0)
        wg = t % NUM_WG  # the MMA warpgroup that computed this tile
        c_smem = c_bufs.index(wg)
        mbarrier.wait(c_ready_bars.index(wg), (t // NUM_WG) & 1)
        if logits_desc is not None:
            tma.async_copy_shared_to_global(logits_desc, [off_m, off_n], c_smem)  # TMA clips the edges
        if checked:
            run_max, run_sum, logit_sum, target_logit, nll_logit = _tile_row_stats(
                c_smem, off_n, N, target, nll_target, layout, SLICE_N, True)
        else:
            run_max, run_sum, logit_sum, target_logit, nll_logit = _tile_row_stats(
                c_smem, off_n, N, target, nll_target, layout, SLICE_N, False)
        if logits_desc is not None:
            tma.store_wait(pendings=0)
        mbarrier.arrive(c_empty_bars.index(wg))  # c_smem is read out: the MMA warpgroup may write the next tile
        at = pid_n.to(gl.int64) * M + rows
        gl.store(partial_ptr + at, run_max, mask=in_rows)
        gl.store(partial_ptr + plane + at, run_sum, mask=in_rows)
        gl.store(partial_ptr + 2 * plane + at, logit_sum, mask=in_rows)
        gl.store(target_logit_ptr + rows, target_logit, mask=target_here)
        gl.store(nll_logit_ptr + rows, nll_logit, mask=nll_here)
        t += 1


@gluon.jit(do_not_specialize=["M", "N", "K"])
def logits_row_stats_kernel(a_desc, b_desc, logits_desc, target_ptr, nll_target_ptr, partial_ptr, target_logit_ptr,
                            nll_logit_ptr, M, N, K, C_LAYOUT: gl.constexpr, BLOCK_N: gl.constexpr,
                            STAGES: gl.constexpr, GROUP_M: gl.constexpr, SLICE_N: gl.constexpr,
                            LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    a_bufs, b_bufs, ready_bars, empty_bars = alloc_ring(a_desc, b_desc, STAGES)
    # a tile buffer per MMA warpgroup, in the inputs' dtype, with its ready and empty barriers
    c_bufs = gl.allocate_shared_memory(a_desc.dtype, [2, BLOCK_M, BLOCK_N], C_LAYOUT)
    c_ready_bars = alloc_barriers(2)
    c_empty_bars = alloc_barriers(2)
    turn_bars = alloc_barriers(2)  # the MMA warpgroups' K loops take turns
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    # Two MMA warpgroups: one's K loop runs while the other hands its tile over (partitions in order:
    # the epilogue, MMA warpgroups 0 and 1, the TMA producer).
    gl.warp_specialize([
        (_row_stats_partition, (c_bufs, c_ready_bars, c_empty_bars, logits_desc, target_ptr, nll_target_ptr,
                                partial_ptr, target_logit_ptr, nll_logit_ptr, M, N, num_pid_m, num_pid_n,
                                GROUP_M, SLICE_N)),
        (mma_to_smem_partition, (a_bufs, b_bufs, c_bufs, ready_bars, empty_bars, c_ready_bars, c_empty_bars,
                                 turn_bars, num_pid_m, num_pid_n, k_tiles, 0)),
        (mma_to_smem_partition, (a_bufs, b_bufs, c_bufs, ready_bars, empty_bars, c_ready_bars, c_empty_bars,
                                 turn_bars, num_pid_m, num_pid_n, k_tiles, 1)),
        (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, num_pid_m, num_pid_n,
                          k_tiles, GROUP_M)),
    ], [4, 4, 1], [MMA_REGS, MMA_REGS, LOAD_REGS])


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------

# Measured on the H200 (figures/data/stats-gemm-variants-h200.json): two MMA warpgroups beat one at six
# of seven shapes, by up to 7 % of the logits GEMM (0.9 % behind at 16384×4096×128256); slices of 16 columns
# and of 8 are within noise (of 32, registers spill); sending every tile through the checked loop costs 1-8 %.
BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M, SLICE_N = 128, 128, 64, 4, 8, 16


def check_supported(x, weight, logits=None) -> None:
    """Raise ValueError unless this kernel can take these operands (dtype, shapes, TMA alignment)."""
    check_operand_pair("logits_row_stats", "x", x, "(M, H)", "weight", weight, "(V, H)")
    # Only a stored logits buffer has rows of V elements, which TMA needs 16-byte aligned; the partials do not.
    check_tma_shapes("logits_row_stats", x.shape[0], weight.shape[0] if logits is not None else 8, x.shape[1], x.dtype,
                     x.dtype)
    check_operand("logits_row_stats", "x", x)
    check_operand("logits_row_stats", "weight", weight)
    if logits is not None:
        if tuple(logits.shape) != (x.shape[0], weight.shape[0]) or logits.dtype != x.dtype:
            raise ValueError(f"logits_row_stats: logits must be {(x.shape[0], weight.shape[0])} {x.dtype}, got "
                             f"{tuple(logits.shape)} {logits.dtype}")
        check_operand("logits_row_stats", "logits", logits)


def _launch_plan(x, weight, logits, target, nll_target, partials, target_logit, nll_logit, programs):
    in_gl = TORCH_TO_GL[x.dtype]
    c_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], in_gl)
    a_desc = TensorDescriptor.from_tensor(
        x, [BLOCK_M, BLOCK_K], gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], in_gl))
    b_desc = TensorDescriptor.from_tensor(
        weight, [BLOCK_N, BLOCK_K], gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], in_gl))
    logits_desc = None if logits is None else TensorDescriptor.from_tensor(logits, [BLOCK_M, BLOCK_N], c_layout)
    M, K = x.shape
    N = weight.shape[0]
    tiles = -(-M // BLOCK_M) * -(-N // BLOCK_N)
    grid = (max(1, min(programs, tiles)), )
    # Registers: 16 warps (4 epilogue + 2·4 MMA + 1 producer, padded) may hold 128 each; the producer's
    # warpgroup gives most of its share to the MMA warpgroups' 128×128 float32 accumulators (24 and 168).
    args = (a_desc, b_desc, logits_desc, target, nll_target, partials, target_logit, nll_logit, M, N, K, c_layout,
            BLOCK_N, STAGES, GROUP_M, SLICE_N, 24, 168)
    return grid, args, {"num_warps": 4, "maxnreg": 128}


def new_partials(rows: int, vocab: int, device) -> torch.Tensor:
    """(3, column tiles, rows) float32: each tile's row maxima, sums of exp without the target, logit sums."""
    return torch.empty(3, -(-vocab // BLOCK_N), rows, device=device, dtype=torch.float32)


def logits_row_stats(x, weight, target, nll_target, token, logp, nll_logp, logit_sum, lse, *, logits=None,
                     num_programs=None) -> None:
    """The row statistics of ``x @ weight.T`` as ``row_stats`` writes them from a logits buffer, without
    reading one: x (C, H) and weight (V, H) bf16/fp16; target, nll_target (C,) int32 (-1: none); token
    (C,) int64 index of each row in the per-token outputs (float32, written at those indices). With
    ``logits`` ((C, V), the inputs' dtype) the logits are stored there too."""
    check_supported(x, weight, logits)
    rows, vocab = x.shape[0], weight.shape[0]
    partials = new_partials(rows, vocab, x.device)
    target_logit = torch.empty(rows, device=x.device, dtype=torch.float32)  # read only where a target exists
    nll_logit = torch.empty(rows, device=x.device, dtype=torch.float32)
    programs = num_programs or num_sms(x.device)
    grid, args, opts = _launch_plan(x, weight, logits, target, nll_target, partials, target_logit, nll_logit,
                                    programs)
    logits_row_stats_kernel[grid](*args, **opts)
    fold_row_stats(partials, target_logit, nll_logit, target, nll_target, token, logp, nll_logp, logit_sum, lse)


def compile_for_target(*, store_logits=False, in_dtype=torch.bfloat16, target=None):
    """Compile ``logits_row_stats_kernel`` to a cubin without a GPU (``offline_compile.compile_kernel``)."""
    rows, vocab, size = 1000, 776, 1000
    x = torch.empty(rows, size, dtype=in_dtype)
    weight = torch.empty(vocab, size, dtype=in_dtype)
    logits = torch.empty(rows, vocab, dtype=in_dtype) if store_logits else None
    ids = torch.empty(rows, dtype=torch.int32)
    floats = torch.empty(rows, dtype=torch.float32)
    _, args, opts = _launch_plan(x, weight, logits, ids, ids, new_partials(rows, vocab, "cpu"), floats, floats, 132)
    return compile_kernel(logits_row_stats_kernel, args, opts, target)
