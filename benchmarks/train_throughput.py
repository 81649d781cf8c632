"""Training throughput and MFU of aiayn's Transformer against PyTorch's nn.Transformer at the same configuration.

python benchmarks/train_throughput.py                       # GPU: base model, batch 256 x 48, results/bench_train.json
python benchmarks/train_throughput.py --preset multi30k --out results/bench_train_multi30k.json
python benchmarks/train_throughput.py --quick --out /tmp/bench_train.json    # CPU smoke test, tiny sizes
python benchmarks/train_throughput.py --preset multi30k --set N=3 d_ff=512 h=8 P_drop=0.2 --profile --out FILE
                                       # the GPU recipe's model, and where one update of ours spends its time
"""

import argparse
import math
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from _common import output_path, write

from aiayn.floor import TorchTransformer
from aiayn.model import PRESETS, count_parameters, make_model
from aiayn.training import AMP_DTYPES, LabelSmoothingLoss, TrainConfig, choose_precision, train

PEAK_BF16_TFLOPS = {  # dense bf16 tensor-core peaks from the vendor's data sheets, matched in this order
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.4,
    "H200": 989.4,
    "GH200": 989.4,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10": 125.0,
}


LOSS_COMPILED = "aiayn, loss compiled"  # the row of --compile-loss


def peak_tflops(name: str, given: float | None) -> float | None:
    """The device's dense bf16 peak: --peak-tflops if given, else looked up from the device name (None if unknown)."""
    if given is not None:
        return given
    return next((v for key, v in PEAK_BF16_TFLOPS.items() if key in name), None)


