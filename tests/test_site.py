"""The course website, checked in a real headless Chromium, page by page.

The site is built by `bash scripts/build_site.sh` (again only when a source is newer than it),
served from build/site on 127.0.0.1, and every page is opened in Debian's `chromium` driven by
Playwright. Each page must: log no console error, request nothing outside 127.0.0.1, load every
image, finish MathJax with no TeX error and no raw `$...$` left in its text, and have every
internal link point to an existing page and anchor.

`CHROMIUM_PATH` picks another Chromium build (default /usr/bin/chromium, which
scripts/setup_env.sh installs on Debian). `python tests/test_site.py --screenshots` writes the
README's screenshots of the site to images/.
"""

import functools
import html.parser
import http.server
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
from stage_site import repository_url, rewrite_links, site_pages  # noqa: E402

SITE = ROOT / "build" / "site"
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SOURCES = ["README.md", "pyproject.toml", "images", "notebooks", "solutions", "docs/conf.py",
           "docs/stage_site.py", "scripts/build_site.sh"]
# The front page, the notebooks, the solutions, and the pages Sphinx adds to every site.
PAGES = (["index.html"] + [p.removesuffix(".ipynb") + ".html" for p in site_pages()]
         + ["genindex.html", "search.html"])
PAGE_TIMEOUT_MS = 30_000

# Text the browser shows, without code, program output and typeset math: raw TeX left there
# means MathJax did not render it.
VISIBLE_PROSE_JS = """() => {
  const body = document.querySelector('main') || document.body;
  const copy = body.cloneNode(true);
  copy.querySelectorAll('pre, code, script, style, mjx-container, .highlight')
      .forEach(e => e.remove());
  return copy.textContent;
}"""
BROKEN_IMAGES_JS = """() => Array.from(document.images)
  .filter(img => !(img.complete && img.naturalWidth > 0))
  .map(img => img.getAttribute('src'))"""
LINKS_JS = "() => Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"
RAW_TEX = re.compile(r"\$\$|\$[^$\s][^$]*?\$|\\\(|\\\)|\\\[|\\\]|\\begin\{")


def newest_mtime(paths) -> float:
    times = [0.0]
    for rel in paths:
        path = ROOT / rel
        if path.is_dir():
            times += [p.stat().st_mtime for p in path.rglob("*") if p.is_file()]
        elif path.exists():
            times.append(path.stat().st_mtime)
    return max(times)


