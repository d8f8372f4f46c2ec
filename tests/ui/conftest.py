"""The JupyterLab UI test: collected always, run only when asked for.

``make ui-test`` sets ``UI_TEST=1``. Without it every test here is reported as skipped (visible
in ``pytest -ra``), so the plain ``make test`` neither needs Chromium nor waits for a browser.
With it nothing here is ever skipped: a missing browser or package is an error, not a skip.
"""

import os
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = ROOT / "build" / "ui"
SCREENSHOT_DIR = BUILD_DIR / "screenshots"
ENABLED = os.environ.get("UI_TEST") == "1"
# One notebook opened, run top to bottom on CPU and its widgets moved; leaves room for the
# Triton interpreter on a 2-core CI machine.
TEST_TIMEOUT_S = 600

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    ours = [item for item in items if HERE in item.path.parents]
    if not ours:
        return
    if not ENABLED:
        skip = pytest.mark.skip(reason="JupyterLab UI test: run it with `make ui-test` (UI_TEST=1)")
        for item in ours:
            item.add_marker(skip)
        return
    if not config.pluginmanager.hasplugin("timeout"):
        raise pytest.UsageError("UI_TEST=1 needs pytest-timeout: pip install -e '.[ui-test]'")
    for item in ours:
        item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def lab():
    """A JupyterLab server and a Chromium for the whole session, both stopped by pid at the end."""
    from lab_driver import ChromiumBrowser, JupyterLabServer

    shutil.rmtree(SCREENSHOT_DIR, ignore_errors=True)  # only this run's pictures
    server = JupyterLabServer(ROOT, BUILD_DIR / "jupyter")
    browser = ChromiumBrowser(BUILD_DIR / "chromium")
    try:
        server.start()
        browser.start()
        yield server, browser
    finally:
        try:
            browser.stop()
        finally:
            server.stop()


@pytest.fixture
def open_notebook(lab):
    """Open notebooks by path (relative to the repository); each is screenshotted into
    build/ui/screenshots/ and its kernel shut down when the test ends, pass or fail."""
    from lab_driver import NotebookPage

    server, browser = lab
    opened = []

    def open_(path: str) -> NotebookPage:
        notebook = NotebookPage(server, browser, path)
        opened.append(notebook)
        notebook.open()
        return notebook

    yield open_
    for notebook in opened:
        try:
            name = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(notebook.path).stem)
            notebook.screenshot(SCREENSHOT_DIR / f"{name}.png")
        finally:
            notebook.close()


def pytest_terminal_summary(terminalreporter):
    if ENABLED and SCREENSHOT_DIR.exists():
        terminalreporter.write_line(
            f"JupyterLab UI test: screenshots in {SCREENSHOT_DIR.relative_to(ROOT)}/, "
            f"server and browser logs in {BUILD_DIR.relative_to(ROOT)}/"
        )
