"""The notebook runner fails loudly on a stalled cell, and runs kernels headless."""

import json

import nbformat
import pytest
import torch

from orpo_lib.workbook import notebooks, widgets


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
    run = notebooks.execute(source, tmp_path / "out")
    assert json.loads(run["record"].read_text()) == {"headless": "1"}
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
