"""C = A·Bᵀ in Gluon for Hopper (sm_90a): the logits GEMM X·Wᵀ, written by hand, warp-specialised.

This is stage 1 (the gate) of computing the row statistics inside the logits GEMM: before any
statistics are fused in, a Gluon kernel with ``warpgroup_mma`` in a worker partition beside a TMA
producer has to compile and be correct on triton 3.6. Nothing in the library calls it yet, and
``orpo_lib.kernels`` does not export it. Importing the module launches nothing and needs no GPU.

Shapes: A is (M, K) and B is (N, K), both row-major bf16 (or fp16); C is (M, N) in float32, bf16 or
fp16, accumulated in float32. Tiles are BLOCK_M × BLOCK_N × BLOCK_K = 128 × 128 × 64 by default.
Every operand moves by TMA, which zero-fills the part of a load tile outside the tensor and clips the
part of a store tile outside it, so M, N and K need not be multiples of the tile. TMA needs every
row stride and base address 16-byte aligned, so K must be a multiple of 8 (bf16 rows of A and B) and
N a multiple of 16 / C's element size (8 for bf16, 4 for float32). ``check_supported`` says so in
its error.

Three partitions. The default partition (the kernel's 4 warps) is the epilogue: it TMA-stores each
C tile. Worker 0 (4 warps, one warpgroup) waits for operand stages and issues the async
``warpgroup_mma``; it writes its finished accumulator into shared memory for the epilogue. Worker 1
(1 warp) is the TMA producer filling a STAGES-deep ring of A and B tiles. Measured on the H200
(``figures/data/gluon-gate-2026-12-04-h200.json``), this runs at cuBLAS's rate at the logits shape;
the epilogue, beside the next tile's MMAs, is where the row statistics are to go. The gate also ran
three diagnostic variants (the MMA worker storing its own tiles; MMA and store in the default
partition; no warp specialisation): all correct, the last one 7% slower; they are not kept.

The kernel is persistent: min(#SMs, #tiles) programs walk the tiles in
groups of GROUP_M row blocks (so concurrently running tiles share B tiles in L2). Every partition
walks the same tile sequence, so the ring's stage index and phase need no communication beyond the
mbarriers.
"""

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .offline_compile import compile_kernel

_TORCH_TO_GL = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}


# --------------------------------------------------------------------------------------------------
# Device helpers
# --------------------------------------------------------------------------------------------------

