"""Run the workbook through papermill and assert on the values each notebook records."""

import json
from pathlib import Path

import pytest

from orpo_lib.workbook import measurements, memory
from orpo_lib.workbook.measurements import DATA_DIR, latest_bench_record
from orpo_lib.workbook.record import load_record

pytestmark = pytest.mark.notebook
GIB = 2**30


def _record(runs, stem):
    return load_record(runs[stem]["record"])


@pytest.mark.parametrize("stem", ["01-derivation", "02-kernels", "03-memory", "04-kernel-tuning", "05-batch-scaling"])
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


def test_kernels_notebook_toy_kernels_against_float64(runs):
    r = _record(runs, "02-kernels")
    assert r["toy_stats_lse_error"] < 1e-6 and r["toy_stats_logp_error"] < 1e-5
    assert r["toy_grads_error"] < 1e-6
    # the near-certain row: the float32 textbook log p and the toy's target column cancel to 0, and even
    # float64 log_softmax keeps only a few digits, while the kernel's form keeps float32 precision
    assert r["float32_textbook_near_certain_error"] == 1.0 and r["toy_grads_near_certain_target_error"] == 1.0
    assert r["float64_log_softmax_logp_error"] > 100 * r["toy_stats_logp_error"]


def test_kernels_notebook_library_kernels_against_float64(runs):
    r = _record(runs, "02-kernels")
    assert max(r["library_stats_lse_error"], r["library_stats_logp_error"], r["library_stats_nll_logp_error"]) < 1e-5
    assert r["library_grads_error"] < 1e-6
    assert r["library_grads_near_certain_target_error"] < 1e-4  # expm1(log p): no cancellation
    # two reads and one write of each bf16 logit, the row-kernel stage of the roofline (3 × logits × 2 bytes)
    assert r["bytes_per_logit"] == {"row_stats_kernel": 2, "row_grads_kernel": 4}
    (row_stage,) = [s for s in memory.stage_costs("fused", 2, 64, 8, 100) if s["stage"].startswith("row kernels")]
    assert row_stage["bytes"] == sum(r["bytes_per_logit"].values()) * 2 * 64 * 100


def test_kernels_notebook_chunk_plan(runs):
    r = _record(runs, "02-kernels")
    plan = r["plan"]
    assert (plan["batch"], plan["seq"], plan["chunk_rows"]) == (8, 3072, 4096)
    # a 6144-row pair in blocks of at most 4096 rows: two of 3072 each, two passes, one pair per chunk
    assert (plan["chunks"], plan["blocks"], plan["buffer_rows"], plan["passes"]) == (4, 8, 3072, ["two passes"])
    chunk = memory.chunking(8, 3072, 4096)
    assert (chunk.count, chunk.rows, chunk.passes) == (plan["blocks"], plan["buffer_rows"], 2)
    for row in r["default_plans"]:
        model = memory.chunking(row["batch"], row["seq"], None, 128256, hidden=4096)
        assert (row["blocks"], row["buffer_rows"]) == (model.count, model.rows)
        assert row["passes"] == ("one pass, per sequence" if model.one_pass else
                                 "two passes" if model.passes == 2 else "one pass")
    assert [row["chunks"] for row in r["default_plans"]] == [1, 1, 4, 1]


