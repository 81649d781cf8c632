# Generated from book/10_training.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/10_training.ipynb: §5.2–5.4 Optimizer, schedule, regularization and t...
"""§5.2–5.4: the paper's optimizer and learning-rate schedule, label
smoothing, and one training loop."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from aiayn.model import TransformerConfig
from aiayn.multi_head import MultiHeadAttention


# book/10_training.ipynb: §5.3 The learning-rate schedule
def rate(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """§5.3, Equation (3), for step >= 1:
    factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)."""
    if step < 1:
        raise ValueError(f"step counts optimizer updates from 1, got {step}")
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


# book/10_training.ipynb: Post-LN and the learning rate at small batches
# The book's named recipes (python -m aiayn.experiment --recipe NAME): short
# sets of overrides of the run's settings; "set" changes the multi30k model.
# Beside each value, the measurement that chose it (results/, §6.1, §5.3).
RECIPES = {
    "cpu": {  # about 30 minutes on 2 CPU cores
        # the tutorial anchor's size and dropout; Table 3's rows on the CPU
        # measure them since (results/cpu-variations, §6.2)
        "set": {"N": 3, "d_ff": 512, "h": 8, "P_drop": 0.1},
        "bpe_size": 8000,  # set, not searched
        "max_tokens": 4096,  # results/cpu-variations, R-tokens rows (§5.3)
        "epochs": 16,  # the time budget ends training first
        "warmup": 400,  # results/cpu-variations, R-warmup rows (§5.3)
        "factor": 0.64,  # results/cpu-search, the best peak (§6.1)
        "clip_norm": 1.0,  # a guard against one bad update; not searched
        "average_last": 5,  # set, not searched
        "time_budget": 1800.0,  # half an hour, the CPU budget
        "eval_reserve": 240.0,  # decoding and scoring the five splits
    },
    # ten minutes on 2 CPU cores for the whole command, test 2016 and val
    # scored; each change measured on validation in results/cpu-fast-search
    # (§6.1), where the CPU recipe with a higher peak failed its checks
    "cpu-fast": {
        # two layers and no dropout: ahead of three layers, and of dropout
        # 0.1, in ten minutes (Table 3's rows C and D say so at short budgets)
        "set": {"N": 2, "d_ff": 512, "h": 8, "P_drop": 0.0},
        # a little ahead of 8,000, within the spread of seeds: a smaller
        # softmax, so more updates in the same time
        "bpe_size": 4000,
        # level with 4,096 in ten minutes, within the spread of seeds in
        # results/cpu-variations; the search's later runs kept it
        "max_tokens": 2048,
        # Equation (1) written out: more updates in the same time on a CPU
        # (benchmarks/cpu_levers.py --recipe cpu-fast, §6.1), the same model
        "attention": "written",
        # Adam's loop, not its fused kernel: more updates in the same time on
        # a CPU (benchmarks/cpu_levers.py --recipe cpu-fast), the same updates
        "adam": "loop",
        "epochs": 16,  # the time budget ends training first
        "warmup": 400,  # the CPU recipe's schedule
        "factor": 0.64,
        "clip_norm": 1.0,
        "average_last": 5,
        "save_every": 100,  # checkpoints to average in a short run
        "time_budget": 600.0,
        # averaging, decoding and scoring used under half of the 80 s once
        # kept; 50 gave the rest to training (results/cpu-fast-search,
        # reserve50: ahead on validation)
        "eval_reserve": 50.0,
        "splits": ["val", "test2016"],
    },
    # the CPU recipe's model with more dropout and twice the batch, trained
    # for as long as one GPU call allows: ahead of 8 settings on validation
    # (results/gpu-search, §6.1)
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


# book/10_training.ipynb: The optimizer, and one schedule step per update
def make_optimizer(
    model: nn.Module,
    d_model: int,
    warmup: int,
    factor: float = 1.0,
    fused: bool | None = None,
):
    """§5.3: Adam(β1=0.9, β2=0.98, ε=1e-9) and a LambdaLR whose n-th
    optimizer update uses lr = rate(n)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(
        params, lr=1.0, betas=(0.9, 0.98), eps=1e-9, fused=fused
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: rate(s + 1, d_model, warmup, factor)
    )
    return optimizer, scheduler


