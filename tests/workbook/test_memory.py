"""The analytic memory model: hand-computed peaks, agreement with the library's chunking, and with H200 measurements."""

import pytest
import torch

from orpo_lib import schedule
from orpo_lib.chunked import gemms as chunked  # (new_logits_buffer, with_padding)
from orpo_lib.workbook import memory
from orpo_lib.workbook.measurements import H200_ANCHORS, latest_bench_record

H, V = 4096, 128256


@pytest.mark.parametrize("batch,seq", [(2, 1024), (16, 4096), (6, 100)])
def test_baseline_peaks_by_hand(batch, seq):
    logits = batch * seq * V
    gemm_backward = 2 * logits + V * H * 2 + batch * seq * H * 2  # bf16 dlogits, dW, dX
    assert sum(memory.peak_bytes("baseline", batch, seq, H, V).values()) == max(12 * logits, gemm_backward)
    assert sum(memory.peak_bytes("seed_baseline", batch, seq, H, V).values()) == 14 * logits


def test_baseline_at_16x4096_is_about_110_gib_for_the_seed_reference():
    assert memory.peak_gib("seed_baseline", 16, 4096, H, V) == pytest.approx(109.6, abs=0.05)
    assert memory.peak_gib("baseline", 16, 4096, H, V) == pytest.approx(93.94, abs=0.01)


def test_fused_default_multi_chunk_by_hand():
    batch, seq = 16, 4096
    tokens, rows = batch * seq, 2 * seq  # one pair per chunk: 8192 rows
    # buffer, gathered rows, the chunk's dX rows, fp32 dW, dX, per-token state
    chunk_loop = rows * V * 2 + rows * H * 2 + rows * H * 2 + V * H * 4 + tokens * H * 2 + tokens * 32
    backward = V * H * 4 + V * H * 2 + 2 * tokens * H * 2  # saved fp32 dW and dX sums, new dW and dX
    assert sum(memory.peak_bytes("fused", batch, seq, H, V).values()) == max(chunk_loop, backward)
    assert memory.peak_phase("fused", batch, seq, H, V) == "chunk dX GEMM"
    # at 16×1024 the loop is smaller (4096-row chunks) and backward's second dX makes the peak
    assert memory.peak_phase("fused", 16, 1024, H, V) == "backward"


def test_fused_single_chunk_by_hand():
    batch, seq = 2, 1024
    tokens = rows = batch * seq
    # token order: hidden's rows read in place; dX in float32, then scaled into hidden's dtype
    dx_gemm = rows * V * 2 + rows * H * 4 + tokens * H * 2 + tokens * 32
    dw_gemm = rows * V * 2 + V * H * 2 + tokens * H * 2 + tokens * 32
    expected = max(dx_gemm, dw_gemm)
    assert sum(memory.peak_bytes("fused", batch, seq, H, V).values()) == expected


def test_lean_is_bounded_by_weight_gradient_not_logits():
    phases = dict(memory.memory_phases("fused_lean", 16, 4096, H, V))
    assert phases["chunk dX GEMM"]["chunk_logits"] == 1639 * V * 2  # a 8192-row pair in five equal blocks
    assert phases["chunk dX GEMM"]["dw_accumulator"] == V * H * 2
    # backward: the saved dW and dX sums in the weight dtype, and the new dW and dX beside them
    assert sum(memory.peak_bytes("fused_lean", 16, 4096, H, V).values()) == 2 * V * H * 2 + 2 * 16 * 4096 * H * 2
    assert memory.peak_gib("fused_lean", 16, 4096, H, V) < 0.7 * memory.peak_gib("fused", 16, 4096, H, V)


