"""The loss is a package of its own: nothing in it imports the workbook layer or the workbook's dependencies."""

import ast
import subprocess
import sys
from pathlib import Path

import orpo_lib

PACKAGE = Path(orpo_lib.__file__).parent
LOSS_MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "workbook" not in p.relative_to(PACKAGE).parts)


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, relative imports resolved against its package."""
    package = ".".join(("orpo_lib", *path.relative_to(PACKAGE).parent.parts))
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = node.module if node.level == 0 else ".".join(filter(None, (base, node.module)))
            names |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return names


def test_no_loss_module_imports_the_workbook():
    assert len(LOSS_MODULES) >= 15  # the scan sees the loss's modules, kernels included
    for path in LOSS_MODULES:
        workbook = {m for m in imported_modules(path) if m.startswith("orpo_lib.workbook")}
        assert not workbook, f"{path.relative_to(PACKAGE)} imports {workbook}"


def test_importing_the_loss_loads_no_workbook_module_or_dependency():
    code = ("import sys, orpo_lib, orpo_lib.causal_lm; "
            "print(sorted(m for m in sys.modules if m.startswith('orpo_lib.workbook') "
            "or m.split('.')[0] in ('matplotlib', 'ipywidgets', 'IPython', 'papermill')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_the_scan_sees_relative_imports():
    # the workbook's own modules import the loss relatively: the scan must resolve them
    assert "orpo_lib.fused" in imported_modules(PACKAGE / "workbook" / "bench.py")
    assert "orpo_lib.kernels" in imported_modules(PACKAGE / "chunked" / "steps.py")
    assert "orpo_lib.kernels.numerics" in imported_modules(PACKAGE / "kernels" / "row_stats.py")
