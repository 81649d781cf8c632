"""§6.1 in one command: train on Multi30k, average the last checkpoints, beam-search the test sets, score them.

    python -m aiayn.experiment --direction en-de --out runs/en-de --time-budget 540
    torchrun --nproc_per_node=8 -m aiayn.experiment --direction en-de --out runs/en-de   # one process per GPU

The sentences come from the encoded cache (aiayn.corpus), so a run imports no spaCy; only the lowercased
Moses-tokenised BLEU needs sacremoses.

Not about the paper's model, training or decoding: those are the chapters' modules (aiayn.model, aiayn.training,
aiayn.decoding), and the recipes are chapter 10's (aiayn.training.RECIPES). This module runs them in order and writes
what they make.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # the run's clock starts before the heavy imports

import dataclasses
from dataclasses import dataclass, field
import datetime
import json
import os
import shlex
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from aiayn import corpus, data
from aiayn.batching import EpochBatches
from aiayn.decoding import average_checkpoints, translate_ids
from aiayn.floor import build
from aiayn.model import TransformerConfig, count_parameters
from aiayn.pretrained import attention_maps
from aiayn.runs.config import (  # noqa: F401  (parser, recipe_config, to_argv: for chapters 10 and 12)
    SCORED,
    ExperimentError,
    RunConfig,
    check_options,
    make_config,
    parse_args,
    parser,
    recipe_config,
    run_precision,
    to_argv,
)
from aiayn.runs.provenance import ROOT, cpu_name, provenance
from aiayn.runs.scoring import WU_REF_LEN, check_reference_length, moses_tokenize, run_checks, score
from aiayn.training import (
    CheckpointError,
    LabelSmoothingLoss,
    TrainConfig,
    checkpoints,
    evaluate,
    read_checkpoint,
    train,
    world,
)

BEAM, ALPHA = 4, 0.6  # §6.1; the output limit, input length + 50, is aiayn.decoding's default
STOPPED_BY = {
    "max_seconds": "time budget",
    "patience": "early stopping",
}  # train()'s reasons, as metrics.json words them


def _write_atomic(path: Path, text: str) -> None:
    data.write_atomic(path, text.encode("utf-8"))


def _start_processes() -> torch.device:
    """Join the torchrun group if there is one; the device of this process (its own GPU, or the CPU)."""
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")  # CPU token counts
    if not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    return device


@dataclass
class State:
    """What the phases of one run hand on: the folders, the process, the data, the model and, phase by phase, what
    training, averaging and decoding made."""

    out: Path
    ckpt_dir: Path
    existing: list[Path]
    device: torch.device
    rank: int
    size: int
    encoded: object = None
    train_data: object = None
    val_data: list = None
    config: TransformerConfig = None
    model: nn.Module = None
    precision: str = "fp32"
    started_with: dict = None
    tokens_before: float = 0
    cfg: TrainConfig = None
    history: dict = None
    last: dict = None
    stopped_by: str = None
    paths: list = None
    val: dict = None
    scores: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    reference_check: dict = None
    checks: dict = None
    train_wall_start: float = 0.0  # the wall clock when training began (checkpoints' times are on it)


def run(args: RunConfig, argv: list[str], started: float) -> dict | None:
    """Train (unless --eval-only), average, decode and score; write everything to args.out and return the metrics.

    Under torchrun every process trains; process 0 alone evaluates and writes, the others return None.
    """
    phases, tick = {}, time.perf_counter()
    check_options(args)
    out = Path(args.out)
    ckpt_dir = Path(args.ckpt_dir or ROOT / "checkpoints" / "experiment" / out.resolve().name)
    if ckpt_dir.resolve().is_relative_to(out.resolve()):
        raise ExperimentError(f"--ckpt-dir {ckpt_dir} lies inside --out {out}; results hold no checkpoints")
    if (out / "metrics.json").is_file():
        if args.resume:
            print(
                f"the run in {out} is finished: {out / 'metrics.json'} holds its scores; nothing to do "
                f"(evaluate again with --eval-only into another --out)",
                flush=True,
            )
            return json.loads((out / "metrics.json").read_text(encoding="utf-8"))
        raise ExperimentError(
            f"{out} already holds the metrics.json of a finished run; choose another --out, or "
            f"delete {out} to run again"
        )
    state = setup(args, argv, out, ckpt_dir)
    phases["setup"] = time.perf_counter() - tick
    tick = time.perf_counter()
    train_phase(state, args, started)
    phases["train"] = time.perf_counter() - tick
    if state.rank > 0:
        return None
    for name, phase in (("average", average), ("decode_and_score", decode_and_score), ("write", write_outputs)):
        tick = time.perf_counter()
        phase(state, args)
        phases[name] = time.perf_counter() - tick
    phases["total"] = time.perf_counter() - started
    metrics = write_metrics(state, args, phases)
    if args.curve:
        curve(state, args, phases["train"])
    return metrics


def setup(args: RunConfig, argv: list[str], out: Path, ckpt_dir: Path) -> State:
    """Check the checkpoint folder, start the processes, read the encoded data, build the model."""
    existing = checkpoints(ckpt_dir) if ckpt_dir.is_dir() else []
    if existing and not (args.resume or args.eval_only):
        raise ExperimentError(
            f"{ckpt_dir} already holds {len(existing)} checkpoints of an earlier run; pass --resume "
            f"to continue it, --eval-only to evaluate it, or delete the folder or choose --ckpt-dir"
        )
    if args.eval_only and not existing:
        raise ExperimentError(f"--eval-only: no checkpoints in {ckpt_dir}; train first (drop --eval-only)")
    if args.resume and not existing:
        print(f"--resume: no checkpoints in {ckpt_dir} yet; starting the run from the beginning", flush=True)
    if args.splits:
        moses_tokenize([], "de")  # sacremoses is there: fail now, not after training
    device = _start_processes()
    rank, size = world()
    s = State(out, ckpt_dir, existing, device, rank, size)
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        s.encoded = corpus.encoded(args.bpe_size)  # made once (needs spaCy then), read by every later run
        s.encoded.tokenizer.save(ckpt_dir / "tokenizer.json")
    if size > 1:
        dist.barrier()  # process 0 has written the cache
    if rank > 0:
        s.encoded = corpus.encoded(args.bpe_size)
    batches = {"max_tokens": args.max_tokens, "pad_multiple": args.pad_multiple, "device": device}
    s.train_data = EpochBatches(s.encoded.pairs("train", args.direction), seed=args.train.seed, **batches)
    s.val_data = EpochBatches(s.encoded.pairs("val", args.direction), shuffle=False, **batches)(0)
    if args.limit_train:
        s.train_data = (lambda full, n: lambda epoch: full(epoch)[:n])(s.train_data, args.limit_train)
    s.config = make_config(args, len(s.encoded.tokenizer))
    if existing:
        _check_continued(existing[-1], s.config, args.layers)
        s.tokens_before = read_checkpoint(existing[-1])["progress"].get("tokens", 0)
    torch.manual_seed(args.train.seed)
    s.model = build(s.config, args.layers).to(device)
    s.precision = run_precision(device, args.train.precision)
    # the code and machine as the run starts (the tree may change while it trains); the date is the end's
    s.started_with = provenance(" ".join(["python -m aiayn.experiment", *map(shlex.quote, argv)]), device)
    if rank == 0:
        threads = torch.get_num_threads()
        where = (
            torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else f"CPU ({cpu_name()}, {threads} thread{'s' if threads > 1 else ''})"
        )
        print(
            f"{args.direction}: {count_parameters(s.model):,} parameters on {where}, precision "
            f"{s.precision} ({'chosen by --precision' if args.train.precision != 'auto' else 'auto'})",
            flush=True,
        )
    return s


def _check_continued(path: Path, config: TransformerConfig, layers: str) -> None:
    """A run continued (--resume, --eval-only) must build the model its checkpoints hold."""
    last = read_checkpoint(path)
    trained = TransformerConfig(**last["model_config"])
    if trained != config:
        raise ExperimentError(
            f"{path.parent} holds a model with {trained}, but --preset/--set ask for {config}; "
            f"give the same --preset and --set as the run being continued, or another --ckpt-dir"
        )
    held = {"Transformer": "aiayn", "TorchTransformer": "torch"}.get(last.get("model_class"), "aiayn")
    if held != layers:
        raise ExperimentError(
            f"{path.parent} holds a model with --layers {held}, not {layers}; give "
            f"--layers {held}, or another --ckpt-dir"
        )


def train_phase(s: State, args: RunConfig, started: float) -> None:
    """Train within the time budget (or read the history of the checkpoints, --eval-only); note why it stopped."""
    keep = 10**9 if args.curve else max(args.average_last, 2)
    s.cfg = dataclasses.replace(args.train, ckpt_dir=str(s.ckpt_dir), keep_last=keep)
    s.train_wall_start = time.time()
    s.cfg.precision = s.precision
    if args.time_budget is not None:
        s.cfg.max_seconds = started + args.time_budget - args.eval_reserve - time.perf_counter()
        if s.cfg.max_seconds <= 0 and not args.eval_only:
            raise ExperimentError(
                f"--time-budget {args.time_budget:g} s leaves no time to train after "
                f"{time.perf_counter() - started:.0f} s of setup and --eval-reserve {args.eval_reserve:g} s"
            )
    if args.eval_only:
        s.history = read_checkpoint(s.existing[-1])["progress"]["history"]
    else:
        s.history = train(s.model, s.train_data, s.val_data, s.cfg, resume=bool(s.existing))
    if s.size > 1:
        dist.barrier()
        dist.destroy_process_group()
        if s.rank > 0:
            return
    s.last = read_checkpoint(checkpoints(s.ckpt_dir)[-1])["progress"]
    # the setting that ended training, as train() reports it (and stores it with the last checkpoint)
    reason = s.history.get("stopped_by") or s.last.get("stopped_by") or "unknown"
    s.stopped_by = STOPPED_BY.get(reason, reason)
    print(f"training: {s.last['step']} updates, {s.last['epoch']} epochs, stopped by {s.stopped_by}", flush=True)


def average(s: State, args: RunConfig) -> None:
    """Average the last --average-last checkpoints (kept as averaged.pt) and measure the validation loss."""
    s.paths = checkpoints(s.ckpt_dir)[-args.average_last :]
    s.model.load_state_dict(average_checkpoints(s.paths))
    torch.save(
        {
            "model_config": dataclasses.asdict(s.config),
            "layers": args.layers,
            "direction": args.direction,
            "model": s.model.state_dict(),
        },
        s.ckpt_dir / ".averaged.pt.tmp",
    )
    os.replace(s.ckpt_dir / ".averaged.pt.tmp", s.ckpt_dir / "averaged.pt")
    loss_fn = LabelSmoothingLoss(s.config.eps_ls if args.train.eps_ls is None else args.train.eps_ls, s.config.pad_id)
    s.val = evaluate(s.model, s.val_data, loss_fn, s.device, s.precision)
    print(f"averaged {len(s.paths)} checkpoints: val loss {s.val['loss']:.3f}, val ppl {s.val['ppl']:.2f}", flush=True)


def decode_and_score(s: State, args: RunConfig) -> None:
    """Beam-search every chosen split, write its hypotheses, score them; then the run's checks on itself."""
    s.out.mkdir(parents=True, exist_ok=True)
    src_lang, tgt_lang = args.direction.split("-")
    tokenizer = s.encoded.tokenizer
    if "test2016" in args.splits:
        s.reference_check = check_reference_length()
        print(
            f"test 2016 German references, lowercased and Moses-tokenised: {s.reference_check['test2016_de_tokens']} "
            f"tokens ({'equals' if s.reference_check['ok'] else 'DIFFERS FROM'} Wu et al.'s {WU_REF_LEN})",
            flush=True,
        )
    for split in (x for x in SCORED if x in args.splits):
        start = time.perf_counter()
        pairs = data.load(split, src_lang, tgt_lang)
        sources = s.encoded.ids[split][src_lang]
        s.outputs[split] = translate_ids(s.model, sources, BEAM, ALPHA, args.decode_batch, args.max_output)
        hyps = [tokenizer.decode(h).replace("\n", " ") for h in s.outputs[split]]
        decode_s = time.perf_counter() - start
        _write_atomic(s.out / f"hyp.{split}.txt", "".join(h + "\n" for h in hyps))
        s.scores[split] = {
            "file": f"{data.SPLITS[split][0]}.{tgt_lang}",
            "sentences": len(pairs),
            "decode_s": decode_s,
            **score(hyps, [t for _, t in pairs], tgt_lang),
        }
        print(
            f"{split}: {s.scores[split]['sacrebleu']['text']}\n    tokenised, lowercased: "
            f"{s.scores[split]['tok_lc']['score']:.2f}  ({decode_s:.1f} s)",
            flush=True,
        )
    hypotheses = {split: [tokenizer.decode(h) for h in ids] for split, ids in s.outputs.items()}
    s.checks = run_checks(s.model, s.val_data, s.val, hypotheses)
    for warning in s.checks["warnings"]:
        print(f"WARNING: {warning}", file=sys.stderr, flush=True)


