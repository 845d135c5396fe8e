"""The course website, checked in a real headless Chromium, page by page, on a phone and a laptop.

The site is built by `bash scripts/build_site.sh` (again only when a source is newer than it),
served from build/site on 127.0.0.1, and every page is opened once in Debian's `chromium` driven
by Playwright (tests/site_browser.py) at 390 x 844 (a phone), then resized to 1366 x 900 (a
laptop): one load checks both widths, as course.js fits the page again when the window changes.
Each page must: log no console error, request nothing outside 127.0.0.1, load every image, finish
MathJax with no TeX error and no raw `$...$` left in its text, have every internal link point to
an existing page and anchor, be no wider than the window, let every code block, output and display equation either fit its
column or scroll in its own box (never cut off), fit every table in its column (a wide one as
cards of "header: value", each with its header), show no nbdev directive line, and, when it is
longer than two screens, show a "Back to top" that covers nothing once the reader is down the page.

On the phone, the smallest text of every figure that records its font size (the PNG's tEXt entry
TEXT_SIZE_KEY, written by transformer_lib.plotting.use_course_style, and its pHYs dpi) is measured
as displayed: font_pt * dpi / 72 * (displayed width / the PNG's width) CSS px. Every such figure must
reach MIN_FIGURE_TEXT_PX, and at least MEASURED_FIGURES of them must be measurable;
build/site_figure_text.json lists each figure's size.

A cell folded in Jupyter (tag `hide-input`, `jupyter.source_hidden`) must show as a collapsed
"show code" toggle with its outputs visible: checked on a small notebook built through the same
docs/conf.py, and on every folded cell of the real site; the small notebook also prints a wide
table, which must read as cards with every number in the window. A tapped figure opens at full
size, and "Back to top" takes the reader up. The staging itself: tests/test_site_staging.py.

`CHROMIUM_PATH` picks another Chromium build (default /usr/bin/chromium, which
scripts/setup_env.sh installs on Debian). `python tests/test_site.py --screenshots` writes the
README's screenshots of the site to images/.
"""

import functools
import html.parser
import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
from stage_site import DOC_PAGES, repository_url, site_cells, site_pages  # noqa: E402
from site_browser import VIEWPORTS, launch, open_page, resize, serve  # noqa: E402
from transformer_lib.plotting import TEXT_SIZE_KEY  # noqa: E402

SITE = ROOT / "build" / "site"
SOURCES = ["README.md", "pyproject.toml", "images", "notebooks", "solutions", "docs/conf.py",
           "docs/stage_site.py", "docs/printed_tables.py", "docs/_static", "docs/_templates", "scripts/build_site.sh", *DOC_PAGES]
