"""The benchmark harness at a tiny shape on the CPU: every provider recorded, with provenance."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

import orpo_lib
from orpo_lib.workbook import bench, grad_gemm, measurements


def test_harness_records_every_provider_and_mode(tmp_path):
    out = tmp_path / "record.json"
    record = bench.main(["--shapes", "2x8", "--hidden", "32", "--vocab", "101", "--reps", "1", "--warmup", "0",
                         "--providers", "floor,baseline,fused,fused_lean", "--masks", "none,prompt-half",
                         "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(record))
    assert {"gpu", "torch", "triton", "date", "commit", "command"} <= set(saved["provenance"])
    rows = saved["results"]
    assert [(r["mask"], r["provider"], r["mode"]) for r in rows] == [  # no forward-only floor
        (mask, p, m) for mask in ("none", "prompt-half") for p in ("floor", "baseline", "fused", "fused_lean")
        for m in ("full", "forward", "eval") if (p, m) != ("floor", "forward")]
    for r in rows:
        assert r["status"] == "ok", r
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert r["reps"] == 1 and r["tflops"] > 0
    assert all(r["chunk_size"] == bench.LEAN_CHUNK_ROWS for r in rows if r["provider"] == "fused_lean")


def test_a_failing_provider_is_recorded_not_raised(monkeypatch):
    def out_of_memory(w, inputs, mode):
        def run():
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 110.00 GiB")
        return run

    def broken(w, inputs, mode):
        def run():
            raise RuntimeError("kernel failed")
        return run

    monkeypatch.setitem(bench.PROVIDERS, "oom", out_of_memory)
    monkeypatch.setitem(bench.PROVIDERS, "broken", broken)
    w = bench.Workload(2, 4, 16, 50, "fp32")
    inputs = bench.make_inputs(w, torch.device("cpu"))
    oom = bench.measure("oom", "full", w, inputs, torch.device("cpu"), warmup=0, reps=1)
    assert oom.status == "oom" and "110.00 GiB" in oom.error and oom.median_ms is None
    err = bench.measure("broken", "full", w, inputs, torch.device("cpu"), warmup=0, reps=1)
    assert err.status == "error" and "kernel failed" in err.error


def test_timed_repetitions_take_turns_and_a_failing_provider_drops_out(monkeypatch):
    calls = []

    def logged(name, make_run, fail_on_call=None):
        """``make_run``'s closure, each call logged under ``name``; call number ``fail_on_call`` raises."""
        def provider(w, inputs, mode):
            run = make_run(w, inputs, mode)
            count = 0

            def logged_run():
                nonlocal count
                count += 1
                calls.append(name)
                if count == fail_on_call:
                    raise RuntimeError("kernel failed")
                run()
            return logged_run
        return provider

    def out_of_memory(w, inputs, mode):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 110.00 GiB")

    make_fused = bench.PROVIDERS["fused"]
    monkeypatch.setitem(bench.PROVIDERS, "floor", logged("floor", bench.PROVIDERS["floor"]))
    # a closure is built for the peak and again for the timing: call 2 of the second is the first timed one
    monkeypatch.setitem(bench.PROVIDERS, "broken", logged("broken", make_fused, fail_on_call=2))
    monkeypatch.setitem(bench.PROVIDERS, "oom", out_of_memory)
    monkeypatch.setitem(bench.PROVIDERS, "fused", logged("fused", make_fused))
    w = bench.Workload(2, 4, 16, 50, "fp32")
    inputs = bench.make_inputs(w, torch.device("cpu"))
    jobs = [(p, None, None) for p in ("floor", "broken", "oom", "fused")]
    floor, broken, oom, fused = bench.measure_interleaved(jobs, "full", w, inputs, torch.device("cpu"),
                                                          warmup=1, reps=3)
    # Rounds of one call per provider still measuring, each in a shuffled order: the first call before
    # the peak (on the CPU peak_memory itself makes none), the warm-up, then the timed calls.
    rounds = [calls[0:3], calls[3:6], calls[6:9], calls[9:11], calls[11:13]]
    assert len(calls) == 13
    assert [sorted(r) for r in rounds] == [["broken", "floor", "fused"]] * 3 + [["floor", "fused"]] * 2
    assert len({tuple(r) for r in rounds[:3]} | {tuple(r) for r in rounds[3:]}) > 2  # not one fixed order
    assert broken.status == "error" and "kernel failed" in broken.error and broken.median_ms is None
    assert oom.status == "oom" and "110.00 GiB" in oom.error and oom.median_ms is None
    for r in (floor, fused):
        assert r.status == "ok" and r.reps == 3 and 0 < r.min_ms <= r.median_ms <= r.max_ms
    assert inputs[0].grad is None and inputs[1].grad is None


