"""`make report`: one self-contained HTML page per executed notebook, figures inline, and an index; no
machine's paths from the run and no Out[] echo of a recorded value."""

import re

import nbformat
import pytest

from orpo_lib.workbook import notebooks, report
from orpo_lib.workbook.notebooks import notebook_paths

INLINE_PNG = re.compile(r'<img[^>]*src="data:image/png;base64,[A-Za-z0-9+/=\s]{1000,}"')
OUT_PROMPT = re.compile(r"Out\[\d+\]")  # the prompt of a cell's value; the page's CSS names "Out[]" itself


@pytest.fixture(scope="module")
def pages(runs, tmp_path_factory):
    (executed,) = {run["notebook"].parent for run in runs.values()}
    out = tmp_path_factory.mktemp("report")
    report.write_report(executed, out)
    return out


@pytest.mark.notebook
def test_one_page_per_notebook_with_its_figures_inline(pages, runs):
    (executed,) = {run["notebook"].parent for run in runs.values()}
    stems = [p.stem for p in notebook_paths()]
    assert sorted(p.stem for p in pages.glob("*.html")) == sorted([*stems, "index"])
    for stem in stems:
        page = (pages / f"{stem}.html").read_text()
        assert INLINE_PNG.search(page), f"{stem}: no figure embedded"
        assert not re.search(r'<(?:script|link|img)[^>]*(?:src|href)="(?:https?:)?//', page), f"{stem} loads from the web"
        assert "widget-view+json" not in page and "widget-state+json" not in page
        assert "Traceback" not in page
        assert str(executed) not in page and "injected-parameters" not in page, f"{stem} shows the run's paths"


@pytest.mark.notebook
def test_no_cell_ending_in_record_shows_a_value(runs):
    for run in runs.values():
        for cell in nbformat.read(run["notebook"], as_version=4).cells:
            if cell.cell_type == "code" and cell.source.strip().splitlines()[-1].lstrip().startswith("record("):
                assert not [o for o in cell.outputs if o.output_type == "execute_result"], cell.source


@pytest.mark.notebook
def test_the_index_links_every_page_with_its_title(pages):
    index = (pages / "index.html").read_text()
    for source in notebook_paths():
        title = report.notebook_title(nbformat.read(source, as_version=4))
        assert f'<a href="{source.stem}.html">{source.stem}</a> — {title}' in index.replace("&#x27;", "'")
        assert title


def test_widget_outputs_become_a_note_and_the_rest_stays():
    nb = nbformat.v4.new_notebook()
    printed = nbformat.v4.new_output("stream", name="stdout", text="table\n")
    widget = nbformat.v4.new_output("display_data", data={report.WIDGET_VIEW: {"model_id": "x"}, "text/plain": "VBox()"})
    cell = nbformat.v4.new_code_cell("widgets.explorer()")
    cell.outputs = [printed, widget]
    nb.cells = [nbformat.v4.new_markdown_cell("# 9 · A title\n\ntext"), cell]
    nb.metadata["widgets"] = {"state": {}}
    cleaned = report.without_widgets(nb)
    assert cleaned.cells[1].outputs[0] == printed
    assert cleaned.cells[1].outputs[1].data == {"text/html": report.WIDGET_NOTE}
    assert "widgets" not in cleaned.metadata
    assert report.notebook_title(nb) == "9 · A title"


def test_main_says_when_nothing_was_executed(tmp_path, capsys):
    assert report.main(["--notebooks", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    assert "no executed notebooks" in capsys.readouterr().err


@pytest.mark.notebook
def test_a_page_shows_neither_the_runners_paths_nor_a_recorded_value(tmp_path):
    """A notebook run as ``make report`` runs it: papermill injects the runner's absolute paths, and a cell
    ends in ``record(...)``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    parameters = nbformat.v4.new_code_cell('record_path = ""\noutput_dir = ""')
    parameters.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# 9 · Recorded"), parameters, nbformat.v4.new_code_cell(
        "from orpo_lib.workbook.record import record\nrecord('answer', 6 * 7000001, path=record_path)")]
    nbformat.write(nb, tmp_path / "09-recorded.ipynb")
    run = notebooks.execute(tmp_path / "09-recorded.ipynb", tmp_path / "executed")
    assert "42000006" in run["record"].read_text()
    (page,) = [p for p in report.write_report(tmp_path / "executed", tmp_path / "report") if p.stem != "index"]
    html = page.read_text()
    assert str(tmp_path) not in html and "injected-parameters" not in html
    assert not OUT_PROMPT.search(html) and "42000006" not in html
    assert "answer" in html and "record_path" in html  # the notebook's own cells stay (highlighted: split in spans)


def test_the_injected_cell_keeps_what_a_reader_needs():
    def injected(source):
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = ["injected-parameters"]
        return cell

    nb = nbformat.v4.new_notebook()
    nb.cells = [injected('# Parameters\noutput_dir = "/home/me/build/notebooks/09"\n'
                         'record_path = "/home/me/build/notebooks/09.json"\nrun_gpu = True\n'),
                nbformat.v4.new_code_cell('output_dir = "kept: not the injected cell"')]
    cleaned = report.without_runner_parameters(nb)
    assert [c.source for c in cleaned.cells] == ["# Parameters\nrun_gpu = True", 'output_dir = "kept: not the injected cell"']
    nb.cells = [injected('# Parameters\noutput_dir = "/home/me/09"\nrecord_path = "/home/me/09.json"\n')]
    assert report.without_runner_parameters(nb).cells == []
