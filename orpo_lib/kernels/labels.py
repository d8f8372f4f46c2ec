"""The label check: one program per sequence checks the label ids, counts the tokens each target
uses and writes the int32 ids the row kernels read (-1 where a token does not count). One launch
instead of a dozen small torch ops, which at small shapes would cost more than the row kernels.

It also counts, per chosen sequence, what keeps its pair from the one-pass schedule
(``schedule.eligible_pairs``): each token that the odds ratio counts but whose NLL id differs (or that the
NLL, while on, ignores), plus 1 if some NLL-only token (odds ratio ignored, NLL counted) comes after a
token the odds ratio counts. Where there are none, the sequence's kept tokens are NLL-only ones, whose
gradient of the logits b·(onehot(y') - P) is known before any GEMM, then the odds ratio's, whose gradient
is one coefficient of the sequence times onehot(y) - P: TRL's labels (prompt, then response) are so.

And it writes the order in which the kept tokens go through the GEMMs, before the counts are read back:
after the read-back the host only has to slice it, so the first GEMM follows at once (a dozen torch ops
there, each waiting on the host, cost about 1 ms of idle GPU at 2×1024 with TRL's labels). A program places
its sequence's kept tokens after those of the sequences before it in that order, which it counts itself:
re-reading their labels costs less than a second launch.
"""

from .. import _triton_mode  # noqa: F401 (decides compile vs interpret before @triton.jit runs)

import torch
import triton
import triton.language as tl

# label_stats_kernel's per-sequence outputs, in column order
LABEL_STATS = ("target_tokens", "kept_tokens", "nll_tokens", "bad_target_ids", "bad_nll_ids", "one_pass_blockers")


@triton.jit
def _counted(target_ptr, nll_target_ptr, stride_tb, stride_tt, stride_nb, stride_nt, seq, t, T, ignore_index, pairs,
             COMPUTE_NLL: tl.constexpr):
    """Sequence ``seq``'s labels at positions ``t``, and whether each target counts them."""
    in_seq = t < T
    target = tl.load(target_ptr + seq * stride_tb + t * stride_tt, mask=in_seq).to(tl.int64)
    nll_target = tl.load(nll_target_ptr + seq * stride_nb + t * stride_nt, mask=in_seq).to(tl.int64)
    target_counts = in_seq & (target != ignore_index)
    nll_counts = in_seq & (nll_target != ignore_index) & (seq < pairs) & COMPUTE_NLL
    return target, nll_target, target_counts, nll_counts


@triton.jit
def _sequence_in_order(k, pairs, PAIR_ORDER: tl.constexpr):
    """The k-th sequence of the row order: pair order (chosen 0, rejected 0, chosen 1, ...) or batch order."""
    if PAIR_ORDER:
        return k // 2 + (k % 2) * pairs
    return k


