"""torch.compile against eager: the same losses over a few updates of varying shapes, and how many graphs
compiling made.

    python benchmarks/compile_check.py                     # on a GPU: results/bench_compile.json
    python benchmarks/compile_check.py --out /tmp/compile.json    # on the CPU (minutes: compiling is slow there)

Batches of Multi30k pairs (encoded cache) with lengths padded to multiples of --pad-multiple, so that the batches
have only a few distinct shapes; the same model (same seed, no dropout) trains --updates updates with
`TrainConfig(compile=True)` and without. Reported: both loss curves, their largest difference, the distinct batch
shapes, the graphs dynamo compiled, and the wall time of each (compilation included).
"""

import argparse
import time

import torch

from _common import output_path, write

from aiayn import corpus
from aiayn.batching import EpochBatches
from aiayn.model import PRESETS, make_model
from aiayn.training import TrainConfig, train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=12)
    p.add_argument("--pad-multiple", type=int, default=8)
    p.add_argument("--pairs", type=int, default=3000, help="the first N training pairs")
    p.add_argument("--max-tokens", type=int, default=2000)
    p.add_argument("--out", help="report path (default results/bench_compile.json on a GPU, /tmp on the CPU)")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    path = output_path(args.out, "bench_compile.json", device, quick=False)
    pairs = corpus.encoded(8000).pairs("train", "en-de")[: args.pairs]
    batches = EpochBatches(pairs, args.max_tokens, seed=0, pad_multiple=args.pad_multiple, device=device)(0)
    batches = batches[: args.updates]
    config = {**vars(PRESETS["multi30k"]), "P_drop": 0.0}
    if device.type == "cpu":
        config.update(N=1, d_model=64, d_ff=128, h=2)  # compiling the full model on a CPU takes very long
    runs = {}
    for compiled in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = make_model(**config).to(device)
        cfg = TrainConfig(warmup=100, epochs=1, compile=compiled, progress=False, log=False, log_every=1)
        start = time.perf_counter()
        history = train(model, batches, None, cfg)
        if device.type == "cuda":
            torch.cuda.synchronize()
        runs["compiled" if compiled else "eager"] = {"loss": history["loss"], "wall_s": time.perf_counter() - start}
        if compiled:
            from torch._dynamo.utils import counters

            runs["compiled"]["graphs"] = int(counters["stats"].get("unique_graphs", 0))
    diff = max(abs(a - b) for a, b in zip(runs["eager"]["loss"], runs["compiled"]["loss"]))
    shapes = sorted({(tuple(b[0].shape), tuple(b[1].shape)) for b in batches})
    print(
        f"{len(batches)} updates, {len(shapes)} distinct batch shapes, {runs['compiled']['graphs']} graphs compiled; "
        f"largest loss difference {diff:.2e}; eager {runs['eager']['wall_s']:.1f} s, "
        f"compiled {runs['compiled']['wall_s']:.1f} s (compilation included)"
    )
    write(
        path,
        {
            "config": {**vars(args), "model": config, "device": str(device)},
            "runs": runs,
            "max_abs_loss_difference": diff,
            "batch_shapes": shapes,
        },
        device,
    )


if __name__ == "__main__":
    main()
