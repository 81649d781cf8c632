"""The website: vendored vega matches altair, and a chart page draws offline in headless Chromium."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VEGA = ROOT / "book" / "_static" / "vega"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

CHART_NOTEBOOK = {
    "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": "# Chart\n"},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": (
            "import altair as alt\nimport pandas as pd\n"
            "alt.Chart(pd.DataFrame({'x': [0, 1, 2], 'y': [1, 3, 2]})).mark_line().encode(x='x', y='y')")},
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                 "language_info": {"name": "python"}},
    "nbformat": 4, "nbformat_minor": 5,
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
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run",
         "--host-resolver-rules=MAP * ~NOTFOUND",  # no network at all: a CDN fetch would fail
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=10000", "--dump-dom",
         page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True).stdout
    embeds = re.findall(r'<div[^>]*class="[^"]*vega-embed[^"]*"[^>]*>(.*?)</div>\s*(?:<script|</div>)', dom, re.S)
    return dom.count('id="altair-viz-'), sum(("<svg" in e or "<canvas" in e) for e in embeds)


@pytest.fixture(scope="module")
def chart_site(tmp_path_factory) -> Path:
    """A one-page book with the project's configuration and static files, built as the site is."""
    site = tmp_path_factory.mktemp("site")
    shutil.copy(ROOT / "_config.yml", site)
    (site / "book").mkdir()
    shutil.copytree(ROOT / "book" / "_static", site / "book" / "_static")
    shutil.copytree(ROOT / "book" / "_ext", site / "book" / "_ext")  # Sphinx extensions _config.yml loads
    shutil.copy(ROOT / "book" / "references.bib", site / "book")
    (site / "book" / "intro.md").write_text("# Intro\n")
    (site / "book" / "chart.ipynb").write_text(json.dumps(CHART_NOTEBOOK))
    (site / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: book/chart\n")
    jb = Path(sys.executable).with_name("jupyter-book")
    subprocess.run([str(jb) if jb.exists() else "jupyter-book", "build", str(site), "-W", "-n", "--keep-going"],
                   check=True, capture_output=True, text=True, timeout=600)
    return site / "_build" / "html"


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium); "
                                             ".ci/run installs it, so CI always runs this test")
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
        for path in re.findall(rf"colab\.research\.google\.com/github/{re.escape(repo)}/blob/main/([^\"'&]+)",
                               page.read_text()):
            assert (ROOT / path).is_file(), f"{page.name} links Colab to {path}, which does not exist"
            linked.add(path)
    in_toc = set(re.findall(r"file: (book/\S+)", (ROOT / "_toc.yml").read_text()))
    chapters = sorted((ROOT / "book").glob("*.ipynb"))
    assert linked == {f"book/{p.name}" for p in chapters if f"book/{p.stem}" in in_toc}
