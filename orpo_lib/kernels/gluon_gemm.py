"""C = A·Bᵀ in Gluon for Hopper (sm_90a): the logits GEMM X·Wᵀ, written by hand, warp-specialised.

The plain GEMM on the pipeline that the statistics GEMM (``gluon_row_stats``) is built on (``gluon_pipeline``): one
MMA warpgroup, and an epilogue that only stores C, so that the pipeline's correctness and rate can be checked on
their own (tests/gpu/test_gluon_gemm.py). ``orpo_lib.kernels`` does not export it. Importing the module launches
nothing and needs no GPU.

Shapes: A is (M, K) and B is (N, K), both row-major bf16 (or fp16); C is (M, N) in float32, bf16 or
fp16, accumulated in float32. Tiles are BLOCK_M × BLOCK_N × BLOCK_K = 128 × 128 × 64 by default.
Every operand moves by TMA, which zero-fills the part of a load tile outside the tensor and clips the
part of a store tile outside it, so M, N and K need not be multiples of the tile. TMA needs every
row stride and base address 16-byte aligned, so K must be a multiple of 8 (bf16 rows of A and B) and
N a multiple of 16 / C's element size (8 for bf16, 4 for float32). ``gluon_pipeline.check_tma_shapes`` says so
in its error.

Three partitions. The default partition (the kernel's 4 warps) is the epilogue: it TMA-stores each
C tile. Worker 0 (4 warps, one warpgroup: ``gluon_pipeline.mma_to_smem_partition``) waits for operand stages
and issues the async ``warpgroup_mma``; it writes its finished accumulator into shared memory for the epilogue.
Worker 1 (1 warp: ``gluon_pipeline.load_partition``) is the TMA producer filling a STAGES-deep ring of A and B
tiles. Measured on the H200 (``figures/data/gluon-gemm-gate-h200.json``), this runs at cuBLAS's rate at
the logits shape; without warp specialisation the same GEMM is 7% slower there.
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .gluon_pipeline import (TORCH_TO_GL, alloc_barriers, alloc_ring, check_operand, check_operand_pair,
                             check_tma_shapes, load_partition, mma_to_smem_partition, num_sms, tile_coords)
from .offline_compile import compile_kernel

__all__ = ["compile_for_target", "gemm_ws_worker_kernel", "gluon_matmul_abt"]


# --------------------------------------------------------------------------------------------------
# Device side
# --------------------------------------------------------------------------------------------------

@gluon.jit
def _store_partition(c_desc, c_bufs, c_ready_bars, c_empty_bars, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """ws_worker's epilogue (default partition): TMA-store each finished C tile, then free its buffer."""
    NUM_WG: gl.constexpr = c_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    num_tiles = num_pid_m * num_pid_n
    t = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        wg = t % NUM_WG  # the warpgroup that computed this tile
        mbarrier.wait(c_ready_bars.index(wg), (t // NUM_WG) & 1)
        tma.async_copy_shared_to_global(c_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N], c_bufs.index(wg))
        tma.store_wait(pendings=0)  # the buffer has been read out; its warpgroup may overwrite it
        mbarrier.arrive(c_empty_bars.index(wg))
        t += 1


@gluon.jit(do_not_specialize=["M", "N", "K"])  # shapes reach the kernel via TMA; one compile for all
def gemm_ws_worker_kernel(a_desc, b_desc, c_desc, M, N, K, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                          LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    a_bufs, b_bufs, ready_bars, empty_bars = alloc_ring(a_desc, b_desc, STAGES)
    # the C tile's hand-off from the MMA warpgroup to the epilogue: a buffer, its ready and empty barriers
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [1, BLOCK_M, BLOCK_N], c_desc.layout)
    c_ready_bars = alloc_barriers(1)
    c_empty_bars = alloc_barriers(1)
    turn_bars = alloc_barriers(1)  # (one MMA warpgroup: its turns are never waited for)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    # triton 3.6: warp_specialize(functions_and_args, worker_num_warps, worker_num_regs); the first
    # entry is the default partition (the kernel's num_warps), the rest run in extra warps. The
    # compiler places a 4-warp worker on a warpgroup boundary, which wgmma needs.
    gl.warp_specialize([
        (_store_partition, (c_desc, c_bufs, c_ready_bars, c_empty_bars, num_pid_m, num_pid_n, GROUP_M)),
        (mma_to_smem_partition, (a_bufs, b_bufs, c_bufs, ready_bars, empty_bars, c_ready_bars, c_empty_bars,
                                 turn_bars, num_pid_m, num_pid_n, k_tiles, 0)),
        (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, num_pid_m, num_pid_n, k_tiles,
                          GROUP_M)),
    ], [4, 1], [MMA_REGS, LOAD_REGS])


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------

def _descriptors(a, b, out, block_m, block_n, block_k):
    """Host TMA descriptors; each tile's shared-memory layout is the widest swizzle its rows allow."""
    in_gl = TORCH_TO_GL[a.dtype]
    a_layout = gl.NVMMASharedLayout.get_default_for([block_m, block_k], in_gl)
    b_layout = gl.NVMMASharedLayout.get_default_for([block_n, block_k], in_gl)
    c_layout = gl.NVMMASharedLayout.get_default_for([block_m, block_n], TORCH_TO_GL[out.dtype])
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
    # the shape rules first: they explain the alignment ones
    check_tma_shapes("gluon_gemm", M, N, K, a.dtype, out_dtype)
    check_operand("gluon_gemm", "a", a)
    check_operand("gluon_gemm", "b", b)
    if out is None:
        out = torch.empty((M, N), device=a.device, dtype=out_dtype)
    elif tuple(out.shape) != (M, N) or out.dtype != out_dtype:
        raise ValueError(f"gluon_gemm: out must be {(M, N)} {out_dtype}, got {tuple(out.shape)} {out.dtype}")
    check_operand("gluon_gemm", "out", out)
    descs = _descriptors(a, b, out, block_m, block_n, block_k)
    programs = num_programs or num_sms(a.device)
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
