"""The "Try the model" page (book/try_the_model.md, web/): its JavaScript against Python's, and the built page in
headless Chromium, served on 127.0.0.1, translating as Python does and drawing the attention views."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _chromium import CHROMIUM

from aiayn import browser

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "book" / "_static" / "model"
NODE = shutil.which("node")
FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox")
FIXTURES = ROOT / "web" / "test" / "fixtures" / "fixtures.json"
EXPORT = "python -m aiayn.browser export --out book/_static/model (`make test` runs it, after `npm ci`)"

needs_export = pytest.mark.skipif(
    not (MODEL / "manifest.json").is_file() or not (MODEL / "web" / "page.js").is_file(),
    reason=f"no export of the models for the page: run `{EXPORT}`",
)
needs_browser = pytest.mark.skipif(
    CHROMIUM is None or importlib.util.find_spec("playwright") is None,
    reason="Chromium or Playwright is not installed (Debian: apt-get install chromium; pip install playwright, "
    "which drives Debian's Chromium: no `playwright install` needed)",
)


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed (Debian: apt-get install nodejs)")
def test_javascript_matches_python():
    """node --test web/test/: the tokenizer on val and test 2016, the beam search on made-up and real models."""
    if not FIXTURES.is_file():
        pytest.skip(f"no {FIXTURES.relative_to(ROOT)}: run `python -m aiayn.browser fixtures` (after the export)")
    if not (ROOT / "node_modules" / "onnxruntime-web").is_dir():
        pytest.skip("ONNX Runtime Web is not installed: run `npm ci`")
    run = subprocess.run([NODE, "--test", "web/test/"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "# skipped 0" in run.stdout, "some node tests were skipped:\n" + run.stdout[-2000:]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The built site: _build/html where `make book` built the page with the current export, else a book of this
    page alone, built as the site is (its links to the chapters stay unresolved)."""
    built = ROOT / "_build" / "html"
    if (built / "book" / "try_the_model.html").is_file() and browser.holds_export(built, MODEL):
        return built
    book = tmp_path_factory.mktemp("site")
    shutil.copy(ROOT / "_config.yml", book)
    (book / "book").mkdir()
    for folder in ("_static", "_ext"):
        shutil.copytree(ROOT / "book" / folder, book / "book" / folder)
    shutil.copy(ROOT / "book" / "references.bib", book / "book")
    shutil.copy(ROOT / "book" / "try_the_model.md", book / "book")
    (book / "book" / "intro.md").write_text("# Intro\n")
    (book / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: book/try_the_model\n")
    jb = Path(sys.executable).with_name("jupyter-book")
    subprocess.run([str(jb) if jb.exists() else "jupyter-book", "build", str(book)], check=True, capture_output=True)
    return book / "_build" / "html"


@pytest.fixture(scope="module")
def served(site):
    with browser.serve(site) as url:
        yield url + "book/try_the_model.html"


@pytest.fixture(scope="module")
def python():
    """Python's translation of a text over the served graphs: aiayn.tokenization, then aiayn.browser's beam search
    with ONNX Runtime."""
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install -r requirements.txt)")
    from aiayn.tokenization import Tokenizer

    manifest = json.loads((MODEL / "manifest.json").read_text(encoding="utf-8"))
    translators = {}

    def translate(text: str, name: str) -> dict:
        entry = manifest["models"][name]
        if name not in translators:
            bpe = json.loads((MODEL / entry["tokenizer"]).read_text(encoding="utf-8"))
            tokenizer = Tokenizer({p: i for i, p in enumerate(bpe["pieces"])}, bpe["merges"])
            files = entry["files"]
            translators[name] = (
                tokenizer,
                browser.Translator(MODEL / files["encoder"], MODEL / files["decoder"], entry["config"]),
            )
        tokenizer, tr = translators[name]
        hyp, extra = tr.beam_search(tokenizer.encode(text, entry["src_lang"]))
        scores = sorted((c["score"] for c in extra["candidates"]), reverse=True)
        return {"translation": tokenizer.decode(hyp), "scores": scores}

    return translate


def state(page) -> str:
    return page.eval_on_selector("#try-model", "e => e.dataset.state")


def translate(page, text: str, name: str) -> str:
    """Type text, pick the direction, press Translate; the page's state once it has answered."""
    page.select_option("#try-direction", name)
    page.fill("#try-text", text)
    page.click("#try-model button[type=submit]")
    page.wait_for_function(
        "() => ['done', 'ready', 'error'].includes(document.getElementById('try-model').dataset.state)"
    )
    return state(page)


def shown_scores(page) -> list[float]:
    return [
        float(t)
        for t in page.eval_on_selector_all(".try-candidates td:last-child", "tds => tds.map(td => td.textContent)")
    ]


# how many cells of a canvas are not white, and what its data-drawn says (rows x columns)
INKED = """c => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4) if (d[i] < 250 || d[i + 1] < 250 || d[i + 2] < 250) n++;
  return [n, c.dataset.drawn];
}"""


