"""`python -m orpo_lib.workbook.figures`: model figures always, measured figures only from a record, provenance on each."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from orpo_lib.workbook import figures, measurements, plots

PROVENANCE = {"gpu": "Test GPU X1", "torch": "9.9", "triton": "9.9", "liger": None, "date": "2000-01-01",
              "commit": "feedfacecafe0123", "command": "python -m orpo_lib.workbook.bench --sweeps chunk,stages,row_kernel"}
MODEL_FIGURES = {"memory-vs-batch-T1024", "memory-vs-batch-T4096", "memory-vs-seq-B16", "memory-breakdown-16x4096"}


@pytest.fixture
def synthetic_record(tmp_path):
    """Test data in the benchmark schema (never committed to figures/data)."""
    results = []
    for seq, mode in ((1024, "full"), (4096, "full"), (1024, "forward")):
        for batch in (2, 4, 8, 16):
            for provider, scale in (("floor", 1.0), ("baseline", 1.5), ("fused", 1.05), ("fused_lean", 1.4)):
                ms = scale * 9.0 * batch * seq / 2048
                results.append({"provider": provider, "mode": mode, "batch": batch, "seq": seq, "hidden": 4096,
                                "vocab": 128256, "dtype": "bf16", "mask": "none", "chunk_size": 1024 if provider == "fused_lean" else None,
                                "median_ms": ms, "min_ms": ms, "max_ms": ms, "reps": 10,
                                "peak_gib": None, "peak_over_inputs_gib": None if provider == "floor" else batch * 0.1,
                                "status": "ok", "error": None})
    sweeps = {
        "chunk": [{"chunk_size": c, "fp32_weight_grad": f, "median_ms": 150.0, "peak_over_inputs_gib": 1.0 + c / 4096, "status": "ok"}
                  for c in (1024, 4096) for f in (True, False)],
        "stages": [{"stage": "logits GEMM", "median_ms": 25.0, "min_ms": 24.0, "max_ms": 26.0, "chunk_rows": 4096}],
        # a 4096-row chunk of bf16 logits, read once ("stats") or read and written ("grads")
        "row_kernel": [{"kernel": k, "block_v": b, "num_warps": w, "gbps": 3000.0 + b / 10,
                        "median_ms": passes * 4096 * 128256 * 2 / ((3000.0 + b / 10) * 1e6)}
                       for k, passes in (("stats", 1), ("grads", 2)) for b in (2048, 4096) for w in (4, 8)],
    }
    data = tmp_path / "data"
    data.mkdir()
    (data / "seed-shapes-test.json").write_text(json.dumps({"provenance": PROVENANCE, "results": results, "sweeps": sweeps}))
    return data


def _names(paths):
    return {p.stem for p in paths}


def test_without_records_only_model_figures_and_a_message(tmp_path, capsys):
    empty = tmp_path / "data"
    empty.mkdir()
    written = figures.build_figures(empty, tmp_path / "out")
    assert _names(written) == MODEL_FIGURES
    assert {p.suffix for p in written} == {".png", ".svg"}
    assert measurements.NO_RECORD_MESSAGE in capsys.readouterr().out


def test_model_figures_carry_model_and_measurement_provenance(tmp_path):
    empty = tmp_path / "data"
    empty.mkdir()
    figures.build_figures(empty, tmp_path / "out")
    svg = (tmp_path / "out" / "memory-vs-batch-T4096.svg").read_text()
    assert "orpo_lib.workbook.memory" in svg and "NVIDIA" not in svg  # no record: the model alone
    figures.build_figures(None, tmp_path / "measured")
    svg = (tmp_path / "measured" / "memory-vs-batch-T4096.svg").read_text()
    record = measurements.latest_bench_record()
    assert "orpo_lib.workbook.memory" in svg and record.provenance["gpu"] in svg and "seed-shapes-" in svg


def test_committed_data_gives_every_figure_with_short_captions(tmp_path):
    """The H200 records in figures/data: measured figures, the mask figure, one-line provenance
    (no command lines), the sweeps drawn at the shape each was recorded at."""
    written = figures.build_figures(None, tmp_path / "out")
    assert _names(written) == MODEL_FIGURES | {
        f"batch-scaling-{mode}-T{seq}" for mode in ("full", "forward", "eval") for seq in (1024, 4096)} | {
        "chunk-pareto", "stage-breakdown", "row-kernel", "mask-prompt-half"}
    for path in written:
        if path.suffix == ".svg":
            text = path.read_text()
            assert "python -m orpo_lib.workbook.bench" not in text and "--sweep" not in text, path.name
    record = measurements.latest_bench_record()
    caption = f"commit {record.provenance['commit'][:7]} ({record.source.split(', ')[0]}"
    assert caption in (tmp_path / "out" / "batch-scaling-full-T4096.svg").read_text()
    assert "B=8, T=4096" in (tmp_path / "out" / "chunk-pareto.svg").read_text()
    assert "mask-h200.json" in (tmp_path / "out" / "mask-prompt-half.svg").read_text()


def test_a_record_adds_measured_figures_with_its_provenance(synthetic_record, tmp_path):
    written = figures.build_figures(synthetic_record, tmp_path / "out")
    assert _names(written) == MODEL_FIGURES | {
        "batch-scaling-full-T1024", "batch-scaling-full-T4096", "batch-scaling-forward-T1024",
        "chunk-pareto", "stage-breakdown", "row-kernel"}
    for name in ("batch-scaling-full-T1024", "chunk-pareto", "row-kernel", "stage-breakdown"):
        svg = (tmp_path / "out" / f"{name}.svg").read_text()
        assert "Test GPU X1" in svg and "feedfac" in svg and "2000-01-01" in svg, name


def test_figures_are_byte_stable(tmp_path):
    empty = tmp_path / "data"
    empty.mkdir()
    first = {p.name: p.read_bytes() for p in figures.build_figures(empty, tmp_path / "a")}
    second = {p.name: p.read_bytes() for p in figures.build_figures(empty, tmp_path / "b")}
    assert first == second


def test_cli_writes_into_the_given_folder(synthetic_record, tmp_path):
    assert figures.main(["--data", str(synthetic_record), "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "chunk-pareto.png").exists()


def test_a_gpu_record_wins_over_a_newer_cpu_record(synthetic_record):
    cpu = {"provenance": {**PROVENANCE, "gpu": "CPU (x86_64)", "date": "2099-01-01"}, "results": [], "sweeps": {}}
    (synthetic_record / "seed-shapes-cpu.json").write_text(json.dumps(cpu))
    assert measurements.latest_bench_record(synthetic_record).provenance["gpu"] == "Test GPU X1"


def test_the_workbook_imports_without_the_repositorys_data(tmp_path):
    """A copy of the package with no figures/data beside it (as installed): the anchors are empty records."""
    shutil.copytree(Path(measurements.__file__).parents[1], tmp_path / "orpo_lib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import orpo_lib.workbook.measurements as m; "
            "assert m.H200_ANCHORS.results == [] and 'not found' in m.H200_ANCHORS.source, m.H200_ANCHORS")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})


def test_the_row_kernel_heatmap_names_its_shape_and_has_a_colour_bar(synthetic_record, tmp_path):
    figures.build_figures(synthetic_record, tmp_path / "out")
    svg = (tmp_path / "out" / "row-kernel.svg").read_text()
    assert "4096 rows × V=128256, bf16" in svg
    assert "GB/s moved (0 to 4800" in svg
    fig = plots.row_kernel_heatmap(measurements.load_bench_record(next(synthetic_record.glob("seed-shapes-*.json"))))
    (colour_bar,) = fig.axes[-1].child_axes  # beside the last heatmap
    assert colour_bar.get_ylabel().startswith("GB/s moved") and colour_bar.get_ylim() == (0, 4800)
    plt.close(fig)


def _labelled_ticks(axis):
    low, high = axis.get_view_interval()
    return [axis.get_major_formatter()(v) for v in axis.get_majorticklocs() if low <= v <= high]


@pytest.mark.parametrize("mode", ["full", "forward", "eval"])
def test_the_batch_scaling_memory_panel_labels_several_plain_ticks(mode):
    record = measurements.latest_bench_record()
    fig = plots.batch_scaling(record, seq=1024, hidden=4096, vocab=128256, mode=mode)
    fig.canvas.draw()
    labels = _labelled_ticks(fig.axes[1].yaxis)
    assert len(labels) >= 3 and all(label and "$" not in label for label in labels), labels
    assert _labelled_ticks(fig.axes[1].xaxis) == ["2", "4", "8", "16"]
    plt.close(fig)


@pytest.mark.parametrize(("low", "high", "expected"), [(2.2, 4.8, ["3", "4"]), (1.6, 7.0, ["2", "3", "5"]),
                                                       (0.4, 60.0, ["0.5", "1", "2", "5", "10", "20", "50"])])
def test_plain_log_axis_labels_a_short_range_more_finely(low, high, expected):
    fig, ax = plt.subplots()
    ax.plot([1, 2], [low, high])
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    plots.plain_log_axis(ax.yaxis)
    fig.canvas.draw()
    assert _labelled_ticks(ax.yaxis) == expected
    plt.close(fig)