# book/10_training.ipynb: §5.4 Label smoothing
class LabelSmoothingLoss(nn.Module):
    """§5.4: cross-entropy against a smoothed target: 1 - eps_ls on the true
    token, eps_ls spread evenly over the V - 2 tokens that are neither the
    true token nor padding. Padding positions are ignored."""

    def __init__(self, eps_ls: float = 0.1, pad_id: int = 0):
        super().__init__()
        if not 0.0 <= eps_ls < 1.0:
            raise ValueError(f"eps_ls must lie in [0, 1), got {eps_ls!r}")
        self.eps_ls, self.pad_id = eps_ls, pad_id

    def target_distribution(
        self, target: torch.Tensor, V: int
    ) -> torch.Tensor:
        """The smoothed distribution q (…, V) for token ids target (…); rows
        of padding are all zero."""
        q = torch.full(
            (*target.shape, V), self.eps_ls / (V - 2), device=target.device
        )
        q[..., self.pad_id] = 0.0
        q.scatter_(-1, target.unsqueeze(-1), 1.0 - self.eps_ls)
        return q * (target != self.pad_id).unsqueeze(-1)

    def forward(
        self, logits: torch.Tensor, target: torch.Tensor
    ) -> torch.Tensor:
        """Summed loss -Σ q log p over non-pad positions:
        logits (…, V), target (…) -> a scalar."""
        # finite for finite logits: no log 0
        logp = F.log_softmax(logits.float(), dim=-1)
        keep = target != self.pad_id
        # -log p(true token)
        nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        # -Σ log p over the V - 2 other tokens
        spread = -(logp.sum(-1) - logp[..., self.pad_id] - (-nll))
        V = logits.size(-1)
        loss = (1.0 - self.eps_ls) * nll + self.eps_ls / (V - 2) * spread
        return loss.masked_fill(~keep, 0.0).sum()


# book/10_training.ipynb: Comparison with `F.cross_entropy(label_smoothing=....
def token_nll(
    logits: torch.Tensor, target: torch.Tensor, pad_id: int = 0
) -> torch.Tensor:
    """Summed negative log-likelihood of the true tokens (no smoothing):
    what perplexity is made of."""
    return F.cross_entropy(
        logits.float().flatten(0, -2),
        target.flatten(),
        ignore_index=pad_id,
        reduction="sum",
    )


# book/10_training.ipynb: The training loop
@dataclass
class TrainConfig:
    """Settings of a training run (§5.2–5.4). Batches come from the caller;
    these govern everything else."""

    warmup: int = 4000  # §5.3 warmup_steps
    # multiplies Equation (3); small data likes a larger peak (see §5.3)
    factor: float = 1.0
    accum: int = 1  # micro-batches per optimizer update (accumulation)
    epochs: int = 1
    max_updates: int | None = None
    max_seconds: float | None = None  # stop (and save) after this wall time
    eps_ls: float | None = None  # None: the model config's eps_ls
    clip_norm: float | None = None
    ckpt_dir: str | None = None
    keep_last: int = 5  # checkpoints kept in ckpt_dir
    save_every: int | None = None  # also every this many updates (and epoch)
    patience: int | None = None  # epochs without a better validation loss
    precision: str = "auto"  # "auto", "bf16", "fp16", "fp32": see below
    # Equation (1) through the fused kernel, or "written" out (chapter 2)
    attention: str = "fused"
    # Adam's step: one fused kernel, or PyTorch's own choice (on a CPU, a
    # loop over the parameters)
    adam: str = "fused"
    compile: bool = False  # torch.compile the model for training
    log_every: int = 50  # updates between two reads of the loss
    seed: int = 0
    progress: bool = True
    log: bool = True  # one line per epoch


