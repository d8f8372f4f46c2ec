"""The workbook as a person uses it: each notebook opened in JupyterLab, run top to bottom on CPU,
its figures rendered, and its shape controls moved with the view following the memory model.

Screenshots land in build/ui/screenshots/ (see conftest.py). Assertions are on text and DOM
structure, never on pixels.
"""

import hashlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
EXPECTED_NOTEBOOKS = 5
RUN_ALL_TIMEOUT_S = 480

# orpo_lib.workbook.widgets.memory_explorer: its shape controls (description labels) and the header line
# and table that orpo_lib.workbook.widgets.show_memory prints above its figure.
MEMORY_CONTROLS = {"batch": "batch B", "seq": "seq T", "hidden": "hidden H", "vocab": "vocab V"}
MEMORY_CHUNK_CONTROL = "chunk rows (0: default)"
# orpo_lib.workbook.widgets.batch_scaling_explorer: the largest batch, sequence length, hidden and vocab
# sizes, and mode; orpo_lib.workbook.widgets.show_batch_scaling prints a header line, the memory model's
# peaks (GiB, one row per batch) and, when a GPU record has the workload, a measured table.
SCALING_CONTROLS = {"batch": "batch B ≤", "seq": "seq T", "hidden": "hidden H", "vocab": "vocab V"}
SCALING_MODE_CONTROL = "mode"
SCALING_MEASURED_TITLE = "Measured ("
# orpo_lib.workbook.widgets.chunk_plan_explorer (H=4096, V=128256): its header line and plan table.
PLAN_CONTROLS = {"batch": "batch B", "seq": "seq T", "chunk_rows": "chunk rows (0: default)"}


def test_workbook_has_its_notebooks():
    assert len(NOTEBOOKS) == EXPECTED_NOTEBOOKS, f"notebooks/: {NOTEBOOKS}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_in_jupyterlab(open_notebook, name):
    path = ROOT / "notebooks" / name
    source = hashlib.sha256(path.read_bytes()).hexdigest()
    notebook = open_notebook(f"notebooks/{name}")
    assert notebook.kernel_names() == ["python3"]

    report = notebook.run_all(timeout_s=RUN_ALL_TIMEOUT_S)
    assert report.errors == [], "error outputs:\n" + "\n\n".join(report.errors)
    assert report.unexecuted == [], f"code cells that did not run: {report.unexecuted}"
    assert report.browser_errors == []
    check_figures(notebook, report)

    if "memory" in name:
        check_memory_explorer(notebook)
    if "batch-scaling" in name:
        check_batch_scaling_explorer(notebook)
    if "kernels" in name:
        check_chunk_plan_explorer(notebook)

    after_widgets = notebook.report()
    assert after_widgets.errors == [], "the widgets produced error outputs"
    assert after_widgets.browser_errors == []
    # Running in JupyterLab must not write outputs over the committed notebook.
    assert hashlib.sha256(path.read_bytes()).hexdigest() == source


def check_figures(notebook, report):
    """Every image a cell output holds is on the page, decoded, with a real size."""
    assert report.figures, "no figure rendered"
    rendered = {}
    for figure in report.figures:
        assert figure["width"] > 50 and figure["height"] > 50, figure
        rendered[figure["cell"]] = rendered.get(figure["cell"], 0) + 1
    for index, cell in enumerate(notebook.cell_outputs()):
        images = sum(any(m.startswith("image/") for m in o["mime"]) for o in cell["outputs"])
        assert rendered.get(index, 0) >= images, f"code cell {index}: {images} images in the model"


UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def shown_bytes(text: str) -> tuple[float, float]:
    """A size as the view prints it ("4.85 GiB", "512 B") and half its last digit, in bytes."""
    number, unit = text.split()
    decimals = len(number.partition(".")[2])
    return float(number) * UNITS[unit], 0.5 * 10**-decimals * UNITS[unit]