def test_one_block_when_it_costs_no_more_than_a_float32_accumulator():
    """8×1024 (8192 rows) fits in a 4096-row chunk plus the 4096 rows of logits that an fp32 dW
    accumulator would cost at H = 4096: one block, same peak; 16×1024 does not."""
    assert memory.chunking(8, 1024, None, V, 2, hidden=H) == memory.Chunking(rows=8192, count=1, passes=1)
    assert memory.peak_gib("fused", 8, 1024, H, V) <= memory.peak_gib("fused", 8, 1024, H, V, chunk_rows=4096)
    assert memory.chunking(16, 1024, None, V, 2, hidden=H).count == 4
    # without a float32 accumulator (weight-dtype dW, or fp32 weights) there is nothing to trade
    assert memory.chunking(8, 1024, None, V, 2, hidden=H, dw_fp32=False).count == 2
    assert memory.chunking(8, 1024, None, V, 4, hidden=H).count == 2


def test_logits_rows_start_on_16_byte_boundaries():
    """An odd vocabulary gets a buffer a few columns wider, so that each row starts on a 16-byte boundary; the
    memory model counts those columns."""
    assert [schedule.logits_row_columns(v) for v in (32000, 32001, 50257, 128256)] == [32000, 32016, 50272, 128256]
    assert schedule.logits_row_columns(517) == 528
    like = torch.empty(0, dtype=torch.bfloat16)
    buffer = chunked.new_logits_buffer(5, 50257, like)
    assert buffer.shape == (5, 50257) and buffer.stride() == (50272, 1)
    assert all((buffer[i].data_ptr() - buffer.data_ptr()) % 16 == 0 for i in range(5))
    padded = chunked.with_padding(buffer[:3])
    assert padded.shape == (3, 50272) and padded.is_contiguous() and padded.data_ptr() == buffer.data_ptr()
    phases = dict(memory.memory_phases("fused", 2, 1024, 1024, 50257, 2, with_grad=False))
    assert phases["chunk loop"]["chunk_logits"] == 2048 * 50272 * 2


def test_default_chunk_holds_about_a_gibibyte_of_logits():
    """4096 rows at V = 128256 and above (a GiB of bf16 logits at 128K), whole multiples of 4096 below: 16384
    rows at V = 32000, so that 8×2048 at H = 1024 is one block, where it had four chunks."""
    assert [schedule.default_chunk_rows(v, 2) for v in (256000, 151936, 128256, 65536, 50257, 32000)] == \
        [4096, 4096, 4096, 8192, 8192, 16384]
    assert schedule.default_chunk_rows(32000, 4) == 8192
    for v in (32000, 50257, 128256):
        rows = schedule.default_chunk_rows(v, 2)
        assert rows * v * 2 <= schedule.CHUNK_LOGITS_BYTES or rows == schedule.DEFAULT_CHUNK_ROWS
        assert (rows + schedule.DEFAULT_CHUNK_ROWS) * v * 2 > schedule.CHUNK_LOGITS_BYTES
    assert memory.chunking(8, 2048, None, 32000, 2, hidden=1024) == memory.Chunking(rows=16384, count=1, passes=1)
    assert memory.chunking(8, 4096, None, 32000, 2, hidden=2048).count == 2  # 32768 rows: two chunks of two pairs
    assert schedule.single_block(8, 2048, 1024, 32000, 2, chunk_size=None, fp32_weight_grad=True, grad_weight=True)
    assert not schedule.single_block(8, 2048, 1024, 128256, 2, chunk_size=None, fp32_weight_grad=True,
                                     grad_weight=True)
    with pytest.raises(ValueError, match="vocab"):
        memory.chunking(8, 2048)


