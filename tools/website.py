"""`python tools/website.py` — the course as a website: Jupyter Book 1.x builds the README, the notebooks with
their stored outputs (nothing is executed) and docs/ into build/site/_build/html (`make site`).

Jupyter Book 1.x (Sphinx) builds offline; 2.x (the MyST engine) fetches its site template from api.mystmd.org at
build time. With a GitHub repository (--repository, else the clone's `origin` remote) a notebook's page gets launch
buttons: Binder, opening the learner's copy (lab/tree/my-notebooks/…, which the repository's `start` makes, the
solutions' in my-notebooks/solutions/), and with --hub a class JupyterHub, where nbgitpuller pulls the repository
into the learner's home (or merges its updates into their clone) and opens the notebook there. Without a repository
the pages get no launch buttons.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from qwenvl_lab import files
from qwenvl_lab.course.notebooks import NOTEBOOKS, with_exercises
from qwenvl_lab.resources import checkout_dir

SITE = Path("docs") / "site"  # _config.yml, _toc.yml and the site's own pages, in the clone
OUTPUT = Path("build") / "site"
GITHUB = re.compile(r"^(?:https://github\.com/|git@github\.com:)([\w.-]+/[\w.-]+?)(?:\.git)?/?$")
# folders the course's markdown links to, and the page that stands for each on the site
FOLDER_PAGES = {"notebooks/solutions": "docs/site/solutions.html"}
SITE_WRITER = files.writer("site", "the course website (Jupyter Book's build)")
# a Binder launch URL of a course notebook or a solution: the learner's copy is my-notebooks/… (the `start` script)
BINDER_LAUNCH = re.compile(
    r"(https://mybinder\.org/v2/[^\"?]+\?urlpath=lab/tree/)notebooks/((?:solutions/)?\d\d_[\w-]+\.ipynb)"
)
HUB_URL = re.compile(r"^https?://[\w.-]+(?::\d+)?(?:/[\w.~-]+)*/?$")  # a JupyterHub's address: scheme, host, path


def github_repository(root: Path, given: str | None = None) -> str | None:
    """'owner/name' of the course's GitHub repository: `given` (a URL or owner/name), else the clone's origin."""
    if given is None:
        found = subprocess.run(["git", "remote", "get-url", "origin"], cwd=root, capture_output=True, text=True)
        given = found.stdout.strip() if found.returncode == 0 else ""
    if re.fullmatch(r"[\w.-]+/[\w.-]+", given or ""):
        return given
    match = GITHUB.match(given or "")
    return match.group(1) if match else None


def site_config(root: Path, repository: str | None, branch: str, hub: str | None = None) -> dict:
    """docs/site/_config.yml with the launch buttons this build gets: Binder for a GitHub `repository`, and a class
    JupyterHub (through nbgitpuller) when `hub` is its address too; neither without a repository (Jupyter Book's own
    default repository would otherwise fill the Binder button)."""
    import yaml  # noqa: PLC0415 — Jupyter Book's own dependency, asked for only when the site is built

    config = yaml.safe_load((root / SITE / "_config.yml").read_text(encoding="utf-8"))
    if hub is not None and not HUB_URL.match(hub):
        raise ValueError(f"--hub {hub!r}: give the hub's address, e.g. https://hub.example.org")
    if repository is None:
        config.pop("launch_buttons", None)
        config["html"]["use_repository_button"] = False  # Jupyter Book refuses one without a repository
        return config
    config["repository"] = {"url": f"https://github.com/{repository}", "branch": branch}
    if hub is not None:
        config["launch_buttons"]["jupyterhub_url"] = hub.rstrip("/")
    return config


NOTEBOOK_LINK = re.compile(  # a relative link to a course notebook, not a download of its source (_sources/)
    r'href="((?!https?:|/|#|[^"]*_sources/)(?:[\w./-]*/)?(?:solutions/)?\d\d_[\w-]+)\.ipynb(#[^"]*)?"'
)


def site_toc(root: Path) -> dict:
    """The site's table of contents: the core path, the deep dives and the solutions from the course's notebook list,
    then the parts of docs/site/_toc.yml (JSON is YAML, which Jupyter Book reads)."""
    import yaml  # noqa: PLC0415 — Jupyter Book's own dependency, asked for only when the site is built

    toc = yaml.safe_load((root / SITE / "_toc.yml").read_text(encoding="utf-8"))
    pages = [
        {"caption": "The core path", "chapters": [{"file": f"notebooks/{n.stem}"} for n in NOTEBOOKS if n.core]},
        {"caption": "Deep dives", "chapters": [{"file": f"notebooks/{n.stem}"} for n in NOTEBOOKS if not n.core]},
        {
            "caption": "Solutions",
            "chapters": [
                {
                    "file": "docs/site/solutions",
                    "sections": [{"file": f"notebooks/solutions/{n.number}_solutions"} for n in with_exercises()],
                }
            ],
        },
    ]
    return {**toc, "parts": pages + toc["parts"]}


def fix_links(html: str, page: str) -> str:
    """A built page with the launch buttons opening the learner's copy (my-notebooks/) and links to a folder of the
    repository pointing at the page that stands for it (`page`: the page's path in the site)."""
    html = BINDER_LAUNCH.sub(r"\1my-notebooks/\2", html)
    html = NOTEBOOK_LINK.sub(r'href="\1.html\2"', html)  # a notebook named in an output (the welcome's tables)
    up = "../" * page.count("/")
    for folder, target in FOLDER_PAGES.items():
        for link in {folder, os.path.relpath(folder, os.path.dirname(page) or ".")}:
            html = html.replace(f'href="#{link}/"', f'href="{up}{target}"')
    return html


def site_bytes(root: Path) -> int:
    """About how many bytes the built site takes: its pages hold the notebooks with their outputs and the docs, about
    three times their size with the theme's copies, and the theme's own files (some 60 MB)."""
    sources = [*(root / "notebooks").rglob("*.ipynb"), *(root / "docs").rglob("*.md"), root / "README.md"]
    return 3 * sum(p.stat().st_size for p in sources if p.is_file()) + 60 * 2**20


def build(
    root: Path, repository: str | None, branch: str = "main", output: Path | None = None, hub: str | None = None
) -> Path:
    """Build the site into `output` (default build/site/ in the clone): written whole beside it, then put in place,
    replacing a site built earlier (and nothing else); the folder of its HTML."""
    output = root / OUTPUT if output is None else output
    with files.writing_folder(
        output, SITE_WRITER, overwrite=True, need_bytes=site_bytes(root), parents=True
    ) as staging:
        config = staging / "_config.yml"
        config.write_text(json.dumps(site_config(root, repository, branch, hub), indent=1), encoding="utf-8")
        toc = staging / "_toc.yml"
        toc.write_text(json.dumps(site_toc(root), indent=1, ensure_ascii=False), encoding="utf-8")
        command = [
            sys.executable,
            "-c",
            "import sys; from jupyter_book.cli.main import main; sys.exit(main())",  # its `jupyter-book` command
            "build",
            str(root),
            "--config",
            str(config),
            "--toc",
            str(toc),
            "--path-output",
            str(staging),
        ]
        subprocess.run(command, check=True)
        html = staging / "_build" / "html"
        for page in html.rglob("*.html"):
            text = page.read_text(encoding="utf-8")
            fixed = fix_links(text, page.relative_to(html).as_posix())
            if fixed != text:
                page.write_text(fixed, encoding="utf-8")
    return output / "_build" / "html"


def main(argv=None) -> int:
    """Command line: build the site and say where it is."""
    parser = argparse.ArgumentParser(prog="python tools/website.py", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--repository", help="the GitHub repository for the launch buttons: owner/name or its URL (default: origin)"
    )
    parser.add_argument("--branch", default="main", help="the branch Binder builds (default: %(default)s)")
    parser.add_argument("--output", type=Path, help="where the site goes (default: build/site/ in the clone)")
    parser.add_argument(
        "--hub",
        help="a class JupyterHub's address (with nbgitpuller): the pages also get a button that opens the notebook there",
    )
    args = parser.parse_args(argv)
    if args.hub is not None and not HUB_URL.match(args.hub):
        parser.error(f"--hub {args.hub!r}: give the hub's address, e.g. https://hub.example.org")
    root = checkout_dir()
    if root is None or not (root / SITE / "_toc.yml").is_file():
        parser.error("run it from a clone of the course (docs/site/ holds the site's configuration)")
    try:
        import jupyter_book  # noqa: F401, PLC0415 — the site extra's, asked for only by this command
    except ImportError:
        parser.error("Jupyter Book is not installed: pip install -e '.[site]' (make site does)")
    repository = github_repository(root, args.repository)
    if repository is None:
        print(
            "no GitHub repository (--repository owner/name, or an origin remote): the pages get no launch buttons"
            + (" (the JupyterHub button needs the repository that nbgitpuller pulls)" if args.hub else "")
        )
    try:
        html = build(root, repository, args.branch, args.output, args.hub)
    except subprocess.CalledProcessError as err:
        print(f"python tools/website.py: Jupyter Book failed (exit {err.returncode}); its output is above")
        return 1
    except (OSError, ValueError) as err:  # the output folder: not ours, read-only, full
        print(f"python tools/website.py: {err}", file=sys.stderr)
        return 2
    print(f"the site: {html / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
