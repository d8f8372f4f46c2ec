"""The workbook's figures: each function takes data (model or measured) and returns a Figure.

Every figure carries a footnote naming where its numbers came from (the analytic model, or the
GPU, software versions, date and commit of a benchmark record).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
from IPython.display import display
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from . import memory
from .kernel_tour import group_pass
from .measurements import BenchRecord, floor_mode, provenance_caption, record_caption, sweep_shape

STYLE = {
    "floor": {"color": "0.35", "label": "floor (3 GEMMs)", "marker": "s"},
    "logits_gemm": {"color": "0.6", "label": "logits GEMM alone", "marker": "v"},
    "seed_baseline": {"color": "tab:purple", "label": "seed baseline (TRL-style reference)", "marker": "x"},
    "baseline": {"color": "tab:red", "label": "baseline (orpo_lib, fp32 logits)", "marker": "o"},
    "liger": {"color": "tab:orange", "label": "Liger ORPO", "marker": "^"},
    "fused": {"color": "tab:blue", "label": "fused (default chunks)", "marker": "D"},
    "fused_lean": {"color": "tab:cyan", "label": f"fused, lean (at most {memory.LEAN_CHUNK_ROWS}-row blocks, dW in the weight dtype)", "marker": "P"},
}
UNMASKED = {"mask": "none"}  # benchmark rows where every token counts (the anchors' setting)
MODEL_NOTE = "Model: orpo_lib.workbook.memory (counted tensor sizes)"


def add_caption(fig: Figure, *lines: str) -> None:
    """Footnote under the axes, wrapped to the figure's width; room is made for it."""
    width = int(fig.get_figwidth() * 18)
    wrapped = [part for line in lines if line for part in textwrap.wrap(line, width)]
    fig.text(0.01, 0.01, "\n".join(wrapped), fontsize=7, color="0.3", va="bottom", ha="left")
    fig.subplots_adjust(bottom=(0.6 + 0.13 * len(wrapped)) / fig.get_figheight())


