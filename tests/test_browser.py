"""The course in a real browser: JupyterLab in headless Chromium runs every notebook (Run → Run All Cells), checks
that no cell fails and every widget renders, and drives the widgets as a learner would (token viewer, table explorer,
ask panel, chat panel, self-check); then it opens every notebook as a learner's copy in my-notebooks/ and follows each
relative link. Every figure, widget and HTML output of every notebook is saved as a screenshot, after the run and
after each widget is driven, into a gallery with an index.html (browser-gallery/ in the course's output folder, or
$QWENVL_LAB_GALLERY; `make screenshots` makes it).

Needs Playwright for Python and Debian's Chromium (/usr/bin/chromium; Playwright never downloads a browser here).
Without them the tests are skipped with the reason; with QWENVL_LAB_BROWSER_TEST=required (`make browser`) they fail.
"""

import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from chromium import CHROMIUM_FLAGS  # tests/chromium.py
from conftest import pythonpath

from qwenvl_lab.course.lab import (
    ANSWER_TAG,
    COURSE_FOLDER,
    MY_FOLDER,
    copy_course_notebooks,
    lab_environment,
    running_as_root,
)
from qwenvl_lab.course.widgets import HEATMAP_CLASS
from qwenvl_lab.resources import OUTPUT_ENV, OUTPUT_FOLDER, output_dir

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb")) + sorted((REPO / "notebooks" / "solutions").glob("*.ipynb"))
REQUIRED_ENV = "QWENVL_LAB_BROWSER_TEST"  # "required": missing tools fail the tests instead of skipping them
# JupyterLab user settings: nothing is saved into the repository's notebooks; every cell is kept in the page
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}
SERVER_START_S = 180  # JupyterLab answering its API
KERNEL_START_S = 180  # a notebook's kernel started and idle
RUN_ALL_S = 900  # one notebook's Run All Cells (engines build, benchmarks run)
ANSWER_S = 300  # an answer after Ask or Send
WIDGET_S = 60  # a widget reacting to a slider or a choice
ACTION_MS = 120_000  # Playwright's wait for a page to load, or an element to click, fill or read
WIDGET_REPR = re.compile(r"\b(?:VBox|HBox|Box|GridBox|Accordion|Tab|Stack)\(children=")
ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception)\b(?::|$)", re.MULTILINE)
DRIVEN: dict[str, set[str]] = {}  # notebook → kinds of widget driven in it, filled as the notebook tests pass


def missing_tools() -> list[str]:
    """What the browser tests need and this machine lacks, each with how to get it."""
    missing = []
    if importlib.util.find_spec("playwright") is None:
        missing.append(
            "Playwright for Python (pip install playwright; never `playwright install`: it drives Debian's chromium)"
        )
    if shutil.which("chromium") is None:
        missing.append("Chromium (as root: apt-get install chromium)")
    if importlib.util.find_spec("jupyterlab") is None:
        missing.append("JupyterLab (pip install -e '.[course]')")
    return missing


MISSING = missing_tools()
if MISSING and os.environ.get(REQUIRED_ENV) != "required":
    pytest.skip("the browser test needs " + "; ".join(MISSING), allow_module_level=True)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


class CourseProblem(AssertionError):
    """What a learner would see go wrong, with the element that shows it (scrolled into the screenshot)."""

    def __init__(self, message: str, where=None):
        super().__init__(message)
        self.where = where