def curve(s: State, args: RunConfig, train_s: float) -> None:
    """After the run: val BLEU of every --curve'th checkpoint alone (and of the last), each at the training time when
    it was saved, beside the averaged model's at the end of training (curve.json); then only the last
    --average-last checkpoints stay."""
    src_lang, tgt_lang = args.direction.split("-")
    refs, paths, points = [t for _, t in data.load("val", src_lang, tgt_lang)], checkpoints(s.ckpt_dir), []
    start = time.perf_counter()
    for i, path in enumerate(paths):
        if (i + 1) % args.curve and path != paths[-1]:
            continue
        ckpt = read_checkpoint(path)
        s.model.load_state_dict(ckpt["model"])
        ids = translate_ids(s.model, s.encoded.ids["val"][src_lang], BEAM, ALPHA, args.decode_batch, args.max_output)
        bleu = score([s.encoded.tokenizer.decode(h) for h in ids], refs, tgt_lang)["tok_lc"]["score"]
        step = ckpt["progress"]["step"]
        points.append({"step": step, "train_s": path.stat().st_mtime - s.train_wall_start, "val_bleu": bleu})
        print(f"curve: update {step}, {points[-1]['train_s']:.0f} s of training, val BLEU {bleu:.2f}", flush=True)
    val_bleu = s.scores["val"]["tok_lc"]["score"] if "val" in s.scores else None
    averaged = {"step": s.last["step"], "train_s": train_s, "val_bleu": val_bleu}
    report = {"points": points, "averaged": averaged, "every": args.curve, "seconds": time.perf_counter() - start}
    _write_atomic(s.out / "curve.json", json.dumps(report, indent=1) + "\n")
    for path in paths[: -args.average_last]:
        path.unlink()


