"""The class load test's parts (`python tools/classload.py`): statistics, notebooks' cells and outputs, the kernel
protocol's frames, the shared install's snapshot, the hub's configuration. The whole run is `make class-load`."""

import json
import os
import struct
import urllib.parse
from pathlib import Path

import pytest
import yaml
from traitlets.config.loader import PyFileConfigLoader

from tools import classload

REPO = Path(__file__).resolve().parents[1]


def test_percentiles_and_summary():
    assert classload.percentile([3, 1, 2, 4], 50) == 2.5
    assert classload.percentile(list(range(101)), 95) == 95
    assert classload.percentile([7], 95) == 7
    summary = classload.latency_summary([0.1, 0.2, 0.3, 10.0])
    assert summary == {"cells": 4, "median_s": 0.25, "p95_s": 8.545, "max_s": 10.0}
    assert classload.latency_summary([])["median_s"] is None


def test_code_cells_know_which_outputs_are_compared():
    notebook = {
        "cells": [
            {"cell_type": "markdown", "source": ["# t"], "metadata": {}},
            {"cell_type": "code", "source": ["# NBVAL_IGNORE_OUTPUT\n", "x"], "metadata": {}},
            {"cell_type": "code", "source": ["1/0"], "metadata": {"tags": ["raises-exception"]}},
        ]
    }
    cells = classload.code_cells(notebook)
    assert [(c.index, c.compared, c.raises) for c in cells] == [(1, False, False), (2, True, True)]


def message(kind: str, **content) -> dict:
    return {"header": {"msg_type": kind}, "content": content}


def test_outputs_join_streams_as_a_notebook_stores_them():
    outputs = []
    for msg in (
        message("stream", name="stdout", text="a"),
        message("stream", name="stdout", text="b\n"),
        message("stream", name="stderr", text="w"),
        message("execute_result", data={"text/plain": "42", "image/png": "…"}),
        message("stream", name="stdout", text="c"),
        message("error", ename="ValueError", evalue="bad"),
        message("status", execution_state="idle"),
    ):
        classload.add_output(outputs, msg)
    assert classload.normalized(outputs, "/home/x") == [
        "stdout: ab\n",
        "stderr: w",
        "result: 42",
        "stdout: c",
        "error: ValueError: bad",
    ]
    assert classload.normalized([["stdout", "/home/x/course-output/e"]], "/home/x") == [
        "stdout: <workdir>/course-output/e"
    ]


def test_outputs_compared_with_the_lone_run_but_ignored_cells():
    cells = {"01": [classload.Cell(1, "a", True, False), classload.Cell(2, "b", False, False)]}
    lone = {"01": {1: ["stdout: 1"], 2: ["stdout: 0.51 s"]}}
    assert classload.compare_outputs(lone, {"01": {1: ["stdout: 1"], 2: ["stdout: 0.73 s"]}}, cells) == []
    (difference,) = classload.compare_outputs(lone, {"01": {1: ["stdout: 2"], 2: []}}, cells)
    assert difference.startswith("01 cell 1: ")
    assert classload.compare_outputs(lone, {}, cells) == ["01 cell 1: 'None' != lone \"['stdout: 1']\""]


def test_websocket_frames_text_and_binary():
    msg = {"header": {"msg_type": "comm_msg"}, "parent_header": {"msg_id": "m"}, "content": {}}
    assert classload.decode_frame(json.dumps(msg)) == msg
    body, buffer = json.dumps(msg).encode(), b"\x00\x01\x02"
    offsets = [12, 12 + len(body)]  # 4 bytes of count, 2 offsets of 4 bytes
    frame = struct.pack("!3I", 2, *offsets) + body + buffer
    assert classload.decode_frame(frame) == msg
    request = classload.execute_request("1 + 1", "s", "learner")
    assert request["channel"] == "shell" and request["content"]["code"] == "1 + 1"
    assert request["header"]["msg_type"] == "execute_request" and len(request["header"]["msg_id"]) == 32


