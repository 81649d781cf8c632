"""The settings of one run of ``python -m aiayn.experiment``, each declared once, and its command line made from them.

Not about the paper: the model's settings are ``aiayn.model.TransformerConfig`` (§3, chapter 7), the training's
``aiayn.training.TrainConfig`` (§5, chapter 10) and the book's named recipes ``aiayn.training.RECIPES`` (chapter 10).
``RunConfig`` nests a ``TrainConfig`` and adds what a run needs around it: the data, the folders, the time budget and
the decoding. ``parser`` makes one option per setting, the nested ones included, so a setting's default lives in one
place: RunConfig's own fields here, the training's in TrainConfig.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from dataclasses import dataclass, field

import torch

from aiayn.model import PRESETS, TransformerConfig
from aiayn.runs.provenance import cpu_features
from aiayn.training import MULTI30K_TRAIN, RECIPES, TrainConfig, choose_precision

TEST_SPLITS = ("test2016", "test2017", "mscoco2017", "test2018")
SCORED = ("val",) + TEST_SPLITS
LAYERS = ("aiayn", "torch")  # the book's layers, or PyTorch's nn.Transformer layers (the floor)
NATIVE_BF16 = ("amx", "avx512_bf16")  # CPU features with bf16 matrix instructions


class ExperimentError(RuntimeError):
    """A bad option or a checkpoint folder that does not fit the request; the message says what to do."""


def setting(default, help: str, **argparse_options):
    """A field of RunConfig: its one default, its help, and how the command line takes it."""
    factory = {"default_factory": lambda: list(default)} if isinstance(default, list) else {"default": default}
    return field(**factory, metadata={"help": help, **argparse_options})


# The fields of TrainConfig that the command line sets: their help and how argparse reads them (their defaults are
# TrainConfig's, or MULTI30K_TRAIN's). The others follow from the run: ckpt_dir, keep_last (--average-last) and
# max_seconds (--time-budget).
TRAIN_OPTIONS = {
    "epochs": ("epochs at most", {"type": int}),
    "max_updates": ("optimizer updates at most", {"type": int}),
    "warmup": ("warmup updates of Equation (3)", {"type": int}),
    "factor": ("multiplies Equation (3)", {"type": float}),
    "eps_ls": ("label smoothing (None: the model config's, 0.1)", {"type": float}),
    "accum": ("micro-batches per optimizer update", {"type": int}),
    "clip_norm": ("clip the gradient norm (None: no clipping)", {"type": float}),
    "save_every": ("also save every this many updates (else per epoch)", {"type": int}),
    "precision": (
        "auto: bf16 on GPUs with compute capability 8.0+, fp16 with loss scaling below; on a CPU bf16 where it has "
        "AMX or AVX-512 BF16, else fp32",
        {"choices": ("auto", "bf16", "fp16", "fp32")},
    ),
    "attention": (
        "Equation (1) in training: through the fused kernel, or written out as chapter 2 writes it",
        {"choices": ("fused", "written")},
    ),
    "adam": (
        "Adam's step: one fused kernel, or PyTorch's own choice (on a CPU, a loop over the parameters)",
        {"choices": ("fused", "loop")},
    ),
    "compile": ("torch.compile the model for training", {"action": "store_true"}),
    "progress": ("show a progress bar per epoch", {"action": "store_true"}),
    "seed": ("seed of the initialisation, the batches and dropout", {"type": int}),
}


def multi30k_training() -> TrainConfig:
    """The training a run has without a recipe: chapter 10's Multi30k schedule, no progress bar."""
    return TrainConfig(**MULTI30K_TRAIN, progress=False)


