"""Execute the workbook headless: ``python -m orpo_lib.workbook.notebooks --out build/notebooks``.

Each notebook runs with papermill on the ``python3`` kernel into the output folder (never over the
sources). It receives two parameters: ``output_dir`` for its figures and ``record_path`` for the
JSON of key values that the tests read. With ``--gpu`` the notebooks that declare a ``run_gpu``
parameter also get ``run_gpu=True``: their GPU cells (buttons for people) then run once, headless, and
record what they measure; without a CUDA device ``--gpu`` stops before any notebook runs. The kernel runs with ``widgets.HEADLESS_ENV`` set, so that
widget views wait for a frontend that never comes instead of drawing (see ``widgets``).

A cell that reaches the cell timeout fails the run with ``CellTimeout``, naming the notebook and the
cell: nbclient raises for a cell still running then, and a cell whose reply nbclient only noticed at
the timeout (it then carries on as if nothing happened) is caught from its recorded duration.

Every notebook runs on each call: that is the job of ``make notebooks``, and its test. With
``--reuse-newer`` (``make report``) a notebook whose executed copy is up to date is left as it is
(``up_to_date`` says what that means).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import papermill
import torch
from nbclient.exceptions import CellTimeoutError

from .measurements import DATA_DIR
from .widgets import HEADLESS_ENV

# A cell that runs longer than this is stuck: the slowest cell takes about 20 s on a 2-core CPU.
CELL_TIMEOUT_S = 120
NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
PACKAGE_DIR = Path(__file__).resolve().parents[1]


class CellTimeout(RuntimeError):
    """A cell of a notebook ran into the runner's cell timeout."""


def notebook_paths(names: list[str] | None = None) -> list[Path]:
    """The workbook's notebooks in order, or those whose file name starts with one of ``names``."""
    paths = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    if names:
        paths = [p for p in paths if any(p.name.startswith(n) for n in names)]
    return paths


