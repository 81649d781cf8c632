"""Beam search (K=4, α=0.6) of test 2016 on the CPU: the book's PyTorch decoding against ONNX Runtime's.

    python benchmarks/cpu_decoding.py          # writes results/cpu_decoding.json (about 5 min on 2 cores)
    python benchmarks/cpu_decoding.py --limit 50 --rounds 1 --out /tmp/cpu_decoding.json   # a quick check

The same shipped model (aiayn.pretrained) both ways, alternating, best round each, on every core:
- PyTorch: ``Pretrained.translate`` (``aiayn.decoding.translate``), what the book's pages use: batches of 64
  sentences, cached keys and values, fp32;
- ONNX Runtime: the graphs ``python -m aiayn.browser export`` writes for the page (fp32), one sentence at a time, as
  the page runs them (``aiayn.browser.Translator``, the beam in NumPy), with every core to one sentence.

Both include tokenising and detokenising. The hypotheses are compared: the faster route is only a choice if it gives
the same translations.
"""

import argparse
import tempfile
import time
from pathlib import Path

from _common import ROOT, write


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--direction", default="en-de", choices=["en-de", "de-en"])
    p.add_argument("--rounds", type=int, default=2, help="alternate the two routes this many times")
    p.add_argument("--limit", type=int, help="the first sentences of test 2016 only")
    p.add_argument("--out", default=str(ROOT / "results" / "cpu_decoding.json"))
    args = p.parse_args()

    import torch

    from aiayn import browser, data, pretrained

    shipped = pretrained.load(args.direction)
    src_lang, _ = args.direction.split("-")
    sources = [s for s, _ in data.load("test2016", src_lang, args.direction.split("-")[1])][: args.limit]
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        entry = browser.export_direction(args.direction, Path(tmp), "fp32")
        onnx = browser.Translator(
            Path(tmp) / entry["files"]["encoder"], Path(tmp) / entry["files"]["decoder"], entry["config"], threads
        )

        def with_onnx():
            ids = [shipped.tokenizer.encode(s, src_lang) for s in sources]
            return [shipped.tokenizer.decode(h) for h in onnx.translate_ids(ids)]

        routes = {"pytorch": lambda: shipped.translate(sources), "onnxruntime": with_onnx}
        seconds, hyps = {name: [] for name in routes}, {}
        for _ in range(args.rounds):
            for name, route in routes.items():
                start = time.perf_counter()
                hyps[name] = route()
                seconds[name].append(time.perf_counter() - start)
                print(f"{name}: {seconds[name][-1]:.1f} s", flush=True)
    same = sum(a == b for a, b in zip(hyps["pytorch"], hyps["onnxruntime"]))
    best = {name: min(s) for name, s in seconds.items()}
    report = {
        "direction": args.direction,
        "sentences": len(sources),
        "threads": threads,
        "seconds": seconds,
        "best_seconds": best,
        "ratio_onnxruntime_over_pytorch": best["onnxruntime"] / best["pytorch"],
        "faster": min(best, key=best.get),
        "identical": same / len(sources),
        "identical_count": same,
        "versions": {"onnxruntime": __import__("onnxruntime").__version__, "torch": torch.__version__},
    }
    write(Path(args.out), report, torch.device("cpu"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
