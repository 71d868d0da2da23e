"""`python tools/classload.py` — a class on one JupyterHub server, measured.

N simulated learners log in through the hub, start their servers, get the notebooks through nbgitpuller's link (a
clone of the course in their home) and run them cell by cell through the Jupyter server's REST API and kernel
channels (websocket), with a think time between cells; one learner alone runs every course notebook first, for the
reference outputs, latencies and each notebook's memory. Per learner it records the peak memory of the server and
of its kernel with the processes the kernel starts, each cell's latency and the errors, and compares every text
output with the lone run's. Each learner edits a cell of their clone before the notebooks; once all have pulled, the
upstream repository gets a new cell, and after the notebooks each learner pulls again: the edit must stay and the new
cell arrive. The upstream is a bare git repository on this machine holding the clone's tracked files as they are.
The hub runs the instructor's configuration (docs/jupyterhub/jupyterhub_config.py and course.py) with a password
authenticator; each learner is a system user made for the run and removed after it. Linux, as root, on 127.0.0.1
only; bounded by --time-limit.
"""

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import pwd
import random
import re
import secrets
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from qwenvl_lab import files as qfiles
from qwenvl_lab.course.lab import COURSE_FOLDER
from qwenvl_lab.course.notebooks import NOTEBOOKS as COURSE_NOTEBOOKS
from qwenvl_lab.course.notebooks import core_path
from qwenvl_lab.resources import checkout_dir

JSON_WRITER = qfiles.writer("class-load --json", "the class load test's results")

HUB_CONFIG = Path("docs") / "jupyterhub" / "jupyterhub_config.py"  # in the clone
COURSE_CONFIG = Path("docs") / "jupyterhub" / "course.py"  # the course's part, loaded by HUB_CONFIG
NOTEBOOKS = tuple(n.number for n in core_path()[1:])  # the workshop's core path after the welcome
EVERY_NOTEBOOK = tuple(n.number for n in COURSE_NOTEBOOKS)  # the lone learner's: each notebook's memory
IGNORE = "NBVAL_IGNORE_OUTPUT"
CELL_TIMEOUT_S = 600
SPAWN_TIMEOUT_S = 300
PULL_TIMEOUT_S = 300
SAMPLE_EVERY_S = 1.0  # the class's memory samples
LONE_SAMPLE_EVERY_S = 0.2  # the lone learner's: short-lived processes a notebook starts are caught too
HOST = "127.0.0.1"
UPSTREAM = "qwenvl-lab"  # the upstream repository's folder name: nbgitpuller clones it into ~/qwenvl-lab
BRANCH = "main"
EDITED_NOTEBOOK = "notebooks/00_welcome.ipynb"  # a learner edits its first code cell; the upstream appends a cell
EDIT_MARK = "# my note, kept across pulls:"


