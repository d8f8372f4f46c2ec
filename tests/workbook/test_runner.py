"""The notebook runner fails loudly on a stalled cell, runs kernels headless, and with --reuse-newer reruns only stale copies."""

import json
import os
import time
from pathlib import Path

import nbformat
import pytest
import torch
from papermill.exceptions import PapermillExecutionError

import orpo_lib
from orpo_lib.workbook import measurements, notebooks, plots, widgets


def _notebook(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    parameters = nbformat.v4.new_code_cell('record_path = ""\noutput_dir = ""')
    parameters.metadata["tags"] = ["parameters"]
    nb.cells = [parameters, *(nbformat.v4.new_code_cell(s) for s in sources)]
    nbformat.write(nb, path)
    return path


@pytest.mark.notebook
def test_a_cell_past_the_timeout_fails_the_run_naming_notebook_and_cell(tmp_path):
    source = _notebook(tmp_path / "sleepy.ipynb", "import time\ntime.sleep(30)", "print('never')")
    with pytest.raises(notebooks.CellTimeout, match=r"sleepy\.ipynb: cell 2 \('import time'\) ran past the 3 s"):
        notebooks.execute(source, tmp_path / "out", cell_timeout_s=3)


@pytest.mark.notebook
def test_main_exits_non_zero_on_a_stall(tmp_path, monkeypatch, capsys):
    _notebook(tmp_path / "01-sleepy.ipynb", "import time\ntime.sleep(30)")
    monkeypatch.setattr(notebooks, "NOTEBOOK_DIR", tmp_path)
    assert notebooks.main(["--out", str(tmp_path / "out"), "--cell-timeout", "3"]) == 1
    assert "01-sleepy.ipynb: cell 2" in capsys.readouterr().err


@pytest.mark.notebook
def test_kernels_run_headless_and_the_flag_is_restored(tmp_path, monkeypatch):
    monkeypatch.delenv(widgets.HEADLESS_ENV, raising=False)
    source = _notebook(tmp_path / "env.ipynb", "import os\nfrom orpo_lib.workbook.record import record\n"
                       f"record('headless', os.environ.get({widgets.HEADLESS_ENV!r}), path=record_path)")
    stale = tmp_path / "out" / "env" / "figure-of-an-earlier-run.png"
    stale.parent.mkdir(parents=True)
    stale.touch()
    run = notebooks.execute(source, tmp_path / "out")
    assert json.loads(run["record"].read_text()) == {"headless": "1"}
    assert not stale.exists(), "figures must come from this run"
    assert widgets.HEADLESS_ENV not in __import__("os").environ


def test_a_cell_that_took_the_whole_timeout_is_found(tmp_path):
    """nbclient can notice a cell's reply only at the timeout and carry on; its duration gives it away."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("fast()"), nbformat.v4.new_code_cell("widgets.explorer()\nmore()")]
    nb.cells[0].metadata["papermill"] = {"duration": 0.3}
    nb.cells[1].metadata["papermill"] = {"duration": 120.01}
    nbformat.write(nb, tmp_path / "ran.ipynb")
    assert notebooks.cells_at_timeout(tmp_path / "ran.ipynb", 120) == [(1, 120.01, "widgets.explorer()")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_gpu_without_cuda_stops_before_any_notebook(tmp_path, capsys):
    assert notebooks.main(["--gpu", "--out", str(tmp_path / "out")]) == 1
    assert "--gpu runs the notebooks' GPU cells and needs a CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.notebook
def test_gpu_sets_run_gpu_only_where_a_notebook_declares_it(tmp_path):
    declares = _notebook(tmp_path / "declares.ipynb", "from orpo_lib.workbook.record import record\n"
                         "record('run_gpu', run_gpu, path=record_path)")
    nb = nbformat.read(declares, as_version=4)
    nb.cells[0].source += "\nrun_gpu = False"
    nbformat.write(nb, declares)
    lacks = _notebook(tmp_path / "lacks.ipynb", "from orpo_lib.workbook.record import record\n"
                      "record('run_gpu', 'run_gpu' in globals(), path=record_path)")
    for gpu in (False, True):
        assert json.loads(notebooks.execute(declares, tmp_path / "out", gpu=gpu)["record"].read_text()) == {"run_gpu": gpu}
    assert json.loads(notebooks.execute(lacks, tmp_path / "out", gpu=True)["record"].read_text()) == {"run_gpu": False}


def _counting_notebook(folder, log):
    """A notebook that appends a line to ``log`` each time it runs, and fails while ``log``.fail exists."""
    return _notebook(folder / "01-count.ipynb", "from pathlib import Path\n"
                     f"log = Path({str(log)!r})\n"
                     "assert not log.with_suffix('.fail').exists(), 'asked to fail'\n"
                     "with log.open('a') as f:\n    f.write('ran\\n')")


def _age(path, seconds):
    """Set ``path``'s modification time ``seconds`` from now (negative: in the past)."""
    when = time.time() + seconds
    os.utime(path, (when, when))


@pytest.mark.notebook
def test_reuse_newer_keeps_a_fresh_copy_and_reruns_a_stale_one(tmp_path, monkeypatch, capsys):
    """``--reuse-newer`` (make report) against real modification times of the notebook, the package and the data."""
    sources, package, data, out = (tmp_path / name for name in ("notebooks", "package", "data", "out"))
    for folder in (sources, package, data):
        folder.mkdir()
    monkeypatch.setattr(notebooks, "NOTEBOOK_DIR", sources)
    monkeypatch.setattr(notebooks, "PACKAGE_DIR", package)
    monkeypatch.setattr(notebooks, "DATA_DIR", data)
    log = tmp_path / "runs.log"
    source = _counting_notebook(sources, log)
    module, record = package / "loss.py", data / "bench.json"
    module.write_text("")
    record.write_text("{}")
    for path in (source, module, record):
        _age(path, -100)
    copy = out / source.name

    def runs(*flags):
        assert notebooks.main(["--out", str(out), *flags]) == 0
        return len(log.read_text().splitlines())

    assert runs("--reuse-newer") == 1  # no copy yet
    assert runs("--reuse-newer") == 1
    assert "01-count.ipynb: up to date, reused" in capsys.readouterr().out
    assert runs() == 2  # make notebooks runs every notebook
    for count, changed in enumerate((source, module, record), 3):
        _age(copy, -50)
        _age(changed, -10)  # edited after the copy was made
        assert runs("--reuse-newer") == count, changed.name
        assert runs("--reuse-newer") == count, f"the new copy is newer than {changed.name}"
        _age(changed, -100)


@pytest.mark.notebook
def test_a_copy_that_failed_or_stopped_early_is_not_reused(tmp_path):
    log = tmp_path / "runs.log"
    source = _counting_notebook(tmp_path, log)
    _age(source, -100)
    out = tmp_path / "out"
    copy = out / source.name
    params = notebooks.run_parameters(source, out)
    log.with_suffix(".fail").touch()
    with pytest.raises(PapermillExecutionError, match="asked to fail"):
        notebooks.execute(source, out)
    assert copy.stat().st_mtime > source.stat().st_mtime and not notebooks.up_to_date(source, copy, params)
    log.with_suffix(".fail").unlink()
    notebooks.execute(source, out)
    assert notebooks.up_to_date(source, copy, params)
    assert not notebooks.up_to_date(source, copy, {**params, "run_gpu": True}), "made with other parameters"
    nb = nbformat.read(copy, as_version=4)
    nb.cells[-1].execution_count = None  # where an interrupted run stops: a cell never numbered
    nbformat.write(nb, copy)
    assert not notebooks.up_to_date(source, copy, params)


def test_a_copy_depends_on_the_notebook_the_package_and_the_data():
    source = notebooks.notebook_paths()[0]
    inputs = notebooks.inputs_of(source)
    assert source in inputs
    assert Path(plots.__file__).resolve() in inputs and Path(orpo_lib.__file__).resolve() in inputs
    assert measurements.DATA_DIR / "anchors-2026-12-02-h200.json" in inputs
