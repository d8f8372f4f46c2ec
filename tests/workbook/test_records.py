"""The regeneration command: every part is a known harness run that writes <part>-<gpu>.json."""

import sys

import pytest

from orpo_lib.workbook import bench, records, trl_bench


@pytest.mark.parametrize("part", list(records.PARTS))
def test_part_command_parses_and_names_its_record(part, tmp_path):
    command = records.part_command(part, tmp_path, "h100", "abc1234")
    assert command[:3] == [sys.executable, "-m", f"orpo_lib.workbook.{records.PARTS[part][0]}"]
    args = command[3:]
    assert args[args.index("--out") + 1] == str(tmp_path / f"{part}-h100.json")
    assert args[args.index("--commit") + 1] == "abc1234"
    if records.PARTS[part][0] == "bench":
        parsed = bench.parse_args(args)
        assert bench.parse_shapes(parsed.shapes)
        assert set(parsed.providers.split(",")) <= set(bench.PROVIDERS)
    else:
        trl_bench.parse_args(args, on_gpu=True)


def test_seed_part_measures_what_the_workbook_reads():
    args = bench.parse_args(records.PARTS["seed-shapes"][1])
    assert bench.parse_shapes(args.shapes) == bench.SEED_SHAPES
    assert {"floor", "baseline", "baseline_compiled", "fused", "liger"} <= set(args.providers.split(","))
    assert set(args.modes.split(",")) == {"full", "forward", "eval"}
    assert set(args.sweeps) == set(bench.SWEEPS)


def test_unknown_part_is_refused(capsys):
    with pytest.raises(SystemExit):
        records.main(["--parts", "seed-shapes,nope", "--dry-run"])
    assert "nope" in capsys.readouterr().err


def test_without_cuda_nothing_runs(monkeypatch):
    monkeypatch.setattr(records.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        records.main(["--parts", "mask"])
