"""How fast the "Try the model" page is in headless Chromium (one WebAssembly thread, no cross-origin isolation):
seconds from opening the page to a loaded model, from pressing Translate to a translation of a 15-word sentence (with
its attention drawn), and sentences per second over test 2016 in each direction; the bytes it fetched.

    python benchmarks/browser_speed.py                      # writes results/browser_speed.json
    python benchmarks/browser_speed.py --limit 50 --out /tmp/speed.json   # a quick look

It serves the built site (_build/html, after `make book`) on 127.0.0.1, or, without one, the page alone at the root of
the export (book/_static/model, `python -m aiayn.browser export`); Chromium is Debian's, driven by Playwright.
"""

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from aiayn import browser, data  # noqa: E402
from aiayn.runs.provenance import provenance  # noqa: E402

WORDS = 15  # the goal: a first translation of a 15-word sentence within 2 s of the model being loaded
FETCHED = "() => performance.getEntriesByType('resource').reduce((n, e) => n + e.encodedBodySize, 0)"
# what came from the export (the runtime, the models, the page's scripts) under a path prefix: not the book's theme
FROM_EXPORT = """(prefix) => performance.getEntriesByType('resource')
  .filter((e) => new URL(e.name).pathname.startsWith(prefix)).reduce((n, e) => n + e.encodedBodySize, 0)"""


def page_url(site: Path | None) -> tuple[Path, str]:
    """(folder to serve, the page's path in it)."""
    built = ROOT / "_build" / "html"
    if site is None and (built / "book" / "try_the_model.html").is_file():
        if browser.holds_export(built):
            site = built
        else:
            print(f"{built} holds an older export than {browser.DEFAULT_OUT}: timing the page alone", file=sys.stderr)
    if site is not None:
        return site, "book/try_the_model.html"
    folder = browser.DEFAULT_OUT
    if not (folder / "manifest.json").is_file():
        raise SystemExit(f"no export in {folder}: run `python -m aiayn.browser export` first")
    (folder / "index.html").write_text(browser.PAGE, encoding="utf-8")
    return folder, "index.html"


def first_translation(url: str, sentence: str) -> dict:
    """One fresh page: seconds to a loaded model, then to the first translation drawn, and the bytes fetched."""
    with browser.browser_page() as page:
        start = time.perf_counter()
        page.goto(url)
        if browser.wait_loaded(page) != "ready":
            raise SystemExit(f"the page did not load its model: {page.inner_text('#try-model')[:300]}")
        loaded = time.perf_counter() - start
        fetched = page.evaluate("() => tryModel.timing.fetched")  # counted by the page when its model was ready
        page.select_option("#try-direction", "en-de")
        page.fill("#try-text", sentence)
        start = time.perf_counter()
        page.click("#try-model button[type=submit]")
        page.wait_for_function("() => document.getElementById('try-model').dataset.state === 'done'")
        first = time.perf_counter() - start
        search = page.evaluate("() => tryModel.last.seconds")
        page.wait_for_function("() => Promise.all(Object.keys(tryModel.manifest.models).map((n) => tryModel.model(n)))")
        return {
            "load_s": loaded,
            "first_s": first,
            "first_search_s": search,
            "bytes_to_ready": fetched,
            "bytes_all": page.evaluate(FETCHED),
            "bytes_export": page.evaluate(FROM_EXPORT, "/" if url.endswith("index.html") else "/_static/model/"),
            "chromium": page.context.browser.version,
        }


def throughput(url: str, limit: int | None) -> dict:
    """Sentences per second over test 2016 in each direction, one sentence at a time, without drawing."""
    out = {}
    with browser.browser_page() as page:
        page.goto(url)
        browser.wait_loaded(page)
        for name in browser.NAMES:
            src, tgt = name.split("-")
            texts = [s for s, _ in data.load("test2016", src, tgt)[:limit]]
            run = page.evaluate(browser.TRANSLATE_ALL, {"name": name, "texts": texts})
            errors = [o["error"] for o in run["out"] if "error" in o]
            out[name] = {
                "sentences": len(texts),
                "seconds": run["seconds"],
                "sentences_per_s": len(texts) / run["seconds"],
            }
            out[name]["errors"] = errors[:5]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--site", type=Path, default=None, help="a built site to serve (default: _build/html if built)")
    p.add_argument("--runs", type=int, default=3, help="fresh pages for the load and first-translation times")
    p.add_argument("--limit", type=int, default=None, help="test 2016's first LIMIT sentences for the throughput")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "browser_speed.json")
    args = p.parse_args(argv)
    folder, path = page_url(args.site)
    sentence = next(s for s, _ in data.load("test2016") if len(s.split()) == WORDS)
    load_before = os.getloadavg()
    start = time.perf_counter()
    try:
        with browser.serve(folder) as url:
            runs = [first_translation(url + path, sentence) for _ in range(args.runs)]
            speed = throughput(url + path, args.limit)
    finally:
        if path == "index.html":
            (folder / path).unlink()
    report = {
        "page": path if folder != browser.DEFAULT_OUT else "the export's index.html (no site build)",
        "load_s": statistics.median(r["load_s"] for r in runs),
        "first": {"words": WORDS, "sentence": sentence, "seconds": statistics.median(r["first_s"] for r in runs)},
        "goal_first_s": 2.0,
        "runs": runs,
        "throughput": speed,
        "threads": 1,
        "load_average_before": load_before,
    }
    command = " ".join(map(shlex.quote, ["python", *sys.argv]))
    report["provenance"] = provenance(command, torch.device("cpu")) | {
        "chromium": runs[0]["chromium"],
        "onnxruntime_web": browser._ort_web(),
        "wall_s": time.perf_counter() - start,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({k: report[k] for k in ("load_s", "first", "throughput")}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