# book/10_training.ipynb: Checkpoints that resume exactly
def rng_state() -> dict:
    """Every random generator the loop touches: Python, torch CPU and (if
    present) CUDA."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# book/10_training.ipynb: Checkpoints that resume exactly
FORMAT = "aiayn-train-1"


class CheckpointError(RuntimeError):
    """A checkpoint is unreadable, not ours, or made for a different model;
    the message says what to do."""


def save_checkpoint(path: str | Path, state: dict) -> Path:
    """Write atomically: to a temporary file in the same folder, then
    os.replace (never a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save({"format": FORMAT, **state}, tmp)
    os.replace(tmp, path)
    return path


def checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """The run's checkpoints, oldest first (names carry the update number)."""
    return sorted(Path(ckpt_dir).glob("step_*.pt"))


def read_checkpoint(
    path: str | Path, config: TransformerConfig | None = None
) -> dict:
    """Load a checkpoint, checking it is whole, ours and (if config is given)
    for the same model."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise CheckpointError(
            f"no checkpoint at {path}; check the path, or list {path.parent} "
            "for the ones written"
        )
    except Exception as err:
        raise CheckpointError(
            f"{path} is corrupt or truncated ({type(err).__name__}: {err}); "
            f"delete it and resume from an earlier checkpoint in "
            f"{path.parent}, or start afresh"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"{path} is not a training checkpoint of this book (format "
            f"{FORMAT!r} expected); load plain weights with "
            "model.load_state_dict instead"
        )
    if config is not None:
        saved = state["model_config"]
        diff = {
            k: (saved.get(k), v)
            for k, v in dataclasses.asdict(config).items()
            if saved.get(k) != v
        }
        if diff:
            told = ", ".join(
                f"{k}={a!r} there but {b!r} here" for k, (a, b) in diff.items()
            )
            raise CheckpointError(
                f"{path} was written for a different model: {told}. Build "
                "the model with the checkpoint's config "
                "(make_model(TransformerConfig(**ckpt['model_config']))) or "
                "train into a fresh checkpoint folder"
            )
    return state


# book/10_training.ipynb: Precision: what the hardware offers
AMP_DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}


def choose_precision(
    device, precision: str = "auto", capability: tuple[int, int] | None = None
) -> str:
    """The autocast precision for a device: "bf16" on GPUs of compute
    capability 8.0 and up, "fp16" (with loss scaling) on older GPUs, "fp32"
    on the CPU.

    A precision other than "auto" is checked and kept. ``capability``
    defaults to the device's own.
    """
    if precision not in ("auto", *AMP_DTYPES):
        raise ValueError(
            "precision must be 'auto', 'bf16', 'fp16' or 'fp32', "
            f"got {precision!r}"
        )
    device = torch.device(device)
    if precision != "auto":
        return precision
    if device.type != "cuda":
        return "fp32"
    capability = capability or torch.cuda.get_device_capability(device)
    return "bf16" if tuple(capability) >= (8, 0) else "fp16"


def make_scaler(precision: str, device) -> torch.amp.GradScaler:
    """A gradient scaler that never applies a non-finite gradient: the update
    is skipped and the scale halved.

    fp16 starts at a scale of 2^16 and doubles it after 2000 clean updates;
    bf16 and fp32 need no scaling and keep the scale at 1, so a scale below 1
    always means that gradients were not finite even unscaled.
    """
    fp16 = precision == "fp16"
    return torch.amp.GradScaler(
        torch.device(device).type,
        init_scale=2.0**16 if fp16 else 1.0,
        growth_interval=2000 if fp16 else 2**31 - 1,
    )


# book/10_training.ipynb: Several GPUs
def world() -> tuple[int, int]:
    """(rank, world size): (0, 1) unless torch.distributed has been
    initialised (torchrun)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# book/10_training.ipynb: Several GPUs
Batches = (
    Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    | Callable[[int], Iterable]
)


def _epoch_batches(batches: Batches, epoch: int, rank: int, size: int) -> list:
    """This rank's micro-batches of an epoch: batches may be a list, or a
    function epoch -> batches."""
    items = list(batches(epoch) if callable(batches) else batches)
    if len(items) < size:
        raise ValueError(
            f"epoch {epoch + 1} has {len(items)} batches"
            + (f" for {size} processes" if size > 1 else "")
            + "; the loop needs at least one per process. Check that the "
            "data is not empty and that max_tokens is not larger than the "
            "whole data set"
        )
    # every rank takes the same number of steps
    items = items[: len(items) - len(items) % size]
    return items[rank::size]


def target_tokens(batch, pad_id: int) -> int:
    """A batch's target tokens: known in advance (aiayn.batching.Batch), or
    counted from its tensor on the CPU."""
    tokens = getattr(batch, "tokens", None)
    return int((batch[2] != pad_id).sum()) if tokens is None else tokens


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Batches,
    loss_fn: LabelSmoothingLoss,
    device=None,
    precision: str = "auto",
) -> dict:
    """Validation: label-smoothed loss and perplexity exp(NLL) per target
    token (one host synchronisation)."""
    model.eval()
    device = torch.device(device or next(model.parameters()).device)
    precision = choose_precision(device, precision)
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    for src, tgt_in, tgt_out in batches(0) if callable(batches) else batches:
        src, tgt_in, tgt_out = (
            t.to(device, non_blocking=True) for t in (src, tgt_in, tgt_out)
        )
        with torch.autocast(
            device.type, AMP_DTYPES[precision], enabled=precision != "fp32"
        ):
            logits = model(src, tgt_in)
        totals += torch.stack(
            [
                loss_fn(logits, tgt_out),
                token_nll(logits, tgt_out, loss_fn.pad_id),
                (tgt_out != loss_fn.pad_id).sum(),
            ]
        ).double()
    loss, nll, tokens = totals.tolist()
    if not tokens:
        raise ValueError("the validation batches hold no target tokens")
    return {
        "loss": loss / tokens,
        "nll": nll / tokens,
        "ppl": math.exp(min(nll / tokens, 700.0)),
    }


