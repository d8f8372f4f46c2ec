"""The pipeline two Gluon kernels for Hopper (sm_90a) are built on: a persistent, warp-specialised C = A·Bᵀ whose
epilogue each kernel writes itself (``gluon_gemm``: a TMA store of C; ``gluon_row_stats``: the row statistics).
``gluon_grad_gemm`` shares its tile order, barriers, accumulator layout and operand checks.

Data flows through three kinds of partition. ``load_partition`` (1 warp) is the TMA producer: it fills a
STAGES-deep ring of A and B tiles in shared memory (``alloc_ring``), stage by stage, as soon as the MMA
warpgroups free one. ``mma_to_smem_partition`` (a 4-warp worker, one warpgroup; one or more of them) waits for
each stage, issues the async ``warpgroup_mma`` of the K loop in float32, and hands each finished C tile to the
epilogue in a shared-memory buffer of its own, with a ready and an empty mbarrier (``alloc_barriers``). The
epilogue (the default partition) is the kernel's own.

The kernels are persistent: min(#SMs, #tiles) programs walk the tiles in groups of GROUP_M row blocks
(``tile_coords``, so that concurrently running tiles share B tiles in L2). Every partition walks the same tile
sequence, so the ring's stage index and phase need no communication beyond the mbarriers.

The host side: ``TORCH_TO_GL`` (the Gluon dtypes), ``check_operand_pair``, ``check_tma_shapes`` and
``check_operand`` (what TMA can address: 16-byte aligned base addresses and row strides), ``num_sms``.
Importing the module launches nothing and needs no GPU.
"""

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

__all__ = ["TORCH_TO_GL", "accumulator_layout", "alloc_barriers", "alloc_counting_barriers", "alloc_ring", "check_operand",
           "check_operand_pair", "check_tma_shapes", "load_partition", "mma_to_smem_partition", "num_sms", "tile_coords"]

TORCH_TO_GL = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}


# --------------------------------------------------------------------------------------------------
# Device side
# --------------------------------------------------------------------------------------------------

@gluon.constexpr_function
def accumulator_layout(BLOCK_N):
    # The accumulator's register layout, which also fixes the wgmma shape: one warpgroup (warps
    # stacked along M, 16 rows each per m64 instruction), instructions of m16 × n × k16 per warp for
    # 16-bit inputs (k = 256 bits / 16). The largest n (≤ 256, a multiple of 8) dividing the tile
    # means the fewest instructions per K step: n = 128 for the default tile.
    n = min(BLOCK_N, 256)
    while BLOCK_N % n != 0:
        n -= 8
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.jit
def tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    # Grouped ordering: GROUP_M row blocks advance along N together, so the programs running at the
    # same time read the same few B (weight) tiles and one group's A rows stay in L2.
    per_group = GROUP_M * num_pid_n
    group = tile // per_group
    first_m = group * GROUP_M
    group_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    in_group = tile % per_group
    pid_m = first_m + in_group % group_m
    pid_n = in_group // group_m
    return pid_m, pid_n


