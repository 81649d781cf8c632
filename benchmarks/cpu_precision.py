"""fp32 against bf16 autocast for CPU training: the CPU recipe's model on real Multi30k batches, the two precisions
alternating in one process, as target tokens per second and their ratio.

    python benchmarks/cpu_precision.py                  # writes results/cpu_precision.json (about 2 min, 2 cores)
    python benchmarks/cpu_precision.py --steps 2 --rounds 1 --out /tmp/cpu_precision.json   # a quick check
    python benchmarks/cpu_precision.py --isa avx2 --out results/cpu_precision_epyc_avx2.json   # as an AVX2-only CPU

bf16 needs AVX512-BF16 or AMX to be fast; without them (Colab's free CPU is AVX2 only) PyTorch emulates it and it is
slower than fp32. The report names the CPU's features, so the ratio is read with the hardware that made it.
`--isa avx2` makes PyTorch's own kernels and oneDNN's use AVX2 at most (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA), so
a newer CPU measures what a CPU with AVX2 only, like Colab's free one, would do.
"""

import argparse
import os
import sys
import time

from _common import ROOT, write


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="timed updates per round and precision")
    p.add_argument("--rounds", type=int, default=3, help="alternate the precisions this many times; the best counts")
    p.add_argument("--out", default=str(ROOT / "results" / "cpu_precision.json"))
    p.add_argument("--isa", choices=("native", "avx2"), default="native", help="the instructions the kernels may use")
    args = p.parse_args()
    if args.isa == "avx2":  # read when torch loads, so set before it is imported
        os.environ.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")

    import torch

    from aiayn import corpus
    from aiayn.batching import EpochBatches
    from aiayn.floor import build
    from aiayn.model import PRESETS
    from aiayn.runs.provenance import cpu_features
    from aiayn.training import AMP_DTYPES, RECIPES, LabelSmoothingLoss, make_optimizer

    recipe = RECIPES["cpu"]
    encoded = corpus.encoded(recipe["bpe_size"])
    config = PRESETS["multi30k"].replace(vocab_size=len(encoded.tokenizer), **recipe["set"])
    batches = EpochBatches(encoded.pairs("train", "en-de"), recipe["max_tokens"], seed=0)(0)
    loss_fn = LabelSmoothingLoss(config.eps_ls)
    models = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = build(config).train()
        models[precision] = (model, make_optimizer(model, config.d_model, 400, 0.3, fused=True)[0])

    def updates(precision: str, items) -> float:
        """Target tokens per second over ``items``, one update each."""
        model, optimizer = models[precision]
        start, tokens = time.perf_counter(), 0
        for batch in items:
            src, tgt_in, tgt_out = batch
            with torch.autocast("cpu", AMP_DTYPES[precision], enabled=precision != "fp32"):
                logits = model(src, tgt_in)
            (loss_fn(logits, tgt_out) / batch.tokens).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tokens += batch.tokens
        return tokens / (time.perf_counter() - start)

    warm = batches[:3]
    for precision in models:
        updates(precision, warm)  # untimed: the first calls allocate and pick kernels
    rounds = {precision: [] for precision in models}
    for r in range(args.rounds):
        timed = batches[3 + r * args.steps : 3 + (r + 1) * args.steps]
        for precision in models:
            rounds[precision].append(updates(precision, timed))
    best = {precision: max(v) for precision, v in rounds.items()}
    ratio = best["bf16"] / best["fp32"]
    print(
        f"fp32 {best['fp32']:.0f}, bf16 {best['bf16']:.0f} target tokens/s: bf16/fp32 = {ratio:.2f} "
        f"(CPU features: {', '.join(cpu_features())})"
    )
    report = {
        "config": {
            "recipe": "cpu",
            "model": {k: v for k, v in vars(config).items()},
            "steps": args.steps,
            "rounds": args.rounds,
            "threads": torch.get_num_threads(),
            "isa": args.isa,
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        },
        "results": {"target_tokens_per_s": best, "rounds": rounds},
        "ratio_bf16_over_fp32": ratio,
        "cpu_features": cpu_features(),
    }
    write(__import__("pathlib").Path(args.out), report, torch.device("cpu"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