# book/10_training.ipynb: The loop
def train(
    model: nn.Module,
    train_batches: Batches,
    val_batches: Batches | None = None,
    cfg: TrainConfig | None = None,
    resume: bool | str | Path = False,
) -> dict:
    """Train in place (§5.2–5.4) on (src, tgt_in, tgt_out) batches. Returns
    the run's history, and in it ``stopped_by``: the setting that ended the
    run ("epochs", "max_updates", "max_seconds" or "patience").

    resume=True continues from the newest checkpoint in cfg.ckpt_dir (if
    any); a path continues from that file.
    """
    cfg = cfg or TrainConfig()
    run = Run(model, cfg, resume)  # optimizer, schedule, loss, checkpoint
    while not run.stopped_by:
        micro, updates = run.epoch(train_batches)
        for i in updates:  # one update per `accum` micro-batches
            group = micro[i : i + cfg.accum]
            tokens = run.target_tokens(group)  # of the whole update
            total = torch.zeros((), device=run.device)
            for j, batch in enumerate(group):
                src, tgt_in, tgt_out = (t.to(run.device, non_blocking=True)
                                        for t in batch)
                with run.sync(last=j == len(group) - 1):
                    with run.autocast():
                        logits = run.net(src, tgt_in)  # (batch, T, vocab)
                    loss = run.loss_fn(logits, tgt_out)  # §5.4, summed
                    # per target token of the update (DDP averages over
                    # processes; `* size` undoes that)
                    run.scaler.scale(loss * run.size / tokens).backward()
                total += loss.detach()
            if cfg.clip_norm:
                run.scaler.unscale_(run.optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            lr = run.scheduler.get_last_lr()[0]
            run.scaler.step(run.optimizer)  # skipped if a grad is not finite
            run.scaler.update()
            run.scheduler.step()  # §5.3: once per optimizer update
            run.optimizer.zero_grad(set_to_none=True)
            if run.updated(total, tokens, lr, next_batch=i + len(group)):
                break  # a limit ends the run
        run.end_epoch(val_batches)  # validation, early stopping, checkpoint
    return {**run.history, "stopped_by": run.stopped_by}


# book/10_training.ipynb: The loop
@dataclass
class Progress:
    """Where a run stands, as each checkpoint stores it: the epoch and the
    next batch in it, optimizer updates and target tokens so far, the best
    validation loss and the epochs since, why it stopped, and the history
    (per update: step, loss, lr, epoch; per epoch: val_loss, val_ppl)."""

    epoch: int = 0
    batch: int = 0
    step: int = 0
    tokens: float = 0.0
    best: float = math.inf
    bad_epochs: int = 0
    early_stopped: bool = False
    stopped_by: str | None = None
    history: dict = dataclasses.field(default_factory=lambda: {
        "step": [], "loss": [], "lr": [], "epoch": [], "val_loss": [],
        "val_ppl": []})


def _finite(model: nn.Module) -> bool:
    finite = [p.detach().isfinite().all() for p in model.parameters()]
    return bool(torch.stack(finite).all())


def _save(ckpt_dir, model, optimizer, scheduler, scaler, progress: Progress,
          cfg: TrainConfig) -> None:
    """Every rank hands in its RNG state; rank 0 writes the checkpoint and
    keeps the last cfg.keep_last."""
    rank, size = world()
    if not _finite(model):
        raise FloatingPointError(
            f"the weights are not finite at update {progress.step}; "
            f"nothing was saved, and the checkpoints in {ckpt_dir} still "
            "hold finite weights"
        )
    rngs = [rng_state()]
    if size > 1:
        rngs = [None] * size
        dist.all_gather_object(rngs, rng_state())
    if rank == 0:
        save_checkpoint(
            Path(ckpt_dir) / f"step_{progress.step:08d}.pt",
            {
                "model_config": dataclasses.asdict(model.config),
                "train_config": dataclasses.asdict(cfg),
                "model_class": type(model).__name__,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(),
                "rng": rngs,
                "progress": dataclasses.asdict(progress),
            },
        )
        for old in checkpoints(ckpt_dir)[: -cfg.keep_last]:
            old.unlink()
    if size > 1:
        dist.barrier()


def _nonfinite(since: int, step: int, epoch: int,
               ckpt_dir) -> FloatingPointError:
    found = checkpoints(ckpt_dir) if ckpt_dir else []
    if found:
        where = (f"resume from {found[-1]}, the newest checkpoint, whose "
                 "weights are finite")
    elif ckpt_dir:
        where = "start again"
    else:
        where = ("start again (with cfg.ckpt_dir set, a run can resume from "
                 "its last checkpoint)")
    return FloatingPointError(
        f"a gradient was not finite between updates {since + 1} and {step} "
        f"(epoch {epoch + 1}); that update was skipped, so no weights or "
        "checkpoint hold it. Lower the learning-rate factor, lengthen the "
        f"warmup or set clip_norm, then {where}"
    )


def _eta(left: float) -> str:
    """Seconds left, as a watcher reads them."""
    return (f"{left / 60:.0f} min left" if left >= 90 else
            f"{max(left, 0):.0f} s left")


class Run:
    """One training run: the optimizer, schedule, loss and gradient scaler;
    the progress a checkpoint stores; the losses not yet read back from the
    device; the clock; and ``stopped_by``, the setting that ended the run
    ("epochs", "max_updates", "max_seconds" or "patience"; None while it
    goes on)."""

    def __init__(self, model: nn.Module, cfg: TrainConfig,
                 resume: bool | str | Path = False):
        if resume is True and not cfg.ckpt_dir:
            raise ValueError(
                "resume=True continues from the newest checkpoint in "
                "cfg.ckpt_dir, but cfg.ckpt_dir is not set: set it to the "
                "run's checkpoint folder, or pass a checkpoint's path as "
                "resume=")
        self.model, self.cfg = model, cfg
        self.rank, self.size = world()
        self.device = next(model.parameters()).device
        self.precision = choose_precision(self.device, cfg.precision)
        c = model.config
        eps_ls = c.eps_ls if cfg.eps_ls is None else cfg.eps_ls
        self.loss_fn = LabelSmoothingLoss(eps_ls, c.pad_id)
        if cfg.attention not in ("fused", "written"):
            raise ValueError(f"attention={cfg.attention!r}: choose 'fused' "
                             "or 'written'")
        if cfg.adam not in ("fused", "loop"):
            raise ValueError(f"adam={cfg.adam!r}: choose 'fused' or 'loop'")
        fused = self.device.type in ("cpu", "cuda") and cfg.adam == "fused"
        self.optimizer, self.scheduler = make_optimizer(  # fused: one kernel
            model, c.d_model, cfg.warmup, cfg.factor, fused=fused or None)
        self.scaler = make_scaler(self.precision, self.device)
        for layer in model.modules():
            if isinstance(layer, MultiHeadAttention):
                layer.fused = cfg.attention == "fused"
        random.seed(cfg.seed + self.rank)
        torch.manual_seed(cfg.seed + self.rank)  # ranks draw different masks
        self.progress = Progress()
        if resume:
            self.restore(resume)
        self.history = self.progress.history
        self.ddp = (nn.parallel.DistributedDataParallel(model)
                    if self.size > 1 else model)
        # the model that steps: wrapped for several processes, compiled
        self.net = torch.compile(self.ddp) if cfg.compile else self.ddp
        if cfg.compile:  # and the loss: passes over the whole (batch, T, V)
            self.loss_fn = torch.compile(self.loss_fn)
        # losses of updates not yet read back; the last update checked
        self.pending, self.checked = [], self.progress.step
        self.started = time.perf_counter()
        p = self.progress
        self.stopped_by = ("patience" if p.early_stopped else
                           "epochs" if p.epoch >= cfg.epochs else
                           self.limit())
        if (resume and self.stopped_by in ("patience", "epochs", "max_updates")
                and cfg.log and self.rank == 0):
            print(f"the run is finished ({p.step} updates, {p.epoch} "
                  "epochs): nothing to train")

    def restore(self, resume: bool | str | Path) -> None:
        """Weights, optimizer, schedule, scaler, random states and progress
        from the newest checkpoint in cfg.ckpt_dir, or from a file."""
        path = ((checkpoints(self.cfg.ckpt_dir) or [None])[-1]
                if isinstance(resume, bool) else Path(resume))
        if path is None:
            return
        ckpt = read_checkpoint(path, self.model.config)
        self.model.load_state_dict(ckpt["model"])
        for name in ("optimizer", "scheduler", "scaler"):
            getattr(self, name).load_state_dict(ckpt[name])
        rngs = ckpt["rng"]
        set_rng_state(rngs[self.rank] if len(rngs) == self.size else rngs[0])
        self.progress = Progress(**ckpt["progress"])

    def epoch(self, train_batches: Batches) -> tuple[list, Iterable[int]]:
        """This process's micro-batches of the epoch, and the index of each
        update's first micro-batch (from where an interrupted epoch
        stopped), with a progress bar."""
        p = self.progress
        micro = _epoch_batches(train_batches, p.epoch, self.rank,
                               self.size)
        self.model.train()
        self.t0, self.seen = time.perf_counter(), 0
        self.bar = tqdm(range(p.batch, len(micro), self.cfg.accum),
                        desc=f"epoch {p.epoch + 1}", mininterval=1.0,
                        disable=not self.cfg.progress or self.rank > 0,
                        file=sys.stdout)
        return micro, self.bar

    def target_tokens(self, group: list) -> float:
        """The target tokens of one update, over every process, counted on
        the CPU (no wait for the device)."""
        tokens = float(sum(target_tokens(b, self.model.config.pad_id)
                           for b in group))
        if self.size > 1:
            tokens = torch.tensor(tokens)
            dist.all_reduce(tokens)
            tokens = tokens.item()
        return tokens

    def sync(self, last: bool):
        """DDP all-reduces the gradients once per update: on its last
        micro-batch."""
        return (self.ddp.no_sync() if self.size > 1 and not last
                else contextlib.nullcontext())

    def autocast(self):
        """The forward pass in the run's precision."""
        return torch.autocast(self.device.type, AMP_DTYPES[self.precision],
                              enabled=self.precision != "fp32")

    def updated(self, total: torch.Tensor, tokens: float, lr: float,
                next_batch: int) -> bool:
        """Book one update: progress and history (the loss stays on the
        device until the next read), a checkpoint every cfg.save_every
        updates. True when a limit ends the run."""
        if self.size > 1:
            dist.all_reduce(total)
        p, h, cfg = self.progress, self.history, self.cfg
        self.pending.append(total / tokens)
        p.step += 1
        p.batch = next_batch
        p.tokens += tokens
        self.seen += tokens
        h["step"].append(p.step)
        h["lr"].append(lr)
        h["epoch"].append(p.epoch + 1)
        if p.step % cfg.log_every == 0:
            self.read()
            tok_s = self.seen / (time.perf_counter() - self.t0)
            self.bar.set_postfix(loss=f"{h['loss'][-1]:.3f}",
                                 tok_s=f"{tok_s:.0f}", lr=f"{lr:.2e}",
                                 refresh=False)
        self.stopped_by = self.limit()
        if not self.stopped_by and cfg.save_every and (
                p.step % cfg.save_every == 0):
            self.save()
        return self.stopped_by is not None

    def limit(self) -> str | None:
        """Which limit ends the run now, if any; under DDP every rank must
        agree, so rank 0's clock decides."""
        cfg = self.cfg
        if cfg.max_updates and self.progress.step >= cfg.max_updates:
            return "max_updates"
        if cfg.max_seconds is None:
            return None
        late = torch.tensor(
            float(time.perf_counter() - self.started >= cfg.max_seconds))
        if self.size > 1:
            dist.broadcast(late, src=0)
        return "max_seconds" if late.item() else None

    def read(self) -> None:
        """The loop's one wait for the device: fetch the pending losses and
        check that no update was skipped."""
        if self.pending:
            self.history["loss"].extend(torch.stack(self.pending).tolist())
            self.pending.clear()
        p = self.progress
        if self.scaler.get_scale() < 1.0:
            raise _nonfinite(self.checked, p.step, p.epoch,
                             self.cfg.ckpt_dir)
        self.checked = p.step

    def save(self) -> None:
        """A checkpoint, after a read: never one after a skipped update."""
        self.read()
        self.progress.stopped_by = self.stopped_by
        if self.cfg.ckpt_dir:
            _save(self.cfg.ckpt_dir, self.model, self.optimizer,
                  self.scheduler, self.scaler, self.progress, self.cfg)

    def end_epoch(self, val_batches: Batches | None) -> None:
        """The epoch's end (or the run's, if a limit came first): the
        validation loss, early stopping, one line of log, a checkpoint."""
        self.bar.close()
        self.read()
        p, cfg, h = self.progress, self.cfg, self.history
        log = cfg.log and self.rank == 0
        if self.stopped_by:  # a limit, mid-epoch
            if log:
                print(f"stopped after {p.step} updates ({self.stopped_by}),"
                      f" train loss {h['loss'][-1]:.3f}")
            self.save()
            return
        p.epoch += 1
        p.batch = 0
        epoch_s = time.perf_counter() - self.t0
        line = (f"epoch {p.epoch}/{cfg.epochs}: updates {p.step}, "
                f"train loss {h['loss'][-1]:.3f}")
        timing = f"\n  {epoch_s:.0f} s"
        if p.epoch < cfg.epochs:  # a watcher wants the ETA
            left = epoch_s * (cfg.epochs - p.epoch)
            if cfg.max_seconds is not None:  # the time limit may come first
                left = min(left, cfg.max_seconds
                           - (time.perf_counter() - self.started))
            timing += f", about {_eta(left)}"
        if val_batches is not None:
            val = evaluate(self.model, val_batches, self.loss_fn, self.device,
                           self.precision)
            h["val_loss"].append(val["loss"])
            h["val_ppl"].append(val["ppl"])
            line += f", val loss {val['loss']:.3f}, val ppl {val['ppl']:.2f}"
            if val["loss"] < p.best:
                p.best, p.bad_epochs = val["loss"], 0
            else:
                p.bad_epochs += 1
            if cfg.patience is not None and p.bad_epochs >= cfg.patience:
                p.early_stopped = True
                line += (f"; no better validation loss for {cfg.patience} "
                         "epochs: stopping early")
        self.stopped_by = ("patience" if p.early_stopped else
                           "epochs" if p.epoch >= cfg.epochs else None)
        if log:
            print(line + timing, flush=True)
        self.save()


# book/10_training.ipynb: A first run: the copy task
def copy_batches(
    n_batches: int,
    batch_size: int,
    seq_len: int,
    vocab_size: int,
    seed: int = 0,
    first_symbol: int = 4,
    bos_id: int = 1,
    eos_id: int = 2,
) -> list[tuple]:
    """The copy task: src is a random sequence of symbols, the target is the
    same sequence."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.randint(  # (batch, seq_len)
            first_symbol, vocab_size, (batch_size, seq_len), generator=g
        )
        bos = torch.full((batch_size, 1), bos_id)
        eos = torch.full((batch_size, 1), eos_id)
        # src, tgt_in, tgt_out
        out.append((x, torch.cat([bos, x], 1), torch.cat([x, eos], 1)))
    return out


# book/10_training.ipynb: A first run: the copy task
COPY_MODEL = {"vocab_size": 14, "N": 2, "d_model": 64, "d_ff": 128, "h": 4,
              "P_drop": 0.0, "max_len": 32}
COPY_TRAIN = {"warmup": 100, "factor": 0.5, "epochs": 8}
MULTI30K_TRAIN = {"warmup": 2000, "factor": 1.5, "epochs": 30}


def copy_task_data(vocab_size: int = 14) -> tuple[Callable[[int], list], list]:
    """The copy task's data: a function epoch -> 50 fresh batches of 32
    sequences of 10 symbols, and 2 validation batches."""
    def train_batches(epoch: int) -> list:
        return copy_batches(50, 32, 10, vocab_size, seed=100 + epoch)

    return train_batches, copy_batches(2, 32, 10, vocab_size, seed=2)


# book/10_training.ipynb: A first run: the copy task
@torch.no_grad()
def greedy(
    model: nn.Module,
    src: torch.Tensor,
    max_len: int,
    bos_id: int = 1,
    eos_id: int = 2,
) -> list[list[int]]:
    """Greedy decoding: at each step take the most probable next token,
    until EOS or max_len tokens."""
    model.eval()
    memory, src_mask = model.encode(src)  # (batch, S, d_model)
    ys = torch.full(
        (src.size(0), 1), bos_id, dtype=torch.long, device=src.device
    )
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        last = model.decode(ys, memory, src_mask)[:, -1]  # (batch, d_model)
        next_id = model.generator(last).argmax(-1)  # (batch,)
        next_id = next_id.masked_fill(done, model.config.pad_id)
        ys = torch.cat([ys, next_id[:, None]], dim=1)
        done |= next_id == eos_id
        if done.all():
            break
    return [
        row[: row.index(eos_id)] if eos_id in row else row
        for row in ys[:, 1:].tolist()
    ]
