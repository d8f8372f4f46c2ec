"""The driver checked against two small notebooks written into build/ui/selftest/.

A notebook shaped like the workbook's (parameters cell, matplotlib figure, sliders wired with
``interactive_output``) must pass every check, and a notebook that raises must be caught, so
that "no error outputs" in test_workbook.py cannot pass vacuously.
"""

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
SELFTEST_DIR = ROOT / "build" / "ui" / "selftest"

PARAMETERS = "batch = 4\nseq_len = 128"
FIGURE = """\
import sys
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(4, 3))
ax.plot([1, 2, 3], [batch, seq_len / 32, 2])
plt.show()
print(sys.executable)"""
SLIDERS = """\
import ipywidgets as widgets

def show_tokens(batch, seq_len, mode):
    print(f"tokens per step: {batch * seq_len:,}")
    print(f"mode: {mode}")

controls = {
    "batch": widgets.IntSlider(value=batch, min=1, max=64, description="batch",
                               continuous_update=False),
    "seq_len": widgets.SelectionSlider(options=[64, 128, 256, 512, 1024], value=seq_len,
                                       description="sequence length", continuous_update=False),
    "mode": widgets.ToggleButtons(options=["full", "forward"], description="mode"),
}
view = widgets.interactive_output(show_tokens, controls)
display(widgets.VBox([widgets.HBox(list(controls.values())), view]))"""


def write_notebook(name: str, *sources: str) -> str:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {
        "name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"
    }  # fmt: skip
    notebook.cells = [nbformat.v4.new_markdown_cell(f"# {name}")]
    for i, source in enumerate(sources):
        cell = nbformat.v4.new_code_cell(source)
        if i == 0:
            cell.metadata["tags"] = ["parameters"]
        notebook.cells.append(cell)
    path = SELFTEST_DIR / f"{name}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)
    return str(path.relative_to(ROOT))


def test_figure_and_slider(open_notebook):
    notebook = open_notebook(write_notebook("selftest-slider", PARAMETERS, FIGURE, SLIDERS))
    assert notebook.kernel_names() == ["python3"]

    report = notebook.run_all(timeout_s=120)
    assert report.errors == []
    assert report.unexecuted == []
    assert report.browser_errors == []
    assert report.code_cells == 3
    assert [(f["cell"], f["mime"]) for f in report.figures] == [(1, "image/png")]
    assert report.figures[0]["width"] > 100 and report.figures[0]["height"] > 100
    # The kernel is the venv's interpreter, not one found elsewhere on the machine.
    assert str(Path(sys.executable).parent) in notebook.panel.inner_text()

    assert notebook.output_text("batch") == "tokens per step: 512\nmode: full\n"
    notebook.set_widget("batch", 8)  # a slider with a typed-in readout
    text = notebook.wait_for_output_change("batch", "tokens per step: 512\nmode: full\n")
    assert text == "tokens per step: 1,024\nmode: full\n"
    notebook.set_widget("sequence length", 1024)  # a selection slider, moved with the arrow keys
    text = notebook.wait_for_output_change("sequence length", text)
    assert text == "tokens per step: 8,192\nmode: full\n"
    notebook.set_widget("sequence length", 64)
    text = notebook.wait_for_output_change("sequence length", text)
    assert text == "tokens per step: 512\nmode: full\n"
    notebook.set_widget("mode", "forward")  # toggle buttons
    text = notebook.wait_for_output_change("mode", text)
    assert text == "tokens per step: 512\nmode: forward\n"
    assert notebook.widget_value("batch") == "8"
    assert notebook.widget_value("sequence length") == "64"
    assert notebook.widget_value("mode") == "forward"
    after_widgets = notebook.report()
    assert after_widgets.errors == [] and after_widgets.browser_errors == []


def test_error_is_caught(open_notebook):
    notebook = open_notebook(
        write_notebook(
            "selftest-error",
            PARAMETERS,
            "import warnings\nwarnings.warn('only a warning')",
            "raise ValueError('broken on purpose')",
            "1",
        )
    )
    report = notebook.run_all(timeout_s=60)
    assert len(report.errors) == 1 and "ValueError: broken on purpose" in report.errors[0]
    # A warning on stderr is reported, not counted as an error.
    assert len(report.stderr) == 1 and "UserWarning: only a warning" in report.stderr[0]
    # Run All stops at the error: the cell after it never runs.
    assert report.unexecuted == [3]


def test_unknown_widget_label_fails(open_notebook):
    notebook = open_notebook(write_notebook("selftest-labels", PARAMETERS, SLIDERS))
    notebook.run_all(timeout_s=60)
    with pytest.raises(AssertionError, match="0 widgets labelled 'batch size'"):
        notebook.widget("batch size")
