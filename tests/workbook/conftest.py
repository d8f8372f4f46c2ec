import pytest

from orpo_lib.workbook.notebooks import execute, notebook_paths


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Every notebook executed once with papermill (the notebook and report tests share it)."""
    out = tmp_path_factory.mktemp("notebooks")
    sources = notebook_paths()
    before = {p: p.read_bytes() for p in sources}
    results = {p.stem: execute(p, out) for p in sources}
    assert {p: p.read_bytes() for p in sources} == before, "sources must never be overwritten"
    return results