def check_memory_view(notebook, shape: dict, chunk_rows: int) -> str:
    """The header and every implementation's peak in the view agree with orpo_lib.workbook.memory."""
    from lab_driver import text_table

    from orpo_lib.workbook import memory

    text = notebook.output_text(MEMORY_CONTROLS["batch"])
    b, t, h, v = shape["batch"], shape["seq"], shape["hidden"], shape["vocab"]
    chunk = memory.chunking(b, t, chunk_rows or None, v, hidden=h)
    header = f"B={b} T={t} H={h} V={v}: fused chunks of {chunk.rows} rows × {chunk.count}"
    assert header in text, f"expected {header!r} in the view:\n{text}"

    rows = {row["impl"]: row for row in text_table(text)}
    assert sorted(rows) == sorted(memory.IMPLEMENTATIONS), text
    for impl, row in rows.items():
        options = {"chunk_rows": chunk_rows or None} if impl == "fused" else {}
        model = sum(memory.peak_bytes(impl, b, t, h, v, **options).values())
        shown, rounding = shown_bytes(row["peak"])
        assert abs(shown - model) <= rounding, (
            f"{impl} at {shape}: the view shows {row['peak']}, the memory model says {model} B"
        )
    return text


def check_memory_explorer(notebook):
    """Move batch, then sequence length; the table must follow orpo_lib.workbook.memory each time and the
    breakdown figure be redrawn."""
    shape = {key: int(notebook.widget_value(label)) for key, label in MEMORY_CONTROLS.items()}
    chunk_rows = int(notebook.widget_value(MEMORY_CHUNK_CONTROL))
    text = check_memory_view(notebook, shape, chunk_rows)
    figures = notebook.output_images(MEMORY_CONTROLS["batch"])
    assert len(figures) == 1, "the memory view shows one breakdown figure"

    for key, new in (("batch", shape["batch"] // 2), ("seq", shape["seq"] // 4)):
        shape[key] = new
        notebook.set_widget(MEMORY_CONTROLS[key], new)
        notebook.wait_for_output_change(MEMORY_CONTROLS[key], text)
        before, text = text, check_memory_view(notebook, shape, chunk_rows)
        assert text != before
        before, figures = figures, notebook.redrawn_images(MEMORY_CONTROLS[key], figures)
        assert len(figures) == 1 and figures != before, f"figure not redrawn for {key}={new}"


def half_last_digit(text: str) -> float:
    """Half a unit in the last printed digit of a number: the rounding of what the view shows."""
    return 0.5 * 10 ** -len(text.partition(".")[2])


def check_scaling_view(notebook, shape: dict, mode: str) -> str:
    """Header, model peaks and (with a GPU record) measured medians agree with orpo_lib."""
    from lab_driver import text_table

    from orpo_lib.workbook import memory
    from orpo_lib.workbook.measurements import NO_RECORD_MESSAGE, floor_mode, latest_bench_record

    text = notebook.output_text(SCALING_CONTROLS["batch"])
    b, t, h, v = shape["batch"], shape["seq"], shape["hidden"], shape["vocab"]
    header = f"T={t} H={h} V={v}, B=2…{b}, mode {mode}"
    assert header in text, f"expected {header!r} in the view:\n{text}"

    model_text, _, measured_text = text.partition(SCALING_MEASURED_TITLE)
    rows = text_table(model_text)
    assert [int(row["batch"]) for row in rows] == [2**k for k in range(1, b.bit_length())], text
    for row in rows:
        for impl in memory.IMPLEMENTATIONS:
            model = memory.peak_gib(impl, int(row["batch"]), t, h, v, with_grad=mode != "eval")
            assert abs(float(row[impl]) - model) <= half_last_digit(row[impl]), (
                f"{impl} at B={row['batch']} {shape} {mode}: the view shows {row[impl]} GiB, "
                f"the memory model says {model}"
            )

    record = latest_bench_record()
    if record is None:
        assert NO_RECORD_MESSAGE in text, text
    elif measured_text:
        for row in text_table(measured_text):
            provider_mode = floor_mode(mode) if row["provider"] == "floor" else mode
            result, *_ = record.select(
                provider=row["provider"], mode=provider_mode, status=None, batch=int(row["batch"]),
                seq=t, hidden=h, vocab=v, mask="none",
            )  # fmt: skip
            if row["median_ms"] != "—":
                shown = float(row["median_ms"])
                assert abs(shown - result["median_ms"]) <= half_last_digit(row["median_ms"]), row
    else:
        assert f"{record.source} has no {mode} results" in text, text
    return text


def check_batch_scaling_explorer(notebook):
    """Move sequence length, then the largest batch, then mode: each time the printed model peaks
    follow orpo_lib.workbook.memory (and measured numbers the record, if any) and the figure is redrawn."""
    shape = {key: int(notebook.widget_value(label)) for key, label in SCALING_CONTROLS.items()}
    mode = notebook.widget_value(SCALING_MODE_CONTROL)
    text = check_scaling_view(notebook, shape, mode)
    figures = notebook.output_images(SCALING_CONTROLS["batch"])
    assert len(figures) == 1, "the batch-scaling view shows one figure"

    for key, value in (
        ("seq", 4096 if shape["seq"] == 1024 else 1024),
        ("batch", shape["batch"] // 2),
        ("mode", "forward"),
    ):
        if key == "mode":
            mode = value
            notebook.set_widget(SCALING_MODE_CONTROL, value)
        else:
            shape[key] = value
            notebook.set_widget(SCALING_CONTROLS[key], value)
        notebook.wait_for_output_change(SCALING_CONTROLS["batch"], text)
        before, text = text, check_scaling_view(notebook, shape, mode)
        assert text != before
        before, figures = figures, notebook.redrawn_images(SCALING_CONTROLS["batch"], figures)
        assert len(figures) == 1 and figures != before, f"figure not redrawn for {key}={value}"
    cell = notebook.cell_index(SCALING_CONTROLS["batch"])
    assert [f for f in notebook.figures() if f["cell"] == cell and f["width"] > 50]


def check_plan_view(notebook, shape: dict) -> str:
    """The header and the plan table follow the library's schedule (orpo_lib.workbook.kernel_tour)."""
    from lab_driver import text_table

    from orpo_lib.workbook import kernel_tour

    text = notebook.output_text(PLAN_CONTROLS["batch"])
    plan = kernel_tour.chunk_plan(shape["batch"], shape["seq"], shape["chunk_rows"])
    header = (f"B={shape['batch']} T={shape['seq']} H=4096 V=128256, at most {plan.chunk_rows} rows per block: "
              f"{len(plan.groups)} chunk(s), {plan.blocks} block(s), buffer of {plan.buffer_rows} rows")
    assert header in text, f"expected {header!r} in the view:\n{text}"
    shown = text_table(text.partition(header)[2])
    expected = kernel_tour.plan_rows(plan)
    assert [(int(r["blocks"]), r["pass"]) for r in shown] == [(r["blocks"], r["pass"]) for r in expected], text
    return text


def check_chunk_plan_explorer(notebook):
    """Move the sequence length (long enough for pairs to be split), then the chunk size: the plan follows
    the library's each time and its drawing is redrawn."""
    shape = {key: int(notebook.widget_value(label)) for key, label in PLAN_CONTROLS.items()}
    text = check_plan_view(notebook, shape)
    figures = notebook.output_images(PLAN_CONTROLS["batch"])
    assert len(figures) == 1, "the chunk-plan view shows one drawing"
    for key, value in (("seq", 32768), ("chunk_rows", 0 if shape["chunk_rows"] else 4096)):
        shape[key] = value
        notebook.set_widget(PLAN_CONTROLS[key], value)
        notebook.wait_for_output_change(PLAN_CONTROLS["batch"], text)
        before, text = text, check_plan_view(notebook, shape)
        assert text != before
        before, figures = figures, notebook.redrawn_images(PLAN_CONTROLS["batch"], figures)
        assert len(figures) == 1 and figures != before, f"drawing not redrawn for {key}={value}"
