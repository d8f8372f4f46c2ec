"""The TRL training bench on the CPU: a tiny Llama trained by both trainers, recorded with provenance."""

import gc
import json
import math

import pytest
import torch

pytest.importorskip("trl", reason="the trl extra: pip install -e .[trl]")
import transformers  # noqa: E402

from orpo_lib.workbook import trl_bench  # noqa: E402

FIELDS = {"model", "pairs", "seq", "trainer", "steps", "warmup", "status", "error", "median_step_ms", "min_step_ms",
          "max_step_ms", "tokens_per_step", "tokens_per_s", "peak_gib", "final_loss", "losses", "max_pairs"}


def tiny_models_alive() -> int:
    gc.collect()
    return sum(issubclass(type(o), transformers.PreTrainedModel) and o.config.vocab_size == 131
               for o in gc.get_objects())


def test_both_trainers_recorded_with_the_same_losses(tmp_path):
    out = tmp_path / "record.json"
    record = trl_bench.main(["--models", "tiny-llama", "--seqs", "24", "--pairs", "2", "--steps", "2",
                             "--warmup", "0", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(record))
    assert {"gpu", "torch", "triton", "date", "commit", "command", "transformers", "trl", "accelerate",
            "datasets"} <= set(saved["provenance"])
    assert saved["models"]["tiny-llama"]["vocab_size"] == 131
    stock, fused = saved["rows"]
    assert (stock["trainer"], fused["trainer"]) == ("stock", "fused")
    for row in (stock, fused):
        assert set(row) == FIELDS
        assert (row["model"], row["seq"], row["pairs"]) == ("tiny-llama", 24, 2)
        assert (row["status"], row["error"]) == ("ok", None)
        assert 0 < row["min_step_ms"] <= row["median_step_ms"] <= row["max_step_ms"]
        # one answer of each pair fills T = 24, the other 75-100 % of what the prompt leaves
        assert 0.75 * 2 * 2 * 24 < row["tokens_per_step"] < 2 * 2 * 24
        assert row["tokens_per_s"] == pytest.approx(row["tokens_per_step"] / row["median_step_ms"] * 1e3)
        assert row["peak_gib"] is None and row["max_pairs"] is None  # no GPU memory to count or fill on the CPU
        assert len(row["losses"]) == 2 and row["final_loss"] == row["losses"][-1] and math.isfinite(row["final_loss"])
    # the same weights, data and order: the same loss (float32 on the CPU)
    assert fused["losses"] == pytest.approx(stock["losses"], rel=1e-4)
    assert "tiny-llama" in trl_bench.summary_table(saved["rows"])
    assert tiny_models_alive() == 0, "a row's model outlived it"


def test_a_row_that_runs_out_of_memory_is_recorded_and_freed(monkeypatch):
    class OutOfMemory(trl_bench.ORPOTrainer):
        def training_step(self, *args, **kwargs):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    monkeypatch.setitem(trl_bench.TRAINERS, "stock", OutOfMemory)
    row = trl_bench.run_row("tiny-llama", "stock", 2, 24, warmup=0, steps=1, device=torch.device("cpu"))
    assert row["status"] == "oom" and all(row[name] is None for name in trl_bench.MEASURED)
    assert "out of memory" in trl_bench.describe(row)
    assert tiny_models_alive() == 0, "the failed step's model outlived it"


def test_every_batch_pads_to_max_length():
    """One answer of each pair runs past T, so that TRL cuts it at T; the other fits, 0-25 % short of it."""
    seq = 40
    data = trl_bench.preference_data(131, seq, rows=12)
    for row in data:
        prompt = len(row["prompt"].split()) + 1  # TRL's BOS
        lengths = sorted(prompt + len(row[answer].split()) + 1 for answer in ("chosen", "rejected"))  # and EOS
        assert lengths[0] <= seq < lengths[1]
        assert lengths[0] >= prompt + 0.75 * (seq - prompt - 1)


def test_max_pairs_doubles_until_the_first_failure_within_the_cap():
    tried = []

    def fits_up_to(limit):
        def fits(pairs):
            tried.append(pairs)
            return pairs <= limit
        return fits

    assert trl_bench.largest_fitting(fits_up_to(40), 8, 64) == 32 and tried == [16, 32, 64]
    tried.clear()
    assert trl_bench.largest_fitting(fits_up_to(1000), 8, 64) == 64 and tried == [16, 32, 64]
    tried.clear()
    assert trl_bench.largest_fitting(fits_up_to(12), 8, 64) == 8 and tried == [16]
