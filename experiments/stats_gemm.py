"""Experiment: the logits GEMM with the row statistics in its epilogue, for a no-grad forward (no logits stored).

Without gradients the logits are only reduced: per row a log-sum-exp, two target logits and a sum.
``logits_stats_kernel`` computes ``X @ W.T (+ bias)`` one BM×BN tile at a time (a persistent grid,
TMA loads) and reduces each tile while it is still in registers, in float32, writing per (tile,
row) partials: the tile's max, its sum of exp(logit - max) without the target's column, and its sum
of logits; the tile holding a row's target (or NLL target) writes that logit. ``combine_stats_kernel``
folds the partials of each row into the same outputs as ``kernels.row_stats_kernel``.

Compared with cuBLAS + row_stats_kernel this skips writing the C×V logits and reading them back
(one pass of 2·C·V bytes), and it needs no C×V buffer. The reductions come from the float32
accumulator, not from logits rounded to the input dtype.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from orpo_lib._triton_mode import INTERPRET
from orpo_lib.kernels import _log_probs

@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and launch of ``logits_stats_kernel``."""

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    group_m: int = 32  # row tiles that sweep the vocabulary together, so each W tile is read once from HBM
    num_stages: int = 3
    num_warps: int = 8
    warp_specialize: bool = False


# The best of experiments/stats_gemm_sweep.py on the H200 (figures/data/stats-gemm-sweep-2026-12-02-h200.json).
GPU_CONFIG = GemmConfig()
# The interpreter's cost grows with the number of block operations, not their size.
INTERPRETER_CONFIG = GemmConfig(block_m=32, block_n=64, block_k=32, group_m=4, num_stages=1, num_warps=4)


@triton.jit
def logits_stats_kernel(
    x_desc,  # (C, H) rows of hidden, BM×BK blocks
    w_desc,  # (V, H) weight, BN×BK blocks
    bias_ptr,  # (V,) or unused without HAS_BIAS
    target_ptr,  # (C,) int32 odds-ratio target id, -1 where the token does not count
    nll_target_ptr,  # (C,) int32 NLL target id, -1 where it does not count
    tile_max_ptr,  # (tiles along V, C) fp32 out: max of the row's logits in the tile
    tile_sum_ptr,  # (tiles along V, C) fp32 out: sum of exp(logit - tile max) without the target's column
    tile_logit_sum_ptr,  # (tiles along V, C) fp32 out: sum of the row's logits in the tile
    target_logit_ptr,  # (C,) fp32 out: the target's logit (written by the tile that holds it)
    nll_logit_ptr,  # (C,) fp32 out: the NLL target's logit
    C, V, H,
    HAS_BIAS: tl.constexpr,
    SEPARATE_NLL: tl.constexpr,  # an NLL target that may differ from the odds-ratio target
    UPCAST: tl.constexpr,  # the interpreter computes bf16 products wrongly: take them in fp32 there
    NUM_PROGRAMS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    tiles_m = tl.cdiv(C, BM)
    tiles_n = tl.cdiv(V, BN)
    per_group = GROUP_M * tiles_n
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_PROGRAMS, flatten=True, warp_specialize=WARP_SPECIALIZE):
        # Grouped order: GROUP_M row tiles take each BN-column strip of W in turn, while it is in L2.
        first_m = tile // per_group * GROUP_M
        group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
        m0 = (first_m + tile % group_rows) * BM
        tile_n = tile % per_group // group_rows
        n0 = tile_n * BN

        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, H, BK):
            a = x_desc.load([m0, k])
            b = w_desc.load([n0, k])
            if UPCAST:
                a, b = a.to(tl.float32), b.to(tl.float32)
            acc = tl.dot(a, b.T, acc)

        rows = m0 + tl.arange(0, BM)
        cols = n0 + tl.arange(0, BN)
        in_rows = rows < C
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=cols < V, other=0.0).to(tl.float32)[None, :]
        # No branch on the data below: it would stop the loop over tiles from being software-pipelined.
        # Columns past V hold zeros (the loads pad with them): harmless in the sum of logits, but they
        # must not count in the max or the exponentials.
        logit_sum = tl.sum(acc, axis=1)
        acc = tl.where(cols[None, :] < V, acc, float("-inf"))
        tile_max = tl.max(acc, axis=1)
        target = tl.load(target_ptr + rows, mask=in_rows, other=-1)
        is_target = cols[None, :] == target[:, None]
        tile_sum = tl.sum(tl.where(is_target, 0.0, tl.exp(acc - tile_max[:, None])), axis=1)
        has_target = (target >= n0) & (target < n0 + BN)
        tl.store(target_logit_ptr + rows, tl.sum(tl.where(is_target, acc, 0.0), axis=1), mask=has_target)
        if SEPARATE_NLL:  # otherwise the NLL target is the target (or none) and shares its logit
            nll_target = tl.load(nll_target_ptr + rows, mask=in_rows, other=-1)
            is_nll = cols[None, :] == nll_target[:, None]
            has_nll = (nll_target >= n0) & (nll_target < n0 + BN)
            tl.store(nll_logit_ptr + rows, tl.sum(tl.where(is_nll, acc, 0.0), axis=1), mask=has_nll)

        out = tile_n.to(tl.int64) * C + rows
        tl.store(tile_max_ptr + out, tile_max, mask=in_rows)
        tl.store(tile_sum_ptr + out, tile_sum, mask=in_rows)
        tl.store(tile_logit_sum_ptr + out, logit_sum, mask=in_rows)


