# Generated from book/10_training.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

"""§5.2–5.4: the paper's optimizer and learning-rate schedule, label smoothing, and one training loop."""
from __future__ import annotations

import argparse
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

from aiayn.model import TransformerConfig, make_model


def rate(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """§5.3, Equation (3): factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), for step >= 1."""
    if step < 1:
        raise ValueError(f"step counts optimizer updates from 1, got {step}")
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def make_optimizer(model: nn.Module, d_model: int, warmup: int, factor: float = 1.0, fused: bool | None = None):
    """§5.3: Adam(β1=0.9, β2=0.98, ε=1e-9) and a LambdaLR whose n-th optimizer update uses lr = rate(n)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=1.0, betas=(0.9, 0.98), eps=1e-9, fused=fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: rate(s + 1, d_model, warmup, factor))
    return optimizer, scheduler


class LabelSmoothingLoss(nn.Module):
    """§5.4: cross-entropy against a smoothed target: 1 - eps_ls on the true token, eps_ls spread evenly
    over the V - 2 tokens that are neither the true token nor padding. Padding positions are ignored."""

    def __init__(self, eps_ls: float = 0.1, pad_id: int = 0):
        super().__init__()
        if not 0.0 <= eps_ls < 1.0:
            raise ValueError(f"eps_ls must lie in [0, 1), got {eps_ls!r}")
        self.eps_ls, self.pad_id = eps_ls, pad_id

    def target_distribution(self, target: torch.Tensor, V: int) -> torch.Tensor:
        """The smoothed distribution q (…, V) for token ids target (…); rows of padding are all zero."""
        q = torch.full((*target.shape, V), self.eps_ls / (V - 2), device=target.device)
        q[..., self.pad_id] = 0.0
        q.scatter_(-1, target.unsqueeze(-1), 1.0 - self.eps_ls)
        return q * (target != self.pad_id).unsqueeze(-1)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Summed loss -Σ q log p over non-pad positions: logits (…, V), target (…) -> a scalar."""
        logp = F.log_softmax(logits.float(), dim=-1)  # finite for finite logits: no log 0
        keep = target != self.pad_id
        nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # -log p(true token)
        spread = -(logp.sum(-1) - logp[..., self.pad_id] - (-nll))  # -Σ log p over the V - 2 other tokens
        V = logits.size(-1)
        loss = (1.0 - self.eps_ls) * nll + self.eps_ls / (V - 2) * spread
        return loss.masked_fill(~keep, 0.0).sum()


def token_nll(logits: torch.Tensor, target: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
    """Summed negative log-likelihood of the true tokens (no smoothing): what perplexity is made of."""
    return F.cross_entropy(logits.float().flatten(0, -2), target.flatten(), ignore_index=pad_id, reduction="sum")


@dataclass
class TrainConfig:
    """Settings of a training run (§5.2–5.4). Batches come from the caller; these govern everything else."""

    warmup: int = 4000            # §5.3 warmup_steps
    factor: float = 1.0           # multiplies Equation (3); small data likes a larger peak (see the chapter)
    accum: int = 1                # micro-batches per optimizer update (gradient accumulation)
    epochs: int = 1
    max_updates: int | None = None
    max_seconds: float | None = None  # stop (and save) after this much wall time in one call
    eps_ls: float | None = None   # None: the model config's eps_ls
    clip_norm: float | None = None
    ckpt_dir: str | None = None
    keep_last: int = 5            # checkpoints kept in ckpt_dir
    save_every: int | None = None  # also save every this many updates (always at each epoch end)
    patience: int | None = None   # early stopping: epochs without a better validation loss
    bf16: bool = True             # bf16 autocast when on a GPU
    seed: int = 0
    progress: bool = True
    log: bool = True              # one line per epoch


def rng_state() -> dict:
    """Every random generator the loop touches: Python, torch CPU and (if present) CUDA."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


FORMAT = "aiayn-train-1"


class CheckpointError(RuntimeError):
    """A checkpoint is unreadable, not ours, or made for a different model; the message says what to do."""


def save_checkpoint(path: str | Path, state: dict) -> Path:
    """Write atomically: to a temporary file in the same folder, then os.replace (never a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save({"format": FORMAT, **state}, tmp)
    os.replace(tmp, path)
    return path


def checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """The run's checkpoints, oldest first (names carry the update number)."""
    return sorted(Path(ckpt_dir).glob("step_*.pt"))


def read_checkpoint(path: str | Path, config: TransformerConfig | None = None) -> dict:
    """Load a checkpoint, checking it is whole, ours and (if config is given) for the same model."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path}; check the path, or list {path.parent} for the ones written")
    except Exception as err:
        raise CheckpointError(f"{path} is corrupt or truncated ({type(err).__name__}: {err}); delete it and resume "
                              f"from an earlier checkpoint in {path.parent}, or start afresh") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a training checkpoint of this book (format {FORMAT!r} expected); "
                              f"load plain weights with model.load_state_dict instead")
    if config is not None:
        saved = state["model_config"]
        diff = {k: (saved.get(k), v) for k, v in dataclasses.asdict(config).items() if saved.get(k) != v}
        if diff:
            told = ", ".join(f"{k}={a!r} there but {b!r} here" for k, (a, b) in diff.items())
            raise CheckpointError(f"{path} was written for a different model: {told}. Build the model with the "
                                  f"checkpoint's config (make_model(TransformerConfig(**ckpt['model_config']))) "
                                  f"or train into a fresh checkpoint folder")
    return state


def world() -> tuple[int, int]:
    """(rank, world size): (0, 1) unless torch.distributed has been initialised (torchrun)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


Batches = Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | Callable[[int], Iterable]


def _epoch_batches(batches: Batches, epoch: int, rank: int, size: int) -> list:
    """This rank's micro-batches of an epoch: batches may be a list, or a function epoch -> batches."""
    items = list(batches(epoch) if callable(batches) else batches)
    items = items[: len(items) - len(items) % size]  # every rank takes the same number of steps
    return items[rank::size]


@torch.no_grad()
def evaluate(model: nn.Module, batches: Batches, loss_fn: LabelSmoothingLoss, device=None, bf16: bool = True) -> dict:
    """Validation: label-smoothed loss and perplexity exp(NLL) per target token."""
    model.eval()
    device = device or next(model.parameters()).device
    use_bf16 = bf16 and torch.device(device).type == "cuda"
    totals = torch.zeros(3, dtype=torch.float64)
    for src, tgt_in, tgt_out in (batches(0) if callable(batches) else batches):
        src, tgt_in, tgt_out = src.to(device), tgt_in.to(device), tgt_out.to(device)
        with torch.autocast("cuda", torch.bfloat16, enabled=use_bf16):
            logits = model(src, tgt_in)
        totals += torch.tensor([loss_fn(logits, tgt_out).item(), token_nll(logits, tgt_out, loss_fn.pad_id).item(),
                                (tgt_out != loss_fn.pad_id).sum().item()], dtype=torch.float64)
    loss, nll, tokens = totals.tolist()
    return {"loss": loss / tokens, "nll": nll / tokens, "ppl": math.exp(min(nll / tokens, 700.0))}


def _save(ckpt_dir, model, optimizer, scheduler, progress: dict, cfg: TrainConfig) -> None:
    """Every rank hands in its RNG state; rank 0 writes the checkpoint and keeps the last cfg.keep_last."""
    rank, size = world()
    rngs = [rng_state()]
    if size > 1:
        rngs = [None] * size
        dist.all_gather_object(rngs, rng_state())
    if rank == 0:
        save_checkpoint(Path(ckpt_dir) / f"step_{progress['step']:08d}.pt", {
            "model_config": dataclasses.asdict(model.config), "train_config": dataclasses.asdict(cfg),
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "rng": rngs, "progress": progress})
        for old in checkpoints(ckpt_dir)[: -cfg.keep_last]:
            old.unlink()
    if size > 1:
        dist.barrier()


def train(model: nn.Module, train_batches: Batches, val_batches: Batches | None = None,
          cfg: TrainConfig | None = None, resume: bool | str | Path = False) -> dict:
    """Train in place (§5.2–5.4). Batches are (src, tgt_in, tgt_out) tensors; returns the run's history.

    resume=True continues from the newest checkpoint in cfg.ckpt_dir (if any); a path continues from that file.
    """
    cfg = cfg or TrainConfig()
    rank, size = world()
    device = next(model.parameters()).device
    use_bf16 = cfg.bf16 and device.type == "cuda"
    c = model.config
    loss_fn = LabelSmoothingLoss(c.eps_ls if cfg.eps_ls is None else cfg.eps_ls, c.pad_id)
    optimizer, scheduler = make_optimizer(model, c.d_model, cfg.warmup, cfg.factor, fused=device.type == "cuda" or None)
    random.seed(cfg.seed + rank)
    torch.manual_seed(cfg.seed + rank)  # ranks draw different dropout masks
    progress = {"epoch": 0, "batch": 0, "step": 0, "best": math.inf, "bad_epochs": 0, "early_stopped": False,
                "history": {"step": [], "loss": [], "lr": [], "epoch": [], "val_loss": [], "val_ppl": []}}
    if resume:
        path = Path(resume) if not isinstance(resume, bool) else (checkpoints(cfg.ckpt_dir) or [None])[-1]
        if path is not None:
            ckpt = read_checkpoint(path, c)
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            scheduler.load_state_dict(ckpt["scheduler"])
            set_rng_state(ckpt["rng"][rank] if len(ckpt["rng"]) == size else ckpt["rng"][0])
            progress = ckpt["progress"]
    history = progress["history"]
    net = nn.parallel.DistributedDataParallel(model) if size > 1 else model
    save = (lambda: _save(cfg.ckpt_dir, model, optimizer, scheduler, progress, cfg)) if cfg.ckpt_dir else (lambda: None)

    started = time.perf_counter()

    def limit() -> str | None:
        """Which limit ends the run now, if any; under DDP every rank must agree, so rank 0's clock decides."""
        if cfg.max_updates and progress["step"] >= cfg.max_updates:
            return "max_updates"
        if cfg.max_seconds is None:
            return None
        late = torch.tensor(float(time.perf_counter() - started >= cfg.max_seconds))
        if size > 1:
            dist.broadcast(late, src=0)
        return "max_seconds" if late.item() else None

    reached = limit()
    while progress["epoch"] < cfg.epochs and not progress["early_stopped"] and not reached:
        items = _epoch_batches(train_batches, progress["epoch"], rank, size)
        model.train()
        bar = tqdm(range(progress["batch"], len(items), cfg.accum), desc=f"epoch {progress['epoch'] + 1}",
                   disable=not cfg.progress or rank > 0, mininterval=1.0, file=sys.stdout)
        t0, seen = time.perf_counter(), 0
        for i in bar:
            group = items[i : i + cfg.accum]
            tokens = torch.tensor(float(sum((b[2] != c.pad_id).sum().item() for b in group)))
            if size > 1:
                dist.all_reduce(tokens)  # the tokens of the whole update, over every rank
            total = torch.zeros((), device=device)
            for j, (src, tgt_in, tgt_out) in enumerate(group):
                src, tgt_in, tgt_out = src.to(device), tgt_in.to(device), tgt_out.to(device)
                sync = size == 1 or j == len(group) - 1  # DDP all-reduces gradients once per update
                with (net.no_sync() if not sync else torch.enable_grad()):
                    with torch.autocast("cuda", torch.bfloat16, enabled=use_bf16):
                        logits = net(src, tgt_in)  # (batch, T, vocab)
                    loss = loss_fn(logits, tgt_out)
                    (loss * size / tokens.item()).backward()  # DDP averages over ranks; undo that
                total += loss.detach()
            if size > 1:
                dist.all_reduce(total)
            loss_per_token = total.item() / tokens.item()
            if not math.isfinite(loss_per_token):
                raise FloatingPointError(
                    f"the loss became {loss_per_token} at update {progress['step'] + 1} (epoch {progress['epoch'] + 1}, "
                    f"batch {i}); the weights were not updated. Lower the learning-rate factor, lengthen the warmup, "
                    f"set clip_norm, or resume from the last checkpoint in {cfg.ckpt_dir}")
            if cfg.clip_norm:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()  # once per optimizer update, however many micro-batches it took
            optimizer.zero_grad(set_to_none=True)
            progress["step"] += 1
            progress["batch"] = i + len(group)
            seen += tokens.item()
            for key, value in zip(("step", "loss", "lr", "epoch"),
                                  (progress["step"], loss_per_token, lr, progress["epoch"] + 1)):
                history[key].append(value)
            bar.set_postfix(loss=f"{loss_per_token:.3f}", tok_s=f"{seen / (time.perf_counter() - t0):.0f}",
                            lr=f"{lr:.2e}", refresh=False)
            reached = limit()
            if reached:
                break
            if cfg.save_every and progress["step"] % cfg.save_every == 0:
                save()
        bar.close()
        if reached:
            if cfg.log and rank == 0:
                print(f"stopped after {progress['step']} updates ({reached}), train loss {history['loss'][-1]:.3f}")
            save()
            break
        progress["epoch"] += 1
        progress["batch"] = 0
        line = f"epoch {progress['epoch']}: updates {progress['step']}, train loss {history['loss'][-1]:.3f}"
        if val_batches is not None:
            val = evaluate(model, val_batches, loss_fn, device, cfg.bf16)
            history["val_loss"].append(val["loss"])
            history["val_ppl"].append(val["ppl"])
            line += f", val loss {val['loss']:.3f}, val ppl {val['ppl']:.2f}"
            if val["loss"] < progress["best"]:
                progress["best"], progress["bad_epochs"] = val["loss"], 0
            else:
                progress["bad_epochs"] += 1
            if cfg.patience is not None and progress["bad_epochs"] >= cfg.patience:
                progress["early_stopped"] = True
                line += f"; no better validation loss for {cfg.patience} epochs: stopping early"
        if cfg.log and rank == 0:
            print(line, flush=True)
        save()
    return history


def copy_batches(n_batches: int, batch_size: int, seq_len: int, vocab_size: int, seed: int = 0,
                 first_symbol: int = 4, bos_id: int = 1, eos_id: int = 2) -> list[tuple]:
    """The copy task: src is a random sequence of symbols, the target is the same sequence."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.randint(first_symbol, vocab_size, (batch_size, seq_len), generator=g)  # (batch, seq_len)
        bos = torch.full((batch_size, 1), bos_id)
        eos = torch.full((batch_size, 1), eos_id)
        out.append((x, torch.cat([bos, x], 1), torch.cat([x, eos], 1)))  # src, tgt_in, tgt_out
    return out


COPY_MODEL = {"vocab_size": 14, "N": 2, "d_model": 64, "d_ff": 128, "h": 4, "P_drop": 0.0, "max_len": 32}
COPY_TRAIN = {"warmup": 100, "factor": 1.0, "epochs": 8}
MULTI30K_TRAIN = {"warmup": 2000, "factor": 1.5, "epochs": 30}


def copy_task_data(vocab_size: int = 14) -> tuple[Callable[[int], list], list]:
    """The copy task's data: a function epoch -> 50 fresh batches of 32 sequences of 10 symbols, and 2 validation batches."""
    return (lambda epoch: copy_batches(50, 32, 10, vocab_size, seed=100 + epoch)), copy_batches(2, 32, 10, vocab_size, seed=2)


@torch.no_grad()
def greedy(model: nn.Module, src: torch.Tensor, max_len: int, bos_id: int = 1, eos_id: int = 2) -> list[list[int]]:
    """Greedy decoding: at each step take the most probable next token, until EOS or max_len tokens."""
    model.eval()
    memory, src_mask = model.encode(src)  # (batch, S, d_model)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        next_id = model.generator(model.decode(ys, memory, src_mask)[:, -1]).argmax(-1)  # (batch,)
        next_id = next_id.masked_fill(done, model.config.pad_id)
        ys = torch.cat([ys, next_id[:, None]], dim=1)
        done |= next_id == eos_id
        if done.all():
            break
    return [row[: row.index(eos_id)] if eos_id in row else row for row in ys[:, 1:].tolist()]


def multi30k_batches(direction: str = "en-de", bpe_size: int = 8000, max_tokens: int = 8000,
                     tokenizer_path: str | Path | None = None, seed: int = 0):
    """Multi30k (§5.1) as the loop wants it: (tokenizer, a function epoch -> training batches, validation batches)."""
    from aiayn.batching import collate, example_lengths, token_batches
    from aiayn.data import load
    from aiayn.tokenization import encode_pairs, multi30k_tokenizer

    langs = tuple(direction.split("-"))
    tokenizer = multi30k_tokenizer(bpe_size, tokenizer_path)  # joint BPE, learned on the training split only
    train_ids, val_ids = (encode_pairs(tokenizer, load(split, *langs), langs) for split in ("train", "val"))

    def batches(examples, epoch, shuffle):
        index = token_batches(example_lengths(examples), max_tokens, shuffle=shuffle, seed=seed + epoch)
        return [collate([examples[i] for i in idx]) for idx in index]

    return tokenizer, (lambda epoch: batches(train_ids, epoch, True)), batches(val_ids, 0, False)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m aiayn.training", description="Train the Transformer (§5): "
                                "Multi30k translation, or the copy task. Under torchrun, one process per GPU (DDP).")
    p.add_argument("--task", choices=("multi30k", "copy"), default="multi30k")
    p.add_argument("--preset", default="multi30k", help="model preset of aiayn.model: multi30k, base, big")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="override TransformerConfig fields, e.g. --set N=6 P_drop=0.1")
    p.add_argument("--direction", choices=("en-de", "de-en"), default="en-de")
    p.add_argument("--bpe-size", type=int, default=8000, help="joint BPE vocabulary size (sets vocab_size)")
    p.add_argument("--max-tokens", type=int, default=8000, help="token budget of one micro-batch")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer update")
    p.add_argument("--epochs", type=int, default=None, help="default: 30 (multi30k), 8 (copy)")
    p.add_argument("--max-updates", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None, help="default: 2000 (multi30k), 100 (copy)")
    p.add_argument("--factor", type=float, default=None,
                   help="multiplies the learning rate of Equation (3); default: 1.5 (multi30k), 1.0 (copy)")
    p.add_argument("--clip-norm", type=float, default=None)
    p.add_argument("--patience", type=int, default=None, help="early stopping after this many epochs")
    p.add_argument("--ckpt-dir", default="checkpoints/run")
    p.add_argument("--keep-last", type=int, default=10)
    p.add_argument("--save-every", type=int, default=None, help="also save every this many updates")
    p.add_argument("--average-last", type=int, default=0, help="average the last k checkpoints into averaged.pt")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --ckpt-dir")
    p.add_argument("--no-bf16", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _overrides(pairs: list[str]) -> dict:
    fields = {f.name: f.type for f in dataclasses.fields(TransformerConfig)}
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in fields:
            raise SystemExit(f"--set {pair!r}: expected FIELD=VALUE with FIELD one of {', '.join(fields)}")
        out[key] = {"True": True, "False": False, "None": None}.get(value) if value in ("True", "False", "None") \
            else (float(value) if "." in value or "e" in value else int(value))
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if "RANK" in os.environ and not dist.is_initialized():  # started by torchrun
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")  # token counts are CPU tensors
    rank, size = world()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    overrides = _overrides(args.set)
    if args.task == "copy":
        overrides = {**COPY_MODEL, **overrides}
        train_data, val_data = copy_task_data(overrides["vocab_size"])
        defaults = COPY_TRAIN
    else:
        Path(args.ckpt_dir).mkdir(parents=True, exist_ok=True)
        tokenizer, train_data, val_data = multi30k_batches(args.direction, args.bpe_size, args.max_tokens,
                                                           Path(args.ckpt_dir) / "tokenizer.json", args.seed)
        overrides = {"vocab_size": len(tokenizer), **overrides}
        defaults = MULTI30K_TRAIN
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    torch.manual_seed(args.seed)
    model = make_model(args.preset, **overrides).to(device)
    cfg = TrainConfig(warmup=args.warmup, factor=args.factor, accum=args.accum, epochs=args.epochs,
                      max_updates=args.max_updates, clip_norm=args.clip_norm, ckpt_dir=args.ckpt_dir,
                      keep_last=args.keep_last, save_every=args.save_every, patience=args.patience,
                      bf16=not args.no_bf16, seed=args.seed, progress=not args.no_progress)
    history = train(model, train_data, val_data, cfg, resume=args.resume)
    if args.average_last and rank == 0:
        from aiayn.decoding import average_checkpoints  # §6.1

        paths = checkpoints(args.ckpt_dir)[-args.average_last:]
        torch.save({"model_config": dataclasses.asdict(model.config), "model": average_checkpoints(paths)},
                   Path(args.ckpt_dir) / "averaged.pt")
        print(f"averaged {len(paths)} checkpoints into {Path(args.ckpt_dir) / 'averaged.pt'}")
    if size > 1:
        dist.destroy_process_group()
    return history


if __name__ == "__main__" and "__file__" in globals():  # as a script; a notebook defines no __file__
    main()
