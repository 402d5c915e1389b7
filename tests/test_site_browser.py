"""The built site, in a real browser: math rendered, links resolved, figures loaded.

The site is built by ``python -m sphinx -W --keep-going -b html -c docs/site . docs/_build/html``
(``docs/site/README.md``). This test serves ``docs/_build/html`` on loopback, opens pages in
Debian's headless Chromium through Selenium (``apt-get install chromium chromium-driver``; no
browser is downloaded), and checks on each page:

* the math was rendered: MathJax's elements are there, none of them an error, and no raw
  ``\\(``, ``\\[`` or ``$$`` is left in the text outside code;
* every internal link resolves: its page answers, and its ``#fragment`` names an element of
  that page (a tag of an annotated reference links to its equation this way);
* every figure loaded, with a non-zero size.

It saves a screenshot of each page in ``docs/_build/screenshots/``. A negative control, a copy
of the annotated attention page with a dead equation link, a dead page link, broken and raw
math and a missing figure, must fail each check. Marked ``site``; skipped, saying why, when
the site is not built, or Chromium, its driver or Selenium is absent; under CI (``CI=true``,
``.ci/run`` builds the site and installs Chromium) it fails instead.
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import importlib.util
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "docs" / "_build" / "html"
SCREENSHOTS = ROOT / "docs" / "_build" / "screenshots"
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
BUILD = "python -m sphinx -W --keep-going -b html -c docs/site . docs/_build/html"
PAGES = {  # name -> (page, whether it must show figures, whether it must show math)
    "annotated_attention": ("docs/site/_generated/functional/attention.html", False, True),
    "notebook_attention": ("docs/notebooks/solutions/02_attention.html", True, True),
    "experiments": ("experiments/README.html", True, False),
    "pictures": ("docs/site/pictures.html", True, True),
}
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")


def skip_reason() -> str | None:
    missing = [p for p, *_ in PAGES.values() if not (SITE / p).exists()]
    if missing:
        return f"the site is not built ({missing[0]} is missing): run {BUILD}"
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        return "Chromium or its driver is absent: apt-get install chromium chromium-driver"
    if importlib.util.find_spec("selenium") is None:
        return 'Selenium is absent: pip install ".[docs]"'
    return None


REASON = skip_reason()
IN_CI = os.environ.get("CI") == "true"  # .ci/run builds the site: there it must not skip
pytestmark = [pytest.mark.site, pytest.mark.skipif(REASON is not None and not IN_CI,
                                                   reason=REASON or "")]


def test_ci_has_what_the_browser_checks_need():
    assert REASON is None, REASON


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no line per request on stderr
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``serve(folder) -> base URL``: a folder on loopback, for as long as the module runs."""
    servers = []

    def serve(folder: Path) -> str:
        handler = functools.partial(_Quiet, directory=str(folder))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS + (f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
                         "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


class _Ids(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs) -> None:
        self.ids |= {v for k, v in attrs if k in ("id", "name") and v}


@functools.cache
def _fetch(url: str) -> tuple[int, frozenset[str]]:
    """(HTTP status, the ids of the page's elements) of one URL."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            body, status = response.read(), response.status
    except urllib.error.HTTPError as e:
        return e.code, frozenset()
    ids = _Ids()
    if url.split("?")[0].endswith(".html"):
        ids.feed(body.decode("utf-8", "replace"))
    return status, frozenset(ids.ids)


TEXT_OUTSIDE_CODE = """
const body = document.body.cloneNode(true);
body.querySelectorAll('pre, code, script, style, mjx-container, .highlight')
    .forEach(e => e.remove());
return body.textContent;
"""
WAIT_FOR_MATHJAX = """
const done = arguments[arguments.length - 1];
if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    MathJax.startup.promise.then(() => done('typeset')).catch(e => done('failed: ' + e));
} else { done('absent'); }
"""
IMAGES = """
const done = arguments[arguments.length - 1];
const images = Array.from(document.images);
for (const image of images) { image.loading = 'eager'; image.scrollIntoView(); }
Promise.all(images.map(image => image.complete ? null : new Promise(
    r => { image.onload = r; image.onerror = r; setTimeout(r, 10000); }))).then(() => {
  window.scrollTo(0, 0);
  done(images.map(i => [i.getAttribute('src'), i.naturalWidth, i.naturalHeight,
                        i.getBoundingClientRect().width, i.getBoundingClientRect().height]));
});
"""


def inspect_page(driver, url: str, screenshot: Path | None, figures: bool,
                 math: bool) -> list[str]:
    """Open ``url``, check it as the module docstring says (that it shows figures and math
    when told so); returns the problems found."""
    problems = []
    driver.get(url)
    mathjax = driver.execute_async_script(WAIT_FOR_MATHJAX)
    if mathjax not in ("typeset", "absent" if not math else None):
        problems.append(f"MathJax did not typeset the page: {mathjax}")
    rendered = driver.execute_script("return document.querySelectorAll('mjx-container').length")
    if math and rendered == 0:
        problems.append("no math rendered (no mjx-container element)")
    errors = driver.execute_script("return Array.from(document.querySelectorAll('mjx-merror'))"
                                   ".map(e => e.textContent)")
    problems += [f"MathJax error: {e}" for e in errors]
    text = driver.execute_script(TEXT_OUTSIDE_CODE)
    for raw in ("\\(", "\\[", "$$"):
        if raw in text:
            at = text.index(raw)
            problems.append(f"raw math {raw!r} left in the text: {text[at:at + 60]!r}")
    links = driver.execute_script("return Array.from(document.querySelectorAll('a[href]'))"
                                  ".map(a => a.href)")
    base = url.split("#")[0]
    origin = urllib.parse.urljoin(url, "/")
    for link in sorted(set(links)):
        if not link.startswith(origin):
            continue
        page, _, fragment = link.partition("#")
        status, ids = _fetch(page or base)
        if status != 200:
            problems.append(f"dead link {link}: HTTP {status}")
        elif fragment and urllib.parse.unquote(fragment) not in ids:
            problems.append(f"dead link {link}: no element #{fragment} on its page")
    images = driver.execute_async_script(IMAGES)
    if figures and not images:
        problems.append("no figure on the page")
    for src, width, height, shown_width, shown_height in images:
        if min(width, height, shown_width, shown_height) <= 0:
            problems.append(f"figure {src} did not load ({width}x{height}, shown "
                            f"{shown_width:.0f}x{shown_height:.0f})")
    if screenshot is not None:
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1400, min(max(height, 1000), 16000))
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(screenshot))
        driver.set_window_size(1400, 1000)
    return problems


@pytest.mark.parametrize("name", list(PAGES))
def test_the_page_renders_and_links_and_shows(name, browser, served):
    page, figures, math = PAGES[name]
    shot = SCREENSHOTS / f"{name}.png"
    problems = inspect_page(browser, served(SITE) + page, shot, figures, math)
    assert not problems, "\n".join(problems)
    assert shot.stat().st_size > 10_000


class _Links(_Ids):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: set[str] = set()

    def handle_starttag(self, tag, attrs) -> None:
        super().handle_starttag(tag, attrs)
        self.hrefs |= {v for k, v in attrs if k in ("href", "src") and v}


def dead_links(site: Path, pages: list[Path]) -> list[str]:
    """The relative links and sources of ``pages`` that name no file of ``site``, or a
    fragment that names no element of its page."""
    parsed: dict[Path, _Links] = {}

    def parse(path: Path) -> _Links:
        if path not in parsed:
            parsed[path] = _Links()
            parsed[path].feed(path.read_text(encoding="utf-8"))
        return parsed[path]

    dead = []
    for page in pages:
        for href in sorted(parse(page).hrefs):
            parts = urllib.parse.urlparse(href)
            if parts.scheme or parts.netloc:
                continue
            target = page.parent / urllib.parse.unquote(parts.path) if parts.path else page
            where = f"{page.relative_to(site)}: {href}"
            if not target.exists():
                dead.append(f"{where} (no such file)")
            elif parts.fragment and target.suffix == ".html" and \
                    urllib.parse.unquote(parts.fragment) not in parse(target).ids:
                dead.append(f"{where} (no such element)")
    return dead


def test_every_internal_link_of_the_whole_site_resolves():
    """Without a browser, over every page: each relative link names a file of the site, and
    its fragment an element of that page (the browser checks the pages above as served)."""
    pages = [p for p in SITE.rglob("*.html")  # the theme's templates in _static are no pages
             if "_static" not in p.relative_to(SITE).parts]
    assert len(pages) > 40
    dead = dead_links(SITE, pages)
    assert not dead, "\n".join(dead[:50])


def test_the_annotated_page_links_every_tag_to_its_equation(browser, served):
    """Every tag of the attention page's code links to an equation anchor, and every
    equation to a line: the page is the contract drawn (inspect_page checks they resolve)."""
    browser.get(served(SITE) + PAGES["annotated_attention"][0])
    tags = browser.execute_script("return Array.from(document.querySelectorAll("
                                  "'.annotated-code a.eqref')).map(a => a.hash)")
    uses = browser.execute_script("return Array.from(document.querySelectorAll("
                                  "'.eq-uses a')).map(a => a.hash)")
    assert len(tags) > 20 and all(t.startswith("#eq-sdpa-") for t in tags), tags
    assert {t[len("#eq-sdpa-"):] for t in tags} >= {"0", "1", "2", "3", "4", "4b", "5"}
    assert len(uses) > 20 and all(u.startswith("#sdpa-L") for u in uses), uses


def test_the_negative_control_fails_every_check(browser, served, tmp_path):
    """A copy of the annotated attention page with a tag that names no equation, a link to no
    page, math MathJax cannot read, raw math and a missing figure: each must be reported."""
    page = PAGES["annotated_attention"][0]
    folder = tmp_path  # the site as it is, through links, with one page added beside it:
    for part in (*Path(page).parent.parts, None):  # real folders down to the page's
        source = SITE / folder.relative_to(tmp_path)
        for entry in source.iterdir():
            if entry.name != part:
                (folder / entry.name).symlink_to(entry)
        if part is not None:
            folder = folder / part
            folder.mkdir()
    broken = (SITE / page).read_text(encoding="utf-8").replace(
        '<a class="eqref" href="#eq-sdpa-1">', '<a class="eqref" href="#eq-sdpa-9">', 1)
    container = '<div class="annotated docutils container">'
    broken = broken.replace(container, '<p>\\(\\frac{1}\\) is broken math, \\(x^2 is left '
                            'open, <a href="no-such-page.html">a dead link</a>, <img '
                            'src="no-such-figure.png" alt="a missing figure"></p>' + container, 1)
    assert broken.count("#eq-sdpa-9") == 1 and "no-such-page.html" in broken
    name = Path(page).name.replace(".html", "_broken.html")
    (folder / name).write_text(broken, encoding="utf-8")
    problems = inspect_page(browser, served(tmp_path) + str(Path(page).parent / name),
                            SCREENSHOTS / "negative_control.png", figures=True, math=True)
    report = "\n".join(problems + dead_links(tmp_path, [folder / name]))
    assert "#eq-sdpa-9" in report, report
    assert "no-such-page.html: HTTP 404" in report, report
    assert "MathJax error" in report, report
    assert "raw math '\\\\(' left in the text: '\\\\(x^2 is left open" in report, report
    assert "no-such-figure.png did not load" in report, report
    assert f"{name}: #eq-sdpa-9 (no such element)" in report, report  # the check without
    assert f"{name}: no-such-page.html (no such file)" in report, report  # a browser
