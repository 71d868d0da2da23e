"""`python -m qwenvl_lab.course.lab` — open the course in JupyterLab on the learner's own copies of the notebooks.

The course notebooks (notebooks/, with their solutions in notebooks/solutions/) stay pristine: the first start copies
them into my-notebooks/ (git ignores it), solutions into my-notebooks/solutions/, so every relative link of a copy
works; later starts copy only notebooks that have no copy yet, and `--reset NAME` restores one copy from the course.
A learner's copy hides what answers a question before it is tried: a "predict, then run" cell (tagged `predict`)
comes without its stored output, the explanation after it (tagged `answer`) comes collapsed, and a widget's stored
output, which reads as `VBox(children=…)` text until its kernel runs, comes cleared.
JupyterLab opens at the repository's top level on my-notebooks/00_welcome.ipynb; arguments it does not know itself
(e.g. --ip=0.0.0.0 --port=8888 --no-browser) go to JupyterLab.

On a shared server the course is installed once, read-only, and each learner's work goes to a folder of their own
(`--workdir ~/qwenvl-lab`): my-notebooks/, course-output/, and links to the course's data/, notebooks/ and
qwenvl_lab/, so the notebooks' relative paths (../data/images/…) hold there too. `--run COMMAND …` starts another
server command (JupyterHub's jupyterhub-singleuser, Binder's) in that folder with the course's settings. On a class
hub whose learners get the notebooks through nbgitpuller (a clone of the repository in their home, merged with each
update), `--no-copy` makes neither copies nor links: the server only gets the course's settings and output folder.
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

from .. import files, options
from ..checks.values import check_path
from ..options import Parser
from ..resources import OUTPUT_ENV, OUTPUT_FOLDER, checkout_dir
from .notebooks import NOTEBOOKS

WORKDIR_ENV = "QWENVL_LAB_WORKDIR"  # a learner's own folder on a shared install (default: the clone itself)
LINKED = ("data", "notebooks", "qwenvl_lab")  # what a learner's folder links to in the course's clone
COURSE_FOLDER = "notebooks"
MY_FOLDER = "my-notebooks"
SOLUTIONS_FOLDER = "solutions"  # inside the course folder and inside my-notebooks/
BACKUP_FOLDER = "backup"  # inside my-notebooks/: a learner's copy that --reset replaced
FIRST_NOTEBOOK = NOTEBOOKS[0].file
JUPYTER_CONFIG_FOLDER = ".jupyter"  # labconfig/page_config.json: the news-announcement plugin is switched off
PREDICT_TAG = "predict"  # a code cell whose output answers a "predict, then run" question
ANSWER_TAG = "answer"  # a markdown cell that explains that output
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"  # the output of a displayed widget
NOTEBOOK_WRITER = files.writer("notebook copy", "a learner's copy of a course notebook")


def course_root() -> Path:
    """The repository's top level (the course runs from a clone: its notebooks are not part of the package)."""
    root = checkout_dir()
    if root is None or not (root / COURSE_FOLDER).is_dir():
        raise FileNotFoundError(
            "the course runs from a clone of the qwenvl-lab repository (its notebooks/ folder is not installed with "
            "the package); install the clone with `pip install -e .[course]` and start it from there"
        )
    return root


def course_notebooks(course: Path) -> list[Path]:
    """The course's notebooks, then their solutions (course/solutions/)."""
    course = check_path("course", course)
    return sorted(course.glob("*.ipynb")) + sorted((course / SOLUTIONS_FOLDER).glob("*.ipynb"))


