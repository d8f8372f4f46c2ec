"""The chunk schedule: which token rows go together through the logits buffer, decided before any GEMM.

Pure functions of shapes, options and the per-sequence token counts. ``plan_chunks`` packs whole
(chosen, rejected) pairs into chunks, because a token's gradient depends on its pair; a pair longer
than a chunk is split into equal blocks and takes two passes (statistics of every block, then each
block's logits again for its gradient). ``single_block`` decides from shapes alone whether every row
fits in one block, whose gradient GEMMs then wait for backward.
"""

from dataclasses import dataclass

import torch

# Rows per chunk by default: large enough that every GEMM runs at full rate, small enough that
# the C×V buffer stays near 1 GiB at V = 128K in bf16. A pair longer than this gets a chunk of its own.
DEFAULT_CHUNK_ROWS = 4096
# The most bytes of logits the automatic choice lets exist at once.
LOGITS_BUDGET_BYTES = 8 << 30


@dataclass
class ChunkGroup:
    """Whole pairs [first_pair, end_pair) whose rows [blocks[0][0], blocks[-1][1]) are processed together."""

    first_pair: int
    end_pair: int
    blocks: list  # (start_row, end_row) ranges of at most chunk_rows rows; more than one → two passes


def plan_chunks(pair_rows: list, chunk_rows: int) -> list:
    """Pack pairs greedily into groups of at most ``chunk_rows`` rows; split a pair that alone exceeds it
    into the fewest blocks of at most ``chunk_rows`` rows, all of (nearly) the same size."""
    groups, first_pair, first_row, row = [], 0, 0, 0
    for pair, rows in enumerate(pair_rows):
        if row > first_row and row - first_row + rows > chunk_rows:
            groups.append(ChunkGroup(first_pair, pair, [(first_row, row)]))
            first_pair, first_row = pair, row
        row += rows
        if row - first_row > chunk_rows:  # this pair alone: blocks of equal size, none a small remainder
            block_rows = -(-(row - first_row) // -(-(row - first_row) // chunk_rows))
            blocks = [(r, min(r + block_rows, row)) for r in range(first_row, row, block_rows)]
            groups.append(ChunkGroup(first_pair, pair + 1, blocks))
            first_pair, first_row = pair + 1, row
    if row > first_row:
        groups.append(ChunkGroup(first_pair, len(pair_rows), [(first_row, row)]))
    return groups


def auto_chunk_rows(largest_pair_rows: int, total_rows: int, vocab: int, itemsize: int, device: torch.device,
                    accumulator_rows: int = 0) -> int:
    """``DEFAULT_CHUNK_ROWS``, or one whole pair if longer, within the logits budget (and a quarter of free memory).

    Several chunks accumulate dW in a float32 tensor that costs as much memory as ``accumulator_rows``
    rows of logits; when every row fits in a chunk plus that many, they go in one block instead, which
    needs no more memory and skips the accumulation and the final conversion.
    """
    budget = LOGITS_BUDGET_BYTES
    if device.type == "cuda":
        budget = min(budget, torch.cuda.mem_get_info(device)[0] // 4)
    return min(wanted_chunk_rows(largest_pair_rows, total_rows, accumulator_rows), budget_rows(vocab, itemsize, budget))


def budget_rows(vocab: int, itemsize: int, budget: int = LOGITS_BUDGET_BYTES) -> int:
    """Rows of logits that fit in ``budget`` bytes."""
    return max(1, budget // (vocab * itemsize))


def wanted_chunk_rows(largest_pair_rows: int, total_rows: int, accumulator_rows: int = 0) -> int:
    """``auto_chunk_rows`` before any memory cap."""
    rows = max(DEFAULT_CHUNK_ROWS, largest_pair_rows)
    return total_rows if total_rows <= rows + accumulator_rows else rows


def accumulator_rows(hidden_size: int, itemsize: int, fp32_weight_grad: bool) -> int:
    """Rows of logits (V entries of ``itemsize`` bytes each) that take the memory a float32 dW accumulator
    needs beyond dW itself (V×H×(4 − itemsize) bytes); 0 when dW accumulates in its own dtype."""
    if not fp32_weight_grad or itemsize >= 4:
        return 0
    return hidden_size * (4 - itemsize) // itemsize


def single_block(batch: int, seq: int, hidden_size: int, vocab: int, itemsize: int, *, chunk_size, fp32_weight_grad: bool,
                 grad_weight: bool) -> bool:
    """Whether every token row, counted or not, fits in one block of the gradient schedule.

    Decided from shapes and options alone (not from how many tokens the labels keep), so that a compiled
    graph knows which tensors forward keeps for backward: one block keeps its gradient of the logits,
    several keep the summed dX, dW and dbias. The free-memory cap of ``auto_chunk_rows`` is left out for
    the same reason; the static budget applies.
    """
    tokens = batch * seq
    if chunk_size is not None:
        return tokens <= chunk_size
    extra = accumulator_rows(hidden_size, itemsize, fp32_weight_grad) if grad_weight else 0
    return tokens <= min(wanted_chunk_rows(2 * seq, tokens, extra), budget_rows(vocab, itemsize))
