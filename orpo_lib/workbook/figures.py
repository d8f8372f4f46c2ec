"""Rebuild every report figure in ``figures/`` from ``figures/data`` (no GPU needed).

    python -m orpo_lib.workbook.figures [--data figures/data] [--out figures]

Figures of the analytic memory model are always drawn, with the peaks of the newest seed-shapes
record overlaid. Figures of measured time need a
benchmark record; without one this says so and draws none of them. A mask record
(``mask-*.json``) adds the realistic-mask comparison.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib.pyplot as plt

from . import memory, plots
from .measurements import DATA_DIR, NO_RECORD_MESSAGE, latest_bench_record, mask_rows, sweep_shape

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
    measured = [record] if record else []
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
        fig = plots.batch_scaling(record, seq=seq, hidden=hidden, vocab=vocab, mode="full")
        _save(fig, out, f"batch-scaling-full-{suffix}", written)
        for mode in ("forward", "eval"):
            if record.select(mode=mode, seq=seq, hidden=hidden, vocab=vocab):
                fig = plots.batch_scaling(record, seq=seq, hidden=hidden, vocab=vocab, mode=mode)
                _save(fig, out, f"batch-scaling-{mode}-{suffix}", written)
    sweeps = record.sweeps
    shape = sweep_shape(record, "chunk")
    if sweeps.get("chunk") and shape:
        fig = plots.chunk_pareto(sweeps["chunk"], record.provenance, chunk_sizes=SWEEP_CHUNKS, source=record.source, **shape)
        _save(fig, out, "chunk-pareto", written)
    shape = sweep_shape(record, "stages")
    if sweeps.get("stages") and shape:
        rows = sweeps["stages"][0].get("chunk_rows")
        predicted = memory.stage_costs("fused", **shape, chunk_rows=rows)
        _save(plots.stage_breakdown(predicted, record), out, "stage-breakdown", written)
    if sweeps.get("row_kernel"):
        _save(plots.row_kernel_heatmap(record), out, "row-kernel", written)
    mask_record = latest_bench_record(data_dir, pattern="mask-*.json")
    if mask_record is not None and mask_rows(mask_record):
        _save(plots.mask_comparison(mask_rows(mask_record), mask_record), out, "mask-prompt-half", written)
    return written


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
