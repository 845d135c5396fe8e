"""Headless Chromium for tests/test_site.py: serve a built site on 127.0.0.1, open a page in Debian's
`chromium` through Playwright and wait until it is ready (images, math, fonts, course.js's fitting),
collecting what goes wrong on the way; resize an open page.

`CHROMIUM_PATH` picks another Chromium build (default /usr/bin/chromium, which
scripts/setup_env.sh installs on Debian).
"""

import contextlib
import functools
import http.server
import os
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PAGE_TIMEOUT_MS = 30_000
VIEWPORTS = {"phone": {"width": 390, "height": 844}, "laptop": {"width": 1366, "height": 900}}


@contextlib.contextmanager
def serve(directory: Path):
    """Serve `directory` on 127.0.0.1; yield its origin (`http://127.0.0.1:PORT`)."""
    handler = functools.partial(QuietHandler, directory=str(directory))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
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


def open_page(browser, url: str, viewport=None):
    """Open `url`; return (page, problems) once the page, its images, math and fonts are loaded."""
    context = browser.new_context(viewport=viewport or VIEWPORTS["laptop"])
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
    # course.js has fitted the page: a wide table made cards, a formula too wide for its line given
    # a scrolling line of its own.
    page.wait_for_function("() => document.documentElement.dataset.courseMath === 'fitted'")
    return page, problems


def resize(page, viewport: dict) -> None:
    """Give `page` another window size and wait until course.js has fitted the page to it."""
    if page.viewport_size == viewport:
        return  # no resize event: nothing to fit again
    page.evaluate("() => { delete document.documentElement.dataset.courseMath; }")
    page.set_viewport_size(viewport)
    page.wait_for_function("() => document.documentElement.dataset.courseMath === 'fitted'")
