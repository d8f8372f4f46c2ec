"""Rebuild every report figure in ``figures/`` from ``figures/data`` (no GPU needed).

    python -m orpo_lib.figures [--data figures/data] [--out figures]

Figures of the analytic memory model are always drawn, with the published anchors and the H200
memory check overlaid. Figures of measured time need a benchmark record; without one this says
so and draws none of them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib.pyplot as plt

from . import memory, plots
from .measurements import (DATA_DIR, H200_ANCHORS, H200_MEMORY_CHECK, NO_RECORD_MESSAGE, SEED_A100_FORWARD,
                           latest_bench_record)

FIGURE_DIR = DATA_DIR.parent
# The seed workloads: H=4096, V=128256, bf16, B = 2..16, T = 1024 and 4096.
SEED_SHAPE = {"hidden": 4096, "vocab": 128256}
SEED_BATCHES = [2, 4, 8, 16]
SWEEP_CHUNKS = [1024, 2048, 4096, 8192, 16384]


def _save(fig, out_dir, name, written):
    written += plots.save_figure(fig, out_dir, name)
    plt.close(fig)


def build_figures(data_dir: str | Path | None = None, out_dir: str | Path | None = None) -> list[Path]:
    """Write every figure the data supports; returns the files written."""
    out = Path(out_dir) if out_dir else FIGURE_DIR
    record = latest_bench_record(data_dir)
    measured = [H200_ANCHORS, H200_MEMORY_CHECK] + ([record] if record else [])
    written: list[Path] = []
    for seq in (1024, 4096):
        fig = plots.memory_scaling("batch", SEED_BATCHES, batch=2, seq=seq, measured=measured, **SEED_SHAPE)
        _save(fig, out, f"memory-vs-batch-T{seq}", written)
    fig = plots.memory_scaling("seq", [512, 1024, 2048, 4096, 8192, 16384], batch=16, seq=1024, measured=measured, **SEED_SHAPE)
    _save(fig, out, "memory-vs-seq-B16", written)
    _save(plots.memory_breakdown(16, 4096, **SEED_SHAPE), out, "memory-breakdown-16x4096", written)
    if record is None:
        print(NO_RECORD_MESSAGE)
        return written
    shapes = sorted({(r["seq"], r["hidden"], r["vocab"]) for r in record.results if r.get("mask", "none") == "none"})
    for seq, hidden, vocab in shapes:
        seed_shape = {"hidden": hidden, "vocab": vocab} == SEED_SHAPE
        suffix = f"T{seq}" if seed_shape else f"T{seq}-H{hidden}-V{vocab}"
        fig = plots.batch_scaling(record, seq=seq, hidden=hidden, vocab=vocab, mode="full", references=[H200_ANCHORS])
        _save(fig, out, f"batch-scaling-full-{suffix}", written)
        if record.select(mode="forward", seq=seq, hidden=hidden, vocab=vocab):
            fig = plots.batch_scaling(record, seq=seq, hidden=hidden, vocab=vocab, mode="forward", references=[SEED_A100_FORWARD])
            _save(fig, out, f"batch-scaling-forward-{suffix}", written)
    sweeps = record.sweeps
    shape = _sweep_shape(record)
    if sweeps.get("chunk") and shape:
        fig = plots.chunk_pareto(sweeps["chunk"], record.provenance, chunk_sizes=SWEEP_CHUNKS, **shape)
        _save(fig, out, "chunk-pareto", written)
    if sweeps.get("stages") and shape:
        predicted = memory.stage_costs("fused", **shape)
        _save(plots.stage_breakdown(predicted, record), out, "stage-breakdown", written)
    if sweeps.get("row_kernel"):
        _save(plots.row_kernel_heatmap(record), out, "row-kernel", written)
    return written


def _sweep_shape(record) -> dict | None:
    """The shape the sweeps ran at, from the command that produced the record (bench's default: 8x4096)."""
    command = record.provenance.get("command") or ""
    words = command.split()
    text = words[words.index("--sweep-shape") + 1] if "--sweep-shape" in words else "8x4096"
    batch, seq = (int(v) for v in text.split("x"))
    # bench.py runs the sweeps at the record's hidden and vocab sizes
    first = record.results[0] if record.results else SEED_SHAPE
    hidden = int(words[words.index("--hidden") + 1]) if "--hidden" in words else first["hidden"]
    vocab = int(words[words.index("--vocab") + 1]) if "--vocab" in words else first["vocab"]
    return {"batch": batch, "seq": seq, "hidden": hidden, "vocab": vocab}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="folder of benchmark JSON records (default figures/data)")
    parser.add_argument("--out", default=None, help="folder for the figures (default figures/)")
    args = parser.parse_args(argv)
    written = build_figures(args.data, args.out)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
