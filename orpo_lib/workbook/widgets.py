"""The workbook's optional interactive layer.

Each view is a plain function: a notebook cell calls it once with the parameters (so the static
result is in the executed notebook), then ``interactive_view`` wraps the same function in
controls with ``continuous_update=False``. Views return what they showed, so tests can call them
directly. GPU work starts from a button, or, where the notebook's ``run_gpu`` parameter is set (the
runner's ``--gpu``), once when the cell runs.

Run headless (``HEADLESS_ENV`` set, as ``orpo_lib.workbook.notebooks`` does), a view waits for its
controls to move instead of drawing at once: there is no frontend, and nbclient's stand-in for the
Output widget answers every output routed to it with a message on the kernel's shell socket, the
socket on which it is waiting for the cell's reply. When that message crosses the reply, nbclient
does not see the reply until the cell's timeout runs out (it then finds it and carries on), so a
cell of a few tenths of a second took the whole timeout in 3 of 9 runs of notebook 5 here (0 of 14
headless).
"""

from __future__ import annotations

import os
from pathlib import Path

import ipywidgets as widgets
import torch

from . import kernel_tour, memory, plots
from .measurements import (NO_RECORD_MESSAGE, BenchRecord, batch_scaling_rows, floor_mode, format_table,
                           latest_bench_record, latest_record, latest_shapes_record, provenance_caption, record_caption, trl_training_rows, workload_rows)

HEADLESS_ENV = "ORPO_WORKBOOK_HEADLESS"
POWERS_OF_TWO = [2**k for k in range(1, 8)]
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
WORKLOAD_PROVIDERS = ("baseline", "liger", "fused")  # the providers of the shapes records, beside their floor


def format_bytes(size: float) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.2f} {unit}" if unit != "B" else f"{size:.0f} B"
        size /= 1024


def memory_table(batch: int, seq: int, hidden: int, vocab: int, chunk_rows: int | None = None, dtype_bytes: int = 2) -> list[dict]:
    """Modelled peak of every implementation at one shape: total, the phase it occurs in, and its largest part."""
    rows = []
    for impl in memory.IMPLEMENTATIONS:
        options = {"chunk_rows": chunk_rows} if impl == "fused" else {}
        parts = memory.peak_bytes(impl, batch, seq, hidden, vocab, dtype_bytes, **options)
        largest = max(parts, key=parts.get)
        total = sum(parts.values())
        rows.append({
            "impl": impl,
            "peak_gib": total / memory.GIB,
            "peak": format_bytes(total),
            "phase": memory.peak_phase(impl, batch, seq, hidden, vocab, dtype_bytes, **options),
            "largest_part": f"{largest} ({format_bytes(parts[largest])})",
        })
    return rows


def show_memory(batch: int, seq: int, hidden: int, vocab: int, chunk_rows: int = 0, dtype: str = "bf16",
                output_dir: str | Path | None = None) -> list[dict]:
    """Table and breakdown figure of the modelled peaks; ``chunk_rows=0`` means the fused default."""
    rows_limit = chunk_rows or None
    dtype_bytes = DTYPE_BYTES[dtype]
    table = memory_table(batch, seq, hidden, vocab, rows_limit, dtype_bytes)
    chunk = memory.chunking(batch, seq, rows_limit, vocab, dtype_bytes, hidden=hidden)
    print(f"{dtype}, B={batch} T={seq} H={hidden} V={vocab}: fused chunks of {chunk.rows} rows × {chunk.count}, "
          f"{'two passes (logits recomputed)' if chunk.passes == 2 else 'one pass'}")
    print(format_table(table, ["impl", "peak", "phase", "largest_part"]))
    plots.show_figure(plots.memory_breakdown(batch, seq, hidden, vocab, dtype_bytes=dtype_bytes, chunk_rows=rows_limit),
          output_dir, "memory-breakdown")
    return table


def batch_sizes_up_to(largest_batch: int) -> list[int]:
    """The batches a scaling view covers: powers of two from 2 to ``largest_batch``."""
    return [b for b in POWERS_OF_TWO if b <= largest_batch]


def model_peak_rows(batches: list[int], seq: int, hidden: int, vocab: int, with_grad: bool = True) -> list[dict]:
    """The memory model's peak over the inputs (GiB) of every implementation, one row per batch."""
    return [
        {"batch": b, **{impl: memory.peak_gib(impl, b, seq, hidden, vocab, with_grad=with_grad) for impl in memory.IMPLEMENTATIONS}}
        for b in batches
    ]


