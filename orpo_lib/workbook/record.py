"""Record key values of a notebook run in a small JSON file, so tests can assert on them.

A notebook calls ``record("max_grad_error", err, path=record_path)``; the path comes from the
notebook's ``record_path`` parameter or, when that is empty, from ``$ORPO_RECORD_PATH``. With
neither (an interactive session) nothing is written. ``record`` returns None: a cell that ends in a
call adds no ``Out[]`` copy of the value it stored to the page.
"""

from __future__ import annotations

import json
import math
import os
from numbers import Integral, Real
from pathlib import Path

RECORD_PATH_ENV = "ORPO_RECORD_PATH"


def record_path(path: str | os.PathLike | None = None) -> Path | None:
    """Where records go: the explicit path, else the environment variable, else nowhere."""
    chosen = str(path) if path else os.environ.get(RECORD_PATH_ENV, "")
    return Path(chosen) if chosen else None


def _plain(value):
    """Convert tensors, numpy scalars and tuples into JSON values; non-finite floats become strings."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        value = float(value)
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    raise TypeError(f"cannot record a {type(value).__name__}")


def record(name: str, value, path: str | os.PathLike | None = None) -> None:
    """Store ``value`` under ``name`` in the record file (merging with what is there)."""
    target = record_path(path)
    if target is not None:
        values = load_record(target) if target.exists() else {}
        values[name] = _plain(value)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_suffix(target.suffix + ".tmp")
        staging.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
        staging.replace(target)


def load_record(path: str | os.PathLike) -> dict:
    """The values a notebook run recorded."""
    return json.loads(Path(path).read_text())