def test_memory_notebook_matches_hand_formulas(runs):
    r = _record(runs, "03-memory")
    s = r["shape"]
    b, t, h, v = s["batch"], s["seq"], s["hidden"], s["vocab"]
    tokens = b * t
    assert r["seed_baseline_peak_gib"] == pytest.approx(14 * tokens * v / GIB)
    assert r["baseline_peak_gib"] == pytest.approx(12 * tokens * v / GIB)
    chunk = r["fused_chunk"]
    rows = chunk["rows"]
    assert rows == min(b, max(1, 4096 // (2 * t))) * 2 * t or chunk["passes"] == 2
    # several chunks: buffer, the chunk's rows of hidden and of dX, fp32 dW, dX, per-token state
    loop = rows * v * 2 + rows * h * 2 + rows * h * 2 + v * h * 4 + tokens * h * 2 + tokens * 32
    backward = v * h * 4 + v * h * 2 + 2 * tokens * h * 2  # the saved fp32 dW and dX sums, and the new dW and dX
    if chunk["count"] > 1:
        assert r["fused_peak_gib"] == pytest.approx(max(loop, backward) / GIB)
    assert r["fused_peak_gib"] < r["liger_peak_gib"] < r["baseline_peak_gib"]


def test_memory_notebook_states_model_error_against_the_record(runs):
    r = _record(runs, "03-memory")
    record = latest_bench_record()
    assert r["bench_record"] == record.source
    rows = memory.model_vs_measured(record)
    assert r["bench_max_abs_error_pct"] == pytest.approx(max(abs(x["error_pct"]) for x in rows))
    errors = r["model_error_pct_by_impl"]
    assert set(errors) == {"baseline", "fused", "fused_lean", "liger"}
    assert max(errors[k] for k in ("baseline", "fused", "fused_lean")) < 0.1 and errors["liger"] < 2.5
    shown = {(p["batch"], p["seq"]): p for p in r["peak_rows"]}
    fused_runs = record.select(provider="fused", mode="full", mask="none")
    assert set(shown) == {(f["batch"], f["seq"]) for f in fused_runs}
    for f in fused_runs:
        (liger,) = record.select(provider="liger", mode="full", mask="none", batch=f["batch"], seq=f["seq"])
        row = shown[f["batch"], f["seq"]]
        assert row["fused_gib"] == f["peak_over_inputs_gib"] and row["liger_gib"] == liger["peak_over_inputs_gib"]
        assert row["fused_over_liger"] == pytest.approx(f["peak_over_inputs_gib"] / liger["peak_over_inputs_gib"])


def test_batch_scaling_reads_the_record(runs):
    r = _record(runs, "05-batch-scaling")
    record = latest_bench_record()
    assert r["bench_record"] == record.source
    workload = {"seq": 1024, "hidden": 4096, "vocab": 128256, "mask": "none"}
    measured = [x for x in record.select(mode="full", **workload) if x["batch"] in (2, 4, 8, 16)]
    assert r["measured_points"] == len(measured)
    fused = sorted((x for x in measured if x["provider"] == "fused"), key=lambda x: x["batch"])
    floor_ms = {x["batch"]: x["median_ms"] for x in measured if x["provider"] == "floor"}
    assert r["fused_x_floor"] == pytest.approx([x["median_ms"] / floor_ms[x["batch"]] for x in fused])
    newest = [measurements.latest_bench_record(pattern=f"{part}-*.json")
              for part in ("seed-shapes", "mask", "long-context", "small-models")]
    trl = measurements.latest_record("trl-training-*.json")
    assert r["cards"] == sorted({x.provenance["gpu"] for x in newest if x} | {trl["provenance"]["gpu"]})


def test_batch_scaling_against_the_targets(runs):
    """The notebook's summary is the record's: each ratio to the floor of the same run, and the workloads
    within 1.05 at two decimals; every seed workload within 1.2× the floor (forward+backward and no-grad),
    the lean setting slower than the default, and the masked step below 0.6× the unmasked floor."""
    r = _record(runs, "05-batch-scaling")
    record = latest_bench_record()
    summary = {(row["provider"], row["mode"]): row for row in r["floor_ratio_summary"]}
    for (provider, mode), row in summary.items():
        ratios = []
        for run in record.select(provider=provider, mode=mode, mask="none"):
            shape = {k: run[k] for k in ("batch", "seq", "hidden", "vocab")}
            (floor,) = record.select(provider="floor", mode="full" if mode == "full" else "eval", mask="none", **shape)
            ratios.append((run["median_ms"] / floor["median_ms"], f"{run['batch']}×{run['seq']}"))
        assert row["workloads"] == len(ratios) > 0
        assert (row["min_x_floor"], row["at_min"]) == min(ratios)
        assert (row["max_x_floor"], row["at_max"]) == max(ratios)
        within = sorted(shape for ratio, shape in ratios if round(ratio, 2) <= 1.05)
        assert sorted(row["within_1.05"].split(", ")) == (within or ["none"])
    assert 1.0 < summary["fused", "full"]["min_x_floor"] <= summary["fused", "full"]["max_x_floor"] < 1.2
    assert 1.0 < summary["fused", "eval"]["min_x_floor"] <= summary["fused", "eval"]["max_x_floor"] < 1.3
    assert summary["fused_lean", "full"]["min_x_floor"] > summary["fused", "full"]["max_x_floor"]
    masked = r["mask_summary"]
    assert len(masked) == 2 and all(0.5 < m["fused_x_unmasked_floor"] < 0.6 for m in masked)
    assert all(m["fused_x_unmasked_floor"] < m["liger_x_unmasked_floor"] < m["baseline_x_unmasked_floor"] for m in masked)


def _floor_ratios_from_the_file(pattern, mode):
    """(batch, seq, hidden, vocab, mask, provider) -> median over the same run's floor, read from the newest raw JSON."""
    newest = max(DATA_DIR.glob(pattern), key=lambda p: json.loads(p.read_text())["provenance"]["date"])
    results = json.loads(newest.read_text())["results"]
    floor_mode = "full" if mode == "full" else "eval"
    shape = ("batch", "seq", "hidden", "vocab")
    floors = {tuple(r[k] for k in shape): r["median_ms"] for r in results
              if r["provider"] == "floor" and r["mode"] == floor_mode and r["mask"] == "none"}
    ratios = {(*(r[k] for k in shape), r["mask"], r["provider"]): r["median_ms"] / floors[tuple(r[k] for k in shape)]
              for r in results if r["provider"] != "floor" and r["mode"] == mode}
    return newest.name, ratios


@pytest.mark.parametrize("name, pattern, modes", [("long_context", "long-context-*.json", ["full"]),
                                                  ("small_models", "small-models-*.json", ["full", "eval"])])
def test_batch_scaling_shows_the_workload_records_against_their_floor(runs, name, pattern, modes):
    shown = _record(runs, "05-batch-scaling")[name]
    for mode in modes:
        source, expected = _floor_ratios_from_the_file(pattern, mode)
        assert shown["record"] == source
        rows = [r for r in shown["rows"] if r["mode"] == mode]
        got = {(r["batch"], r["seq"], r["hidden"], r["vocab"], r["mask"], p): r[f"{p}_x_floor"]
               for r in rows for p in ("baseline", "liger", "fused")}
        assert got == pytest.approx(expected)
    if name == "long_context":
        assert Path(runs["05-batch-scaling"]["figures"], "workloads-long-context.png").exists()


def test_gpu_cells_wait_for_a_button_without_run_gpu(runs):
    assert "live_chunk_sweep" not in _record(runs, "04-kernel-tuning")
    assert "live_batch_scaling" not in _record(runs, "05-batch-scaling")


def _outputs_text(notebook) -> str:
    nb = json.loads(Path(notebook).read_text())
    return "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))


def check_kernel_tuning_against_its_record(r, record):
    """What notebook 4 recorded is its seed-shapes record, each value worked out here from the record's raw rows;
    a sweep the record lacks (a record made before the sweep existed) is shown as missing."""
    from orpo_lib import kernels

    sweeps = record.sweeps
    if "accuracy" not in sweeps:
        assert r["accuracy"] == []
    if "stats_gemm" not in sweeps:
        assert r["stats_gemm_rows"] == [] and r["stats_gemm_verdict"] is None
    if "grad_gemm" not in sweeps:
        assert r["grad_gemm_rows"] == []
    sweeps = {"accuracy": [], "stats_gemm": [], "grad_gemm": [], **sweeps}
    assert r["seed_record"] == record.source and r["measured_on"] == record.provenance["gpu"]
    assert r["chunk_sweep_points"] == len(sweeps["chunk"]) and r["stage_points"] == len(sweeps["stages"])
    assert sorted(r["model_chunk_peak_gib"], key=int) == [str(c) for c in sorted({p["chunk_size"] for p in sweeps["chunk"]})]
    assert sum(r["profile_ms_by_kind"].values()) == pytest.approx(sum(p["device_ms"] for p in sweeps["profile"]))
    for kernel, launch in (("stats", kernels.STATS_LAUNCH), ("grads", kernels.GRADS_LAUNCH)):
        points = [p for p in sweeps["row_kernel"] if p["kernel"] == kernel]
        assert r["row_kernel_best"][kernel] == max(points, key=lambda p: p["gbps"])
        at_launch = [p for p in points if (p["block_v"], p["num_warps"]) == (launch.block_v, launch.num_warps)]
        assert r["row_kernel_library"][kernel] == (at_launch[0] if at_launch else None)
    shown = {(a["batch"], a["seq"], a["quantity"]): a for a in r["accuracy"]}
    assert len(shown) == 3 * len(sweeps["accuracy"])
    for case in sweeps["accuracy"]:
        for quantity in ("loss", "grad_hidden", "grad_weight"):
            row = shown[case["workload"]["batch"], case["workload"]["seq"], quantity]
            fused, baseline = (case["relative_error"][impl][quantity] for impl in ("fused", "baseline"))
            assert (row["fused"], row["baseline"]) == (fused, baseline)
            assert row["fused_over_baseline"] == pytest.approx(fused / baseline)
    # the statistics GEMM: the prediction at the sweep's shapes, each path over cuBLAS's GEMM in the same run
    raw = sweeps["stats_gemm"]
    from orpo_lib.workbook import bench

    assert [(p["rows"], p["hidden"], p["vocab"]) for p in r["stats_gemm_predicted"]] == (
        [(x["rows"], x["hidden"], x["vocab"]) for x in raw] or [tuple(shape) for shape in bench.STATS_GEMM_SHAPES])
    assert len(r["stats_gemm_rows"]) == len(raw)
    faster_or_level, taken = set(), set()
    for row, x in zip(r["stats_gemm_rows"], raw):
        assert (row["rows"], row["hidden"], row["vocab"], row["status"], row["in_library"]) == (
            x["rows"], x["hidden"], x["vocab"], x["status"], x["in_library"])
        gemm = x["stats_gemm_ms"]
        assert row["stats_gemm_x_mm"] == (None if gemm is None else pytest.approx(gemm / x["cublas_mm_ms"]))
        assert row["row_stats_x_mm"] == pytest.approx(x["cublas_row_stats_ms"] / x["cublas_mm_ms"])
        moved = {p: x[f"{p}_written_bytes"] + x[f"{p}_read_bytes"] for p in ("cublas_row_stats", "stats_gemm")}
        assert row["gb_not_moved"] == pytest.approx((moved["cublas_row_stats"] - moved["stats_gemm"]) / 1e9)
        shape = f"{x['rows']}×{x['hidden']}×{x['vocab']}"
        if gemm is not None:
            if x["stats_gemm_min_ms"] <= x["cublas_row_stats_max_ms"]:  # faster, or the ranges overlap
                faster_or_level.add(shape)
            if x["in_library"]:
                taken.add(shape)
    if raw:
        verdict = r["stats_gemm_verdict"]
        assert (set(verdict["faster_or_level"]), set(verdict["in_library"])) == (faster_or_level, taken)
        assert set(verdict["differ"]) == faster_or_level ^ taken
    # the gradient GEMMs: each over cuBLAS's in the same run, against the target
    assert [(row["rows"], row["hidden"], row["vocab"], row["status"]) for row in r["grad_gemm_rows"]] == [
        (x["rows"], x["hidden"], x["vocab"], x["status"]) for x in sweeps["grad_gemm"]]
    for row, x in zip(r["grad_gemm_rows"], sweeps["grad_gemm"]):
        gemms = x["cublas_dx_ms"] + x["cublas_dw_ms"]
        assert row["buffer_x_gemms"] == pytest.approx(x["buffer_ms"] / gemms)
        ratios = [None if x[f"gluon_{g}_ms"] is None else x[f"gluon_{g}_ms"] / x[f"cublas_{g}_ms"] for g in ("dx", "dw")]
        assert row["gluon_dx_x_cublas"] == (None if ratios[0] is None else pytest.approx(ratios[0]))
        target = 1.03 if x["hidden"] >= 4096 else 1.08
        assert row["meets_target"] == (None if None in ratios else max(ratios) <= target)
    fused = {(x["batch"], x["seq"]): x["median_ms"] for x in record.select("fused", "full", mask="none")}
    floor = {(x["batch"], x["seq"]): x["median_ms"] for x in record.select("floor", "full", mask="none")}
    shown = {(x["batch"], x["seq"]): x["x_floor"] for x in r["fused_over_floor_measured"]}
    assert shown == pytest.approx({k: fused[k] / floor[k] for k in fused if k in floor})


def test_kernel_tuning_prediction(runs):
    r = _record(runs, "04-kernel-tuning")
    assert 1.0 < r["fused_over_floor_predicted"] < 1.1 < r["baseline_over_floor_predicted"]
    assert r["floor_ms_predicted"] == pytest.approx(3 * 2 * 8 * 4096 * 4096 * 128256 / (memory.H200_GEMM_TFLOPS * 1e9))
    peaks = r["model_chunk_peak_gib"]
    assert peaks["16384"] > peaks["4096"]  # a bigger buffer never costs less
    for p in r["stats_gemm_predicted"]:  # the read pass saved: TFLOP/s / (H · TB/s) of the GEMM
        assert p["row_stats_x_mm"] - 1 == pytest.approx(memory.H200_GEMM_TFLOPS / (p["hidden"] * memory.H200_ROW_KERNEL_TBPS))
        assert p["stats_gemm_x_mm"] < 1.01


def test_kernel_tuning_reads_the_seed_record(runs):
    """The committed record, or, while there is none, the notebook says so and shows the model alone."""
    from orpo_lib.workbook import bench, measurements

    r = _record(runs, "04-kernel-tuning")
    record = measurements.latest_seed_record()
    if record is None:
        assert r["seed_record"] is None and r["stats_gemm_rows"] == [] and r["stats_gemm_verdict"] is None
        assert r["grad_gemm_rows"] == []
        assert r["row_kernel_best"] is None and r["profile_ms_by_kind"] is None and r["accuracy"] == []
        assert [(p["rows"], p["hidden"], p["vocab"]) for p in r["stats_gemm_predicted"]] == bench.STATS_GEMM_SHAPES
        assert "No seed-shapes record in figures/data yet" in _outputs_text(runs["04-kernel-tuning"]["notebook"])
        return
    check_kernel_tuning_against_its_record(r, record)
    # what the notebook's text says of a GPU run
    assert gemms_dominate(r["profile_ms_by_kind"])
    assert all(a["fused_over_baseline"] <= 1.01 for a in r["accuracy"])  # G rounded once, as the baseline's
    for row in r["stats_gemm_rows"]:
        assert row["row_stats_x_mm"] > 1  # the pass over the buffer adds to the GEMM
        if row["status"] == "ok":
            assert row["lse_max_abs_diff"] < 2e-2 and row["logp_max_abs_diff"] < 2e-2


def gemms_dominate(by_kind) -> bool:
    return by_kind["GEMM (cuBLAS)"] > 10 * by_kind["row kernel (Triton)"] > by_kind.get("small torch ops", 0)


@pytest.fixture(scope="module")
def kernel_tuning_on_a_synthetic_record(tmp_path_factory):
    """Notebook 4 executed on a synthetic seed-shapes record (tests/workbook/synthetic_records.py)."""
    from orpo_lib.workbook.notebooks import execute, notebook_paths
    from synthetic_records import write_seed_shapes_record

    data = tmp_path_factory.mktemp("data")
    write_seed_shapes_record(data)
    (source,) = notebook_paths(["04"])
    before = source.read_bytes()
    run = execute(source, tmp_path_factory.mktemp("notebook"), parameters={"data_dir": str(data)})
    assert source.read_bytes() == before, "the source must never be overwritten"
    return run, data


def test_kernel_tuning_shows_a_seed_record(kernel_tuning_on_a_synthetic_record):
    from orpo_lib.workbook import measurements
    from synthetic_records import GPU

    run, data = kernel_tuning_on_a_synthetic_record
    r = load_record(run["record"])
    record = measurements.latest_seed_record(data)
    check_kernel_tuning_against_its_record(r, record)
    text = _outputs_text(run["notebook"])
    assert f"Every measured number below comes from one run on one GPU, {GPU}" in text
    assert "No seed-shapes record" not in text
    # the synthetic rows: faster at 4096 rows (which the rule leaves off), slower at H = 2048 (which it takes)
    assert r["stats_gemm_verdict"]["differ"] == ["16384×2048×151936", "4096×4096×128256"]
    assert {p.name for p in Path(run["figures"]).glob("*.png")} == {
        "chunk-pareto.png", "stage-breakdown.png", "row-kernel.png", "stats-gemm.png"}


def test_memory_notebook_vocab_parallel_table(runs):
    r = _record(runs, "03-memory")
    expected = {str(row["ranks"]): row["peak_gib"] for row in memory.vocab_parallel_table(16, 4096, 4096, 128256)}
    assert r["vocab_parallel_peak_gib"] == pytest.approx(expected)