class _Ids(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value and (name == "id" or (tag == "a" and name == "name")):
                self.ids.add(value)


@functools.cache
def anchors_of(page: Path) -> frozenset:
    parser = _Ids()
    parser.feed(page.read_text(encoding="utf-8"))
    return frozenset(parser.ids)


def link_problem(href: str, origin: str) -> str | None:
    """Why an internal link does not resolve on the built site, or None when it does."""
    parts = urlsplit(href)
    if f"{parts.scheme}://{parts.netloc}" != origin:
        return None  # another site, mailto:, javascript: ... nothing the site must hold
    target = SITE / unquote(parts.path).lstrip("/")
    if target.is_dir():
        target = target / "index.html"
    if not target.is_file():
        return f"{href}: no such file"
    if parts.fragment and target.suffix == ".html":
        ids = anchors_of(target)
        if parts.fragment not in ids and unquote(parts.fragment) not in ids:
            hint = " (a link Sphinx could not resolve: does its target exist?)" if "/" in parts.fragment else ""
            return f"{href}: no anchor #{parts.fragment} in {target.relative_to(SITE)}{hint}"
    return None


@pytest.fixture(scope="session")
def built_site() -> Path:
    index = SITE / "index.html"
    if not index.exists() or newest_mtime(SOURCES) > index.stat().st_mtime:
        subprocess.run(["bash", "scripts/build_site.sh"], cwd=ROOT, check=True)
    return SITE


# Module scope: the browser and server are gone before nbval's kernels start (asyncio loops).
@pytest.fixture(scope="module")
def server(built_site):
    handler = functools.partial(QuietHandler, directory=str(built_site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


def launch(playwright):
    """Debian's chromium, never a browser downloaded by Playwright."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} not found: run `bash scripts/setup_env.sh` (it installs Debian's "
                    "`chromium`), or point CHROMIUM_PATH at a Chromium or Chrome binary")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: run `bash scripts/setup_env.sh`")
    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


def open_page(browser, url: str, viewport=None):
    """Open `url`; return (page, problems) once the page, its images, math and fonts are loaded."""
    context = browser.new_context(viewport=viewport or {"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    problems = []
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(url))

    def route(route):
        request_url = route.request.url
        if urlsplit(request_url).scheme in ("data", "blob") or request_url.startswith(origin + "/"):
            route.continue_()
        else:
            problems.append(f"request leaves 127.0.0.1: {request_url}")
            route.abort()

    context.route("**/*", route)
    page.on("console", lambda msg: msg.type == "error" and problems.append(
        f"console error: {msg.text} ({msg.location.get('url')})"))
    page.on("pageerror", lambda error: problems.append(f"uncaught exception: {error}"))
    page.on("requestfailed", lambda request: problems.append(
        f"request failed: {request.url} ({request.failure})"))
    page.on("response", lambda response: response.status >= 400 and problems.append(
        f"HTTP {response.status}: {response.url}"))

    response = page.goto(url, wait_until="load")
    assert response is not None and response.ok, f"{url}: {response and response.status}"
    if page.evaluate("() => document.querySelector('.math') !== null"):
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
        page.evaluate("() => MathJax.startup.promise.then(() => document.fonts.ready).then(() => true)")
    return page, problems


@pytest.mark.parametrize("name", PAGES)
def test_page_in_chromium(name, browser, server):
    page, problems = open_page(browser, f"{server}/{name}")
    try:
        problems += [f"image not loaded: {src}" for src in page.evaluate(BROKEN_IMAGES_JS)]
        typeset = page.evaluate("() => document.querySelectorAll('mjx-container').length")
        pending = page.evaluate("() => document.querySelectorAll('.math:not(:has(mjx-container))').length")
        if pending:
            problems.append(f"{pending} math elements not typeset by MathJax ({typeset} typeset)")
        errors = page.evaluate("() => Array.from(document.querySelectorAll('mjx-merror'))"
                               ".map(e => e.getAttribute('data-mjx-error') || e.textContent)")
        problems += [f"MathJax TeX error: {e}" for e in errors]
        prose = page.evaluate(VISIBLE_PROSE_JS)
        problems += [f"raw TeX left in the text: ...{prose[max(m.start() - 40, 0):m.end() + 40]!r}..."
                     for m in RAW_TEX.finditer(prose)]
        problems += filter(None, (link_problem(href, server) for href in set(page.evaluate(LINKS_JS))))
    finally:
        page.context.close()
    # A failed image is reported again when the page re-requests it: each problem once.
    assert problems == [], f"{name}:\n" + "\n".join(dict.fromkeys(problems))


@pytest.mark.parametrize("source, link, expected", [
    ("README.md", "[n](notebooks/04_attention.ipynb)", "[n](notebooks/04_attention.ipynb)"),
    ("README.md", "![a](images/architecture.png)", "![a](images/architecture.png)"),
    ("README.md", "[s](scripts/test.sh)", "[s]({repo}/blob/main/scripts/test.sh)"),
    ("README.md", "[r](results/multi30k/)", "[r]({repo}/tree/main/results/multi30k)"),
    ("README.md", "[h](#syllabus)", "[h](#syllabus)"),
    ("README.md", "[w](https://arxiv.org/abs/1706.03762)", "[w](https://arxiv.org/abs/1706.03762)"),
    ("notebooks/05_multihead_attention.ipynb", "[n](04_attention.ipynb#masks)", "[n](04_attention.ipynb#masks)"),
    ("notebooks/05_multihead_attention.ipynb", "[c](../transformer_lib/attention.py)",
     "[c]({repo}/blob/main/transformer_lib/attention.py)"),
    ("notebooks/05_multihead_attention.ipynb", "[m](../README.md#syllabus)", "[m](../index.md#syllabus)"),
    ("notebooks/05_multihead_attention.ipynb", "[x](no_such_file.ipynb)", "[x](no_such_file.ipynb)"),
])
def test_staging_points_links_to_non_pages_at_github(source, link, expected):
    pages = set(site_pages()) | {"notebooks/04_attention.ipynb"}
    repo = repository_url()
    assert rewrite_links(link, source, pages, repo) == expected.format(repo=repo)


def test_every_built_page_is_tested(built_site):
    built = {p.relative_to(built_site).as_posix() for p in built_site.rglob("*.html")
             if not p.relative_to(built_site).as_posix().startswith("_static/")}
    assert built == set(PAGES)


def test_no_page_loads_anything_from_a_cdn(built_site):
    """The built HTML names no remote script, stylesheet, font or image; links may go anywhere."""
    remote = re.compile(r"<(?:script|link|img|iframe|source)\b[^>]*?\b(?:src|href)=[\"'](?:https?:)?//", re.I)
    offenders = {name: remote.findall((built_site / name).read_text(encoding="utf-8"))
                 for name in PAGES}
    assert {name: found for name, found in offenders.items() if found} == {}


def take_screenshots() -> None:
    """Write images/site_front_page.png and images/site_notebook_page.png from the built site."""
    from playwright.sync_api import sync_playwright

    subprocess.run(["bash", "scripts/build_site.sh"], cwd=ROOT, check=True)
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(SITE)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{httpd.server_address[1]}"
    shots = {"site_front_page.png": ("index.html", None),
             "site_notebook_page.png": ("notebooks/04_attention.html", "#the-equation")}
    with sync_playwright() as playwright:
        browser = launch(playwright)
        for file_name, (name, anchor) in shots.items():
            page, problems = open_page(browser, f"{origin}/{name}", viewport={"width": 1280, "height": 800})
            assert problems == [], problems
            if anchor and page.query_selector(anchor):
                page.evaluate(f"() => document.querySelector({anchor!r}).scrollIntoView()")
                page.wait_for_timeout(300)
            page.screenshot(path=str(ROOT / "images" / file_name))
            page.context.close()
            print(f"wrote images/{file_name}")
        browser.close()
    httpd.shutdown()


if __name__ == "__main__":
    if sys.argv[1:] != ["--screenshots"]:
        sys.exit(f"usage: {sys.argv[0]} --screenshots   (the tests run under pytest)")
    take_screenshots()