@pytest.mark.parametrize("batch,seq,chunk_size", [
    (2, 1024, None), (8, 1024, None), (16, 1024, None), (8, 1536, None), (16, 4096, None), (4, 300, None),
    (8, 4096, 1024), (4, 1024, 2048), (6, 100, 450), (2, 32768, None),
])
def test_chunking_matches_the_library(batch, seq, chunk_size):
    """The model's chunks are the library's plan for labels whose NLL is on the odds ratio's tokens."""
    pair_rows = [2 * seq] * (batch // 2)
    rows = chunk_size or schedule.auto_chunk_rows(2 * seq, batch * seq, V, 2, torch.device("cpu"),
                                               schedule.accumulator_rows(H, 2, True))
    sums = schedule.one_pass_bytes(2 * seq, H, V, nll_only_rows=0, sum_itemsize=4, stats_itemsize=4,
                                   grad_hidden=True, grad_weight=True, grad_bias=False)
    one_pass = schedule.choose_one_pass([True] * (batch // 2), [sums] * (batch // 2),
                                        schedule.one_pass_budget(chunk_size, torch.device("cpu")))
    groups = schedule.plan_passes(schedule.plan_chunks(pair_rows, rows), [seq] * (batch // 2), [0] * (batch // 2),
                                  one_pass, schedule.one_pass_block_rows(rows))
    model = memory.chunking(batch, seq, chunk_size, V, 2, hidden=H)
    assert model.rows == max(end - start for g in groups for start, end in g.blocks)
    assert model.count == sum(len(g.blocks) for g in groups)
    assert model.one_pass == any(g.one_pass for g in groups)
    assert model.passes == (2 if any(len(g.blocks) > 1 and not g.one_pass for g in groups) else 1)


def test_one_pass_at_long_context_by_hand():
    """2×32768: each sequence in four 8192-row blocks; at the pair's end the buffer, two float32 V×H sums,
    the pair's float32 dX rows, dX and the per-token state; then backward's dW and dX beside the saved ones."""
    batch, seq = 2, 32768
    tokens = batch * seq
    assert memory.chunking(batch, seq, None, V, 2, hidden=H) == memory.Chunking(8192, 8, 1, one_pass=True)
    pair_end = 8192 * V * 2 + 2 * V * H * 4 + tokens * H * 4 + tokens * H * 2 + tokens * 32
    backward = V * H * 4 + V * H * 2 + 2 * tokens * H * 2
    assert sum(memory.peak_bytes("fused", batch, seq, H, V).values()) == max(pair_end, backward)
    assert memory.peak_gib("fused", batch, seq, H, V) < 12
    # a chunk size given takes two passes, and so does the lean setting
    assert memory.chunking(batch, seq, 16384, V, 2, hidden=H).passes == 2
    assert not any(s["stage"].endswith("(recompute)") for s in memory.stage_costs("fused", batch, seq, H, V))


def test_odd_batch_is_rejected():
    with pytest.raises(ValueError, match="even"):
        memory.chunking(3, 16)


def test_model_matches_the_anchors():
    rows = memory.model_vs_measured(H200_ANCHORS)
    assert len(rows) == 16
    assert max(abs(r["error_pct"]) for r in rows) < 2.0


def test_model_matches_the_h200_bench_record():
    """The recorded peaks of this library's implementations are the counted tensors; Liger's small
    per-chunk temporaries are not modelled."""
    rows = memory.model_vs_measured(latest_bench_record())
    assert {r["impl"] for r in rows} == {"baseline", "fused", "fused_lean", "liger"} and len(rows) == 32
    assert max(abs(r["error_pct"]) for r in rows if r["impl"] != "liger") < 0.1
    assert max(abs(r["error_pct"]) for r in rows if r["impl"] == "liger") < 2.5


def test_model_matches_the_default_chunks_of_an_h100_record():
    """The default chunk of eight shapes at the GiB-of-logits rule: one block at V = 32000 (8×2048) and V = 50257,
    two 16384-row chunks at 8×4096, V = 32000, and 4096-row chunks at V ≥ 128256."""
    from orpo_lib.workbook import measurements

    record = measurements.load_bench_record(measurements.DATA_DIR / "chunk-rows-ab-h100.json")
    rows = memory.model_vs_measured(record, impls=("fused",))
    assert len(rows) == 8
    # V = 50257 was measured before its rows were padded to 16 columns and W copied to match (chunked.gemms.gemm_head)
    aligned = [r for r in rows if r["vocab"] % 16 == 0]
    assert len(aligned) == 7 and max(abs(r["error_pct"]) for r in aligned) < 0.1


def test_model_matches_odd_vocabularies_of_an_h100_record():
    """At an odd vocabulary the buffer's rows are padded to 16 columns, the GEMMs take W's last rows as a 16-row copy
    with zero rows, the two dX GEMMs sum in float32, and the dW GEMMs make a row per column of the buffer: the model
    counts each, against single blocks (V = 50257, 32001, 128257), several blocks (8×4096, V=128257), a long pair's
    one pass (2×16384, V=32001) and two aligned controls, with and without gradients."""
    from orpo_lib.workbook import measurements

    record = measurements.load_bench_record(measurements.DATA_DIR / "two-part-head-ab-h100.json")
    rows = memory.model_vs_measured(record, impls=("fused",))
    assert sorted((r["batch"], r["seq"], r["vocab"]) for r in rows) == [
        (2, 1024, 128256), (2, 1024, 128257), (2, 16384, 32001), (4, 2048, 50257), (8, 2048, 32000), (8, 2048, 32001),
        (8, 2048, 32001), (8, 4096, 128257)]
    assert max(abs(r["error_pct"]) for r in rows) < 0.1
    no_grad = record.select("fused", "eval", mask="none")
    assert len(no_grad) == 8
    # Small allocations move a no-grad peak by up to 1 MiB from run to run: 2×1024, V=128256 peaked at 504.03 MiB
    # here and at 503.03 MiB (the model) in ab-padded-aligned-…-5742090 with the same code.
    for r in no_grad:
        model = memory.peak_gib("fused", r["batch"], r["seq"], r["hidden"], r["vocab"], with_grad=False)
        assert abs(r["peak_over_inputs_gib"] - model) < max(0.001 * model, 1.5 / 1024), r


def test_model_matches_eval_calls_that_queue_their_first_gemm_early():
    """No-grad single blocks whose first rows' logits GEMM is queued before the read-back (an H100 record): the
    gathered early rows beside the buffer and the label check's outputs are the peak."""
    from orpo_lib.workbook import measurements

    record = measurements.load_bench_record(measurements.DATA_DIR / "eval-early-gemm-ab-h100.json")
    rows = record.select("fused", "eval", mask="none")
    assert len(rows) == 7
    for r in rows:
        if r["vocab"] % 16:  # measured before the rows of an odd vocabulary were padded (chunked.gemms.gemm_head)
            continue
        phases = dict(memory.memory_phases("fused", r["batch"], r["seq"], r["hidden"], r["vocab"], with_grad=False))
        model = sum(memory.peak_bytes("fused", r["batch"], r["seq"], r["hidden"], r["vocab"], with_grad=False).values())
        assert sum(phases["early GEMM"].values()) == model
        assert abs(r["peak_over_inputs_gib"] * memory.GIB - model) < 0.001 * model, r


def test_eval_needs_less_than_training():
    for impl in memory.IMPLEMENTATIONS:
        assert memory.peak_gib(impl, 8, 1024, H, V, with_grad=False) < memory.peak_gib(impl, 8, 1024, H, V)


def test_stage_costs_count_three_gemms_and_most_of_a_fourth_when_recomputing():
    gemm = 2 * 8 * 4096 * H * V
    default = memory.stage_costs("fused", 8, 4096, H, V)
    lean = memory.stage_costs("fused_lean", 8, 4096, H, V)
    assert sum(s["flops"] for s in default) == 3 * gemm == memory.floor_flops(8, 4096, H, V)
    # lean: each 8192-row pair in five blocks, four of which compute their logits a second time
    assert sum(s["flops"] for s in lean) == 3 * gemm + round(4 / 5 * gemm)
    floor_ms = memory.floor_flops(8, 4096, H, V) / (memory.H200_GEMM_TFLOPS * 1e12) * 1e3
    assert floor_ms < memory.predicted_ms(default) < 1.1 * floor_ms
    assert memory.predicted_ms(memory.stage_costs("baseline", 8, 4096, H, V)) > 1.15 * floor_ms


def test_unknown_implementation():
    with pytest.raises(ValueError, match="unknown implementation"):
        memory.peak_bytes("cce", 2, 16, H, V)


def test_eval_with_statistics_in_gemm_matches_the_measured_peaks():
    """Eval calls on the H200 whose statistics came from inside the logits GEMM (no buffer): the model's
    partials + target logits + token state against the measured peak over the inputs; a few KiB of label
    statistics the model leaves out are the difference."""
    from orpo_lib.workbook import measurements

    record = measurements.load_bench_record(measurements.DATA_DIR / "stats-gemm-eval-h200.json")
    checked = 0
    for r in record.select("fused", "eval"):
        in_gemm = r["vocab"] >= 65536  # (this record predates the 8192-row threshold)
        # and the default chunk size that grows at small vocabularies: its chunks were 4096 rows or a pair
        old_default = max(schedule.DEFAULT_CHUNK_ROWS, 2 * r["seq"])
        model = sum(memory.peak_bytes("fused", r["batch"], r["seq"], r["hidden"], r["vocab"], with_grad=False,
                                      chunk_rows=old_default, statistics_in_gemm=in_gemm).values())
        measured = r["peak_over_inputs_gib"] * memory.GIB
        assert 0 <= measured - model <= 8192, (r["batch"], r["seq"], r["vocab"], measured, model)
        checked += in_gemm
    assert checked == 9
    assert sum(memory.peak_bytes("fused", 16, 4096, 4096, 128256, with_grad=False, statistics_in_gemm=True).values()) < \
        sum(memory.peak_bytes("fused", 16, 4096, 4096, 128256, with_grad=False).values()) / 20


def test_stats_tile_columns_are_the_kernels():
    gluon_row_stats = pytest.importorskip("orpo_lib.kernels.gluon_row_stats")
    assert memory.STATS_TILE_COLUMNS == gluon_row_stats.BLOCK_N


def test_vocab_parallel_memory_per_gpu():
    table = memory.vocab_parallel_table(16, 4096, 4096, 128256)
    assert [row["ranks"] for row in table] == [1, 2, 4, 8]
    peaks = [row["peak_gib"] for row in table]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > 2 * peaks[-1]  # more ranks, less per GPU
    assert table[1]["head_shard_gib"] == pytest.approx(table[0]["head_shard_gib"] / 2, rel=1e-4)
    one, eight = (dict(memory.vocab_parallel_phases(16, 4096, 4096, 128256, p)) for p in (1, 8))
    assert one["statistics"]["chunk_logits"] == 4096 * 128256 * 2
    assert eight["statistics"]["chunk_logits"] == 4096 * 16032 * 2  # ceil(128256 / 8) rows
    # what does not shrink with the ranks: dX, and the gathered per-row statistics and chunk dX rows grow
    assert eight["backward"]["dx"] == one["backward"]["dx"] == 16 * 4096 * 4096 * 2
    assert eight["combine"]["gathered_row_stats"] > one["combine"]["gathered_row_stats"]
    assert eight["gradient chunk"]["chunk_dx_fp32_gathered"] == 10 * 4096 * 4096 * 4


def test_statistics_gemm_prediction_counts_the_pass_it_saves():
    from orpo_lib.workbook import bench

    for rows, hidden, vocab in bench.STATS_GEMM_SHAPES:
        paths = memory.statistics_paths(rows, hidden, vocab)
        # what each path writes and reads between the GEMM and the statistics, as the sweep records it
        written_read = bench.stats_gemm_bytes(rows, vocab, 2)
        assert paths["cublas_row_stats"][1]["bytes"] == written_read["cublas_row_stats"][1]
        assert paths["stats_gemm"][1]["bytes"] == written_read["stats_gemm"][1]
        p = memory.statistics_gemm_prediction(rows, hidden, vocab)
        # the GEMM is compute-bound: the buffer path pays the read of the logits, TFLOP/s / (H · TB/s) of the GEMM
        assert p["row_stats_x_mm"] - 1 == pytest.approx(memory.H200_GEMM_TFLOPS / (hidden * memory.H200_ROW_KERNEL_TBPS))
        assert 1 < p["stats_gemm_x_mm"] < 1.01 < p["row_stats_x_mm"]
        assert p["logits_gemm_ms"] == pytest.approx(2 * rows * hidden * vocab / (memory.H200_GEMM_TFLOPS * 1e9))
    small, large = (memory.statistics_gemm_prediction(16384, h, 151936) for h in (2048, 4096))
    assert small["row_stats_x_mm"] - 1 == pytest.approx(2 * (large["row_stats_x_mm"] - 1))
