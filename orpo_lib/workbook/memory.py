"""Analytic peak-memory and cost model of the ORPO loss implementations.

Every function here is pure arithmetic on shapes, so notebooks, widgets and figures can ask
"how many bytes would this need?" for shapes no CPU could run. Memory is counted *over the
inputs*: hidden, weight and targets are already allocated before the loss is called, which is how
the benchmark reports ``peak_over_inputs_gib``.

Each implementation is described as a sequence of phases; a phase lists the tensors alive at that
moment. The peak is the phase with the largest sum. The component lists follow the code in
``orpo_lib.fused`` / ``orpo_lib.baseline`` and the published structure of Liger's ORPO loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import schedule
from ..schedule import accumulator_rows, auto_chunk_rows

GIB = 2**30
FP32_BYTES = 4

IMPLEMENTATIONS = ("seed_baseline", "baseline", "liger", "fused", "fused_lean")

# The lean setting trades computing most logits twice for a small logits buffer. At most 1664 rows:
# a T=4096 pair (8192 rows) becomes five blocks of 1639 rows, a T=1024 pair two of 1024, and the
# 16×4096 peak stays under 2 GiB with fewer (so cheaper) dW accumulations than 1024-row blocks.
LEAN_CHUNK_ROWS = 1664
# Per token the fused loss keeps four fp32 statistics (log-prob, NLL log-prob, logit sum, log-sum-exp), two
# int32 label vectors and an int64 row index.
FUSED_TOKEN_STATE_BYTES = 4 * 4 + 2 * 4 + 8
FUSED_LABEL_BYTES = 2 * 4 + 8  # of which the label check's outputs: the two int32 label vectors and the row index
# Columns of a tile of the statistics GEMM (kernels.gluon_row_stats.BLOCK_N): one set of partials per tile.
STATS_TILE_COLUMNS = 128

# Rates measured on the H200 for this project's shapes (bf16 GEMM, in-place row rewrite).
H200_GEMM_TFLOPS = 695.0
H200_ROW_KERNEL_TBPS = 3.5


@dataclass(frozen=True)
class Chunking:
    """How the fused loss splits B·T token rows into chunks of whole (chosen, rejected) pairs."""

    rows: int  # token rows whose logits exist at once (the chunk buffer's height)
    count: int  # chunks per call (blocks of logits computed for the gradient pass)
    passes: int  # 1, or 2 when a pair is larger than a chunk and most of its logits are computed twice
    one_pass: bool = False  # a pair larger than a chunk, in blocks per sequence, each block's logits once


def chunk_row_limit(batch: int, seq: int, chunk_size: int | None = None, vocab: int = 0, dtype_bytes: int = 2,
                    hidden: int = 0, dw_fp32: bool = True) -> int:
    """The most token rows whose logits may exist at once (the library's rule, without its free-memory cap).

    With ``hidden``, the default takes every row as one block when that needs no more memory than
    chunks with a float32 dW accumulator (``dw_fp32``); without it, that rule is left out.
    """
    if chunk_size is not None:
        return int(chunk_size)
    if not vocab:
        raise ValueError("the default chunk size depends on the vocabulary: pass vocab (or a chunk_size)")
    extra_rows = accumulator_rows(hidden, dtype_bytes, dw_fp32)
    return auto_chunk_rows(2 * seq, batch * seq, vocab, dtype_bytes, torch.device("cpu"), extra_rows)


def chunking(batch: int, seq: int, chunk_size: int | None = None, vocab: int = 0, dtype_bytes: int = 2, *,
             hidden: int = 0, dw_fp32: bool = True) -> Chunking:
    """Chunk geometry of the fused loss (with gradients) with every token counted (no ignored positions).

    ``chunk_size=None`` is the library default (pass ``vocab``): ``schedule.default_chunk_rows`` (4096 rows,
    more at a small vocabulary) or one whole pair if that is longer, or every row when they fit in that plus
    the rows a float32 dW accumulator would cost (pass ``hidden``), capped so the buffer stays within
    ``LOGITS_BUDGET_BYTES`` (on a GPU the library also caps it at a quarter of free memory, which this model
    ignores).
    """
    if batch % 2:
        raise ValueError(f"batch must be even (chosen half, rejected half), got {batch}")
    pairs = batch // 2
    pair_rows = 2 * seq
    limit = chunk_row_limit(batch, seq, chunk_size, vocab, dtype_bytes, hidden, dw_fp32)
    if limit >= pair_rows:
        pairs_per_chunk = min(pairs, limit // pair_rows)
        return Chunking(rows=pairs_per_chunk * pair_rows, count=math.ceil(pairs / pairs_per_chunk), passes=1)
    if chunk_size is None and one_pass_fits(seq, hidden, vocab, dtype_bytes, dw_fp32):
        # The automatic chunk size: each sequence in equal blocks, each block's logits computed once.
        blocks = math.ceil(seq / schedule.one_pass_block_rows(limit))
        return Chunking(rows=math.ceil(seq / blocks), count=pairs * 2 * blocks, passes=1, one_pass=True)
    # Otherwise the pair is split into equal blocks, a statistics pass over them, then a gradient pass
    # that computes their logits again.
    blocks = math.ceil(pair_rows / limit)
    return Chunking(rows=math.ceil(pair_rows / blocks), count=pairs * blocks, passes=2)


def one_pass_fits(seq: int, hidden: int, vocab: int, dtype_bytes: int, dw_fp32: bool) -> bool:
    """Whether a pair's one-pass sums fit the library's budget (its free-memory cap left out). The labels are
    taken to be eligible: the NLL on the odds ratio's tokens (``nll_target=None``)."""
    extra = schedule.one_pass_bytes(2 * seq, hidden, vocab, nll_only_rows=0,
                                    sum_itemsize=FP32_BYTES if dw_fp32 else dtype_bytes, stats_itemsize=FP32_BYTES,
                                    grad_hidden=True, grad_weight=True, grad_bias=False)
    return extra <= schedule.ONE_PASS_BUDGET_BYTES


def _fused_phases(batch, seq, hidden, vocab, dtype_bytes, chunk_size, dw_fp32, with_grad, statistics_in_gemm=False):
    tokens = batch * seq
    chunk = chunking(batch, seq, chunk_size, vocab, dtype_bytes, hidden=hidden, dw_fp32=dw_fp32)
    columns = schedule.logits_row_columns(vocab)  # rows start on 16-byte boundaries
    buffer = chunk.rows * columns * dtype_bytes
    # chunked.gemms.gemm_head: at an odd vocabulary the GEMMs take W's last rows as a 16-row copy with zero rows, and the dX
    # GEMMs, two of them, sum in float32 before their one rounding
    odd = columns != vocab
    head = {"head_tail": 16 * hidden * dtype_bytes if odd else 0}
    token_state = tokens * FUSED_TOKEN_STATE_BYTES
    if not with_grad:
        # Without gradients the chunks need not hold whole pairs, and read hidden's rows in place.
        rows = min(tokens, chunk_row_limit(batch, seq, chunk_size, vocab, dtype_bytes))
        if statistics_in_gemm:  # no buffer: each block's per-tile partials and its two target logits per row
            tiles = -(-vocab // STATS_TILE_COLUMNS)
            return [("chunk loop", {"tile_partials": 3 * tiles * rows * FP32_BYTES, "target_logits": 2 * rows * FP32_BYTES,
                                    "token_state": token_state})]
        loop = ("chunk loop", {"chunk_logits": rows * columns * dtype_bytes, "token_state": token_state, **head})
        if rows < tokens or not schedule.overlaps_read_backs(tokens, hidden, vocab):
            return [loop]
        # One block whose first rows' logits GEMM is queued before the read-back: those rows of hidden are
        # gathered beside the buffer, before the per-token statistics exist (the label check's outputs do).
        early_rows = min(tokens, schedule.early_rows(hidden, vocab))
        early = {"chunk_logits": rows * columns * dtype_bytes, "early_rows": early_rows * hidden * dtype_bytes,
                 "label_outputs": tokens * FUSED_LABEL_BYTES, **head}
        return [("early GEMM", early), loop]
    # With every token kept, one group of every pair reads hidden's rows and writes dX's in place (token
    # order); several groups copy their rows out for the GEMMs and their dX rows back.
    one_group = chunk.count == 1 or batch == 2
    gathered_rows = 0 if one_group else chunk.rows * hidden * dtype_bytes
    dx = tokens * hidden * dtype_bytes
    dw = vocab * hidden * dtype_bytes
    # the dW GEMMs take G's rows with their padding columns: a (padded V, H) result, its padding rows left out
    padded_dw = columns * hidden * dtype_bytes
    dw_operand = {"chunk_logits": buffer, "gathered_rows": gathered_rows, **head}
    dx_gemm = {**dw_operand, "chunk_dx_rows": gathered_rows,  # the chunk's dX rows, before they go into dX
               "chunk_dx_fp32": chunk.rows * hidden * FP32_BYTES if odd else 0}
    if chunk.count == 1:
        # One chunk: its dX and dW GEMMs wait for backward; dW is produced once, in the weight dtype, and dX,
        # where the call overlaps its read-backs, first in float32 (scaled on the device by the upstream gradient).
        overlap = schedule.overlaps_read_backs(tokens, hidden, vocab)
        dx_fp32 = chunk.rows * hidden * FP32_BYTES if overlap or odd else 0
        return [
            ("chunk dX GEMM", {**dx_gemm, "chunk_dx_fp32": dx_fp32, "dx": dx, "token_state": token_state}),
            ("chunk dW GEMM", {**dw_operand, "dw": padded_dw, "dx": dx, "token_state": token_state}),
        ]
    dw_accumulator = columns * hidden * (FP32_BYTES if dw_fp32 else dtype_bytes)
    if chunk.one_pass:
        return _one_pass_phases(batch, seq, hidden, chunk, buffer, dtype_bytes, dw_accumulator, dx, dw,
                                {"token_state": token_state, **head})
    common = {"dw_accumulator": dw_accumulator, "dx": dx, "token_state": token_state}
    # Backward scales the saved sums into new tensors and leaves the sums as they are (a retained graph
    # can run backward again), so dX and dW exist twice until autograd releases the saved ones.
    backward = {"dw_accumulator": dw_accumulator, "dw": dw, "dx": dx, "dx_grad": dx}
    return [("chunk dX GEMM", {**dx_gemm, **common}), ("chunk dW GEMM", {**dw_operand, **common}),
            ("backward", backward)]


def _one_pass_phases(batch, seq, hidden, chunk, buffer, dtype_bytes, dw_accumulator, dx, dw, forward_state):
    """At a pair's end: its two sequences' dW sums and its dX rows in float32, before their coefficients. One
    pair reads hidden and writes dX in token order; with several, the rows are gathered, their dX rows staged,
    and the sums from the second pair on add to a dW sum (the first pair's dW is made in place of its sum)."""
    pair_end = {"chunk_logits": buffer, "sequence_dw_sums": 2 * dw_accumulator,
                "pair_dx_rows_fp32": 2 * seq * hidden * FP32_BYTES, "dx": dx, **forward_state}
    if batch > 2:
        pair_end.update(dw_accumulator=dw_accumulator, gathered_rows=chunk.rows * hidden * dtype_bytes,
                        pair_dx_rows=2 * seq * hidden * dtype_bytes)
    backward = {"dw_accumulator": dw_accumulator, "dw": dw, "dx": dx, "dx_grad": dx}
    return [("pair end", pair_end), ("backward", backward)]


def _baseline_phases(batch, seq, hidden, vocab, dtype_bytes, with_grad):
    """orpo_lib.baseline: fp32 logits and their log_softmax, gathered twice (odds-ratio and NLL targets)."""
    logits = batch * seq * vocab
    forward = {"logits_fp32": logits * FP32_BYTES, "log_softmax_fp32": logits * FP32_BYTES}
    if not with_grad:
        return [("forward", forward)]
    # Autograd keeps the log_softmax output; each gather's backward scatters into a full fp32
    # tensor, and both exist before they are summed.
    gather_backward = {
        "log_softmax_fp32": logits * FP32_BYTES,
        "grad_gather_target_fp32": logits * FP32_BYTES,
        "grad_gather_nll_fp32": logits * FP32_BYTES,
    }
    gemm_backward = {
        "grad_logits": logits * dtype_bytes,
        "dw": vocab * hidden * dtype_bytes,
        "dx": batch * seq * hidden * dtype_bytes,
    }
    return [("forward", forward), ("gather backward", gather_backward), ("GEMM backward", gemm_backward)]


def _seed_baseline_phases(batch, seq, hidden, vocab, dtype_bytes, with_grad):
    """The anchors' baseline (the seed benchmark's Hugging Face reference): a cross-entropy over the
    chosen half adds its own fp32 log_softmax of half the logits, and the dtype logits stay alive."""
    logits = batch * seq * vocab
    forward = {
        "logits": logits * dtype_bytes,
        "logits_fp32": logits * FP32_BYTES,
        "chosen_log_softmax_fp32": logits // 2 * FP32_BYTES,
        "log_softmax_fp32": logits * FP32_BYTES,
    }
    if not with_grad:
        return [("forward", forward)]
    softmax_backward = {
        "log_softmax_fp32": logits * FP32_BYTES,
        "chosen_log_softmax_fp32": logits // 2 * FP32_BYTES,
        "grad_gather_fp32": logits * FP32_BYTES,
        "grad_logits_fp32": logits * FP32_BYTES,
    }
    return [("forward", forward), ("softmax backward", softmax_backward)]


def _liger_phases(batch, seq, hidden, vocab, dtype_bytes, with_grad):
    chunk_logits = 2 * seq * vocab  # one pair per chunk; chunking is over the batch only
    loop = {
        "chunk_logits": chunk_logits * dtype_bytes,
        "chunk_log_softmax_fp32": chunk_logits * FP32_BYTES,
    }
    if not with_grad:
        return [("chunk loop", loop)]
    loop.update(
        chunk_grad_logits=chunk_logits * dtype_bytes,
        dw_accumulator=vocab * hidden * dtype_bytes,
        dx=batch * seq * hidden * dtype_bytes,
    )
    return [("chunk loop", loop)]


def fused_chunk_rows(impl: str, chunk_rows: int | None) -> int | None:
    """The chunk_size a fused setting runs with: the lean one defaults to ``LEAN_CHUNK_ROWS``."""
    return LEAN_CHUNK_ROWS if impl == "fused_lean" and chunk_rows is None else chunk_rows


def memory_phases(
    impl: str,
    batch: int,
    seq: int,
    hidden: int,
    vocab: int,
    dtype_bytes: int = 2,
    chunk_rows: int | None = None,
    dw_fp32: bool | None = None,
    with_grad: bool = True,
    statistics_in_gemm: bool = False,
) -> list[tuple[str, dict[str, int]]]:
    """Every phase of one loss call (forward, plus backward when ``with_grad``) with its live bytes.

    ``chunk_rows`` and ``dw_fp32`` apply to the fused implementations only. ``None`` means the
    implementation's default: ``fused`` accumulates dW in fp32 with the default chunking,
    ``fused_lean`` uses ``LEAN_CHUNK_ROWS`` rows and accumulates dW in the weight dtype.
    ``statistics_in_gemm``: a call without gradients computes its row statistics inside the logits GEMM,
    as it does where ``schedule.statistics_in_gemm`` says so (the model knows no GPU).
    """
    shape = (batch, seq, hidden, vocab, dtype_bytes)
    if impl == "fused":
        return _fused_phases(*shape, chunk_rows, True if dw_fp32 is None else dw_fp32, with_grad, statistics_in_gemm)
    if impl == "fused_lean":
        return _fused_phases(*shape, fused_chunk_rows(impl, chunk_rows), False if dw_fp32 is None else dw_fp32, with_grad,
                             statistics_in_gemm)
    if impl == "baseline":
        return _baseline_phases(*shape, with_grad)
    if impl == "seed_baseline":
        return _seed_baseline_phases(*shape, with_grad)
    if impl == "liger":
        return _liger_phases(*shape, with_grad)
    raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLEMENTATIONS}")


def peak_bytes(impl: str, batch: int, seq: int, hidden: int, vocab: int, dtype_bytes: int = 2, **options) -> dict[str, int]:
    """The tensors alive at the peak of one loss call, name -> bytes (over the inputs)."""
    _, components = max(memory_phases(impl, batch, seq, hidden, vocab, dtype_bytes, **options), key=lambda p: sum(p[1].values()))
    return components


def peak_phase(impl: str, batch: int, seq: int, hidden: int, vocab: int, dtype_bytes: int = 2, **options) -> str:
    """Name of the phase at which the peak occurs."""
    name, _ = max(memory_phases(impl, batch, seq, hidden, vocab, dtype_bytes, **options), key=lambda p: sum(p[1].values()))
    return name


def peak_gib(impl: str, batch: int, seq: int, hidden: int, vocab: int, dtype_bytes: int = 2, **options) -> float:
    """Total peak over the inputs in GiB."""
    return sum(peak_bytes(impl, batch, seq, hidden, vocab, dtype_bytes, **options).values()) / GIB


def stage_costs(
    impl: str,
    batch: int,
    seq: int,
    hidden: int,
    vocab: int,
    dtype_bytes: int = 2,
    chunk_rows: int | None = None,
) -> list[dict]:
    """FLOPs and HBM bytes of each stage of a forward+backward call (fused or baseline).

    The fused row kernels read each chunk of logits for its statistics, then read it again and write
    it back as the gradient; a pair split into blocks computes most of its logits twice but reads
    them no more often.
    The baseline's elementwise chain (cast, log_softmax,
    gather backward, softmax backward, cast) touches the logits in fp32 several times.
    """
    tokens = batch * seq
    gemm_flops = 2 * tokens * hidden * vocab
    logits = tokens * vocab
    x_bytes = tokens * hidden * dtype_bytes
    w_bytes = vocab * hidden * dtype_bytes
    if impl in ("fused", "fused_lean"):
        chunk = chunking(batch, seq, fused_chunk_rows(impl, chunk_rows), vocab, dtype_bytes)
        w_reads = chunk.count * w_bytes
        stages = [{"stage": "logits GEMM", "flops": gemm_flops, "bytes": x_bytes + w_reads + logits * dtype_bytes}]
        if chunk.passes == 2:
            # every block of a pair but one (the last, still in the buffer) computes its logits again
            again = 1 - batch // 2 / chunk.count
            stages.append({"stage": "logits GEMM (recompute)", "flops": round(again * gemm_flops),
                           "bytes": round(again * (x_bytes + w_reads + logits * dtype_bytes))})
        stages += [
            {"stage": "row kernels (statistics; gradient in place)", "flops": 0, "bytes": 3 * logits * dtype_bytes},
            {"stage": "dX GEMM", "flops": gemm_flops, "bytes": logits * dtype_bytes + w_reads + x_bytes},
            {"stage": "dW GEMM", "flops": gemm_flops, "bytes": logits * dtype_bytes + x_bytes + chunk.count * vocab * hidden * 2 * FP32_BYTES},
        ]
        if chunk.one_pass:
            # per pair: its float32 dX rows written by the dX GEMM and read back, the two V×H sums read once more
            stages.append({"stage": "pair ends (float32 dX rows and dW sums scaled)", "flops": 0,
                           "bytes": 2 * tokens * hidden * FP32_BYTES + batch // 2 * 3 * vocab * hidden * FP32_BYTES})
        return stages
    if impl == "baseline":
        return [
            {"stage": "logits GEMM", "flops": gemm_flops, "bytes": x_bytes + w_bytes + logits * dtype_bytes},
            # cast to fp32, log_softmax (read + write), its backward (read out, grad; write), cast back
            {"stage": "fp32 softmax chain", "flops": 0, "bytes": logits * (dtype_bytes + 4 * 2 + 4 * 3 + 4 + dtype_bytes)},
            {"stage": "dX GEMM", "flops": gemm_flops, "bytes": logits * dtype_bytes + w_bytes + x_bytes},
            {"stage": "dW GEMM", "flops": gemm_flops, "bytes": logits * dtype_bytes + x_bytes + w_bytes},
        ]
    raise ValueError(f"stage costs are modelled for fused, fused_lean and baseline, not {impl!r}")


def floor_flops(batch: int, seq: int, hidden: int, vocab: int) -> int:
    """FLOPs of the three GEMMs any fused linear loss must do: logits, dX and dW."""
    return 3 * 2 * batch * seq * hidden * vocab


def predicted_ms(stages: list[dict], gemm_tflops: float = H200_GEMM_TFLOPS, bandwidth_tbps: float = H200_ROW_KERNEL_TBPS) -> float:
    """Roofline time: each stage costs the larger of its FLOP time and its byte time."""
    return sum(max(s["flops"] / (gemm_tflops * 1e12), s["bytes"] / (bandwidth_tbps * 1e12)) for s in stages) * 1e3


def model_vs_measured(record, impls: tuple[str, ...] = IMPLEMENTATIONS) -> list[dict]:
    """Each measured full-step peak of ``record`` next to the model's prediction for the same call."""
    dtype_bytes = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4, "fp32": 4}
    rows = []
    for r in record.results:
        if (r["provider"] not in impls or r.get("mode") != "full" or r.get("peak_over_inputs_gib") is None
                or r.get("status", "ok") != "ok" or r.get("mask", "none") != "none"):
            continue
        options = {}
        if r["provider"].startswith("fused"):
            options = {"chunk_rows": r.get("chunk_size"), "dw_fp32": r.get("fp32_weight_grad")}
        model = peak_gib(r["provider"], r["batch"], r["seq"], r["hidden"], r["vocab"], dtype_bytes[r.get("dtype", "bfloat16")], **options)
        measured = r["peak_over_inputs_gib"]
        rows.append({
            "impl": r["provider"], "batch": r["batch"], "seq": r["seq"], "hidden": r["hidden"], "vocab": r["vocab"],
            "chunk": r.get("chunk_size"),
            "measured_gib": measured, "model_gib": model, "error_pct": 100.0 * (model - measured) / measured,
        })
    return rows


def cost_summary(batch: int, seq: int, hidden: int, vocab: int, dtype_bytes: int = 2) -> dict:
    """The counts behind the motivation: how big the logits are, the GEMM floor, and the peaks."""
    logits = batch * seq * vocab
    floor = floor_flops(batch, seq, hidden, vocab)
    return {
        "logits": logits,
        "logits_gib_dtype": logits * dtype_bytes / GIB,
        "logits_gib_fp32": logits * FP32_BYTES / GIB,
        "floor_tflop": floor / 1e12,
        "floor_ms_predicted": floor / (H200_GEMM_TFLOPS * 1e12) * 1e3,
        "fused_ms_predicted": predicted_ms(stage_costs("fused", batch, seq, hidden, vocab, dtype_bytes)),
        "baseline_ms_predicted": predicted_ms(stage_costs("baseline", batch, seq, hidden, vocab, dtype_bytes)),
        "baseline_peak_gib": peak_gib("baseline", batch, seq, hidden, vocab, dtype_bytes),
        "fused_peak_gib": peak_gib("fused", batch, seq, hidden, vocab, dtype_bytes),
    }


def stage_table(impl: str, batch: int, seq: int, hidden: int, vocab: int, dtype_bytes: int = 2, chunk_rows: int | None = None) -> list[dict]:
    """Per stage: GFLOP, GB moved, arithmetic intensity and roofline milliseconds on the H200."""
    rows = []
    for stage in stage_costs(impl, batch, seq, hidden, vocab, dtype_bytes, chunk_rows):
        rows.append({
            "stage": stage["stage"],
            "gflop": stage["flops"] / 1e9,
            "gb": stage["bytes"] / 1e9,
            "flop_per_byte": stage["flops"] / stage["bytes"],
            "ms_roofline": predicted_ms([stage]),
        })
    return rows


def statistics_paths(rows: int, hidden: int, vocab: int, dtype_bytes: int = 2) -> dict[str, list[dict]]:
    """FLOPs and HBM bytes of each stage of the row statistics of one block, X (rows × H) times Wᵀ, three ways
    (the paths of ``bench.stats_gemm_sweep``): cuBLAS's logits GEMM alone, which writes the logits; that GEMM
    and ``row_stats_kernel``, which reads them back; and the statistics GEMM, whose epilogue writes per-tile
    partials (three float32 per row and column tile, two target logits per row) that a fold reads back."""
    flops = 2 * rows * hidden * vocab
    inputs = (rows + vocab) * hidden * dtype_bytes
    logits = rows * vocab * dtype_bytes
    partials = rows * FP32_BYTES * (3 * -(-vocab // STATS_TILE_COLUMNS) + 2)
    gemm = {"stage": "logits GEMM", "flops": flops, "bytes": inputs + logits}
    return {
        "cublas_mm": [gemm],
        "cublas_row_stats": [gemm, {"stage": "row stats (read)", "flops": 0, "bytes": logits}],
        "stats_gemm": [{"stage": "GEMM, statistics in its epilogue", "flops": flops, "bytes": inputs + partials},
                       {"stage": "fold of the partials (read)", "flops": 0, "bytes": partials}],
    }


def statistics_gemm_prediction(rows: int, hidden: int, vocab: int, dtype_bytes: int = 2) -> dict:
    """The roofline of ``statistics_paths``: the logits GEMM's time, each statistics path's over it, and the bytes
    the statistics GEMM leaves unmoved. The row-statistics pass costs ``rows·V·dtype_bytes`` of bandwidth against
    ``2·rows·H·V`` FLOPs of GEMM, a share of ``TFLOP/s · dtype_bytes / (2·H · TB/s)`` that halves as H doubles;
    the statistics GEMM pays only for its partials, if its epilogue hides behind the MMAs."""
    paths = statistics_paths(rows, hidden, vocab, dtype_bytes)
    ms = {path: predicted_ms(stages) for path, stages in paths.items()}
    # what each writes and reads back between the GEMM and the statistics: the logits, or the partials
    logits, partials = paths["cublas_row_stats"][1]["bytes"], paths["stats_gemm"][1]["bytes"]
    return {"rows": rows, "hidden": hidden, "vocab": vocab, "logits_gemm_ms": ms["cublas_mm"],
            "row_stats_x_mm": ms["cublas_row_stats"] / ms["cublas_mm"], "stats_gemm_x_mm": ms["stats_gemm"] / ms["cublas_mm"],
            "gb_not_moved": 2 * (logits - partials) / 1e9}


# Per token of ``vocab_parallel_orpo_loss``: the four float32 statistics, the two int32 target ids, four int32
# shard-local ids and an int64 row index.
VOCAB_PARALLEL_TOKEN_BYTES = 4 * 4 + 2 * 4 + 4 * 4 + 8


def vocab_parallel_phases(batch: int, seq: int, hidden: int, vocab: int, ranks: int, dtype_bytes: int = 2,
                          chunk_rows: int | None = None) -> list[tuple[str, dict[str, int]]]:
    """Every phase of one ``vocab_parallel_orpo_loss`` call with gradients on the rank with the largest shard
    (ceil(V / ranks) rows), with its live bytes over the inputs. A model of the code, not yet measured on
    several GPUs: the statistics pass, the all-gathers that combine the rows' statistics, a chunk of the
    gradient pass (its dX rows in float32, gathered from every rank), and backward (new dX and dW beside
    the saved sums)."""
    tokens = batch * seq
    shard = -(-vocab // ranks)
    rows = min(tokens, chunk_rows or schedule.DEFAULT_CHUNK_ROWS)
    resident = {"chunk_logits": rows * shard * dtype_bytes, "token_state": tokens * VOCAB_PARALLEL_TOKEN_BYTES}
    # a clone of the local lse, the 4 owned sums, every rank's lse (gathered, then stacked), the max, every
    # rank's 4 sums and their total: float32 per token
    combine = {"gathered_row_stats": tokens * FP32_BYTES * (1 + 4 + 2 * ranks + 1 + 4 * ranks + 4)}
    dx = tokens * hidden * dtype_bytes
    dw_accumulator = shard * hidden * FP32_BYTES
    gradient = {"dx": dx, "dw_accumulator": dw_accumulator,
                "chunk_dx_fp32_gathered": (ranks + 2) * rows * hidden * FP32_BYTES}  # own, every rank's, total
    backward = {"dx": dx, "dw_accumulator": dw_accumulator, "dx_grad": dx, "dw": shard * hidden * dtype_bytes}
    return [("statistics", resident), ("combine", {**resident, **combine}), ("gradient chunk", {**resident, **gradient}),
            ("backward", backward)]


def vocab_parallel_table(batch: int, seq: int, hidden: int, vocab: int, ranks=(1, 2, 4, 8), dtype_bytes: int = 2) -> list[dict]:
    """Per GPU at each number of ranks: the peak over the inputs, its phase, and the largest shard's head
    (the part of the inputs that shrinks with the ranks)."""
    rows = []
    for p in ranks:
        phase, parts = max(vocab_parallel_phases(batch, seq, hidden, vocab, p, dtype_bytes), key=lambda ph: sum(ph[1].values()))
        rows.append({"ranks": p, "peak_gib": sum(parts.values()) / GIB, "phase": phase,
                     "head_shard_gib": -(-vocab // p) * hidden * dtype_bytes / GIB})
    return rows