def learner_copy(notebook: Path) -> bytes:
    """The course notebook `notebook` as a learner gets it: each `predict` cell without its output, each `answer`
    cell collapsed, each widget's output (and the stored widget state) gone; a file that is not a notebook as it is."""
    data = notebook.read_bytes()
    try:
        content = json.loads(data)
        cells = content["cells"]
    except (ValueError, KeyError, TypeError):
        return data
    for cell in cells:
        tags = cell.get("metadata", {}).get("tags", [])
        outputs = cell.get("outputs", [])
        if PREDICT_TAG in tags or any(WIDGET_VIEW in output.get("data", {}) for output in outputs):
            cell["outputs"], cell["execution_count"] = [], None
        if ANSWER_TAG in tags:
            cell["metadata"].setdefault("jupyter", {})["source_hidden"] = True
    content.get("metadata", {}).pop("widgets", None)
    return (json.dumps(content, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def copy_course_notebooks(course: Path, mine: Path) -> list[Path]:
    """Copy every course notebook (solutions included, into mine/solutions/) that has no copy in `mine` yet (an
    existing copy is never touched, nor is anything else in its place: a link, even to nothing, is left as it is,
    with a warning), as `learner_copy` makes it; the new copies."""
    course, mine = check_path("course", course), check_path("mine", mine)
    copied = []
    for notebook in course_notebooks(course):
        target = mine / notebook.relative_to(course)
        if target.is_symlink() and not target.exists():
            warnings.warn(
                f"{target} is a link to {os.readlink(target)}, which does not exist: no copy was written through it; "
                f"remove the link to get a fresh copy of {notebook.name}",
                stacklevel=2,
            )
            continue
        if not target.exists():
            _copy(notebook, target, overwrite=False)
            copied.append(target)
    return copied


def _copy(notebook: Path, target: Path, overwrite: bool) -> None:
    """Write the learner's copy of the course notebook `notebook` (`learner_copy`) as `target` (its folder made if
    needed)."""
    with files.writing_file(
        target, NOTEBOOK_WRITER, overwrite=overwrite, need_bytes=notebook.stat().st_size, parents=True
    ) as part:
        part.write_bytes(learner_copy(notebook))


def find_course_notebook(course: Path, name: str) -> Path:
    """The course notebook named `name`: its file name, its stem (03_solutions for a solution) or a unique prefix of
    a course notebook's name such as `03`."""
    notebooks = course_notebooks(course)
    exact = [n for n in notebooks if name in (n.name, n.stem, n.relative_to(course).with_suffix("").as_posix())]
    matches = exact or [n for n in notebooks if n.parent == course and n.name.startswith(name)]
    if len(matches) != 1:
        found = "no course notebook matches" if not matches else f"{len(matches)} course notebooks match"
        raise ValueError(f"{found} {name!r}; name one of: {', '.join(n.stem for n in notebooks)}")
    return matches[0]


def reset_notebook(course: Path, mine: Path, name: str) -> tuple[Path, Path | None]:
    """Restore `mine`'s copy of course notebook `name`; a changed copy of the learner's moves to mine/backup/ first.

    Returns (the restored copy, where the learner's copy went or None if there was none or it was unchanged)."""
    course, mine = check_path("course", course), check_path("mine", mine)
    notebook = find_course_notebook(course, name)
    target = mine / notebook.relative_to(course)
    backup = None
    if target.is_symlink() or (target.exists() and target.read_bytes() != learner_copy(notebook)):
        backup = files.move_to_backup(
            target, mine / BACKUP_FOLDER / f"{notebook.stem}-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
        )
    _copy(notebook, target, overwrite=True)  # the learner's copy, if any, is in backup/ now (or was the course's)
    return target, backup


def prepare_workdir(root: Path, workdir: Path) -> list[Path]:
    """Make `workdir` a learner's folder for the course in `root`: links to the course's LINKED folders (an entry of
    the learner's own is never replaced); the links made."""
    files.make_folder(check_path("workdir", workdir), parents=True)
    if workdir.resolve() == check_path("root", root).resolve():
        return []
    return [workdir / name for name in LINKED if files.make_link(workdir / name, root / name)]


def running_as_root() -> bool:
    """True under a POSIX root account (Docker, cloud VMs), where JupyterLab needs --allow-root."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def lab_command(root: Path, lab_args=()) -> list[str]:
    """The JupyterLab command: this interpreter's jupyterlab, rooted at `root`, opening the first notebook copy."""
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}"]
    if running_as_root() and "--allow-root" not in lab_args:
        command.append("--allow-root")
    return [*command, *lab_args, str(Path(MY_FOLDER) / FIRST_NOTEBOOK)]


def lab_environment(root: Path, environ=None, workdir: Path | None = None) -> dict[str, str]:
    """`environ` (default os.environ) with the course's Jupyter config folder searched first, and course outputs
    going to course-output/ in `workdir` (default `root`) unless $QWENVL_LAB_OUTPUT says otherwise (also when the
    kernels import the package from a shared environment)."""
    env = dict(os.environ if environ is None else environ)
    extra = str(root / JUPYTER_CONFIG_FOLDER)
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (extra, env.get("JUPYTER_CONFIG_PATH", "")) if p)
    env[OUTPUT_ENV] = env.get(OUTPUT_ENV) or str((workdir or root) / OUTPUT_FOLDER)
    return env


def missing_jupyterlab(root: Path, python: str | None = None) -> str | None:
    """None when this Python has JupyterLab; else what to run instead: the clone's .venv (which `make lab` makes),
    or how to install the course into this Python."""
    if importlib.util.find_spec("jupyterlab") is not None:
        return None
    python = python or sys.executable
    venv = root / ".venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if venv.exists() and venv.absolute() != Path(python).absolute():
        way = f"the course's environment is {venv}: run `make lab`, or `{venv} -m qwenvl_lab.course.lab`"
    else:
        way = "install the course into it first: `make lab`, or `python -m pip install -e '.[course]'` in the clone"
    return f"JupyterLab is not installed in this Python ({python}); {way}"