def show_batch_scaling(seq: int, hidden: int, vocab: int, mode: str = "full", largest_batch: int = 16,
                       output_dir: str | Path | None = None, data_dir=None) -> dict:
    """Modelled and measured time and memory against batch (2 … ``largest_batch``) at one (T, H, V).

    Prints the memory model's peaks, then, where the newest benchmark record has the workload
    (every token counted), each provider's median, its ratio to the floor of the same run and its
    measured peak.
    """
    batches = batch_sizes_up_to(largest_batch)
    with_grad = mode != "eval"
    model = model_peak_rows(batches, seq, hidden, vocab, with_grad)
    print(f"T={seq} H={hidden} V={vocab}, B={batches[0]}…{batches[-1]}, mode {mode}")
    step = "forward+backward" if with_grad else "forward without gradients"
    note = " (a forward call peaks at or below it)" if mode == "forward" else ""
    print(f"Memory model: peak over inputs (GiB) of one {step}{note}")
    print(format_table(model, ["batch", *memory.IMPLEMENTATIONS], {impl: ".2f" for impl in memory.IMPLEMENTATIONS}))
    print()
    record = latest_bench_record(data_dir)
    measured = [] if record is None else batch_scaling_rows(record, mode=mode, seq=seq, hidden=hidden, vocab=vocab, batches=batches)
    if record is None:
        print(NO_RECORD_MESSAGE)
    elif not measured:
        print(f"Measured: {record.source} has no {mode} results at T={seq} H={hidden} V={vocab}, B≤{largest_batch}, mask none.")
    else:
        floor = "the three GEMMs" if mode == "full" else "the logits GEMM alone, its eval run"
        print(f"Measured ({record.source}, mask none); x_floor = median_ms / floor median_ms (floor: {floor}; same run)")
        print(record_caption(record))
        print(format_table(measured, ["batch", "provider", "median_ms", "x_floor", "peak_over_inputs_gib", "status"],
                           {"median_ms": ".2f", "x_floor": ".3f", "peak_over_inputs_gib": ".2f"}))
    fig = plots.batch_scaling(record, seq=seq, hidden=hidden, vocab=vocab, mode=mode, batches=batches)
    plots.show_figure(fig, output_dir, f"batch-scaling-{mode}-T{seq}")
    return {
        "record": None if record is None else record.source,
        "measured_points": sum(r["status"] == "ok" for r in measured),
        "model": model,
        "measured": measured,
    }


def int_slider(description: str, value: int, options: list[int]) -> widgets.SelectionSlider:
    """A slider over a fixed list of sizes that updates only on release."""
    options = sorted(set(options) | {value})
    return widgets.SelectionSlider(description=description, options=options, value=value, continuous_update=False)


def shape_controls(batch: int, seq: int, hidden: int, vocab: int) -> dict:
    """Sliders for the four shape parameters, starting at the notebook's values."""
    return {
        "batch": int_slider("batch B", batch, POWERS_OF_TWO),
        "seq": int_slider("seq T", seq, [2**k for k in range(4, 16)]),
        "hidden": int_slider("hidden H", hidden, [48, 64, 256, 1024, 2048, 4096, 8192]),
        "vocab": int_slider("vocab V", vocab, [517, 2048, 32000, 50257, 128256, 151936, 256000]),
    }


def headless() -> bool:
    """Whether the notebook runs without a frontend (see the module's docstring)."""
    return os.environ.get(HEADLESS_ENV, "") == "1"


def interactive_view(view, controls: dict, fixed: dict | None = None) -> widgets.VBox:
    """Controls above an output area that re-runs ``view(**values)`` when a control is released; it draws
    at once unless headless."""
    fixed = fixed or {}
    output = widgets.Output()

    def run(_change=None):
        with output:
            output.clear_output(wait=True)
            view(**{name: control.value for name, control in controls.items()}, **fixed)

    for control in controls.values():
        control.observe(run, "value")
    if not headless():
        run()
    return widgets.VBox([widgets.HBox(list(controls.values()), layout=widgets.Layout(flex_flow="row wrap")), output])


def memory_explorer(batch: int, seq: int, hidden: int, vocab: int, chunk_rows: int = 0, dtype: str = "bf16") -> widgets.VBox:
    """``show_memory`` under shape, chunk-size and dtype controls."""
    controls = shape_controls(batch, seq, hidden, vocab)
    controls["chunk_rows"] = int_slider("chunk rows (0: default)", chunk_rows, [0, 256, 1024, 2048, 4096, 8192, 16384])
    controls["dtype"] = widgets.SelectionSlider(description="dtype", options=list(DTYPE_BYTES), value=dtype,
                                                continuous_update=False)
    return interactive_view(show_memory, controls)