@dataclass
class Lab:
    """A running JupyterLab server: its address, token, process and log file."""

    url: str
    token: str
    process: subprocess.Popen
    log: Path

    def api(self, method: str, path: str):
        """Call the server's REST API; the decoded JSON answer (None for an empty one)."""
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None

    def kernel_state(self, path: str) -> str | None:
        """The execution state of the kernel of notebook `path` (relative to the repository), None without one."""
        for session in self.api("GET", "/api/sessions"):
            if session["path"] == path and session.get("kernel"):
                return session["kernel"]["execution_state"]
        return None

    def shut_down_kernels(self):
        """End every session and its kernel."""
        for session in self.api("GET", "/api/sessions"):
            self.api("DELETE", f"/api/sessions/{session['id']}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.5):
    """Poll `condition` until it returns something true (returned), else raise a CourseProblem naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise CourseProblem(f"{what}: not seen within {timeout_s:g} s")
        time.sleep(poll_s)


@contextmanager
def running_lab(root: Path, home: Path):
    """JupyterLab on a free local port, rooted at `root`, with the course's Jupyter config; kernels import this
    checkout's qwenvl_lab; course outputs and notebook checkpoints go to `home`."""
    if MISSING:
        pytest.fail("the browser test needs " + "; ".join(MISSING), pytrace=False)
    for plugin, settings in LAB_SETTINGS.items():
        file = home / "settings" / f"{plugin}.jupyterlab-settings"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(settings), encoding="utf-8")
    env = lab_environment(REPO)
    env.update(
        {
            OUTPUT_ENV: str(home / "course-output"),
            "PYTHONPATH": pythonpath(REPO, env=env),
            "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        }
    )
    token, port = secrets.token_hex(16), free_port()
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root}",
        f"--IdentityProvider.token={token}",
        f"--FileCheckpoints.checkpoint_dir={home / 'checkpoints'}",
    ]
    if running_as_root():
        command.append("--allow-root")
    log = home / "jupyterlab.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    server = Lab(f"http://127.0.0.1:{port}", token, process, log)

    def answers():
        if process.poll() is not None:
            pytest.fail(
                f"JupyterLab stopped (exit status {process.returncode}) before it answered; its log: "
                f"{log}\n{log.read_text(errors='replace')[-3000:]}",
                pytrace=False,
            )
        try:
            return server.api("GET", "/api/status") is not None
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    try:
        wait_for(answers, SERVER_START_S, f"JupyterLab answering on {server.url} (log: {log})")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab rooted at the repository."""
    with running_lab(REPO, tmp_path_factory.mktemp("jupyterlab")) as server:
        yield server


@pytest.fixture(scope="module")
def learner_lab(tmp_path_factory):
    """JupyterLab rooted at a learner's checkout: the repository's files (linked), and my-notebooks/ made by
    qwenvl_lab.course.lab as `make lab` makes it."""
    checkout = tmp_path_factory.mktemp("learner-checkout")
    for entry in REPO.iterdir():
        if entry.name not in (MY_FOLDER, ".git", OUTPUT_FOLDER):
            (checkout / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    copy_course_notebooks(checkout / COURSE_FOLDER, checkout / MY_FOLDER)
    with running_lab(checkout, tmp_path_factory.mktemp("jupyterlab-learner")) as server:
        yield server


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Debian's headless Chromium driven by Playwright, with a fresh profile."""
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 — playwright: the browser test's extra

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            tmp_path_factory.mktemp("chromium-profile"),
            executable_path=shutil.which("chromium"),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        context.set_default_timeout(ACTION_MS)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory):
    """The folder that gets a screenshot of each notebook that fails (pytest keeps it when a test fails)."""
    folder = tmp_path_factory.mktemp("browser-screenshots")
    print(f"browser test: screenshots of failures go to {folder}")
    return folder


# A learner's actions


@dataclass
class Notebook:
    """A notebook open in a browser page, with the server whose kernel runs it."""

    page: object  # playwright.sync_api.Page
    lab: Lab
    path: str  # relative to the repository
    raises: frozenset  # indices of the cells tagged raises-exception: their error output is expected

    def status(self) -> str | None:
        """The notebook toolbar's kernel status (idle, busy, …)."""
        return self.page.locator(".jp-Notebook-ExecutionIndicator").get_attribute("data-status")

    def wait_idle(self, timeout_s: float, what: str):
        """Wait until the kernel is idle, for the server and the page, twice in a row."""
        calm = [0]

        def idle():
            calm[0] = calm[0] + 1 if self.lab.kernel_state(self.path) == "idle" and self.status() == "idle" else 0
            return calm[0] >= 2

        wait_for(idle, timeout_s, what)


def click_menu(page, menu: str, item: str):
    """Open a menu of JupyterLab's menu bar and click one of its items."""
    page.locator("li.lm-MenuBar-item", has=page.locator(f'.lm-MenuBar-itemLabel:text-is("{menu}")')).click()
    page.locator(f'.lm-Menu li.lm-Menu-item:has(> .lm-Menu-itemLabel:text-is("{item}"))').click()


