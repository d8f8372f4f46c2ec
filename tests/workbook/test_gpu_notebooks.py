"""`python -m orpo_lib.workbook.gpu_notebooks`: the GPU run's set-up, and its refusal without CUDA."""

import pytest
import torch

from orpo_lib.workbook import gpu_notebooks


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_without_cuda_it_stops_before_any_notebook(tmp_path, capsys):
    assert gpu_notebooks.main(["--out", str(tmp_path / "out")]) == 1
    assert "needs a CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_missing_python3_kernel_is_installed_under_the_prefix(tmp_path, monkeypatch):
    from jupyter_client.kernelspec import KernelSpecManager

    monkeypatch.setattr(KernelSpecManager, "find_kernel_specs", lambda self: {})
    monkeypatch.setenv("JUPYTER_PATH", "/elsewhere")
    where = gpu_notebooks.ensure_python3_kernel(tmp_path)
    assert (tmp_path / "share" / "jupyter" / "kernels" / "python3" / "kernel.json").exists()
    assert where.startswith(str(tmp_path))
    assert gpu_notebooks.os.environ["JUPYTER_PATH"] == f"{tmp_path}/share/jupyter:/elsewhere"


def test_a_found_python3_kernel_is_used_as_it_is(tmp_path, monkeypatch):
    from jupyter_client.kernelspec import KernelSpecManager

    monkeypatch.setattr(KernelSpecManager, "find_kernel_specs", lambda self: {"python3": "/somewhere/python3"})
    assert gpu_notebooks.ensure_python3_kernel(tmp_path) == "/somewhere/python3"
    assert not list(tmp_path.iterdir())
