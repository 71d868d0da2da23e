"""The course's part of a class JupyterHub: each learner's server runs from one read-only course install shared by
everyone, and gets the notebooks through nbgitpuller (docs/workshop.md, "A class on one JupyterHub server").

It sets only what is the course's (the learners' server command, the page they land on, kernel culling) and appends
to lists rather than replacing them, so it can follow another configuration without undoing it:

- The Littlest JupyterHub: link it into TLJH's folder of extra settings, which TLJH loads after its own
  (`ln -s /opt/qwenvl-lab/docs/jupyterhub/course.py /opt/tljh/config/jupyterhub_config.d/qwenvl-lab.py`); TLJH keeps
  its proxy, authenticator, idle culler and memory limits (`tljh-config`).
- A hub of its own: docs/jupyterhub/jupyterhub_config.py loads this file and adds the hub's address, the idle culler
  and its role.

The notebooks: with a repository to pull from ($QWENVL_LAB_REPOSITORY, else the shared install's `origin` remote),
a learner's first page is nbgitpuller's link: it clones the repository into the learner's home (~/<name>/) on the
first visit and, on each later one, merges the repository's updates into that clone, keeping the learner's edits
(nbgitpuller commits them, then merges with git's -Xours). Without one, the first start copies the notebooks into
~/qwenvl-lab/my-notebooks/ (as `make lab` does on a laptop) and later updates do not reach them.
"""

import os
import subprocess
from urllib.parse import urlencode

COURSE = os.environ.get("QWENVL_LAB_COURSE", "/opt/qwenvl-lab")  # the shared clone, with its .venv (make setup)
VENV_BIN = os.path.join(COURSE, ".venv", "bin")
BRANCH = os.environ.get("QWENVL_LAB_BRANCH", "main")
FIRST_NOTEBOOK = "notebooks/00_welcome.ipynb"
KERNEL_IDLE_TIMEOUT_S = 1200  # inside a server: a kernel idle for 20 minutes is shut down (its variables are lost)
KERNEL_CULL_EVERY_S = 120


def origin(course: str) -> str:
    """The git URL the shared install was cloned from ('' when there is none)."""
    try:
        found = subprocess.run(
            ["git", "-C", course, "remote", "get-url", "origin"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return found.stdout.strip() if found.returncode == 0 else ""


def pull_link(repository: str, branch: str, notebook: str) -> str:
    """nbgitpuller's link (below a server's or the hub's user-redirect URL) that pulls `repository` into the
    learner's home and opens `notebook` (its path in the repository) in JupyterLab."""
    folder = repository.rstrip("/").split("/")[-1]  # nbgitpuller's own choice of folder: the URL's last part
    return "git-pull?" + urlencode({"repo": repository, "branch": branch, "urlpath": f"lab/tree/{folder}/{notebook}"})


REPOSITORY = os.environ.get("QWENVL_LAB_REPOSITORY") or origin(COURSE)

c = get_config()  # noqa: F821 (JupyterHub's config loader provides it)

server = [os.path.join(VENV_BIN, "python"), "-m", "qwenvl_lab.course.lab"]
if REPOSITORY:  # the home is the server's root; nbgitpuller's clone lands in it
    c.Spawner.cmd = [*server, "--workdir", "~", "--no-copy", "--run", os.path.join(VENV_BIN, "jupyterhub-singleuser")]
    c.Spawner.default_url = "/" + pull_link(REPOSITORY, BRANCH, FIRST_NOTEBOOK)
else:
    c.Spawner.cmd = [*server, "--workdir", "~/qwenvl-lab", "--run", os.path.join(VENV_BIN, "jupyterhub-singleuser")]
    c.Spawner.default_url = "/lab/tree/my-notebooks/00_welcome.ipynb"
c.Spawner.args.extend(
    [
        f"--MappingKernelManager.cull_idle_timeout={KERNEL_IDLE_TIMEOUT_S}",
        f"--MappingKernelManager.cull_interval={KERNEL_CULL_EVERY_S}",
    ]
)
c.Spawner.start_timeout = 120  # the first start imports torch from a cold disk
c.Spawner.http_timeout = 120
