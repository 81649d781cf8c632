"""Each lever of CPU training speed, measured alone against the CPU recipe's training as it runs, the variants
alternating in one process: target tokens per second, sentence pairs per second, and the ratio to the recipe's.

    python benchmarks/cpu_levers.py                  # writes results/cpu_levers.json (about 10 min on 2 cores)
    python benchmarks/cpu_levers.py --steps 2 --rounds 1 --only recipe fp32 --out /tmp/levers.json   # a quick check
    python benchmarks/cpu_levers.py --recipe cpu-fast --only recipe fp32 fused_attention fused_adam   # against cpu-fast
    python benchmarks/cpu_levers.py --recipe cpu-fast --only recipe dropout --out results/cpu_levers_fast_dropout.json

The recipe's training: the CPU recipe's model (aiayn.training.RECIPES["cpu"], or "cpu-fast" with ``--recipe``) on real
Multi30k batches of its size (4,096 tokens; 2,048 for cpu-fast) sorted by length (§5.1), the recipe's attention
(PyTorch's fused ``scaled_dot_product_attention``; Equation (1) written out for cpu-fast), the recipe's Adam step
(fused; a loop for cpu-fast), the precision ``--precision auto`` picks here (bf16 with AMX or AVX-512 BF16, else fp32)
and every core. Each variant changes one of these: the precision, the attention (Equation (1) written out, as chapter 2
writes it, or fused), the optimizer step (Adam's per-parameter loop, or fused), the batches (shuffled pairs, not sorted
by length: more padding), the threads, the vocabulary (4,000 BPE pieces), the batch size and dropout (P_drop 0.1, or
none, or 0.1 only where the paper's §5.4 puts it: on sublayer outputs and embedding sums, not on the attention weights
and the FFN's hidden activations). ``--compile`` adds torch.compile, whose compile time is reported apart. A
vocabulary of another size cuts the same sentences into another number of tokens, so sentence pairs per second compare
it fairly; the rest compare in target tokens. Speed only: which setting learns best per second is the recipe search's
question (§6.1).

It also measures the cores' matmul peak (the fastest product of two 2,048 x 2,048 matrices, bf16 and fp32) and the
share of it that the recipe's training reaches: its matmul and attention FLOPs per target token (counted by torch's
FlopCounterMode over the timed batches) times its best round's target tokens per second.
"""

import argparse
import random
import statistics
import sys
import time

from _common import ROOT, write

