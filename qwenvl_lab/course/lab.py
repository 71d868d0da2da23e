"""`python -m qwenvl_lab.course.lab` — open the course in JupyterLab on the learner's own copies of the notebooks.

The course notebooks (notebooks/, with their solutions in notebooks/solutions/) stay pristine: the first start copies
them into my-notebooks/ (git ignores it), solutions into my-notebooks/solutions/, so every relative link of a copy
works; later starts copy only notebooks that have no copy yet, and `--reset NAME` restores one copy from the course.
JupyterLab opens at the repository's top level on my-notebooks/00_welcome.ipynb; arguments it does not know itself
(e.g. --ip=0.0.0.0 --port=8888 --no-browser) go to JupyterLab.

On a shared server the course is installed once, read-only, and each learner's work goes to a folder of their own
(`--workdir ~/qwenvl-lab`): my-notebooks/, course-output/, and links to the course's data/, notebooks/ and
qwenvl_lab/, so the notebooks' relative paths (../data/images/…) hold there too. `--run COMMAND …` starts another
server command (JupyterHub's jupyterhub-singleuser, Binder's) in that folder with the course's settings.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .. import options
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
    return sorted(course.glob("*.ipynb")) + sorted((course / SOLUTIONS_FOLDER).glob("*.ipynb"))


def copy_course_notebooks(course: Path, mine: Path) -> list[Path]:
    """Copy every course notebook (solutions included, into mine/solutions/) that has no copy in `mine` yet (an
    existing copy is never touched); the new copies."""
    copied = []
    for notebook in course_notebooks(course):
        target = mine / notebook.relative_to(course)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(notebook, target)
            copied.append(target)
    return copied


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
    notebook = find_course_notebook(course, name)
    target = mine / notebook.relative_to(course)
    backup = None
    if target.exists() and target.read_bytes() != notebook.read_bytes():
        backup = mine / BACKUP_FOLDER / f"{notebook.stem}-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
        if backup.exists():
            raise FileExistsError(f"{backup} already exists; wait a second and reset again")
        backup.parent.mkdir(parents=True, exist_ok=True)
        target.replace(backup)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(notebook, target)
    return target, backup


def prepare_workdir(root: Path, workdir: Path) -> list[Path]:
    """Make `workdir` a learner's folder for the course in `root`: links to the course's LINKED folders (an entry of
    the learner's own is never replaced); the links made."""
    workdir.mkdir(parents=True, exist_ok=True)
    if workdir.resolve() == root.resolve():
        return []
    made = []
    for name in LINKED:
        link = workdir / name
        if not link.exists() and not link.is_symlink():
            link.symlink_to(root / name, target_is_directory=True)
            made.append(link)
    return made


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
    prepare_workdir(root, workdir)
    copied = copy_course_notebooks(course, mine)
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