def test_shared_install_snapshot_sees_every_change(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("a")
    before = classload.tree_state(tmp_path)
    assert classload.changes(before, classload.tree_state(tmp_path)) == []
    (tmp_path / "pkg" / "a.py").write_text("changed")
    os.utime(tmp_path / "pkg" / "a.py", ns=(1, 1))
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / ".git").mkdir()  # git's bookkeeping is not the install
    found = classload.changes(before, classload.tree_state(tmp_path))
    assert "changed pkg/a.py" in found and "added pkg/__pycache__" in found
    assert not any(".git" in change for change in found)


def test_readable_by_all(tmp_path):
    (tmp_path / "open").mkdir(mode=0o755)
    (tmp_path / "closed").mkdir(mode=0o700)
    (tmp_path / "closed").chmod(0o700)
    tmp_path.chmod(0o755)
    assert str(tmp_path / "closed") in classload.readable_by_all(tmp_path / "closed")
    assert str(tmp_path / "open") not in classload.readable_by_all(tmp_path / "open")


def test_a_venv_whose_python_learners_cannot_reach_is_named_as_the_cause(tmp_path, monkeypatch):
    """The course readable, its .venv's python a link into a folder closed to others (a pyenv under /root): the
    refusal names the interpreter and how to make the venv from a Python every account can read."""
    everyones = classload.readable_by_all  # pytest's own temporary folder is closed to others: only ours count
    monkeypatch.setattr(
        classload, "readable_by_all", lambda p: [b for b in everyones(p) if Path(b).is_relative_to(tmp_path)]
    )
    tmp_path.chmod(0o755)
    course, private = tmp_path / "course", tmp_path / "private"
    (course / ".venv" / "bin").mkdir(parents=True)
    (private / "bin").mkdir(parents=True)
    (private / "bin" / "python3.12").write_text("")
    (private / "bin" / "python3.12").chmod(0o755)
    private.chmod(0o700)
    for folder in (course, course / ".venv", course / ".venv" / "bin"):
        folder.chmod(0o755)
    python = course / ".venv" / "bin" / "python"
    python.symlink_to(private / "bin" / "python3.12")
    problem = classload.blocked_for_learners(course, python)
    assert f"the course's {python} is a link to {private / 'bin' / 'python3.12'}" in problem
    assert str(private) in problem and "make setup PYTHON=/usr/bin/python3" in problem
    assert "the course must be readable" not in problem
    private.chmod(0o755)
    assert classload.blocked_for_learners(course, python) is None
    course.chmod(0o700)
    assert "the course must be readable by every learner" in classload.blocked_for_learners(course, python)
    course.chmod(0o755)


INSTRUCTOR = REPO / classload.HUB_CONFIG
COURSE_PART = REPO / classload.COURSE_CONFIG


def load_config(path: Path):
    loader = PyFileConfigLoader(path.name, str(path.parent))
    return loader.load_config()


def test_the_instructors_config_runs_the_course_from_the_shared_install(monkeypatch):
    monkeypatch.setenv("QWENVL_LAB_COURSE", "/srv/course")
    monkeypatch.setenv("QWENVL_LAB_REPOSITORY", "https://github.com/owner/qwenvl-lab")
    config = load_config(INSTRUCTOR)
    cmd = config.Spawner.cmd
    assert cmd[:3] == ["/srv/course/.venv/bin/python", "-m", "qwenvl_lab.course.lab"]
    assert cmd[3:7] == ["--workdir", "~", "--no-copy", "--run"]
    assert cmd[-1] == "/srv/course/.venv/bin/jupyterhub-singleuser"
    link = urllib.parse.urlsplit(config.Spawner.default_url)
    assert link.path == "/git-pull"  # nbgitpuller's link: the first visit clones, later ones merge updates
    query = dict(urllib.parse.parse_qsl(link.query))
    assert query == {
        "repo": "https://github.com/owner/qwenvl-lab",
        "branch": "main",
        "urlpath": "lab/tree/qwenvl-lab/notebooks/00_welcome.ipynb",
    }
    assert (REPO / query["urlpath"].removeprefix("lab/tree/qwenvl-lab/")).is_file()
    (culler,) = config.JupyterHub.services.get_value([])
    assert f"--timeout={classload.culler_settings(REPO)['idle_timeout_s']}" in culler["command"]
    assert "delete:servers" in config.JupyterHub.load_roles.get_value([])[0]["scopes"]
    assert "PYTHONPATH" not in config.Spawner.env_keep
    kernels = config.Spawner.args.get_value([])
    assert (
        f"--MappingKernelManager.cull_idle_timeout={classload.culler_settings(REPO)['kernel_idle_timeout_s']}"
        in kernels
    )


