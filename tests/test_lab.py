"""`python -m qwenvl_lab.course.lab`: learners' notebook copies (made once, never overwritten, reset on request) and the
JupyterLab command (repository root, first notebook, --allow-root as root, news announcements off)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import pythonpath

from qwenvl_lab.course import lab
from qwenvl_lab.course.notebooks import NOTEBOOKS

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def course(tmp_path):
    """A clone-like folder: notebooks/ with three course notebooks and a solutions notebook, no my-notebooks/ yet."""
    (tmp_path / "notebooks" / "solutions").mkdir(parents=True)
    for name in ("00_welcome", "01_tokenizing", "02_locating_img_pos", "solutions/01_solutions"):
        (tmp_path / "notebooks" / f"{name}.ipynb").write_text(json.dumps({"cells": [], "name": name}))
    return tmp_path


def test_first_start_copies_every_course_notebook_and_the_solutions(course):
    copied = lab.copy_course_notebooks(course / "notebooks", course / "my-notebooks")
    assert [p.relative_to(course / "my-notebooks").as_posix() for p in copied] == [
        "00_welcome.ipynb",
        "01_tokenizing.ipynb",
        "02_locating_img_pos.ipynb",
        "solutions/01_solutions.ipynb",  # a copy's link solutions/… works, as from the course's notebooks/
    ]
    for p in copied:
        assert p.read_bytes() == lab.learner_copy(course / "notebooks" / p.relative_to(course / "my-notebooks"))


def test_a_learners_copy_is_never_overwritten(course):
    mine = course / "my-notebooks"
    lab.copy_course_notebooks(course / "notebooks", mine)
    (mine / "01_tokenizing.ipynb").write_text("my work")
    (mine / "02_locating_img_pos.ipynb").unlink()
    (course / "notebooks" / "03_new.ipynb").write_text("{}")  # a course update brings a new notebook
    copied = lab.copy_course_notebooks(course / "notebooks", mine)
    assert [p.name for p in copied] == ["02_locating_img_pos.ipynb", "03_new.ipynb"]
    assert (mine / "01_tokenizing.ipynb").read_text() == "my work"


def test_reset_restores_the_course_notebook_and_keeps_the_learners_copy(course):
    mine = course / "my-notebooks"
    lab.copy_course_notebooks(course / "notebooks", mine)
    (mine / "01_tokenizing.ipynb").write_text("my work")
    restored, backup = lab.reset_notebook(course / "notebooks", mine, "01")
    assert restored == mine / "01_tokenizing.ipynb"
    assert restored.read_bytes() == lab.learner_copy(course / "notebooks" / "01_tokenizing.ipynb")
    assert backup.parent == mine / "backup" and backup.name.startswith("01_tokenizing-") and backup.suffix == ".ipynb"
    assert backup.read_text() == "my work"
    assert lab.reset_notebook(course / "notebooks", mine, "02_locating_img_pos.ipynb")[0].is_file()
    (mine / "solutions" / "01_solutions.ipynb").write_text("my notes")
    for name in ("01_solutions", "solutions/01_solutions"):  # a solution, by its stem or its path
        restored, backup = lab.reset_notebook(course / "notebooks", mine, name)
        assert restored == mine / "solutions" / "01_solutions.ipynb" and restored.read_text() != "my notes"
    assert backup is None and len(list((mine / "backup").glob("01_solutions-*.ipynb"))) == 1


def test_reset_of_a_missing_or_unchanged_copy_makes_no_backup(course):
    restored, backup = lab.reset_notebook(course / "notebooks", course / "my-notebooks", "00_welcome")
    assert restored.is_file() and backup is None
    assert lab.reset_notebook(course / "notebooks", course / "my-notebooks", "00_welcome") == (restored, None)
    assert not (course / "my-notebooks" / "backup").exists()


@pytest.mark.parametrize(
    "name, problem",
    [("0", "3 course notebooks match '0'"), ("09", "no course notebook matches"), ("", "3 course notebooks match ''")],
)
def test_reset_names_one_course_notebook(course, name, problem):
    with pytest.raises(ValueError, match=problem) as err:
        lab.reset_notebook(course / "notebooks", course / "my-notebooks", name)
    assert "00_welcome, 01_tokenizing, 02_locating_img_pos, 01_solutions" in str(err.value)
    assert not (course / "my-notebooks").exists()


def test_lab_command_opens_the_first_copy_at_the_repository_root(monkeypatch):
    monkeypatch.setattr(lab, "running_as_root", lambda: False)
    command = lab.lab_command(REPO, ["--port=9999"])
    assert command[:3] == [sys.executable, "-m", "jupyterlab"]
    assert f"--ServerApp.root_dir={REPO}" in command and "--port=9999" in command
    assert command[-1] == str(Path("my-notebooks") / "00_welcome.ipynb") and "--allow-root" not in command
    monkeypatch.setattr(lab, "running_as_root", lambda: True)
    assert lab.lab_command(REPO).count("--allow-root") == 1
    assert lab.lab_command(REPO, ["--allow-root"]).count("--allow-root") == 1


def test_environment_puts_the_course_config_first_and_outputs_in_the_clone(tmp_path):
    env = lab.lab_environment(REPO, {"JUPYTER_CONFIG_PATH": "/elsewhere", "HOME": "/home/x"})
    assert env["JUPYTER_CONFIG_PATH"] == os.pathsep.join([str(REPO / ".jupyter"), "/elsewhere"])
    assert env["HOME"] == "/home/x" and env["QWENVL_LAB_OUTPUT"] == str(REPO / "course-output")
    env = lab.lab_environment(REPO, {"QWENVL_LAB_OUTPUT": str(tmp_path)})
    assert env["JUPYTER_CONFIG_PATH"] == str(REPO / ".jupyter") and env["QWENVL_LAB_OUTPUT"] == str(tmp_path)


def test_jupyterlab_sees_the_news_announcements_switched_off():
    pytest.importorskip("jupyterlab_server", reason="JupyterLab is not installed (the course extra)")
    code = (
        "from jupyterlab_server.config import get_static_page_config; "
        "print(get_static_page_config().get('disabledExtensions', {}))"
    )
    shipped = subprocess.run(
        [sys.executable, "-c", code], env=lab.lab_environment(REPO), capture_output=True, text=True, check=True
    ).stdout
    assert "'@jupyterlab/apputils-extension:announcements': True" in shipped


def test_command_line_copies_then_prints_the_command(monkeypatch, course, capsys):
    monkeypatch.setattr(lab, "missing_jupyterlab", lambda root, python=None: None)  # as where the extra is in
    monkeypatch.setattr(lab, "course_root", lambda: course)
    assert lab.main(["--print-command", "--ip=0.0.0.0", "--no-browser"]) == 0
    out = capsys.readouterr().out
    assert "copied 4 course notebook(s) into my-notebooks/" in out
    assert f"--ServerApp.root_dir={course}" in out and "--ip=0.0.0.0 --no-browser" in out
    assert lab.main(["--print-command"]) == 0
    assert "copied" not in capsys.readouterr().out


def test_command_line_reset(monkeypatch, course, capsys):
    monkeypatch.setattr(lab, "course_root", lambda: course)
    lab.copy_course_notebooks(course / "notebooks", course / "my-notebooks")
    (course / "my-notebooks" / "00_welcome.ipynb").write_text("mine")
    assert lab.main(["--reset", "00"]) == 0
    assert (
        "restored my-notebooks/00_welcome.ipynb from notebooks/; your copy is now my-notebooks/backup/"
        in capsys.readouterr().out.replace(os.sep, "/")
    )
    with pytest.raises(SystemExit) as exit_:
        lab.main(["--reset", "7"])
    assert exit_.value.code == 2 and "no course notebook matches '7'" in capsys.readouterr().err


def test_course_root_is_this_clone():
    assert lab.course_root() == REPO


def test_a_learners_folder_links_to_the_course_and_keeps_its_own_entries(course, tmp_path):
    (course / "data").mkdir()
    mine = tmp_path / "learner"
    (mine / "notebooks").mkdir(parents=True)  # the learner's own folder of that name stays
    made = lab.prepare_workdir(course, mine)
    assert [p.name for p in made] == ["data", "qwenvl_lab"]
    assert (mine / "data").resolve() == (course / "data").resolve() and not (mine / "notebooks").is_symlink()
    assert lab.prepare_workdir(course, mine) == [] and lab.prepare_workdir(course, course) == []


def test_workdir_takes_the_copies_and_outputs_of_a_shared_install(monkeypatch, course, tmp_path, capsys):
    monkeypatch.setattr(lab, "missing_jupyterlab", lambda root, python=None: None)  # as where the extra is in
    monkeypatch.setattr(lab, "course_root", lambda: course)
    mine = tmp_path / "home" / "qwenvl-lab"
    assert lab.main(["--workdir", str(mine), "--print-command"]) == 0
    assert sorted(p.name for p in (mine / "my-notebooks").iterdir()) == [
        "00_welcome.ipynb",
        "01_tokenizing.ipynb",
        "02_locating_img_pos.ipynb",
        "solutions",
    ]
    assert not (course / "my-notebooks").exists()
    assert f"--ServerApp.root_dir={mine}" in capsys.readouterr().out
    env = lab.lab_environment(course, {}, workdir=mine)
    assert env["QWENVL_LAB_OUTPUT"] == str(mine / "course-output")
    (mine / "my-notebooks" / "00_welcome.ipynb").write_text("mine")
    monkeypatch.setenv(lab.WORKDIR_ENV, str(mine))
    assert lab.main(["--reset", "00"]) == 0
    assert (mine / "my-notebooks" / "00_welcome.ipynb").read_bytes() == lab.learner_copy(
        course / "notebooks" / "00_welcome.ipynb"
    )


PROBE_SERVER = "import json, os; print(json.dumps([os.getcwd(), os.environ['QWENVL_LAB_OUTPUT'], os.environ['JUPYTER_CONFIG_PATH']]))"


def test_run_starts_another_server_command_in_the_learners_folder(tmp_path):
    mine = tmp_path / "learner"
    env = {k: v for k, v in os.environ.items() if k not in ("QWENVL_LAB_OUTPUT", lab.WORKDIR_ENV)}
    env["PYTHONPATH"] = pythonpath(REPO, env=env)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenvl_lab.course.lab",
            "--workdir",
            str(mine),
            "--run",
            sys.executable,
            "-c",
            PROBE_SERVER,
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    cwd, output, config = json.loads(done.stdout.splitlines()[-1])
    assert Path(cwd) == mine and Path(output) == mine / "course-output"
    assert config.split(os.pathsep)[0] == str(REPO / ".jupyter")
    assert (mine / "my-notebooks" / "00_welcome.ipynb").is_file() and (mine / "data" / "images").is_dir()
    missing = subprocess.run(
        [sys.executable, "-m", "qwenvl_lab.course.lab", "--workdir", str(mine), "--run", "no-such-server"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "--run 'no-such-server': no such program on the PATH" in missing.stderr


def code_cell(source, outputs, tags=()):
    return {"cell_type": "code", "execution_count": 3, "metadata": {"tags": list(tags)}, "outputs": outputs,
            "source": source}  # fmt: skip


def test_a_learners_copy_hides_what_answers_a_prediction(tmp_path):
    """A `predict` cell loses its output, the `answer` after it is collapsed, a widget's stored output and state go;
    every other cell stays as the course has it."""
    printed = [{"output_type": "stream", "name": "stdout", "text": ["287 ids\n"]}]
    widget = [{"output_type": "display_data", "metadata": {},
               "data": {"text/plain": ["VBox(children=(…))"], lab.WIDGET_VIEW: {"model_id": "x", "version_major": 2}}}]  # fmt: skip
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": "**Predict, then run.** How many ids?"},
        code_cell("print(len(ids), 'ids')", printed, tags=[lab.PREDICT_TAG]),
        {"cell_type": "markdown", "metadata": {"tags": [lab.ANSWER_TAG]}, "source": "287: the span is 256 ids."},
        code_cell("token_viewer(ids)", widget),
        code_cell("len(ids)", printed),
    ]
    notebook = tmp_path / "01_x.ipynb"
    notebook.write_text(json.dumps({"cells": cells, "metadata": {"widgets": {"state": 1}}, "nbformat": 4}))
    copy = json.loads(lab.learner_copy(notebook))
    question, predicted, answer, shown, other = copy["cells"]
    assert question == cells[0] and other == cells[4]
    assert (
        predicted["outputs"] == []
        and predicted["execution_count"] is None
        and predicted["source"] == cells[1]["source"]
    )
    assert answer["metadata"]["jupyter"]["source_hidden"] is True and answer["source"] == cells[2]["source"]
    assert shown["outputs"] == [] and "widgets" not in copy["metadata"]
    assert json.loads(notebook.read_text())["cells"][1]["outputs"] == printed  # the course's notebook is untouched
    (tmp_path / "notes.ipynb").write_text("not JSON")
    assert lab.learner_copy(tmp_path / "notes.ipynb") == b"not JSON"  # what is not a notebook is copied as it is


def test_a_reset_of_an_untouched_copy_makes_no_backup_though_the_copy_differs_from_the_course(tmp_path):
    course, mine = tmp_path / "notebooks", tmp_path / "my-notebooks"
    course.mkdir()
    cells = [code_cell("x", [{"output_type": "stream", "name": "stdout", "text": ["1"]}], tags=[lab.PREDICT_TAG])]
    (course / "01_x.ipynb").write_text(json.dumps({"cells": cells, "metadata": {}}))
    lab.copy_course_notebooks(course, mine)
    assert (mine / "01_x.ipynb").read_bytes() != (course / "01_x.ipynb").read_bytes()
    assert lab.reset_notebook(course, mine, "01")[1] is None


QUESTION = "**Predict, then run.**"


def prediction_groups(cells):
    """(question cell, the code cells after it up to the next markdown, the markdown cell after them) per question."""
    groups = []
    for k, cell in enumerate(cells):
        if cell["cell_type"] == "markdown" and QUESTION in "".join(cell["source"]):
            end = next((j for j in range(k + 1, len(cells)) if cells[j]["cell_type"] == "markdown"), len(cells))
            groups.append((cell, cells[k + 1 : end], cells[end] if end < len(cells) else None))
    return groups


@pytest.mark.parametrize("n", NOTEBOOKS, ids=lambda n: n.number)
def test_every_prediction_is_tagged_and_its_answer_is_hidden_in_the_copy(n):
    """A question's cells are tagged `predict` and the explanation after them `answer`; in the learner's copy they show
    no output and the explanation is collapsed; no widget shows as text."""
    path = REPO / "notebooks" / n.file
    course = json.loads(path.read_text())["cells"]
    tagged = [c for c in course if lab.PREDICT_TAG in c["metadata"].get("tags", [])]
    groups = prediction_groups(course)
    assert sum(len(code) for _, code, _ in groups) == len(tagged), "a predict cell outside a question's group"
    for question, code, answer in groups:
        where = "".join(question["source"])[:60]
        assert code and all(lab.PREDICT_TAG in c["metadata"].get("tags", []) for c in code), where
        assert answer is not None and lab.ANSWER_TAG in answer["metadata"].get("tags", []), where
    copy = json.loads(lab.learner_copy(path))["cells"]
    for original, copied in zip(course, copy):
        if lab.PREDICT_TAG in original["metadata"].get("tags", []):
            assert copied["outputs"] == [] and copied["execution_count"] is None
        if lab.ANSWER_TAG in original["metadata"].get("tags", []):
            assert copied["metadata"]["jupyter"]["source_hidden"] is True
        shown = json.dumps(copied.get("outputs", []))
        assert "VBox(children" not in shown and lab.WIDGET_VIEW not in shown


def test_under_a_python_without_jupyterlab_it_names_the_courses_python_and_copies_nothing(monkeypatch, course, capsys):
    real_find_spec = lab.importlib.util.find_spec
    monkeypatch.setattr(
        lab.importlib.util, "find_spec", lambda name, *a: None if name == "jupyterlab" else real_find_spec(name, *a)
    )
    monkeypatch.setattr(lab, "course_root", lambda: course)
    with pytest.raises(SystemExit) as exit_:
        lab.main(["--print-command"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"JupyterLab is not installed in this Python ({sys.executable})" in err
    assert "make lab" in err and not (course / "my-notebooks").exists()
    venv_python = course / ".venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("")
    assert f"the course's environment is {venv_python}" in lab.missing_jupyterlab(course, "/usr/bin/python3")
    assert "the course's environment" not in lab.missing_jupyterlab(course, str(venv_python))


def test_no_copy_gives_the_server_its_settings_and_nothing_else(monkeypatch, course, tmp_path, capsys):
    monkeypatch.setattr(lab, "missing_jupyterlab", lambda root, python=None: None)  # as where the extra is in
    monkeypatch.setattr(lab, "course_root", lambda: course)
    home = tmp_path / "home"
    assert lab.main(["--workdir", str(home), "--no-copy", "--print-command"]) == 0
    assert list(home.iterdir()) == [] and "copied" not in capsys.readouterr().out
