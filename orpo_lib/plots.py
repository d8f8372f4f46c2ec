"""The workbook's figures: each function takes data (model or measured) and returns a Figure.

Every figure carries a footnote naming where its numbers came from (the analytic model, or the
GPU, software versions, date and commit of a benchmark record).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from . import memory
from .measurements import BenchRecord, floor_mode, provenance_caption

STYLE = {
    "floor": {"color": "0.35", "label": "floor (3 GEMMs)", "marker": "s"},
    "logits_gemm": {"color": "0.6", "label": "logits GEMM alone", "marker": "v"},
    "seed_baseline": {"color": "tab:purple", "label": "seed baseline (TRL-style reference)", "marker": "x"},
    "baseline": {"color": "tab:red", "label": "baseline (orpo_lib, fp32 logits)", "marker": "o"},
    "liger": {"color": "tab:orange", "label": "Liger ORPO", "marker": "^"},
    "fused": {"color": "tab:blue", "label": "fused (default chunks)", "marker": "D"},
    "fused_lean": {"color": "tab:cyan", "label": "fused, lean (1024-row chunks)", "marker": "P"},
}
UNMASKED = {"mask": "none"}  # benchmark rows where every token counts (the anchors' setting)
MODEL_NOTE = "Model: orpo_lib.memory (analytic, counted tensor sizes)"


def add_caption(fig: Figure, *lines: str) -> None:
    """Footnote under the axes, wrapped to the figure's width; room is made for it."""
    width = int(fig.get_figwidth() * 17)
    wrapped = [part for line in lines if line for part in textwrap.wrap(line, width)]
    fig.text(0.01, 0.01, "\n".join(wrapped), fontsize=7, color="0.3", va="bottom", ha="left")
    fig.subplots_adjust(bottom=0.15 + 0.14 * len(wrapped) / fig.get_figheight())