@triton.jit
def label_stats_kernel(
    target_ptr,  # (B, T) integer labels of the odds-ratio target
    nll_target_ptr,  # (B, T) integer labels of the NLL term (may be target_ptr itself)
    stride_tb, stride_tt, stride_nb, stride_nt,
    target_ids_ptr,  # (B, T) int32 out: the label, or -1 where the token does not count
    nll_ids_ptr,  # (B, T) int32 out: the same for the NLL term (chosen half only)
    stats_ptr,  # (B, N_STATS) int32 out: the LABEL_STATS of each sequence
    order_ptr,  # (B*T,) int64 out: the kept tokens' flattened indices in the row order, then zeros
    B,
    T,
    V,
    ignore_index,
    pairs,  # B / 2: sequences below it are chosen responses
    COMPUTE_NLL: tl.constexpr,
    N_STATS: tl.constexpr,  # len(LABEL_STATS)
    PAIR_ORDER: tl.constexpr,  # rows in pair order; else in token order
    BLOCK_T: tl.constexpr,
):
    k = tl.program_id(0)  # this program's sequence is the k-th of the row order
    seq = _sequence_in_order(k, pairs, PAIR_ORDER)
    offs = tl.arange(0, BLOCK_T)
    offset = 0  # the kept tokens of the sequences before it in the row order
    for before in range(0, k):
        other = _sequence_in_order(before, pairs, PAIR_ORDER)
        for start in range(0, T, BLOCK_T):
            _, _, target_counts, nll_counts = _counted(target_ptr, nll_target_ptr, stride_tb, stride_tt, stride_nb,
                                                       stride_nt, other, start + offs, T, ignore_index, pairs,
                                                       COMPUTE_NLL)
            offset += tl.sum((target_counts | nll_counts).to(tl.int32), axis=0)
    n_target = tl.zeros([BLOCK_T], dtype=tl.int32)
    n_nll = tl.zeros([BLOCK_T], dtype=tl.int32)
    bad_target = tl.zeros([BLOCK_T], dtype=tl.int32)
    bad_nll = tl.zeros([BLOCK_T], dtype=tl.int32)
    nll_mismatch = tl.zeros([BLOCK_T], dtype=tl.int32)
    last_nll_only = tl.full([BLOCK_T], -1, dtype=tl.int32)  # position of the last NLL-only token so far
    first_target = tl.full([BLOCK_T], T, dtype=tl.int32)  # position of the first odds-ratio token
    first_row = offset
    for start in range(0, T, BLOCK_T):
        t = start + offs
        in_seq = t < T
        target, nll_target, target_counts, nll_counts = _counted(
            target_ptr, nll_target_ptr, stride_tb, stride_tt, stride_nb, stride_nt, seq, t, T, ignore_index, pairs,
            COMPUTE_NLL)
        target_id = tl.where(target_counts, target, -1)
        nll_id = tl.where(nll_counts, nll_target, -1)
        tl.store(target_ids_ptr + seq * T + t, target_id.to(tl.int32), mask=in_seq)
        tl.store(nll_ids_ptr + seq * T + t, nll_id.to(tl.int32), mask=in_seq)
        kept = (target_counts | nll_counts).to(tl.int32)
        rank = tl.cumsum(kept, axis=0) - kept  # kept tokens before this one in the block
        tl.store(order_ptr + offset + rank, (seq * T + t).to(tl.int64), mask=kept != 0)
        offset += tl.sum(kept, axis=0)
        n_target += target_counts.to(tl.int32)
        n_nll += nll_counts.to(tl.int32)
        bad_target += (target_counts & ((target < 0) | (target >= V))).to(tl.int32)
        bad_nll += (nll_counts & ((nll_target < 0) | (nll_target >= V))).to(tl.int32)
        # chosen half only, and only with the NLL term: elsewhere no token has an NLL id to differ
        nll_mismatch += (target_counts & (seq < pairs) & COMPUTE_NLL & (nll_id != target_id)).to(tl.int32)
        last_nll_only = tl.maximum(last_nll_only, tl.where(nll_counts & ~target_counts, t, -1))
        first_target = tl.minimum(first_target, tl.where(target_counts, t, T))
    row = stats_ptr + seq * N_STATS
    tl.store(row + 0, tl.sum(n_target, axis=0))
    tl.store(row + 1, offset - first_row)
    tl.store(row + 2, tl.sum(n_nll, axis=0))
    tl.store(row + 3, tl.sum(bad_target, axis=0))
    tl.store(row + 4, tl.sum(bad_nll, axis=0))
    nll_only_after_target = tl.max(last_nll_only, axis=0) > tl.min(first_target, axis=0)
    tl.store(row + 5, tl.sum(nll_mismatch, axis=0) + nll_only_after_target.to(tl.int32))
    if k == B - 1:  # the last sequence of the order: zeros after every kept token (token 0, a row of hidden)
        for start in range(offset, B * T, BLOCK_T):
            tl.store(order_ptr + start + offs, tl.zeros([BLOCK_T], dtype=tl.int64), mask=start + offs < B * T)


def label_stats(target, nll_target, vocab: int, ignore_index: int, compute_nll: bool, pair_order: bool = True):
    """Launch ``label_stats_kernel``: int32 ids (-1 where a token does not count), the (B, 6) LABEL_STATS and the
    (B*T,) kept-row order: the kept tokens, in pair order or token order, then zeros (token 0), so that any
    prefix of it names rows of hidden."""
    batch, seq = target.shape
    nll_target = target if nll_target is None else nll_target
    target_ids, nll_ids = torch.empty(2, batch, seq, device=target.device, dtype=torch.int32)  # one allocation
    stats = torch.empty(batch, len(LABEL_STATS), device=target.device, dtype=torch.int32)
    order = torch.empty(batch * seq, device=target.device, dtype=torch.int64)
    label_stats_kernel[(batch,)](
        target, nll_target, target.stride(0), target.stride(1), nll_target.stride(0), nll_target.stride(1),
        target_ids, nll_ids, stats, order, batch, seq, vocab, ignore_index, batch // 2,
        COMPUTE_NLL=compute_nll, N_STATS=len(LABEL_STATS), PAIR_ORDER=pair_order,
        BLOCK_T=min(triton.next_power_of_2(seq), 1024), num_warps=4,
    )
    return target_ids, nll_ids, stats, order
