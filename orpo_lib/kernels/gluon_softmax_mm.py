"""(row_scale · softmax(Z)) · W with the softmax formed tile by tile beside the MMAs (Gluon, Hopper).

The gradient of a row of logits is G = s·(-P) plus two target columns, P = exp(z - lse). Its dX GEMM,
G·W, is therefore this product with row_scale = -s, plus (G[y] - what this kernel used there)·W[y] for the
two target columns, a gather of two rows of W per token. Formed here, P never goes through memory: no
pass rewrites the logits into G (one read and one write of every logit). Triton's ``tl.dot`` with the
exp in its K loop ran at 1.35× cuBLAS's time even with nothing else in the loop (``docs/performance.md``):
the exp runs in the warps that issue the wgmma. Here it runs in warps of its own.

Partitions, per 128×256 output tile, K = V in steps of 64:

* the default partition (4 warps) issues the TMA loads of a logits tile (128×64) and a Wᵀ tile (256×64)
  into a STAGES-deep ring, STAGES - 1 steps ahead, and turns each logits tile into
  row_scale · exp(z - lse), rounded to the inputs' dtype as a stored G would be, in a second ring;
* two MMA warpgroups (4 warps each) take rows 0-63 and 64-127 of the tile: wgmma m64n256k16 from the
  G ring and the Wᵀ ring, then each stores its 64×256 float32 accumulator.

A separate 1-warp loader would make 13 warps, padded to 16: 128 registers a thread at launch, fewer than
a wgmma with a 64×256 accumulator needs (ptxas asks for 154). With the loads in the default partition,
12 warps get 168 each.

Each exp is paid once per output tile: H / 256 times per logit (4 at H = 1024). Per K step the default
partition forms 8192 exps (512 cycles of the exp unit at 16 a cycle) while the two warpgroups' MMAs take
about 1024 cycles at the tensor cores' rate, so the transform has room to hide.

Status: compiles for sm_90a (CPU test); its first GPU runs hung on a barrier cycle (the next load was
issued before the current tile was formed, and waited on a stage the MMAs free only after that tile),
fixed here by issuing it after the tile, and not yet run since. Not used by the loss.
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

from . import gluon_gemm
from .gluon_gemm import _alloc_barriers, _tile_coords
from .offline_compile import compile_kernel

LOG2E = gl.constexpr(1.4426950408889634)  # exp(x) = exp2(x·log2 e), which is what the hardware has


@gluon.jit
def _issue_load(z_desc, wt_desc, z_bufs, wt_bufs, ready, empty, step, k_tiles, num_pid_m, num_pid_n,
                GROUP_M: gl.constexpr):
    """TMA of this program's K step ``step`` (counted over all its tiles) into stage step % STAGES, once both
    MMA warpgroups have released that stage."""
    BLOCK_M: gl.constexpr = z_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = z_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = wt_desc.block_type.shape[0]
    STAGES: gl.constexpr = z_bufs.type.shape[0]
    tile = gl.program_id(0) + (step // k_tiles) * gl.num_programs(0)
    off_k = (step % k_tiles) * BLOCK_K
    pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
    s = step % STAGES
    mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)  # a fresh barrier lets the first STAGES through
    bar = ready.index(s)
    mbarrier.expect(bar, z_desc.block_type.nbytes + wt_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(z_desc, [pid_m * BLOCK_M, off_k], bar, z_bufs.index(s))
    tma.async_copy_global_to_shared(wt_desc, [pid_n * BLOCK_N, off_k], bar, wt_bufs.index(s))


@gluon.jit
def _softmax_partition(z_desc, wt_desc, z_bufs, wt_bufs, p_bufs, ready, p_ready, empty, lse_ptr, scale_ptr, M,
                       num_pid_m, num_pid_n, k_tiles, GROUP_M: gl.constexpr):
    """Default partition (4 warps): the loads, and each logits tile turned into row_scale · exp(z - lse)."""
    STAGES: gl.constexpr = z_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = z_bufs.type.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16-byte shared-memory accesses
    row_layout: gl.constexpr = gl.SliceLayout(1, layout)
    my_tiles = gl.cdiv(num_pid_m * num_pid_n - gl.program_id(0), gl.num_programs(0))
    steps = my_tiles * k_tiles
    for step in range(0, gl.minimum(STAGES - 1, steps)):
        _issue_load(z_desc, wt_desc, z_bufs, wt_bufs, ready, empty, step, k_tiles, num_pid_m, num_pid_n, GROUP_M)
    it = 0
    for t in range(my_tiles):
        pid_m, pid_n = _tile_coords(gl.program_id(0) + t * gl.num_programs(0), num_pid_m, num_pid_n, GROUP_M)
        rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
        in_rows = rows < M
        lse2 = gl.load(lse_ptr + rows, mask=in_rows, other=0.0) * LOG2E
        scale = gl.load(scale_ptr + rows, mask=in_rows, other=0.0)  # rows past M: 0, whatever TMA filled in
        for ki in range(k_tiles):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            z = z_bufs.index(s).load(layout).to(gl.float32)
            # columns past V: TMA fills z with 0, but Wᵀ's columns there with 0 too, so they add nothing
            p = scale[:, None] * gl.exp2(z * LOG2E - lse2[:, None])
            p_bufs.index(s).store(p.to(p_bufs.dtype))
            fence_async_shared()  # generic-proxy writes, read next by the async proxy (wgmma)
            mbarrier.arrive(p_ready.index(s))
            # Only now the load STAGES - 1 steps ahead: it waits for the stage of step it - 1, which the MMA
            # warpgroups release once step it's wgmma is issued, so step it's tile must be formed first.
            if it + STAGES - 1 < steps:
                _issue_load(z_desc, wt_desc, z_bufs, wt_bufs, ready, empty, it + STAGES - 1, k_tiles, num_pid_m,
                            num_pid_n, GROUP_M)
            it += 1


@gluon.jit
def _mma_partition(p_bufs, wt_bufs, ready, p_ready, empty, out_ptr, stride_out, M, N, num_pid_m, num_pid_n, k_tiles,
                   WG: gl.constexpr, GROUP_M: gl.constexpr):
    """MMA warpgroup WG (4 warps): rows WG·64 .. WG·64 + 63 of every tile, then their store."""
    STAGES: gl.constexpr = p_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = p_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = wt_bufs.type.shape[1]
    HALF: gl.constexpr = BLOCK_M // 2
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    it = 0
    for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=mma_layout)
        for ki in range(k_tiles):
            s = it % STAGES
            phase = (it // STAGES) & 1
            mbarrier.wait(ready.index(s), phase)  # Wᵀ's bytes (landed: the softmax partition waited for them too)
            mbarrier.wait(p_ready.index(s), phase)
            acc = warpgroup_mma(p_bufs.index(s).slice(WG * HALF, HALF, dim=0), wt_bufs.index(s).permute((1, 0)),
                                acc, is_async=True)
            # one wgmma left in flight: the previous step's has read its stage, which goes back to the loads
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=ki > 0)
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))  # the tile's last step (k_tiles >= 1)
        rows = pid_m * BLOCK_M + WG * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, mma_layout))
        cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_layout))
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        gl.store(out_ptr + rows[:, None].to(gl.int64) * stride_out + cols[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit(do_not_specialize=["M", "N", "K"])  # shapes reach the kernel via TMA; one compile for all
def softmax_mm_kernel(z_desc, wt_desc, out_ptr, stride_out, lse_ptr, scale_ptr, M, N, K, P_LAYOUT: gl.constexpr,
                      STAGES: gl.constexpr, GROUP_M: gl.constexpr, MMA_REGS: gl.constexpr):
    BLOCK_M: gl.constexpr = z_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = z_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = wt_desc.block_type.shape[0]
    z_bufs = gl.allocate_shared_memory(z_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], z_desc.layout)
    p_bufs = gl.allocate_shared_memory(z_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], P_LAYOUT)
    wt_bufs = gl.allocate_shared_memory(wt_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], wt_desc.layout)
    ready = _alloc_barriers(STAGES)  # the loads' bytes have landed (the expect is the one arrival)
    p_ready = _alloc_barriers(STAGES)  # the softmax tile is in p_bufs
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(empty.index(i), count=2)  # both MMA warpgroups release each stage
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    gl.warp_specialize([
        (_softmax_partition, (z_desc, wt_desc, z_bufs, wt_bufs, p_bufs, ready, p_ready, empty, lse_ptr, scale_ptr,
                              M, num_pid_m, num_pid_n, k_tiles, GROUP_M)),
        (_mma_partition, (p_bufs, wt_bufs, ready, p_ready, empty, out_ptr, stride_out, M, N, num_pid_m, num_pid_n,
                          k_tiles, 0, GROUP_M)),
        (_mma_partition, (p_bufs, wt_bufs, ready, p_ready, empty, out_ptr, stride_out, M, N, num_pid_m, num_pid_n,
                          k_tiles, 1, GROUP_M)),
    ], [4, 4], [MMA_REGS, MMA_REGS])


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------

BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M = 128, 256, 64, 3, 8  # 3 stages: 3 · 64 KiB of shared memory


def check_supported(logits, weight_t, lse, row_scale, out) -> None:
    """Raise ValueError unless the kernel can take these operands (dtypes, shapes, TMA alignment)."""
    gluon_gemm.check_operand_pair("scaled_softmax_mm", "logits", logits, "(C, V)", "weight_t", weight_t, "(H, V)")
    rows, size = logits.shape[0], weight_t.shape[0]
    for name, t in (("lse", lse), ("row_scale", row_scale)):
        if t.dtype != torch.float32 or tuple(t.shape) != (rows,) or not t.is_contiguous():
            raise ValueError(f"scaled_softmax_mm: {name} must be a contiguous ({rows},) float32 tensor, got "
                             f"{tuple(t.shape)} {t.dtype}")
    if tuple(out.shape) != (rows, size) or out.dtype not in (torch.float32, logits.dtype) or out.stride(1) != 1:
        raise ValueError(f"scaled_softmax_mm: out must be ({rows}, {size}) float32 or {logits.dtype} with unit "
                         f"column stride, got {tuple(out.shape)} {out.dtype}")
    gluon_gemm.check_supported(rows, size, logits.shape[1], logits.dtype, out.dtype)
    gluon_gemm._check_operand("logits", logits)
    gluon_gemm._check_operand("weight_t", weight_t)


def _launch_plan(logits, weight_t, lse, row_scale, out, programs):
    in_gl = gluon_gemm._TORCH_TO_GL[logits.dtype]
    z_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], in_gl)
    wt_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], in_gl)
    z_desc = gluon_gemm.TensorDescriptor.from_tensor(logits, [BLOCK_M, BLOCK_K], z_layout)
    # Wᵀ rather than W: its (256, 64) tile has 128-byte rows, what one swizzled TMA box holds
    wt_desc = gluon_gemm.TensorDescriptor.from_tensor(weight_t, [BLOCK_N, BLOCK_K], wt_layout)
    rows, vocab = logits.shape
    size = weight_t.shape[0]
    tiles = triton.cdiv(rows, BLOCK_M) * triton.cdiv(size, BLOCK_N)
    grid = (max(1, min(programs, tiles)), )
    # 4 + 2·4 warps: 384 threads of 168 registers (each MMA warpgroup's 64×256 float32 accumulator is 128)
    args = (z_desc, wt_desc, out, out.stride(0), lse, row_scale, rows, size, vocab, z_layout, STAGES, GROUP_M, 168)
    return grid, args, {"num_warps": 4, "maxnreg": 168}


def scaled_softmax_mm(logits, weight_t, lse, row_scale, out, *, num_programs=None):
    """out = (row_scale · exp(logits - lse)) @ weight_t.T, each element of the left factor rounded to the
    logits' dtype (as a stored gradient would be), the products summed in float32: logits (C, V) and
    weight_t = Wᵀ (H, V) bf16/fp16, lse and row_scale (C,) float32, out (C, H) float32 or the logits' dtype."""
    check_supported(logits, weight_t, lse, row_scale, out)
    programs = num_programs or gluon_gemm._num_sms(logits.device.index if logits.device.index is not None
                                                   else torch.cuda.current_device())
    grid, args, opts = _launch_plan(logits, weight_t, lse, row_scale, out, programs)
    softmax_mm_kernel[grid](*args, **opts)
    return out


def compile_for_target(*, out_dtype=torch.bfloat16, target=None):
    """Compile ``softmax_mm_kernel`` to a cubin without a GPU (``offline_compile.compile_kernel``)."""
    rows, vocab, size = 1000, 2056, 520  # runtime arguments: any supported shape gives the same kernel
    logits = torch.empty(rows, vocab, dtype=torch.bfloat16)
    weight_t = torch.empty(size, vocab, dtype=torch.bfloat16)
    floats = torch.empty(rows)
    _, args, opts = _launch_plan(logits, weight_t, floats, floats, torch.empty(rows, size, dtype=out_dtype), 132)
    return compile_kernel(softmax_mm_kernel, args, opts, target)
