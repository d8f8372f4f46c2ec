"""The chunk schedule: which token rows go together through the logits buffer, decided before any GEMM.

Pure functions of shapes, options and the per-sequence token counts (the free-memory caps aside).
``plan_chunks`` packs whole (chosen, rejected) pairs into chunks, because a token's gradient depends on
its pair; a pair longer than a chunk is split into blocks, and ``plan_passes`` decides how it is done:

* one pass, where every row's gradient of the logits is either known before any GEMM (the chosen
  sequence's NLL-only rows, which come first) or one coefficient per sequence times
  d log p(y) / dlogits (``eligible_pairs``), and the sums fit the memory budget (``one_pass_bytes``,
  ``one_pass_budget``): each block's logits are computed once; an NLL-only block's GEMMs add to the
  call's gradients at once, the others' to per-sequence sums, which the pair's two coefficients scale at
  its end. Its blocks (at most ``one_pass_block_rows``) never straddle the NLL-only/response or the
  chosen/rejected boundary.
* two passes otherwise (a token the odds ratio counts with another NLL id, or an NLL-only token after
  the response starts, or too little memory): statistics of every block, then each block's logits again
  for its gradient, in blocks as large as the chunk.

``single_block`` decides from shapes alone whether every row fits in one block (whose gradient GEMMs, if any,
then wait for backward).
"""

from dataclasses import dataclass

import torch

# Rows per chunk by default: at least DEFAULT_CHUNK_ROWS, large enough that every GEMM runs at full rate, and
# as many more multiples of it as CHUNK_LOGITS_BYTES of logits hold (4096 rows at V = 128K in bf16, 16384 at
# V = 32000): fewer chunks add less to the float32 dW sum and queue fewer launches. On an H100 at 8×2048,
# V = 32000, one block of 16384 rows took 1.27 against 1.50× the floor at H = 1024 and 1.09 against 1.18× at
# H = 4096 (chunk-rows-ab-h100.json). A pair longer than this gets a chunk of its own.
DEFAULT_CHUNK_ROWS = 4096
CHUNK_LOGITS_BYTES = 1 << 30
# The most bytes of logits the automatic choice lets exist at once.
LOGITS_BUDGET_BYTES = 8 << 30
# Rows per block of a one-pass pair under the automatic chunk size: enough for every GEMM to run at full
# rate; a larger block would only make the buffer larger, as no block's logits are computed twice.
ONE_PASS_BLOCK_ROWS = 8192
# The most bytes a one-pass pair's sums may take (within a quarter of free memory on a GPU).
ONE_PASS_BUDGET_BYTES = 16 << 30