@dataclass
class RunConfig:
    """Every setting of one run of ``python -m aiayn.experiment``: its own fields, and the training's nested in
    ``train``. The command line is generated from both (``parser``), and so is the command line of a run that another
    program starts (``to_argv``)."""

    direction: str = setting(None, "translation direction", choices=("en-de", "de-en"), required=True)
    out: str = setting(None, "results folder (metrics, hypotheses, curves, attention; no checkpoints)", required=True)
    recipe: str | None = setting(
        None,
        "a named set of the settings below (aiayn.training.RECIPES: cpu, about 30 minutes on 2 CPU cores; cpu-fast, "
        "under 10; gpu, under 9 minutes on one GPU); options given here override it",
        choices=sorted(RECIPES),
    )
    ckpt_dir: str | None = setting(None, "scratch folder for checkpoints; default checkpoints/experiment/<out name>")
    preset: str = setting("multi30k", "model preset of aiayn.model: multi30k, base, big")
    set: list = setting(
        [],
        "TransformerConfig fields, e.g. N=6 (given twice, both count)",
        nargs="*",
        action="extend",
        metavar="FIELD=VALUE",
    )
    layers: str = setting("aiayn", "the book's layers, or PyTorch's nn.Transformer layers (the floor)", choices=LAYERS)
    bpe_size: int = setting(8000, "joint BPE vocabulary (sets vocab_size)", type=int)
    max_tokens: int = setting(8000, "token budget of one batch, per process", type=int)
    pad_multiple: int = setting(1, "round batch lengths up to a multiple (8 for --compile)", type=int)
    train: TrainConfig = field(default_factory=multi30k_training)  # its options: TRAIN_OPTIONS
    average_last: int = setting(10, "average this many of the last checkpoints", type=int)
    time_budget: float | None = setting(
        None, "seconds for the whole command; training stops when only --eval-reserve is left", type=float
    )
    eval_reserve: float = setting(90.0, "seconds kept for averaging, decoding, scoring", type=float)
    resume: bool = setting(False, "continue an interrupted run (a finished one says so)", action="store_true")
    eval_only: bool = setting(False, "skip training; evaluate the checkpoints there are", action="store_true")
    limit_train: int | None = setting(None, "use only N training batches per epoch (smoke tests)", type=int)
    curve: int | None = setting(
        None,
        "keep every checkpoint; after the run, beam-search val with every Nth (not averaged): val BLEU against "
        "training time, in curve.json (after the run, outside its time budget)",
        type=int,
    )
    decode_batch: int = setting(128, "sentences per beam-search batch", type=int)
    max_output: int | None = setting(
        None, "most output tokens per sentence (None: input length + 50, as in §6.1)", type=int
    )
    splits: list = setting(
        list(SCORED),
        "sets to decode and score (default all five; val alone for Table 3, none to only train)",
        nargs="*",
        choices=SCORED,
    )

    def flat(self) -> dict:
        """Every setting by its option's name, the training's among them (as the command line names them)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "train"}
        return out | {name: getattr(self.train, name) for name in TRAIN_OPTIONS}

    def replace(self, **changes) -> RunConfig:
        """A copy with settings changed, each by its option's name (a training setting goes into ``train``)."""
        new = copy.deepcopy(self)
        for name, value in changes.items():
            if name in TRAIN_OPTIONS:
                setattr(new.train, name, value)
            elif name in {f.name for f in dataclasses.fields(self)} - {"train"}:
                setattr(new, name, value)
            else:
                raise ExperimentError(f"no setting {name!r}: the settings are {', '.join(self.flat())}")
        return new


def options() -> list[tuple[str, dict]]:
    """(name, argparse options with help) of every setting, in RunConfig's order, the nested ones in place."""
    out = []
    for f in dataclasses.fields(RunConfig):
        if f.name == "train":
            out += [(name, {"help": help, **extra}) for name, (help, extra) in TRAIN_OPTIONS.items()]
        else:
            out.append((f.name, dict(f.metadata)))
    return out


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def parser() -> argparse.ArgumentParser:
    """The command line, generated from RunConfig: one option per setting, with its help and default. An option left
    out takes the recipe's value, else the default (so argparse itself keeps no defaults)."""
    p = argparse.ArgumentParser(
        prog="python -m aiayn.experiment",
        description="Train on Multi30k, average the last checkpoints, beam-search (K=4, α=0.6) and score val and the "
        "four test sets.",
        argument_default=argparse.SUPPRESS,
    )
    defaults = RunConfig().flat()
    for name, options_ in options():
        options_ = dict(options_)
        help = options_.pop("help")
        shown = "" if options_.get("required") or options_.get("action") else f" (default {defaults[name]})"
        p.add_argument(_option(name), help=help + shown, **options_)
    return p


def recipe_config(recipe: str | None) -> RunConfig:
    """The settings a run has before its command line: the defaults, with the recipe's over them."""
    chosen = {k: v for k, v in RECIPES.get(recipe, {}).items() if k != "set"}
    base = RunConfig(recipe=recipe).replace(**chosen)
    base.set = [f"{k}={v}" for k, v in RECIPES.get(recipe, {}).get("set", {}).items()]
    return base