# The front page, the notebooks, the solutions, the Markdown pages, and the pages Sphinx adds.
PAGES = (["index.html"] + [Path(p).with_suffix(".html").as_posix() for p in site_pages()]
         + ["genindex.html", "search.html"])

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
# The page fits the window; every code block, output, display equation and table of the article
# fits its column or scrolls sideways in its own box (which shows shadows at the edges that hide
# more); nothing else is drawn outside the column. Returns the problems, and how many blocks scroll.
LAYOUT_JS = """() => {
  const problems = [];
  const viewport = window.innerWidth;
  const width = document.documentElement.scrollWidth;
  if (width > viewport) problems.push(`the page is ${width} px wide in a ${viewport} px window`);
  const article = document.querySelector('.bd-article');
  if (!article) return {problems, blocks: 0, scrolling: 0};
  const column = article.getBoundingClientRect();
  const right = Math.min(column.right, viewport) + 1, left = Math.max(column.left, 0) - 1;
  const scrollBox = el => {  // the element itself, or its nearest ancestor in the article, that scrolls sideways
    for (let e = el; e && e !== article; e = e.parentElement)
      if (['auto', 'scroll'].includes(getComputedStyle(e).overflowX)) return e;
    return null;
  };
  const describe = el => `<${el.tagName.toLowerCase()} class="${el.className}"> ` +
    JSON.stringify((el.textContent || el.getAttribute('src') || '').trim().slice(0, 60));
  const blocks = Array.from(article.querySelectorAll('pre, mjx-container[display="true"], table'))
    .filter(el => el.getClientRects().length > 0);
  let scrolling = 0;
  for (const el of blocks) {
    const box = scrollBox(el);
    const r = (box || el).getBoundingClientRect();
    if (r.left < left || r.right > right)
      problems.push(`sticks out of the column (${Math.round(r.left)}-${Math.round(r.right)} px): ${describe(el)}`);
    if (!box && el.scrollWidth > el.clientWidth + 1) {
      problems.push(`cut off: ${el.scrollWidth} px of content in ${el.clientWidth} px, no scrollbar: ${describe(el)}`);
    } else if (box && box.scrollWidth > box.clientWidth + 1) {
      scrolling++;
      if (el.tagName === 'TABLE')  // a reader must see every number without scrolling sideways
        problems.push(`table needs a sideways scroll (${box.scrollWidth} px in ${box.clientWidth} px): ${describe(el)}`);
      if (!getComputedStyle(box).backgroundImage.includes('gradient'))
        problems.push(`scrolls without the edge shadows: ${describe(el)}`);
    }
  }
  // A formula course.js put on a scrolling line of its own must be wider than the box it is in.
  for (const math of article.querySelectorAll('mjx-container.course-wide-math')) {
    let box = math.parentElement;
    while (box && getComputedStyle(box).display === 'inline') box = box.parentElement;
    if (box && math.getClientRects().length && math.scrollWidth <= box.clientWidth)
      problems.push(`a formula that fits its line (${math.scrollWidth} px in ${box.clientWidth} px) scrolls on a line of its own: ${describe(math)}`);
  }
  // A table shown as cards: each shown cell names its column.
  for (const cell of article.querySelectorAll('table.course-stacked td')) {
    if (cell.getClientRects().length && !getComputedStyle(cell, '::before').content.includes(':'))
      problems.push(`a card's cell without its header: ${describe(cell)}`);
  }
  let outside = 0;
  for (const el of article.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || (r.right <= right && r.left >= left)) continue;
    // MathJax's assistive MathML is clipped to nothing; a scrolling box shows the rest.
    if (scrollBox(el) || el.closest('mjx-assistive-mml')) continue;
    if (outside++ < 5)
      problems.push(`drawn outside the column (${Math.round(r.left)}-${Math.round(r.right)} px): ${describe(el)}`);
  }
  return {problems, blocks: blocks.length, scrolling};
}"""
# nbdev's `#| export` / `#| default_exp` lines at the top of a code cell, as the page shows them.
DIRECTIVES_JS = r"""() => Array.from(document.querySelectorAll('.cell_input pre'))
  .map(pre => pre.textContent).filter(code => /^\s*#\|/.test(code)).map(code => code.slice(0, 60))"""
# On a page longer than two screens, "Back to top" must show once the reader is at the bottom (at
# every width), and what lies under it must be the header bar's background, not text or a control.
BACK_TO_TOP_JS = """async () => {
  const frames = n => new Promise(resolve => {
    const step = k => k ? requestAnimationFrame(() => step(k - 1)) : resolve();
    step(n);
  });
  const button = document.getElementById('pst-back-to-top');
  if (!button) return ['no Back to top button'];
  const height = document.documentElement.scrollHeight;
  if (height <= 2 * window.innerHeight) return [];
  window.scrollTo({top: height, behavior: 'instant'});
  await frames(3);
  const r = button.getBoundingClientRect();
  if (getComputedStyle(button).display === 'none' || r.width === 0 || r.bottom <= 0 || r.top >= window.innerHeight)
    return [`no Back to top at the bottom of a page ${(height / window.innerHeight).toFixed(1)} screens long`];
  const header = document.querySelector('.bd-header-article');
  const problems = [];
  for (const fx of [0.05, 0.5, 0.95]) for (const fy of [0.1, 0.5, 0.9]) {
    const x = r.left + fx * r.width, y = r.top + fy * r.height;
    const under = document.elementsFromPoint(x, y).find(e => !button.contains(e) && e !== button);
    const control = under && under.closest('a, button, input, p, li, pre, code, h1, h2, h3, h4, table, img');
    if (!under || !header || !header.contains(under) || control)
      problems.push(`Back to top covers ${under ? under.tagName.toLowerCase() + '.' + under.className : 'nothing drawn'} at (${Math.round(x)}, ${Math.round(y)})`);
  }
  return problems;
}"""
# Every figure of the article as the page shows it: its file, displayed and natural width.
FIGURES_JS = """() => Array.from(document.querySelectorAll('.bd-article img'))
  .map(img => ({src: img.currentSrc || img.src, shown: img.getBoundingClientRect().width, natural: img.naturalWidth}))"""