def plain_log_axis(axis) -> None:
    """Plain numbers (2, 4, 8 or 0.5, 1, 2) on a log axis instead of powers of ten, and enough of them.

    Left to itself a base-10 axis labels only the powers of ten: over 2 to 90 GiB that is the one label
    "10". Here it gets ticks at 1, 2 and 5 times each power of ten (1, 2, 3 and 5 where the data spans less
    than a factor of 10, every multiple where it spans less than 3). Ticks set by hand and axes of
    another base (2, 4, 8) keep theirs. Call it once the data is drawn: the ticks follow its range.
    """
    if isinstance(axis.get_major_locator(), LogLocator) and axis.get_transform().base == 10:
        low, high = axis.get_view_interval()
        subs = (1, 2, 5) if high / low >= 10 else (1, 2, 3, 5) if high / low >= 3 else range(1, 10)
        axis.set_major_locator(LogLocator(base=10, subs=list(subs)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def save_figure(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``name``.png and ``name``.svg into ``out_dir`` (byte-stable across runs)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    with plt.rc_context({"svg.hashsalt": name, "svg.fonttype": "none"}):  # text stays searchable
        fig.savefig(paths[0], dpi=150, metadata={"Software": None})
        fig.savefig(paths[1], metadata={"Date": None, "Creator": None})
    return paths


def show_figure(fig: Figure, output_dir: str | Path | None, name: str) -> None:
    """Save ``fig`` (where ``output_dir`` is set), display it and close it: the inline backend draws a figure
    still open at the end of a cell once more, under the one a cell displays."""
    if output_dir:
        save_figure(fig, output_dir, name)
    display(fig)
    plt.close(fig)


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
    """Modelled peak memory (lines, log scale) against ``axis`` ("batch" or "seq"), measured peaks as markers.

    Each implementation's markers come from the first record in ``measured`` that has it at the
    modelled shape; the legend has one entry per implementation and sits below the axes.
    """
    fig, ax = plt.subplots(figsize=(8, 5.6))
    fixed = {"batch": batch, "seq": seq}
    fixed.pop(axis)
    sources = []
    handles = []
    for impl in impls:
        shape = {"batch": batch, "seq": seq, "hidden": hidden, "vocab": vocab}
        ys = []
        for v in values:
            shape[axis] = v
            rows = chunk_rows if impl == "fused" else None
            ys.append(memory.peak_gib(impl, dtype_bytes=dtype_bytes, chunk_rows=rows, **shape))
        style = STYLE[impl]
        ax.plot(values, ys, color=style["color"])
        for record in measured:
            points = [
                (r[axis], r["peak_over_inputs_gib"])
                for r in record.select(provider=impl, mode="full", hidden=hidden, vocab=vocab, **UNMASKED, **fixed)
                if r.get("peak_over_inputs_gib") is not None and r[axis] in values
                and (impl != "fused" or r.get("chunk_size") == chunk_rows)
            ]
            if points:
                xs, ys = zip(*sorted(points))
                ax.scatter(xs, ys, color=style["color"], marker=style["marker"], s=36, zorder=3)
                if record not in sources:
                    sources.append(record)
                break
        handles.append(Line2D([], [], color=style["color"], marker=style["marker"], label=style["label"]))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(values, [str(v) for v in values])
    ax.xaxis.set_minor_formatter(NullFormatter())
    plain_log_axis(ax.yaxis)
    ax.set_xlabel("batch B (sequences: B/2 pairs)" if axis == "batch" else "sequence length T")
    ax.set_ylabel("peak memory over inputs (GiB)")
    shape_text = _shape_label(**{k: v for k, v in {"batch": batch, "seq": seq, "hidden": hidden, "vocab": vocab}.items() if k != axis})
    ax.set_title(f"Peak memory of one forward+backward, {shape_text}", fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False,
              title="lines: model; markers: measured", title_fontsize=8)
    add_caption(fig, MODEL_NOTE, *(f"Measured: {record_caption(r)}" for r in sources))
    fig.subplots_adjust(bottom=0.36)
    return fig


def impl_label(impl: str, chunk_rows: int | None = None) -> str:
    """An implementation's legend label, naming the fused loss's chunk size when one is set."""
    if impl == "fused" and chunk_rows:
        return f"fused (at most {chunk_rows}-row blocks)"
    return STYLE[impl]["label"]


def memory_breakdown(batch: int, seq: int, hidden: int, vocab: int, dtype_bytes: int = 2, chunk_rows: int | None = None) -> Figure:
    """Stacked bars on a linear axis: the tensors alive at each implementation's peak, one segment each.

    When the largest peak dwarfs the others, a second panel repeats the bars on a scale of the small
    ones (the large bars run off it, their totals written beside), so that every segment is readable.
    """
    impls = list(memory.IMPLEMENTATIONS)
    parts = {impl: memory.peak_bytes(impl, batch, seq, hidden, vocab, dtype_bytes, chunk_rows=chunk_rows if impl == "fused" else None)
             for impl in impls}
    totals = {impl: sum(p.values()) for impl, p in parts.items()}
    largest = max(totals.values())
    unit, unit_bytes = next((u, b) for u, b in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if largest >= b or u == "KiB")
    small = [t / unit_bytes for t in totals.values() if t < largest / 4]
    limits = [largest / unit_bytes * 1.45] + ([max(small) * 1.6] if small else [])
    fig, axes = plt.subplots(1, len(limits), figsize=(11 if small else 8, 3.9), sharey=True, squeeze=False)
    for ax, limit in zip(axes[0], limits):
        for i, impl in enumerate(impls):
            left = 0.0
            for size in parts[impl].values():
                ax.barh(i, size / unit_bytes, left=left, height=0.5, color=STYLE[impl]["color"], edgecolor="white",
                        linewidth=1.2, alpha=0.85)
                left += size / unit_bytes
            phase = memory.peak_phase(impl, batch, seq, hidden, vocab, dtype_bytes, chunk_rows=chunk_rows if impl == "fused" else None)
            top = max(parts[impl], key=parts[impl].get)
            note = f"{left:.2f} {unit} at {phase}; largest: {top}, {parts[impl][top] / unit_bytes:.2f}"
            ax.text(limit * 0.005, i + 0.4, note + (" (runs off this panel)" if left > limit else ""), ha="left",
                    va="center", fontsize=6.5)
        ax.set_xlim(0, limit)
        ax.set_ylim(-0.5, len(impls) - 0.3)
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_xlabel(f"{unit} alive at the peak, over the inputs")
    axes[0][0].set_yticks(range(len(impls)), [textwrap.fill(impl_label(k, chunk_rows), 30) for k in impls], fontsize=8)
    if small:
        axes[0][0].set_title("every implementation", fontsize=9)
        axes[0][1].set_title(f"the same, up to {limits[1]:.3g} {unit}", fontsize=9)
    dtype = {2: "16-bit", 4: "fp32"}.get(dtype_bytes, f"{dtype_bytes}-byte")
    fig.suptitle(f"What is alive at the peak ({dtype} inputs; one segment per tensor), "
                 f"{_shape_label(batch=batch, seq=seq, hidden=hidden, vocab=vocab)}", fontsize=10)
    add_caption(fig, MODEL_NOTE + "; linear axes, so a segment's width is its size")
    fig.subplots_adjust(left=0.2 if small else 0.28, right=0.98, wspace=0.06, top=0.84)
    return fig


# How each kind of chunk group is drawn (kernel_tour.group_pass names the kind).
PASS_STYLE = {
    "one pass": {"color": "tab:blue", "hatch": None},
    "two passes": {"color": "tab:orange", "hatch": "//"},
    "one pass, per sequence": {"color": "tab:green", "hatch": ".."},
}


def chunk_plan(plan, vocab: int | None = None, dtype_bytes: int = 2) -> Figure:
    """The rows of a call in the order the loss takes them: one bar per block of logits, coloured by the
    pass its group takes, each chunk outlined; pair boundaries as ticks; the buffer's height beside it
    (``kernel_tour.ChunkPlan``)."""
    total = plan.batch * plan.seq
    fig, (ax, buffer_ax) = plt.subplots(1, 2, figsize=(9, 3.0), gridspec_kw={"width_ratios": [6, 1]})
    for i, group in enumerate(plan.groups):
        style = PASS_STYLE[group_pass(group)]
        for start, end in group.blocks:
            ax.barh(0, end - start, left=start, height=0.6, color=style["color"], hatch=style["hatch"],
                    edgecolor="white", linewidth=1.0)
        first, last = group.blocks[0][0], group.blocks[-1][1]
        ax.add_patch(plt.Rectangle((first, -0.3), last - first, 0.6, fill=False, edgecolor="black", linewidth=1.2))
        if len(plan.groups) <= 12:
            pairs = (f"pair {group.first_pair}" if group.end_pair - group.first_pair == 1
                     else f"pairs {group.first_pair}–{group.end_pair - 1}")
            ax.text((first + last) / 2, 0.4, f"chunk {i}\n{pairs}", ha="center", va="bottom", fontsize=7)
    pair_rows = 2 * plan.seq
    if plan.batch // 2 <= 64:
        ax.set_xticks(range(0, total + 1, pair_rows), minor=True)
    ax.tick_params(axis="x", which="minor", length=6, color="0.3")
    ax.set_xlim(0, total)
    ax.set_ylim(-0.8, 1.0)
    ax.set_yticks([])
    ax.set_xlabel(f"token rows in pair order (chosen i, then rejected i; minor ticks: pairs of {pair_rows} rows)")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=v["color"], hatch=v["hatch"], edgecolor="white", label=k)
               for k, v in PASS_STYLE.items()]
    handles.append(plt.Rectangle((0, 0), 1, 1, fill=False, edgecolor="black", label="a chunk (white lines: its blocks)"))
    ax.legend(handles=handles, fontsize=7, loc="lower center", ncol=2, frameon=False)  # in one row it runs past the axes
    ax.set_title(f"Chunk plan, B={plan.batch}, T={plan.seq}, at most {plan.chunk_rows} rows per block: "
                 f"{len(plan.groups)} chunk(s), {plan.blocks} block(s)", fontsize=9)
    buffer_ax.bar(0, plan.buffer_rows, color="0.5", width=0.6)
    buffer_ax.axhline(plan.chunk_rows, color="black", linestyle="--", linewidth=0.8)
    buffer_ax.text(0.45, plan.chunk_rows, "limit", fontsize=7, va="bottom", ha="right")
    buffer_ax.set_xlim(-0.5, 0.5)
    buffer_ax.set_ylim(0, max(plan.chunk_rows, plan.buffer_rows) * 1.3)
    buffer_ax.set_xticks([])
    buffer_ax.set_ylabel("rows of logits", fontsize=8)
    label = f"{plan.buffer_rows} rows"
    if vocab:
        label += f"\n{plan.buffer_rows * vocab * dtype_bytes / memory.GIB:.2f} GiB"
    buffer_ax.set_xlabel(label, fontsize=7)  # under the bar: inside, it is wider than the bar
    buffer_ax.set_title("buffer", fontsize=9)
    add_caption(fig, f"Plan: orpo_lib.schedule.plan_chunks, every token counted; row limit {plan.chunk_rows}, "
                     f"{plan.limit_source}")
    fig.subplots_adjust(wspace=0.25, top=0.85)
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
                 chunk_sizes: list[int], source: str = "") -> Figure:
    """Time against memory for each chunk size: the measured sweep if any, the model's prediction always."""
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for fp32_dw, linestyle in ((True, "--"), (False, ":")):
        dw = "fp32" if fp32_dw else "weight dtype"
        model_mem = [memory.peak_gib("fused", batch, seq, hidden, vocab, chunk_rows=c, dw_fp32=fp32_dw) for c in chunk_sizes]
        model_ms = [memory.predicted_ms(memory.stage_costs("fused", batch, seq, hidden, vocab, chunk_rows=c)) for c in chunk_sizes]
        ax.plot(model_mem, model_ms, linestyle, color="0.55", marker=".", label=f"model (roofline), dW in {dw}")
        points = sorted((p for p in sweep if p.get("fp32_weight_grad", True) == fp32_dw and p.get("status", "ok") == "ok"),
                        key=lambda p: p["chunk_size"])
        if points:
            ax.plot([p["peak_over_inputs_gib"] for p in points], [p["median_ms"] for p in points], linestyle="-",
                    color=STYLE["fused" if fp32_dw else "fused_lean"]["color"], marker="D", label=f"measured, dW in {dw}")
            for p in points:
                ax.annotate(str(p["chunk_size"]), (p["peak_over_inputs_gib"], p["median_ms"]), fontsize=7,
                            xytext=(6, 2 if fp32_dw else -11), textcoords="offset points")
    ax.set_xscale("log")
    low, high = ax.get_xlim()
    ax.set_xticks([t for t in (0.5, 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 12, 16, 24, 32) if low <= t <= high])
    plain_log_axis(ax.xaxis)
    ax.set_xlabel("peak memory over inputs (GiB); labels: chunk rows")
    ax.set_ylabel("forward+backward (ms)")
    ax.set_title(f"Chunk size: time against memory, {_shape_label(batch=batch, seq=seq, hidden=hidden, vocab=vocab)}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    captions = [MODEL_NOTE + f"; roofline at {memory.H200_GEMM_TFLOPS:.0f} TFLOP/s, {memory.H200_ROW_KERNEL_TBPS} TB/s"]
    if sweep and provenance:
        captions.append("Measured: " + provenance_caption(provenance, source))
    add_caption(fig, *captions)
    return fig


def stage_breakdown(predicted: list[dict], record: BenchRecord | None = None) -> Figure:
    """Per-stage time of one chunk: roofline prediction from counted FLOPs/bytes, and the measured stages if recorded."""
    measured = (record.sweeps.get("stages") if record else None) or []
    panels = 2 if measured else 1
    fig, axes = plt.subplots(panels, 1, figsize=(8, 2.0 + 0.3 * (len(predicted) + len(measured))), sharex=True,
                             gridspec_kw={"height_ratios": [len(predicted)] + ([len(measured)] if measured else [])})
    axes = list(axes) if panels == 2 else [axes]
    groups = [("model (roofline)", predicted, [memory.predicted_ms([s]) for s in predicted], "0.6")]
    if measured:
        groups.append(("measured", measured, [s["median_ms"] for s in measured], STYLE["fused"]["color"]))
    for ax, (title, stages, ms, color) in zip(axes, groups):
        ax.barh(range(len(stages)), ms, color=color, height=0.6)
        for i, value in enumerate(ms):
            ax.text(value, i, f" {value:.2f}", va="center", fontsize=7)
        ax.set_yticks(range(len(stages)), [s["stage"] for s in stages], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1].set_xlabel("ms per chunk")
    axes[-1].set_xlim(right=max(max(g[2]) for g in groups) * 1.12)
    rows = measured[0].get("chunk_rows") if measured else None
    fig.suptitle("Where the time goes, stage by stage" + (f" ({rows}-row chunk)" if rows else ""), fontsize=11)
    captions = [MODEL_NOTE]
    if measured:
        captions.append("Measured: " + record_caption(record))
    add_caption(fig, *captions)
    fig.subplots_adjust(left=0.36, right=0.95, hspace=0.35)
    return fig


ROW_KERNEL_PASSES = {"stats": 1, "grads": 2}  # times a row kernel moves the chunk of logits: read; read and write
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
HBM_PEAK_GBPS = 4800  # the H200's


def row_kernel_shape(record: BenchRecord) -> str:
    """The chunk of logits the row-kernel sweep ran on, as "R rows × V=…, dtype". V comes from the sweep's
    command and the dtype from the run's results; R from the bytes each point counted (GB/s × time, the
    chunk once per pass), where every point gives the same R. "shape not recorded" when none is known."""
    shape = sweep_shape(record, "row_kernel")
    if shape is None:
        return "shape not recorded"
    dtypes = {r.get("dtype") for r in record.results if (r.get("hidden"), r.get("vocab")) == (shape["hidden"], shape["vocab"])}
    if len(dtypes) != 1 or next(iter(dtypes)) not in DTYPE_BYTES:
        return f"V={shape['vocab']}"
    (dtype,) = dtypes
    rows = {round(p["gbps"] * p["median_ms"] * 1e6 / (ROW_KERNEL_PASSES[p["kernel"]] * shape["vocab"] * DTYPE_BYTES[dtype]))
            for p in record.sweeps["row_kernel"]}
    prefix = f"{rows.pop()} rows × " if len(rows) == 1 else ""
    return f"{prefix}V={shape['vocab']}, {dtype}"


def row_kernel_heatmap(record: BenchRecord) -> Figure:
    """Achieved bandwidth of each row kernel for each (BLOCK_V, num_warps), with a colour bar in GB/s and
    the shape of the chunk in the title (``row_kernel_shape``)."""
    titles = {"stats": "statistics (one read)", "grads": "gradient in place (one read, one write)"}
    sweep = record.sweeps["row_kernel"]
    variants = [(k, t) for k, t in titles.items() if any(p["kernel"] == k for p in sweep)]
    fig, axes = plt.subplots(1, len(variants), figsize=(4.6 * len(variants) + 0.6, 3.6), squeeze=False)
    for ax, (kernel, title) in zip(axes[0], variants):
        points = [p for p in sweep if p["kernel"] == kernel]
        blocks = sorted({p["block_v"] for p in points})
        warps = sorted({p["num_warps"] for p in points})
        grid = [[float("nan")] * len(blocks) for _ in warps]
        for p in points:
            grid[warps.index(p["num_warps"])][blocks.index(p["block_v"])] = p["gbps"]
        image = ax.imshow(grid, cmap="viridis", aspect="auto", vmin=0, vmax=HBM_PEAK_GBPS)
        best = max(points, key=lambda p: p["gbps"])
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                if value == value:
                    is_best = (warps[i], blocks[j]) == (best["num_warps"], best["block_v"])
                    red, green, blue, _ = image.cmap(image.norm(value))
                    light = 0.2126 * red + 0.7152 * green + 0.0722 * blue > 0.45
                    ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=8,
                            color="black" if light else "white", fontweight="bold" if is_best else "normal")
        ax.set_xticks(range(len(blocks)), [str(b) for b in blocks])
        ax.set_yticks(range(len(warps)), [str(w) for w in warps])
        ax.set_xlabel("BLOCK_V")
        ax.set_ylabel("num_warps")
        ax.set_title(f"{title}\nbest {best['gbps']:.0f} GB/s", fontsize=9)
    colour_bar = fig.colorbar(image, cax=axes[0][-1].inset_axes([1.04, 0.0, 0.04, 1.0]))
    colour_bar.set_label(f"GB/s moved (0 to {HBM_PEAK_GBPS}, the H200's HBM peak)", fontsize=8)
    colour_bar.ax.tick_params(labelsize=7)
    fig.suptitle(f"Row kernels on a chunk of {row_kernel_shape(record)} logits: bytes moved / median time", fontsize=10)
    add_caption(fig, "Measured: " + record_caption(record))
    fig.subplots_adjust(top=0.78, wspace=0.3)
    return fig


