"""Execute the workbook on a GPU machine and record what it measured:
``python -m orpo_lib.workbook.gpu_notebooks --out DIR``.

Made for a machine without Jupyter, such as the H200 image: bring wheels of papermill, ipykernel,
ipywidgets and nbconvert with what they need, ``pip install --target /tmp/site WHEELS/*.whl`` and put
/tmp/site on PYTHONPATH. This then

1. finds the ``python3`` kernel, or installs its spec for this interpreter under ``--kernel-prefix``;
2. runs every notebook with ``run_gpu=True`` (the runner's ``--gpu``) into ``DIR/notebooks``;
3. writes ``DIR/notebooks-<date>-<gpu>.json``: provenance (GPU, torch and triton versions, date, the
   commit from ``$ORPO_COMMIT``) and each notebook's run time and record: evidence that the workbook's
   GPU cells run and what they measured;
4. copies each notebook's PNG figures to ``DIR/notebooks-<date>-<gpu>/`` and writes the HTML report
   to ``DIR/report``.

Without a CUDA device it stops before running anything.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
from pathlib import Path

import torch

from . import notebooks, report
from .bench import device_slug, liger_version

REPO_ROOT = Path(__file__).resolve().parents[2]


def ensure_python3_kernel(prefix: Path) -> str:
    """Where the ``python3`` kernelspec is; installs one for this interpreter under ``prefix`` (and puts it
    on JUPYTER_PATH) when none is found."""
    from jupyter_client.kernelspec import KernelSpecManager

    found = KernelSpecManager().find_kernel_specs()
    if "python3" in found:
        return found["python3"]
    from ipykernel.kernelspec import install

    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(prefix / "share" / "jupyter"), os.environ.get("JUPYTER_PATH")]))
    return install(prefix=str(prefix), kernel_name="python3")


def provenance(command: str) -> dict:
    import triton

    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "liger": liger_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("ORPO_COMMIT") or "unknown",
        "command": command,
    }


def run_workbook(out: Path, cell_timeout_s: float, kernel_prefix: Path) -> Path:
    """Steps 1–4 of the module's docstring; returns the JSON written."""
    print("python3 kernel:", ensure_python3_kernel(kernel_prefix))
    # the kernels import orpo_lib from this tree, which is not installed there
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    meta = provenance(" ".join(["python -m orpo_lib.workbook.gpu_notebooks", *sys.argv[1:]]))
    stem = f"notebooks-{meta['date'][:10]}-{device_slug(torch.device('cuda'))}"
    executed = out / "notebooks"
    figures = out / stem
    runs = {}
    for source in notebooks.notebook_paths():
        run = notebooks.execute(source, executed, cell_timeout_s=cell_timeout_s, gpu=True)
        print(f"{source.name}: {run['seconds']:.1f} s", flush=True)
        runs[source.stem] = {"seconds": round(run["seconds"], 1), "record": json.loads(run["record"].read_text())}
        for png in sorted(run["figures"].glob("*.png")):
            (figures / source.stem).mkdir(parents=True, exist_ok=True)
            shutil.copy2(png, figures / source.stem / png.name)
    record = out / f"{stem}.json"
    record.write_text(json.dumps({"provenance": meta, "notebooks": runs}, indent=1) + "\n")
    report.write_report(executed, out / "report")
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for the record, the figures, the executed notebooks and the report")
    parser.add_argument("--cell-timeout", type=float, default=600, help="seconds a cell may run (default %(default)s: the live runs)")
    parser.add_argument("--kernel-prefix", default="/tmp/jupyter-kernel", help="writable prefix for a python3 kernelspec if none is found")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: gpu_notebooks runs the notebooks' GPU cells and needs a CUDA device; there is none here", file=sys.stderr)
        return 1
    try:
        record = run_workbook(Path(args.out).resolve(), args.cell_timeout, Path(args.kernel_prefix))
    except notebooks.CellTimeout as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