@gluon.constexpr_function
def _mma_layout(BLOCK_N):
    # The accumulator's register layout, which also fixes the wgmma shape: one warpgroup (warps
    # stacked along M, 16 rows each per m64 instruction), instructions of m16 × n × k16 per warp for
    # 16-bit inputs (k = 256 bits / 16). The largest n (≤ 256, a multiple of 8) dividing the tile
    # means the fewest instructions per K step: n = 128 for the default tile.
    n = min(BLOCK_N, 256)
    while BLOCK_N % n != 0:
        n -= 8
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
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
def _load_partition(a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, num_pid_m, num_pid_n, k_tiles,
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
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
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
    mma_layout: gl.constexpr = _mma_layout(BLOCK_N)
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
def _mma_to_smem_partition(a_bufs, b_bufs, c_bufs, ready_bars, empty_bars, c_ready_bars, c_empty_bars, turn_bars,
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
def _store_partition(c_desc, c_bufs, c_ready_bars, c_empty_bars, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """ws_worker's epilogue (default partition): TMA-store each finished C tile, then free its buffer."""
    NUM_WG: gl.constexpr = c_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    num_tiles = num_pid_m * num_pid_n
    t = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        wg = t % NUM_WG  # the warpgroup that computed this tile
        mbarrier.wait(c_ready_bars.index(wg), (t // NUM_WG) & 1)
        tma.async_copy_shared_to_global(c_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N], c_bufs.index(wg))
        tma.store_wait(pendings=0)  # the buffer has been read out; its warpgroup may overwrite it
        mbarrier.arrive(c_empty_bars.index(wg))
        t += 1


# --------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------

@gluon.jit
def _alloc_ring(a_desc, b_desc, STAGES: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready_bars = _alloc_barriers(STAGES)  # one arrival each: the producer's expect (+ tx bytes)
    empty_bars = _alloc_barriers(STAGES)  # one arrival each: the MMA warpgroup's release
    return a_bufs, b_bufs, ready_bars, empty_bars


@gluon.jit
def _alloc_barriers(count: gl.constexpr):
    bars = gl.allocate_shared_memory(gl.int64, [count, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(count):
        mbarrier.init(bars.index(i), count=1)
    return bars


@gluon.jit(do_not_specialize=["M", "N", "K"])  # shapes reach the kernel via TMA; one compile for all
def gemm_ws_worker_kernel(a_desc, b_desc, c_desc, M, N, K, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                          LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    a_bufs, b_bufs, ready_bars, empty_bars = _alloc_ring(a_desc, b_desc, STAGES)
    # the C tile's hand-off from the MMA warpgroup to the epilogue: a buffer, its ready and empty barriers
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [1, BLOCK_M, BLOCK_N], c_desc.layout)
    c_ready_bars = _alloc_barriers(1)
    c_empty_bars = _alloc_barriers(1)
    turn_bars = _alloc_barriers(1)  # (one MMA warpgroup: its turns are never waited for)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    # triton 3.6: warp_specialize(functions_and_args, worker_num_warps, worker_num_regs); the first
    # entry is the default partition (the kernel's num_warps), the rest run in extra warps. The
    # compiler places a 4-warp worker on a warpgroup boundary, which wgmma needs.
    gl.warp_specialize([
        (_store_partition, (c_desc, c_bufs, c_ready_bars, c_empty_bars, num_pid_m, num_pid_n, GROUP_M)),
        (_mma_to_smem_partition, (a_bufs, b_bufs, c_bufs, ready_bars, empty_bars, c_ready_bars, c_empty_bars,
                                  turn_bars, num_pid_m, num_pid_n, k_tiles, 0)),
        (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, num_pid_m, num_pid_n, k_tiles,
                           GROUP_M)),
    ], [4, 1], [MMA_REGS, LOAD_REGS])


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------

def check_supported(M, N, K, in_dtype, out_dtype):
    """Raise ValueError unless TMA can address these shapes (no GPU needed)."""
    if in_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"gluon_gemm: A and B must be bfloat16 or float16, got {in_dtype}")
    if out_dtype not in _TORCH_TO_GL:
        raise ValueError(f"gluon_gemm: C must be float32, bfloat16 or float16, got {out_dtype}")
    if min(M, N, K) < 1:
        raise ValueError(f"gluon_gemm: empty problem M={M} N={N} K={K}")
    if K % 8:
        raise ValueError(f"gluon_gemm: K={K} must be a multiple of 8 (TMA needs 16-byte row strides for A and B)")
    c_align = 16 // torch.empty((), dtype=out_dtype).element_size()
    if N % c_align:
        raise ValueError(f"gluon_gemm: N={N} must be a multiple of {c_align} for a {out_dtype} C "
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


def _check_operand(name, t):
    if not t.is_cuda or t.dim() != 2 or t.stride(1) != 1 or t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
        raise ValueError(f"gluon_gemm: {name} must be a 2-D CUDA tensor with unit column stride, 16-byte aligned "
                         f"base and row stride (got shape {tuple(t.shape)}, strides {t.stride()}, device {t.device})")


@functools.lru_cache(maxsize=None)
def _num_sms(device_index):
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _descriptors(a, b, out, block_m, block_n, block_k):
    """Host TMA descriptors; each tile's shared-memory layout is the widest swizzle its rows allow."""
    in_gl = _TORCH_TO_GL[a.dtype]
    a_layout = gl.NVMMASharedLayout.get_default_for([block_m, block_k], in_gl)
    b_layout = gl.NVMMASharedLayout.get_default_for([block_n, block_k], in_gl)
    c_layout = gl.NVMMASharedLayout.get_default_for([block_m, block_n], _TORCH_TO_GL[out.dtype])
    return (TensorDescriptor.from_tensor(a, [block_m, block_k], a_layout),
            TensorDescriptor.from_tensor(b, [block_n, block_k], b_layout),
            TensorDescriptor.from_tensor(out, [block_m, block_n], c_layout))


def _launch_plan(descs, M, N, K, *, block_m, block_n, stages, group_m, programs, maxnreg, load_regs, mma_regs):
    """(grid, positional args, launch options) of the kernel: shared by launch and compile-only."""
    num_tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    grid = (max(1, min(programs, num_tiles)), )
    # 4 (default) + 4 (MMA) + 1 (loader) warps, rounded up to 12: 65536 / 384 threads = 170 → 168.
    opts = {"num_warps": 4, "maxnreg": 168 if maxnreg is None else maxnreg}
    return grid, (*descs, M, N, K, stages, group_m, load_regs, mma_regs), opts


def _check_config(block_m, block_n, block_k, stages):
    if block_m != 128:
        raise ValueError("gluon_gemm: block_m must be 128 (one warpgroup of 4 warps, two m64 wgmma rows)")
    if block_n % 16 or not 16 <= block_n <= 256 or block_k % 16 or not 16 <= block_k <= 128 or stages < 2:
        raise ValueError(f"gluon_gemm: unsupported tile {block_m}x{block_n}x{block_k} / {stages} stages")


def gluon_matmul_abt(a, b, out_dtype=torch.float32, *, block_m=128, block_n=128, block_k=64,
                     stages=4, group_m=8, num_programs=None, maxnreg=None, load_regs=24, mma_regs=232, out=None):
    """C = a @ b.T with a (M, K), b (N, K); returns C (M, N) in ``out_dtype`` (float32 accumulation).

    ``num_programs`` caps the persistent grid (default: #SMs). ``maxnreg`` is passed to the compiler
    (default 168); ``load_regs``/``mma_regs`` are
    the register budgets requested for the TMA producer and the MMA warpgroup.
    """
    _check_config(block_m, block_n, block_k, stages)
    check_operand_pair("gluon_gemm", "a", a, "(M, K)", "b", b, "(N, K)")
    M, K = a.shape
    N = b.shape[0]
    check_supported(M, N, K, a.dtype, out_dtype)  # the shape rules first: they explain the alignment ones
    _check_operand("a", a)
    _check_operand("b", b)
    if out is None:
        out = torch.empty((M, N), device=a.device, dtype=out_dtype)
    elif tuple(out.shape) != (M, N) or out.dtype != out_dtype:
        raise ValueError(f"gluon_gemm: out must be {(M, N)} {out_dtype}, got {tuple(out.shape)} {out.dtype}")
    _check_operand("out", out)
    descs = _descriptors(a, b, out, block_m, block_n, block_k)
    programs = num_programs or _num_sms(a.device.index if a.device.index is not None else torch.cuda.current_device())
    grid, args, opts = _launch_plan(descs, M, N, K, block_m=block_m, block_n=block_n, stages=stages, group_m=group_m,
                                    programs=programs, maxnreg=maxnreg, load_regs=load_regs, mma_regs=mma_regs)
    gemm_ws_worker_kernel[grid](*args, **opts)
    return out


def compile_for_target(out_dtype=torch.float32, *, target=None, in_dtype=torch.bfloat16,
                       block_m=128, block_n=128, block_k=64, stages=4, group_m=8, maxnreg=None, load_regs=24,
                       mma_regs=232):
    """Compile the kernel down to a cubin without launching it; no GPU needed.

    ``target`` defaults to ``GPUTarget("cuda", 90, 32)`` (sm_90a). Returns triton's CompiledKernel, whose
    ``asm`` holds the ttgir, llir, ptx and cubin.
    """
    _check_config(block_m, block_n, block_k, stages)
    M, N, K = 1000, 776, 1000  # the shapes are runtime arguments (not specialised): any supported ones do
    a = torch.empty((M, K), dtype=in_dtype)
    b = torch.empty((N, K), dtype=in_dtype)
    out = torch.empty((M, N), dtype=out_dtype)
    descs = _descriptors(a, b, out, block_m, block_n, block_k)
    _, args, opts = _launch_plan(descs, M, N, K, block_m=block_m, block_n=block_n, stages=stages, group_m=group_m,
                                 programs=132, maxnreg=maxnreg, load_regs=load_regs, mma_regs=mma_regs)
    return compile_kernel(gemm_ws_worker_kernel, args, opts, target)