MIN_FIGURE_TEXT_PX = 8     # the smallest figure text a phone reader reads without a tap
MEASURED_FIGURES = 32      # figures that record their font size (every stored notebook figure but one)
# (page, figure file) -> its smallest text on the phone in CSS px, or None when it records no font size.
FIGURE_TEXT_PX: dict[tuple[str, str], float | None] = {}


def figure_text_px(png: Path, shown_width: float) -> float | None:
    """The smallest text of the figure `png` shown `shown_width` CSS px wide, in CSS px; None when
    the PNG does not record its smallest font size (TEXT_SIZE_KEY) and its dpi."""
    from PIL import Image

    with Image.open(png) as image:
        font_pt, dpi, natural_width = image.info.get(TEXT_SIZE_KEY), image.info.get("dpi"), image.width
    if font_pt is None or not dpi:
        return None
    return float(font_pt) * dpi[0] / 72 * shown_width / natural_width


def measure_figures(page, name: str, origin: str) -> list[str]:
    """Record the smallest text of each figure on `page` (FIGURE_TEXT_PX); the ones too small."""
    problems = []
    for figure in page.evaluate(FIGURES_JS):
        src = urlsplit(figure["src"])
        if f"{src.scheme}://{src.netloc}" != origin or not figure["natural"]:
            continue  # a broken image is reported on its own
        png = SITE / unquote(src.path).lstrip("/")
        size = figure_text_px(png, figure["shown"]) if png.suffix == ".png" else None
        FIGURE_TEXT_PX[name, png.name] = size
        if size is not None and size < MIN_FIGURE_TEXT_PX:
            problems.append(f"figure text {size:.1f} px < {MIN_FIGURE_TEXT_PX} px on a phone: {png.name}")
    return problems


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
    """The site, built once: under a lock, since workers that share this file's tests (`pytest -n N`
    without `--dist loadfile`) would otherwise rebuild build/site at the same time and break each other."""
    import fcntl                                   # POSIX; the site's tests do not run on Windows
    SITE.parent.mkdir(parents=True, exist_ok=True)
    with open(SITE.parent / "site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # released when the file closes, also on an error
        index = SITE / "index.html"
        if not index.exists() or newest_mtime(SOURCES) > index.stat().st_mtime:
            subprocess.run(["bash", "scripts/build_site.sh"], cwd=ROOT, check=True)
    return SITE


# Module scope: the browser and server are gone before nbval's kernels start (asyncio loops).
@pytest.fixture(scope="module")
def server(built_site):
    with serve(built_site) as origin:
        yield origin


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


@pytest.mark.parametrize("name", PAGES)
def test_page_in_chromium(name, browser, server):
    """The page as a phone shows it, then the same page in a laptop's window (one load for both:
    course.js fits the page again when the window changes, as it does when a tablet turns)."""
    page, problems = open_page(browser, f"{server}/{name}", viewport=VIEWPORTS["phone"])
    try:
        for viewport in VIEWPORTS:
            if viewport != "phone":
                resize(page, VIEWPORTS[viewport])
            problems += [f"{viewport}: {p}" for p in page.evaluate(LAYOUT_JS)["problems"]]
            problems += [f"{viewport}: {p}" for p in page.evaluate(BACK_TO_TOP_JS)]
            if viewport == "phone":
                problems += measure_figures(page, name, server)
        problems += [f"nbdev directive shown: {code!r}" for code in page.evaluate(DIRECTIVES_JS)]
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


def test_figure_text_on_a_phone(browser, server):
    """Every figure that records its font size, measured at 390 px: how many reach 8 CSS px.

    test_page_in_chromium measured the pages it opened on the phone; the others are opened here."""
    with_figures = [name for name in PAGES if "<img" in (SITE / name).read_text(encoding="utf-8")]
    for name in with_figures:
        if not any(page == name for page, _ in FIGURE_TEXT_PX):
            page, _ = open_page(browser, f"{server}/{name}", viewport=VIEWPORTS["phone"])
            try:
                measure_figures(page, name, server)
            finally:
                page.context.close()
    sizes = {f"{page} {png}": size for (page, png), size in sorted(FIGURE_TEXT_PX.items()) if page in with_figures}
    measured = [size for size in sizes.values() if size is not None]
    readable = sum(size >= MIN_FIGURE_TEXT_PX for size in measured)
    report = ROOT / "build" / "site_figure_text.json"
    report.with_suffix(".tmp").write_text(json.dumps(sizes, indent=1) + "\n", encoding="utf-8")
    report.with_suffix(".tmp").replace(report)
    print(f"figure text on a 390 px phone: {readable} of {len(sizes)} figures reach {MIN_FIGURE_TEXT_PX} px, "
          f"{len(measured)} record their font size; sizes in build/site_figure_text.json")
    assert len(measured) >= MEASURED_FIGURES, sizes
    assert readable == len(measured), sizes


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


# --- Folded cells: a "show code" toggle, outputs visible ---------------------------------------

def folded_cells(nb: dict) -> int:
    return sum("hide-input" in c.get("metadata", {}).get("tags", []) for c in nb["cells"])


def test_every_folded_cell_of_the_site_is_a_collapsed_toggle(built_site):
    """Each cell the staged notebooks fold (tag `hide-input`) is a closed <details> on its page."""
    staged = ROOT / "build" / "site_src"
    for page in site_pages():
        if not page.endswith(".ipynb"):
            continue
        nb = json.loads((staged / page).read_text(encoding="utf-8"))
        html_text = (built_site / Path(page).with_suffix(".html")).read_text(encoding="utf-8")
        toggles = re.findall(r'<div class="cell [^"]*\btag_hide-input\b[^"]*">\s*<details class="([^"]*)"', html_text)
        assert len(toggles) == folded_cells(nb), page
        assert all("above-input" in t.split() for t in toggles), page


def code_cell(source, outputs=(), **metadata) -> dict:
    return {"cell_type": "code", "id": f"c{abs(hash(source))}", "execution_count": 1, "metadata": metadata, "source": source,
            "outputs": [{"output_type": "stream", "name": "stdout", "text": text} for text in outputs]}


# A printed table wider than a phone's output box (notebook 13's BLEU table, two rows of it).
BLEU_TABLE = """\
model           test set   decoding BLEU:  seed_0  seed_1   mean   chrF mean
ours            test_2016  greedy            37.6    37.7  37.64        57.4
nn.Transformer  test_2017  beam4             29.1    30.4  29.71        49.7
"""
# Where each cell of the printed table is on the phone, and the header it is shown with.
TABLE_CELLS_JS = """() => Array.from(document.querySelectorAll('.bd-article table.course-text-table td')).map(td => {
  const r = td.getBoundingClientRect();
  return {text: td.textContent, label: getComputedStyle(td, '::before').content,
          inWindow: r.left >= 0 && r.right <= window.innerWidth,
          stacked: td.closest('table').classList.contains('course-stacked')};
})"""


def test_folded_cell_and_printed_table_in_a_small_notebook(tmp_path, browser):
    """A small notebook built through the site's own docs/conf.py, opened in Chromium on a phone:
    folded cells are closed toggles above their outputs; a wide printed table is cards whose every
    number is in the window, next to its column's header."""
    src, out = tmp_path / "src", tmp_path / "site"
    (src / "notebooks").mkdir(parents=True)
    cells = [
        {"cell_type": "markdown", "id": "title", "metadata": {}, "source": "# Folded cells\n\nThe next cell only guards its input."},
        code_cell("#| export\nif n < 0:\n    raise ValueError('n must be >= 0')\nprint('guarded')",
                  ["guarded\n"], jupyter={"source_hidden": True}, tags=["hide-input"]),
        code_cell("print('only folded in Jupyter')", ["folded too\n"], jupyter={"source_hidden": True}),
        code_cell("print('shown')", ["shown\n"]),
        code_cell("print(bleu_table)", [BLEU_TABLE]),
    ]
    nb = {"nbformat": 4, "nbformat_minor": 5, "cells": site_cells(cells, "notebooks/folded.ipynb", set(), repository_url()),
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}
    (src / "notebooks" / "folded.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    (src / "index.md").write_text("# Index\n\n```{toctree}\nnotebooks/folded\n```\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-c", str(ROOT / "docs"),
                    "-d", str(tmp_path / "doctrees"), str(src), str(out)], check=True)
    with serve(out) as origin:
        page, problems = open_page(browser, f"{origin}/notebooks/folded.html", viewport=VIEWPORTS["phone"])
        try:
            cells = page.evaluate("""() => Array.from(document.querySelectorAll('.bd-article .cell')).map(cell => {
              const details = cell.querySelector('details');
              const code = cell.querySelector('.cell_input pre');
              const output = cell.querySelector('.cell_output pre');
              return {toggle: details ? details.querySelector('summary').innerText.trim() : null,
                      open: details ? details.open : null,
                      codeShown: code.checkVisibility(),
                      output: output && output.checkVisibility() ? output.textContent.trim() : null};
            })""")
            assert cells == [
                {"toggle": "Show code cell source", "open": False, "codeShown": False, "output": "guarded"},
                {"toggle": "Show code cell source", "open": False, "codeShown": False, "output": "folded too"},
                {"toggle": None, "open": None, "codeShown": True, "output": "shown"},
                {"toggle": None, "open": None, "codeShown": True, "output": None},  # the table
            ]
            table = page.evaluate(TABLE_CELLS_JS)
            assert [(c["text"], c["label"]) for c in table[:7]] == [
                ("ours", '"model: "'), ("test_2016", '"test set: "'), ("greedy", '"decoding: "'),
                ("37.6", '"BLEU: seed_0: "'), ("37.7", '"seed_1: "'), ("37.64", '"mean: "'), ("57.4", '"chrF mean: "')]
            assert len(table) == 14 and all(c["inWindow"] and c["stacked"] for c in table), table
            page.click(".bd-article details summary")
            shown = page.evaluate("() => document.querySelector('.bd-article details .cell_input pre').innerText")
            assert shown.startswith("if n < 0:")          # the code, without nbdev's directive line
            assert problems == []
        finally:
            page.context.close()