@triton.jit
def combine_stats_kernel(
    tile_max_ptr, tile_sum_ptr, tile_logit_sum_ptr,  # (tiles, C) partials from logits_stats_kernel
    target_logit_ptr, nll_logit_ptr,  # (C,)
    target_ptr, nll_target_ptr,  # (C,) int32, -1 where the token does not count
    token_ptr,  # (C,) int64 index of each row in the flattened (B*T) per-token outputs
    logp_ptr, nll_logp_ptr, logit_sum_ptr, lse_ptr,  # (B*T,) fp32 out, as from row_stats_kernel
    C, tiles,
    BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_rows = rows < C
    offs_t = tl.arange(0, BLOCK_T)
    row_max = tl.full([BLOCK_R], float("-inf"), tl.float32)
    other_sum = tl.zeros([BLOCK_R], tl.float32)
    logit_sum = tl.zeros([BLOCK_R], tl.float32)
    for start in range(0, tiles, BLOCK_T):  # BLOCK_T tiles × BLOCK_R rows at a time, rows contiguous
        t = start + offs_t
        at = t[:, None].to(tl.int64) * C + rows[None, :]
        valid = (t[:, None] < tiles) & in_rows[None, :]
        part_max = tl.load(tile_max_ptr + at, mask=valid, other=float("-inf"))
        new_max = tl.maximum(row_max, tl.max(part_max, axis=0))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)  # rows past C: no -inf - -inf
        part_sum = tl.load(tile_sum_ptr + at, mask=valid, other=0.0)
        other_sum = other_sum * tl.exp(row_max - safe_max) + \
            tl.sum(part_sum * tl.exp(part_max - safe_max[None, :]), axis=0)
        logit_sum += tl.sum(tl.load(tile_logit_sum_ptr + at, mask=valid, other=0.0), axis=0)
        row_max = new_max
    target = tl.load(target_ptr + rows, mask=in_rows, other=-1)
    nll_target = tl.load(nll_target_ptr + rows, mask=in_rows, other=-1)
    target_logit = tl.load(target_logit_ptr + rows, mask=in_rows & (target >= 0), other=0.0)
    nll_logit = tl.load(nll_logit_ptr + rows, mask=in_rows & (nll_target >= 0), other=0.0)
    other_sum = tl.where(in_rows, other_sum, 1.0)  # rows past C: no log(0)
    lse, logp, nll_logp = _log_probs(row_max, other_sum, target_logit, nll_logit, target, nll_target)
    token = tl.load(token_ptr + rows, mask=in_rows, other=0)
    tl.store(logp_ptr + token, tl.where(target >= 0, logp, 0.0), mask=in_rows)
    tl.store(nll_logp_ptr + token, tl.where(nll_target >= 0, nll_logp, 0.0), mask=in_rows)
    tl.store(logit_sum_ptr + token, logit_sum, mask=in_rows)
    tl.store(lse_ptr + token, lse, mask=in_rows)


