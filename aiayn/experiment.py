"""§6.1 in one command: train on Multi30k, average the last checkpoints, beam-search the test sets, score them.

    python -m aiayn.experiment --direction en-de --out runs/en-de --time-budget 540
    torchrun --nproc_per_node=8 -m aiayn.experiment --direction en-de --out runs/en-de   # one process per GPU

The sentences come from the encoded cache (aiayn.corpus), so a run imports no spaCy; only the lowercased
Moses-tokenised BLEU needs sacremoses.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # the run's clock starts before the heavy imports

import argparse
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
from sacrebleu.metrics import BLEU

from aiayn import bleu, corpus, data, health
from aiayn.batching import EpochBatches
from aiayn.decoding import average_checkpoints, translate_ids
from aiayn.floor import build
from aiayn.pretrained import attention_maps
from aiayn.model import PRESETS, TransformerConfig, count_parameters
from aiayn.provenance import ROOT, cpu_features, cpu_name, provenance
from aiayn.training import (
    MULTI30K_TRAIN,
    CheckpointError,
    LabelSmoothingLoss,
    TrainConfig,
    checkpoints,
    choose_precision,
    evaluate,
    read_checkpoint,
    train,
    world,
)

TEST_SPLITS = ("test2016", "test2017", "mscoco2017", "test2018")
SCORED = ("val",) + TEST_SPLITS
WU_REF_LEN = 12103  # test 2016 German references, lowercased and Moses-tokenised (Wu et al., 2021)
BEAM, ALPHA = 4, 0.6  # §6.1; the output limit, input length + 50, is aiayn.decoding's default
LAYERS = ("aiayn", "torch")  # the book's layers, or PyTorch's nn.Transformer layers (the floor)


class ExperimentError(RuntimeError):
    """A bad option or a checkpoint folder that does not fit the request; the message says what to do."""


def moses_tokenize(lines, lang: str) -> list[str]:
    """The literature's preprocessing: lowercase, then Moses-tokenise (sacremoses defaults) for ``lang``."""
    try:
        from sacremoses import MosesTokenizer
    except ImportError:
        raise ExperimentError("the lowercased Moses-tokenised BLEU needs sacremoses: pip install sacremoses") from None
    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line.lower(), return_str=True) for line in lines]


def score(hypotheses: list[str], references: list[str], lang: str) -> dict:
    """Cased sacreBLEU (13a) with its signature, and lowercased Moses-tokenised BLEU (tokenize="none")."""
    out = {}
    for name, metric, hyps, refs in (
        ("sacrebleu", BLEU(), hypotheses, references),
        (
            "tok_lc",
            BLEU(tokenize="none", force=True),
            moses_tokenize(hypotheses, lang),
            moses_tokenize(references, lang),
        ),
    ):
        s = metric.corpus_score(hyps, [refs])
        out[name] = {
            "score": s.score,
            "signature": str(metric.get_signature()),
            "precisions": s.precisions,
            "bp": s.bp,
            "sys_len": s.sys_len,
            "ref_len": s.ref_len,
            "text": str(s),
        }
    out["sacrebleu"]["aiayn_bleu"] = bleu.corpus_bleu(hypotheses, references).score  # the chapter's own BLEU
    return out


def check_reference_length() -> dict:
    """Tokens of the lowercased Moses-tokenised test 2016 German references; Wu et al. report 12,103."""
    refs = [de for _, de in data.load("test2016", "en", "de")]
    n = sum(len(line.split()) for line in moses_tokenize(refs, "de"))
    return {"test2016_de_tokens": n, "expected": WU_REF_LEN, "ok": n == WU_REF_LEN}


def run_checks(model, val_batches, val: dict, hypotheses: dict[str, list[str]]) -> dict:
    """The signs of a failed run (aiayn.health): how alike each split's outputs are, what the source is worth on
    validation, and the validation perplexity; ``warnings`` lists the ones that fail."""
    spread = {split: health.output_spread(hyps) for split, hyps in hypotheses.items()}
    gain = health.source_gain(model, val_batches)
    warnings = [w for split, s in spread.items() for w in health.warnings(spread=s, split=split)]
    warnings += health.warnings(gain=gain, val_ppl=val["ppl"])
    return {"outputs": spread, "source": gain, "warnings": warnings}


NATIVE_BF16 = ("amx", "avx512_bf16")  # CPU features with bf16 matrix instructions