def batch_scaling_explorer(seq: int, hidden: int, vocab: int, mode: str = "full", largest_batch: int = 16) -> widgets.VBox:
    """``show_batch_scaling`` under shape and mode controls."""
    controls = {
        "largest_batch": int_slider("batch B ≤", largest_batch, POWERS_OF_TWO),
        "seq": int_slider("seq T", seq, [512, 1024, 2048, 4096, 8192]),
        "hidden": int_slider("hidden H", hidden, [2048, 4096, 8192]),
        "vocab": int_slider("vocab V", vocab, [32000, 128256, 152064]),
        "mode": widgets.ToggleButtons(options=["full", "forward", "eval"], value=mode, description="mode"),
    }
    return interactive_view(show_batch_scaling, controls)


def show_chunk_plan(batch: int, seq: int, chunk_rows: int = 0, hidden: int = 4096, vocab: int = 128256,
                    output_dir: str | Path | None = None) -> kernel_tour.ChunkPlan:
    """Table and drawing of the library's chunk plan (``chunk_rows=0``: its default for the shape)."""
    plan = kernel_tour.chunk_plan(batch, seq, chunk_rows, hidden, vocab)
    print(f"B={batch} T={seq} H={hidden} V={vocab}, at most {plan.chunk_rows} rows per block: "
          f"{len(plan.groups)} chunk(s), {plan.blocks} block(s), buffer of {plan.buffer_rows} rows")
    print(format_table(kernel_tour.plan_rows(plan), ["group", "pairs", "rows", "blocks", "block_rows", "pass"]))
    plots.show_figure(plots.chunk_plan(plan, vocab), output_dir, "chunk-plan")
    return plan


def chunk_plan_explorer(batch: int, seq: int, chunk_rows: int = 0, hidden: int = 4096, vocab: int = 128256) -> widgets.VBox:
    """``show_chunk_plan`` under batch, sequence and chunk-size controls."""
    controls = {
        "batch": int_slider("batch B", batch, POWERS_OF_TWO),
        "seq": int_slider("seq T", seq, [2**k for k in range(6, 16)]),
        "chunk_rows": int_slider("chunk rows (0: default)", chunk_rows, [0, 256, 1024, 2048, 4096, 8192, 16384]),
    }
    return interactive_view(show_chunk_plan, controls, fixed={"hidden": hidden, "vocab": vocab})


def gpu_button(description: str, run, *, output_dir: str | Path | None = None, run_now: bool = False) -> widgets.VBox:
    """A button that starts ``run(output_dir)`` (GPU work); disabled, with a note, without CUDA.

    With ``run_now`` (a notebook run with ``run_gpu=True``) ``run`` is also called at once, so a headless run
    measures what a person would by clicking; without CUDA that fails rather than leave the measurement out.
    """
    has_cuda = torch.cuda.is_available()
    if run_now:
        if not has_cuda:
            raise RuntimeError(f"run_gpu=True needs a CUDA device, and there is none here ({description!r})")
        run(output_dir)
    button = widgets.Button(description=description, disabled=not has_cuda, button_style="warning",
                            layout=widgets.Layout(width="auto"))
    note = widgets.HTML("" if has_cuda else "No CUDA device here: showing the recorded data only.")
    output = widgets.Output()

    def on_click(_):
        button.disabled = True
        with output:
            output.clear_output()
            run(output_dir)
        button.disabled = False

    button.on_click(on_click)
    return widgets.VBox([widgets.HBox([button, note]), output])


def live_chunk_sweep(batch: int, seq: int, hidden: int, vocab: int, chunk_sizes: list[int], output_dir: str | Path | None = None) -> list[dict]:
    """Time and memory of the fused loss against chunk size, measured now (CUDA only), with the model."""
    from .bench import Workload, chunk_sweep

    if not torch.cuda.is_available():
        raise RuntimeError("the live sweep needs a CUDA device")
    sweep = chunk_sweep(Workload(batch, seq, hidden, vocab), torch.device("cuda"), chunk_sizes, warmup=2, reps=5)
    provenance = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": "this session",
                  "command": "orpo_lib.workbook.widgets.live_chunk_sweep"}
    print(f"Measured now on {provenance['gpu']}, B={batch} T={seq} H={hidden} V={vocab}:")
    print(format_table(sweep, ["chunk_size", "fp32_weight_grad", "median_ms", "peak_over_inputs_gib", "status"],
                       {"median_ms": ".2f", "peak_over_inputs_gib": ".2f"}))
    fig = plots.chunk_pareto(sweep, provenance, source="live sweep", batch=batch, seq=seq, hidden=hidden, vocab=vocab, chunk_sizes=chunk_sizes)
    plots.show_figure(fig, output_dir, "chunk-pareto-live")
    return sweep