def write_outputs(s: State, args: RunConfig) -> None:
    """The attention maps of three short test sentences (the book's layers only) and the training history."""
    src_lang, tgt_lang = args.direction.split("-")
    if args.layers == "aiayn":  # PyTorch's layers do not hand out their weights the same way
        test = data.load("test2016", src_lang, tgt_lang)
        chosen = [i for i, p in enumerate(test) if 6 <= len(p[0].split()) <= 9][:3]  # three short sentences
        src_ids = [s.encoded.ids["test2016"][src_lang][i] for i in chosen]
        out_ids = (
            [s.outputs["test2016"][i] for i in chosen]
            if "test2016" in s.outputs
            else translate_ids(s.model, src_ids, BEAM, ALPHA, max_len=args.max_output)
        )
        tokenizer = s.encoded.tokenizer
        examples = [(x, o, test[i][0], tokenizer.decode(o), test[i][1]) for x, o, i in zip(src_ids, out_ids, chosen)]
        np.savez_compressed(s.out / "attention.npz", **attention_maps(s.model, tokenizer, examples))
    _write_atomic(s.out / "history.json", json.dumps(s.history, indent=1) + "\n")


def write_metrics(s: State, args: RunConfig, phases: dict) -> dict:
    """metrics.json, written last: the scores, the checks, the settings and the provenance."""
    src_lang, tgt_lang = args.direction.split("-")
    provenance_date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    trained = None if args.eval_only else (s.last.get("tokens", 0) - s.tokens_before) / phases["train"]
    metrics = {
        "direction": args.direction,
        "recipe": args.recipe,
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
        "layers": args.layers,
        "bleu": s.scores,
        "val": s.val,
        "parameters": count_parameters(s.model),
        "updates": s.last["step"],
        "epochs": s.last["epoch"],
        "stopped_by": s.stopped_by,
        "processes": s.size,
        "train_target_tokens_per_s": trained,
        "averaged_checkpoints": [p.name for p in s.paths],
        "decoding": {
            "beam_size": BEAM,
            "alpha": ALPHA,
            "batch": args.decode_batch,
            "max_output": "input length + 50" if args.max_output is None else args.max_output,
        },
        "reference_check": s.reference_check,
        "checks": s.checks,
        "warnings": s.checks["warnings"],
        "model_config": dataclasses.asdict(s.config),
        "train_config": dataclasses.asdict(s.cfg),
        "precision": s.precision,
        "data": {
            "bpe_size": args.bpe_size,
            "max_tokens": args.max_tokens,
            "pad_multiple": args.pad_multiple,
            "limit_train_batches": args.limit_train,
            "splits": args.splits,
            "encoded_cache": s.encoded.path.name,
        },
        "provenance": {**s.started_with, "date": provenance_date, "wall_s": phases, "time_budget_s": args.time_budget},
    }
    _write_atomic(s.out / "metrics.json", json.dumps(metrics, indent=1, ensure_ascii=False) + "\n")  # written last
    print(
        f"wrote {s.out}/metrics.json; {phases['total']:.0f} s in all"
        + (f"; {len(s.checks['warnings'])} WARNING(S) above: this run failed" if s.checks["warnings"] else ""),
        flush=True,
    )
    return metrics


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    """The command line; ``started`` is when the time budget began (default: now)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        run(args, argv, time.perf_counter() if started is None else started)
    except (ExperimentError, CheckpointError, corpus.CorpusError, data.DataError, FloatingPointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(started=T0))