def run_precision(device: torch.device, requested: str = "auto") -> str:
    """The precision a run trains in. "auto" is choose_precision's (bf16 or fp16 on a GPU, fp32 on a CPU), except on a
    CPU with bf16 matrix instructions (AMX, or AVX-512 BF16), where bf16 autocast trains the CPU recipe's model faster
    at the same validation loss (benchmarks/cpu_precision.py measured 1.24 times on a Xeon with AMX and 1.34 on an AMD
    EPYC with AVX-512 BF16; the recipe search of §6.1 compared the losses). CPUs with neither (Colab's free CPU is AVX2
    only) emulate bf16, slower than fp32."""
    if requested == "auto" and device.type == "cpu" and set(NATIVE_BF16) & set(cpu_features()):
        return "bf16"
    return choose_precision(device, requested)


def model_overrides(pairs: list[str]) -> dict:
    """--set FIELD=VALUE pairs as TransformerConfig fields (vocab_size comes from --bpe-size)."""
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in fields:
            raise ExperimentError(f"--set {pair!r}: expected FIELD=VALUE with FIELD one of {', '.join(sorted(fields))}")
        if key == "vocab_size":
            raise ExperimentError("--set vocab_size: the vocabulary size is the tokenizer's; change it with --bpe-size")
        try:
            out[key] = (
                {"True": True, "False": False, "None": None}[value]
                if value in ("True", "False", "None")
                else (float(value) if "." in value or "e" in value else int(value))
            )
        except ValueError:
            raise ExperimentError(f"--set {pair}: {value!r} is not a number, True, False or None") from None
    return out


STOPPED_BY = {
    "max_seconds": "time budget",
    "patience": "early stopping",
}  # train()'s reasons, as metrics.json words them
# Named recipes: model changes (set) and settings of RunConfig, chosen on validation BLEU (§6.1 results shows the
# searches). Options given on the command line override the recipe's.
RECIPES = {
    "cpu": {
        "set": {"N": 3, "d_ff": 512, "h": 8, "P_drop": 0.1},
        "bpe_size": 8000,
        "max_tokens": 4096,
        "epochs": 16,
        "warmup": 400,
        "factor": 0.64,
        "clip_norm": 1.0,
        "average_last": 5,
        "time_budget": 1800.0,
        "eval_reserve": 240.0,
    },
    # the CPU recipe's model with more dropout and twice the batch, trained for as long as one GPU call allows;
    # chosen on validation among 8 settings (results/gpu-search)
    "gpu": {
        "set": {"N": 3, "d_ff": 512, "h": 8, "P_drop": 0.2},
        "bpe_size": 8000,
        "max_tokens": 8192,
        "epochs": 500,
        "warmup": 400,
        "factor": 0.64,
        "clip_norm": 1.0,
        "average_last": 10,
        "time_budget": 520.0,
        "eval_reserve": 100.0,
    },
}


def setting(default, help: str, **argparse_options):
    """A field of RunConfig: its one default, its help, and how the command line takes it."""
    factory = {"default_factory": lambda: list(default)} if isinstance(default, list) else {"default": default}
    return field(**factory, metadata={"help": help, **argparse_options})