def save_figure(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``name``.png and ``name``.svg into ``out_dir`` (byte-stable across runs)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    with plt.rc_context({"svg.hashsalt": name, "svg.fonttype": "none"}):  # text stays searchable
        fig.savefig(paths[0], dpi=150, metadata={"Software": None})
        fig.savefig(paths[1], metadata={"Date": None, "Creator": None})
    return paths


def _shape_label(seq=None, hidden=None, vocab=None, batch=None) -> str:
    parts = [f"{k}={v}" for k, v in (("B", batch), ("T", seq), ("H", hidden), ("V", vocab)) if v is not None]
    return ", ".join(parts)


def memory_scaling(
    axis: str,
    values: list[int],
    *,
    batch: int,
    seq: int,
    hidden: int,
    vocab: int,
    dtype_bytes: int = 2,
    chunk_rows: int | None = None,
    impls: tuple[str, ...] = memory.IMPLEMENTATIONS,
    measured: list[BenchRecord] = (),
) -> Figure:
    """Modelled peak memory (log scale) against ``axis`` ("batch" or "seq"), measured peaks overlaid.

    Measured points are drawn only where their shape matches the modelled line.
    """
    fig, ax = plt.subplots(figsize=(10, 5.2))
    captions = [MODEL_NOTE]
    for impl in impls:
        shape = {"batch": batch, "seq": seq, "hidden": hidden, "vocab": vocab}
        ys = []
        for v in values:
            shape[axis] = v
            rows = chunk_rows if impl == "fused" else None
            ys.append(memory.peak_gib(impl, dtype_bytes=dtype_bytes, chunk_rows=rows, **shape))
        ax.plot(values, ys, color=STYLE[impl]["color"], label=f"{STYLE[impl]['label']}, model")
    fixed = {"batch": batch, "seq": seq}
    fixed.pop(axis)
    for record in measured:
        drawn = False
        for impl in impls:
            points = [
                (r[axis], r["peak_over_inputs_gib"])
                for r in record.select(provider=impl, mode="full", hidden=hidden, vocab=vocab, **UNMASKED, **fixed)
                if r.get("peak_over_inputs_gib") is not None and r[axis] in values
                and (impl != "fused" or r.get("chunk_size") == chunk_rows)
            ]
            if points:
                xs, ys = zip(*sorted(points))
                ax.scatter(xs, ys, color=STYLE[impl]["color"], marker=STYLE[impl]["marker"], zorder=3, label=f"{STYLE[impl]['label']}, measured ({record.source})")
                drawn = True
        if drawn:
            captions.append(provenance_caption(record.provenance))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(values, [str(v) for v in values])
    ax.set_xlabel("batch B (sequences: B/2 pairs)" if axis == "batch" else "sequence length T")
    ax.set_ylabel("peak memory over inputs (GiB)")
    shape_text = _shape_label(**{k: v for k, v in {"batch": batch, "seq": seq, "hidden": hidden, "vocab": vocab}.items() if k != axis})
    ax.set_title(f"Peak memory of one forward+backward, {shape_text}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.subplots_adjust(right=0.6)
    add_caption(fig, *captions)
    return fig


def memory_breakdown(batch: int, seq: int, hidden: int, vocab: int, dtype_bytes: int = 2, chunk_rows: int | None = None) -> Figure:
    """Stacked bars: what is alive at each implementation's peak."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    impls = list(memory.IMPLEMENTATIONS)
    for i, impl in enumerate(impls):
        rows = chunk_rows if impl == "fused" else None
        left = 0.0
        for name, size in memory.peak_bytes(impl, batch, seq, hidden, vocab, dtype_bytes, chunk_rows=rows).items():
            gib = size / memory.GIB
            ax.barh(i, gib, left=left, color=STYLE[impl]["color"], edgecolor="white", alpha=0.85)
            if gib > 0.06 * ax.get_xlim()[1] or gib > 0.5:
                ax.text(left + gib / 2, i, name, ha="center", va="center", fontsize=6, rotation=0)
            left += gib
        ax.text(left, i, f" {left:.2f} GiB", va="center", fontsize=8)
    ax.set_yticks(range(len(impls)), [STYLE[k]["label"] for k in impls], fontsize=8)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("GiB alive at the peak (over inputs)")
    ax.set_title(f"What is alive at the peak, {_shape_label(batch=batch, seq=seq, hidden=hidden, vocab=vocab)}")
    add_caption(fig, MODEL_NOTE)
    return fig


def training_margin(history: list[dict]) -> Figure:
    """Reward margin and the two log-prob curves over a toy ORPO run."""
    steps = [h["step"] for h in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.4))
    left.plot(steps, [h["chosen_logps"] for h in history], color="tab:green", label="chosen log-prob")
    left.plot(steps, [h["rejected_logps"] for h in history], color="tab:red", label="rejected log-prob")
    left.set_xlabel("step")
    left.set_ylabel("mean per-token log-prob")
    left.legend(fontsize=8)
    right.plot(steps, [h["reward_margin"] for h in history], color="tab:blue")
    right.set_xlabel("step")
    right.set_ylabel("reward margin  β·(c − r)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle("Toy ORPO run with fused_linear_orpo_loss")
    add_caption(fig, "Data: this notebook's own CPU run (Triton interpreter), seeded")
    return fig


def chunk_pareto(sweep: list[dict], provenance: dict | None, *, batch: int, seq: int, hidden: int, vocab: int,
                 chunk_sizes: list[int]) -> Figure:
    """Time against memory for each chunk size: the measured sweep if any, the model's prediction always."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    captions = [MODEL_NOTE + f"; roofline at {memory.H200_GEMM_TFLOPS:.0f} TFLOP/s and {memory.H200_ROW_KERNEL_TBPS} TB/s"]
    for fp32_dw, linestyle in ((True, "--"), (False, ":")):
        model_mem = [memory.peak_gib("fused", batch, seq, hidden, vocab, chunk_rows=c, dw_fp32=fp32_dw) for c in chunk_sizes]
        model_ms = [memory.predicted_ms(memory.stage_costs("fused", batch, seq, hidden, vocab, chunk_rows=c)) for c in chunk_sizes]
        ax.plot(model_mem, model_ms, linestyle, color="0.5", marker=".", label=f"model, dW in {'fp32' if fp32_dw else 'weight dtype'}")
        for c, x, y in zip(chunk_sizes, model_mem, model_ms):
            ax.annotate(str(c), (x, y), fontsize=6, color="0.5", xytext=(3, -8), textcoords="offset points")
        points = sorted((p for p in sweep if p.get("fp32_weight_grad", True) == fp32_dw and p.get("status", "ok") == "ok"),
                        key=lambda p: p["chunk_size"])
        if points:
            ax.plot([p["peak_over_inputs_gib"] for p in points], [p["median_ms"] for p in points], linestyle="-",
                    color=STYLE["fused" if fp32_dw else "fused_lean"]["color"], marker="D",
                    label=f"measured, dW in {'fp32' if fp32_dw else 'weight dtype'}")
            for p in points:
                ax.annotate(str(p["chunk_size"]), (p["peak_over_inputs_gib"], p["median_ms"]), fontsize=7, xytext=(4, 4), textcoords="offset points")
    if sweep and provenance:
        captions.append(provenance_caption(provenance))
    ax.set_xscale("log")
    ax.set_xlabel("peak memory over inputs (GiB)")
    ax.set_ylabel("forward+backward (ms)")
    ax.set_title(f"Chunk size: time against memory, {_shape_label(batch=batch, seq=seq, hidden=hidden, vocab=vocab)}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    add_caption(fig, *captions)
    return fig


def stage_breakdown(predicted: list[dict], record: BenchRecord | None = None) -> Figure:
    """Per-stage time: roofline prediction from counted FLOPs/bytes, measured stages if recorded."""
    measured = (record.sweeps.get("stages") if record else None) or []
    fig, ax = plt.subplots(figsize=(7, 3.4))
    names = [s["stage"] for s in predicted]
    model_ms = [memory.predicted_ms([s]) for s in predicted]
    ax.barh([i + 0.2 for i in range(len(names))], model_ms, height=0.4, color="0.6", label="model (roofline)")
    captions = [MODEL_NOTE]
    if measured:
        offset = len(names)
        for j, s in enumerate(measured):
            ax.barh(offset + j - 0.2, s["median_ms"], height=0.4, color=STYLE["fused"]["color"], label="measured" if j == 0 else None)
        names = names + [s["stage"] for s in measured]
        captions.append(provenance_caption(record.provenance))
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title("Where the time goes, stage by stage")
    ax.legend(fontsize=8)
    add_caption(fig, *captions)
    return fig


def row_kernel_heatmap(record: BenchRecord) -> Figure:
    """Achieved bandwidth of the row kernel for each (BLOCK_V, num_warps)."""
    points = [p for p in record.sweeps["row_kernel"] if p.get("write_probs", True)]
    blocks = sorted({p["block_v"] for p in points})
    warps = sorted({p["num_warps"] for p in points})
    grid = [[float("nan")] * len(blocks) for _ in warps]
    for p in points:
        grid[warps.index(p["num_warps"])][blocks.index(p["block_v"])] = p["gbps"]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            if value == value:
                ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=7, color="white")
    ax.set_xticks(range(len(blocks)), [str(b) for b in blocks])
    ax.set_yticks(range(len(warps)), [str(w) for w in warps])
    ax.set_xlabel("BLOCK_V")
    ax.set_ylabel("num_warps")
    ax.set_title("Row kernel (statistics + in-place probabilities): GB/s moved")
    fig.colorbar(image, ax=ax, label="GB/s")
    add_caption(fig, provenance_caption(record.provenance))
    return fig


def batch_scaling(
    record: BenchRecord | None,
    *,
    seq: int,
    hidden: int,
    vocab: int,
    mode: str = "full",
    references: list[BenchRecord] = (),
    batches: list[int] | None = None,
) -> Figure:
    """Time and peak memory against batch for every provider at one (T, H, V), references as hollow markers.

    The floor of "forward" and "eval" is the logits GEMM alone. ``batches`` limits the points drawn;
    a panel with nothing to draw says why instead of showing empty axes.
    """
    fig, (time_ax, mem_ax) = plt.subplots(1, 2, figsize=(10, 4.2))
    fig.subplots_adjust(wspace=0.3)  # room for the memory panel's y label
    captions, oom = [], []
    providers = ("floor", "seed_baseline", "baseline", "liger", "fused", "fused_lean")
    shape = {"seq": seq, "hidden": hidden, "vocab": vocab}

    def in_batches(rows):
        return sorted((r for r in rows if batches is None or r["batch"] in batches), key=lambda r: r["batch"])

    if record is not None:
        drawn = False
        for provider in providers:
            provider_mode = floor_mode(mode) if provider == "floor" else mode
            rows = in_batches(record.select(provider=provider, mode=provider_mode, **shape, **UNMASKED))
            oom += [(r["batch"], provider) for r in in_batches(record.select(provider=provider, mode=provider_mode, status="oom", **shape, **UNMASKED))]
            if not rows:
                continue
            style = STYLE["logits_gemm" if provider == "floor" and mode != "full" else provider]
            batch_sizes = [r["batch"] for r in rows]
            time_ax.errorbar(
                batch_sizes, [r["median_ms"] for r in rows],
                yerr=[[r["median_ms"] - r["min_ms"] for r in rows], [r["max_ms"] - r["median_ms"] for r in rows]],
                color=style["color"], marker=style["marker"], label=style["label"], capsize=2,
            )
            mem = [(r["batch"], r["peak_over_inputs_gib"]) for r in rows if r.get("peak_over_inputs_gib") is not None and provider != "floor"]
            if mem:
                mem_ax.plot(*zip(*mem), color=style["color"], marker=style["marker"], label=style["label"])
            drawn = True
        if drawn or oom:
            captions.append(provenance_caption(record.provenance))
    for reference in references:
        drawn = False
        for provider in providers:
            rows = in_batches(reference.select(provider=provider, **shape))
            if not rows:
                continue
            style = STYLE[provider]
            label = f"{style['label']} — {reference.source}, {rows[0]['mode']}"
            time_ax.plot([r["batch"] for r in rows], [r["median_ms"] for r in rows], linestyle=":", marker=style["marker"], markerfacecolor="none", color=style["color"], label=label)
            mem = [(r["batch"], r["peak_over_inputs_gib"]) for r in rows if r.get("peak_over_inputs_gib") is not None]
            if mem:
                mem_ax.plot(*zip(*mem), linestyle=":", marker=style["marker"], markerfacecolor="none", color=style["color"], label=label)
            drawn = True
        if drawn:
            captions.append(f"Reference ({reference.source}): " + provenance_caption(reference.provenance))
    if record is None:
        why_empty = "no GPU benchmark record in figures/data yet"
    elif oom:
        why_empty = f"out of memory at B={', '.join(sorted({str(b) for b, _ in oom}, key=int))} in {record.source}"
    else:
        why_empty = f"none in {record.source}"
    for ax, ylabel, quantity in ((time_ax, f"{mode} (ms, median; bars: min–max)", "times"),
                                 (mem_ax, "peak memory over inputs (GiB)", "peaks")):
        ax.set_xlabel("batch B")
        ax.set_ylabel(ylabel)
        if not ax.get_legend_handles_labels()[0]:
            ax.text(0.5, 0.5, f"No measured {mode} {quantity}\nat {_shape_label(**shape)}:\n{why_empty}",
                    transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.3")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    if time_ax.get_legend_handles_labels()[0]:  # OOM marks sit at the top of a drawn time axis
        for batch, provider in oom:
            time_ax.annotate("OOM", (batch, time_ax.get_ylim()[1]), color=STYLE[provider]["color"], fontsize=7, va="top")
    fig.suptitle(f"Scaling with batch, {_shape_label(**shape)}, mode {mode}")
    add_caption(fig, *captions)
    return fig
