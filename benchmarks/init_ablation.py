"""Why the book initialises as it does (§3.1): validation perplexity after a fixed, short training of the CPU recipe's
model, with each part of the initialisation undone in turn, and the floor (nn.Transformer's layers) beside it.

    python benchmarks/init_ablation.py                      # writes results/init_ablation.json (about 10 min, 2 cores)
    python benchmarks/init_ablation.py --updates 20 --out /tmp/init_ablation.json   # a quick check of the script

Variants, each trained alike from the same seed (the recipe's model, batches, schedule and clipping; fp32):
- `xavier`: every matrix Xavier-uniform, the shared embedding table too (The Annotated Transformer's choice);
- `embedding`: the table N(0, 1/d_model) as tensor2tensor draws it, every other matrix Xavier;
- `book`: the book's initialisation (aiayn.model._init_weights): the table as above and W^Q, W^K, W^V Xavier with gain
  1/sqrt(2), as fairseq (and nn.MultiheadAttention's single in_proj matrix) has it;
- `floor`: nn.Transformer's layers (aiayn.floor), initialised by the same function.
Two variants train at a time, one thread each, so that the two cores are used.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from _common import ROOT, write

VARIANTS = ("xavier", "embedding", "book", "floor")


def one(variant: str, updates: int, warmup: int, factor: float) -> dict:
    """Train one variant in this process; its record."""
    import torch
    from torch import nn

    from aiayn import corpus
    from aiayn.batching import EpochBatches
    from aiayn.floor import build
    from aiayn.model import PRESETS
    from aiayn.training import RECIPES, LabelSmoothingLoss, TrainConfig, evaluate, train

    recipe = RECIPES["cpu"]
    encoded = corpus.encoded(recipe["bpe_size"])
    config = PRESETS["multi30k"].replace(vocab_size=len(encoded.tokenizer), **recipe["set"])
    train_data = EpochBatches(encoded.pairs("train", "en-de"), recipe["max_tokens"], seed=0)
    val_data = EpochBatches(encoded.pairs("val", "en-de"), recipe["max_tokens"], shuffle=False)(0)
    torch.manual_seed(0)
    model = build(config, "torch" if variant == "floor" else "aiayn")
    if variant in ("xavier", "embedding"):
        for name, p in model.named_parameters():
            if name.endswith(("W_Q.weight", "W_K.weight", "W_V.weight")):
                nn.init.xavier_uniform_(p)  # gain 1
            if variant == "xavier" and name.endswith("lut.weight"):
                nn.init.xavier_uniform_(p)
    started = time.perf_counter()
    cfg = TrainConfig(
        warmup=warmup,
        factor=factor,
        epochs=100,
        max_updates=updates,
        clip_norm=recipe["clip_norm"],
        precision="fp32",
        progress=False,
        log=False,
    )
    history = train(model, train_data, None, cfg)
    val = evaluate(model, val_data, LabelSmoothingLoss(config.eps_ls), "cpu", "fp32")
    return {
        "variant": variant,
        "updates": updates,
        "val_ppl": val["ppl"],
        "val_loss": val["loss"],
        "train_loss": history["loss"],
        "train_s": time.perf_counter() - started,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--updates", type=int, default=300)
    p.add_argument("--warmup", type=int, default=150)
    p.add_argument("--peak-lr", type=float, default=7e-4)
    p.add_argument("--out", default=str(ROOT / "results" / "init_ablation.json"))
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # one variant, in a child process
    args = p.parse_args()
    d_model = 256
    factor = args.peak_lr / (d_model**-0.5 * args.warmup**-0.5)
    if args.variant:
        print(json.dumps(one(args.variant, args.updates, args.warmup, factor)))
        return 0
    records, started = [], time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AIAYN_CONCURRENT_RUNS": "2"}
    for pair in (VARIANTS[:2], VARIANTS[2:]):
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--variant",
                    v,
                    "--updates",
                    str(args.updates),
                    "--warmup",
                    str(args.warmup),
                    "--peak-lr",
                    str(args.peak_lr),
                ],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for v in pair
        ]
        for child in children:
            out, _ = child.communicate()
            if child.returncode:
                raise SystemExit(f"a variant failed (exit {child.returncode})")
            records.append(json.loads(out.strip().splitlines()[-1]))
            print(f"{records[-1]['variant']:>10}: val ppl {records[-1]['val_ppl']:.1f} after {args.updates} updates")
    import torch

    report = {
        "config": {
            "updates": args.updates,
            "warmup": args.warmup,
            "peak_lr": args.peak_lr,
            "factor": factor,
            "recipe": "cpu",
            "direction": "en-de",
            "threads_per_run": 1,
            "runs_at_once": 2,
            "seed": 0,
            "precision": "fp32",
        },
        "results": records,
        "wall_s": time.perf_counter() - started,
    }
    write(__import__("pathlib").Path(args.out), report, torch.device("cpu"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
