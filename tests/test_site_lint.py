"""Site lint: what a reader meets on the website (_build/html) and in the notebooks' stored outputs.

Each kind of defect is its own test, run per page (and per notebook, and per screen width for the browser
checks), so a failure names the page, the place on it and what is wrong, and says what to do. The HTML checks
need the built site: run `make book` first (CI builds it before the tests); without it they skip.
"""

from __future__ import annotations

import functools
import json
import re
import tempfile
from pathlib import Path

import pytest
from _chromium import CHROMIUM, dom_offline

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
TOC = (ROOT / "_toc.yml").read_text()
PAGES = [re.search(r"root: (\S+)", TOC).group(1)] + re.findall(r"file: (\S+)", TOC)  # "book/intro", ...
NOTEBOOKS = [p for p in PAGES if (ROOT / f"{p}.ipynb").is_file()]

# Code is set in 13 px monospace (book/_static/custom.css); at a 1280 px window the code column holds 79
# characters, PEP 8's limit. test_code_column_holds_the_limit measures the rendered page to keep this true.
CODE_COLUMN = 79
WIDTHS = (400, 1280)  # a phone and a laptop
MIN_FIGURE_SCALE = 0.8  # a figure shown below 80% of its pixel size has text too small to read

ERROR_TEXT = re.compile(
    r"Traceback \(most recent call last\)|Error while finding module specification|No module named "
    r"|command not found|^\s*File \"[^\"]+\", line \d+|\b(?:User|Deprecation|Future|Runtime|Syntax)Warning\b"
    r"|An error occurred while executing|CellExecutionError",
    re.M,
)
PROGRESS_BAR = re.compile(r"\d+%\|[^|\n]{0,80}\||\d+/\d+ \[[\d:<.?]+, [^\]\n]*(?:it/s|s/it)\]")
OBJECT_REPR = re.compile(r"<[A-Za-z_][\w.]* (?:object )?at 0x[0-9a-fA-F]+>|<Figure size \d+x\d+ with \d+ Axes>")
RAW_TEX = re.compile(
    r"\$|\\(?:text|mathrm|mathbf|mathbb|mathcal|operatorname|frac|sqrt|cdot|times|left|right"
    r"|begin|end|sum|prod|qquad|quad|dots|ldots|log|exp|max|min|in|le|ge|top)\b|[_^]\{"
)
SECTION_SIGN = "§"
HASHY_ALT = re.compile(r"(^|/)[0-9a-f]{16,}\.\w+$|\.(png|jpe?g|svg|gif)$", re.I)

# How a chapter makes a figure (one convention for every chapter, checked by test_figures_are_numbered_and_captioned
# and test_images_have_real_alt_text): the code cell that draws it ends with `plt.show()`, has exactly one image
# output, and carries the figure's number, caption and alt text in its metadata, where myst-nb reads them:
#
#     "metadata": {"mystnb": {"figure": {"name": "fig-masks", "caption": "Dark cells may be attended to, ..."},
#                             "image": {"alt": "Three heatmaps of True/False masks: ..."}}}
#
# The caption is MyST (maths, {eq}, {numref} and {glue:text} work in it); the alt text says in words what the figure
# shows. The text refers to the figure as {numref}`fig-masks`, which reads "Figure 2.3" (chapter.figure). No italic
# caption paragraph under the figure: the caption lives in the metadata only. An Altair chart is a figure the same way,
# and gets its alt text from `.properties(description=...)`.


def _missing_site():
    return not (SITE / "book").is_dir()


needs_site = pytest.mark.skipif(
    _missing_site(), reason="no built site in _build/html: run `make book` first (CI builds the site before the tests)"
)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium); .ci/run installs it"
)


# ---------------------------------------------------------------------------------------------------- helpers


@functools.cache
def soup(page: str):
    bs4 = pytest.importorskip("bs4")
    path = SITE / f"{page}.html"
    if not path.is_file():
        pytest.fail(f"{page}: listed in _toc.yml but {path.relative_to(ROOT)} was not built")
    return bs4.BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def article(page: str):
    art = soup(page).select_one("article.bd-article")
    assert art is not None, f"{page}.html has no <article class='bd-article'>: did the theme change?"
    return art


