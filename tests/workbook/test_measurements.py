"""The workbook's readers of benchmark records: the seed-shapes record and its statistics-GEMM sweep, TRL training."""

import json

import pytest

from orpo_lib.workbook import bench, measurements
from synthetic_records import (GPU, GRAD_GEMM_TIMES, STATS_GEMM_TIMES, grad_gemm_row, seed_shapes_record, stats_gemm_row,
                               write_seed_shapes_record)


def test_the_seed_record_is_the_newest_seed_shapes_file_and_names_its_gpu(tmp_path):
    assert measurements.latest_seed_record(tmp_path) is None
    (tmp_path / "bench-2026-12-09-h200.json").write_text(json.dumps(seed_shapes_record("NVIDIA H200")))
    write_seed_shapes_record(tmp_path)
    record = measurements.latest_seed_record(tmp_path)
    assert record.source == "seed-shapes-h200.json" and record.provenance["gpu"] == GPU
    sentence = measurements.measured_on(record)
    assert sentence.startswith(f"Every measured number below comes from one run on one GPU, {GPU}: torch ")
    assert sentence.count(GPU) == 1 and "seed-shapes-h200.json" in sentence and "commit 0123abc" in sentence


def test_stats_gemm_rows_are_the_sweep_over_cublas():
    record = measurements.BenchRecord(*(seed_shapes_record()[k] for k in ("provenance", "results", "sweeps")))
    rows = measurements.stats_gemm_rows(record)
    assert [(r["rows"], r["hidden"], r["vocab"]) for r in rows] == list(STATS_GEMM_TIMES)
    # on an H200 the rule takes no-grad calls of at least 8192 rows at V >= 65536
    assert [r["in_library"] for r in rows] == [False, True, True]
    for row, (mm, buffer, gemm) in zip(rows, STATS_GEMM_TIMES.values()):
        assert row["cublas_mm_ms"] == mm and row["status"] == "ok"
        assert row["row_stats_x_mm"] == pytest.approx(buffer / mm) and row["stats_gemm_x_mm"] == pytest.approx(gemm / mm)
        assert row["stats_gemm_x_mm_min"] == pytest.approx(0.995 * gemm / mm)
        assert row["stats_gemm_x_row_stats"] == pytest.approx(gemm / buffer)
        # the logits written and read back (bf16), less the partials: 3 float32 per 128-column tile and 2 per row
        tiles = -(-row["vocab"] // 128)
        assert row["gb_not_moved"] == pytest.approx(2 * row["rows"] * (row["vocab"] * 2 - 4 * (3 * tiles + 2)) / 1e9)
    # ranges of ±0.5 %: 6.7 against 6.8 ms does not overlap, 17.0 against 16.5 neither
    assert [r["against_row_stats"] for r in rows] == ["faster", "faster", "slower"]


def test_stats_gemm_verdict_compares_the_rule_with_the_measurement():
    level = stats_gemm_row(8192, 4096, 128256, 10.0, 10.5, 10.52, False)  # ranges overlap: level
    unsupported = stats_gemm_row(8192, 1024, 32000, 2.0, 2.2, 2.1, False) | {"status": "unsupported"}
    for key in ("stats_gemm_ms", "stats_gemm_min_ms", "stats_gemm_max_ms"):
        unsupported[key] = None
    rows = measurements.stats_gemm_rows(measurements.BenchRecord({}, [], {"stats_gemm": [
        *seed_shapes_record()["sweeps"]["stats_gemm"], level, unsupported]}))
    assert rows[3]["against_row_stats"] == "level" and rows[4]["against_row_stats"] is None
    assert rows[4]["stats_gemm_x_mm"] is None and rows[4]["row_stats_x_mm"] == pytest.approx(1.1)
    verdict = measurements.stats_gemm_verdict(rows)
    assert (verdict["shapes"], verdict["measured"]) == (5, 4)
    assert verdict["faster_or_level"] == ["16384×4096×128256", "4096×4096×128256", "8192×4096×128256"]
    assert verdict["in_library"] == ["16384×2048×151936", "16384×4096×128256"]
    assert verdict["differ"] == ["16384×2048×151936", "4096×4096×128256", "8192×4096×128256"]


def test_row_kernel_point_finds_the_library_launch():
    record = measurements.BenchRecord(*(seed_shapes_record()[k] for k in ("provenance", "results", "sweeps")))
    launch = bench.row_launches(True)[3]
    point = measurements.row_kernel_point(record, "grads", launch.block_v, launch.num_warps)
    assert (point["kernel"], point["block_v"], point["num_warps"]) == ("grads", launch.block_v, launch.num_warps)
    assert measurements.row_kernel_point(record, "stats", 3, 1) is None


def test_trl_training_rows_put_the_two_trainers_side_by_side():
    def row(trainer, pairs, ms, tokens, gib, max_pairs):
        return dict(model="m", seq=1024, pairs=pairs, trainer=trainer, median_step_ms=ms, tokens_per_s=tokens,
                    peak_gib=gib, max_pairs=max_pairs)
    record = {"rows": [row("stock", 2, 100.0, 4000.0, 30.0, 8), row("fused", 2, 80.0, 5000.0, 20.0, 16),
                       row("stock", 4, None, None, None, 8), row("fused", 4, 150.0, 5500.0, 25.0, 16)]}
    two, four = measurements.trl_training_rows(record)
    assert (two["pairs"], two["stock_ms"], two["fused_ms"], two["fused_gib"]) == (2, 100.0, 80.0, 20.0)
    assert two["fused_speedup"] == pytest.approx(1.25)
    assert (two["stock_max_pairs"], two["fused_max_pairs"]) == (8, 16)
    assert four["fused_speedup"] is None  # stock did not fit that row


def test_grad_gemm_rows_are_the_sweep_over_cublas_against_the_targets():
    record = measurements.BenchRecord(**seed_shapes_record())
    rows = measurements.grad_gemm_rows(record)
    assert [(r["rows"], r["hidden"], r["vocab"]) for r in rows] == list(GRAD_GEMM_TIMES)
    for row, (dx, dw, row_grads, buffer, gluon_dx, gluon_dw, gluon) in zip(rows, GRAD_GEMM_TIMES.values()):
        assert (row["cublas_dx_ms"], row["cublas_dw_ms"]) == (dx, dw)
        assert row["gluon_dx_x_cublas"] == pytest.approx(gluon_dx / dx)
        assert row["gluon_dw_x_cublas"] == pytest.approx(gluon_dw / dw)
        assert row["row_grads_x_gemms"] == pytest.approx(row_grads / (dx + dw))
        assert row["buffer_x_gemms"] == pytest.approx(buffer / (dx + dw))
        assert row["gluon_x_gemms"] == pytest.approx(gluon / (dx + dw)) and row["against_buffer"] == "faster"
    # H = 4096: 12.3 / 12.0 and 12.9 / 12.4 = 1.04, which misses 3 %; H = 1024: 1.12 and 1.06 miss 8 %
    assert [(r["target_x_cublas"], r["meets_target"]) for r in rows] == [(1.03, False), (1.08, False)]


def test_grad_gemm_rows_where_the_gluon_path_did_not_run():
    row = grad_gemm_row(4096, 2048, 151936, 3.0, 3.1, 0.4, 6.5, 1.0, 1.0, 1.0) | {"status": "unsupported"}
    for path in ("gluon_dx", "gluon_dw", "gluon"):
        for stat in ("ms", "min_ms", "max_ms"):
            row[f"{path}_{stat}"] = None
    row["gluon_dx_rel_err"] = row["gluon_dw_rel_err"] = row["bitwise_repeatable"] = None
    record = measurements.BenchRecord(**(seed_shapes_record() | {"sweeps": {"grad_gemm": [row]}}))
    (got,) = measurements.grad_gemm_rows(record)
    assert got["gluon_dx_x_cublas"] is None and got["meets_target"] is None and got["against_buffer"] is None
    assert got["buffer_x_gemms"] == pytest.approx(6.5 / 6.1)
    assert got["target_x_cublas"] == 1.08 and got["status"] == "unsupported"