VARIANTS = ("recipe", "fp32", "math_attention", "fused_attention", "loop_adam", "fused_adam", "unsorted", "one_thread",
            "bpe4000", "tokens2048", "tokens8192", "dropout", "no_dropout", "paper_dropout")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="timed updates per round and variant")
    p.add_argument("--rounds", type=int, default=5, help="alternate the variants this many times")
    p.add_argument("--only", nargs="*", choices=VARIANTS, help="measure these variants only")
    p.add_argument("--compile", action="store_true", help="add torch.compile (its compile time reported apart)")
    p.add_argument("--recipe", default="cpu", choices=["cpu", "cpu-fast"], help="whose training is the baseline")
    p.add_argument("--out", help="default: results/cpu_levers.json (cpu), results/cpu_levers_fast.json (cpu-fast)")
    args = p.parse_args()

    import torch

    from aiayn import corpus
    from aiayn.batching import EpochBatches, collate
    from aiayn.floor import build
    from aiayn.model import PRESETS
    from aiayn.multi_head import MultiHeadAttention
    from aiayn.runs.config import run_precision
    from aiayn.runs.provenance import cpu_features
    from aiayn.training import AMP_DTYPES, RECIPES, LabelSmoothingLoss, make_optimizer

    recipe, threads = RECIPES[args.recipe], torch.get_num_threads()
    out = args.out or ROOT / "results" / f"cpu_levers{'_fast' * (args.recipe == 'cpu-fast')}.json"
    precision = run_precision(torch.device("cpu"))
    fused, fused_adam = (recipe.get(k, "fused") == "fused" for k in ("attention", "adam"))

    def unsorted(pairs, max_tokens):
        """Batches of pairs in a random order, cut at the same token budget: the padding of no length sorting."""
        order, batches, batch = list(range(len(pairs))), [], []
        random.Random(0).shuffle(order)
        for i in order:
            new = batch + [pairs[i]]
            size = len(new) * (max(len(s) for s, _ in new) + max(len(t) for _, t in new) + 2)
            if batch and size > max_tokens:
                batches.append(batch)
                new = [pairs[i]]
            batch = new
        out = []
        for b in batches:
            src, tgt_in, tgt_out = collate(b)
            out.append((src, tgt_in, tgt_out, int((tgt_out != 0).sum())))
        return out

    def setup(name: str) -> dict:
        bpe = 4000 if name == "bpe4000" else recipe["bpe_size"]
        max_tokens = {"tokens2048": 2048, "tokens8192": 8192}.get(name, recipe["max_tokens"])
        encoded = corpus.encoded(bpe)
        pairs = encoded.pairs("train", "en-de")
        if name == "unsorted":
            batches = unsorted(pairs, max_tokens)
        else:
            batches = [(*b, b.tokens) for b in EpochBatches(pairs, max_tokens, seed=0)(0)]
        config = PRESETS["multi30k"].replace(vocab_size=len(encoded.tokenizer), **recipe["set"])
        if name in ("dropout", "no_dropout"):  # what drawing dropout's masks costs (P_drop 0.1, or none)
            config = config.replace(P_drop=0.1 if name == "dropout" else 0.0)
        if name == "paper_dropout":  # P_drop 0.1 only where §5.4 puts it: sublayer outputs, embedding sums
            config = config.replace(P_drop=0.1, P_drop_inner=0.0)
        torch.manual_seed(0)
        model = build(config).train()
        for layer in model.modules():  # Equation (1)'s route, as TrainConfig.attention sets it
            if isinstance(layer, MultiHeadAttention):
                layer.fused = {"math_attention": False, "fused_attention": True}.get(name, fused)
        adam = {"loop_adam": False, "fused_adam": True}.get(name, fused_adam)
        optimizer = make_optimizer(model, config.d_model, 400, 0.3, fused=adam)[0]
        if not adam:
            optimizer.defaults["foreach"] = False
            for group in optimizer.param_groups:
                group["foreach"] = False
        return {
            "model": torch.compile(model, dynamic=True) if name == "compile" else model,
            "optimizer": optimizer,
            "loss": LabelSmoothingLoss(config.eps_ls),
            "batches": batches,
            "precision": "fp32" if name == "fp32" else precision,
            "threads": 1 if name == "one_thread" else threads,
        }

    def updates(v: dict, items) -> tuple[float, float]:
        """Target tokens and sentence pairs per second over ``items``, one update each."""
        torch.set_num_threads(v["threads"])
        try:
            start, tokens, pairs = time.perf_counter(), 0, 0
            for src, tgt_in, tgt_out, n in items:
                with torch.autocast("cpu", AMP_DTYPES[v["precision"]], enabled=v["precision"] != "fp32"):
                    logits = v["model"](src, tgt_in)
                (v["loss"](logits, tgt_out) / n).backward()
                v["optimizer"].step()
                v["optimizer"].zero_grad(set_to_none=True)
                tokens, pairs = tokens + n, pairs + src.size(0)
            seconds = time.perf_counter() - start
        finally:
            torch.set_num_threads(threads)
        return tokens / seconds, pairs / seconds

    def matmul_peak(dtype, n: int = 2048, repeats: int = 10, budget_s: float = 20.0) -> float:
        """The cores' matmul rate in GFLOP/s: the fastest of ``repeats`` products of two n x n matrices. Where the
        dtype is emulated (bf16 on a CPU without AVX-512 BF16 or AMX, some hundred times slower than fp32), n halves
        until the products fit ``budget_s``: a product of 2048 would take tens of seconds."""
        small = torch.randn(256, 256).to(dtype)
        start = time.perf_counter()
        small @ small
        first = time.perf_counter() - start
        while n > 256 and first * (n / 256) ** 3 * (repeats + 2) > budget_s:
            n //= 2
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        seconds = []
        for _ in range(repeats + 2):  # two untimed
            start = time.perf_counter()
            a @ b
            seconds.append(time.perf_counter() - start)
        return 2 * n**3 / min(seconds[2:]) / 1e9

    def flops_per_token(v: dict, items) -> float:
        """Matmul and attention FLOPs of an update (forward and backward, as torch's FlopCounterMode counts them) per
        target token, over ``items``."""
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with counter:
            updates(v, items)
        return counter.get_total_flops() / sum(n for *_, n in items)

    names = list(args.only or VARIANTS) + (["compile"] if args.compile else [])
    variants, warm_s = {}, {}
    for name in names:
        variants[name] = setup(name)
        start = time.perf_counter()
        updates(variants[name], variants[name]["batches"][:3])  # untimed: allocation, kernel choice, compilation
        warm_s[name] = time.perf_counter() - start
    rounds = {name: [] for name in names}
    for r in range(args.rounds):
        # the order turns by one each round: a variant's place in the round biases its rate by as much as 15% on an
        # AMD EPYC (the last ran fastest, whichever it was), so each takes each place in turn
        for name in names[r % len(names) :] + names[: r % len(names)]:
            batches = variants[name]["batches"]
            rounds[name].append(updates(variants[name], batches[3 + r * args.steps : 3 + (r + 1) * args.steps]))
    # a variant against the recipe: the median over rounds of the two rates' ratio in the same round (the same
    # batches, where the variant keeps the recipe's), so that the batches' lengths do not count as speed
    best = {name: max(rounds[name]) for name in names}  # the round with most target tokens/s
    results = {}
    for name in names:
        tok_s, pairs_s = best[name]
        results[name] = {"target_tokens_per_s": tok_s, "pairs_per_s": pairs_s, "warm_s": warm_s[name]}
        if "recipe" in rounds:
            ratios = [(v[0] / r[0], v[1] / r[1]) for v, r in zip(rounds[name], rounds["recipe"])]
            results[name] |= {
                "ratio_tokens": statistics.median(t for t, _ in ratios),
                "ratio_pairs": statistics.median(p for _, p in ratios),
            }
        ratio = results[name].get("ratio_tokens")
        print(f"{name:15} {tok_s:7.0f} target tokens/s {pairs_s:6.1f} pairs/s" +
              (f"  x{ratio:.2f} tokens, x{results[name]['ratio_pairs']:.2f} pairs" if ratio else ""))  # fmt: skip
    # the share of the cores' matmul peak that the recipe's training reaches (its best round)
    peak = {"bf16": matmul_peak(torch.bfloat16), "fp32": matmul_peak(torch.float32)}
    if "recipe" in variants:
        recipe_v = variants["recipe"]
        per_token = flops_per_token(recipe_v, recipe_v["batches"][3 : 3 + args.steps])
        achieved = per_token * results["recipe"]["target_tokens_per_s"] / 1e9
        share = achieved / peak[precision if precision in peak else "fp32"]
        results["recipe"] |= {"gflop_per_s": achieved, "flops_per_target_token": per_token, "share_of_peak": share}
        print(f"matmul peak: {peak['bf16']:.0f} GFLOP/s bf16, {peak['fp32']:.0f} fp32; the recipe's training "
              f"{achieved:.0f} GFLOP/s, {share:.0%} of the {precision} peak")  # fmt: skip
    report = {
        "matmul_peak_gflop_per_s": peak,
        "config": {
            "recipe": args.recipe,
            "precision": precision,
            "threads": threads,
            "steps": args.steps,
            "rounds": args.rounds,
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        },
        "results": results,
        "rounds": rounds,
        "cpu_features": cpu_features(),
    }
    write(__import__("pathlib").Path(out), report, torch.device("cpu"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