@dataclass
class RunConfig:
    """Every setting of one run of ``python -m aiayn.experiment``, declared once: its default and its help. The
    command line is generated from it (``parser``), and so is the command line of a run that another program starts
    (``to_argv``)."""

    direction: str = setting(None, "translation direction", choices=("en-de", "de-en"), required=True)
    out: str = setting(None, "results folder (metrics, hypotheses, curves, attention; no checkpoints)", required=True)
    recipe: str | None = setting(
        None,
        "a named set of the settings below (cpu: about 30 minutes on 2 CPU cores; gpu: under 9 minutes on one GPU); "
        "options given here override it",
        choices=sorted(RECIPES),
    )
    ckpt_dir: str | None = setting(None, "scratch folder for checkpoints; default checkpoints/experiment/<out name>")
    preset: str = setting("multi30k", "model preset of aiayn.model: multi30k, base, big")
    set: list = setting([], "TransformerConfig fields, e.g. N=6", nargs="*", metavar="FIELD=VALUE")
    layers: str = setting("aiayn", "the book's layers, or PyTorch's nn.Transformer layers (the floor)", choices=LAYERS)
    bpe_size: int = setting(8000, "joint BPE vocabulary (sets vocab_size)", type=int)
    max_tokens: int = setting(8000, "token budget of one batch, per process", type=int)
    pad_multiple: int = setting(1, "round batch lengths up to a multiple (8 for --compile)", type=int)
    epochs: int = setting(MULTI30K_TRAIN["epochs"], "epochs at most", type=int)
    max_updates: int | None = setting(None, "optimizer updates at most", type=int)
    warmup: int = setting(MULTI30K_TRAIN["warmup"], "warmup updates of Equation (3)", type=int)
    factor: float = setting(MULTI30K_TRAIN["factor"], "multiplies Equation (3)", type=float)
    eps_ls: float | None = setting(None, "label smoothing (None: the model config's, 0.1)", type=float)
    accum: int = setting(1, "micro-batches per optimizer update", type=int)
    clip_norm: float | None = setting(None, "clip the gradient norm (None: no clipping)", type=float)
    average_last: int = setting(10, "average this many of the last checkpoints", type=int)
    save_every: int | None = setting(None, "also save every this many updates (else per epoch)", type=int)
    time_budget: float | None = setting(
        None, "seconds for the whole command; training stops when only --eval-reserve is left", type=float
    )
    eval_reserve: float = setting(90.0, "seconds kept for averaging, decoding, scoring", type=float)
    resume: bool = setting(False, "continue an interrupted run (a finished one says so)", action="store_true")
    eval_only: bool = setting(False, "skip training; evaluate the checkpoints there are", action="store_true")
    limit_train: int | None = setting(None, "use only N training batches per epoch (smoke tests)", type=int)
    decode_batch: int = setting(128, "sentences per beam-search batch", type=int)
    max_output: int | None = setting(
        None, "most output tokens per sentence (None: input length + 50, as in §6.1)", type=int
    )
    precision: str = setting(
        "auto",
        "auto: bf16 on GPUs with compute capability 8.0+, fp16 with loss scaling below; on a CPU bf16 where it has "
        "AMX or AVX-512 BF16, else fp32",
        choices=("auto", "bf16", "fp16", "fp32"),
    )
    compile: bool = setting(False, "torch.compile the model for training", action="store_true")
    progress: bool = setting(False, "show a progress bar per epoch", action="store_true")
    seed: int = setting(0, "seed of the initialisation, the batches and dropout", type=int)
    splits: list = setting(
        list(SCORED),
        "sets to decode and score (default all five; val alone for Table 3, none to only train)",
        nargs="*",
        choices=SCORED,
    )


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def parser() -> argparse.ArgumentParser:
    """The command line, generated from RunConfig: one option per field, with its help and default. An option left
    out takes the recipe's value, else the field's default (so argparse itself keeps no defaults)."""
    p = argparse.ArgumentParser(
        prog="python -m aiayn.experiment",
        description="Train on Multi30k, average the last checkpoints, beam-search (K=4, α=0.6) and score val and the "
        "four test sets.",
        argument_default=argparse.SUPPRESS,
    )
    for f in dataclasses.fields(RunConfig):
        options = {k: v for k, v in f.metadata.items() if k != "help"}
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        shown = "" if options.get("required") or options.get("action") else f" (default {default})"
        p.add_argument(_option(f.name), help=f.metadata["help"] + shown, **options)
    return p


def recipe_config(recipe: str | None) -> RunConfig:
    """The settings a run has before its command line: the defaults, with the recipe's over them."""
    chosen = {k: v for k, v in RECIPES.get(recipe, {}).items() if k != "set"}
    base = RunConfig(**chosen, recipe=recipe)
    base.set = [f"{k}={v}" for k, v in RECIPES.get(recipe, {}).get("set", {}).items()]
    return base


def merge_set(pairs: list[str], changes: dict) -> list[str]:
    """--set FIELD=VALUE pairs with `changes` over them: a field that changes leaves `pairs` and comes last."""
    return [p for p in pairs if p.partition("=")[0] not in changes] + [f"{k}={v}" for k, v in changes.items()]


def parse_args(argv: list[str] | None = None) -> RunConfig:
    """The run's settings: those given, then the recipe's, then RunConfig's defaults."""
    given = vars(parser().parse_args(argv))
    config = recipe_config(given.get("recipe"))
    recipe_set = config.set
    for name, value in given.items():
        setattr(config, name, value)
    config.set = merge_set(recipe_set, dict(pair.partition("=")[::2] for pair in given.get("set", [])))
    return config