def flops_per_step(model, batch, precision: str) -> int:
    """FLOPs of one forward + backward pass, counted by torch.utils.flop_counter (matmuls and attention)."""
    src, tgt_in, tgt_out = batch
    loss_fn = LabelSmoothingLoss(model.config.eps_ls, model.config.pad_id)
    with FlopCounterMode(display=False) as counter:
        with torch.autocast(src.device.type, AMP_DTYPES[precision], enabled=precision != "fp32"):
            logits = model(src, tgt_in)
        loss_fn(logits, tgt_out).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def seconds(model, batch, steps: int, precision: str, attention: str = "fused", compile: bool = False) -> float:
    """Wall time of `steps` updates of the book's training loop (forward, label-smoothed loss, backward, Adam);
    compile: the loop's own torch.compile (TrainConfig.compile: the model and the loss)."""
    cfg = TrainConfig(
        compile=compile,
        warmup=4000,
        max_updates=steps,
        epochs=1,
        precision=precision,
        attention=attention,
        progress=False,
        log=False,
        log_every=steps,
    )
    if batch[0].is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    train(model, [batch] * steps, None, cfg)
    if batch[0].is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def profile(model, batch, steps: int, precision: str, attention: str, compile: bool = False, top: int = 25) -> dict:
    """Where `steps` updates of the training loop spend the device's time (torch.profiler): the operators with the
    most self time, and the share of the whole that each takes."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    cuda = batch[0].is_cuda
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profiler(activities=activities) as prof:
        seconds(model, batch, steps, precision, attention, compile)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in events) or 1.0
    rows = [
        {
            "op": e.key,
            "calls_per_step": e.count / steps,
            "us_per_step": getattr(e, key) / steps,
            "share": getattr(e, key) / total,
        }
        for e in events[:top]
    ]
    for row in rows[:12]:
        print(f"  {row['share']:6.1%} {row['us_per_step']:10.0f} us/step  {row['op'][:70]}")
    return {"time": key, "us_per_step": total / steps, "top": rows}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes and few steps (a CPU check, not a measurement)")
    p.add_argument("--preset", choices=("base", "multi30k"), default="base", help="the model configuration")
    p.add_argument("--batch", type=int, default=256, help="sentences per batch")
    p.add_argument("--length", type=int, default=48, help="source and target tokens per sentence")
    p.add_argument("--vocab", type=int, default=None, help="shared vocabulary size (default: the preset's)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="change the preset: N=3 P_drop=0.2")
    p.add_argument("--profile", action="store_true", help="also profile our updates (torch.profiler) into the report")
    p.add_argument("--warmup-steps", type=int, default=10, help="untimed updates before each measurement")
    p.add_argument("--steps", type=int, default=50, help="timed updates per measurement")
    p.add_argument("--rounds", type=int, default=2, help="alternate the two models this many times; the best counts")
    p.add_argument("--attention", choices=("fused", "written"), default="fused", help="our Equation (1)'s route")
    p.add_argument("--compile", action="store_true", help="torch.compile our model")
    p.add_argument(
        "--compile-loss",
        action="store_true",
        help="also time the training loop's own compile (the model and the loss) as 'aiayn, loss compiled'",
    )
    p.add_argument("--compile-reference", action="store_true", help="torch.compile nn.Transformer too")
    p.add_argument(
        "--compile-mode",
        choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
        default="default",
        help="torch.compile's mode (reduce-overhead: CUDA graphs)",
    )
    p.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp16", "fp32"),
        default="auto",
        help="autocast precision; auto: bf16 on recent GPUs, fp16 on older ones, fp32 on a CPU",
    )
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of the device, for MFU")
    p.add_argument("--out", default=None, help="JSON report; default results/bench_train.json on a GPU")
    args = p.parse_args(argv)
    if args.compile_loss and args.compile_mode != "default":
        p.error("--compile-loss times the training loop's own compile, in the default mode: drop --compile-mode")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = output_path(args.out, "bench_train.json", device, args.quick)
    config = PRESETS[args.preset].replace(vocab_size=args.vocab or PRESETS[args.preset].vocab_size)
    changes = dict(pair.partition("=")[::2] for pair in args.set)
    config = config.replace(**{k: type(getattr(config, k))(v) for k, v in changes.items()})
    if args.quick:
        config = config.replace(vocab_size=1000, N=2, d_model=64, d_ff=128, h=4)
        args.batch, args.length, args.warmup_steps, args.steps, args.rounds = 8, 12, 2, 3, 1
    precision = choose_precision(device, args.precision)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, config.vocab_size, (args.batch, 2, args.length), generator=g)
    src, tgt = tokens[:, 0], tokens[:, 1]
    batch = tuple(t.to(device) for t in (src, torch.cat([torch.ones_like(tgt[:, :1]), tgt[:, :-1]], 1), tgt))
    tokens_per_step = 2 * args.batch * args.length  # source + target, no padding

    torch.manual_seed(0)
    models = {"aiayn": make_model(config).to(device), "nn.Transformer": TorchTransformer(config).to(device)}
    report = {
        "config": {
            "model": config.__dict__,
            "batch": args.batch,
            "length": args.length,
            "precision": precision,
            "compile": args.compile,
            "compile_reference": args.compile_reference,
            "compile_loss": args.compile_loss,
            "compile_mode": args.compile_mode,
            "attention": args.attention,
            "steps": args.steps,
            "warmup_steps": args.warmup_steps,
            "rounds": args.rounds,
            "quick": args.quick,
            "tokens_per_step": tokens_per_step,
        },
        "flops_method": "torch.utils.flop_counter: forward + backward of one batch (matmuls and attention; "
        "the optimizer and elementwise ops are not counted)",
    }
    flops = {name: flops_per_step(m, batch, precision) for name, m in models.items()}
    runners = {
        "aiayn": torch.compile(models["aiayn"], mode=args.compile_mode) if args.compile else models["aiayn"],
        "nn.Transformer": torch.compile(models["nn.Transformer"], mode=args.compile_mode)
        if args.compile_reference
        else models["nn.Transformer"],
    }
    if args.compile_loss:  # compiled inside train(), with the loss
        runners[LOSS_COMPILED], flops[LOSS_COMPILED] = models["aiayn"], flops["aiayn"]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_tflops(name, args.peak_tflops) if device.type == "cuda" else args.peak_tflops
    times, warm = {k: [] for k in runners}, {k: [] for k in runners}
    for _ in range(args.rounds):
        for key, model in runners.items():
            # warm-up: kernels, allocator, compilation (the first round's includes torch.compile's time)
            inner = key == LOSS_COMPILED
            warm[key].append(seconds(model, batch, args.warmup_steps, precision, args.attention, inner))
            times[key].append(seconds(model, batch, args.steps, precision, args.attention, inner))
    results = {}
    for key in runners:
        best = min(times[key])
        results[key] = {
            "parameters": count_parameters(models.get(key, models["aiayn"])),
            "flops_per_step": flops[key],
            "seconds_per_step": best / args.steps,
            "tokens_per_s": tokens_per_step * args.steps / best,
            "all_round_seconds": times[key],
            "warmup_seconds": warm[key],
        }
        results[key]["mfu"] = (flops[key] * args.steps / best / (peak * 1e12)) if peak else None
        print(
            f"{key:15s} {results[key]['tokens_per_s']:12,.0f} tokens/s  "
            f"{results[key]['seconds_per_step'] * 1e3:8.2f} ms/step  "
            + (f"MFU {results[key]['mfu']:.1%}" if peak else "MFU n/a (give --peak-tflops)")
        )
    report.update(
        {
            "peak_bf16_tflops": peak,
            "results": results,
            "ratio_tokens_per_s": results["aiayn"]["tokens_per_s"] / results["nn.Transformer"]["tokens_per_s"],
        }
    )
    print(f"aiayn / nn.Transformer throughput: {report['ratio_tokens_per_s']:.3f}")
    if args.profile:
        # of ours with the loss compiled if it was timed (the model unwrapped: train() compiles it)
        ours = runners[LOSS_COMPILED] if args.compile_loss else runners["aiayn"]
        report["profile"] = profile(ours, batch, args.steps, precision, args.attention, args.compile_loss)
    assert math.isfinite(report["ratio_tokens_per_s"])
    write(out, report, device)
    return report


if __name__ == "__main__":
    main()
