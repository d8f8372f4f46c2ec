"""Run the workbook through papermill and assert on the values each notebook records."""

import json
from pathlib import Path

import pytest

from orpo_lib import memory
from orpo_lib.measurements import latest_bench_record
from orpo_lib.notebooks import execute, notebook_paths
from orpo_lib.record import load_record

pytestmark = pytest.mark.notebook
GIB = 2**30


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("notebooks")
    sources = notebook_paths()
    before = {p: p.read_bytes() for p in sources}
    results = {p.stem: execute(p, out) for p in sources}
    assert {p: p.read_bytes() for p in sources} == before, "sources must never be overwritten"
    return results


def _record(runs, stem):
    return load_record(runs[stem]["record"])


@pytest.mark.parametrize("stem", ["01-derivation", "02-memory", "03-kernel-tuning", "04-batch-scaling"])
def test_ran_without_errors_and_saved_figures(runs, stem):
    nb = json.loads(Path(runs[stem]["notebook"]).read_text())
    outputs = [o for c in nb["cells"] for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert not [o for o in outputs if o.get("name") == "stderr"], "warnings leak into the notebook"
    assert list(Path(runs[stem]["figures"]).glob("*.png")), "each notebook saves its figures"


def test_derivation_gradients(runs):
    r = _record(runs, "01-derivation")
    assert r["closed_form_dx_error"] < 1e-12 and r["closed_form_dw_error"] < 1e-12
    assert r["fused_loss_error"] < 1e-5
    assert r["fused_dx_error"] < 1e-5 and r["fused_dw_error"] < 1e-5


def test_derivation_log1mexp(runs):
    r = _record(runs, "01-derivation")
    assert r["log1mexp_naive_failures"] >= 1
    assert r["log1mexp_stable_max_rel_error"] < 1e-6


def test_derivation_margin_grows(runs):
    r = _record(runs, "01-derivation")
    assert r["last_margin"] > r["first_margin"] + 0.1
    assert r["last_accuracy"] == 1.0


def test_memory_notebook_matches_hand_formulas(runs):
    r = _record(runs, "02-memory")
    s = r["shape"]
    b, t, h, v = s["batch"], s["seq"], s["hidden"], s["vocab"]
    tokens = b * t
    assert r["seed_baseline_peak_gib"] == pytest.approx(14 * tokens * v / GIB)
    assert r["baseline_peak_gib"] == pytest.approx(12 * tokens * v / GIB)
    chunk = r["fused_chunk"]
    rows = chunk["rows"]
    assert rows == min(b, max(1, 4096 // (2 * t))) * 2 * t or chunk["passes"] == 2
    loop = rows * v * 2 + rows * h * 2 + rows * h * 4 + rows * h * 2 + v * h * 4 + tokens * h * 2 + tokens * 28
    cast = v * h * 4 + v * h * 2 + tokens * h * 2 + tokens * 28
    if chunk["count"] > 1:
        assert r["fused_peak_gib"] == pytest.approx(max(loop, cast) / GIB)
    assert r["fused_peak_gib"] < r["liger_peak_gib"] < r["baseline_peak_gib"]


def test_memory_notebook_states_model_error(runs):
    r = _record(runs, "02-memory")
    assert r["anchor_max_abs_error_pct"] < 2.0
    assert r["check_max_abs_error_pct"] < 5.0  # fused rows measured at an older commit (notebook 2 says why)
    record = latest_bench_record()
    assert r["bench_record"] == (record.source if record else None)


def test_kernel_tuning_prediction_and_recorded_sweeps(runs):
    r = _record(runs, "03-kernel-tuning")
    assert 1.0 < r["fused_over_floor_predicted"] < 1.1 < r["baseline_over_floor_predicted"]
    record = latest_bench_record()
    assert r["chunk_sweep_points"] == len((record.sweeps.get("chunk") if record else None) or [])
    assert r["stage_points"] == len((record.sweeps.get("stages") if record else None) or [])
    peaks = r["model_chunk_peak_gib"]
    assert peaks["16384"] > peaks["4096"]  # a bigger buffer never costs less


def test_batch_scaling_reads_the_record_or_says_there_is_none(runs):
    r = _record(runs, "04-batch-scaling")
    record = latest_bench_record()
    if record is None:
        assert r["bench_record"] is None and r["measured_points"] == 0 and r["fused_x_floor"] == []
    else:
        assert r["bench_record"] == record.source
        workload = {"seq": 1024, "hidden": 4096, "vocab": 128256, "mask": "none"}
        measured = [x for x in record.select(mode="full", **workload) if x["batch"] in (2, 4, 8, 16)]
        assert r["measured_points"] == len(measured)
        fused = sorted((x for x in measured if x["provider"] == "fused"), key=lambda x: x["batch"])
        floor_ms = {x["batch"]: x["median_ms"] for x in measured if x["provider"] == "floor"}
        assert r["fused_x_floor"] == pytest.approx([x["median_ms"] / floor_ms[x["batch"]] for x in fused])
    assert r["seed_liger_over_baseline"] == pytest.approx([31.0 / 12.9, 60.9 / 25.6, 121.1 / 51.8, 244.4 / 103.9])
    assert r["anchor_best_liger_x_floor"] == pytest.approx(180.0 / 152.1)