def _x_floor(record: BenchRecord, provider: str, mode: str, shape: dict, batches) -> list[tuple[int, float]]:
    """(batch, median / floor median of the same run) for one provider; floor rows give 1."""
    points = []
    for r in record.select(provider=provider, mode=floor_mode(mode) if provider == "floor" else mode, **shape, **UNMASKED):
        floor = record.select(provider="floor", mode=floor_mode(mode), batch=r["batch"], **shape, **UNMASKED)
        if floor and (batches is None or r["batch"] in batches):
            points.append((r["batch"], r["median_ms"] / floor[0]["median_ms"]))
    return sorted(points)


def batch_scaling(
    record: BenchRecord | None,
    *,
    seq: int,
    hidden: int,
    vocab: int,
    mode: str = "full",
    batches: list[int] | None = None,
) -> Figure:
    """Time as a multiple of the floor and peak memory against batch, for every provider at one (T, H, V).

    Ratios are taken against the floor of the same run (the logits GEMM alone for "forward" and
    "eval"). A panel with nothing to draw says why instead of showing empty axes.
    """
    fig, (time_ax, mem_ax) = plt.subplots(1, 2, figsize=(10, 5.6))
    captions, oom, handles = [], [], {}
    providers = ("floor", "seed_baseline", "baseline", "liger", "fused", "fused_lean")
    shape = {"seq": seq, "hidden": hidden, "vocab": vocab}

    def in_batches(rows):
        return sorted((r for r in rows if batches is None or r["batch"] in batches), key=lambda r: r["batch"])

    def draw(source: BenchRecord) -> bool:
        drawn = False
        for provider in providers:
            style = STYLE["logits_gemm" if provider == "floor" and mode != "full" else provider]
            line = {"color": style["color"], "marker": style["marker"], "linestyle": "-", "markerfacecolor": style["color"]}
            ratios = _x_floor(source, provider, mode, shape, batches)
            if ratios:
                time_ax.plot(*zip(*ratios), **line)
                drawn = True
            rows = in_batches(source.select(provider=provider, mode=mode, **shape, **UNMASKED))
            mem = [(r["batch"], r["peak_over_inputs_gib"]) for r in rows if r.get("peak_over_inputs_gib") is not None and provider != "floor"]
            if mem:
                mem_ax.plot(*zip(*mem), **line)
                drawn = True
            if ratios or mem:
                handles.setdefault(style["label"], Line2D([], [], label=style["label"], **line))
        return drawn

    if record is not None:
        oom = [(r["batch"], r["provider"]) for r in in_batches(record.select(mode=mode, status="oom", **shape, **UNMASKED))]
        if draw(record) or oom:
            captions.append("Measured: " + record_caption(record))
    if record is None:
        why_empty = "no GPU benchmark record in figures/data yet"
    elif oom:
        why_empty = f"out of memory at B={', '.join(sorted({str(b) for b, _ in oom}, key=int))} in {record.source}"
    else:
        why_empty = f"none in {record.source}"
    floor_name = "the 3 GEMMs" if mode == "full" else "the logits GEMM"
    for ax, ylabel, quantity in ((time_ax, f"{mode} time / {floor_name} (median, same run)", "times"),
                                 (mem_ax, "peak memory over inputs (GiB)", "peaks")):
        ax.set_xlabel("batch B")
        ax.set_ylabel(ylabel)
        if not ax.lines:
            ax.text(0.5, 0.5, f"No measured {mode} {quantity}\nat {_shape_label(**shape)}:\n{why_empty}",
                    transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.3")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        ax.set_xscale("log", base=2)
        plain_log_axis(ax.xaxis)
        ax.grid(True, which="both", alpha=0.3)
    if mem_ax.lines:
        mem_ax.set_yscale("log")
        plain_log_axis(mem_ax.yaxis)
    if time_ax.lines:
        time_ax.axhline(1.0, color="0.35", linewidth=0.8)
        time_ax.set_ylim(bottom=min(0.9, time_ax.get_ylim()[0]))
        for batch, provider in oom:
            time_ax.annotate("OOM", (batch, time_ax.get_ylim()[1]), color=STYLE[provider]["color"], fontsize=7, va="top")
    if handles:
        fig.legend(handles=list(handles.values()), loc="upper center", bbox_to_anchor=(0.5, 0.3), ncol=2, fontsize=8, frameon=False)
    fig.suptitle(f"Scaling with batch, {_shape_label(**shape)}, mode {mode}", fontsize=11)
    add_caption(fig, *captions)
    fig.subplots_adjust(bottom=0.41, wspace=0.3, top=0.91)
    return fig


def mask_comparison(rows: list[dict], record: BenchRecord) -> Figure:
    """Forward+backward time over the unmasked floor, every token counted against the prompt-half masked,
    per workload and provider (rows from ``measurements.mask_rows``)."""
    workloads = sorted({(r["batch"], r["seq"]) for r in rows}, key=lambda w: (w[1], w[0]))
    masks = sorted({r["mask"] for r in rows}, key=lambda m: (m != "none", m))
    providers = [p for p in ("floor", "baseline", "liger", "fused") if any(r["provider"] == p for r in rows)]
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.4 * len(workloads), 3.8), sharey=True, squeeze=False)
    width = 0.8 / len(masks)
    for ax, (batch, seq) in zip(axes[0], workloads):
        for k, mask in enumerate(masks):
            for i, provider in enumerate(providers):
                found = [r for r in rows if (r["batch"], r["seq"], r["mask"], r["provider"]) == (batch, seq, mask, provider)]
                if not found:
                    continue
                value = found[0]["x_unmasked_floor"]
                ax.bar(i + (k - (len(masks) - 1) / 2) * width, value, width, color=STYLE[provider]["color"],
                       alpha=1.0 if mask == "none" else 0.55, hatch=None if mask == "none" else "//", edgecolor="white")
                ax.text(i + (k - (len(masks) - 1) / 2) * width, value, f"{value:.2f}", ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="0.35", linewidth=0.8)
        ax.set_xticks(range(len(providers)), [STYLE[p]["label"].split(" (")[0] for p in providers], fontsize=8)
        ax.set_title(f"B={batch}, T={seq}", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("time / unmasked floor (same run)")
    legend = [plt.Rectangle((0, 0), 1, 1, facecolor="0.5", alpha=1.0 if m == "none" else 0.55, hatch=None if m == "none" else "//",
                            edgecolor="white", label=f"mask {m}") for m in masks]
    fig.legend(handles=legend, loc="upper right", fontsize=8, ncol=len(masks), frameon=False)
    fig.suptitle("Realistic mask: the first half of every sequence is prompt", fontsize=11, x=0.3)
    add_caption(fig, "Measured: " + record_caption(record))
    fig.subplots_adjust(top=0.84, wspace=0.08)
    return fig


def sequence_scaling(rows: list[dict], record: BenchRecord, providers: tuple[str, ...] = ("baseline", "liger", "fused")) -> Figure:
    """Time over the floor of the same run and peak memory against sequence length, one line per provider
    and mask (rows from ``measurements.workload_rows`` at one batch, hidden and vocab size)."""
    fig, (time_ax, mem_ax) = plt.subplots(1, 2, figsize=(10, 4.6))
    masks = sorted({r["mask"] for r in rows}, key=lambda m: (m != "none", m))
    dashes = dict(zip(masks, ("-", "--", ":", "-.")))
    for provider in providers:
        for mask in masks:
            points = sorted((r["seq"], r[f"{provider}_x_floor"], r[f"{provider}_gib"]) for r in rows
                            if r["mask"] == mask and r.get(f"{provider}_x_floor") is not None)
            if not points:
                continue
            seqs, ratios, peaks = zip(*points)
            line = {"color": STYLE[provider]["color"], "marker": STYLE[provider]["marker"], "linestyle": dashes[mask]}
            time_ax.plot(seqs, ratios, **line)
            mem_ax.plot(seqs, peaks, **line)
    time_ax.axhline(1.0, color=STYLE["floor"]["color"], linewidth=0.8)
    time_ax.set_ylabel("forward+backward / floor (same run)")
    mem_ax.set_ylabel("peak memory over inputs (GiB)")
    mem_ax.set_yscale("log")
    plain_log_axis(mem_ax.yaxis)
    for ax in (time_ax, mem_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["seq"] for r in rows}))
        plain_log_axis(ax.xaxis)
        ax.set_xlabel("sequence length T")
        ax.grid(True, which="both", alpha=0.3)
    handles = [Line2D([], [], color=STYLE[p]["color"], marker=STYLE[p]["marker"], label=STYLE[p]["label"]) for p in providers]
    handles += [Line2D([], [], color="0.4", linestyle=dashes[m], label=f"mask {m}") for m in masks]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.23), ncol=3, fontsize=8, frameon=False)
    first = rows[0]
    fig.suptitle(f"Scaling with sequence length, {_shape_label(batch=first['batch'], hidden=first['hidden'], vocab=first['vocab'])}",
                 fontsize=11)
    add_caption(fig, "Measured: " + record_caption(record))
    fig.subplots_adjust(top=0.9, bottom=0.34, wspace=0.3)  # the legend goes between the axes and the caption
    return fig