# --- On the phone: figures open at full size, Back to top -----------------------------------------

# A long notebook page with figures, opened once on the phone for the tests below.
PHONE_NOTEBOOK = "notebooks/05_multihead_attention.html"


@pytest.fixture(scope="module")
def phone_notebook(browser, server):
    page, problems = open_page(browser, f"{server}/{PHONE_NOTEBOOK}", viewport=VIEWPORTS["phone"])
    yield page, problems
    page.context.close()


def test_tapping_a_figure_opens_it_at_full_size(phone_notebook):
    page, problems = phone_notebook
    link = page.locator("a.course-figure-link").first
    link.scroll_into_view_if_needed()
    shrunk = link.locator("img").bounding_box()["width"]
    link.click()
    full = page.locator(".course-figure-viewer img")
    full.wait_for()
    page.wait_for_function("() => document.querySelector('.course-figure-viewer img').complete")
    natural = page.evaluate("() => document.querySelector('.course-figure-viewer img').naturalWidth")
    assert full.bounding_box()["width"] == natural > 1.5 * shrunk
    page.keyboard.press("Escape")
    assert page.locator(".course-figure-viewer").count() == 0
    assert problems == []


def test_back_to_top_takes_the_reader_up(phone_notebook):
    """Down the page, "Back to top" shows in the header bar and takes the reader back up."""
    page, problems = phone_notebook
    page.evaluate("() => window.scrollTo({top: document.documentElement.scrollHeight, behavior: 'instant'})")
    page.locator("#pst-back-to-top").click()
    page.wait_for_function("() => window.scrollY === 0")
    assert problems == []


