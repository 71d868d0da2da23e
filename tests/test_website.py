"""The course website's builder (`python tools/website.py`): the repository for the launch buttons, the config
it writes, and the links it mends in the built pages. The built pages themselves: tests/test_site.py."""

import pytest

from qwenvl_lab.resources import checkout_dir
from tools import website

REPO = checkout_dir()


@pytest.mark.parametrize(
    "given, found",
    [
        ("https://github.com/owner/qwenvl-lab.git", "owner/qwenvl-lab"),
        ("https://github.com/owner/qwenvl-lab", "owner/qwenvl-lab"),
        ("git@github.com:owner/qwenvl-lab.git", "owner/qwenvl-lab"),
        ("owner/qwenvl-lab", "owner/qwenvl-lab"),
        ("https://gitlab.com/owner/qwenvl-lab.git", None),
        ("", None),
    ],
)
def test_github_repository(given, found):
    assert website.github_repository(REPO, given) == found


def test_config_names_the_repository_only_when_there_is_one():
    plain = website.site_config(REPO, None, "main")
    assert "repository" not in plain and plain["execute"]["execute_notebooks"] == "off"
    # no launch buttons: Jupyter Book's default repository (its own) would otherwise fill the Binder button
    assert "launch_buttons" not in plain and plain["html"]["use_repository_button"] is False
    named = website.site_config(REPO, "owner/qwenvl-lab", "course")
    assert named["repository"] == {"url": "https://github.com/owner/qwenvl-lab", "branch": "course"}
    assert named["launch_buttons"]["binderhub_url"] == "https://mybinder.org"
    assert "jupyterhub_url" not in named["launch_buttons"]


def test_a_hub_address_adds_the_jupyterhub_button_only_with_a_repository():
    config = website.site_config(REPO, "owner/qwenvl-lab", "main", hub="https://hub.example.org/")
    assert config["launch_buttons"]["jupyterhub_url"] == "https://hub.example.org"
    assert config["launch_buttons"]["notebook_interface"] == "jupyterlab"
    assert "launch_buttons" not in website.site_config(REPO, None, "main", hub="https://hub.example.org")
    for bad in ("hub.example.org", "ftp://hub.example.org", "https://hub.example.org/?next=x"):
        with pytest.raises(ValueError, match="give the hub's address"):
            website.site_config(REPO, "owner/qwenvl-lab", "main", hub=bad)


def test_launch_buttons_open_the_learners_copy_and_folder_links_reach_their_page():
    hub = (
        "https://hub.example.org/hub/user-redirect/git-pull?repo=https%3A//github.com/o/r"
        "&urlpath=lab/tree/r/notebooks/solutions/01_solutions.ipynb&branch=main"
    )
    page = (
        '<a href="https://mybinder.org/v2/gh/o/r/main?urlpath=lab/tree/notebooks/01_tokenizing.ipynb">'
        '<a href="https://mybinder.org/v2/gh/o/r/main?urlpath=lab/tree/notebooks/solutions/01_solutions.ipynb">'
        f'<a href="{hub}">'
        '<a class="reference internal" href="#solutions/">'
    )
    fixed = website.fix_links(page, "notebooks/00_welcome.html")
    assert "urlpath=lab/tree/my-notebooks/01_tokenizing.ipynb" in fixed
    assert "urlpath=lab/tree/my-notebooks/solutions/01_solutions.ipynb" in fixed  # the copy start makes on Binder
    assert f'href="{hub}"' in fixed  # on the hub, nbgitpuller's clone is the learner's own
    assert 'href="../docs/site/solutions.html"' in fixed
    front = website.fix_links('<a href="#notebooks/solutions/">', "README.html")
    assert front == '<a href="docs/site/solutions.html">'
    table = (  # the welcome's table of notebooks is an output: its links name the notebooks' files
        '<a href="01_tokenizing.ipynb"><a href="solutions/01_solutions.ipynb#x">'
        '<a href="../_sources/notebooks/00_welcome.ipynb"><a href="https://example.org/notebooks/01_tokenizing.ipynb">'
    )
    assert website.fix_links(table, "notebooks/00_welcome.html") == (
        '<a href="01_tokenizing.html"><a href="solutions/01_solutions.html#x">'
        '<a href="../_sources/notebooks/00_welcome.ipynb"><a href="https://example.org/notebooks/01_tokenizing.ipynb">'
    )  # the source's download and another site's notebook stay as they are


def test_every_folder_page_and_toc_entry_exists():

    toc = website.site_toc(REPO)
    entries = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    entries += [s["file"] for part in toc["parts"] for c in part["chapters"] for s in c.get("sections", [])]
    missing = [e for e in entries if not any((REPO / f"{e}{suffix}").is_file() for suffix in (".md", ".ipynb"))]
    assert missing == []
    for target in website.FOLDER_PAGES.values():
        assert (REPO / target).with_suffix(".md").is_file()