def live_batch_scaling(seq: int, hidden: int, vocab: int, mode: str = "full", largest_batch: int = 16,
                       output_dir: str | Path | None = None) -> list[dict]:
    """Every provider at B = 2 … ``largest_batch``, measured now (CUDA only) as the benchmark harness does;
    prints and returns each median and its ratio to the floor of this run, and draws them."""
    from .bench import Workload, liger_version, provenance, run_workloads

    if not torch.cuda.is_available():
        raise RuntimeError("the live batch-scaling run needs a CUDA device")
    device = torch.device("cuda")
    batches = batch_sizes_up_to(largest_batch)
    providers = ["floor", "baseline", "fused", *(["liger"] if liger_version() else [])]
    results = run_workloads([Workload(b, seq, hidden, vocab) for b in batches], providers, sorted({mode, floor_mode(mode)}),
                            device, warmup=2, reps=5)
    # ORPO_COMMIT names the commit where the tree is an export without git (gpu_notebooks' runs)
    run = BenchRecord(provenance(device, "orpo_lib.workbook.widgets.live_batch_scaling", commit=os.environ.get("ORPO_COMMIT")),
                      results, source="live run")
    rows = batch_scaling_rows(run, mode=mode, seq=seq, hidden=hidden, vocab=vocab, batches=batches)
    print(f"Measured now, mode {mode}: {record_caption(run)}")
    print(format_table(rows, ["batch", "provider", "median_ms", "x_floor", "peak_over_inputs_gib", "status"],
                       {"median_ms": ".2f", "x_floor": ".3f", "peak_over_inputs_gib": ".2f"}))
    plots.show_figure(plots.batch_scaling(run, seq=seq, hidden=hidden, vocab=vocab, mode=mode, batches=batches), output_dir,
          f"batch-scaling-{mode}-T{seq}-live")
    return rows


def show_workload_record(preset: str, modes: tuple[str, ...] = ("full",), output_dir: str | Path | None = None,
                         data_dir=None) -> dict:
    """The newest record of a benchmark workload set (``bench --shapes preset``): per mode, a table of the
    floor and each provider's ratio to it and peak; with several sequence lengths, their figure too."""
    record = latest_shapes_record(preset, data_dir)
    if record is None:
        print(f"No {preset}-*.json record in figures/data.")
        return {"record": None, "rows": []}
    rows = [row for mode in modes for row in workload_rows(record, mode=mode)]
    print(f"{preset}: {record_caption(record)}")
    print("x_floor = median_ms / floor_ms of the same run (floor: the three GEMMs; for eval, the logits GEMM); "
          "gib: peak over the inputs")
    columns = ["batch", "seq", "hidden", "vocab", "mask", "mode", "floor_ms", *(f"{p}_x_floor" for p in WORKLOAD_PROVIDERS),
               *(f"{p}_gib" for p in WORKLOAD_PROVIDERS)]
    print(format_table(rows, columns, {c: ".2f" if c.endswith(("_ms", "_gib")) else ".3f" for c in columns[6:]}))
    if len({r["seq"] for r in rows}) > 1:
        plots.show_figure(plots.sequence_scaling(rows, record, WORKLOAD_PROVIDERS), output_dir, f"workloads-{preset}")
    return {"record": record.source, "rows": rows}


def show_trl_training(data_dir=None) -> dict:
    """The newest end-to-end record of TRL training steps (``python -m orpo_lib.workbook.trl_bench``): stock
    ORPOTrainer and FusedORPOTrainer per model, sequence length and pairs per step."""
    record = latest_record("trl-training-*.json", data_dir)
    if record is None:
        print("No trl-training-*.json record in figures/data.")
        return {"record": None, "rows": []}
    rows = trl_training_rows(record)
    print(f"TRL training steps: {provenance_caption(record['provenance'], record['source'])}")
    print("ms: median optimizer step; speed-up: fused tokens/s over stock; gib: peak allocated; max_pairs: the "
          "largest batch of pairs that trained a step")
    columns = ["model", "seq", "pairs", "stock_ms", "fused_ms", "fused_speedup", "stock_gib", "fused_gib",
               "stock_max_pairs", "fused_max_pairs"]
    print(format_table(rows, columns, {"stock_ms": ".1f", "fused_ms": ".1f", "fused_speedup": ".2f",
                                       "stock_gib": ".1f", "fused_gib": ".1f"}))
    return {"record": record["source"], "rows": rows}


def show_cards(**records) -> dict:
    """Which card each named record was measured on (a BenchRecord or a ``latest_record`` dict; None for one
    missing): one line per card, so that a notebook says where its numbers come from."""
    cards: dict = {}
    for name, record in records.items():
        if record is None:
            continue
        provenance, source = (record.provenance, record.source) if isinstance(record, BenchRecord) else (
            record["provenance"], record["source"])
        cards.setdefault(provenance.get("gpu") or "unknown GPU", []).append(f"{name} ({source})")
    if not cards:
        print(NO_RECORD_MESSAGE)
    for card, names in cards.items():
        print(f"Measured on one {card}: {', '.join(names)}")
    return cards
