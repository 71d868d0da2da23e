"""JupyterHub for a class on one server, on its own (without The Littlest JupyterHub): one read-only course install
shared by every learner, each learner's work in their own home (docs/workshop.md, "A class on one JupyterHub server").

The instructor installs the course once, as root, where every account can read it and none can write:

    git clone <the course's repository> /opt/qwenvl-lab && cd /opt/qwenvl-lab
    make setup && .venv/bin/python -m pip install -e '.[course,hub]' && .venv/bin/python -m compileall -q qwenvl_lab
    npm install -g configurable-http-proxy
    .venv/bin/jupyterhub -f docs/jupyterhub/jupyterhub_config.py

Learners log in with their system accounts (PAM, JupyterHub's default). What each learner's server runs, and how
the notebooks reach them (nbgitpuller), is the course's part: course.py beside this file, loaded first. This file
adds what is the hub's: its address, the idle culler and the culler's role, appended to whatever came before.
`make class-load` runs this file, with a password authenticator for its simulated learners, and measures it.
"""

import os

COURSE = os.environ.get("QWENVL_LAB_COURSE", "/opt/qwenvl-lab")  # the shared clone, with its .venv (make setup)
VENV_BIN = os.path.join(COURSE, ".venv", "bin")
IDLE_TIMEOUT_S = 1200  # a learner's server unused for 20 minutes is stopped (their files stay)
CULL_EVERY_S = 120

load_subconfig(os.path.join(os.path.dirname(os.path.abspath(__file__)), "course.py"))  # noqa: F821 (the loader's)
c = get_config()  # noqa: F821 (JupyterHub's config loader provides it)

c.JupyterHub.bind_url = "http://:8000"  # put TLS in front of it (a reverse proxy)
c.Spawner.env_keep = ["PATH", "LANG", "LC_ALL"]  # not the hub's PYTHONPATH or VIRTUAL_ENV: the course's own
c.JupyterHub.services.append(
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
)
c.JupyterHub.load_roles.append(
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }
)