def to_argv(config: RunConfig) -> list[str]:
    """The command line of a run with these settings: each setting that differs from its recipe's or default
    value (``--set`` lists the model changes beyond the recipe's)."""
    base, argv = recipe_config(config.recipe), []
    for f in dataclasses.fields(RunConfig):
        value, before = getattr(config, f.name), getattr(base, f.name)
        if f.name == "recipe":
            before = None  # the recipe itself is named whenever there is one
        elif f.name == "set":
            value = [p for p in value if p not in before]
        if value == before or (f.name == "set" and not value):
            continue
        if isinstance(value, bool):
            argv.append(_option(f.name))  # a flag that is on
        elif isinstance(value, list):
            argv += [_option(f.name), *map(str, value)]
        else:
            argv += [_option(f.name), f"{value:g}" if isinstance(value, float) else str(value)]
    return argv


def make_config(args: RunConfig, vocab_size: int) -> TransformerConfig:
    """The model config of --preset with the --set changes and the tokenizer's vocabulary size, checked."""
    if args.preset not in PRESETS:
        raise ExperimentError(f"unknown --preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    try:
        return PRESETS[args.preset].replace(**model_overrides(args.set), vocab_size=vocab_size)
    except (TypeError, ValueError) as err:
        raise ExperimentError(f"--set {' '.join(args.set)}: {err}") from None


def _check_options(args: RunConfig) -> None:
    """Every option that can be checked before any work, with what to do instead."""
    make_config(args, PRESETS.get(args.preset, PRESETS["multi30k"]).vocab_size)
    for name in (
        "average_last",
        "max_tokens",
        "pad_multiple",
        "epochs",
        "warmup",
        "accum",
        "decode_batch",
        "max_output",
    ):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ExperimentError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.bpe_size <= 260:
        raise ExperimentError(f"--bpe-size must exceed the 260 special and byte tokens, got {args.bpe_size}")
    if args.factor <= 0:
        raise ExperimentError(f"--factor must be positive, got {args.factor:g}")
    if args.eps_ls is not None and not 0 <= args.eps_ls < 1:
        raise ExperimentError(f"--eps-ls must lie in [0, 1), got {args.eps_ls:g}")
    if args.resume and args.eval_only:
        raise ExperimentError("--resume continues training and --eval-only skips it: give one of them")
    try:
        choose_precision("cpu", args.precision)
    except ValueError as err:
        raise ExperimentError(str(err)) from None


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


def run(args: RunConfig, argv: list[str], started: float) -> dict | None:
    """Train (unless --eval-only), average, decode and score; write everything to args.out and return the metrics.

    Under torchrun every process trains; process 0 alone evaluates and writes, the others return None.
    """
    phases, tick = {}, time.perf_counter()
    _check_options(args)
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
    return write_metrics(state, args, phases)


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
    s.train_data = EpochBatches(s.encoded.pairs("train", args.direction), seed=args.seed, **batches)
    s.val_data = EpochBatches(s.encoded.pairs("val", args.direction), shuffle=False, **batches)(0)
    if args.limit_train:
        s.train_data = (lambda full, n: lambda epoch: full(epoch)[:n])(s.train_data, args.limit_train)
    s.config = make_config(args, len(s.encoded.tokenizer))
    if existing:
        _check_continued(existing[-1], s.config, args.layers)
        s.tokens_before = read_checkpoint(existing[-1])["progress"].get("tokens", 0)
    torch.manual_seed(args.seed)
    s.model = build(s.config, args.layers).to(device)
    s.precision = run_precision(device, args.precision)
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
            f"{s.precision} ({'chosen by --precision' if args.precision != 'auto' else 'auto'})",
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
    s.cfg = TrainConfig(
        warmup=args.warmup,
        factor=args.factor,
        accum=args.accum,
        epochs=args.epochs,
        max_updates=args.max_updates,
        eps_ls=args.eps_ls,
        clip_norm=args.clip_norm,
        ckpt_dir=str(s.ckpt_dir),
        keep_last=max(args.average_last, 2),
        save_every=args.save_every,
        precision=s.precision,
        compile=args.compile,
        seed=args.seed,
        progress=args.progress,
    )
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
    loss_fn = LabelSmoothingLoss(s.config.eps_ls if args.eps_ls is None else args.eps_ls, s.config.pad_id)
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