def test_without_a_repository_the_servers_copy_the_notebooks(monkeypatch, tmp_path):
    monkeypatch.setenv("QWENVL_LAB_COURSE", str(tmp_path))  # no clone there: no origin to pull from
    monkeypatch.delenv("QWENVL_LAB_REPOSITORY", raising=False)
    config = load_config(COURSE_PART)
    assert config.Spawner.cmd[3:6] == ["--workdir", "~/qwenvl-lab", "--run"]
    assert config.Spawner.default_url == "/lab/tree/my-notebooks/00_welcome.ipynb"


# The Littlest JupyterHub (jupyterhub/the-littlest-jupyterhub at 84ed38fd1f7c239c30378fecc23079911224066c):
# tljh/jupyterhub_config.py sets the hub's settings, applies tljh-config's (tljh/configurer.py: among them the idle
# culler as the one entry of JupyterHub.services, the memory limit, the default URL), then loads every
# /opt/tljh/config/jupyterhub_config.d/*.py with load_subconfig. TLJH_LIKE sets what of that the course's part must
# leave alone, the way TLJH's file does; its values are TLJH's defaults.
TLJH_LIKE = """
c = get_config()
c.JupyterHub.hub_port = 15001
c.JupyterHub.proxy_class = "traefik_file"
c.JupyterHub.base_url = "/"
c.JupyterHub.authenticator_class = "firstuseauthenticator.FirstUseAuthenticator"
c.Spawner.mem_limit = "2.6G"
c.Spawner.default_url = "/lab"
c.SystemdSpawner.default_shell = "/bin/bash"
c.JupyterHub.services = []
c.JupyterHub.services.append({"name": "cull-idle", "admin": True, "command": ["python", "-m", "jupyterhub_idle_culler"]})
load_subconfig(SNIPPET)
"""


def test_the_course_part_appends_to_the_littlest_jupyterhubs_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("QWENVL_LAB_REPOSITORY", "https://github.com/owner/qwenvl-lab")
    (tmp_path / "tljh.py").write_text(TLJH_LIKE.replace("SNIPPET", repr(str(COURSE_PART))))
    config = load_config(tmp_path / "tljh.py")
    assert [s["name"] for s in config.JupyterHub.services] == ["cull-idle"]  # TLJH's culler stays, alone
    assert "load_roles" not in config.JupyterHub and "bind_url" not in config.JupyterHub
    assert config.JupyterHub.hub_port == 15001 and config.JupyterHub.proxy_class == "traefik_file"
    assert config.Spawner.mem_limit == "2.6G"
    assert config.Spawner.cmd[2] == "qwenvl_lab.course.lab" and config.Spawner.default_url.startswith("/git-pull?")
    assert any("cull_idle_timeout" in a for a in config.Spawner.args.get_value([]))
    # the course's part sets nothing of the hub's own: no JupyterHub.* setting at all
    alone = load_config(COURSE_PART)
    assert "JupyterHub" not in alone and set(alone) == {"Spawner"}


