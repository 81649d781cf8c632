"""The website: vendored vega matches altair, and a chart page draws offline in headless Chromium."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _chromium import CHROMIUM, dom_offline

ROOT = Path(__file__).resolve().parents[1]
VEGA = ROOT / "book" / "_static" / "vega"

CHART_NOTEBOOK = {
    "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": "# Chart\n"},
        {
            "cell_type": "code",
            "metadata": {},
            "execution_count": None,
            "outputs": [],
            "source": (
                "import altair as alt\nimport pandas as pd\n"
                "alt.Chart(pd.DataFrame({'x': [0, 1, 2], 'y': [1, 3, 2]})).mark_line().encode(x='x', y='y')"
            ),
        },
    ],
    "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    },
    "nbformat": 4,
    "nbformat_minor": 5,
}


def test_vendored_vega_matches_altair():
    alt = pytest.importorskip("altair")
    versions = (VEGA / "vega-versions.js").read_text()
    assert f'vega_version: "{alt.VEGA_VERSION}"' in versions
    assert f'vegalite_version: "{alt.VEGALITE_VERSION}"' in versions
    assert f'vegaembed_version: "{alt.VEGAEMBED_VERSION}"' in versions
    assert f'"{alt.VEGALITE_VERSION}"' in (VEGA / "vega-lite.min.js").read_text()
    assert re.search(rf'version="{alt.VEGA_VERSION}\.\d+\.\d+"', (VEGA / "vega.min.js").read_text())


def drawn_charts(page: Path, tmp_path: Path) -> tuple[int, int]:
    """(vega-embed elements, those with an svg or canvas inside) after Chromium ran the page with no network."""
    dom = dom_offline(page, tmp_path / "chromium-profile")
    embeds = re.findall(r'<div[^>]*class="[^"]*vega-embed[^"]*"[^>]*>(.*?)</div>\s*(?:<script|</div>)', dom, re.S)
    return dom.count('id="altair-viz-'), sum(("<svg" in e or "<canvas" in e) for e in embeds)


@pytest.fixture(scope="module")
def chart_site(tmp_path_factory) -> Path:
    """A one-page book with the project's configuration and static files, built as the site is."""
    site = tmp_path_factory.mktemp("site")
    config = (ROOT / "_config.yml").read_text()  # the book shows stored outputs; this page has none, so run it
    (site / "_config.yml").write_text(config.replace('execute_notebooks: "off"', "execute_notebooks: force"))
    (site / "book").mkdir()
    shutil.copytree(ROOT / "book" / "_static", site / "book" / "_static")
    shutil.copytree(ROOT / "book" / "_ext", site / "book" / "_ext")  # Sphinx extensions _config.yml loads
    shutil.copy(ROOT / "book" / "references.bib", site / "book")
    (site / "book" / "intro.md").write_text("# Intro\n")
    (site / "book" / "chart.ipynb").write_text(json.dumps(CHART_NOTEBOOK))
    (site / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: book/chart\n")
    jb = Path(sys.executable).with_name("jupyter-book")
    subprocess.run(
        [str(jb) if jb.exists() else "jupyter-book", "build", str(site), "-W", "-n", "--keep-going"],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return site / "_build" / "html"


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (Debian: apt-get install chromium); "
    ".ci/run installs it, so CI always runs this test",
)
def test_chart_draws_offline(chart_site, tmp_path):
    charts, drawn = drawn_charts(chart_site / "book" / "chart.html", tmp_path)
    assert charts == 1 and drawn == 1


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_built_book_charts_draw_offline(tmp_path):
    pages = [p for p in (ROOT / "_build" / "html" / "book").glob("*.html") if "altair-viz-" in p.read_text()]
    if not pages:
        pytest.skip("no built chart pages: run `make book` first (CI builds the site before the tests)")
    for page in pages:
        charts, drawn = drawn_charts(page, tmp_path)
        assert drawn == charts > 0, f"{page.name}: {drawn} of {charts} charts drew"


def test_colab_links_point_at_existing_notebooks():
    pages = list((ROOT / "_build" / "html" / "book").glob("*.html"))
    if not pages:
        pytest.skip("no built site: run `make book` first (CI builds the site before the tests)")
    repo = re.search(r"url: https://github.com/(\S+)", (ROOT / "_config.yml").read_text()).group(1)
    linked = set()
    for page in pages:
        for path in re.findall(
            rf"colab\.research\.google\.com/github/{re.escape(repo)}/blob/main/([^\"'&]+)", page.read_text()
        ):
            assert (ROOT / path).is_file(), f"{page.name} links Colab to {path}, which does not exist"
            linked.add(path)
    in_toc = set(re.findall(r"file: (book/\S+)", (ROOT / "_toc.yml").read_text()))
    chapters = sorted((ROOT / "book").glob("*.ipynb"))
    assert linked == {f"book/{p.name}" for p in chapters if f"book/{p.stem}" in in_toc}


# Run in each page after MathJax has typeset it: every display equation and table wider than the text column
# (article.bd-article) at the window's width, with its section.
WIDTH_PROBE = """<script>
(function () {
  function report() {
    const column = document.querySelector("article.bd-article");
    const limit = column.getBoundingClientRect().width + 1;
    const section = (el) => {
      const s = el.closest("section"), h = s && s.querySelector("h1, h2, h3");
      return h ? h.textContent.replace(/#$/, "").trim() : "";
    };
    const wide = [];
    // an equation is cut when its content reaches past its own box (a numbered one's box leaves room for the
    // number) or the box past the column
    column.querySelectorAll("mjx-container[display=true]").forEach((el) => {
      const box = el.getBoundingClientRect(), math = el.closest("div.math");
      let right = box.right;
      el.querySelectorAll("*").forEach((d) => {
        const r = d.getBoundingClientRect();
        if (r.width > 0) right = Math.max(right, r.right);
      });
      const need = Math.max(el.scrollWidth, right - box.left), room = Math.min(el.clientWidth, limit);
      if (need > room + 1) wide.push({kind: "equation", id: math ? math.id : "", section: section(el),
                                      width: need, room: room});
    });
    column.querySelectorAll("table").forEach((el) => {
      if (el.scrollWidth > limit) wide.push({kind: "table", section: section(el), width: el.scrollWidth,
                                             start: el.textContent.trim().replace(/\\s+/g, " ").slice(0, 60)});
    });
    const pre = document.createElement("pre");
    pre.id = "width-report";
    pre.textContent = JSON.stringify({column: limit - 1, wide: wide});
    document.body.appendChild(pre);
  }
  window.addEventListener("load", function () {
    const mathjax = window.MathJax && MathJax.startup && MathJax.startup.promise;
    (mathjax || Promise.resolve()).then(report);
  });
})();
</script>"""


def too_wide(page: Path, tmp_path: Path, width: int = 1280) -> dict:
    """{"column": the text column's width in px, "wide": the equations and tables wider than it} for a built page
    drawn by Chromium, offline, in a window `width` px wide."""
    probe = page.with_name(f"_width_probe_{page.name}")  # beside the page, so that its relative links resolve
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", WIDTH_PROBE + "</body>"), encoding="utf-8")
    try:
        dom = dom_offline(probe, tmp_path / "chromium-width", f"--window-size={width},900", budget_ms=15000)
    finally:
        probe.unlink()
    found = re.search(r'<pre id="width-report"[^>]*>(.*?)</pre>', dom, re.S)
    assert found, f"{page.name}: the width probe did not report (did MathJax load?)"
    return json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_no_equation_or_table_is_wider_than_the_column_at_1280px(tmp_path):
    """Nothing the reader needs scrolls sideways or is cut at 1280 px (a narrow phone may scroll inside a box)."""
    pages = sorted((ROOT / "_build" / "html" / "book").glob("*.html"))
    if not pages:
        pytest.skip("no built site: run `make book` first (CI builds the site before the tests)")
    problems = []
    for page in pages:
        report = too_wide(page, tmp_path)
        problems += [
            f"{page.name}, section '{w['section']}': {w['kind']} {w.get('id') or w.get('start', '')} is "
            f"{w['width']:.0f} px, with room for {w.get('room', report['column']):.0f} px"
            for w in report["wide"]
        ]
    assert not problems, (
        "wider than the text column at 1280 px:\n  " + "\n  ".join(problems) + "\nWhat to do: "
        "break the equation over lines (aligned rows, or \\\\ inside split), or narrow the table"
    )


# Put first in <head>, so that it sees every script after it: uncaught errors (a script that throws, or fails to
# parse) and console.error calls, reported in the DOM once the page has loaded and its scripts have run.
ERROR_PROBE = """<script>
(function () {
  const errors = [];
  window.addEventListener("error", (e) => errors.push("uncaught: " + e.message));
  window.addEventListener("unhandledrejection", (e) => errors.push("unhandled rejection: " + e.reason));
  const error = console.error;
  console.error = function (...args) { errors.push("console.error: " + args.join(" ")); error.apply(console, args); };
  window.addEventListener("load", () => setTimeout(() => {
    const pre = document.createElement("pre");
    pre.id = "error-report";
    pre.textContent = JSON.stringify(errors);
    document.body.appendChild(pre);
  }, 3000));
})();
</script>"""


def console_errors(page: Path, tmp_path: Path) -> list[str]:
    """The uncaught errors and console.error calls of a built page loaded by Chromium, offline."""
    probe = page.with_name(f"_error_probe_{page.name}")  # beside the page, so that its relative links resolve
    html = page.read_text(encoding="utf-8")
    head = html.index("<head>") + len("<head>")
    probe.write_text(html[:head] + ERROR_PROBE + html[head:], encoding="utf-8")
    try:
        dom = dom_offline(probe, tmp_path / "chromium-errors", budget_ms=15000)
    finally:
        probe.unlink()
    found = re.search(r'<pre id="error-report"[^>]*>(.*?)</pre>', dom, re.S)
    assert found, f"{page.name}: the error probe did not report"
    return json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_a_page_loads_with_no_console_error(chart_site, tmp_path):
    """The project's configuration gives pages whose scripts run cleanly (a script included twice once threw)."""
    assert console_errors(chart_site / "book" / "chart.html", tmp_path) == []


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_built_pages_load_with_no_console_error(tmp_path):
    pages = sorted((ROOT / "_build" / "html" / "book").glob("*.html"))
    if not pages:
        pytest.skip("no built site: run `make book` first (CI builds the site before the tests)")
    problems = {page.name: errors for page in pages if (errors := console_errors(page, tmp_path))}
    assert not problems, f"console errors: {problems}"