def check_attention(page, rows: int, cols: int, heads: int) -> None:
    inked, drawn = page.eval_on_selector(".try-head", INKED)
    assert drawn == f"{rows}x{cols}" and inked > 100, (drawn, inked)  # cross-attention: output rows, source columns
    thumbs = page.eval_on_selector_all(".try-thumb canvas", f"cs => cs.map({INKED})")
    assert len(thumbs) == heads and all(n > 0 for n, _ in thumbs)
    page.select_option("select[name=kind]", "encSelf")
    assert page.eval_on_selector(".try-head", INKED)[1] == f"{cols}x{cols}"
    page.click(".try-thumb >> nth=1")  # layer 1, head 2
    assert page.eval_on_selector("select[name=head]", "s => s.value") == "1"


@needs_export
@needs_browser
def test_the_page_translates_as_python_and_draws_the_attention(served, python):
    manifest = json.loads((MODEL / "manifest.json").read_text(encoding="utf-8"))
    with browser.browser_page() as page:
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(served)
        assert browser.wait_loaded(page) == "ready", page.inner_text("#try-model")
        page.wait_for_function("() => Promise.all(Object.keys(tryModel.manifest.models).map((n) => tryModel.model(n)))")
        loaded = len(requests)
        texts = {
            "en-de": "Two young children are playing in the sand on a beach.",
            "de-en": manifest["examples"]["de-en"],
        }
        for name, text in texts.items():
            assert translate(page, text, name) == "done", page.inner_text("#try-model")
            expected = python(text, name)
            assert page.inner_text(".try-translation") == expected["translation"]
            assert shown_scores(page) == pytest.approx(expected["scores"], abs=2e-3)
            last = page.evaluate("() => ({S: tryModel.last.src.length + 1, T: tryModel.last.hyp.length + 1})")
            c = manifest["models"][name]["config"]
            check_attention(page, last["T"], last["S"], c["N"] * c["h"])
        # the sentence a reader tries first gives what the book's Python gives, not only the graphs' own search
        from aiayn import pretrained

        sentence = "A black dog is running through the snow."
        assert translate(page, sentence, "en-de") == "done"
        assert page.inner_text(".try-translation") == pretrained.load("en-de").translate(sentence)
        assert requests[loaded:] == [], "the page fetched files after it had loaded"
        assert all(url.startswith("http://127.0.0.1") for url in requests)
        assert page.errors == []


@needs_export
@needs_browser
def test_bad_input_gets_a_plain_answer_at_400px(served):
    with browser.browser_page(width=400) as page:
        page.goto(served)
        assert browser.wait_loaded(page) == "ready"
        assert translate(page, "   ", "en-de") == "ready"
        assert "Type a sentence" in page.inner_text(".try-error")
        most = page.evaluate("() => tryModel.manifest.models['en-de'].config.max_len - 1")
        assert translate(page, "a " * most, "en-de") == "ready"  # a piece a word, and the space at the end
        assert f"at most {most}" in page.inner_text(".try-error")
        assert translate(page, "x" * 5000, "en-de") == "ready"
        assert "5000 characters" in page.inner_text(".try-error")
        far = "The quarterly earnings report exceeded analysts' expectations by a considerable margin."
        assert translate(page, far, "en-de") == "done"
        assert "image captions" in page.inner_text(".try-far")
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 400
        assert page.errors == []


@needs_export
@needs_browser
def test_missing_model_files_and_missing_webassembly_are_said_plainly(served):
    with browser.browser_page() as page:
        page.route("**/*.onnx*", lambda route: route.fulfill(status=404))
        page.goto(served)
        assert browser.wait_loaded(page) == "error"
        assert "python -m aiayn.browser export" in page.inner_text(".try-error")
    with browser.browser_page() as page:
        page.add_init_script("delete globalThis.WebAssembly")
        page.goto(served)
        assert browser.wait_loaded(page) == "stored"
        assert "cannot run WebAssembly" in page.inner_text(".try-status")
        assert page.inner_text(".try-translation")
        inked, drawn = page.eval_on_selector(".try-head", INKED)
        assert inked > 100 and drawn


@needs_export
@pytest.mark.skipif(
    FIREFOX is None or NODE is None or not (ROOT / "node_modules" / "puppeteer-core").is_dir(),
    reason="Firefox or puppeteer-core is not installed (Debian: apt-get install firefox-esr; npm ci): the page is "
    "checked in Chromium only",
)
def test_the_page_translates_in_firefox_too(served, python):
    from aiayn import pretrained

    sentences = {"en-de": "A black dog is running through the snow.", "de-en": "Zwei Kinder spielen im Sand."}
    run = subprocess.run(
        [NODE, str(ROOT / "web" / "firefox" / "translate.mjs"), served, *(f"{d}={t}" for d, t in sentences.items())],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "FIREFOX": FIREFOX},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["errors"] == [] and len(report["results"]) == len(sentences), report
    for r in report["results"]:
        assert r["translation"] == python(r["text"], r["direction"])["translation"], r
        assert r["drawn"] and r["thumbs"] > 0, r
    assert report["results"][0]["translation"] == pretrained.load("en-de").translate(sentences["en-de"])