def default_config() -> GemmConfig:
    return INTERPRETER_CONFIG if INTERPRET else GPU_CONFIG


def workspace(rows: int, vocab: int, device, config: GemmConfig = None) -> torch.Tensor:
    """The partials of up to ``rows`` rows, flat: (3, tiles along V, rows) float32, then (2, rows)."""
    tiles = triton.cdiv(vocab, (config or default_config()).block_n)
    return torch.empty((3 * tiles + 2) * rows, device=device, dtype=torch.float32)


def _partials(workspace, rows: int, vocab: int, config: GemmConfig):
    # views of the workspace for a chunk of ``rows`` rows (the tile partials have stride ``rows``)
    tiles = triton.cdiv(vocab, config.block_n)
    tile_max, tile_sum, tile_logit_sum = workspace[: 3 * tiles * rows].view(3, tiles, rows)
    target_logit, nll_logit = workspace[3 * tiles * rows: (3 * tiles + 2) * rows].view(2, rows)
    return tiles, (tile_max, tile_sum, tile_logit_sum, target_logit, nll_logit)


def tile_stats(x, weight, bias, target, nll_target, workspace, config: GemmConfig = None, *,
               separate_nll=True) -> None:
    """Launch ``logits_stats_kernel`` for the logits ``x @ weight.T (+ bias)``: x (C, H); target and
    nll_target (C,) int32; the partials go to ``workspace`` (from ``workspace()``, for at least C rows).
    ``separate_nll=False`` promises that each NLL target is the row's target or -1."""
    config = config or default_config()
    rows, hidden = x.shape
    vocab = weight.shape[0]
    tiles, partials = _partials(workspace, rows, vocab, config)
    programs = min(triton.cdiv(rows, config.block_m) * tiles, _programs(x.device))
    logits_stats_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [config.block_m, config.block_k]),
        TensorDescriptor.from_tensor(weight, [config.block_n, config.block_k]),
        bias if bias is not None else x, target, nll_target, *partials, rows, vocab, hidden,
        HAS_BIAS=bias is not None, SEPARATE_NLL=separate_nll, UPCAST=INTERPRET and x.dtype == torch.bfloat16, NUM_PROGRAMS=programs,
        BM=config.block_m, BN=config.block_n, BK=config.block_k, GROUP_M=config.group_m,
        WARP_SPECIALIZE=config.warp_specialize, num_stages=config.num_stages, num_warps=config.num_warps,
    )


def combine(workspace, rows: int, vocab: int, target, nll_target, token, logp, nll_logp, logit_sum, lse,
            config: GemmConfig = None) -> None:
    """Launch ``combine_stats_kernel``: the partials of ``tile_stats`` (same ``rows``, ``vocab``, ``config``)
    into the per-token outputs at ``token`` (C,) int64, as ``kernels.row_stats`` writes them."""
    tiles, partials = _partials(workspace, rows, vocab, config or default_config())
    block_rows = 32
    combine_stats_kernel[(triton.cdiv(rows, block_rows),)](
        *partials, target, nll_target, token, logp, nll_logp, logit_sum, lse, rows, tiles,
        BLOCK_T=64, BLOCK_R=block_rows, num_warps=4,
    )


def _programs(device) -> int:
    """One program per SM (persistent); a handful in the interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4
