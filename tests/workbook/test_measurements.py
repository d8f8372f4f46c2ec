"""The measurement tables of the statistics GEMM: what the kernel-tuning notebook shows from its records."""

import json

import pytest

from orpo_lib.workbook import measurements


def test_statistics_gemm_and_eval_tables(tmp_path):
    (tmp_path / "stats-gemm-2026-01-01-x.json").write_text(json.dumps({"provenance": {}, "results": [
        {"rows": 8, "hidden": 16, "vocab": 32, "cublas_mm_ms": 2.0, "gluon_mm_ms": 2.2, "mm_plus_row_stats_ms": 2.5,
         "stats_wg1_s16_ms": 3.0, "stats_wg2_s16_ms": 2.4, "stats_wg2_s16_all_ms": 2.6, "stats_wg2_s16_store_ms": 2.0}]}))
    probe = measurements.latest_record("stats-gemm-2*.json", tmp_path)
    assert probe["source"] == "stats-gemm-2026-01-01-x.json"
    (row,) = measurements.statistics_gemm_rows(probe)
    assert row["gluon_gemm"] == pytest.approx(1.1) and row["stats_gemm"] == pytest.approx(1.2)
    assert row["stats_gemm+store"] == pytest.approx(0.8)  # over cuBLAS + row_stats
    shape = {"batch": 2, "seq": 4, "hidden": 16, "vocab": 32}
    result = lambda provider, ms, peak: {"provider": provider, "mode": "eval", **shape, "median_ms": ms,
                                         "peak_over_inputs_gib": peak}
    record = measurements.BenchRecord({}, [result("floor", 2.0, 0.0), result("fused", 2.2, 0.1),
                                           result("before", 2.4, 1.0), result("fused", 9.0, 9.0) | {"mode": "full"}])
    assert measurements.before_after_rows(record) == [
        {**shape, "fused": pytest.approx(1.1), "before": pytest.approx(1.2), "fused_peak_gib": 0.1, "before_peak_gib": 1.0}]
    assert measurements.latest_record("nothing-*.json", tmp_path) is None


def test_busy_idle_rows_read_both_records_of_an_a_b_run(tmp_path):
    shape = {"batch": 2, "seq": 4, "hidden": 16, "vocab": 32, "mask": "none"}
    for scenario, fused_ms in (("busy", 2.2), ("idle", 2.6)):
        results = [{"provider": p, "mode": "full", **shape, "median_ms": ms, "peak_over_inputs_gib": 0.5}
                   for p, ms in (("floor", 2.0), ("fused", fused_ms), ("before", 3.0))]
        (tmp_path / f"ab-x-2026-01-01-g-abc-{scenario}.json").write_text(json.dumps(
            {"provenance": {"gpu": "G", "commit": "abc"}, "results": results}))
    rows, captions = measurements.busy_idle_rows("ab-x-*-{scenario}.json", data_dir=tmp_path)
    assert [(r["scenario"], r["fused"], r["before"]) for r in rows] == [
        ("busy", pytest.approx(1.1), pytest.approx(1.5)), ("idle", pytest.approx(1.3), pytest.approx(1.5))]
    assert [c.split(":")[0] for c in captions] == ["busy", "idle"]
    assert measurements.busy_idle_rows("ab-none-*-{scenario}.json", data_dir=tmp_path) == ([], [])


def test_softmax_mm_table():
    probe = {"results": [{"rows": 8, "hidden": 16, "vocab": 32, "cublas_dx_ms": 2.0, "half_row_grads_ms": 0.5,
                          "three_rings_no_transform_ms": 2.4, "three_rings_no_exp_ms": 3.0, "three_rings_ms": 4.0,
                          "softmax_mm_ms": 3.8}]}
    (row,) = measurements.softmax_mm_rows(probe)
    assert row == {"rows": 8, "hidden": 16, "vocab": 32, "cublas_dx_ms": 2.0, "break_even": pytest.approx(1.25),
                   "skeleton": pytest.approx(1.2), "round_trip": pytest.approx(1.5), "three_rings": pytest.approx(2.0),
                   "softmax_mm": pytest.approx(1.9)}


def test_small_call_table():
    result = lambda variant, scenario, ms: {"shape": "2x4", "variant": variant, "scenario": scenario, "median_ms": ms}
    record = {"provenance": {"gpu": "G"}, "results": [result("floor", "idle", 2.0), result("floor", "busy", 1.6),
                                                       result("fused", "idle", 2.2), result("fused", "busy", 2.0)]}
    assert measurements.small_call_rows(record) == [
        {"gpu": "G", "shape": "2x4", "fused_idle": pytest.approx(1.1), "fused_busy": pytest.approx(1.25)}]


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