@contextmanager
def headless_kernel_env():
    """``HEADLESS_ENV`` for the kernels started inside (they inherit this process's environment)."""
    before = os.environ.get(HEADLESS_ENV)
    os.environ[HEADLESS_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(HEADLESS_ENV)
        else:
            os.environ[HEADLESS_ENV] = before


def cells_at_timeout(notebook: Path, timeout_s: float) -> list[tuple[int, float, str]]:
    """(index, seconds, first line) of the code cells of an executed notebook that ran for the timeout."""
    cells = json.loads(notebook.read_text())["cells"]
    found = []
    for index, cell in enumerate(cells):
        duration = cell.get("metadata", {}).get("papermill", {}).get("duration")
        if cell["cell_type"] == "code" and duration is not None and duration >= timeout_s:
            found.append((index, duration, "".join(cell["source"]).splitlines()[0]))
    return found


def inputs_of(source: Path) -> list[Path]:
    """What an executed copy of ``source`` was made from, as far as files tell: the notebook, every Python
    file of the ``orpo_lib`` package (the loss and the workbook layer it imports) and every file in
    ``figures/data`` (the records it reads)."""
    return [source, *sorted(PACKAGE_DIR.rglob("*.py")), *sorted(p for p in DATA_DIR.rglob("*") if p.is_file())]


def ran_to_the_end(notebook: Path, timeout_s: float) -> bool:
    """Whether papermill ran every code cell of an executed notebook without an error or a stall: no
    exception recorded, every cell completed and every non-empty one numbered (an interrupted run
    leaves cells pending or unnumbered), none at the cell timeout."""
    nb = json.loads(notebook.read_text())
    if nb.get("metadata", {}).get("papermill", {}).get("exception"):
        return False
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        if cell.get("metadata", {}).get("papermill", {}).get("status") != "completed":
            return False
        if "".join(cell["source"]).strip() and cell.get("execution_count") is None:
            return False
    return not cells_at_timeout(notebook, timeout_s)


def up_to_date(source: Path, output: Path, parameters: dict, cell_timeout_s: float = CELL_TIMEOUT_S) -> bool:
    """Whether ``output``, an executed copy of ``source``, can stand for a run with ``parameters`` now: it
    is newer (file modification time) than each of ``inputs_of(source)``, it was run with the same
    parameters (so a CPU copy never stands for a ``--gpu`` run) and it ran to the end
    (``ran_to_the_end``). Not seen: installed packages and environment variables."""
    if not output.exists():
        return False
    made = output.stat().st_mtime_ns
    if any(path.stat().st_mtime_ns >= made for path in inputs_of(source)):
        return False
    ran_with = json.loads(output.read_text()).get("metadata", {}).get("papermill", {}).get("parameters")
    return ran_with == parameters and ran_to_the_end(output, cell_timeout_s)


def run_parameters(source: Path, out_dir: Path, parameters: dict | None = None, gpu: bool = False) -> dict:
    """The parameters ``execute`` gives ``source``: where its figures and record go, ``parameters``, and
    ``run_gpu=True`` with ``gpu`` where the notebook declares it."""
    out_dir = out_dir.resolve()
    params = {"output_dir": str(out_dir / source.stem), "record_path": str(out_dir / f"{source.stem}.json"),
              **(parameters or {})}
    if gpu and "run_gpu" in papermill.inspect_notebook(str(source)):
        params["run_gpu"] = True
    return params


def execute(source: Path, out_dir: Path, parameters: dict | None = None, cell_timeout_s: float = CELL_TIMEOUT_S,
            gpu: bool = False) -> dict:
    """Run one notebook; returns its output notebook, record file, figure folder and wall time.
    ``gpu`` sets ``run_gpu=True`` where the notebook declares it. Raises ``CellTimeout`` when a cell
    reaches ``cell_timeout_s``."""
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    params = run_parameters(source, out_dir, parameters, gpu)
    record_file, figure_dir = out_dir / f"{source.stem}.json", out_dir / source.stem
    record_file.unlink(missing_ok=True)  # records must come from this run
    shutil.rmtree(figure_dir, ignore_errors=True)  # and so must figures: none left from an earlier run
    output = out_dir / source.name
    start = time.perf_counter()
    try:
        with headless_kernel_env():
            papermill.execute_notebook(
                str(source), str(output), parameters=params, kernel_name="python3",
                cwd=str(source.parent), progress_bar=False, execution_timeout=cell_timeout_s,
            )
    except CellTimeoutError as error:
        stuck = cells_at_timeout(output, cell_timeout_s) if output.exists() else []
        where = f"cell {stuck[0][0]} ({stuck[0][2]!r})" if stuck else "a cell"
        raise CellTimeout(f"{source.name}: {where} ran past the {cell_timeout_s} s cell timeout") from error
    stuck = cells_at_timeout(output, cell_timeout_s)
    if stuck:
        index, seconds, line = stuck[0]
        raise CellTimeout(f"{source.name}: cell {index} ({line!r}) took {seconds:.1f} s, the whole "
                          f"{cell_timeout_s} s cell timeout: it stalled")
    return {"notebook": output, "record": record_file, "figures": figure_dir,
            "seconds": time.perf_counter() - start}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="build/notebooks", help="folder for executed notebooks, records and figures")
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT_S, help="seconds a cell may run (default %(default)s)")
    parser.add_argument("--gpu", action="store_true", help="also run the GPU cells (run_gpu=True); needs CUDA")
    parser.add_argument("--reuse-newer", action="store_true",
                        help="leave an executed copy as it is where it ran to the end, with these parameters, "
                             "after the last change to its notebook, the package's Python files and figures/data")
    parser.add_argument("names", nargs="*", help="run only notebooks whose name starts with these (e.g. 01 02)")
    args = parser.parse_args(argv)
    sources = notebook_paths(args.names)
    if not sources:
        print("no notebooks matched", file=sys.stderr)
        return 1
    if args.gpu and not torch.cuda.is_available():
        print("error: --gpu runs the notebooks' GPU cells and needs a CUDA device; there is none here", file=sys.stderr)
        return 1
    total, reused = 0.0, 0
    for source in sources:
        output = Path(args.out).resolve() / source.name
        if args.reuse_newer and up_to_date(source, output, run_parameters(source, Path(args.out), gpu=args.gpu),
                                           args.cell_timeout):
            print(f"{source.name}: up to date, reused {output}")
            reused += 1
            continue
        try:
            run = execute(source, Path(args.out), cell_timeout_s=args.cell_timeout, gpu=args.gpu)
        except CellTimeout as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        total += run["seconds"]
        print(f"{source.name}: {run['seconds']:.1f} s -> {run['notebook']}")
    print(f"{len(sources) - reused} notebook(s) run in {total:.1f} s" + (f", {reused} reused" if reused else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
