"""Widget views and callbacks, called directly (no browser, no kernel)."""

import json

import ipywidgets
import pytest

from orpo_lib.workbook import measurements, memory, plots, widgets


@pytest.fixture
def bench_dir(tmp_path):
    """A synthetic benchmark record (test data only, never committed to figures/data): full and
    forward runs, the floor in full and eval mode (there is no forward floor), one baseline OOM."""
    results = []

    def result(provider, mode, batch, ms, gib, status="ok"):
        ok = status == "ok"
        return {"provider": provider, "mode": mode, "batch": batch, "seq": 1024, "hidden": 4096,
                "vocab": 128256, "dtype": "bf16", "mask": "none", "chunk_size": None,
                "median_ms": ms if ok else None, "min_ms": ms * 0.99 if ok else None, "max_ms": ms * 1.01 if ok else None,
                "reps": 10 if ok else 0, "peak_gib": gib, "peak_over_inputs_gib": gib, "tflops": None,
                "status": status, "error": None if ok else "CUDA out of memory"}

    for batch in (2, 4):
        results.append(result("floor", "full", batch, 9.0 * batch, None))
        results.append(result("floor", "eval", batch, 3.0 * batch, None))
        results.append(result("fused", "full", batch, 9.6 * batch, 1.5))
        results.append(result("fused", "forward", batch, 6.0 * batch, 1.4))
    results.append(result("baseline", "full", 2, 28.0, 3.0))
    results.append(result("baseline", "full", 4, None, None, status="oom"))
    record = {"provenance": {"gpu": "Test GPU", "torch": "0.0", "triton": "0.0", "date": "2000-01-01",
                             "commit": "0123456789abcdef", "command": "synthetic"}, "results": results, "sweeps": {}}
    (tmp_path / "seed-shapes-test.json").write_text(json.dumps(record))
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


def test_batch_scaling_without_a_record_prints_the_model_and_says_so(tmp_path, capsys):
    shown = widgets.show_batch_scaling(4096, 2048, 32000, mode="forward", largest_batch=8, data_dir=tmp_path)
    assert shown["record"] is None and shown["measured_points"] == 0 and shown["measured"] == []
    assert [row["batch"] for row in shown["model"]] == [2, 4, 8]
    for row in shown["model"]:
        for impl in memory.IMPLEMENTATIONS:
            assert row[impl] == memory.peak_gib(impl, row["batch"], 4096, 2048, 32000)
    text = capsys.readouterr().out
    assert "T=4096 H=2048 V=32000, B=2…8, mode forward" in text
    assert f"{memory.peak_gib('fused', 8, 4096, 2048, 32000):.2f}" in text
    assert "No GPU benchmark record" in text


def test_batch_scaling_eval_models_the_forward_without_gradients(tmp_path):
    shown = widgets.show_batch_scaling(1024, 4096, 128256, mode="eval", largest_batch=2, data_dir=tmp_path)
    assert shown["model"][0]["baseline"] == memory.peak_gib("baseline", 2, 1024, 4096, 128256, with_grad=False)


def test_batch_scaling_reads_a_record(bench_dir, tmp_path, capsys):
    shown = widgets.show_batch_scaling(1024, 4096, 128256, largest_batch=4, output_dir=tmp_path / "out", data_dir=bench_dir)
    assert shown["record"] == "seed-shapes-test.json" and shown["measured_points"] == 5
    by_key = {(r["batch"], r["provider"]): r for r in shown["measured"]}
    assert by_key[(2, "floor")]["x_floor"] == 1.0
    assert by_key[(4, "fused")]["x_floor"] == pytest.approx(9.6 / 9.0)
    assert by_key[(2, "baseline")]["peak_over_inputs_gib"] == 3.0
    assert by_key[(4, "baseline")] == {"batch": 4, "provider": "baseline", "median_ms": None, "x_floor": None,
                                       "peak_over_inputs_gib": None, "status": "oom"}
    text = capsys.readouterr().out
    assert "Measured (seed-shapes-test.json, mask none)" in text and "Test GPU" in text
    assert (tmp_path / "out" / "batch-scaling-full-T1024.svg").exists()


def test_batch_scaling_forward_is_compared_with_the_eval_floor(bench_dir):
    shown = widgets.show_batch_scaling(1024, 4096, 128256, mode="forward", largest_batch=4, data_dir=bench_dir)
    by_key = {(r["batch"], r["provider"]): r for r in shown["measured"]}
    assert by_key[(2, "floor")]["median_ms"] == 6.0  # the eval floor at B=2
    assert by_key[(2, "fused")]["x_floor"] == pytest.approx(12.0 / 6.0)


def test_batch_scaling_with_no_matching_workload_says_so(bench_dir, capsys):
    shown = widgets.show_batch_scaling(4096, 4096, 128256, mode="forward", data_dir=bench_dir)
    assert shown["measured"] == [] and shown["record"] == "seed-shapes-test.json"
    assert "seed-shapes-test.json has no forward results at T=4096" in capsys.readouterr().out


def _controls(box):
    return box.children[0].children


def test_memory_explorer_controls_update_on_release_only():
    box = widgets.memory_explorer(4, 64, 64, 2048)
    controls = _controls(box)
    assert [c.description for c in controls] == ["batch B", "seq T", "hidden H", "vocab V", "chunk rows (0: default)",
                                                 "dtype"]
    assert all(c.continuous_update is False for c in controls)
    assert isinstance(box.children[1], ipywidgets.Output)
    controls[0].value = 8  # the callback re-runs show_memory without error