def logits_row_columns(vocab: int) -> int:
    """Columns a row of the logits buffer spans: the vocabulary rounded up to a multiple of 16, so that every row
    starts on a 16-byte boundary in a way Triton can see (it specialises an integer argument divisible by 16, and
    only then proves a row's address aligned for 16-byte loads); cuBLAS needs 16 bytes too. At an odd vocabulary
    (GPT-2's 50257; 32001, a Llama's 32000 plus a pad token) rows packed back to back are not: on an H100 the
    statistics kernel then took 0.69 against 0.30 ms over 8192 rows of 50257 (odd-vocab-steps-h100.json),
    and cuBLAS is slower still (``chunked.gemms.gemm_head``)."""
    return -(-vocab // 16) * 16


@dataclass(frozen=True)
class ChunkGroup:
    """Whole pairs [first_pair, end_pair) whose rows [blocks[0][0], blocks[-1][1]) are processed together."""

    first_pair: int
    end_pair: int
    blocks: list  # (start_row, end_row) ranges; more than one: a single pair, in one pass or two
    rejected_start: int | None = None  # one pass: the rejected sequence's first row; None: one block or two passes
    # one pass: the chosen sequence's first row that the odds ratio counts; the rows before it, from
    # blocks[0][0], count for the NLL alone (TRL's prompt)
    response_start: int | None = None

    @property
    def one_pass(self) -> bool:
        return self.rejected_start is not None


def plan_chunks(pair_rows: list, chunk_rows: int) -> list:
    """Pack pairs greedily into groups of at most ``chunk_rows`` rows; split a pair that alone exceeds it
    into the fewest blocks of at most ``chunk_rows`` rows, all of (nearly) the same size."""
    groups, first_pair, first_row, row = [], 0, 0, 0
    for pair, rows in enumerate(pair_rows):
        if row > first_row and row - first_row + rows > chunk_rows:
            groups.append(ChunkGroup(first_pair, pair, [(first_row, row)]))
            first_pair, first_row = pair, row
        row += rows
        if row - first_row > chunk_rows:  # this pair alone, in blocks
            groups.append(ChunkGroup(first_pair, pair + 1, split_rows(first_row, row, chunk_rows)))
            first_pair, first_row = pair + 1, row
    if row > first_row:
        groups.append(ChunkGroup(first_pair, len(pair_rows), [(first_row, row)]))
    return groups


def split_rows(start: int, end: int, max_rows: int) -> list:
    """Rows [start, end) in the fewest blocks of at most ``max_rows`` rows, all of (nearly) the same size, so
    that none is a small remainder."""
    block_rows = -(-(end - start) // -(-(end - start) // max_rows))
    return [(r, min(r + block_rows, end)) for r in range(start, end, block_rows)]


def eligible_pairs(one_pass_blockers: list) -> list:
    """Which pairs can take one pass: those whose chosen sequence has no one-pass blocker (per sequence,
    from the label check; 0 without the NLL term): no token that the odds ratio counts with another NLL id
    (or none), and no NLL-only token after one that the odds ratio counts.

    With a = dL/dlogp of the sequence's odds-ratio tokens and b = -1/N of its NLL tokens, the chosen rows
    are then NLL-only ones, G = b·(onehot(y') - P), known before any GEMM, followed by G = (a + b)·U, and
    the rejected ones G = a·U, where U = m·(onehot(y) - P) = d log p(y) / dlogits.
    """
    pairs = len(one_pass_blockers) // 2
    return [blockers == 0 for blockers in one_pass_blockers[:pairs]]


def one_pass_bytes(pair_rows: int, hidden_size: int, vocab: int, *, nll_only_rows: int, sum_itemsize: int,
                   stats_itemsize: int, grad_hidden: bool, grad_weight: bool, grad_bias: bool) -> int:
    """What a pair in one pass holds beyond the logits buffer until its end: per sequence a dW sum in the dW
    sum's dtype (a row per column of the buffer, ``logits_row_columns``) and a V dbias sum, and the dX rows of
    its odds-ratio rows before their coefficient (in the statistics dtype, so that each dX element is rounded
    once). A pair with ``nll_only_rows`` adds their gradients to the call's dW and dbias sums before its end,
    which the first such pair makes: one more of each, counted whether or not an earlier pair made them already."""
    sums = 2 + (nll_only_rows > 0)
    return (grad_weight * sums * logits_row_columns(vocab) * hidden_size * sum_itemsize
            + grad_bias * sums * vocab * stats_itemsize
            + grad_hidden * (pair_rows - nll_only_rows) * hidden_size * stats_itemsize)


def one_pass_budget(chunk_size, device: torch.device) -> int:
    """``ONE_PASS_BUDGET_BYTES``, within a quarter of free memory on a GPU (as ``auto_chunk_rows``); 0 when a
    chunk size is given, because that is a bound on the memory the call may take, which the sums would break."""
    return 0 if chunk_size is not None else memory_cap(ONE_PASS_BUDGET_BYTES, device)


def memory_cap(budget: int, device: torch.device) -> int:
    """``budget``, or a quarter of the free memory if less on a GPU."""
    if device.type == "cuda":
        return min(budget, torch.cuda.mem_get_info(device)[0] // 4)
    return budget


def choose_one_pass(eligible: list, pair_bytes: list, budget: int) -> list:
    """Per pair: one pass if eligible and its sums (``one_pass_bytes``) fit the budget; else two passes."""
    return [ok and extra <= budget for ok, extra in zip(eligible, pair_bytes)]


def one_pass_block_rows(chunk_rows: int) -> int:
    """Rows per block of a pair in one pass: the automatic chunk size, at most ``ONE_PASS_BLOCK_ROWS``."""
    return min(chunk_rows, ONE_PASS_BLOCK_ROWS)


def plan_passes(groups: list, chosen_rows: list, nll_only_rows: list, one_pass: list, block_rows: int) -> list:
    """``plan_chunks``'s groups, each split pair that may take one pass (``one_pass``, per pair) planned again
    as one, in blocks of at most ``block_rows``. ``chosen_rows``: rows of each chosen sequence, which come
    first among its pair's rows; ``nll_only_rows``: how many of them count for the NLL alone, which come
    first among the chosen rows (rows keep token order within a sequence)."""
    return [one_pass_group(g, chosen_rows[g.first_pair], nll_only_rows[g.first_pair], block_rows)
            if len(g.blocks) > 1 and one_pass[g.first_pair] else g for g in groups]


def one_pass_group(group: ChunkGroup, chosen_rows: int, nll_only_rows: int, block_rows: int) -> ChunkGroup:
    """The split pair of ``group`` in one pass: no block straddles the NLL-only/response or the
    chosen/rejected boundary, so that each block's gradient is either final or one sequence's, before its
    coefficient."""
    start, end = group.blocks[0][0], group.blocks[-1][1]
    response, rejected = start + nll_only_rows, start + chosen_rows
    blocks = [block for first, last in ((start, response), (response, rejected), (rejected, end)) if last > first
              for block in split_rows(first, last, block_rows)]
    return ChunkGroup(group.first_pair, group.end_pair, blocks, rejected_start=rejected, response_start=response)


def auto_chunk_rows(largest_pair_rows: int, total_rows: int, vocab: int, itemsize: int, device: torch.device,
                    accumulator_rows: int = 0) -> int:
    """``default_chunk_rows``, or one whole pair if longer, within the logits budget (and a quarter of free memory).

    Several chunks accumulate dW in a float32 tensor that costs as much memory as ``accumulator_rows``
    rows of logits; when every row fits in a chunk plus that many, they go in one block instead, which
    needs no more memory and skips the accumulation and the final conversion.
    """
    budget = memory_cap(LOGITS_BUDGET_BYTES, device)
    return min(wanted_chunk_rows(largest_pair_rows, total_rows, vocab, itemsize, accumulator_rows),
               budget_rows(vocab, itemsize, budget))


def default_chunk_rows(vocab: int, itemsize: int) -> int:
    """The most whole multiples of ``DEFAULT_CHUNK_ROWS`` rows whose logits fit in ``CHUNK_LOGITS_BYTES`` (at least
    one)."""
    return max(1, CHUNK_LOGITS_BYTES // (DEFAULT_CHUNK_ROWS * vocab * itemsize)) * DEFAULT_CHUNK_ROWS


def budget_rows(vocab: int, itemsize: int, budget: int | None = None) -> int:
    """Rows of logits that fit in ``budget`` bytes (default ``LOGITS_BUDGET_BYTES``)."""
    return max(1, (LOGITS_BUDGET_BYTES if budget is None else budget) // (vocab * itemsize))


def wanted_chunk_rows(largest_pair_rows: int, total_rows: int, vocab: int, itemsize: int,
                      accumulator_rows: int = 0) -> int:
    """``auto_chunk_rows`` before any memory cap."""
    rows = max(default_chunk_rows(vocab, itemsize), largest_pair_rows)
    return total_rows if total_rows <= rows + accumulator_rows else rows


def accumulator_rows(hidden_size: int, itemsize: int, fp32_weight_grad: bool) -> int:
    """Rows of logits (V entries of ``itemsize`` bytes each) that take the memory a float32 dW accumulator
    needs beyond dW itself (V×H×(4 − itemsize) bytes); 0 when dW accumulates in its own dtype."""
    if not fp32_weight_grad or itemsize >= 4:
        return 0
    return hidden_size * (4 - itemsize) // itemsize


# A single block's first rows go through the logits GEMM before the label counts are read back, so that the
# GPU is busy while the host reads them and plans the call (from the read-back to the next GEMM's launch the
# host took 0.26 ms on an H100 machine, small-call-stalls-h100.json): about 0.4 ms of
# GEMM at 600 TFLOP/s, in whole 256-row tiles.
EARLY_GEMM_FLOPS = 240 * 10**9


def early_rows(hidden_size: int, vocab: int) -> int:
    """Rows of a single block's logits GEMM queued before the label counts are read back (the caller takes at
    most every row): few, because those past the kept tokens are computed for nothing."""
    rows = -(-EARLY_GEMM_FLOPS // (2 * hidden_size * vocab))
    return -(-rows // 256) * 256


def overlaps_read_backs(tokens: int, hidden_size: int, vocab: int) -> bool:
    """Whether a single block of ``tokens`` rows queues GEMM work ahead of its two read-backs (the early rows'
    logits, backward's dX GEMM): only where its logits GEMM is longer than the early rows'. A smaller call is
    bound by the host, whose work the overlap adds to: 2×1024 at H=1024, V=32000 (0.55 ms of GEMMs) ran 4-8 %
    slower with it (early-gemm-ab-h100.json)."""
    return tokens > early_rows(hidden_size, vocab)


def single_block(batch: int, seq: int, hidden_size: int, vocab: int, itemsize: int, *, chunk_size, fp32_weight_grad: bool,
                 grad_weight: bool) -> bool:
    """Whether every token row, counted or not, fits in one block (with or without gradients).

    Decided from shapes and options alone (not from how many tokens the labels keep), so that a compiled
    graph knows which tensors forward keeps for backward: one block keeps its gradient of the logits,
    several keep the summed dX, dW and dbias. The free-memory cap of ``auto_chunk_rows`` is left out for
    the same reason; the static budget applies. (Without gradients, ``grad_weight`` is False.)
    """
    tokens = batch * seq
    if chunk_size is not None:
        return tokens <= chunk_size
    extra = accumulator_rows(hidden_size, itemsize, fp32_weight_grad) if grad_weight else 0
    return tokens <= min(wanted_chunk_rows(2 * seq, tokens, vocab, itemsize, extra), budget_rows(vocab, itemsize))


# Where a no-grad call takes its row statistics from the Gluon statistics GEMM. Measured on the H200 against
# cuBLAS's logits GEMM + row_stats, per block (figures/data/stats-gemm-variants-h200.json): faster at
# V ≥ 128256 for H from 1024 to 4096 (by 0.4-8 % of the logits GEMM), level at V = 32000 and H = 4096,
# slower at V = 32000 and H = 1024 (a tile then holds a row's target so often that the epilogue falls
# behind). Whole eval calls (stats-gemm-eval-h200.json): the peak over the inputs drops
# from 1-2 GiB to under 0.1 GiB; the time goes from 1.25 to 1.19-1.22 × the logits GEMM at H = 1024 and
# V ≥ 151936, is within ±6 % at H = 4096 and 8192 rows or more, and is 8 % worse at 2×1024 (2048 rows).
# On an H100 the same whole calls took 6-17 % longer than the buffer path at five shapes, in two runs
# (stats-gemm-eval-h100.json; the kernel alone 1.10-1.38 × cuBLAS's logits GEMM there,
# stats-gemm-stages-h100.json): the GPUs named here are the ones where it measured faster or level.
STATS_GEMM_MIN_VOCAB = 65536
STATS_GEMM_MIN_ROWS = 8192
STATS_GEMM_GPUS = ("H200",)  # a word of torch.cuda.get_device_name


def statistics_in_gemm(capability: tuple | None, device_name: str, dtype: torch.dtype, has_bias: bool,
                       hidden_size: int, vocab: int, rows: int) -> bool:
    """Whether a call without gradients computes the row statistics of its ``rows`` kept token rows inside
    the logits GEMM (a Hopper GPU in STATS_GEMM_GPUS, bf16 or fp16 inputs, no bias, rows that TMA can address)
    instead of writing the logits to a buffer and reading them back. ``capability`` and ``device_name`` are
    the CUDA device's (capability None: not a CUDA device, or kernels interpreted)."""
    # (the kernel's operand rules, gluon_row_stats.check_supported, want H a multiple of 8; V may be anything)
    return (capability is not None and capability[0] == 9 and any(w in STATS_GEMM_GPUS for w in device_name.split())
            and dtype in (torch.bfloat16, torch.float16) and not has_bias and hidden_size % 8 == 0
            and vocab >= STATS_GEMM_MIN_VOCAB and rows >= STATS_GEMM_MIN_ROWS)