def test_nbgitpuller_keeps_a_learners_edit_and_brings_the_upstreams_change(tmp_path):
    """The upstream stand-in (make_upstream, change_upstream) through nbgitpuller's own puller: the first pull
    clones, the learner edits a cell, the upstream appends one, the second pull merges both."""
    pull = pytest.importorskip("nbgitpuller.pull", reason="nbgitpuller is the hub extra's")
    nbformat = pytest.importorskip("nbformat")
    course = tmp_path / "course"
    (course / "notebooks").mkdir(parents=True)
    (course / "notebooks" / "00_welcome.ipynb").write_bytes((REPO / classload.EDITED_NOTEBOOK).read_bytes())
    classload.git("init", "--quiet", cwd=course)
    classload.git("add", "--all", cwd=course)
    classload.git("commit", "--quiet", "-m", "course", cwd=course)
    (tmp_path / "run").mkdir()
    work, url = classload.make_upstream(course, tmp_path / "run")
    assert url.startswith("file://") and url.endswith("/upstream/qwenvl-lab")
    clone = tmp_path / "home" / "qwenvl-lab"
    for _ in pull.GitPuller(url, str(clone), branch="main").pull():
        pass
    mine = clone / classload.EDITED_NOTEBOOK
    notebook = nbformat.read(mine, as_version=4)
    cell = next(c for c in notebook.cells if c.cell_type == "code")
    note = f"{classload.EDIT_MARK} learner"
    cell.source = f"{note}\n{cell.source}"
    nbformat.write(notebook, mine)  # as the Jupyter server saves it
    text = classload.change_upstream(work, 7)
    assert text.startswith("Upstream change 7")
    for _ in pull.GitPuller(url, str(clone), branch="main").pull():
        pass
    assert classload.merged(json.loads(mine.read_text()), note, text) == {"kept_edit": True, "got_update": True}
    before = json.loads((REPO / classload.EDITED_NOTEBOOK).read_text())
    assert classload.merged(before, note, text) == {"kept_edit": False, "got_update": False}


def test_the_pull_link_and_its_event_stream():
    query = dict(urllib.parse.parse_qsl(classload.pull_query("file:///tmp/x/upstream/qwenvl-lab")))
    assert query["urlpath"] == "lab/tree/qwenvl-lab/notebooks/00_welcome.ipynb" and query["branch"] == "main"
    body = 'data: {"output": "Fetching", "phase": "syncing"}\n\ndata: {"phase": "finished"}\n\n'
    assert [e["phase"] for e in classload.pull_events(body)] == ["syncing", "finished"]


def test_the_load_tests_config_is_the_instructors_on_loopback(tmp_path):
    path = classload.hub_config(tmp_path, REPO, ["qwl-a", "qwl-b"], "secret", 8123, "/usr/bin/chp")
    config = load_config(path)
    assert config.JupyterHub.bind_url == "http://127.0.0.1:8123" and config.Spawner.ip == "127.0.0.1"
    assert config.ConfigurableHTTPProxy.api_url.startswith("http://127.0.0.1:")
    assert config.Authenticator.allowed_users == {"qwl-a", "qwl-b"} and config.DummyAuthenticator.password == "secret"
    assert config.Spawner.cmd[2] == "qwenvl_lab.course.lab"  # the instructor's, loaded first
    assert config.JupyterHub.db_url == f"sqlite:///{tmp_path / 'hub.sqlite'}"


def test_refuses_without_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(classload.LoadTestError, match="as root on Linux"):
        classload.check_can_run(REPO, "configurable-http-proxy")
    with pytest.raises(SystemExit) as exit_info:
        classload.main(["--learners", "0"])
    assert exit_info.value.code == 2


MEASURED = REPO / "data" / "benchmarks" / "jupyterhub" / "class-load-cpu.json"


def test_the_committed_class_measurement_ran_clean():
    """The measurement the workshop's figures come from (tests/test_workshop_figures.py checks the figures)."""
    result = json.loads(MEASURED.read_text())
    assert result["settings"]["learners"] >= 2 and result["class"]["errors"] == 0 and not result["lone"]["errors"]
    assert result["class"]["output_differences"] == 0 and result["shared_install_unchanged"]
    assert {"cpu", "cores", "memory_gib", "load_average"} <= result["machine"].keys()
    assert result["class"]["second_pulls_kept_edit_and_got_update"] == result["settings"]["learners"]
    assert result["lone"]["second_pull"] == {"kept_edit": True, "got_update": True}
    assert set(result["lone"]["peak_memory_by_notebook_gib"]) == set(result["settings"]["lone_notebooks"])
    assert set(result["settings"]["notebooks"]) <= set(result["settings"]["lone_notebooks"])
    values = yaml.safe_load((REPO / "docs" / "jupyterhub" / "z2jh-values.yaml").read_text())["singleuser"]
    culling = result["settings"]["culling"]
    kernel_culling = values["extraFiles"]["kernel-culling"]["data"]["MappingKernelManager"]
    assert kernel_culling["cull_idle_timeout"] == culling["kernel_idle_timeout_s"] == 1200