@functools.cache
def notebook_cells(page: str) -> list[dict]:
    path = ROOT / f"{page}.ipynb"
    return json.loads(path.read_text(encoding="utf-8"))["cells"] if path.is_file() else []


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def heading_before(el) -> str:
    h = el.find_previous(["h1", "h2", "h3"])
    if h is None:
        return "top of the page"
    text = re.sub(r"\s+", " ", h.get_text(" ", strip=True)).rstrip("#").strip()
    return f"section '{text}'"


def cell_of(page: str, el) -> str:
    """'cell [i]' of the notebook for an element inside a code cell, found by its source; else ''."""
    cell = el if "cell" in (el.get("class") or []) else el.find_parent("div", class_="cell")
    if cell is None:
        return ""
    pre = cell.select_one("div.cell_input pre")
    code = pre.get_text() if pre else ""
    for i, c in enumerate(notebook_cells(page)):
        if c["cell_type"] == "code" and source(c).strip() == code.strip():
            return f"cell [{i}]"
    return "a code cell"


def where(page: str, el) -> str:
    parts = [f"{page}.html", heading_before(el)]
    cell = cell_of(page, el)
    if cell:
        parts.append(cell)
    return ", ".join(parts)


def snippet(text: str, at: int = 0, width: int = 70) -> str:
    start = max(0, at - width // 2)
    return repr(re.sub(r"\s+", " ", text[start : start + width]).strip())


def prose_strings(node, skip):
    """Text nodes under node, except those inside an element for which skip(element) is true."""
    from bs4 import NavigableString, Comment

    for s in node.descendants:
        if isinstance(s, NavigableString) and not isinstance(s, Comment):
            if not any(skip(p) for p in s.parents if p is not node.parent):
                yield s


def is_code_or_math(el) -> bool:
    classes = el.get("class") or []
    return (
        el.name in ("code", "pre", "script", "style", "kbd", "samp", "svg")
        or "math" in classes
        or el.name.startswith("mjx-")
        or "highlight" in classes
        or "cell_output" in classes
    )


def outputs(page: str):
    return article(page).select("div.cell_output")


def report(problems: list[str], what: str, todo: str) -> None:
    if problems:
        pytest.fail(f"{len(problems)} {what}:\n  " + "\n  ".join(problems) + f"\nWhat to do: {todo}", pytrace=False)


# ------------------------------------------------------------------------------------ stored notebook outputs


def stored_texts(cell: dict):
    """(output index, kind, text) for what a reader of the notebook sees of each output of a code cell."""
    for j, out in enumerate(cell.get("outputs", [])):
        if out["output_type"] == "stream":
            yield j, f"{out['name']} stream", "".join(out["text"])
        elif out["output_type"] == "error":
            yield j, "error", f"{out['ename']}: {out['evalue']}\n" + "\n".join(out.get("traceback", []))
        else:
            data = out.get("data", {})
            rich = [m for m in data if m != "text/plain"]
            if "text/plain" in data and not rich:
                yield j, "text/plain", "".join(data["text/plain"])
            for mime in ("text/html", "text/markdown"):
                if mime in data:
                    yield j, mime, "".join(data[mime])


def stored_problems(page: str, pattern: re.Pattern, also=lambda cell, j, kind, text: False) -> list[str]:
    found = []
    for i, cell in enumerate(notebook_cells(page)):
        if cell["cell_type"] != "code":
            continue
        for j, kind, text in stored_texts(cell):
            m = pattern.search(text)
            if m or also(cell, j, kind, text):
                found.append(
                    f"{page}.ipynb cell [{i}] output {j} ({kind}): {snippet(text, m.start()) if m else snippet(text)}"
                )
    return found


@pytest.mark.parametrize("page", NOTEBOOKS)
def test_stored_outputs_have_no_errors_or_warnings(page):
    problems = stored_problems(page, ERROR_TEXT, also=lambda c, j, kind, t: kind in ("error", "stderr stream"))
    report(
        problems,
        "stored outputs show errors, tracebacks or warnings",
        "fix the cell (a shell `!python` is not the kernel's Python: call the function, or use "
        "`sys.executable`); print an expected error as a message; silence a warning at its cause; then refresh "
        "the outputs with `python -m aiayn._book execute <notebook>`",
    )


@pytest.mark.parametrize("page", NOTEBOOKS)
def test_stored_outputs_have_no_progress_bars(page):
    problems = stored_problems(
        page,
        PROGRESS_BAR,
        also=lambda c, j, kind, t: any(
            "application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in c["outputs"][j : j + 1]
        ),
    )
    report(
        problems,
        "stored outputs hold progress bars",
        "pass `progress=False` (or `disable=True` to tqdm) in the chapter, and print one summary line instead",
    )


@pytest.mark.parametrize("page", NOTEBOOKS)
def test_stored_outputs_have_no_object_reprs(page):
    report(
        stored_problems(page, OBJECT_REPR),
        "stored outputs are bare object reprs",
        "end the line with `;` or assign the result (`_ = torch.manual_seed(0)`); show a figure with `plt.show()`",
    )


# --------------------------------------------------------------------------------------------- the built HTML


@needs_site
@pytest.mark.parametrize("page", PAGES)
def test_title_comes_first(page):
    art = article(page)
    first = art.find(lambda el: el.name == "h1" or (el.name == "div" and "cell" in (el.get("class") or [])))
    assert first is not None and first.name == "h1", (
        f"{page}.html: {cell_of(page, first) or 'a code cell'} is shown above the title. What to do: make the "
        f"title the notebook's first cell and the set-up cell the second, tagged `remove-cell`; imports follow"
    )


@needs_site
@pytest.mark.parametrize("page", PAGES)
def test_no_error_text_in_outputs(page):
    problems = []
    for out in outputs(page):
        text = out.get_text()
        m = ERROR_TEXT.search(text)
        if m:
            problems.append(f"{where(page, out)}: {snippet(text, m.start())}")
        for bad in out.select("div.output.traceback, div.output.error, div.output.stderr"):
            problems.append(f"{where(page, bad)}: a {' '.join(bad['class'][1:2])} output {snippet(bad.get_text())}")
    report(
        problems,
        "outputs show error text, tracebacks or warnings",
        "see test_stored_outputs_have_no_errors_or_warnings; then `make book`",
    )


@needs_site
@pytest.mark.parametrize("page", PAGES)
def test_no_progress_bars(page):
    problems = [
        f"{where(page, out)}: {snippet(out.get_text(), m.start())}"
        for out in outputs(page)
        for m in [PROGRESS_BAR.search(out.get_text())]
        if m
    ]
    report(problems, "outputs show progress bars", "turn the bars off in the chapter (`progress=False`)")


@needs_site
@pytest.mark.parametrize("page", PAGES)
def test_no_object_reprs(page):
    problems = [
        f"{where(page, out)}: {snippet(out.get_text(), m.start())}"
        for out in outputs(page)
        for m in [OBJECT_REPR.search(out.get_text())]
        if m
    ]
    report(problems, "outputs are bare object reprs", "assign the value (`_ = torch.manual_seed(0)`) or end with `;`")


@needs_site
@pytest.mark.parametrize("page", PAGES)
def test_no_raw_tex_outside_maths(page):
    problems = []
    for s in prose_strings(article(page), is_code_or_math):
        m = RAW_TEX.search(s)
        if m:
            problems.append(f"{where(page, s.parent)}: {snippet(str(s), m.start())}")
    report(
        problems,
        "places show raw TeX outside maths",
        "keep a $...$ formula on one source line and do not start a line with '+', '-' or '*' followed by a "
        "space (Markdown reads it as a list item); write currency or shell '$' as code",
    )


@needs_site
@pytest.mark.parametrize("page", PAGES)
def test_figures_are_numbered_and_captioned(page):
    problems = []
    art = article(page)
    for el in art.select("img") + art.select("div.vega-embed, div[id^=altair-viz]"):
        fig = el.find_parent("figure")
        number = fig.select_one("figcaption span.caption-number") if fig else None
        caption = fig.select_one("figcaption") if fig else None
        kind = "chart" if el.name == "div" else "image"
        if number is None:
            problems.append(f"{where(page, el)}: a{'n' if kind == 'image' else ''} {kind} with no figure number")
        elif len(caption.get_text(" ", strip=True)) - len(number.get_text(strip=True)) < 20:
            problems.append(f"{where(page, el)}: figure {number.get_text(strip=True)} has no caption sentence")
    report(
        problems,
        "figures lack a number or a caption",
        'give the code cell the metadata {"mystnb": {"figure": {"caption": "...", "name": "fig-..."}, '
        '"image": {"alt": "..."}}} (one display output per such cell), and refer to it with {numref}`fig-...`',
    )


@needs_site
@pytest.mark.parametrize("page", PAGES)
def test_images_have_real_alt_text(page):
    problems = []
    art = article(page)
    for img in art.select("img"):
        alt = (img.get("alt") or "").strip()
        if HASHY_ALT.search(alt) or len(alt.split()) < 4:
            problems.append(f"{where(page, img)}: alt text {alt!r}")
    for script in art.select("div.cell_output script"):
        if "vegaEmbed" in script.get_text() and '"description"' not in script.get_text():
            problems.append(f"{where(page, script)}: an Altair chart without a description (its alt text)")
    report(
        problems,
        "images lack real alt text (what the figure shows, in words)",
        'set "image": {"alt": "..."} in the cell\'s "mystnb" metadata (a sentence of what it shows); for an '
        "Altair chart, `.properties(description=...)`",
    )


@needs_site
@pytest.mark.parametrize("page", PAGES)
def test_code_lines_fit_the_column(page):
    problems = []
    for pre in article(page).select("pre"):
        in_output = pre.find_parent("div", class_="cell_output") is not None
        for n, line in enumerate(pre.get_text().expandtabs(4).splitlines(), 1):
            if len(line) > CODE_COLUMN:
                problems.append(
                    f"{where(page, pre)}, {'output' if in_output else 'code'} line {n} has "
                    f"{len(line)} characters: {line[:60]!r}..."
                )
    report(
        problems,
        f"code or output lines are wider than the column ({CODE_COLUMN} characters at 1280 px) and scroll sideways",
        f"wrap code at {CODE_COLUMN} characters (exported cells too, then `python -m aiayn._export`); print "
        "wide results in several lines or as a table",
    )


@needs_site
@pytest.mark.parametrize("page", PAGES)
def test_section_references_are_links(page):
    def skip(el):
        return (
            el.name in ("a", "h1", "h2", "h3", "h4", "h5", "h6")
            or is_code_or_math(el)
            or (el.name == "strong" and el.get_text().startswith("Paper"))
        )  # "**Paper, §3.2:**" quotes

    problems = []
    for s in prose_strings(article(page), skip):
        for m in re.finditer(SECTION_SIGN, s):
            problems.append(f"{where(page, s.parent)}: {snippet(str(s), m.start(), 50)}")
    report(
        problems,
        "'§' references are plain text",
        "make each one a link to where the book treats that section: [§3.2.1](02_attention.ipynb), or "
        "[§3.2.3](02_attention.ipynb#masks-who-may-attend-to-whom) for a part of a chapter; a section the "
        "book does not treat links to its entry in paper_map.md",
    )


@needs_site
@pytest.mark.parametrize("page", PAGES)
def test_equation_labels_are_the_books(page):
    art = article(page)
    problems = [
        f"{where(page, eq)}: equation label {eq.get_text(strip=True)!r}"
        for eq in art.select("span.eqno")
        if not re.fullmatch(r"\(\d+\.\d+\)#?", eq.get_text(strip=True))
    ]
    text = art.get_text(" ")
    problems += [
        f"{page}.html: {snippet(text, m.start())}"
        for m in re.finditer(r"Equation\s+Eq\.|Eq\.\s+Eq\.|Equations\s+Eq\.", text)
    ]
    report(
        problems,
        "equation labels mix the book's numbers with the paper's",
        "book equations are numbered per chapter, (2.1), and cited as {eq}`label` alone, which reads "
        "'Eq. (2.1)'; write the paper's as \"the paper's Equation (1)\"",
    )


@needs_site
@pytest.mark.parametrize("page", PAGES)
def test_outputs_are_not_split_or_repeated(page):
    problems = []
    for out in outputs(page):
        boxes = out.find_all("div", class_="output", recursive=False)
        for a, b in zip(boxes, boxes[1:]):
            if "stream" in a["class"] and "stream" in b["class"]:
                problems.append(f"{where(page, out)}: one output shown as separate boxes {snippet(b.get_text())}")
        texts = [re.sub(r"\s+", " ", b.get_text()).strip() for b in boxes if b.get_text().strip()]
        for t in {t for t in texts if texts.count(t) > 1}:
            problems.append(f"{where(page, out)}: the same output shown twice {snippet(t)}")
    report(
        problems,
        "outputs are split or repeated",
        "print what belongs together from one cell (the site merges consecutive prints, `nb_merge_streams`); "
        "show a table once (display it, or print it, not both)",
    )


@functools.cache
def ids_of(path: Path) -> frozenset[str]:
    return frozenset(re.findall(r'\bid="([^"]+)"', path.read_text(encoding="utf-8")))


@needs_site
@pytest.mark.parametrize("page", PAGES)
def test_internal_links_resolve(page):
    from urllib.parse import unquote, urlsplit

    here = SITE / f"{page}.html"
    problems = []
    for a in article(page).select("a[href]"):
        url = urlsplit(a["href"])
        if url.scheme or url.netloc or a["href"] in ("#", ""):
            continue
        target = (here.parent / unquote(url.path)).resolve() if url.path else here
        if not target.is_file():
            problems.append(f"{where(page, a)}: link {a['href']!r} ({a.get_text(strip=True)!r}): no such page")
        elif url.fragment and unquote(url.fragment) not in ids_of(target):
            problems.append(
                f"{where(page, a)}: link {a['href']!r} ({a.get_text(strip=True)!r}): "
                f"{target.name} has no anchor {url.fragment!r}"
            )
    report(
        problems,
        "links lead nowhere",
        'a heading that starts with a number gets an anchor without it ("§5.3 The schedule" -> '
        "#the-schedule): link to that, or give the heading a label, (name)=, and link to [text](#name)",
    )


@needs_site
def test_no_markdown_line_is_dropped_as_a_comment():
    """MyST reads a line that starts with % as a comment and drops it from the page, text and all: a wrapped sentence
    whose next line begins with `%time` loses that line. Code fences aside, no line of a Markdown page may start so."""
    for page in [p for p in PAGES if (ROOT / f"{p}.md").is_file()]:
        fenced = False
        for number, line in enumerate((ROOT / f"{page}.md").read_text().splitlines(), 1):
            fenced ^= line.lstrip().startswith(("```", "~~~"))
            assert fenced or not line.startswith("%"), f"{page}.md:{number} starts with %: MyST drops it, rewrap it"


def test_sidebar_entries_are_distinct_and_chapters_numbered():
    nav = soup(PAGES[1]).select_one("nav.bd-docs-nav")
    assert nav is not None, f"{PAGES[1]}.html has no sidebar (nav.bd-docs-nav): did the theme change?"
    entries = [(a.get_text(" ", strip=True), a["href"]) for a in nav.select("li.toctree-l1 > a")]
    problems = [
        f"sidebar entry {text!r} appears {n} times"
        for text, n in {t: [e[0] for e in entries].count(t) for t, _ in entries}.items()
        if n > 1
    ]
    chapters = {f"{p.split('/')[-1]}.html" for p in NOTEBOOKS}
    problems += [
        f"sidebar entry {text!r} ({href}) has no chapter number"
        for text, href in entries
        if href in chapters and not re.match(r"\d+\. ", text)
    ]
    report(
        problems,
        "sidebar entries are ambiguous",
        'give each chapter a distinct title that names its paper section and what it does ("§6.1 Decoding", '
        '"§6.1 Results"), and keep `numbered: 1` on every chapter part of _toc.yml',
    )


@needs_site
def test_references_are_labelled_as_the_text_cites_them():
    page = next(p for p in PAGES if p.endswith("references"))
    labels = [s.get_text(strip=True) for s in article(page).select("div.citation span.label, dl.citation > dt")]
    assert labels, f"{page}.html lists no references"
    problems = [
        f"{page}.html: label {label!r}" for label in labels if not re.fullmatch(r"\[\D+,? \d{4}[a-z]?\]", label)
    ]
    report(
        problems,
        "references are not labelled author-year, as the text cites them",
        "keep `bibtex_default_style: author_year_labels` in _config.yml (book/_ext/author_year_labels.py)",
    )


# --------------------------------------------------------------------------------------- in a browser (Chromium)

HARNESS = r"""<!doctype html><html><body><pre id="out"></pre><script>
const pages = %(pages)s, width = %(width)d;
const sleep = ms => new Promise(r => setTimeout(r, ms));
async function load(frame, url) {
  await new Promise(r => { frame.onload = r; frame.src = url; });
  const win = frame.contentWindow;
  for (let i = 0; i < 100 && !(win.MathJax && win.MathJax.startup && win.MathJax.startup.promise); i++) await sleep(50);
  if (win.MathJax && win.MathJax.startup) { try { await win.MathJax.startup.promise; } catch (e) {} }
  await sleep(300);
  return win;
}
function describe(win, el) {
  let h = null, n = el;
  const heads = [...win.document.querySelectorAll('article h1, article h2, article h3')];
  for (const x of heads) if (x.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING) h = x;
  let what = el.tagName.toLowerCase() + (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\s+/).join('.') : '');
  let text = (el.textContent || '').replace(/\s+/g, ' ').trim().slice(0, 70);
  const display = el.closest('div.math') || el.querySelector('div.math'), inline = el.closest('span.math');
  const math = display || inline;
  if (math) {
    what = display ? 'display equation' : 'inline formula';
    try { const items = win.MathJax.startup.document.getMathItemsWithin(math); if (items.length) text = 'TeX: ' + items[0].math.replace(/\s+/g, ' ').trim().slice(0, 70); } catch (e) {}
  } else if (el.tagName === 'TABLE' || el.querySelector('table')) what = 'table (' + what + ')';
  return {section: h ? h.textContent.replace(/[#¶]/g, '').replace(/\s+/g, ' ').trim() : 'top of the page', what, text};
}
function scrolls(win, el, stop) {
  for (let p = el.parentElement; p && p !== stop; p = p.parentElement) {
    const o = win.getComputedStyle(p).overflowX;
    if (o === 'auto' || o === 'scroll') return true;
  }
  return false;
}
function cutOff(win, el) {
  // how far visible content reaches past the element's right edge (MathJax's hidden MathML copy does not count)
  const box = el.getBoundingClientRect(), right = box.left + el.clientLeft + el.clientWidth;
  const kids = [...el.querySelectorAll('*')].filter(d => !d.closest('mjx-assistive-mml') && !scrolls(win, d, el));
  if (!kids.length) return el.scrollWidth - el.clientWidth;
  let reach = -Infinity;
  for (const d of kids) { const b = d.getBoundingClientRect(); if (b.width > 0 && b.height > 0) reach = Math.max(reach, b.right); }
  return Math.round(reach - right);
}
async function measure(win) {
  const doc = win.document, art = doc.querySelector('article.bd-article') || doc.body, r = [];
  for (const el of art.querySelectorAll('*')) {
    const o = win.getComputedStyle(el).overflowX;
    if ((o === 'hidden' || o === 'clip') && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 2
        && !el.closest('mjx-assistive-mml')) {  // MathJax's copy for screen readers is hidden on purpose
      const hidden = cutOff(win, el);
      if (hidden > 2) r.push(Object.assign({kind: 'clipped', hidden}, describe(win, el)));
    }
  }
  const vw = doc.documentElement.clientWidth;
  if (doc.documentElement.scrollWidth > vw + 1) {
    for (const el of art.querySelectorAll('*')) {
      const b = el.getBoundingClientRect();
      if (b.right > vw + 1 && b.width > 0 && !scrolls(win, el, art) && !(el.parentElement && el.parentElement.getBoundingClientRect().right > vw + 1))
        r.push(Object.assign({kind: 'page-overflow', hidden: Math.round(b.right - vw)}, describe(win, el)));
    }
  }
  for (const img of art.querySelectorAll('img')) {
    if (!img.complete || !img.naturalWidth) { r.push(Object.assign({kind: 'image-missing'}, describe(win, img))); continue; }
    // a figure drawn at twice its pixels (sharp on high-density screens) says its width on the page in its style
    const intended = parseFloat(img.style.width) || img.naturalWidth;
    const scale = img.getBoundingClientRect().width / intended;
    r.push(Object.assign({kind: 'image', scale, natural: Math.round(intended), alt: img.alt}, describe(win, img)));
  }
  const pre = art.querySelector('div.cell_input pre');
  if (pre) {
    const cs = win.getComputedStyle(pre), s = doc.createElement('span');
    s.textContent = 'x'.repeat(200); s.style.whiteSpace = 'pre'; pre.appendChild(s);
    const cw = s.getBoundingClientRect().width / 200; s.remove();
    const inner = pre.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    r.push({kind: 'code-column', chars: Math.floor(inner / cw + 0.01), px: inner, font: cs.fontSize});
  }
  return r;
}
(async () => {
  const frame = document.createElement('iframe');
  frame.style.width = width + 'px'; frame.style.height = '900px'; frame.style.border = '0';
  document.body.appendChild(frame);
  const all = {};
  for (const [name, url] of Object.entries(pages)) {
    try { all[name] = await measure(await load(frame, url)); } catch (e) { all[name] = [{kind: 'error', text: String(e)}]; }
  }
  document.getElementById('out').textContent = JSON.stringify(all);
  document.body.setAttribute('data-done', '1');
})();
</script></body></html>"""


@functools.cache
def browser(width: int) -> dict[str, list[dict]]:
    """Every page measured in headless Chromium at the given window width: {page: [finding, ...]}."""
    pages = {p: (SITE / f"{p}.html").as_uri() for p in PAGES if (SITE / f"{p}.html").is_file()}
    with tempfile.TemporaryDirectory() as tmp:
        harness = Path(tmp) / "harness.html"
        harness.write_text(HARNESS % {"pages": json.dumps(pages), "width": width}, encoding="utf-8")
        dom = dom_offline(
            harness,
            Path(tmp) / "profile",
            "--allow-file-access-from-files",
            "--hide-scrollbars",
            f"--window-size={width + 40},1000",
            budget_ms=600000,
            timeout=900,
            check=False,
        )
    m = re.search(r'<pre id="out">(.*?)</pre>', dom, re.S)
    if not m or not m.group(1).strip():
        pytest.fail(f"Chromium did not finish measuring the pages at {width} px")
    import html

    return json.loads(html.unescape(m.group(1)))


def browser_findings(page: str, width: int, kind: str) -> list[dict]:
    if (SITE / f"{page}.html").is_file() is False:
        pytest.fail(f"{page}: listed in _toc.yml but not built")
    found = browser(width).get(page, [])
    errors = [f for f in found if f["kind"] == "error"]
    assert not errors, f"{page}.html could not be measured at {width} px: {errors[0]['text']}"
    return [f for f in found if f["kind"] == kind]


def at(page: str, f: dict) -> str:
    return f"{page}.html, section '{f['section']}', {f['what']} {f['text']!r}"


@needs_site
@needs_chromium
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", PAGES)
def test_nothing_is_clipped(page, width):
    problems = [f"{at(page, f)}: {f['hidden']} px cut off" for f in browser_findings(page, width, "clipped")]
    report(
        problems,
        f"elements are cut off at the right at {width} px",
        "a wide equation must scroll (book/_static/custom.css) or be split over lines (aligned, \\\\); "
        "a wide table must sit in a scrolling box",
    )


@needs_site
@needs_chromium
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", PAGES)
def test_page_does_not_scroll_sideways(page, width):
    problems = [
        f"{at(page, f)}: reaches {f['hidden']} px past the window"
        for f in browser_findings(page, width, "page-overflow")
    ]
    report(
        problems,
        f"elements make the whole page wider than a {width} px window",
        "let the element scroll in its own box (overflow-x: auto) or shrink it (max-width: 100%)",
    )


@needs_site
@needs_chromium
@pytest.mark.parametrize("page", PAGES)
def test_figures_are_shown_at_readable_size(page):
    found = browser_findings(page, 1280, "image")
    problems = [
        f"{at(page, f)}: a {f['natural']} px wide image shown at {f['scale']:.0%}"
        for f in found
        if f["scale"] < MIN_FIGURE_SCALE
    ]
    problems += [f"{at(page, f)}: the image did not load" for f in browser_findings(page, 1280, "image-missing")]
    report(
        problems,
        f"figures are shrunk below {MIN_FIGURE_SCALE:.0%} at 1280 px, so their labels become too small to read",
        "draw the figure at most 6.7 in wide at dpi 100 (the column is about "
        "680 px), with fonts of 8 pt or more; split a wide figure into two",
    )


@needs_site
@needs_chromium
def test_code_column_holds_the_limit():
    columns = [f for p in NOTEBOOKS for f in browser(1280).get(p, []) if f["kind"] == "code-column"]
    assert columns, "no code cell was measured at 1280 px"
    narrowest = min(columns, key=lambda f: f["chars"])
    assert narrowest["chars"] >= CODE_COLUMN, (
        f"at 1280 px a code cell holds {narrowest['chars']} characters ({narrowest['px']:.0f} px of "
        f"{narrowest['font']} monospace), fewer than CODE_COLUMN = {CODE_COLUMN}: the theme or "
        f"book/_static/custom.css changed; restore the width or lower CODE_COLUMN and rewrap the code"
    )