def test_time_interleaved_warms_up_then_takes_turns():
    calls = []
    runs = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = bench.time_interleaved(runs, torch.device("cpu"), warmup=2, reps=4)
    assert calls[:6] == ["a", "a", "b", "b", "c", "c"]  # the warm-up, call by call
    rounds = [calls[i:i + 3] for i in range(6, 18, 3)]
    assert len(calls) == 18 and all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # not one fixed order
    assert {name: len(t) for name, t in times.items()} == {"a": 4, "b": 4, "c": 4}
    assert all(ms >= 0 for t in times.values() for ms in t)


def test_inputs_are_random_not_zero():
    w = bench.Workload(2, 16, 32, 101, "fp32", mask="prompt-half")
    hidden, weight, target, nll_target = bench.make_inputs(w, torch.device("cpu"))
    assert hidden.std() > 0.5 and weight.abs().min() >= 0 and weight.std() > 0
    assert (target[:, :8] == -100).all() and (target[:, 8:] >= 0).all() and nll_target is None


def test_sweeps_run_on_cpu(tmp_path):
    record = bench.main(["--shapes", "2x4", "--hidden", "16", "--vocab", "67", "--reps", "1", "--warmup", "0",
                         "--providers", "fused", "--modes", "full", "--sweeps", "chunk,stages,row_kernel,accuracy",
                         "--sweep-shape", "2x8", "--out", str(tmp_path / "r.json")])
    sweeps = record["sweeps"]
    assert {r["status"] for r in sweeps["chunk"]} == {"ok"}
    assert {s["stage"] for s in sweeps["stages"]} >= {"logits GEMM", "row stats (read)", "dW GEMM (fp32 accumulate)"}
    assert len(sweeps["row_kernel"]) == 4  # two launch configurations × two row kernels
    assert len(sweeps["accuracy"]) == 3
    for case in sweeps["accuracy"]:
        errors = case["relative_error"]
        assert errors["fused"]["grad_weight"] < 1e-4 and errors["baseline"]["grad_weight"] < 1e-4


def test_before_measures_an_earlier_copy_of_the_package_beside_this_one(tmp_path, monkeypatch):
    # the "earlier copy" counts its calls, so the test can tell which package each provider ran
    shutil.copytree(Path(orpo_lib.__file__).parent, tmp_path / "orpo_lib_before")
    fused_py = tmp_path / "orpo_lib_before" / "fused.py"
    fused_py.write_text(fused_py.read_text() + "\nCALLS = []\n_counted = fused_linear_orpo_loss\n\n\n"
                        "def fused_linear_orpo_loss(*args, **kwargs):\n    CALLS.append(1)\n"
                        "    return _counted(*args, **kwargs)\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        record = bench.main(["--shapes", "2x8", "--hidden", "32", "--vocab", "101", "--reps", "2", "--warmup", "0",
                             "--providers", "fused", "--modes", "eval", "--before", str(tmp_path),
                             "--before-commit", "abc1234", "--out", str(tmp_path / "ab.json")])
        calls = len(sys.modules["orpo_lib_before.fused"].CALLS)
    finally:
        bench.PROVIDERS.pop("before", None)
        for name in [m for m in sys.modules if m.startswith("orpo_lib_before")]:
            del sys.modules[name]
    by_provider = {r["provider"]: r for r in record["results"]}
    assert set(by_provider) == {"fused", "before"} and all(r["status"] == "ok" for r in by_provider.values())
    assert calls == 1 + 2  # the call before the peak (not measured on the CPU), then the two timed repetitions
    assert "--before" in record["provenance"]["command"] and record["provenance"]["before_commit"] == "abc1234"