@gluon.jit
def load_partition(a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, num_pid_m, num_pid_n, k_tiles,
                   GROUP_M: gl.constexpr):
    """TMA producer (1 warp): fills the ring stage by stage, as soon as the MMA warpgroup frees one."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    num_tiles = num_pid_m * num_pid_n
    it = 0  # k-steps issued so far by this program, over all its tiles: stage = it % STAGES
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        for ki in range(k_tiles):
            s = it % STAGES
            # A fresh mbarrier counts as having completed the phase before phase 0, so waiting for
            # parity (phase ^ 1) lets the first STAGES loads through before any consumer release.
            phase = (it // STAGES) & 1
            mbarrier.wait(empty_bars.index(s), phase ^ 1)
            bar = ready_bars.index(s)
            mbarrier.expect(bar, nbytes)  # the barrier completes when both tiles' bytes have landed
            tma.async_copy_global_to_shared(a_desc, [off_m, ki * BLOCK_K], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [off_n, ki * BLOCK_K], bar, b_bufs.index(s))
            it += 1


@gluon.jit
def _mma_tile(a_bufs, b_bufs, ready_bars, empty_bars, it, k_tiles, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """One C tile's K loop on one warpgroup; returns the float32 accumulator and the updated step count.

    The wgmma of step k is issued async and then waited on with one group allowed outstanding, which
    means the wgmma of step k-1 has finished reading its stage: that stage goes back to the producer
    while step k computes.
    """
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    mma_layout: gl.constexpr = accumulator_layout(BLOCK_N)
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
    for ki in range(k_tiles):
        s = it % STAGES
        mbarrier.wait(ready_bars.index(s), (it // STAGES) & 1)
        # B's tile is (BLOCK_N, BLOCK_K), K contiguous; the permuted view is the (K, N) operand that
        # wgmma wants, read K-major from the same shared memory (no data moves).
        acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        mbarrier.arrive(empty_bars.index((it + STAGES - 1) % STAGES), pred=ki > 0)
        it += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(empty_bars.index((it + STAGES - 1) % STAGES))  # the last step's stage (k_tiles >= 1)
    return acc, it


@gluon.jit
def mma_to_smem_partition(a_bufs, b_bufs, c_bufs, ready_bars, empty_bars, c_ready_bars, c_empty_bars, turn_bars,
                          num_pid_m, num_pid_n, k_tiles, WG: gl.constexpr):
    """An MMA warpgroup (a 4-warp worker): K loop, then hand the tile to the epilogue via its own c buffer.

    With several MMA warpgroups (``c_bufs.shape[0]`` of them), warpgroup WG takes every WG-th tile of the
    program's sequence: while one stores its finished tile, the next one's K loop keeps the tensor cores
    busy. Each tile's K steps keep their place in the ring's order (tile t's steps are t·k_tiles onwards),
    so the producer needs to know nothing about the warpgroups. The K loops take turns (``turn_bars``):
    a ring barrier's wait only knows a phase's parity, so a warpgroup that waited for a stage two
    phases ahead of the other would take the other's data for its own.
    """
    NUM_WG: gl.constexpr = c_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = c_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = c_bufs.type.shape[2]
    c_smem = c_bufs.index(WG)
    num_tiles = num_pid_m * num_pid_n
    j = 0  # tiles done by this warpgroup: parity of its hand-off barriers
    for tile in range(gl.program_id(0) + WG * gl.num_programs(0), num_tiles, NUM_WG * gl.num_programs(0)):
        if NUM_WG > 1:  # wait for the previous warpgroup's K loop; warpgroup 0's first turn is free
            mbarrier.wait(turn_bars.index(WG), (j & 1) ^ (WG == 0))
        acc, _ = _mma_tile(a_bufs, b_bufs, ready_bars, empty_bars, (WG + j * NUM_WG) * k_tiles, k_tiles, BLOCK_M,
                           BLOCK_N)
        if NUM_WG > 1:
            mbarrier.arrive(turn_bars.index((WG + 1) % NUM_WG))
        # The epilogue must have finished with this warpgroup's previous tile in c_smem.
        mbarrier.wait(c_empty_bars.index(WG), (j & 1) ^ 1)
        c_smem.store(acc.to(c_smem.dtype))
        # Generic-proxy writes to smem must be fenced before the async proxy (the TMA store) reads them.
        fence_async_shared()
        mbarrier.arrive(c_ready_bars.index(WG))
        j += 1


@gluon.jit
def alloc_ring(a_desc, b_desc, STAGES: gl.constexpr):
    """The ring: STAGES buffers of A and of B tiles in shared memory, and a ready and an empty barrier per stage."""
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready_bars = alloc_barriers(STAGES)  # one arrival each: the producer's expect (+ tx bytes)
    empty_bars = alloc_barriers(STAGES)  # one arrival each: the MMA warpgroup's release
    return a_bufs, b_bufs, ready_bars, empty_bars


@gluon.jit
def alloc_barriers(count: gl.constexpr):
    """``count`` mbarriers in shared memory, each completing at one arrival."""
    return alloc_counting_barriers(count, 1)


@gluon.jit
def alloc_counting_barriers(count: gl.constexpr, arrivals: gl.constexpr):
    """``count`` mbarriers in shared memory, each completing at ``arrivals`` arrivals."""
    bars = gl.allocate_shared_memory(gl.int64, [count, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(count):
        mbarrier.init(bars.index(i), count=arrivals)
    return bars


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------

def check_tma_shapes(kernel, M, N, K, in_dtype, out_dtype):
    """Raise ValueError unless TMA can address an (M, K)·(N, K)ᵀ → (M, N) problem in these dtypes (no GPU needed);
    ``kernel`` names the kernel in the message."""
    if in_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"{kernel}: A and B must be bfloat16 or float16, got {in_dtype}")
    if out_dtype not in TORCH_TO_GL:
        raise ValueError(f"{kernel}: C must be float32, bfloat16 or float16, got {out_dtype}")
    if min(M, N, K) < 1:
        raise ValueError(f"{kernel}: empty problem M={M} N={N} K={K}")
    if K % 8:
        raise ValueError(f"{kernel}: K={K} must be a multiple of 8 (TMA needs 16-byte row strides for A and B)")
    c_align = 16 // torch.empty((), dtype=out_dtype).element_size()
    if N % c_align:
        raise ValueError(f"{kernel}: N={N} must be a multiple of {c_align} for a {out_dtype} C "
                         "(TMA needs 16-byte row strides)")


def check_operand_pair(kernel, a_name, a, a_dims, b_name, b, b_dims):
    """Raise ValueError unless a kernel's two input operands are 2-D, both bf16 or both fp16, and share their
    last dimension (``a_dims``, ``b_dims``: how the message names their shapes, e.g. "(M, K)")."""
    if a.dtype not in (torch.bfloat16, torch.float16) or b.dtype != a.dtype:
        raise ValueError(f"{kernel}: {a_name} and {b_name} must both be bfloat16 or float16, got {a.dtype} and "
                         f"{b.dtype}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"{kernel}: need {a_name} {a_dims} and {b_name} {b_dims}, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")


def check_operand(kernel, name, t):
    """Raise ValueError unless TMA can read or write ``t``: 2-D on a GPU, unit column stride, 16-byte aligned base and
    row stride."""
    if not t.is_cuda or t.dim() != 2 or t.stride(1) != 1 or t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
        raise ValueError(f"{kernel}: {name} must be a 2-D CUDA tensor with unit column stride, 16-byte aligned "
                         f"base and row stride (got shape {tuple(t.shape)}, strides {t.stride()}, device {t.device})")


def num_sms(device) -> int:
    """The SM count of a CUDA device (the persistent grid's default size)."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count(device_index):
    return torch.cuda.get_device_properties(device_index).multi_processor_count