STATS_GEMM_STYLE = {
    "row_stats": {"color": "tab:orange", "label": "cuBLAS logits GEMM, then row_stats over its buffer"},
    "stats_gemm": {"color": "tab:blue", "label": "statistics GEMM (Gluon): no logits stored"},
}


def stats_gemm_paths(predicted: list[dict], measured: list[dict] = (), record: BenchRecord | None = None) -> Figure:
    """The row statistics of X·Wᵀ two ways, per shape, as time over cuBLAS's logits GEMM alone: the roofline's
    prediction (``memory.statistics_gemm_prediction``, black ticks) always; the measured medians
    (``measurements.stats_gemm_rows``, bars, with whiskers from the fastest to the slowest repetition) where the
    record has them, the reason where it has a shape without them, and hollow bars up to the prediction where
    nothing was measured."""
    shapes = [(p["rows"], p["hidden"], p["vocab"]) for p in predicted]
    by_shape = {(m["rows"], m["hidden"], m["vocab"]): m for m in measured}
    fig, ax = plt.subplots(figsize=(8, 2.6 + 0.8 * len(shapes)))
    height = 0.36
    for i, (shape, prediction) in enumerate(zip(shapes, predicted)):
        row = by_shape.get(shape, {})
        for k, (name, style) in enumerate(STATS_GEMM_STYLE.items()):
            y = i + (k - 0.5) * height
            ax.plot([100 * (prediction[f"{name}_x_mm"] - 1)] * 2, [y - height / 2, y + height / 2], color="black",
                    linewidth=2)
            value = row.get(f"{name}_x_mm")
            if value is None and row:
                ax.text(0, y, f" not measured: {row.get('status')}", va="center", fontsize=7, color="0.3")
            if value is None:
                if not row:
                    ax.barh(y, 100 * (prediction[f"{name}_x_mm"] - 1), height=height * 0.9, fill=False,
                            edgecolor=style["color"], hatch="//")
                continue
            low, high = row[f"{name}_x_mm_min"], row[f"{name}_x_mm_max"]
            ax.barh(y, 100 * (value - 1), height=height * 0.9, color=style["color"], alpha=0.85,
                    xerr=[[100 * (value - low)], [100 * (high - value)]], error_kw={"linewidth": 0.8, "capsize": 2})
            ax.text(max(0, 100 * (high - 1)), y, f"  {value:.3f}×", va="center", fontsize=7)
    ax.axvline(0, color="0.35", linewidth=0.8)
    ax.set_yticks(range(len(shapes)), [f"{r}×{h}×{v}" for r, h, v in shapes], fontsize=8)
    ax.invert_yaxis()
    ax.set_ylabel("rows × H × V", fontsize=8)
    ax.set_xlabel("% over cuBLAS's logits GEMM alone (same inputs, same run)")
    ax.grid(True, axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=s["color"], alpha=0.85, label=s["label"]) for s in STATS_GEMM_STYLE.values()]
    handles.append(Line2D([], [], color="black", linewidth=2, label="roofline prediction (hatched: not measured)"))
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    ax.set_title("Row statistics of X·Wᵀ: what the pass over the logits costs, and what fusing it into the GEMM buys",
                 fontsize=9)
    captions = [MODEL_NOTE + f"; roofline at {memory.H200_GEMM_TFLOPS:.0f} TFLOP/s, {memory.H200_ROW_KERNEL_TBPS} TB/s"]
    if measured and record is not None:
        captions.append("Measured: " + record_caption(record))
    add_caption(fig, *captions)
    # room under the axes for the legend, then the caption
    fig.subplots_adjust(left=0.2, right=0.95, top=0.9, bottom=(1.2 + 0.13 * len(captions)) / fig.get_figheight())
    return fig
