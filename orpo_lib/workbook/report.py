"""Write the executed workbook as a report for readers: ``python -m orpo_lib.workbook.report``.

Each executed notebook in ``--notebooks`` (where ``make notebooks`` puts them) becomes one
self-contained HTML page in ``--out``: nbconvert's HTML exporter with the figures inline as data URIs
and no script fetched from the web (no require.js, MathJax or widget manager: the markdown has no
maths, and there is no kernel behind the page). A widget output (a view waiting for its controls, a
GPU button) would read as nothing there: it is replaced by a note, and what the cell printed or drew
stays. Of the cell papermill injects with the run's parameters, only what a reader needs stays: the
runner's ``output_dir`` and ``record_path`` (absolute paths on the machine that ran it) go, and so
does the cell when nothing else is left. ``index.html`` links every page with the notebook's title.
"""

from __future__ import annotations

import argparse
import ast
import html
import sys
from pathlib import Path

import nbconvert
import nbformat
from jinja2 import DictLoader
from nbconvert import HTMLExporter

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ("<p><em>Interactive controls here when the notebook runs in JupyterLab (<code>make lab</code>); "
               "the cell's static result is shown.</em></p>")
# JupyterLab's page, less the scripts it loads from a CDN
TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
"""
INJECTED_TAG = "injected-parameters"  # papermill's tag on the cell it adds after the `parameters` cell
RUNNER_PARAMETERS = ("output_dir", "record_path")  # what notebooks.execute passes every notebook
# `pip install --target DIR` (the GPU machine) puts nbconvert's templates in DIR/share, where Jupyter's paths do not look
TARGET_TEMPLATES = Path(nbconvert.__file__).parents[1] / "share" / "jupyter" / "nbconvert" / "templates"


def without_widgets(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook with each widget output replaced by a note, and no widget state."""
    note = nbformat.v4.new_output("display_data", data={"text/html": WIDGET_NOTE})
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [note if WIDGET_VIEW in output.get("data", {}) else output for output in cell.outputs]
    nb.metadata.pop("widgets", None)
    return nb


def without_runner_parameters(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook with the runner's parameters taken out of papermill's injected cell, and the cell
    dropped when it sets nothing else."""
    kept = []
    for cell in nb.cells:
        if INJECTED_TAG in cell.metadata.get("tags", []):
            dropped = {line for node in ast.parse(cell.source).body
                       if isinstance(node, ast.Assign) and all(getattr(t, "id", None) in RUNNER_PARAMETERS for t in node.targets)
                       for line in range(node.lineno, node.end_lineno + 1)}
            cell.source = "\n".join(text for line, text in enumerate(cell.source.splitlines(), 1) if line not in dropped)
            if all(not text.strip() or text.lstrip().startswith("#") for text in cell.source.splitlines()):
                continue
        kept.append(cell)
    nb.cells = kept
    return nb


def notebook_title(nb: nbformat.NotebookNode) -> str:
    """The first level-one heading of a notebook (its title), without the '#'."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return ""


def index_page(pages: list[tuple[str, str]]) -> str:
    """An HTML page linking each (file name, title)."""
    items = "\n".join(f'  <li><a href="{html.escape(name)}">{html.escape(Path(name).stem)}</a> — {html.escape(title)}</li>'
                      for name, title in pages)
    return f"""<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>orpo_lib workbook</title></head>
<body>
<h1>orpo_lib workbook</h1>
<p>The notebooks as executed headless by <code>make report</code>; each page stands alone.</p>
<ul>
{items}
</ul>
</body>
</html>
"""


def write_report(notebook_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """One HTML page per executed notebook in ``notebook_dir``, and ``index.html``; returns the pages written."""
    sources = sorted(Path(notebook_dir).glob("*.ipynb"))
    if not sources:
        raise FileNotFoundError(f"no executed notebooks in {notebook_dir}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target_templates = [str(TARGET_TEMPLATES)] if TARGET_TEMPLATES.is_dir() else []
    exporter = HTMLExporter(extra_loaders=[DictLoader({"report.html.j2": TEMPLATE})], template_file="report.html.j2",
                            extra_template_basedirs=target_templates, extra_template_paths=target_templates)
    pages, written = [], []
    for source in sources:
        nb = without_runner_parameters(without_widgets(nbformat.read(source, as_version=4)))
        body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": notebook_title(nb) or source.stem}})
        page = out / f"{source.stem}.html"
        page.write_text(body, encoding="utf-8")
        pages.append((page.name, notebook_title(nb)))
        written.append(page)
    index = out / "index.html"
    index.write_text(index_page(pages), encoding="utf-8")
    return [*written, index]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notebooks", default="build/notebooks", help="folder of executed notebooks (make notebooks)")
    parser.add_argument("--out", default="build/report", help="folder for the HTML pages")
    args = parser.parse_args(argv)
    try:
        written = write_report(args.notebooks, args.out)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
