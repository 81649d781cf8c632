"""What an epoch costs beyond the model: building its batches, and the training loop's own work per update.

    python benchmarks/epoch_cost.py                      # Multi30k's training split, the multi30k preset's batches
    python benchmarks/epoch_cost.py --quick --out /tmp/epoch_cost.json    # fewer repeats and updates

Batches: one epoch of Multi30k's training pairs (encoded cache, BPE 8,000), built the straightforward way
(`token_batches` + `collate` every epoch) and with `EpochBatches` (padded once, then only reordered), best of
--repeats epochs each. Loop: `aiayn.training.train` against a bare loop (forward, label-smoothed loss, backward,
the same fused Adam and schedule) on the same batches and a small model, so that any bookkeeping of the loop shows
up in the ratio. After a warm-up round the two loops alternate --rounds times; the best round of each counts.
"""

import argparse
import time

import torch

from _common import output_path, write

from aiayn import corpus
from aiayn.batching import EpochBatches, collate, example_lengths, token_batches
from aiayn.model import PRESETS, make_model
from aiayn.training import LabelSmoothingLoss, TrainConfig, make_optimizer, train


def best_seconds(make, repeats: int) -> float:
    """The best of `repeats` timings of make(epoch), for epochs 1, 2, ..."""
    times = []
    for epoch in range(1, repeats + 1):
        start = time.perf_counter()
        make(epoch)
        times.append(time.perf_counter() - start)
    return min(times)


def batch_cost(pairs, max_tokens: int, repeats: int, device) -> dict:
    lengths = example_lengths(pairs)
    rebuild = best_seconds(
        lambda e: [collate([pairs[i] for i in b]) for b in token_batches(lengths, max_tokens, seed=e)], repeats
    )
    start = time.perf_counter()
    once = EpochBatches(pairs, max_tokens, device=device)
    build = time.perf_counter() - start

    def reorder(epoch):
        once(epoch)
        if device.type == "cuda":
            torch.cuda.synchronize()

    per_epoch = best_seconds(reorder, repeats)
    return {
        "pairs": len(pairs),
        "max_tokens": max_tokens,
        "batches_per_epoch": len(once),
        "rebuild_s_per_epoch": rebuild,
        "epoch_batches_build_s": build,
        "epoch_batches_s_per_epoch": per_epoch,
        "speedup": rebuild / per_epoch,
        "target_s_per_epoch": 0.05,
        "meets_target": per_epoch <= 0.05,
    }


def bare_loop(model, batches, updates: int, warmup: int) -> None:
    """Forward, loss, backward, step: nothing else (no precision handling, no counting, no logging)."""
    loss_fn = LabelSmoothingLoss(model.config.eps_ls, model.config.pad_id)
    optimizer, scheduler = make_optimizer(model, model.config.d_model, warmup, fused=True)
    model.train()
    for k in range(updates):
        src, tgt_in, tgt_out = batches[k % len(batches)]
        loss = loss_fn(model(src, tgt_in), tgt_out) / int(batches[k % len(batches)].tokens)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()


def loop_cost(batches, config: dict, updates: int, rounds: int, device) -> dict:
    def book(model):
        cfg = TrainConfig(warmup=100, epochs=10**6, max_updates=updates, precision="fp32", progress=False, log=False)
        train(model, lambda epoch: batches, None, cfg)

    def bare(model):
        bare_loop(model, batches, updates, 100)

    times = {"book": [], "bare": []}
    for round_ in range(rounds + 1):  # round 0 warms up (allocator, kernels) and is not counted
        for name, run in (("book", book), ("bare", bare)):
            torch.manual_seed(0)
            model = make_model(**config).to(device)
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            run(model)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if round_ > 0:
                times[name].append(time.perf_counter() - start)
    best = {name: min(t) for name, t in times.items()}
    return {
        "updates": updates,
        "rounds": rounds,
        "model": config,
        "book_ms_per_update": best["book"] / updates * 1e3,
        "bare_ms_per_update": best["bare"] / updates * 1e3,
        "ratio_book_over_bare": best["book"] / best["bare"],
        "all_s": times,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-tokens", type=int, default=8000, help="the batch budget (the multi30k preset's)")
    p.add_argument("--bpe-size", type=int, default=8000)
    p.add_argument("--repeats", type=int, default=5, help="epochs timed per way of building batches")
    p.add_argument("--updates", type=int, default=60, help="updates per timed loop")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of the two loops")
    p.add_argument("--quick", action="store_true", help="2 repeats, 8 updates, 2 rounds: checks the script")
    p.add_argument("--out", help="report path (default results/bench_epoch.json on a GPU, /tmp on the CPU)")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.updates, args.rounds = 2, 8, 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    path = output_path(args.out, "bench_epoch.json", device, args.quick)

    pairs = corpus.encoded(args.bpe_size).pairs("train", "en-de")
    batches_report = batch_cost(pairs, args.max_tokens, args.repeats, device)
    print(
        f"batches: rebuilt {batches_report['rebuild_s_per_epoch']:.3f} s per epoch; EpochBatches "
        f"{batches_report['epoch_batches_s_per_epoch'] * 1e3:.1f} ms per epoch "
        f"({batches_report['speedup']:.0f} times less; built once in {batches_report['epoch_batches_build_s']:.2f} s)"
    )

    small = (
        {
            **vars(PRESETS["multi30k"]),
            "N": 1,
            "d_model": 64,
            "d_ff": 128,
            "h": 2,
            "P_drop": 0.0,
            "vocab_size": args.bpe_size,
        }
        if device.type == "cpu"
        else {**vars(PRESETS["multi30k"])}
    )
    cap = 1000 if device.type == "cpu" else args.max_tokens  # CPU: small batches, so the loop's own work shows
    loop_batches = EpochBatches(pairs, cap, shuffle=False, device=device)(0)[:16]
    loop_report = loop_cost(loop_batches, small, args.updates, args.rounds, device)
    print(
        f"loop: {loop_report['book_ms_per_update']:.2f} ms per update in train(), "
        f"{loop_report['bare_ms_per_update']:.2f} ms in a bare loop (ratio {loop_report['ratio_book_over_bare']:.3f})"
    )
    write(
        path, {"config": {**vars(args), "device": str(device)}, "batches": batches_report, "loop": loop_report}, device
    )


if __name__ == "__main__":
    main()