def merge_set(pairs: list[str], changes: dict) -> list[str]:
    """--set FIELD=VALUE pairs with `changes` over them: a field that changes leaves `pairs` and comes last."""
    return [p for p in pairs if p.partition("=")[0] not in changes] + [f"{k}={v}" for k, v in changes.items()]


def parse_args(argv: list[str] | None = None) -> RunConfig:
    """The run's settings: those given, then the recipe's, then the defaults."""
    given = vars(parser().parse_args(argv))
    config = recipe_config(given.get("recipe"))
    recipe_set = config.set
    config = config.replace(**{k: v for k, v in given.items() if k != "set"})
    config.set = merge_set(recipe_set, dict(pair.partition("=")[::2] for pair in given.get("set", [])))
    return config


def to_argv(config: RunConfig) -> list[str]:
    """The command line of a run with these settings: each setting that differs from its recipe's or default
    value (``--set`` lists the model changes beyond the recipe's)."""
    base, argv = recipe_config(config.recipe).flat(), []
    for name, value in config.flat().items():
        before = base[name]
        if name == "recipe":
            before = None  # the recipe itself is named whenever there is one
        elif name == "set":
            value = [p for p in value if p not in before]
        if value == before or (name == "set" and not value):
            continue
        if isinstance(value, bool):
            argv.append(_option(name))  # a flag that is on
        elif isinstance(value, list):
            argv += [_option(name), *map(str, value)]
        else:
            argv += [_option(name), f"{value:g}" if isinstance(value, float) else str(value)]
    return argv


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


def make_config(args: RunConfig, vocab_size: int) -> TransformerConfig:
    """The model config of --preset with the --set changes and the tokenizer's vocabulary size, checked."""
    if args.preset not in PRESETS:
        raise ExperimentError(f"unknown --preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    try:
        return PRESETS[args.preset].replace(**model_overrides(args.set), vocab_size=vocab_size)
    except (TypeError, ValueError) as err:
        raise ExperimentError(f"--set {' '.join(args.set)}: {err}") from None


def check_options(args: RunConfig) -> None:
    """Every option that can be checked before any work, with what to do instead."""
    make_config(args, PRESETS.get(args.preset, PRESETS["multi30k"]).vocab_size)
    settings = args.flat()
    for name in ("average_last", "max_tokens", "pad_multiple", "epochs", "warmup", "accum", "decode_batch",
                 "max_output", "curve"):  # fmt: skip
        if settings[name] is not None and settings[name] < 1:
            raise ExperimentError(f"{_option(name)} must be at least 1, got {settings[name]}")
    if args.bpe_size <= 260:
        raise ExperimentError(f"--bpe-size must exceed the 260 special and byte tokens, got {args.bpe_size}")
    if args.train.factor <= 0:
        raise ExperimentError(f"--factor must be positive, got {args.train.factor:g}")
    if args.train.eps_ls is not None and not 0 <= args.train.eps_ls < 1:
        raise ExperimentError(f"--eps-ls must lie in [0, 1), got {args.train.eps_ls:g}")
    if args.resume and args.eval_only:
        raise ExperimentError("--resume continues training and --eval-only skips it: give one of them")
    if args.curve and (args.resume or args.eval_only):
        raise ExperimentError(
            "--curve times the checkpoints of one uninterrupted training: drop --resume or --eval-only"
        )
    try:
        choose_precision("cpu", args.train.precision)
    except ValueError as err:
        raise ExperimentError(str(err)) from None


def run_precision(device: torch.device, requested: str = "auto") -> str:
    """The precision a run trains in. "auto" is choose_precision's (bf16 or fp16 on a GPU, fp32 on a CPU), except on a
    CPU with bf16 matrix instructions (AMX, or AVX-512 BF16), where bf16 autocast trains the CPU recipe's model faster
    at the same validation loss (benchmarks/cpu_precision.py measured 1.24 times on a Xeon with AMX and 1.34 on an AMD
    EPYC with AVX-512 BF16; the recipe search of §6.1 compared the losses). CPUs with neither (Colab's free CPU is AVX2
    only) emulate bf16, slower than fp32."""
    if requested == "auto" and device.type == "cpu" and set(NATIVE_BF16) & set(cpu_features()):
        return "bf16"
    return choose_precision(device, requested)
