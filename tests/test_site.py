"""The course as a website (`make site`): Jupyter Book builds it from the stored outputs; headless Chromium opens every
page reachable from the front page, and checks that it renders, that every internal link and anchor resolves, that
the figures load and Chinese text shows, and every launch button: Binder opening the learner's copy, a class
JupyterHub through nbgitpuller, and none at all when the site is built without a repository.

Needs Jupyter Book 1.x (the site extra), Playwright for Python and Debian's Chromium with a CJK font (apt-get install
chromium fonts-wqy-microhei). Without them the tests are skipped; with QWENVL_LAB_BROWSER_TEST=required they fail.
"""

import functools
import http.server
import importlib.util
import json
import os
import shutil
import subprocess
import threading
import urllib.parse
from pathlib import Path

import pytest
from chromium import CHROMIUM_FLAGS  # tests/chromium.py

from tools import website

REPO = Path(__file__).resolve().parents[1]
REPOSITORY = "example/qwenvl-lab"  # the launch buttons' GitHub repository in this test
HUB = "https://hub.example.org"  # a class JupyterHub's address in this test
CHINESE = "图片里是什么"  # notebook 01's question


def missing_tools() -> list[str]:
    """What the site test needs and this machine lacks, each with how to get it."""
    missing = []
    if importlib.util.find_spec("jupyter_book") is None:
        missing.append("Jupyter Book (pip install -e '.[site]')")
    if importlib.util.find_spec("playwright") is None:
        missing.append("Playwright for Python (pip install playwright; never `playwright install`)")
    if shutil.which("chromium") is None:
        missing.append("Chromium (as root: apt-get install chromium)")
    fonts = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True) if shutil.which("fc-list") else None
    if fonts is None or not fonts.stdout.strip():
        missing.append("a font with Chinese characters (as root: apt-get install fonts-wqy-microhei)")
    return missing


MISSING = missing_tools()
if MISSING and os.environ.get("QWENVL_LAB_BROWSER_TEST") != "required":
    pytest.skip("the site test needs " + "; ".join(MISSING), allow_module_level=True)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site served on a free port of 127.0.0.1: its base URL."""
    if MISSING:
        pytest.fail("the site test needs " + "; ".join(MISSING), pytrace=False)
    html = website.build(REPO, REPOSITORY, output=tmp_path_factory.mktemp("site"), hub=HUB)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(html))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


PAGE_FACTS = """() => ({
    title: document.title,
    text: document.body.innerText.length,
    links: [...document.querySelectorAll('a[href]')].map(a => a.href),
    ids: [...document.querySelectorAll('[id]')].map(e => e.id),
    images: [...document.querySelectorAll('main img')].map(img => ({src: img.src, ok: img.complete && img.naturalWidth > 0})),
    // the theme's launch buttons ("Launch on Binder", …), whose title Bootstrap's tooltip moves once the page runs
    launch: [...document.querySelectorAll('a[title^="Launch on"], a[data-bs-original-title^="Launch on"]')]
        .map(a => a.href),
})"""


def toc_pages() -> set[str]:
    """The site path of every page the table of contents names."""

    toc = website.site_toc(REPO)
    found, todo = {toc["root"]}, [c for part in toc["parts"] for c in part["chapters"]]
    while todo:
        entry = todo.pop()
        found.add(entry["file"])
        todo += entry.get("sections", [])
    return {f"{name}.html" for name in found}


@pytest.fixture(scope="module")
def crawl(site, browser):
    """Every page reachable from the front page: site path → its facts; and the failures seen on the way."""
    page, pages, failures = browser.new_page(), {}, []
    page.goto(site + "index.html")  # Jupyter Book's index.html sends the browser on to the front page
    page.wait_for_url(site + "README.html")
    todo = ["README.html"]
    while todo:
        path = todo.pop()
        if path in pages:
            continue
        response = page.goto(site + path)
        if response is None or not response.ok:
            failures.append(f"{path}: HTTP {response and response.status}")
            pages[path] = None
            continue
        page.wait_for_load_state("load")
        facts = page.evaluate(PAGE_FACTS)
        pages[path] = facts
        for link in facts["links"]:
            target = urllib.parse.urldefrag(link)[0]
            if target.startswith(site) and target.endswith(".html"):
                todo.append(target[len(site) :])
    page.close()
    return pages, failures


def test_every_page_of_the_table_of_contents_renders(crawl):
    pages, failures = crawl
    assert failures == []
    assert toc_pages() <= set(pages), f"not reached from the front page: {sorted(toc_pages() - set(pages))}"
    empty = [path for path, facts in pages.items() if facts["text"] < 200]
    assert empty == [], f"pages with (almost) no text: {empty}"


def test_every_internal_link_and_anchor_resolves(crawl, site):
    import urllib.request

    pages, _ = crawl
    broken = []
    for path, facts in pages.items():
        for link in facts["links"]:
            target, anchor = urllib.parse.urldefrag(link)
            if not target.startswith(site):
                continue
            name = target[len(site) :] or "index.html"
            if name.endswith(".html"):
                if pages.get(name) is None:
                    broken.append(f"{path} → {name}")
                elif anchor and urllib.parse.unquote(anchor) not in pages[name]["ids"]:
                    broken.append(f"{path} → {name}#{anchor} (no such anchor)")
            else:  # a download (the course's sources) or a static file
                try:
                    with urllib.request.urlopen(target, timeout=10) as response:
                        assert response.status == 200
                except (OSError, AssertionError):
                    broken.append(f"{path} → {name}")
    assert broken == [], "\n".join(sorted(set(broken)))


def stored_images(notebook: Path) -> int:
    """How many pictures a notebook's stored outputs hold (image/png outside widgets)."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return sum("image/png" in out.get("data", {}) for cell in cells for out in cell.get("outputs", []))


