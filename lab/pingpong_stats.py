"""Experiment: the row statistics in the registers of two ping-pong MMA warpgroups (Gluon, Hopper).

Like kernels.gluon_row_stats, but each MMA warpgroup reduces its own finished accumulator while the other
warpgroup runs the next tile's K loop: no tile goes through shared memory, no epilogue partition, so the
ring can be deeper. Partials as gluon_row_stats writes them; fold_row_stats finishes them.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from orpo_lib.kernels import gluon_gemm
from orpo_lib.kernels.gluon_gemm import _alloc_barriers, _alloc_ring, _load_partition, _mma_layout, _tile_coords
from orpo_lib.kernels.gluon_row_stats import LOG2E, _maximum, _row_sum, new_partials
from orpo_lib.kernels.offline_compile import compile_kernel
from orpo_lib.kernels.row_stats import fold_row_stats


@gluon.jit
def _acc_row_stats(z, off_n, N, target, nll_target, CHECKED: gl.constexpr):
    """Per row of the tile z (float32, the accumulator's layout): max, sum of exp(z - max) without the target,
    logit sum, the two target logits (0 where not in the tile)."""
    layout: gl.constexpr = z.type.layout
    BLOCK_N: gl.constexpr = z.type.shape[1]
    if CHECKED:
        cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        in_vocab = (cols < N)[None, :]
        is_target = cols[None, :] == target[:, None]
        target_logit = _row_sum(gl.where(is_target, z, 0.0))
        nll_logit = _row_sum(gl.where(cols[None, :] == nll_target[:, None], z, 0.0))
        logit_sum = _row_sum(gl.where(in_vocab, z, 0.0))
        z = gl.where(in_vocab, z, float("-inf"))
    else:
        logit_sum = _row_sum(z)
        target_logit = logit_sum  # not stored: no row's target is in the tile
        nll_logit = logit_sum
    row_max = gl.reduce(z, 1, _maximum)
    terms = gl.exp2(z * LOG2E - (row_max * LOG2E)[:, None])
    if CHECKED:
        terms = gl.where(is_target, 0.0, terms)
    return row_max, _row_sum(terms), logit_sum, target_logit, nll_logit


@gluon.jit
def _mma_stats_partition(a_bufs, b_bufs, ready_bars, empty_bars, turn_bars, target_ptr, nll_target_ptr, partial_ptr,
                         target_logit_ptr, nll_logit_ptr, M, N, num_pid_m, num_pid_n, k_tiles, GROUP_M: gl.constexpr,
                         WG: gl.constexpr, STATS: gl.constexpr, EARLY_TURN: gl.constexpr):
    """MMA warpgroup WG of two: every other tile of the program's sequence, its K loop in turn with the other
    warpgroup's, then its statistics from its own registers while the other's K loop runs."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = a_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = b_bufs.type.shape[1]
    mma_layout: gl.constexpr = _mma_layout(BLOCK_N)
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    plane = gl.cdiv(N, BLOCK_N).to(gl.int64) * M
    num_tiles = num_pid_m * num_pid_n
    j = 0
    for tile in range(gl.program_id(0) + WG * gl.num_programs(0), num_tiles, 2 * gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        rows = off_m + gl.arange(0, BLOCK_M, layout=row_layout)
        in_rows = rows < M
        target = gl.load(target_ptr + rows, mask=in_rows, other=-1)
        nll_target = gl.load(nll_target_ptr + rows, mask=in_rows, other=-1)
        target_here = in_rows & (target >= off_n) & (target < off_n + BLOCK_N)
        nll_here = in_rows & (nll_target >= off_n) & (nll_target < off_n + BLOCK_N)
        checked = (off_n + BLOCK_N > N) | (gl.reduce((target_here | nll_here).to(gl.int32), 0, _maximum) > 0)

        mbarrier.wait(turn_bars.index(WG), (j & 1) ^ (WG == 0))
        it = (WG + 2 * j) * k_tiles
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
        for ki in range(k_tiles):
            s = it % STAGES
            mbarrier.wait(ready_bars.index(s), (it // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty_bars.index((it + STAGES - 1) % STAGES), pred=ki > 0)
            it += 1
        # Every wgmma of this tile is issued: the other warpgroup's queue behind them.
        if EARLY_TURN:
            mbarrier.arrive(turn_bars.index(1 - WG))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        if not EARLY_TURN:
            mbarrier.arrive(turn_bars.index(1 - WG))
        mbarrier.arrive(empty_bars.index((it + STAGES - 1) % STAGES))

        z = acc.to(a_bufs.dtype).to(gl.float32)  # rounded as a stored logits buffer would be
        if STATS:
            if checked:
                row_max, row_sum, logit_sum, target_logit, nll_logit = _acc_row_stats(z, off_n, N, target, nll_target,
                                                                                      True)
            else:
                row_max, row_sum, logit_sum, target_logit, nll_logit = _acc_row_stats(z, off_n, N, target, nll_target,
                                                                                      False)
            at = pid_n.to(gl.int64) * M + rows
            gl.store(partial_ptr + at, row_max, mask=in_rows)
            gl.store(partial_ptr + plane + at, row_sum, mask=in_rows)
            gl.store(partial_ptr + 2 * plane + at, logit_sum, mask=in_rows)
            gl.store(target_logit_ptr + rows, target_logit, mask=target_here)
            gl.store(nll_logit_ptr + rows, nll_logit, mask=nll_here)
        else:  # timing only: the K loops, turns and a row max, no statistics
            gl.store(partial_ptr + pid_n.to(gl.int64) * M + rows, gl.reduce(z, 1, _maximum), mask=in_rows)
        j += 1


@gluon.jit(do_not_specialize=["M", "N", "K"])
def pingpong_row_stats_kernel(a_desc, b_desc, target_ptr, nll_target_ptr, partial_ptr, target_logit_ptr,
                              nll_logit_ptr, M, N, K, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                              LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr, STATS: gl.constexpr,
                              EARLY_TURN: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    a_bufs, b_bufs, ready_bars, empty_bars = _alloc_ring(a_desc, b_desc, STAGES)
    turn_bars = _alloc_barriers(2)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    gl.warp_specialize([
        (_mma_stats_partition, (a_bufs, b_bufs, ready_bars, empty_bars, turn_bars, target_ptr, nll_target_ptr,
                                partial_ptr, target_logit_ptr, nll_logit_ptr, M, N, num_pid_m, num_pid_n, k_tiles,
                                GROUP_M, 0, STATS, EARLY_TURN)),
        (_mma_stats_partition, (a_bufs, b_bufs, ready_bars, empty_bars, turn_bars, target_ptr, nll_target_ptr,
                                partial_ptr, target_logit_ptr, nll_logit_ptr, M, N, num_pid_m, num_pid_n, k_tiles,
                                GROUP_M, 1, STATS, EARLY_TURN)),
        (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, num_pid_m, num_pid_n, k_tiles,
                           GROUP_M)),
    ], [4, 1], [MMA_REGS, LOAD_REGS])


BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 64


def _launch_plan(x, weight, target, nll_target, partials, target_logit, nll_logit, programs, stages, group_m,
                 mma_regs, load_regs, stats=True, early_turn=True):
    in_gl = gluon_gemm._TORCH_TO_GL[x.dtype]
    a_desc = gluon_gemm.TensorDescriptor.from_tensor(
        x, [BLOCK_M, BLOCK_K], gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], in_gl))
    b_desc = gluon_gemm.TensorDescriptor.from_tensor(
        weight, [BLOCK_N, BLOCK_K], gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], in_gl))
    M, K = x.shape
    N = weight.shape[0]
    tiles = -(-M // BLOCK_M) * -(-N // BLOCK_N)
    grid = (max(1, min(programs, tiles)), )
    # 4 + 4 + 1 warps in 3 warpgroups: 65536 / 384 = 170 → 168 a thread at launch; the loader gives its share
    # to the two MMA warpgroups (the default partition gets what the workers leave).
    args = (a_desc, b_desc, target, nll_target, partials, target_logit, nll_logit, M, N, K, stages, group_m,
            load_regs, mma_regs, stats, early_turn)
    return grid, args, {"num_warps": 4, "maxnreg": 168}


def pingpong_row_stats(x, weight, target, nll_target, token, logp, nll_logp, logit_sum, lse, *, stages=6, group_m=8,
                       mma_regs=240, load_regs=24, num_programs=None, stats=True, early_turn=True):
    rows, vocab = x.shape[0], weight.shape[0]
    partials = new_partials(rows, vocab, x.device)
    target_logit = torch.empty(rows, device=x.device, dtype=torch.float32)
    nll_logit = torch.empty(rows, device=x.device, dtype=torch.float32)
    programs = num_programs or gluon_gemm._num_sms(x.device.index if x.device.index is not None
                                                   else torch.cuda.current_device())
    grid, args, opts = _launch_plan(x, weight, target, nll_target, partials, target_logit, nll_logit, programs,
                                    stages, group_m, mma_regs, load_regs, stats, early_turn)
    pingpong_row_stats_kernel[grid](*args, **opts)
    fold_row_stats(partials, target_logit, nll_logit, target, nll_target, token, logp, nll_logp, logit_sum, lse)


def compile_for_target(stages=6, mma_regs=240, load_regs=24, stats=True, early_turn=True):
    rows, vocab, size = 1000, 776, 1000
    x = torch.empty(rows, size, dtype=torch.bfloat16)
    weight = torch.empty(vocab, size, dtype=torch.bfloat16)
    ids = torch.empty(rows, dtype=torch.int32)
    floats = torch.empty(rows, dtype=torch.float32)
    _, args, opts = _launch_plan(x, weight, ids, ids, new_partials(rows, vocab, "cpu"), floats, floats, 132, stages, 8,
                                 mma_regs, load_regs, stats, early_turn)
    return compile_kernel(pingpong_row_stats_kernel, args, opts)


if __name__ == "__main__":
    import re
    for stages, stats, early in ((4, True, True), (4, False, True), (4, True, False)):
        k = compile_for_target(stages, stats=stats, early_turn=early)
        ptx = k.asm["ptx"]
        print(stages, "shared", k.metadata.shared, re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx),
              "local (spill) bytes:", re.findall(r"\.local \.align \d+ \.b8 \S+\[(\d+)\]", ptx))
