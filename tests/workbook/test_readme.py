"""The README is for users: short, no commit hashes, and its tables are what the records say."""

import re

import pytest

from orpo_lib.workbook import readme
from orpo_lib.workbook.measurements import BenchRecord

TEXT = readme.README.read_text()


def test_readme_is_short_and_has_no_commit_hashes():
    assert len(TEXT.splitlines()) <= 150
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", TEXT) if re.search(r"\d", w) and re.search(r"[a-f]", w)]
    assert hashes == []


def test_readme_tables_are_the_records():
    blocks = readme.tables()
    assert set(blocks) == {"performance", "training"}, "figures/data lacks a record the README's tables read"
    assert readme.with_tables(TEXT, blocks) == TEXT, "README's tables differ: python -m orpo_lib.workbook.readme --write"


def _result(provider, mode, ms, gib=1.0, status="ok", batch=2, seq=1024):
    return {"provider": provider, "mode": mode, "batch": batch, "seq": seq, "hidden": 4096, "vocab": 128256,
            "mask": "none", "median_ms": ms if status == "ok" else None, "peak_over_inputs_gib": gib, "status": status}


def test_performance_table_cells():
    record = BenchRecord(provenance={}, results=[
        _result("floor", "full", 10.0), _result("floor", "eval", 4.0), _result("fused", "full", 10.5, 1.5),
        _result("fused", "eval", 4.4), _result("liger", "full", 15.0, 3.0), _result("baseline", "full", None, status="oom"),
        _result("floor", "full", 20.0, batch=4), _result("fused", "full", 21.0, 12.25, batch=4)])
    lines = readme.performance_table([record]).splitlines()
    assert lines[0] == "| B×T | floor | fused | Liger | baseline (TRL-style) | fused, no grad |"  # no compiled runs
    assert lines[2] == "| 2×1024 | 10 ms | 1.05× · 1.50 GiB | 1.50× · 3.00 GiB | out of memory | 1.10× |"
    assert lines[3] == "| 4×1024 | 20 ms | 1.05× · 12.2 GiB | — | — | — |"


def test_tables_go_between_their_markers_only():
    text = "a\n<!-- performance table -->\nold\n<!-- end performance table -->\nb\n"
    assert readme.with_tables(text, {"performance": "new"}) == (
        "a\n<!-- performance table -->\nnew\n<!-- end performance table -->\nb\n")
    with pytest.raises(ValueError, match="training"):
        readme.with_tables(text, {"training": "x"})