def test_figures_load_and_each_notebook_shows_its_stored_pictures(crawl):
    pages, _ = crawl
    broken = [f"{path}: {img['src']}" for path, facts in pages.items() for img in facts["images"] if not img["ok"]]
    assert broken == []
    for notebook in sorted((REPO / "notebooks").glob("*.ipynb")):
        shown = [img for img in pages[f"notebooks/{notebook.stem}.html"]["images"] if "_images/" in img["src"]]
        assert len(shown) >= stored_images(notebook), notebook.name


def launch_urls(notebook: str) -> set[str]:
    """The launch URLs a page of the course's notebook `notebook` (its path under notebooks/) must have: Binder on
    the learner's copy (my-notebooks/…, made by `start`), the class hub through nbgitpuller on the learner's clone."""
    name = REPOSITORY.split("/")[1]
    pull = urllib.parse.urlencode(
        {
            "repo": f"https://github.com/{REPOSITORY}",
            "urlpath": f"lab/tree/{name}/notebooks/{notebook}",
            "branch": "main",
        }
    )
    return {
        f"https://mybinder.org/v2/gh/{REPOSITORY}/main?urlpath=lab/tree/my-notebooks/{notebook}",
        f"{HUB}/hub/user-redirect/git-pull?{pull}",
    }


def test_each_notebook_page_launches_on_binder_and_on_the_class_hub(crawl):
    pages, _ = crawl
    notebooks = sorted((REPO / "notebooks").glob("*.ipynb")) + sorted(
        (REPO / "notebooks" / "solutions").glob("*.ipynb")
    )
    for notebook in notebooks:
        path = notebook.relative_to(REPO / "notebooks").as_posix()
        page = pages[f"notebooks/{Path(path).with_suffix('.html').as_posix()}"]
        found = {urllib.parse.unquote(url) for url in page["launch"]}
        want = {urllib.parse.unquote(url) for url in launch_urls(path)}
        assert found == want, (path, found)
    others = [path for path, facts in pages.items() if not path.startswith("notebooks/") and facts["launch"]]
    assert others == [], "pages that are not notebooks have launch buttons"


def test_without_a_repository_no_page_has_a_launch_button(tmp_path):
    html = website.build(REPO, None, output=tmp_path / "site", hub=HUB)
    launching = []
    for page in sorted(html.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        if 'title="Launch on' in text or "executablebooks/jupyter-book" in text:
            launching.append(page.relative_to(html).as_posix())
    assert launching == []
    assert (html / "notebooks" / "01_tokenizing.html").is_file()


def test_chinese_text_shows_in_a_chinese_font(site, browser):
    page = browser.new_page()
    page.goto(site + "notebooks/01_tokenizing.html")
    assert CHINESE in page.inner_text("main")
    # two different characters: drawn with a font they differ; as missing-glyph boxes they are the same picture
    page.evaluate(
        """() => { for (const c of ['图', '片']) { const s = document.createElement('span'); s.textContent = c;
        s.className = 'glyph-probe'; s.style.fontSize = '48px'; document.querySelector('main').prepend(s); } }"""
    )
    shots = [probe.screenshot() for probe in page.locator(".glyph-probe").all()]
    page.close()
    assert shots[0] != shots[1], "Chinese characters show as boxes: install a CJK font (fonts-wqy-microhei)"