def test_memory_view_follows_the_dtype(capsys):
    bf16 = widgets.show_memory(4, 64, 64, 2048)
    fp32 = widgets.show_memory(4, 64, 64, 2048, dtype="fp32")
    assert "fp32, B=4 T=64 H=64 V=2048" in capsys.readouterr().out
    for a, b in zip(bf16, fp32):
        assert b["peak_gib"] == pytest.approx(memory.peak_gib(a["impl"], 4, 64, 64, 2048, 4, **(
            {"chunk_rows": None} if a["impl"] == "fused" else {})))
        assert b["peak_gib"] >= a["peak_gib"]  # fp32 parts (accumulators, upcast logits) do not grow
    assert sum(r["peak_gib"] for r in fp32) > sum(r["peak_gib"] for r in bf16)


def test_interactive_view_passes_control_values_to_the_view():
    calls = []
    slider = widgets.int_slider("x", 4, [2, 4, 8])
    widgets.interactive_view(lambda x, y: calls.append((x, y)), {"x": slider}, fixed={"y": "fixed"})
    slider.value = 8
    assert calls[0] == (4, "fixed") and calls[-1] == (8, "fixed")


def test_batch_scaling_explorer_offers_several_shapes():
    box = widgets.batch_scaling_explorer(1024, 4096, 128256)
    controls = {c.description: c for c in _controls(box)}
    assert list(controls) == ["batch B ≤", "seq T", "hidden H", "vocab V", "mode"]
    assert controls["hidden H"].options == (2048, 4096, 8192)
    assert controls["vocab V"].options == (32000, 128256, 152064)
    assert controls["batch B ≤"].value == 16
    controls["vocab V"].value = 32000  # the callback re-runs show_batch_scaling without error


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


def test_interactive_view_waits_for_a_control_when_headless(monkeypatch):
    """Without a frontend nothing is drawn into the Output widget (see widgets' docstring) until a control moves."""
    monkeypatch.setenv(widgets.HEADLESS_ENV, "1")
    calls = []
    slider = widgets.int_slider("x", 4, [2, 4, 8])
    box = widgets.interactive_view(lambda x: calls.append(x), {"x": slider})
    assert calls == [] and box.children[1].outputs == ()
    slider.value = 8
    assert calls == [8]


def test_show_chunk_plan_prints_the_plan_and_saves_the_figure(tmp_path, capsys):
    plan = widgets.show_chunk_plan(8, 3072, 4096, output_dir=tmp_path)
    assert (len(plan.groups), plan.blocks, plan.buffer_rows) == (4, 8, 3072)
    text = capsys.readouterr().out
    assert "at most 4096 rows per block: 4 chunk(s), 8 block(s), buffer of 3072 rows" in text and "two passes" in text
    svg = (tmp_path / "chunk-plan.svg").read_text()
    assert "B=8, T=3072" in svg and "row limit 4096, given" in svg


def test_chunk_plan_explorer_controls():
    box = widgets.chunk_plan_explorer(8, 1024)
    controls = {c.description: c for c in _controls(box)}
    assert list(controls) == ["batch B", "seq T", "chunk rows (0: default)"]
    assert all(c.continuous_update is False for c in controls.values())
    controls["seq T"].value = 4096  # the callback re-runs show_chunk_plan without error


def test_memory_breakdown_is_linear_and_labels_the_chunk_setting(tmp_path):
    fig = plots.memory_breakdown(16, 4096, 4096, 128256, chunk_rows=1024)
    assert all(ax.get_xscale() == "linear" for ax in fig.axes)
    labels = [t.get_text().replace("\n", " ") for t in fig.axes[0].get_yticklabels()]
    assert "fused (at most 1024-row blocks)" in labels
    plots.save_figure(fig, tmp_path, "breakdown")
    assert "linear axes" in (tmp_path / "breakdown.svg").read_text()


def test_gpu_button_run_now_without_cuda_fails_clearly(monkeypatch):
    monkeypatch.setattr(widgets.torch.cuda, "is_available", lambda: False)
    started = []
    with pytest.raises(RuntimeError, match=r"run_gpu=True needs a CUDA device, and there is none here \('run'\)"):
        widgets.gpu_button("run", lambda out: started.append(out), run_now=True)
    assert started == []


def test_gpu_button_run_now_runs_once_and_keeps_the_button(monkeypatch):
    monkeypatch.setattr(widgets.torch.cuda, "is_available", lambda: True)
    started = []
    box = widgets.gpu_button("run", lambda out: started.append(out), output_dir="figs", run_now=True)
    assert started == ["figs"]
    button = box.children[0].children[0]
    assert not button.disabled
    button.click()
    assert started == ["figs", "figs"]


def test_show_cards_names_the_card_of_every_record(capsys):
    bench_record = measurements.BenchRecord({"gpu": "NVIDIA H100 80GB HBM3"}, [], source="seed-shapes-h100.json")
    trl = {"provenance": {"gpu": "NVIDIA H200"}, "source": "trl-training-h200.json"}
    cards = widgets.show_cards(seed_shapes=bench_record, mask=None, trl_training=trl)
    assert cards == {"NVIDIA H100 80GB HBM3": ["seed_shapes (seed-shapes-h100.json)"],
                     "NVIDIA H200": ["trl_training (trl-training-h200.json)"]}
    out = capsys.readouterr().out.splitlines()
    assert out == ["Measured on one NVIDIA H100 80GB HBM3: seed_shapes (seed-shapes-h100.json)",
                   "Measured on one NVIDIA H200: trl_training (trl-training-h200.json)"]