def run_until_exit(command: list[str], cwd: Path, env: dict[str, str]) -> int:
    """Run `command` and return its exit status; Ctrl+C reaches it too, so it decides when to stop."""
    process = subprocess.Popen(command, cwd=cwd, env=env)
    while True:
        try:
            return process.wait()
        except KeyboardInterrupt:
            continue


def notebook_name(name: str) -> str:
    """An option type (--reset): the name of one course notebook."""
    try:
        find_course_notebook(course_root() / COURSE_FOLDER, name)
    except (ValueError, FileNotFoundError) as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return name


notebook_name.kind = "choice"  # what the test of every option reads: one of a set of names


def parser() -> Parser:
    """`qwenvl-lab lab`'s options (arguments it does not know go to JupyterLab)."""

    def check(parser, args):
        if args.run is None:
            return
        if not args.run or not args.run[0].strip():
            parser.error("--run needs a command, and comes last (what follows it is the command's)")
        command = args.run[0]
        if "/" in command or os.sep in command:  # a path: from the folder the command runs in
            command = str((course_root() if args.workdir is None else args.workdir.expanduser()) / command)
        if shutil.which(command) is None:
            parser.error(
                f"--run {args.run[0]!r}: no such program on the PATH (give a command, e.g. jupyterhub-singleuser)"
            )

    parser = Parser(
        prog="qwenvl-lab lab",
        description=__doc__.split("\n")[0],
        allow_abbrev=False,
        epilog="Other arguments go to JupyterLab, e.g. --ip=0.0.0.0 --port=8888 --no-browser on a remote machine.",
        check=check,
    )
    parser.add_argument(
        "--reset",
        metavar="NOTEBOOK",
        type=notebook_name,
        help="restore my-notebooks/NOTEBOOK from the course (e.g. 03, 03_fake_prompt_ids or 03_solutions); "
        "your copy moves to my-notebooks/backup/",
    )
    parser.add_argument(
        "--print-command", action="store_true", help="print the JupyterLab command instead of running it"
    )
    parser.add_argument(
        "--workdir",
        type=options.output_folder,
        default=os.environ.get(WORKDIR_ENV) or None,
        help=f"your own folder on a shared install: my-notebooks/ and course-output/ go there (default: ${WORKDIR_ENV}, "
        "else the clone)",
    )
    parser.add_argument(
        "--no-copy",
        action="store_true",
        help="make no notebook copies and no links in the folder (a class hub whose learners pull the notebooks "
        "with nbgitpuller)",
    )
    parser.add_argument(
        "--run",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="after copying the notebooks, run this server command in the folder instead of JupyterLab "
        "(e.g. jupyterhub-singleuser under JupyterHub; everything after it is its own)",
    )
    return parser


def main(argv=None) -> int:
    """Command line: copy the notebooks, then start JupyterLab (or restore one copy with --reset)."""
    parser_ = parser()
    args, lab_args = parser_.parse_known_args(argv)
    root = course_root()
    workdir = root if args.workdir is None else args.workdir.expanduser().absolute()
    course, mine = root / COURSE_FOLDER, workdir / MY_FOLDER
    if args.run is not None and lab_args:
        parser_.error("--run comes last (what follows it is the command's)")
    if args.reset is not None:
        try:
            restored, backup = reset_notebook(course, mine, args.reset)
        except ValueError as err:
            parser_.error(str(err))
        print(
            f"restored {restored.relative_to(workdir)} from {COURSE_FOLDER}/"
            + (f"; your copy is now {backup.relative_to(workdir)}" if backup else "")
        )
        return 0
    if args.run is None and (problem := missing_jupyterlab(root)) is not None:
        parser_.error(problem)  # before anything is copied
    if args.no_copy:
        files.make_folder(check_path("workdir", workdir), parents=True)
        copied = []
    else:
        prepare_workdir(root, workdir)
        with warnings.catch_warnings(record=True) as left:  # a link in the way: said in a line of its own
            warnings.simplefilter("always")
            copied = copy_course_notebooks(course, mine)
        for warning in left:
            print(f"note: {warning.message}")
    if copied:
        print(
            f"copied {len(copied)} course notebook(s) into {MY_FOLDER}/ (your work goes there; "
            f"{COURSE_FOLDER}/ stays as shipped)"
        )
    env = lab_environment(root, workdir=workdir)
    if args.run is not None:
        os.chdir(workdir)  # the server's files start here
        try:
            os.execvpe(args.run[0], args.run, env)
        except OSError as err:
            parser_.error(f"--run {args.run[0]!r} cannot run: {err.strerror}")
    command = lab_command(workdir, lab_args)
    if args.print_command:
        print(" ".join(command))
        return 0
    return run_until_exit(command, workdir, env)


if __name__ == "__main__":
    sys.exit(main())
