"""One source of truth for dependencies, and notebooks that papermill and nbstripout accept."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _env():
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def _pip_lines():
    pip = next(d["pip"] for d in _env()["dependencies"] if isinstance(d, dict) and "pip" in d)
    return pip


def test_environment_installs_the_package_with_existing_extras():
    installs = [line for line in _pip_lines() if re.match(r"-e\s+\.", line)]
    assert len(installs) == 1
    extras = re.search(r"\[([^\]]*)\]", installs[0]).group(1).split(",")
    declared = _pyproject()["project"]["optional-dependencies"]
    assert extras and all(e.strip() in declared for e in extras)
    assert {"notebooks", "test"} <= {e.strip() for e in extras}


def test_environment_lists_no_dependencies_of_its_own():
    names = [d for d in _env()["dependencies"] if isinstance(d, str)]
    assert all(re.match(r"(python|pip)\b", d) for d in names), names


def test_environment_uses_the_constraints_file():
    constraint_lines = [line for line in _pip_lines() if line.startswith("-c")]
    assert constraint_lines == ["-c constraints.txt"]
    assert (ROOT / "constraints.txt").exists()


def test_python_versions_agree():
    pinned = next(d for d in _env()["dependencies"] if isinstance(d, str) and d.startswith("python"))
    major, minor = (int(v) for v in pinned.split("=")[1].split(".")[:2])
    minimum = _pyproject()["project"]["requires-python"].removeprefix(">=")
    assert (major, minor) >= tuple(int(v) for v in minimum.split("."))


def test_there_are_five_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05"]


def test_notebooks_are_stripped():
    result = subprocess.run([sys.executable, "-m", "nbstripout", "--verify",
                             "--extra-keys", "metadata.papermill cell.metadata.papermill", *map(str, NOTEBOOKS)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_contract(path):
    nb = json.loads(path.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    tagged = [i for i, c in enumerate(code) if "parameters" in c["metadata"].get("tags", [])]
    assert tagged == [0], "one parameters cell, the first code cell"
    source = "".join("".join(c["source"]) for c in code)
    assert "interact_manual" not in source
    assert "MPLBACKEND" not in source
    assert "record_path" in "".join(code[0]["source"]) and "output_dir" in "".join(code[0]["source"])
