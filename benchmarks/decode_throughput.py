"""Beam-search speed (K=4, α=0.6) on test 2016, with and without the decoder's key/value cache.

python benchmarks/decode_throughput.py --ckpt-dir checkpoints/experiment/en-de    # after aiayn.experiment, GPU
python benchmarks/decode_throughput.py --quick --out /tmp/bench_decode.json       # CPU smoke test, random weights
"""

import argparse
import time
from pathlib import Path

import torch

from _common import output_path, write

from aiayn import corpus
from aiayn.decoding import EOS, beam_search
from aiayn.model import PRESETS, make_model
from aiayn.pretrained import load_file


def source_batches(ids: list[list[int]], batch_size: int, pad_id: int, device) -> list[torch.Tensor]:
    """Source ids (+ </s>) sorted by length and padded into (batch, S) tensors, as translate() batches them."""
    order = sorted(ids, key=len)
    out = []
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        src = torch.full((len(rows), len(rows[-1]) + 1), pad_id, dtype=torch.long)
        for r, x in enumerate(rows):
            src[r, : len(x) + 1] = torch.tensor(x + [EOS])
        out.append(src.to(device))
    return out


def decode_all(model, batches, use_cache: bool) -> tuple[float, list]:
    """Seconds to beam-search every batch, and the hypotheses."""
    sync = torch.cuda.synchronize if batches[0].is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    hyps = [h for src in batches for h in beam_search(model, src, 4, 0.6, use_cache=use_cache)[0]]
    sync()
    return time.perf_counter() - start, hyps


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--ckpt-dir",
        default=None,
        help="a folder of aiayn.experiment (averaged.pt, tokenizer.json); "
        "without it the multi30k preset with random weights (every output runs to the length limit)",
    )
    p.add_argument("--direction", choices=("en-de", "de-en"), default="en-de")
    p.add_argument("--batch", type=int, default=128, help="sentences per beam-search batch")
    p.add_argument("--limit", type=int, default=None, help="only the first N sentences of test 2016")
    p.add_argument("--quick", action="store_true", help="tiny random model and 32 sentences (a CPU check)")
    p.add_argument("--out", default=None, help="JSON report; default results/bench_decode.json on a GPU")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = output_path(args.out, "bench_decode.json", device, args.quick)
    src_lang, _ = args.direction.split("-")
    if args.ckpt_dir:
        trained = load_file(Path(args.ckpt_dir) / "averaged.pt")  # the weights and tokenizer.json beside them
        model, tokenizer, weights = trained.model, trained.tokenizer, "trained"
        encoded = corpus.encoded(len(tokenizer))
        if encoded.tokenizer != tokenizer:
            raise SystemExit(
                f"error: the encoded cache of BPE {len(tokenizer)} is not the tokenizer in {args.ckpt_dir}"
            )
    else:
        encoded = corpus.encoded(1000 if args.quick else PRESETS["multi30k"].vocab_size)
        config = PRESETS["multi30k"].replace(vocab_size=len(encoded.tokenizer))
        model, weights = make_model(config.replace(N=1, d_model=32, d_ff=64, h=2) if args.quick else config), "random"
        args.limit = 32 if args.quick else args.limit
    model = model.to(device).eval()
    sources = encoded.ids["test2016"][src_lang][: args.limit]  # from the encoded cache: no spaCy needed
    batches = source_batches(sources, args.batch, model.config.pad_id, device)
    decode_all(model, batches[:1], True)  # warm-up
    results = {}
    for name, use_cache in (("cache", True), ("no_cache", False)):
        secs, hyps = decode_all(model, batches, use_cache)
        results[name] = {
            "seconds": secs,
            "sentences_per_s": len(sources) / secs,
            "output_tokens_per_s": sum(len(h) + 1 for h in hyps) / secs,
        }
        results[name]["hypotheses"] = hyps
        print(f"{name:9s} {results[name]['sentences_per_s']:10.1f} sentences/s  ({secs:.2f} s)")
    same = results["cache"].pop("hypotheses") == results["no_cache"].pop("hypotheses")
    report = {
        "config": {
            "model": model.config.__dict__,
            "weights": weights,
            "ckpt_dir": args.ckpt_dir,
            "direction": args.direction,
            "sentences": len(sources),
            "batch": args.batch,
            "beam_size": 4,
            "alpha": 0.6,
            "max_output": "input length + 50",
            "quick": args.quick,
        },
        "results": results,
        "speedup_cache": results["no_cache"]["seconds"] / results["cache"]["seconds"],
        "same_hypotheses": same,
    }
    print(f"cache speed-up {report['speedup_cache']:.2f}x, same hypotheses: {same}")
    write(out, report, device)
    return report


if __name__ == "__main__":
    main()
