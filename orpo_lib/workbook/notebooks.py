"""Execute the workbook headless: ``python -m orpo_lib.workbook.notebooks --out build/notebooks``.

Each notebook runs with papermill on the ``python3`` kernel into the output folder (never over the
sources). It receives two parameters: ``output_dir`` for its figures and ``record_path`` for the
JSON of key values that the tests read.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import papermill

# A cell that runs longer than this is stuck (the whole workbook takes well under a minute on CPU).
CELL_TIMEOUT_S = 240
NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"


def notebook_paths(names: list[str] | None = None) -> list[Path]:
    """The workbook's notebooks in order, or those whose file name starts with one of ``names``."""
    paths = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    if names:
        paths = [p for p in paths if any(p.name.startswith(n) for n in names)]
    return paths


def execute(source: Path, out_dir: Path, parameters: dict | None = None) -> dict:
    """Run one notebook; returns its output notebook, record file, figure folder and wall time."""
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = source.stem
    record_file = out_dir / f"{stem}.json"
    record_file.unlink(missing_ok=True)  # records must come from this run
    params = {"output_dir": str(out_dir / stem), "record_path": str(record_file), **(parameters or {})}
    start = time.perf_counter()
    papermill.execute_notebook(
        str(source), str(out_dir / source.name), parameters=params, kernel_name="python3",
        cwd=str(source.parent), progress_bar=False, execution_timeout=CELL_TIMEOUT_S,
    )
    return {"notebook": out_dir / source.name, "record": record_file, "figures": out_dir / stem,
            "seconds": time.perf_counter() - start}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="build/notebooks", help="folder for executed notebooks, records and figures")
    parser.add_argument("names", nargs="*", help="run only notebooks whose name starts with these (e.g. 01 02)")
    args = parser.parse_args(argv)
    sources = notebook_paths(args.names)
    if not sources:
        print("no notebooks matched", file=sys.stderr)
        return 1
    total = 0.0
    for source in sources:
        run = execute(source, Path(args.out))
        total += run["seconds"]
        print(f"{source.name}: {run['seconds']:.1f} s -> {run['notebook']}")
    print(f"{len(sources)} notebook(s) in {total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