def open_notebook(page, lab: Lab, path: str) -> Notebook:
    """Open notebook `path` in a fresh workspace and wait until its kernel is idle."""
    page.goto(f"{lab.url}/lab/tree/{path}?reset&token={lab.token}")
    page.locator(".jp-NotebookPanel .jp-Notebook").wait_for()
    cells = json.loads((REPO / path).read_text(encoding="utf-8"))["cells"]
    raises = frozenset(i for i, cell in enumerate(cells) if "raises-exception" in cell["metadata"].get("tags", []))
    notebook = Notebook(page, lab, path, raises)
    wait_for(
        lambda: page.locator(".jp-Notebook .jp-Cell").count() == len(cells),
        WIDGET_S,
        f"all {len(cells)} cells of {path} in the page",
    )
    notebook.wait_idle(KERNEL_START_S, f"the kernel of {path} started and idle")
    return notebook


CELLS = """() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].map(cell => ({
    code: cell.classList.contains('jp-CodeCell'),
    prompt: cell.querySelector('.jp-InputPrompt')?.textContent ?? '',
    empty: (cell.querySelector('.cm-content')?.textContent ?? '').trim() === '',
}))"""
RAN = re.compile(r"\[\d+\]")  # an input prompt such as [12]: the cell ran


def run_all_cells(notebook: Notebook, timeout_s: float = RUN_ALL_S):
    """Clear every output, Run → Run All Cells, and wait until no cell is queued and the kernel stays idle."""
    page = notebook.page
    click_menu(page, "Edit", "Clear Outputs of All Cells")
    click_menu(page, "Run", "Run All Cells")
    if not [c for c in page.evaluate(CELLS) if c["code"] and not c["empty"]]:
        return
    deadline, settled = time.monotonic() + timeout_s, 0
    while settled < 3:  # three polls in a row: nothing queued, kernel idle, some cell numbered
        time.sleep(1)
        cells, status = page.evaluate(CELLS), notebook.status()
        queued = [c for c in cells if c["code"] and "*" in c["prompt"]]
        ran = any(c["code"] and RAN.search(c["prompt"]) for c in cells)
        settled = settled + 1 if status == "idle" and not queued and ran else 0
        if time.monotonic() > deadline:
            raise CourseProblem(
                f"Run All Cells did not finish within {timeout_s:g} s: kernel {status}, "
                f"{len(queued)} code cell(s) still queued"
            )


OUTPUTS = """() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].flatMap((cell, index) =>
    [...cell.querySelectorAll('.jp-OutputArea-output')].map(output => ({
        index, mime: output.dataset.mimeType ?? '', text: output.textContent,
        errorWidget: output.querySelector('.jupyter-widgets-error-widget') !== null,
        brokenImages: [...output.querySelectorAll('img')].filter(
            img => img.offsetParent !== null && img.complete && img.naturalWidth === 0).length,
    })))"""


def output_problems(notebook: Notebook) -> dict[int, list[str]]:
    """Cell index → what a learner would see go wrong there: tracebacks (but in cells tagged raises-exception), code
    cells left unrun, widgets that did not render (raw `VBox(children=…)` text, "Error displaying widget", a child
    view that failed, a broken picture)."""
    page, problems = notebook.page, {}
    for out in page.evaluate(OUTPUTS):
        text, found = out["text"], []
        if (
            out["mime"] == "application/vnd.jupyter.stderr"
            and out["index"] not in notebook.raises
            and ("Traceback (most recent call last)" in text or ERROR_LINE.search(text))
        ):
            found.append("error output:\n" + text.strip()[-1500:])
        if "Error displaying widget" in text:
            found.append(f"a widget did not render: {text.strip()[:300]!r}")
        if out["errorWidget"]:
            found.append(
                "a part of a widget could not be displayed (JupyterLab shows an error box in its place; "
                "the browser console says why)"
            )
        if out["mime"] == "text/plain" and WIDGET_REPR.search(text):
            found.append(f"a widget shows as its text repr, not as a widget: {text.strip()[:200]!r}")
        if "Loading widget..." in text:
            found.append("a widget is still 'Loading widget...' after the run")
        if out["brokenImages"]:
            found.append(f"{out['brokenImages']} picture(s) shown as a broken image")
        for what in found:
            if what not in problems.setdefault(out["index"], []):  # an output inside a widget is seen twice
                problems[out["index"]].append(what)
    cells = page.evaluate(CELLS)
    unrun = [i for i, c in enumerate(cells) if c["code"] and not c["empty"] and not RAN.search(c["prompt"])]
    if unrun:
        problems.setdefault(unrun[0], []).append(f"{len(unrun)} code cell(s) did not run (cells {unrun[:10]})")
    return {index: found for index, found in sorted(problems.items()) if found}