class LoadTestError(RuntimeError):
    """The load test cannot run here, or the hub did not come up; the message says why."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def percentile(values, q: float) -> float:
    """The q-th percentile (0-100) of `values`, linearly interpolated."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q / 100
    low, high = int(rank), min(int(rank) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_summary(seconds) -> dict:
    """Median, 95th percentile and maximum of a list of latencies, in seconds."""
    values = list(seconds)
    return {
        "cells": len(values),
        "median_s": round(statistics.median(values), 4) if values else None,
        "p95_s": round(percentile(values, 95), 4) if values else None,
        "max_s": round(max(values), 4) if values else None,
    }


# notebooks and their outputs


@dataclass(frozen=True)
class Cell:
    """A code cell of a course notebook: its index among the notebook's cells, source, and how it is compared."""

    index: int
    source: str
    compared: bool  # False: NBVAL_IGNORE_OUTPUT
    raises: bool  # tagged raises-exception: an error is its expected output


def code_cells(notebook: dict) -> list[Cell]:
    """The code cells of a notebook (its JSON), in order."""
    return [
        Cell(
            i,
            "".join(cell["source"]),
            IGNORE not in "".join(cell["source"]),
            "raises-exception" in cell["metadata"].get("tags", []),
        )
        for i, cell in enumerate(notebook["cells"])
        if cell["cell_type"] == "code"
    ]


def add_output(outputs: list[list[str]], message: dict) -> None:
    """Append the text a learner reads in one output message as [kind, text]; a stream continues the same stream
    before it (the kernel splits them as it pleases, a notebook stores them joined)."""
    kind, content = message["header"]["msg_type"], message["content"]
    if kind == "stream":
        if outputs and outputs[-1][0] == content["name"]:
            outputs[-1][1] += content["text"]
        else:
            outputs.append([content["name"], content["text"]])
    elif kind in ("execute_result", "display_data"):
        outputs.append(["result", content.get("data", {}).get("text/plain", "")])
    elif kind == "error":
        outputs.append(["error", f"{content['ename']}: {content['evalue']}"])


def normalized(outputs: list[list[str]], workdir: str) -> list[str]:
    """Outputs as "kind: text", with the learner's own folder written as <workdir> (every learner has another home)."""
    return [f"{kind}: {text}".replace(workdir, "<workdir>") for kind, text in outputs]


def compare_outputs(reference: dict, run: dict, cells: dict) -> list[str]:
    """Where `run`'s text outputs differ from `reference`'s (both: notebook → cell index → outputs), cells that
    ignore their output left out."""
    differences = []
    for notebook, notebook_cells in cells.items():
        for cell in notebook_cells:
            if not cell.compared:
                continue
            want = reference.get(notebook, {}).get(cell.index)
            got = run.get(notebook, {}).get(cell.index)
            if want != got:
                differences.append(f"{notebook} cell {cell.index}: {str(got)[:300]!r} != lone {str(want)[:300]!r}")
    return differences


# the kernel protocol over the server's websocket


def decode_frame(frame) -> dict:
    """One websocket message from the Jupyter server: JSON text, or the binary form for messages with buffers."""
    if isinstance(frame, str):
        return json.loads(frame)
    (count,) = struct.unpack("!I", frame[:4])
    offsets = struct.unpack(f"!{count}I", frame[4 : 4 * (count + 1)])
    end = offsets[1] if count > 1 else len(frame)
    return json.loads(frame[offsets[0] : end].decode())


def execute_request(code: str, session: str, username: str) -> dict:
    """A Jupyter execute_request on the shell channel."""
    return {
        "header": {
            "msg_id": uuid.uuid4().hex,
            "username": username,
            "session": session,
            "msg_type": "execute_request",
            "version": "5.3",
            "date": datetime.now(timezone.utc).isoformat(),
        },
        "parent_header": {},
        "metadata": {},
        "content": {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        },
        "channel": "shell",
        "buffers": [],
    }


# processes and memory


def proportional_memory(pid: int) -> dict:
    """Resident and proportional set size of a process in bytes (Linux /proc/PID/smaps_rollup; zeros if gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {"rss": 0, "pss": 0}
    found = dict(re.findall(r"^(Rss|Pss):\s+(\d+) kB", text, re.MULTILINE))
    return {"rss": int(found.get("Rss", 0)) * 1024, "pss": int(found.get("Pss", 0)) * 1024}


def processes_of(uid: int) -> dict:
    """The server and kernel processes of a user: {"server": [pids], "kernel": [pids]}."""
    import psutil

    found = {"server": [], "kernel": []}
    for process in psutil.process_iter(["pid", "uids", "cmdline"]):
        if process.info["uids"] is None or process.info["uids"].real != uid:
            continue
        command = " ".join(process.info["cmdline"] or [])
        if "ipykernel_launcher" in command:
            found["kernel"].append(process.info["pid"])
        elif "jupyterhub-singleuser" in command or "qwenvl_lab.course.lab" in command:
            found["server"].append(process.info["pid"])
    return found


def meminfo() -> dict:
    """/proc/meminfo's MemTotal and MemAvailable, in bytes."""
    found = dict(re.findall(r"^(MemTotal|MemAvailable):\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE))
    return {key: int(value) * 1024 for key, value in found.items()}


def machine() -> dict:
    """The machine the run is on: CPU model, cores, memory, load average now."""
    model = re.search(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
    return {
        "cpu": model.group(1).strip() if model else platform.processor(),
        "cores": os.cpu_count(),
        "memory_gib": round(meminfo()["MemTotal"] / 2**30, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def versions() -> dict:
    """Versions of what the class runs on."""
    found = {}
    for name in ("jupyterhub", "jupyterhub-idle-culler", "jupyterlab", "jupyter_server", "ipykernel", "torch"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def tree_state(root: Path) -> dict:
    """path → (size, mtime_ns) of every file and folder under `root` (links not followed), but its .git: git's own
    bookkeeping, which a clone made with hard links shares with the repository it came from."""
    state = {}
    for folder, dirs, files in os.walk(root):
        if folder == str(root):
            dirs[:] = [d for d in dirs if d != ".git"]
        for name in dirs + files:
            path = os.path.join(folder, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            state[os.path.relpath(path, root)] = (info.st_size if name in files else 0, info.st_mtime_ns)
    return state


def changes(before: dict, after: dict) -> list[str]:
    """What was added, removed or changed between two tree_state()s."""
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    return [f"added {p}" for p in added] + [f"removed {p}" for p in removed] + [f"changed {p}" for p in changed]


def git(*args, cwd: Path) -> str:
    """Run git in `cwd` (no user configuration needed); its output."""
    command = ["git", "-c", "user.name=class-load", "-c", "user.email=class-load@localhost", *args]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise LoadTestError(f"git {' '.join(args)} failed in {cwd}: {done.stderr.strip()[-500:]}")
    return done.stdout


def make_upstream(course: Path, folder: Path) -> tuple[Path, str]:
    """A stand-in for the course's upstream repository: the clone's tracked files as they are now, one commit on
    BRANCH, served as a bare repository under `folder` that every account can read; (the working copy that changes
    it, the bare repository's file:// URL)."""
    work, bare = folder / "upstream-work", folder / "upstream" / UPSTREAM
    work.mkdir(parents=True)
    for name in git("ls-files", "-z", cwd=course).split("\0"):
        source = course / name
        if name and (source.is_file() or source.is_symlink()):
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, work / name, follow_symlinks=False)
    git("init", "--quiet", "--initial-branch", BRANCH, cwd=work)
    git("add", "--all", cwd=work)
    git("commit", "--quiet", "-m", "the course, as the clone holds it", cwd=work)
    git("clone", "--quiet", "--bare", str(work), str(bare), cwd=folder)
    git("remote", "add", "origin", str(bare), cwd=work)
    for path in [bare.parent, *bare.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o005 | (0o001 if path.is_dir() else 0))
    bare.chmod(0o755)
    return work, f"file://{bare}"


def trust_upstream(users: dict, homes: Path, repository: str) -> None:
    """Let each learner's git read the upstream, which root owns (git refuses a repository of another owner on this
    machine; a real upstream is a server, https://…): safe.directory in each learner's own ~/.gitconfig."""
    bare = repository.removeprefix("file://")
    for name, uid in users.items():
        config = homes / name / ".gitconfig"
        config.write_text(f"[safe]\n\tdirectory = {bare}\n")
        os.chown(config, uid, pwd.getpwuid(uid).pw_gid)


def change_upstream(work: Path, number: int) -> str:
    """Push a markdown cell appended to EDITED_NOTEBOOK upstream, as a fix pushed between sessions would come; the
    cell's text."""
    import nbformat

    path = work / EDITED_NOTEBOOK
    notebook = nbformat.read(path, as_version=4)
    text = f"Upstream change {number}: pushed after the learners' first pull (class load test)."
    notebook.cells.append(nbformat.v4.new_markdown_cell(text))
    nbformat.write(notebook, path)
    git("commit", "--quiet", "-am", f"upstream change {number}", cwd=work)
    git("push", "--quiet", "origin", BRANCH, cwd=work)
    for path in (work.parent / "upstream").rglob("*"):  # the objects the push added: readable by the learners
        path.chmod(path.stat().st_mode | 0o004 | (0o001 if path.is_dir() else 0))
    return text


def pull_query(repository: str) -> str:
    """The query of nbgitpuller's link for the upstream: pull BRANCH, open EDITED_NOTEBOOK in JupyterLab."""
    return urllib.parse.urlencode(
        {"repo": repository, "branch": BRANCH, "urlpath": f"lab/tree/{UPSTREAM}/{EDITED_NOTEBOOK}"}
    )


def pull_events(body: str) -> list[dict]:
    """The events of nbgitpuller's event stream (`data: {json}` lines)."""
    return [json.loads(line[len("data: ") :]) for line in body.splitlines() if line.startswith("data: ")]


def merged(notebook: dict, note: str, upstream_text: str) -> dict:
    """Whether a learner's notebook (its JSON) after a pull kept the learner's edit and holds the upstream's cell."""
    sources = ["".join(cell["source"]) for cell in notebook["cells"]]
    return {"kept_edit": any(s.startswith(note) for s in sources), "got_update": upstream_text in sources}


def blocked_for_learners(course: Path, python: Path) -> str | None:
    """Why the learners' servers could not run the shared install, or None: the clone must be readable by every
    account, and so must the interpreter its .venv links to, which may live elsewhere (a pyenv under /root)."""
    blocked = readable_by_all(course)
    if blocked:
        return (
            f"other accounts cannot read {', '.join(blocked)}: the course must be readable by every learner "
            f"(chmod o+rx on those folders, or clone it where every account can read, e.g. /opt)"
        )
    real = python.resolve()
    blocked = readable_by_all(real)
    if blocked:
        return (
            f"the course's {python} is a link to {real}, inside {', '.join(blocked)}, which other accounts cannot "
            "enter: the learners' servers could not start that Python. Make the course's .venv from a Python every "
            "account can read (the system's /usr/bin/python3.X, or one installed under /opt or /usr/local): "
            "make clean-all && make setup PYTHON=/usr/bin/python3.12"
        )
    return None


def readable_by_all(path: Path) -> list[str]:
    """The folders on the way to `path` (and `path`) that other accounts cannot enter or read."""
    blocked = []
    for part in [*reversed(path.parents), path]:
        mode = part.stat().st_mode
        if not mode & 0o005 == 0o005:
            blocked.append(str(part))
    return blocked


# the hub


@dataclass
class Hub:
    """A JupyterHub started for the run: its URL, process, log and working folder."""

    url: str
    process: subprocess.Popen
    log: Path
    folder: Path


def hub_config(folder: Path, course: Path, users: list[str], password: str, port: int, proxy: str) -> Path:
    """The load test's hub config: the instructor's, then loopback addresses, a password for the simulated learners,
    and the run's own database and secrets."""
    config = folder / "jupyterhub_config.py"
    config.write_text(
        "\n".join(
            [
                f"load_subconfig({str(course / HUB_CONFIG)!r})",
                "c = get_config()",
                f"c.JupyterHub.bind_url = 'http://{HOST}:{port}'",
                f"c.JupyterHub.hub_ip = {HOST!r}",
                f"c.JupyterHub.hub_port = {free_port()}",
                f"c.ConfigurableHTTPProxy.api_url = 'http://{HOST}:{free_port()}'",
                f"c.ConfigurableHTTPProxy.command = [{proxy!r}]",
                "c.JupyterHub.authenticator_class = 'dummy'",
                f"c.DummyAuthenticator.password = {password!r}",
                f"c.Authenticator.allowed_users = {set(users)!r}",
                f"c.JupyterHub.db_url = 'sqlite:///{folder / 'hub.sqlite'}'",
                f"c.JupyterHub.cookie_secret_file = {str(folder / 'cookie_secret')!r}",
                f"c.JupyterHub.pid_file = {str(folder / 'hub.pid')!r}",
                "c.Spawner.ip = '127.0.0.1'",
                "",
            ]
        )
    )
    return config


def start_hub(folder: Path, config: Path, course: Path, port: int, repository: str, timeout_s: float = 120) -> Hub:
    """Start JupyterHub with `config` (the learners pulling from `repository`) and wait until it answers."""

    env = {
        "PATH": os.pathsep.join([str(course / ".venv" / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),
        "LANG": "C.UTF-8",
        "QWENVL_LAB_COURSE": str(course),
        "QWENVL_LAB_REPOSITORY": repository,
        "QWENVL_LAB_BRANCH": BRANCH,
        "HOME": str(folder),
        "PYTHONDONTWRITEBYTECODE": "1",  # the hub runs as root: it must not write into the course either
    }
    log = folder / "hub.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=folder, env=env, stdout=out, stderr=out
        )
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LoadTestError(f"JupyterHub stopped (exit {process.returncode}): {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/hub/health", timeout=5):
                return Hub(url, process, log, folder)
        except OSError:
            time.sleep(0.5)
    process.terminate()
    raise LoadTestError(f"JupyterHub did not answer within {timeout_s:g} s: {log.read_text()[-2000:]}")


def stop_hub(hub: Hub) -> None:
    """Stop the hub (it stops the learners' servers and its proxy)."""
    hub.process.send_signal(signal.SIGTERM)
    try:
        hub.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        hub.process.kill()
        hub.process.wait()


def make_users(names: list[str], homes: Path) -> dict:
    """System users for the simulated learners (home folders under `homes`); name → uid."""
    made = {}
    for name in names:
        subprocess.run(
            ["useradd", "--create-home", "--home-dir", str(homes / name), "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )
        made[name] = pwd.getpwnam(name).pw_uid
    return made


def remove_users(users: dict) -> None:
    """End every process of the run's users (by pid), then remove the users and their homes."""
    import psutil

    for name, uid in users.items():
        for process in psutil.process_iter(["pid", "uids"]):
            if process.info["uids"] is not None and process.info["uids"].real == uid:
                try:
                    process.kill()
                except psutil.Error:
                    pass
        subprocess.run(["userdel", "--remove", name], capture_output=True)


# one learner


@dataclass
class Learner:
    """One simulated learner's session and what was measured."""

    name: str
    uid: int
    home: Path
    seed: int
    token: str = ""
    login_s: float = 0.0
    spawn_s: float = 0.0
    latencies: dict = field(default_factory=dict)  # notebook → [seconds per code cell]
    outputs: dict = field(default_factory=dict)  # notebook → cell index → [text outputs]
    errors: list = field(default_factory=list)
    kernel_cpu_s: dict = field(default_factory=dict)  # notebook → the kernel's CPU seconds
    peaks: dict = field(default_factory=lambda: {"server_rss": 0, "server_pss": 0, "kernel_rss": 0, "kernel_pss": 0})
    notebook: str = ""  # the notebook whose kernel runs now
    notebook_peaks: dict = field(default_factory=dict)  # notebook → peaks while it ran, as `peaks`
    pulls: list = field(default_factory=list)  # each pull through nbgitpuller's link: seconds, its end
    merge: dict = field(default_factory=dict)  # after the second pull: kept_edit, got_update


@dataclass
class PullRound:
    """The upstream change between the learners' two pulls: pushed once every learner has pulled and edited."""

    work: Path
    repository: str  # the upstream's URL, as the link names it
    number: int
    waiting: int
    pulled: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    text: str = ""

    def arrive(self) -> None:
        """One learner has pulled and edited (or given up before)."""
        self.waiting -= 1
        if self.waiting <= 0:
            self.pulled.set()

    async def change_when_pulled(self) -> None:
        """Push the upstream change once every learner has arrived."""
        await self.pulled.wait()
        self.text = change_upstream(self.work, self.number)
        self.changed.set()


class Client:
    """HTTP calls of one learner to the hub and their server (tornado), with cookies kept."""

    def __init__(self, base: str):
        from tornado.httpclient import AsyncHTTPClient

        self.base, self.http, self.cookies = base, AsyncHTTPClient(), {}

    def _headers(self, token: str = "", xsrf: bool = False) -> dict:
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}
        if token:
            headers["Authorization"] = f"token {token}"
        if xsrf and "_xsrf" in self.cookies:
            headers["X-XSRFToken"] = self.cookies["_xsrf"]
        return headers

    async def call(self, method: str, path: str, body=None, token: str = "", form=None, expect=(200,)):
        """One request; the decoded JSON answer (None when empty)."""
        from tornado.httpclient import HTTPClientError

        headers = self._headers(token, xsrf=method != "GET")
        if form is not None:
            data = urllib.parse.urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        else:
            data = None if body is None else json.dumps(body)
            headers["Content-Type"] = "application/json"
        try:
            response = await self.http.fetch(
                self.base + path,
                method=method,
                body=data if method in ("POST", "PUT", "PATCH") else None,
                headers=headers,
                follow_redirects=False,
                request_timeout=120,
                allow_nonstandard_methods=True,
            )
        except HTTPClientError as err:
            response = err.response
            if response is None or response.code not in expect:
                raise LoadTestError(f"{method} {path}: {err}") from None
        for cookie in response.headers.get_list("Set-Cookie"):
            key, _, value = cookie.split(";", 1)[0].partition("=")
            self.cookies[key.strip()] = value.strip()
        if response.code not in expect:
            raise LoadTestError(f"{method} {path}: HTTP {response.code} {response.body[:300]!r}")
        return json.loads(response.body) if response.body and response.body[:1] in b"[{" else None

    async def open_page(self, path: str, limit: int = 12) -> str:
        """GET `path` as a browser does, following redirects (the hub's, the server's OAuth round trip) with the
        cookies they set; the path of the page it ends on."""
        from tornado.httpclient import HTTPClientError

        for _ in range(limit):
            try:
                response = await self.http.fetch(
                    self.base + path, headers=self._headers(), follow_redirects=False, request_timeout=PULL_TIMEOUT_S
                )
            except HTTPClientError as err:
                response = err.response
                if response is None or response.code not in (301, 302, 303, 307):
                    raise LoadTestError(f"GET {path}: {err}") from None
            for cookie in response.headers.get_list("Set-Cookie"):
                key, _, value = cookie.split(";", 1)[0].partition("=")
                self.cookies[key.strip()] = value.strip()
            if response.code == 200:
                return path
            location = urllib.parse.urlsplit(urllib.parse.urljoin(self.base + path, response.headers["Location"]))
            path = urllib.parse.urlunsplit(("", "", location.path, location.query, ""))
        raise LoadTestError(f"more than {limit} redirects opening {path}")

    async def stream(self, path: str, token: str) -> str:
        """GET `path` with the token and return the whole body (an event stream that ends when its work is done)."""
        from tornado.httpclient import HTTPClientError

        try:
            response = await self.http.fetch(
                self.base + path, headers=self._headers(token), request_timeout=PULL_TIMEOUT_S
            )
        except HTTPClientError as err:
            raise LoadTestError(f"GET {path}: {err}") from None
        return response.body.decode()


async def pull_through_link(learner: Learner, client: Client, repository: str) -> None:
    """Open nbgitpuller's link as the learner's browser does, through the hub's user-redirect to the learner's
    server, then make the pull its page starts (the page's event stream) and wait for nbgitpuller's last word."""
    query = pull_query(repository)
    start = time.monotonic()
    landed = await client.open_page(f"/hub/user-redirect/git-pull?{query}")
    if not landed.startswith(f"/user/{learner.name}/git-pull?"):
        raise LoadTestError(f"{learner.name}: nbgitpuller's link ended on {landed}, not the pull's page")
    events = pull_events(await client.stream(f"/user/{learner.name}/git-pull/api?{query}", learner.token))
    last = events[-1] if events else {"phase": "none"}
    learner.pulls.append({"seconds": round(time.monotonic() - start, 2), "phase": last["phase"]})
    if last["phase"] != "finished":
        raise LoadTestError(f"{learner.name}: nbgitpuller ended with {last.get('message', last['phase'])!r}")


async def edit_first_code_cell(learner: Learner, client: Client) -> str:
    """Save an edit of the learner's own to the first code cell of their EDITED_NOTEBOOK, as JupyterLab would;
    the line added."""
    path = urllib.parse.quote(f"{UPSTREAM}/{EDITED_NOTEBOOK}")
    base = f"/user/{learner.name}/api/contents/{path}"
    model = await client.call("GET", base, token=learner.token)
    note = f"{EDIT_MARK} {learner.name}"
    cell = next((c for c in model["content"]["cells"] if c["cell_type"] == "code"), None)
    if cell is None:
        raise LoadTestError(f"{EDITED_NOTEBOOK} has no code cell to edit")
    cell["source"] = f"{note}\n{''.join(cell['source'])}"
    await client.call(
        "PUT", base, {"type": "notebook", "format": "json", "content": model["content"]}, token=learner.token
    )
    return note


async def check_second_pull(learner: Learner, client: Client, note: str, upstream_text: str) -> None:
    """After the second pull: the learner's edit is still there and the upstream's new cell has arrived."""
    path = urllib.parse.quote(f"{UPSTREAM}/{EDITED_NOTEBOOK}")
    model = await client.call("GET", f"/user/{learner.name}/api/contents/{path}", token=learner.token)
    learner.merge = merged(model["content"], note, upstream_text)
    if not all(learner.merge.values()):
        learner.errors.append(f"the second pull: {learner.merge} (the edit must stay, the upstream's cell arrive)")


async def log_in_and_start(learner: Learner, hub: str, password: str) -> Client:
    """Log in through the hub's login form, take an API token, start the learner's server and wait until it is up."""
    client = Client(hub)
    start = time.monotonic()
    await client.call("GET", "/hub/login")  # sets the _xsrf cookie
    await client.call(
        "POST",
        "/hub/login",
        form={"username": learner.name, "password": password, "_xsrf": client.cookies.get("_xsrf", "")},
        expect=(302,),
    )
    reply = await client.call(
        "POST", f"/hub/api/users/{learner.name}/tokens", {"note": "class-load", "expires_in": 7200}, expect=(200, 201)
    )
    learner.token, learner.login_s = reply["token"], time.monotonic() - start
    start = time.monotonic()
    await client.call("POST", f"/hub/api/users/{learner.name}/server", {}, token=learner.token, expect=(201, 202))
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while time.monotonic() < deadline:
        user = await client.call("GET", f"/hub/api/users/{learner.name}", token=learner.token)
        if user["servers"].get("", {}).get("ready"):
            learner.spawn_s = time.monotonic() - start
            return client
        await asyncio.sleep(0.5)
    raise LoadTestError(f"{learner.name}'s server did not start within {SPAWN_TIMEOUT_S} s")


async def run_notebook(learner: Learner, client: Client, hub: str, notebook: str, think_s: float, rng) -> None:
    """Open the learner's copy of `notebook`, run its code cells one by one through the kernel's websocket, then shut
    its kernel down (one notebook open at a time, as the workshop plan asks)."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    base = f"/user/{learner.name}"
    listing = await client.call("GET", f"{base}/api/contents/{UPSTREAM}/{COURSE_FOLDER}", token=learner.token)
    (path,) = [item["path"] for item in listing["content"] if item["name"].startswith(notebook + "_")]
    model = await client.call("GET", f"{base}/api/contents/{urllib.parse.quote(path)}", token=learner.token)
    cells = code_cells(model["content"])
    session = await client.call(
        "POST",
        f"{base}/api/sessions",
        {"path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}},
        token=learner.token,
        expect=(201,),
    )
    kernel, session_id = session["kernel"]["id"], uuid.uuid4().hex
    ws_url = hub.replace("http://", "ws://") + f"{base}/api/kernels/{kernel}/channels?session_id={session_id}"
    socket_ = await websocket_connect(
        HTTPRequest(ws_url, headers={"Authorization": f"token {learner.token}"}), max_message_size=2**30
    )
    latencies, outputs = learner.latencies.setdefault(notebook, []), learner.outputs.setdefault(notebook, {})
    learner.notebook = notebook
    try:
        for cell in cells:
            await asyncio.sleep(think_s * rng.uniform(0.5, 1.5))
            request = execute_request(cell.source, session_id, learner.name)
            msg_id, texts, replied, idle, failed = request["header"]["msg_id"], [], False, False, None
            start = time.monotonic()
            await socket_.write_message(json.dumps(request))
            while not (replied and idle):
                frame = await asyncio.wait_for(socket_.read_message(), CELL_TIMEOUT_S)
                if frame is None:
                    raise LoadTestError(f"{learner.name} {notebook} cell {cell.index}: the kernel's websocket closed")
                message = decode_frame(frame)
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = message["header"]["msg_type"]
                if kind == "status" and message["content"]["execution_state"] == "idle":
                    idle = True
                elif kind == "execute_reply":
                    replied = True
                    if message["content"]["status"] != "ok":
                        failed = message["content"].get("ename", message["content"]["status"])
                elif kind == "clear_output":
                    texts.clear()
                else:
                    add_output(texts, message)
            latencies.append(time.monotonic() - start)
            outputs[cell.index] = normalized(texts, str(learner.home))
            if failed and not cell.raises:
                learner.errors.append(
                    f"{notebook} cell {cell.index}: {failed}: {' '.join(text for _, text in texts)[-300:]}"
                )
            if cell.raises and not failed:
                learner.errors.append(f"{notebook} cell {cell.index}: expected an error, none came")
        learner.kernel_cpu_s[notebook] = kernel_cpu_seconds(learner.uid)
    finally:
        learner.notebook = ""
        socket_.close()
        await client.call("DELETE", f"{base}/api/sessions/{session['id']}", token=learner.token, expect=(204,))


def kernel_cpu_seconds(uid: int) -> float:
    """CPU seconds (user + system) used so far by the user's kernel processes."""
    import psutil

    total = 0.0
    for pid in processes_of(uid)["kernel"]:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return round(total, 2)


async def run_learner(
    learner: Learner, hub: str, password: str, notebooks, think_s: float, delay_s: float, upstream: PullRound
):
    """One learner's whole session: log in, start the server, pull the course through nbgitpuller's link and edit a
    cell, run each notebook, pull again once the upstream has changed (the edit must stay), stop the server."""
    await asyncio.sleep(delay_s)
    rng, arrived = random.Random(learner.seed), False
    try:
        client = await log_in_and_start(learner, hub, password)
        await pull_through_link(learner, client, upstream.repository)
        note = await edit_first_code_cell(learner, client)
        upstream.arrive()
        arrived = True
        for notebook in notebooks:
            await run_notebook(learner, client, hub, notebook, think_s, rng)
        await asyncio.wait_for(upstream.changed.wait(), PULL_TIMEOUT_S)
        await pull_through_link(learner, client, upstream.repository)
        await check_second_pull(learner, client, note, upstream.text)
        await client.call("DELETE", f"/hub/api/users/{learner.name}/server", token=learner.token, expect=(202, 204))
    except (LoadTestError, OSError, asyncio.TimeoutError, KeyError, ValueError) as err:
        learner.errors.append(f"{type(err).__name__}: {err}")
    finally:
        if not arrived:
            upstream.arrive()


def with_descendants(pids: list[int]) -> list[int]:
    """`pids` and every process they started (a notebook's kernel may start Python processes of its own)."""
    import psutil

    found = list(pids)
    for pid in pids:
        try:
            found += [child.pid for child in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            continue
    return sorted(set(found))


async def sample_memory(learners: list[Learner], stop: asyncio.Event, system: dict, every_s: float) -> None:
    """Every `every_s`: each learner's server memory and that of their kernel with the processes it started (peaks
    kept, in all and per notebook), and the machine's."""
    while not stop.is_set():
        for learner in learners:
            found = processes_of(learner.uid)
            found["kernel"] = with_descendants(found["kernel"])
            now = {}
            for role in ("server", "kernel"):
                used = [proportional_memory(pid) for pid in found[role]]
                for kind in ("rss", "pss"):
                    now[f"{role}_{kind}"] = sum(u[kind] for u in used)
            for key, value in now.items():
                learner.peaks[key] = max(learner.peaks[key], value)
            if learner.notebook:
                peaks = learner.notebook_peaks.setdefault(learner.notebook, dict.fromkeys(now, 0))
                for key, value in now.items():
                    peaks[key] = max(peaks[key], value)
        now = meminfo()
        system["min_available"] = min(system.get("min_available", now["MemAvailable"]), now["MemAvailable"])
        system["max_load_1min"] = max(system.get("max_load_1min", 0.0), os.getloadavg()[0])
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except asyncio.TimeoutError:
            pass


@dataclass(frozen=True)
class Run:
    """What every learner of one run does: the notebooks, the think time, the stagger, the limit, how often memory
    is sampled, and the upstream (its working copy, URL, and the number of the change it gets in this run)."""

    notebooks: tuple
    think_s: float
    stagger_s: float
    limit_s: float
    sample_s: float
    upstream: tuple  # (working copy, URL, change number)


async def run_class(learners, hub: str, password: str, run: Run):
    """Every learner at once (each starting `stagger_s` after the one before), memory sampled throughout."""
    from tornado.httpclient import AsyncHTTPClient

    AsyncHTTPClient.configure(None, max_clients=4 * len(learners) + 8)
    stop, system = asyncio.Event(), {}
    upstream = PullRound(*run.upstream, waiting=len(learners))
    changer = asyncio.ensure_future(upstream.change_when_pulled())
    sampler = asyncio.ensure_future(sample_memory(learners, stop, system, run.sample_s))
    start = time.monotonic()
    try:
        await asyncio.wait_for(
            asyncio.gather(
                *(
                    run_learner(learner, hub, password, run.notebooks, run.think_s, i * run.stagger_s, upstream)
                    for i, learner in enumerate(learners)
                )
            ),
            run.limit_s,
        )
    except asyncio.TimeoutError:
        for learner in learners:
            learner.errors.append(f"the run passed --time-limit ({run.limit_s:g} s)")
    stop.set()
    changer.cancel()
    await sampler
    system["seconds"] = round(time.monotonic() - start, 1)
    return system


def learner_report(learner: Learner, differences: list[str]) -> dict:
    """What one learner's run measured, for the JSON."""
    every = [s for notebook in learner.latencies.values() for s in notebook]
    return {
        "name": learner.name,
        "login_s": round(learner.login_s, 3),
        "server_start_s": round(learner.spawn_s, 2),
        "latency": latency_summary(every),
        "latency_by_notebook": {nb: latency_summary(values) for nb, values in learner.latencies.items()},
        "first_cell_s": {nb: round(values[0], 3) for nb, values in learner.latencies.items() if values},
        "kernel_cpu_s": learner.kernel_cpu_s,
        "peak_memory_gib": {key: round(value / 2**30, 3) for key, value in learner.peaks.items()},
        "peak_memory_by_notebook_gib": {
            nb: {key: round(value / 2**30, 3) for key, value in peaks.items()}
            for nb, peaks in learner.notebook_peaks.items()
        },
        "pulls": learner.pulls,
        "second_pull": learner.merge,
        "errors": learner.errors,
        "output_differences": differences,
    }


def busiest_cells(learner: Learner, cells: dict, count: int = 5) -> list[dict]:
    """The `count` slowest cells of a run (notebook, cell index, seconds, first source line)."""
    rows = [
        (seconds, notebook, cell)
        for notebook, values in learner.latencies.items()
        for seconds, cell in zip(values, cells[notebook])
    ]
    return [
        {
            "notebook": nb,
            "cell": cell.index,
            "seconds": round(s, 3),
            "source": next((ln for ln in cell.source.splitlines() if ln.strip() and not ln.startswith("#")), "")[:80],
        }
        for s, nb, cell in sorted(rows, key=lambda row: -row[0])[:count]
    ]


def culler_settings(course: Path) -> dict:
    """The idle culler's and the kernels' culling settings, read from the instructor's config (the hub's file and
    the course's part)."""
    text = (course / HUB_CONFIG).read_text() + (course / COURSE_CONFIG).read_text()
    return {
        name.lower(): int(re.search(rf"^{name} = (\d+)", text, re.MULTILINE).group(1))
        for name in ("IDLE_TIMEOUT_S", "CULL_EVERY_S", "KERNEL_IDLE_TIMEOUT_S")
    }


def check_can_run(course: Path, proxy: str) -> None:
    """Refuse, saying why, where the load test cannot run."""
    if platform.system() != "Linux" or not hasattr(os, "geteuid") or os.geteuid() != 0:
        raise LoadTestError("the load test makes system users: run it as root on Linux")
    for command, package in (("useradd", "passwd"), ("userdel", "passwd"), ("git", "git")):
        if shutil.which(command) is None:
            raise LoadTestError(f"{command} is missing (Debian/Ubuntu: the {package} package)")
    if shutil.which(proxy) is None:
        raise LoadTestError(
            f"no configurable-http-proxy at {proxy!r}: npm install configurable-http-proxy (make class-load)"
        )
    for module in ("jupyterhub", "jupyterhub_idle_culler", "nbgitpuller", "tornado", "psutil"):
        if importlib.util.find_spec(module) is None:
            raise LoadTestError(f"{module} is not installed: pip install -e '.[course,hub]' (make class-load does)")
    python = course / ".venv" / "bin" / "python"
    if not python.exists():
        raise LoadTestError(f"the learners' servers run {python}: make setup first, in {course}")
    problem = blocked_for_learners(course, python)
    if problem is not None:
        raise LoadTestError(problem)


def save_result(path: Path, result: dict, overwrite: bool = False) -> None:
    """Write the run's result as JSON to `path` (a new file, or with overwrite=True replacing one)."""
    qfiles.write_text(path, json.dumps(result, indent=2, ensure_ascii=False) + "\n", JSON_WRITER, overwrite=overwrite)


def main(argv=None) -> int:
    """Command line: run the lone learner, then the class, write the JSON; exit status 1 on errors or differences."""
    parser = argparse.ArgumentParser(prog="python tools/classload.py", description=__doc__.split("\n")[0])
    parser.add_argument("--learners", type=int, default=4, help="simulated learners at once (default: %(default)s)")
    parser.add_argument(
        "--notebooks", nargs="+", default=list(NOTEBOOKS), help="the class's notebooks (default: %(default)s)"
    )
    parser.add_argument(
        "--lone-notebooks",
        nargs="+",
        default=list(EVERY_NOTEBOOK),
        help="the lone learner's, for each notebook's memory; they include the class's (default: %(default)s)",
    )
    parser.add_argument("--think", type=float, default=2.0, help="mean seconds between cells (default: %(default)s)")
    parser.add_argument(
        "--stagger", type=float, default=5.0, help="seconds between learners' logins (default: %(default)s)"
    )
    parser.add_argument(
        "--time-limit", type=float, default=3600, help="the whole run's limit in seconds (default: %(default)s)"
    )
    parser.add_argument("--proxy", default="configurable-http-proxy", help="the proxy command (default: from PATH)")
    parser.add_argument("--json", type=Path, help="write the results here (a new file, or --overwrite)")
    parser.add_argument("--overwrite", action="store_true", help="replace the --json file if it exists")
    args = parser.parse_args(argv)
    if not 1 <= args.learners <= 32 or args.think < 0 or args.time_limit <= 0:
        parser.error("--learners must be 1-32, --think >= 0 and --time-limit > 0")
    if args.json is not None:
        try:  # checked before the class runs, not after
            qfiles.check_destination(args.json, JSON_WRITER, folder=False, overwrite=args.overwrite, need_bytes=2**20)
        except (OSError, ValueError) as err:
            parser.error(f"--json {str(args.json)!r}: {err}")
    course = checkout_dir()
    if course is None:
        parser.error("run it from a clone of the course (its docs/jupyterhub/ config and notebooks/)")
    try:
        check_can_run(course, args.proxy)
    except LoadTestError as err:
        parser.error(str(err))
    lone_notebooks = list(dict.fromkeys(args.lone_notebooks + args.notebooks))  # the class's compared with the lone's
    notebook_files = {nb: next((course / COURSE_FOLDER).glob(f"{nb}_*.ipynb"), None) for nb in lone_notebooks}
    missing = [nb for nb, path in notebook_files.items() if path is None]
    if missing:
        parser.error(f"no course notebook {', '.join(missing)}")
    cells = {nb: code_cells(json.loads(path.read_text(encoding="utf-8"))) for nb, path in notebook_files.items()}

    folder = Path(tempfile.mkdtemp(prefix="qwenvl-class-"))
    folder.chmod(0o755)
    (folder / "home").mkdir(mode=0o755)
    tag = secrets.token_hex(2)
    names = [f"qwl{tag}-lone"] + [f"qwl{tag}-{i + 1}" for i in range(args.learners)]
    password, port = secrets.token_urlsafe(12), free_port()
    started = machine()
    users, hub = {}, None
    try:
        work, repository = make_upstream(course, folder)
        users = make_users(names, folder / "home")
        trust_upstream(users, folder / "home", repository)
        config = hub_config(folder, course, names, password, port, os.path.abspath(shutil.which(args.proxy)))
        hub = start_hub(folder, config, course, port, repository)
        before = tree_state(course)  # from here on only the learners' servers run the course
        home = lambda name: folder / "home" / name  # noqa: E731 (each server's root: nbgitpuller clones into it)
        lone = Learner(names[0], users[names[0]], home(names[0]), seed=0)
        print(f"the lone learner: notebooks {' '.join(lone_notebooks)}, think time {args.think:g} s", flush=True)
        alone = Run(tuple(lone_notebooks), args.think, 0, args.time_limit, LONE_SAMPLE_EVERY_S, (work, repository, 1))
        lone_system = asyncio.run(run_class([lone], hub.url, password, alone))
        learners = [Learner(n, users[n], home(n), seed=i + 1) for i, n in enumerate(names[1:])]
        print(f"the class: {len(learners)} learners, {args.stagger:g} s apart", flush=True)
        idle = meminfo()["MemAvailable"]
        together = Run(
            tuple(args.notebooks), args.think, args.stagger, args.time_limit, SAMPLE_EVERY_S, (work, repository, 2)
        )
        system = asyncio.run(run_class(learners, hub.url, password, together))
    except LoadTestError as err:
        print(f"class-load: {err}", file=sys.stderr)
        return 1
    finally:
        if hub is not None:
            stop_hub(hub)
        remove_users(users)
        hub_log = (folder / "hub.log").read_text(errors="replace")[-4000:] if (folder / "hub.log").exists() else ""
        shutil.rmtree(folder, ignore_errors=True)
    written = changes(before, tree_state(course))
    class_cells = {nb: cells[nb] for nb in args.notebooks}
    reports = [learner_report(lr, compare_outputs(lone.outputs, lr.outputs, class_cells)) for lr in learners]
    lone_report = learner_report(lone, [])
    every_class = [s for lr in learners for nb in lr.latencies.values() for s in nb]
    every_lone = [s for nb in args.notebooks for s in lone.latencies.get(nb, [])]  # the same cells as the class's
    kernel_peaks = [lr.peaks["kernel_pss"] + lr.peaks["server_pss"] for lr in learners]
    result = {
        "kind": "qwenvl-lab class load test",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python tools/classload.py " + " ".join(sys.argv[1:] if argv is None else map(str, argv)),
        "machine": started,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "versions": versions(),
        "settings": {
            "learners": args.learners,
            "notebooks": args.notebooks,
            "lone_notebooks": lone_notebooks,
            "code_cells": sum(len(class_cells[nb]) for nb in args.notebooks),
            "lone_code_cells": sum(len(c) for c in cells.values()),
            "notebooks_from": "nbgitpuller's link (through the hub's user-redirect) to a bare git repository on this "
            "machine holding the clone's tracked files; a second pull after an upstream change",
            "memory_samples_s": {"lone": LONE_SAMPLE_EVERY_S, "class": SAMPLE_EVERY_S},
            "think_s": args.think,
            "stagger_s": args.stagger,
            "spawner": "LocalProcessSpawner (system users), DummyAuthenticator with a password",
            "culling": culler_settings(course),
        },
        "lone": {
            **lone_report,
            "latency_of_class_notebooks": latency_summary(every_lone),
            "busiest_cells": busiest_cells(lone, cells),
            "seconds": lone_system["seconds"],
        },
        "class": {
            "seconds": system["seconds"],
            "latency": latency_summary(every_class),
            "latency_vs_lone": {
                "median": round(statistics.median(every_class) / statistics.median(every_lone), 2)
                if every_class and every_lone
                else None,
                "p95": round(percentile(every_class, 95) / percentile(every_lone, 95), 2)
                if every_class and every_lone
                else None,
            },
            "errors": sum(len(r["errors"]) for r in reports),
            "second_pulls_kept_edit_and_got_update": sum(
                all(r["second_pull"].values()) for r in reports if r["second_pull"]
            ),
            "output_differences": sum(len(r["output_differences"]) for r in reports),
            "peak_memory_per_learner_gib": round(max(kernel_peaks) / 2**30, 3) if kernel_peaks else None,
            "machine_memory_used_at_peak_gib": round((idle - system["min_available"]) / 2**30, 2),
            "max_load_1min": round(system["max_load_1min"], 2),
        },
        "shared_install_unchanged": not written,
        "shared_install_changes": written[:50],
        "learners": reports,
    }
    if args.json is not None:
        save_result(args.json, result, args.overwrite)
    print(format_summary(result))
    if result["class"]["errors"] or result["class"]["output_differences"] or written or lone_report["errors"]:
        print("hub log (end):\n" + hub_log if result["class"]["errors"] else "", file=sys.stderr)
        return 1
    return 0


def format_summary(result: dict) -> str:
    """A few lines for the terminal."""
    lone, klass = result["lone"], result["class"]
    lines = [
        f"machine: {result['machine']['cpu']}, {result['machine']['cores']} cores, {result['machine']['memory_gib']} GiB, "
        f"load average at start {result['machine']['load_average']}",
        f"lone learner: {lone['latency']['cells']} cells, median {lone['latency']['median_s']} s, "
        f"p95 {lone['latency']['p95_s']} s; peak memory {lone['peak_memory_gib']}; errors {len(lone['errors'])}",
        f"class of {result['settings']['learners']}: median {klass['latency']['median_s']} s "
        f"(x{klass['latency_vs_lone']['median']}), p95 {klass['latency']['p95_s']} s (x{klass['latency_vs_lone']['p95']}); "
        f"errors {klass['errors']}, output differences {klass['output_differences']}; "
        f"peak memory per learner {klass['peak_memory_per_learner_gib']} GiB (PSS), machine {klass['machine_memory_used_at_peak_gib']} GiB",
        f"nbgitpuller: {klass['second_pulls_kept_edit_and_got_update']} of {result['settings']['learners']} learners "
        f"kept their edit and got the upstream's new cell on the second pull (alone: {lone['second_pull']})",
        f"shared install unchanged: {result['shared_install_unchanged']}",
    ]
    for report in result["learners"]:
        for problem in (report["errors"] + report["output_differences"])[:5]:
            lines.append(f"  {report['name']}: {problem}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
