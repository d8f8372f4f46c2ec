"""Widget views and callbacks, called directly (no browser, no kernel)."""

import json

import ipywidgets
import pytest

from orpo_lib import memory, widgets


@pytest.fixture
def bench_dir(tmp_path):
    """A synthetic benchmark record (test data only, never committed to figures/data)."""
    results = []
    for batch in (2, 4):
        for provider, ms, gib in (("floor", 9.0, None), ("baseline", 14.0, 3.0), ("fused", 9.6, 1.5)):
            results.append({"provider": provider, "mode": "full", "batch": batch, "seq": 1024, "hidden": 4096,
                            "vocab": 128256, "dtype": "bf16", "mask": "none", "chunk_size": None,
                            "median_ms": ms * batch, "min_ms": ms * batch * 0.99, "max_ms": ms * batch * 1.01, "reps": 10,
                            "peak_gib": gib, "peak_over_inputs_gib": gib, "status": "ok", "error": None})
    record = {"provenance": {"gpu": "Test GPU", "torch": "0.0", "triton": "0.0", "date": "2000-01-01",
                             "commit": "0123456789abcdef", "command": "synthetic"}, "results": results, "sweeps": {}}
    (tmp_path / "bench-test.json").write_text(json.dumps(record))
    return tmp_path


def test_show_memory_returns_the_model_and_saves_the_figure(tmp_path, capsys):
    table = widgets.show_memory(16, 4096, 4096, 128256, chunk_rows=0, output_dir=tmp_path)
    by_impl = {row["impl"]: row for row in table}
    assert set(by_impl) == set(memory.IMPLEMENTATIONS)
    assert by_impl["fused"]["peak_gib"] == memory.peak_gib("fused", 16, 4096, 4096, 128256)
    assert by_impl["seed_baseline"]["peak_gib"] > 100
    assert (tmp_path / "memory-breakdown.png").exists() and (tmp_path / "memory-breakdown.svg").exists()
    assert "chunks of 8192 rows" in capsys.readouterr().out


def test_show_memory_with_a_chunk_size_uses_it():
    table = widgets.show_memory(16, 4096, 4096, 128256, chunk_rows=1024)
    fused_row = next(r for r in table if r["impl"] == "fused")
    assert fused_row["peak_gib"] == memory.peak_gib("fused", 16, 4096, 4096, 128256, chunk_rows=1024)


def test_batch_scaling_without_a_record_says_so(tmp_path, capsys):
    shown = widgets.show_batch_scaling(1024, 4096, 128256, data_dir=tmp_path)
    assert shown == {"record": None, "measured_points": 0}
    assert "No GPU benchmark record" in capsys.readouterr().out


def test_batch_scaling_reads_a_record(bench_dir, tmp_path):
    shown = widgets.show_batch_scaling(1024, 4096, 128256, output_dir=tmp_path / "out", data_dir=bench_dir)
    assert shown == {"record": "bench-test.json", "measured_points": 6}
    assert (tmp_path / "out" / "batch-scaling-full-T1024.svg").exists()


def _controls(box):
    return box.children[0].children


def test_memory_explorer_controls_update_on_release_only():
    box = widgets.memory_explorer(4, 64, 64, 2048)
    controls = _controls(box)
    assert [c.description for c in controls] == ["batch B", "seq T", "hidden H", "vocab V", "chunk rows (0: default)"]
    assert all(c.continuous_update is False for c in controls)
    assert isinstance(box.children[1], ipywidgets.Output)
    controls[0].value = 8  # the callback re-runs show_memory without error


def test_interactive_view_passes_control_values_to_the_view():
    calls = []
    slider = widgets.int_slider("x", 4, [2, 4, 8])
    widgets.interactive_view(lambda x, y: calls.append((x, y)), {"x": slider}, fixed={"y": "fixed"})
    slider.value = 8
    assert calls[0] == (4, "fixed") and calls[-1] == (8, "fixed")


def test_batch_scaling_explorer_has_a_mode_toggle():
    box = widgets.batch_scaling_explorer(1024, 4096, 128256)
    assert [c.description for c in _controls(box)][-1] == "mode"


def test_gpu_button_is_disabled_without_cuda():
    started = []
    box = widgets.gpu_button("run", lambda out: started.append(out))
    button = box.children[0].children[0]
    assert button.disabled is (not __import__("torch").cuda.is_available())
    assert started == []  # nothing runs until the button is pressed


def test_format_bytes():
    assert widgets.format_bytes(512) == "512 B"
    assert widgets.format_bytes(3 * 2**20) == "3.00 MiB"
    assert widgets.format_bytes(110 * 2**30) == "110.00 GiB"