# --- The front page starts the course ------------------------------------------------------------

def test_front_page_starts_the_course_three_ways():
    """Colab at notebook 00, one local command, the website: all on the README's first screen."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    repo = repository_url()
    owner, name = repo.removeprefix("https://github.com/").split("/")
    first_screen = "\n".join(readme.splitlines()[:30])
    assert f"https://colab.research.google.com/github/{owner}/{name}/blob/main/notebooks/00_course_map.ipynb" in first_screen
    assert "bash scripts/start_course.sh" in first_screen and (ROOT / "scripts" / "start_course.sh").is_file()
    assert f"https://{owner}.github.io/{name}/" in first_screen
    assert "jupyter lab" in (ROOT / "scripts" / "start_course.sh").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150, "README.md is the learner's page: maintainer detail goes to CONTRIBUTING.md"


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    testing = readme.split("\n## Testing\n", 1)[1].split("\n## ", 1)[0]
    assert "bash scripts/test.sh" in testing
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()


def test_readme_screenshots_exist_one_at_phone_size():
    from PIL import Image

    sizes = {}
    for shot in re.findall(r"\(images/(site_[a-z_]+\.png)\)", (ROOT / "README.md").read_text(encoding="utf-8")):
        with Image.open(ROOT / "images" / shot) as image:
            sizes[shot] = image.size
    assert sizes.get("site_phone_page.png") == (VIEWPORTS["phone"]["width"], VIEWPORTS["phone"]["height"])
    assert sizes.get("site_front_page.png") == (VIEWPORTS["laptop"]["width"], VIEWPORTS["laptop"]["height"])


# --- The README's screenshots ----------------------------------------------------------------------

# file: (page, element to scroll to the top, viewport)
SCREENSHOTS = {
    "site_front_page.png": ("index.html", None, "laptop"),
    "site_notebook_page.png": ("notebooks/05_multihead_attention.html", "#the-core-multi-head-attention-in-under-twenty-lines", "laptop"),
    "site_phone_page.png": ("notebooks/05_multihead_attention.html", "#the-equations", "phone"),
}


def take_screenshots() -> None:
    """Write the README's pictures of the site (SCREENSHOTS) into images/ from a fresh build."""
    from playwright.sync_api import sync_playwright

    subprocess.run(["bash", "scripts/build_site.sh"], cwd=ROOT, check=True)
    with serve(SITE) as origin, sync_playwright() as playwright:
        browser = launch(playwright)
        for file_name, (name, anchor, viewport) in SCREENSHOTS.items():
            page, problems = open_page(browser, f"{origin}/{name}", viewport=VIEWPORTS[viewport])
            # A screenshot taken for the first time is missing from the site it is taken of.
            assert [p for p in problems if not any(shot in p for shot in SCREENSHOTS)] == [], problems
            if anchor:
                page.evaluate(f"() => document.querySelector({anchor!r}).scrollIntoView()")
                page.wait_for_timeout(300)
            page.screenshot(path=str(ROOT / "images" / file_name))
            page.context.close()
            print(f"wrote images/{file_name}")
        browser.close()


if __name__ == "__main__":
    if sys.argv[1:] != ["--screenshots"]:
        sys.exit(f"usage: {sys.argv[0]} --screenshots   (the tests run under pytest)")
    take_screenshots()