def check_outputs(notebook: Notebook):
    """Raise a CourseProblem (at the first bad cell) unless every output is free of errors and every widget renders."""
    page = notebook.page

    def settled():  # widget views and pictures load asynchronously after the run
        return not any("Loading widget..." in out["text"] or out["brokenImages"] for out in page.evaluate(OUTPUTS))

    try:
        wait_for(settled, WIDGET_S, "every widget view created")
    except CourseProblem:
        pass  # output_problems names what is still loading or broken
    problems = output_problems(notebook)
    if problems:
        first = page.locator(".jp-Notebook .jp-Cell").nth(next(iter(problems)))
        raise CourseProblem("\n".join(f"cell {i}: {what}" for i, found in problems.items() for what in found), first)


def drag_slider(page, slider, fraction: float):
    """Drag a slider's handle with the mouse to `fraction` of its track."""
    track, handle = slider.locator(".noUi-base"), slider.locator(".noUi-handle")
    handle.scroll_into_view_if_needed()
    box, grip = track.bounding_box(), handle.bounding_box()
    page.mouse.move(grip["x"] + grip["width"] / 2, grip["y"] + grip["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + fraction * box["width"], box["y"] + box["height"] / 2, steps=10)
    page.mouse.up()


def html_matching(root, pattern: re.Pattern):
    """The HTML widget of `root` whose text matches `pattern`."""
    return root.locator(".widget-html-content").filter(has_text=pattern)


POSITION = re.compile(r"^position (\d+): id (\d+) · ")
LOOKUP = re.compile(r"^sequence (\d+), position (\d+): fake id (\d+) = .* = prompt_table row (\d+)$")
CHIP_RANGE = re.compile(r"^(\d+)(?:–(\d+))?:")


def drive_token_viewer(notebook: Notebook, root):
    """Move the position slider: the described position follows it, and the outlined chip holds that position."""
    info, slider = html_matching(root, POSITION), root.locator(".widget-slider")
    before = info.inner_text().strip()
    drag_slider(notebook.page, slider, 0.7)
    notebook.wait_idle(WIDGET_S, "the kernel done with the token viewer's slider")
    after, readout = info.inner_text().strip(), slider.locator(".widget-readout").inner_text().strip()
    position = int(POSITION.match(after).group(1))
    assert str(position) == readout, f"the slider reads {readout} but the viewer describes {after!r}"
    assert after != before, f"moving the slider to {readout} left the description at {before!r}"
    outlined = root.locator('span[style*="outline:2px solid"]')
    first, last = CHIP_RANGE.match(outlined.get_attribute("title")).groups()
    assert int(first) <= position <= int(last or first), (
        f"the outlined chip {outlined.get_attribute('title')!r} does not hold position {position}"
    )


def drive_table_explorer(notebook: Notebook, root):
    """Move the fake-id slider: the slider and the text name the same fake id, the described table row changes and
    the heat map is drawn again, at the size it had."""
    info, slider = html_matching(root, LOOKUP), root.locator(".widget-slider")
    heat_map = root.locator(f"img.{HEATMAP_CLASS}").first
    before, map_before, size_before = info.inner_text().strip(), heat_map.get_attribute("src"), heat_map.bounding_box()
    drag_slider(notebook.page, slider, 0.7)
    notebook.wait_idle(WIDGET_S, "the kernel done with the table explorer's slider")
    after, readout = info.inner_text().strip(), slider.locator(".widget-readout").inner_text().strip()
    assert LOOKUP.match(after), f"the table explorer describes {after!r}"
    seq, _, fake, row = LOOKUP.match(after).groups()
    assert readout == f"{fake} (seq {seq})", f"the slider reads {readout!r} but the text says {after!r}"
    assert row != LOOKUP.match(before).group(4), (
        f"moving the slider to fake id {readout} left the row as it was: {before!r} → {after!r}"
    )
    assert heat_map.get_attribute("src") != map_before, "the heat map was not drawn again for the new row"
    size = heat_map.bounding_box()
    assert (round(size["width"]), round(size["height"])) == (
        round(size_before["width"]),
        round(size_before["height"]),
    ), f"the heat map changed size with the slider: {size_before} → {size}"


def pick_option(root, skip=()) -> str:
    """Choose, in `root`'s dropdown, the last option not in `skip` that is not chosen now; its label."""
    select = root.locator("select").first
    chosen = select.evaluate("s => s.options[s.selectedIndex]?.text ?? ''")
    labels = [o for o in select.locator("option").all_inner_texts() if o not in skip and o != chosen]
    assert labels, f"the dropdown offers nothing else than {chosen!r}"
    select.select_option(label=labels[-1])
    return labels[-1]


def drive_ask_panel(notebook: Notebook, root):
    """Pick a sample picture (shown), type a question, click Ask: an answer, the fake ids and the table appear."""
    picture = root.locator("img.widget-image").first
    source_before = picture.get_attribute("src")
    label = pick_option(root)
    notebook.wait_idle(WIDGET_S, f"the kernel done with choosing {label}")
    html_matching(root, re.compile(rf"^sample: {re.escape(label)}$")).wait_for()
    assert picture.get_attribute("src") != source_before, f"choosing {label} left the picture as it was"
    assert picture.evaluate("img => img.complete && img.naturalWidth > 0"), f"the picture of {label} is broken"
    root.locator(".widget-text input").first.fill("How many shapes are there?")
    root.get_by_role("button", name="Ask", exact=True).click()
    reply = html_matching(root, re.compile(r"^(answer|cannot ask):"))
    reply.wait_for(timeout=ANSWER_S * 1000)
    notebook.wait_idle(ANSWER_S, "the kernel done answering")
    text = reply.inner_text().strip()
    assert re.match(r"^answer: \S", text), f"the ask panel says {text!r}"
    html_matching(root, re.compile(r"fake_prompt_id \d+")).wait_for()
    root.locator(f"img.{HEATMAP_CLASS}").first.wait_for()
    shoot(notebook, root, "ask-panel-answered")
    other = pick_option(root, skip={label})  # another picture: the answer about the one before must go
    notebook.wait_idle(WIDGET_S, f"the kernel done with choosing {other}")
    html_matching(root, re.compile(r"the picture changed")).wait_for(timeout=WIDGET_S * 1000)
    assert not reply.count(), f"after choosing {other} the ask panel still shows {text!r}"
    assert not root.locator(f"img.{HEATMAP_CLASS}").first.is_visible(), "the table of the picture before is still shown"


def drive_chat_panel(notebook: Notebook, root):
    """Attach a picture, type a question, click Send: the transcript shows the question, the picture and an answer."""
    label = pick_option(root, skip={"(no new picture)"})
    question = "What is in the picture?"
    root.locator(".widget-text input").first.fill(question)
    root.get_by_role("button", name="Send", exact=True).click()
    turn = html_matching(root, re.compile(rf"you: {re.escape(question)}"))
    turn.wait_for(timeout=ANSWER_S * 1000)
    notebook.wait_idle(ANSWER_S, "the kernel done answering")
    text = turn.inner_text()
    assert re.search(r"model: \S", text), f"the chat transcript has no answer: {text!r}"
    assert os.path.basename(label) in text, f"the transcript does not name the picture {label!r}: {text!r}"
    thumbnail = turn.locator("img").first
    assert thumbnail.evaluate("img => img.complete && img.naturalWidth > 0"), "the turn's picture has no thumbnail"


def drive_self_check(notebook: Notebook, root):
    """Press Check with no option picked (a reminder), then pick the first question's last option and press Check
    again: the package's verdict on it, with its explanation, appears."""
    check = root.get_by_role("button", name="Check", exact=True).first
    check.click()
    html_matching(root, re.compile(r"^pick an option first$")).first.wait_for(timeout=WIDGET_S * 1000)
    root.locator(".widget-toggle-buttons").first.locator("button").last.click()
    check.click()
    verdict = html_matching(root, re.compile(r"^\([a-h]\) (right|not quite) — \S"))
    verdict.first.wait_for(timeout=WIDGET_S * 1000)


DRIVERS = {  # kind → (how to recognise it inside a widget's view, how to drive it)
    "token viewer": (
        lambda root: root.locator(".widget-slider .widget-label", has_text=re.compile(r"^position$")),
        drive_token_viewer,
    ),
    "table explorer": (
        lambda root: root.locator(".widget-slider .widget-label", has_text=re.compile(r"^fake id$")),
        drive_table_explorer,
    ),
    "ask panel": (lambda root: root.get_by_role("button", name="Ask", exact=True), drive_ask_panel),
    "chat panel": (lambda root: root.get_by_role("button", name="Send", exact=True), drive_chat_panel),
    "self-check": (lambda root: root.get_by_role("button", name="Check", exact=True), drive_self_check),
}


def drive_widgets(notebook: Notebook) -> set[str]:
    """Drive each of the course's widgets the notebook shows, then check every output again; the kinds driven."""
    roots = notebook.page.locator(
        ".jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output > .jupyter-widgets"
    )
    driven = set()
    for n in range(roots.count()):
        root = roots.nth(n)
        for kind, (finds, drive) in DRIVERS.items():
            if finds(root).count():
                root.scroll_into_view_if_needed()
                try:
                    drive(notebook, root)
                except AssertionError as err:
                    raise CourseProblem(f"the {kind} (widget {n}) does not respond as it should: {err}", root) from None
                driven.add(kind)
                shoot(notebook, root, f"widget{n:02d}-{kind.replace(' ', '-')}-driven")
    check_outputs(notebook)
    return driven


# The gallery: a screenshot of every figure and widget of every notebook, in one page (`make screenshots`)

GALLERY_ENV = "QWENVL_LAB_GALLERY"  # the gallery's folder; default: browser-gallery/ in the course's output folder
SHOT_MIMES = ("image/png", "application/vnd.jupyter.widget-view+json", "text/html")  # figures, widgets, tables, chips
TOP_OUTPUTS = ".jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output"


def gallery_dir() -> Path:
    """The gallery's folder, made if needed."""
    folder = Path(os.environ.get(GALLERY_ENV) or output_dir() / "browser-gallery")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def notebook_gallery(notebook: Notebook) -> Path:
    """The folder of one notebook's screenshots (solutions/04_solutions → solutions-04_solutions)."""
    return gallery_dir() / Path(notebook.path).relative_to("notebooks").with_suffix("").as_posix().replace("/", "-")


def shoot(notebook: Notebook, element, name: str):
    """Save a screenshot of `element` as NAME.png in the notebook's gallery folder."""
    folder = notebook_gallery(notebook)
    folder.mkdir(parents=True, exist_ok=True)
    page, viewport = notebook.page, notebook.page.viewport_size
    element.scroll_into_view_if_needed()
    box = element.bounding_box() or {"height": 0}
    if box["height"] > viewport["height"] - 200:  # a tall widget: a taller window, so that all of it is on screen
        page.set_viewport_size({"width": viewport["width"], "height": int(box["height"]) + 300})
        page.wait_for_timeout(500)  # JupyterLab lays the notebook out again
        element.scroll_into_view_if_needed()
    try:
        element.screenshot(path=folder / f"{name}.png", animations="disabled")
    finally:
        page.set_viewport_size(viewport)


def shoot_every_output(notebook: Notebook):
    """A screenshot of every figure, widget and HTML output of the notebook as the run left it (the notebook's
    earlier screenshots removed first)."""
    shutil.rmtree(notebook_gallery(notebook), ignore_errors=True)
    cells = notebook.page.locator(".jp-Notebook .jp-Cell")
    for index in range(cells.count()):
        outputs = cells.nth(index).locator(TOP_OUTPUTS)
        for k in range(outputs.count()):
            output = outputs.nth(k)
            mime = output.get_attribute("data-mime-type") or ""
            kind = "widget" if output.locator(".jupyter-widgets").count() else mime.split("/")[-1]
            if (mime in SHOT_MIMES or kind == "widget") and output.bounding_box():
                shoot(notebook, output, f"cell{index:03d}-{k}-{kind}")


def write_gallery_index():
    """index.html of the gallery: every notebook's screenshots, in order, each named by its file."""
    root = gallery_dir()
    parts = ["<!doctype html><meta charset='utf-8'><title>qwenvl-lab: every figure and widget</title>",
             "<style>body{font-family:sans-serif;margin:2em}figure{margin:1em 0;border-top:1px solid #ccc}"
             "img{max-width:100%;border:1px solid #eee}</style><h1>Every figure and widget of the course</h1>"]  # fmt: skip
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        parts.append(f"<h2 id='{folder.name}'>{folder.name}</h2>")
        for shot in sorted(folder.glob("*.png")):
            parts.append(f"<figure><figcaption>{shot.stem}</figcaption><img src='{folder.name}/{shot.name}'></figure>")
    (root / "index.html").write_text("\n".join(parts), encoding="utf-8")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.relative_to(REPO / "notebooks").as_posix())
def test_notebook_runs_in_the_browser_and_its_widgets_respond(notebook, lab, browser, screenshots):
    from playwright.sync_api import Error as PlaywrightError  # noqa: PLC0415 — playwright: the browser test's extra

    path = notebook.relative_to(REPO).as_posix()
    page = browser.new_page()
    console = []
    page.on("console", lambda message: console.append(message.text) if message.type == "error" else None)
    failure = None
    try:
        opened = open_notebook(page, lab, path)
        run_all_cells(opened)
        check_outputs(opened)
        shoot_every_output(opened)
        DRIVEN[notebook.name] = drive_widgets(opened)
        write_gallery_index()
        print(f"{path}: ran every cell; drove {', '.join(sorted(DRIVEN[notebook.name])) or 'no widget'}")
    except (AssertionError, PlaywrightError) as err:
        if getattr(err, "where", None) is not None:
            err.where.scroll_into_view_if_needed()
        shot = screenshots / f"{notebook.stem}.png"
        page.screenshot(path=shot)
        errors = "".join(f"\n  {line[:300]}" for line in console[-10:])
        failure = f"{path}: {err}\nscreenshot: {shot}\nJupyterLab's log: {lab.log}" + (
            f"\nbrowser console errors:{errors}" if errors else ""
        )
    finally:
        page.close()
        lab.shut_down_kernels()
    if failure:
        pytest.fail(failure, pytrace=False)


def test_the_notebooks_show_every_kind_of_widget():
    if len(DRIVEN) < len(NOTEBOOKS):
        pytest.skip("needs every notebook's browser test to have passed in this run")
    shown = set().union(*DRIVEN.values())
    assert {"token viewer", "table explorer", "ask panel"} <= shown, f"driven: {DRIVEN}"


LINKS = """() => [...document.querySelectorAll('.jp-Notebook .jp-RenderedMarkdown a[href]')].map(a => ({
    href: a.getAttribute('href'), text: a.textContent.trim(),
    cell: [...document.querySelectorAll('.jp-Notebook .jp-Cell')].findIndex(c => c.contains(a)),
}))"""
LEARNER_NOTEBOOKS = [p.relative_to(REPO / COURSE_FOLDER).as_posix() for p in NOTEBOOKS]


def local_target(lab: Lab, href: str) -> str | None:
    """The checkout path a rendered link points at (JupyterLab turns relative links into /files/… URLs), None for a
    link to elsewhere (another site, an anchor in the same notebook)."""
    prefix = f"{lab.url}/files/"
    if not href.startswith(prefix):
        return None
    return urllib.parse.unquote(href.removeprefix(prefix).split("?", 1)[0].split("#", 1)[0])


@pytest.mark.parametrize("notebook", LEARNER_NOTEBOOKS)
def test_every_relative_link_works_from_the_learners_copy(notebook, learner_lab, browser, screenshots):
    """Open the learner's copy (my-notebooks/…) and follow each relative link of its text: the file or folder it
    names exists; a link to a solutions notebook opens that notebook in JupyterLab."""
    path = f"{MY_FOLDER}/{notebook}"
    page = browser.new_page()
    try:
        page.goto(f"{learner_lab.url}/lab/tree/{path}?reset&token={learner_lab.token}")
        page.locator(".jp-NotebookPanel .jp-Notebook").wait_for()
        cells = json.loads((REPO / COURSE_FOLDER / notebook).read_text(encoding="utf-8"))["cells"]
        wait_for(lambda: page.locator(".jp-Notebook .jp-Cell").count() == len(cells), WIDGET_S, f"the cells of {path}")
        link = re.compile(r"\]\((?!https?:|#)([^)]+)\)")
        hidden = [c for c in cells if ANSWER_TAG in c.get("metadata", {}).get("tags", [])]  # folded in the copy
        written = sum(
            len(link.findall(text))
            for c in cells
            if c not in hidden
            for text in (
                ["".join(c["source"])]
                if c["cell_type"] == "markdown"
                else ["".join(o.get("data", {}).get("text/markdown", "")) for o in c.get("outputs", [])]
            )
        )  # the markdown cells' links, and those of markdown outputs (the welcome's tables of notebooks)
        folded = [  # an answer's links render only once the learner unfolds it: their targets are checked on disk
            target
            for c in hidden
            for target in link.findall("".join(c["source"]))
            if not (REPO / COURSE_FOLDER / Path(notebook).parent / target.split("#")[0]).exists()
        ]
        assert not folded, f"{path}: links of folded answers that lead nowhere: {folded}"

        def relative_links():  # JupyterLab resolves a relative link asynchronously, into a /files/… URL
            found = [link for link in page.evaluate(LINKS) if not link["href"].startswith(("#", "https://"))]
            return found if len(found) >= written and all(local_target(learner_lab, x["href"]) for x in found) else None

        try:
            wait_for(relative_links, WIDGET_S, f"every relative link of {path} resolved")
        except CourseProblem:
            pass  # the unresolved ones are reported below
        found = [link for link in page.evaluate(LINKS) if not link["href"].startswith(("#", "https://"))]
        local = [(link, local_target(learner_lab, link["href"])) for link in found]
        broken = [f"cell {x['cell']}: [{x['text']}]({x['href']}) was not resolved" for x, t in local if t is None]
        if len(found) != written:
            broken.append(f"{written} relative links in the markdown, {len(found)} rendered as links")
        local = [(link, target) for link, target in local if target is not None]
        for link, target in local:
            try:
                learner_lab.api("GET", f"/api/contents/{urllib.parse.quote(target)}?content=0")
            except urllib.error.HTTPError as err:
                broken.append(f"cell {link['cell']}: [{link['text']}] → {target} ({err.code})")
        if broken:
            raise CourseProblem(f"{path}: links that lead nowhere from my-notebooks/:\n" + "\n".join(broken))
        solutions = [(link, target) for link, target in local if target.startswith(f"{MY_FOLDER}/solutions/")]
        if solutions:
            link, target = solutions[0]
            page.locator(".jp-Notebook .jp-RenderedMarkdown a").filter(  # its whole text: "01" is in "01 · …" too
                has_text=re.compile(rf"^\s*{re.escape(link['text'].strip())}\s*$")
            ).first.click()
            tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=Path(target).name)
            tab.first.wait_for(timeout=WIDGET_S * 1000)
            assert not page.locator(".jp-Dialog").count(), f"{path}: opening {target} shows a dialog"
    except (AssertionError, CourseProblem) as err:
        page.screenshot(path=screenshots / f"links-{Path(notebook).stem}.png")
        pytest.fail(f"{err}\nscreenshot: {screenshots / f'links-{Path(notebook).stem}.png'}", pytrace=False)
    finally:
        page.close()
        learner_lab.shut_down_kernels()
