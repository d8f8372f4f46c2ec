"""Drive a real JupyterLab from Debian's Chromium: start both, open a notebook, run it, read it back.

Everything here is generic (a notebook path, a widget's description label, an output's text); the
checks on the workbook itself live in ``test_workbook.py``. Both processes are started here, so
both are stopped here, by pid, on every exit path (test teardown, ``atexit``, SIGTERM).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from playwright.sync_api import Locator, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
# No sandbox (root in a container), no GPU, and nothing that phones home while the test runs.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
KERNEL_NAME = "python3"
VIEWPORT = {"width": 1400, "height": 1000}

# JupyterLab settings for the test's fresh settings dir: no autosave (running a notebook must not
# write its outputs over the committed source) and no news/update prompts over the notebook.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}

# JupyterLab renders an `error` output and a stderr stream alike, so errors are read from the
# notebook model (exposed to the page the way JupyterLab's own UI tests, Galata, do). Inside a
# widget Output area, whose outputs are not in the cell model, a traceback is recognised by its
# text; ipywidgets writes the other text in place of a widget it could not display.
STDERR_OUTPUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
TRACEBACK_TEXT = "Traceback (most recent call last)"
WIDGET_ERROR_TEXT = "Error displaying widget"
CELL_OUTPUTS_JS = """() => {
    const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
    const found = [];
    for (let i = 0; i < cells.length; i++) {
        const cell = cells.get(i);
        if (cell.type !== 'code') continue;
        found.push({
            execution_count: cell.executionCount,
            outputs: cell.outputs.toJSON().map(o => ({
                output_type: o.output_type,
                name: o.name ?? null,
                text: o.output_type === 'error'
                    ? o.traceback.join('\\n').replace(/\\x1b\\[[0-9;]*m/g, '')
                    : [].concat(o.text ?? []).join(''),
                mime: Object.keys(o.data ?? {}),
            })),
        });
    }
    return found;
}"""

_live: list = []  # the servers and browsers started and not yet stopped


def _stop_all_live() -> None:
    for proc in reversed(list(_live)):
        proc.stop()


def _on_sigterm(signum, frame):
    # SIGTERM (e.g. from the outer `timeout`) interrupts the session like Ctrl-C, so pytest stops
    # and still runs fixture teardown; atexit catches anything left.
    raise KeyboardInterrupt(f"signal {signum}")


atexit.register(_stop_all_live)
if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
    signal.signal(signal.SIGTERM, _on_sigterm)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_pid(pid: int, family: list[psutil.Process], grace_s: float = 15.0) -> None:
    """SIGTERM ``pid`` and wait; then SIGTERM, and finally SIGKILL, whatever of ``family`` is left.

    ``family`` is the process and its descendants, listed before the stop (once the parent exits
    its children are re-parented and can no longer be found from it). psutil checks each
    process's start time, so a pid reused meanwhile is never signalled.
    """
    try:
        psutil.Process(pid).terminate()
    except psutil.NoSuchProcess:
        pass
    _, alive = psutil.wait_procs(family, timeout=grace_s)
    for proc in alive:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(alive, timeout=5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def _family(pid: int) -> list[psutil.Process]:
    try:
        proc = psutil.Process(pid)
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


class JupyterLabServer:
    """A JupyterLab server on 127.0.0.1 with a random port, a token and fresh config dirs.

    Config, data, runtime, settings and workspace dirs, IPython's and matplotlib's, all live under
    ``state_dir``, so nothing from the machine's user profile reaches the server or its kernels.
    """

    def __init__(self, root_dir: Path, state_dir: Path):
        self.root_dir = root_dir
        self.state_dir = state_dir
        self.port = free_port()
        self.token = secrets.token_hex(24)
        self.log_path = state_dir / "jupyterlab.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        dirs = {
            "JUPYTER_CONFIG_DIR": "config",
            "JUPYTER_DATA_DIR": "data",
            "JUPYTER_RUNTIME_DIR": "runtime",
            "JUPYTERLAB_SETTINGS_DIR": "lab-settings",
            "JUPYTERLAB_WORKSPACES_DIR": "lab-workspaces",
            "IPYTHONDIR": "ipython",
            "MPLCONFIGDIR": "matplotlib",
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "IPYTHON"))}
        # MPLBACKEND=Agg would silently drop every inline figure.
        env.pop("MPLBACKEND", None)
        for var, name in dirs.items():
            env[var] = str(self.state_dir / name)
        # The kernel spec installed in the venv wins over any user- or system-wide `python3`.
        env["JUPYTER_PREFER_ENV_PATH"] = "1"
        return env

    def _write_settings(self, env: dict[str, str]) -> None:
        settings_dir = Path(env["JUPYTERLAB_SETTINGS_DIR"])
        for rel, values in LAB_SETTINGS.items():
            path = settings_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))

    def start(self, timeout_s: float = 120.0) -> None:
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.state_dir.mkdir(parents=True)
        env = self._env()
        self._write_settings(env)
        cmd = [
            sys.executable, "-m", "jupyter", "lab",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={self.root_dir}",
            f"--IdentityProvider.token={self.token}",
            f"--MappingKernelManager.default_kernel_name={KERNEL_NAME}",
            "--LabApp.expose_app_in_browser=True",
            # Checkpoints go under build/, not into .ipynb_checkpoints/ next to the notebooks.
            f"--FileCheckpoints.checkpoint_dir={self.state_dir / 'checkpoints'}",
        ]  # fmt: skip
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                cmd, cwd=self.root_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        _live.append(self)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"jupyter lab exited with {self.process.returncode}:\n{_tail(self.log_path)}"
                )
            try:
                self.api("GET", "/api/status")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.25)
        raise TimeoutError(
            f"jupyter lab not answering after {timeout_s:.0f} s:\n{_tail(self.log_path)}"
        )

    def api(self, method: str, path: str):
        request = urllib.request.Request(
            self.url + path, method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def stop(self) -> None:
        if self.process is None:
            return
        stop_pid(self.process.pid, _family(self.process.pid))
        self.process.wait(timeout=5)
        self.process = None
        _live.remove(self)


class ChromiumBrowser:
    """Debian's Chromium, started by us (so we hold its pid) and driven by Playwright over CDP."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.profile_dir = state_dir / "chromium-profile"
        self.log_path = state_dir / "chromium.log"
        self.process: subprocess.Popen | None = None
        self._playwright = None
        self.browser = None

    def start(self, timeout_s: float = 60.0) -> None:
        if not os.access(CHROMIUM, os.X_OK):
            raise FileNotFoundError(f"{CHROMIUM} is missing: apt-get install -y chromium")
        shutil.rmtree(self.profile_dir, ignore_errors=True)
        self.profile_dir.mkdir(parents=True)
        cmd = [
            CHROMIUM, *CHROMIUM_FLAGS,
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={self.profile_dir}",
            "about:blank",
        ]  # fmt: skip
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        _live.append(self)
        port_file = self.profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start:\n{_tail(self.log_path)}")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        self._playwright = sync_playwright().start()
        self.browser = self._playwright.chromium.connect_over_cdp(f"http://127.0.0.1:{port}")

    def new_page(self) -> Page:
        context = self.browser.contexts[0] if self.browser.contexts else self.browser.new_context()
        page = context.new_page()
        page.set_viewport_size(VIEWPORT)
        return page

    def stop(self) -> None:
        try:
            if self._playwright is not None:
                try:
                    self.browser.close()
                finally:
                    self._playwright.stop()
                    self._playwright = None
        finally:
            # Whatever happened to the CDP connection, the browser process goes.
            if self.process is not None:
                stop_pid(self.process.pid, _family(self.process.pid))
                self.process.wait(timeout=5)
                self.process = None
                _live.remove(self)


@dataclass
class RunReport:
    """What a notebook showed after Run All Cells."""

    code_cells: int
    unexecuted: list[int]  # code cell indices without an execution count
    errors: list[str]  # text of each error output (tracebacks, widget display errors)
    stderr: list[str]
    figures: list[dict] = field(default_factory=list)  # one per rendered image
    browser_errors: list[str] = field(default_factory=list)  # JavaScript exceptions, console errors


class NotebookPage:
    """One notebook opened in its own JupyterLab workspace, in its own browser tab."""

    def __init__(self, server: JupyterLabServer, browser: ChromiumBrowser, path: str):
        self.server = server
        self.path = path
        self.page = browser.new_page()
        self.browser_errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.browser_errors.append(f"uncaught: {exc}"))
        self.page.on("console", self._on_console)
        # A workspace per notebook, so no tab from a previous notebook is restored next to it.
        workspace = re.sub(r"[^A-Za-z0-9-]", "-", Path(path).stem)
        self.url = f"{server.url}/lab/workspaces/{workspace}/tree/{path}?token={server.token}"

    def _on_console(self, message) -> None:
        if message.type == "error":
            self.browser_errors.append(f"console.error: {message.text}")

    @property
    def panel(self) -> Locator:
        return self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")

    def open(self, timeout_s: float = 120.0) -> None:
        """Open the notebook and wait for its kernel to be idle; fail on any dialog instead."""
        self.page.goto(self.url)
        indicator = self.panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')
        dialog = self.page.locator(".jp-Dialog")
        indicator.or_(dialog).first.wait_for(timeout=timeout_s * 1000)
        if dialog.count():
            raise AssertionError(f"JupyterLab showed a dialog: {dialog.first.inner_text()!r}")
        # The toolbar reads "idle" before the kernel has connected; the server knows better.
        deadline = time.monotonic() + timeout_s
        while [s["kernel"]["execution_state"] for s in self.sessions()] != ["idle"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.path}: kernel not idle: {self.sessions()}")
            time.sleep(0.25)
        # The left sidebar (file browser) would take a third of every screenshot.
        if self.page.locator("#jp-left-stack:not(.lm-mod-hidden)").count():
            self.page.keyboard.press("Control+b")

    def sessions(self) -> list[dict]:
        """This notebook's sessions (JupyterLab names a session path by file id, not by name)."""
        folder, name = str(Path(self.path).parent), Path(self.path).name
        return [
            s for s in self.server.api("GET", "/api/sessions")
            if s["name"] == name and str(Path(s["path"]).parent) == folder
        ]  # fmt: skip

    def kernel_names(self) -> list[str]:
        return [s["kernel"]["name"] for s in self.sessions()]

    def _menu(self, menu: str, item: str) -> None:
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
        self.page.locator(".lm-Menu-item:visible .lm-Menu-itemLabel").get_by_text(
            item, exact=True
        ).click()

    def _prompts(self) -> list[str]:
        return self.panel.locator(".jp-CodeCell .jp-InputPrompt").all_text_contents()

    def _wait_idle(self, timeout_s: float, settle_s: float = 1.0) -> None:
        """Wait until no cell is queued or running and the kernel is idle, `settle_s` in a row."""
        idle = self.panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')
        deadline = time.monotonic() + timeout_s
        settled_since = None
        while time.monotonic() < deadline:
            busy = idle.count() == 0 or any("*" in p for p in self._prompts())
            if busy:
                settled_since = None
            elif settled_since is None:
                settled_since = time.monotonic()
            elif time.monotonic() - settled_since >= settle_s:
                return
            time.sleep(0.25)
        prompts = self._prompts()
        raise TimeoutError(f"{self.path}: still running after {timeout_s:.0f} s; prompts {prompts}")

    def run_all(self, timeout_s: float) -> RunReport:
        """Run > Run All Cells, wait until the kernel is done, and report what is on the page."""
        self._menu("Run", "Run All Cells")
        # Run All stops at the first error; the cells after it are left without a count.
        self.panel.locator(".jp-CodeCell .jp-InputPrompt").first.filter(
            has_text=re.compile(r"\[(\*|\d+)\]")
        ).wait_for(timeout=30_000)
        self._wait_idle(timeout_s)
        return self.report()

    def cell_outputs(self) -> list[dict]:
        """Each code cell's execution count and outputs, read from the notebook model."""
        return self.page.evaluate(CELL_OUTPUTS_JS)

    def report(self) -> RunReport:
        cells = self.cell_outputs()
        outputs = [o for cell in cells for o in cell["outputs"]]
        widget_texts = self.panel.locator(".widget-output").locator(STDERR_OUTPUT)
        errors = [o["text"] for o in outputs if o["output_type"] == "error"]
        errors += [t for t in widget_texts.all_text_contents() if TRACEBACK_TEXT in t]
        errors += [
            t for t in self.panel.locator(".jp-OutputArea-output").all_text_contents()
            if t.strip().startswith(WIDGET_ERROR_TEXT)
        ]  # fmt: skip
        return RunReport(
            code_cells=len(cells),
            unexecuted=[i for i, cell in enumerate(cells) if cell["execution_count"] is None],
            errors=errors,
            stderr=[o["text"] for o in outputs if o["name"] == "stderr"],
            figures=self.figures(),
            browser_errors=list(self.browser_errors),
        )

    def figures(self) -> list[dict]:
        """Every image in an output area, decoded: its mime type and natural size in pixels."""
        return self.panel.evaluate(
            """async (panel) => {
                const found = [];
                const cells = [...panel.querySelectorAll('.jp-CodeCell')];
                for (const [index, cell] of cells.entries()) {
                    const outputs = cell.querySelectorAll(
                        '.jp-OutputArea-output[data-mime-type^="image/"]');
                    for (const out of outputs) {
                        const img = out.querySelector('img, svg');
                        if (img && img.decode) { try { await img.decode(); } catch (e) {} }
                        const box = img ? img.getBoundingClientRect() : {width: 0, height: 0};
                        found.push({
                            cell: index,
                            mime: out.dataset.mimeType,
                            width: img ? (img.naturalWidth ?? box.width) : 0,
                            height: img ? (img.naturalHeight ?? box.height) : 0,
                        });
                    }
                }
                return found;
            }"""
        )

    def _label(self, description: str) -> Locator:
        # Unscoped, so that it can also be used inside `filter(has=...)` on a cell.
        return self.page.locator("label.widget-label").get_by_text(description, exact=True)

    def widget(self, description: str) -> Locator:
        """The one widget whose description label reads exactly ``description``."""
        found = self.panel.locator(".jp-CodeCell").locator(self._label(description))
        count = found.count()
        if count != 1:
            labels = self.panel.locator("label.widget-label").all_text_contents()
            raise AssertionError(
                f"{self.path}: {count} widgets labelled {description!r}; labels: {labels}"
            )
        return found.locator("xpath=..")

    def widget_value(self, description: str) -> str:
        """What the widget shows: a slider's readout, the pressed toggle, the chosen option."""
        widget = self.widget(description)
        readout = widget.locator(".widget-readout")
        if readout.count():
            return readout.inner_text().strip()
        toggle = widget.locator(".widget-toggle-button.mod-active")
        if toggle.count():
            return toggle.inner_text().strip()
        select = widget.locator("select")
        if select.count():
            return select.evaluate("s => s.options[s.selectedIndex].text")
        return widget.locator("input").input_value()

    def set_widget(self, description: str, value, timeout_s: float = 120.0) -> None:
        """Set a widget the way a person does with the keyboard, then wait for the kernel.

        Widgets use ``continuous_update=False``, so nothing is dragged: a numeric slider gets the
        value typed into its readout and Enter; a selection slider (whose readout is not an input)
        is stepped with the arrow keys; toggle buttons are clicked; text boxes filled.
        """
        widget = self.widget(description)
        handle = widget.locator(".noUi-handle")
        if handle.count():
            readout = widget.locator(".widget-readout")
            # A numeric slider's handle reports its value, a selection slider's an index.
            if handle.get_attribute("aria-valuetext") == readout.inner_text().strip():
                readout.click()
                self.page.keyboard.press("Control+a")
                self.page.keyboard.type(str(value))
                self.page.keyboard.press("Enter")
                shown = handle.get_attribute("aria-valuetext")
            else:
                shown = self._step_slider(handle, readout, value)
        elif widget.locator(".widget-toggle-button").count():
            widget.locator(".widget-toggle-button").get_by_text(str(value), exact=True).click()
            shown = self.widget_value(description)
        elif widget.locator("select").count():
            widget.locator("select").select_option(label=str(value))
            shown = self.widget_value(description)
        elif widget.locator("input").count():
            box = widget.locator("input").first
            box.fill(str(value))
            box.press("Enter")
            shown = self.widget_value(description)
        else:
            raise AssertionError(f"{self.path}: no way to type into widget {description!r}")
        if _as_number(shown) != _as_number(value):
            raise AssertionError(
                f"{self.path}: set {description!r} to {value!r} but it shows {shown!r}"
                " (not one of its values?)"
            )
        self._wait_idle(timeout_s)

    @staticmethod
    def _step_slider(handle: Locator, readout: Locator, value, max_steps: int = 100) -> str:
        """Arrow-key a selection slider to ``value``; each step is one option, as for a person."""
        target = _as_number(value)
        shown = readout.inner_text().strip()
        first_key = None
        for _ in range(max_steps):
            current = _as_number(shown)
            if current == target:
                break
            if isinstance(current, str) or isinstance(target, str):
                raise AssertionError(f"cannot order {shown!r} and {value!r} to step towards it")
            key = "ArrowRight" if current < target else "ArrowLeft"
            if key != (first_key := first_key or key):  # stepped past it: not an option
                break
            handle.press(key)
            before, shown = shown, readout.inner_text().strip()
            if shown == before:  # at the end of the range
                break
        return shown

    def output_text(self, description: str) -> str:
        """Text of the widget Output areas in the cell that holds the widget ``description``."""
        self.widget(description)
        cell = self.panel.locator(".jp-CodeCell").filter(has=self._label(description))
        return "\n".join(cell.locator(".widget-output").all_text_contents())

    def output_images(self, description: str) -> list[str]:
        """The ``src`` of each image in the widget Output areas of the cell holding
        ``description``: equal strings mean the same figure, a new string a redrawn one."""
        self.widget(description)
        cell = self.panel.locator(".jp-CodeCell").filter(has=self._label(description))
        images = cell.locator(".widget-output img")
        return [images.nth(i).get_attribute("src") for i in range(images.count())]

    def redrawn_images(self, description: str, before: list[str], timeout_s: float = 60.0) -> list[str]:
        """``output_images`` once they differ from ``before``, or as they are after ``timeout_s``: the figure
        is the view's last output, and under load it reaches the page well after the printed text (15 s
        was once not enough on a 2-core machine)."""
        deadline = time.monotonic() + timeout_s
        images = self.output_images(description)
        while images == before and time.monotonic() < deadline:
            time.sleep(0.25)
            images = self.output_images(description)
        return images

    def cell_index(self, description: str) -> int:
        """Index, among the code cells, of the cell that holds the widget ``description``."""
        return self.widget(description).evaluate(
            """(widget) => {
                const cells = [...widget.closest('.jp-Notebook').querySelectorAll('.jp-CodeCell')];
                return cells.indexOf(widget.closest('.jp-CodeCell'));
            }"""
        )

    def wait_for_output_change(self, description: str, before: str, timeout_s: float = 60.0) -> str:
        """Wait until the output next to ``description`` differs from ``before`` and the kernel is
        idle again (a view prints in several messages), then return it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.output_text(description)
            if text.strip() and text != before:
                self._wait_idle(max(deadline - time.monotonic(), 1.0))
                return self.output_text(description)
            time.sleep(0.25)
        raise TimeoutError(
            f"{self.path}: output next to {description!r} did not change within "
            f"{timeout_s:.0f} s; still {before!r}"
        )

    def screenshot(self, path: Path) -> None:
        """The whole notebook in one image: the viewport is stretched to the notebook's height."""
        path.parent.mkdir(parents=True, exist_ok=True)
        scroller = self.panel.locator(".jp-WindowedPanel-outer")
        hidden = scroller.evaluate(
            "e => { e.scrollTop = 0; return e.scrollHeight - e.clientHeight; }"
        )
        height = min(VIEWPORT["height"] + hidden, 16000)
        self.page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
        self.page.wait_for_timeout(500)
        scroller.evaluate("e => { e.scrollTop = 0; }")
        self.page.wait_for_timeout(200)
        self.page.screenshot(path=str(path))
        self.page.set_viewport_size(VIEWPORT)

    def close(self) -> None:
        self.page.close()
        for session in self.sessions():
            self.server.api("DELETE", f"/api/sessions/{session['id']}")


def _as_number(value) -> float | str:
    text = str(value).strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return text


def text_table(text: str) -> list[dict[str, str]]:
    """The rows of the first fixed-width table in ``text``: a header line, a line of dashes
    (one run per column, two spaces apart), then one line per row, read by column position."""
    lines = text.splitlines()
    for i in range(1, len(lines)):
        if re.fullmatch(r"-+(  -+)*", lines[i].strip()) and lines[i].startswith("-"):
            spans = [m.span() for m in re.finditer(r"-+", lines[i])]
            header = [lines[i - 1][a:b].strip() for a, b in spans]
            rows = []
            for line in lines[i + 1 :]:
                if not line.strip():
                    break
                rows.append(
                    {name: line[a:b].strip() for name, (a, b) in zip(header, spans, strict=True)}
                )
            return rows
    raise AssertionError(f"no table in {text!r}")
