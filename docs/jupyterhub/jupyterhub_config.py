"""JupyterHub for a class on one server: one read-only course install shared by every learner, each learner's work in
their own home (docs/workshop.md, "A class on one JupyterHub server").

The instructor installs the course once, as root, where every account can read it and none can write:

    git clone <the course's repository> /opt/qwenvl-lab && cd /opt/qwenvl-lab
    make setup && .venv/bin/python -m pip install -e '.[course,hub]' && .venv/bin/python -m compileall -q qwenvl_lab
    npm install -g configurable-http-proxy
    .venv/bin/jupyterhub -f docs/jupyterhub/jupyterhub_config.py

Learners log in with their system accounts (PAM, JupyterHub's default). Each learner's server starts through
`python -m qwenvl_lab.course.lab --workdir ~/qwenvl-lab --run jupyterhub-singleuser`: the notebooks are copied into
~/qwenvl-lab/my-notebooks/ on the first start (never overwritten), course outputs go to ~/qwenvl-lab/course-output/,
and ~/qwenvl-lab/data, notebooks, qwenvl_lab link to the shared install. `make class-load` runs this file, with a
password authenticator for its simulated learners, and measures it.
"""

import os

COURSE = os.environ.get("QWENVL_LAB_COURSE", "/opt/qwenvl-lab")  # the shared clone, with its .venv (make setup)
VENV_BIN = os.path.join(COURSE, ".venv", "bin")
IDLE_TIMEOUT_S = 1200  # a learner's server unused for 20 minutes is stopped (their files stay)
CULL_EVERY_S = 120
KERNEL_IDLE_TIMEOUT_S = 1200  # inside a server: a kernel idle for 20 minutes is shut down (its variables are lost)

c = get_config()  # noqa: F821 (JupyterHub's config loader provides it)

c.JupyterHub.bind_url = "http://:8000"  # put TLS in front of it (The Littlest JupyterHub, or a reverse proxy)
c.Spawner.cmd = [
    os.path.join(VENV_BIN, "python"),
    "-m",
    "qwenvl_lab.course.lab",
    "--workdir",
    "~/qwenvl-lab",
    "--run",
    os.path.join(VENV_BIN, "jupyterhub-singleuser"),
]
c.Spawner.default_url = "/lab/tree/my-notebooks/00_welcome.ipynb"
c.Spawner.args = [
    f"--MappingKernelManager.cull_idle_timeout={KERNEL_IDLE_TIMEOUT_S}",
    "--MappingKernelManager.cull_interval=120",
]
c.Spawner.env_keep = ["PATH", "LANG", "LC_ALL"]  # not the hub's PYTHONPATH or VIRTUAL_ENV: the course's own
c.Spawner.start_timeout = 120  # the first start imports torch from a cold disk
c.Spawner.http_timeout = 120
c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [
            os.path.join(VENV_BIN, "python"),
            "-m",
            "jupyterhub_idle_culler",
            f"--timeout={IDLE_TIMEOUT_S}",
            f"--cull-every={CULL_EVERY_S}",
        ],
    }
]
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }
]