def test_shapes_take_presets_and_per_workload_sizes(tmp_path):
    assert bench.parse_shapes("2x8,4x16x32x101") == [(2, 8), (4, 16, 32, 101)]
    assert bench.parse_shapes("long-context")[-1] == (2, 32768)
    small = bench.parse_shapes("small-models")
    assert {(h, v) for _, _, h, v in small} == {(h, v) for h in (1024, 2048) for v in (32000, 151936, 256000)}
    with pytest.raises(ValueError, match="BxT or BxTxHxV"):
        bench.parse_shapes("2x8x32")
    record = bench.main(["--shapes", "2x8,2x8x16x67", "--hidden", "32", "--vocab", "101", "--reps", "1",
                         "--warmup", "0", "--providers", "fused", "--modes", "eval", "--out", str(tmp_path / "r.json")])
    assert [(r["hidden"], r["vocab"]) for r in record["results"]] == [(32, 101), (16, 67)]


def test_an_unknown_sweep_is_an_error(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--sweeps", "stages,grad_gemms"])
    assert "unknown sweep(s) ['grad_gemms']" in capsys.readouterr().err
    assert bench.parse_args(["--sweeps", "stages,accuracy"]).sweeps == ["stages", "accuracy"]
    assert bench.parse_args([]).sweeps == []


def test_trl_labels_and_their_floor(tmp_path):
    """TRL's batches: the odds ratio on the response, the NLL on the same ids with the prompt; a run of
    only this mask still gets its ratios to the floor, whose GEMMs do not read labels."""
    w = bench.Workload(2, 16, 32, 101, "fp32", mask="trl")
    _, _, target, nll_target = bench.make_inputs(w, torch.device("cpu"))
    assert (target[:, :4] == -100).all() and (target[:, 4:] >= 0).all()
    assert torch.equal(nll_target[:, 4:], target[:, 4:]) and (nll_target[:, :4] >= 0).all()
    *_, every_token, default_nll = bench.make_inputs(bench.Workload(2, 16, 32, 101, "fp32"), torch.device("cpu"))
    assert (every_token >= 0).all() and default_nll is None  # mask "none": the NLL on the odds ratio's tokens
    record = bench.main(["--shapes", "2x8", "--hidden", "32", "--vocab", "101", "--reps", "1", "--warmup", "0",
                         "--providers", "floor,fused", "--modes", "full", "--masks", "trl",
                         "--out", str(tmp_path / "trl.json")])
    (ratio,) = measurements.floor_ratios(measurements.BenchRecord(record["provenance"], record["results"]),
                                         mode="full", mask="trl")
    (fused,) = [r for r in record["results"] if r["provider"] == "fused"]
    (floor,) = [r for r in record["results"] if r["provider"] == "floor"]
    assert fused["mask"] == floor["mask"] == "trl"
    assert ratio["x_floor"] == fused["median_ms"] / floor["median_ms"]
    assert f"{ratio['x_floor']:.3f}" in bench.summary_table(record)


def test_busy_gpu_queues_the_stand_in_before_each_timed_call(monkeypatch):
    """With a lead (``--busy-gpu``: ``stand_in_model``), every timed call, and no other, comes right after it."""
    calls = []

    def logged(make_run):
        def provider(w, inputs, mode):
            run = make_run(w, inputs, mode)
            return lambda: calls.append("call") or run()
        return provider
    monkeypatch.setitem(bench.PROVIDERS, "fused", logged(bench.PROVIDERS["fused"]))
    w = bench.Workload(2, 4, 16, 50, "fp32")
    inputs = bench.make_inputs(w, torch.device("cpu"))
    (fused,) = bench.measure_interleaved([("fused", None, None)], "full", w, inputs, torch.device("cpu"),
                                         warmup=1, reps=3, lead=lambda: calls.append("lead"))
    assert fused.status == "ok" and fused.reps == 3
    assert calls == ["call", "call"] + ["lead", "call"] * 3  # before the peak, warm-up, then the timed calls
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench.main(["--busy-gpu", "--providers", "floor", "--modes", "full"])


def test_stats_gemm_sweep_on_cpu_times_the_buffer_paths_and_skips_the_gluon_kernel(tmp_path):
    from synthetic_records import stats_gemm_row

    record = bench.main(["--shapes", "2x4", "--hidden", "16", "--vocab", "64", "--reps", "2", "--warmup", "0",
                         "--providers", "fused", "--modes", "eval", "--sweeps", "stats_gemm", "--out", str(tmp_path / "r.json")])
    (row,) = record["sweeps"]["stats_gemm"]
    rows, hidden, vocab = bench.STATS_GEMM_CPU_SHAPES[0]
    assert (row["rows"], row["hidden"], row["vocab"], row["dtype"]) == (rows, hidden, vocab, "fp32")
    assert row["status"] == "unsupported" and row["error"] is None and row["in_library"] is False and row["reps"] == 2
    for path in ("cublas_mm", "cublas_row_stats"):
        assert 0 < row[f"{path}_min_ms"] <= row[f"{path}_ms"] <= row[f"{path}_max_ms"]
    assert row["stats_gemm_ms"] is None and row["lse_max_abs_diff"] is None and row["logp_max_abs_diff"] is None
    # fp32 logits written (and read back by row_stats); the partials: 3 float32 per row and 128-column tile, 2 per row
    logits, partials = rows * vocab * 4, rows * 4 * (3 * -(-vocab // 128) + 2)
    assert [(row[f"{p}_written_bytes"], row[f"{p}_read_bytes"]) for p in bench.STATS_GEMM_PATHS] == [
        (logits, 0), (logits, logits), (partials, partials)]
    # the synthetic record the notebook tests read has the same row format
    assert set(row) == set(stats_gemm_row(rows, hidden, vocab, 1.0, 1.0, 1.0, False))


def _statistics_from_a_buffer(shift_lse=0.0, shift_nll_logp=0.0, calls=None):
    """A stand-in for the Gluon statistics GEMM on the CPU: row_stats over X·Wᵀ, its outputs then shifted."""
    def call(x, weight, target, nll_target, token, stats):
        if calls is not None:
            calls.append(len(x))
        orpo_lib.kernels.row_stats(x @ weight.t(), target, nll_target, token, *stats)
        stats[3].add_(shift_lse)
        stats[1].sub_(shift_nll_logp)
    return call


def test_stats_gemm_sweep_checks_and_times_the_statistics_gemm_where_it_runs(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "gluon_supported", lambda device, dtype: True)
    monkeypatch.setattr(bench, "stats_gemm_call", _statistics_from_a_buffer(0.25, 0.5, calls))
    (row,) = bench.stats_gemm_sweep(torch.device("cpu"), [(6, 16, 48)], "fp32", warmup=1, reps=2)
    assert row["status"] == "ok" and row["error"] is None
    assert row["lse_max_abs_diff"] == pytest.approx(0.25, abs=1e-5)
    assert row["logp_max_abs_diff"] == pytest.approx(0.5, abs=1e-5)  # the larger of the two log-probs' differences
    assert calls == [6] * 4  # the check, one warm-up and two timed repetitions
    for path in bench.STATS_GEMM_PATHS:
        assert 0 < row[f"{path}_min_ms"] <= row[f"{path}_ms"] <= row[f"{path}_max_ms"]


def test_a_failing_statistics_gemm_leaves_the_buffer_paths_timed(monkeypatch):
    def fails(*args):
        raise RuntimeError("no wgmma here")

    monkeypatch.setattr(bench, "gluon_supported", lambda device, dtype: True)
    monkeypatch.setattr(bench, "stats_gemm_call", fails)
    odd, aligned = bench.stats_gemm_sweep(torch.device("cpu"), [(6, 16, 50), (6, 16, 48)], "fp32", warmup=0, reps=1)
    assert odd["status"] == "error" and "multiple of 16" in odd["error"] and odd["cublas_mm_ms"] is None
    assert aligned["status"] == "error" and "no wgmma here" in aligned["error"]
    assert aligned["stats_gemm_ms"] is None and aligned["lse_max_abs_diff"] is None
    assert aligned["cublas_mm_ms"] > 0 and aligned["cublas_row_stats_ms"] > 0


def test_grad_gemm_sweep_on_cpu_times_the_buffer_paths_and_skips_the_gluon_kernels(tmp_path):
    record = bench.main(["--shapes", "2x4", "--hidden", "16", "--vocab", "64", "--reps", "2", "--warmup", "0",
                         "--providers", "fused", "--modes", "eval", "--sweeps", "grad_gemm", "--out", str(tmp_path / "r.json")])
    (row,) = record["sweeps"]["grad_gemm"]
    rows, hidden, vocab = grad_gemm.GRAD_GEMM_CPU_SHAPES[0]
    assert (row["rows"], row["hidden"], row["vocab"], row["dtype"]) == (rows, hidden, vocab, "float32")
    assert row["status"] == "unsupported" and row["error"] is None and row["reps"] == 2
    for path in ("cublas_dx", "cublas_dw", "row_grads", "buffer"):
        assert 0 < row[f"{path}_min_ms"] <= row[f"{path}_ms"] <= row[f"{path}_max_ms"]
    for path in ("gluon_dx", "gluon_dw", "gluon"):
        assert row[f"{path}_ms"] is None
    assert row["gluon_dx_rel_err"] is None and row["gluon_dw_rel_err"] is None and row["bitwise_repeatable"] is None
    assert 0 < row["buffer_dx_rel_err"] < 1e-5 and 0 < row["buffer_dw_rel_err"] < 1e-5  # float32 G against float64
    assert row["flops"] == 2 * rows * hidden * vocab and row["buffer_bytes"] == 2 * rows * vocab * 4
    from synthetic_records import grad_gemm_row

    assert set(row) == set(grad_gemm_row(rows, hidden, vocab, *[1.0] * 7))  # the notebook tests' rows: same keys


def test_grad_gemm_sweep_checks_and_times_the_gluon_paths_where_they_run(monkeypatch):
    calls = []

    def buffer_stand_ins(logits, weight, x, ids, sizes, dx, dw):  # G·W and Gᵀ·X from the buffer path, a little off
        def grads():
            calls.append(len(logits))
            grad = logits.clone()
            orpo_lib.kernels.row_grads(grad, *ids, **sizes)
            return grad * (1.001 if len(calls) == 1 else 1.0)

        def gluon_dx():
            dx.copy_(grads() @ weight)

        def gluon_dw():
            dw.copy_(grads().t() @ x)

        def gluon():
            grad = grads()
            dx.copy_(grad @ weight)
            dw.copy_(grad.t() @ x)

        return {"gluon_dx": gluon_dx, "gluon_dw": gluon_dw, "gluon": gluon}

    monkeypatch.setattr(grad_gemm, "gluon_supported", lambda device, dtype: True)
    monkeypatch.setattr(grad_gemm, "gluon_calls", buffer_stand_ins)
    (row,) = grad_gemm.grad_gemm_sweep(torch.device("cpu"), [(6, 16, 48)], torch.float32, warmup=1, reps=2)
    assert row["status"] == "ok" and row["error"] is None
    assert row["gluon_dx_rel_err"] < 1e-5 and row["gluon_dw_rel_err"] < 1e-5
    assert row["bitwise_repeatable"] is False  # its two checked runs differ
    assert calls == [6] * 2 + [6] * 9  # the check's two runs, then one warm-up and two timed reps of three paths
    for path in grad_gemm.GRAD_GEMM_PATHS:
        assert 0 < row[f"{path}_min_ms"] <= row[f"{path}_ms"] <= row[f"{path}_max_ms"]


def test_the_record_is_on_disk_before_the_gradient_gemms_run(monkeypatch, tmp_path):
    out = tmp_path / "r.json"

    def killed(*args, **kwargs):  # stands in for a kernel that hangs until the process is killed
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "grad_gemm_sweep", killed)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--shapes", "2x4", "--hidden", "16", "--vocab", "64", "--reps", "1", "--warmup", "0",
                    "--providers", "fused", "--modes", "eval", "--sweeps", "grad_gemm,stats_gemm", "--out", str(out)])
    written = json.loads(out.read_text())
    assert set(written["sweeps"]) == {"stats_gemm"} and written["results"]
