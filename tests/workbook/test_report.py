"""`make report`: one self-contained HTML page per executed notebook, figures inline, and an index."""

import re

import nbformat
import pytest

from orpo_lib.workbook import report
from orpo_lib.workbook.notebooks import notebook_paths

INLINE_PNG = re.compile(r'<img[^>]*src="data:image/png;base64,[A-Za-z0-9+/=\s]{1000,}"')


@pytest.fixture(scope="module")
def pages(runs, tmp_path_factory):
    (executed,) = {run["notebook"].parent for run in runs.values()}
    out = tmp_path_factory.mktemp("report")
    report.write_report(executed, out)
    return out


@pytest.mark.notebook
def test_one_page_per_notebook_with_its_figures_inline(pages):
    stems = [p.stem for p in notebook_paths()]
    assert sorted(p.stem for p in pages.glob("*.html")) == sorted([*stems, "index"])
    for stem in stems:
        page = (pages / f"{stem}.html").read_text()
        assert INLINE_PNG.search(page), f"{stem}: no figure embedded"
        assert not re.search(r'<(?:script|link|img)[^>]*(?:src|href)="(?:https?:)?//', page), f"{stem} loads from the web"
        assert "widget-view+json" not in page and "widget-state+json" not in page
        assert "Traceback" not in page


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
