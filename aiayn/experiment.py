"""§6.1 in one command: train on Multi30k, average the last checkpoints, beam-search the test sets, score them.

    python -m aiayn.experiment --direction en-de --out results/en-de --time-budget 540
"""
from __future__ import annotations

import time

T0 = time.perf_counter()  # the run's clock starts before the heavy imports

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import torch
from sacrebleu.metrics import BLEU
from sacremoses import MosesTokenizer

from aiayn import bleu, data
from aiayn.decoding import BOS, EOS, average_checkpoints, translate
from aiayn.model import PRESETS, TransformerConfig, count_parameters, make_model
from aiayn.provenance import ROOT, provenance
from aiayn.training import (MULTI30K_TRAIN, CheckpointError, LabelSmoothingLoss, TrainConfig, _overrides, checkpoints,
                            evaluate, multi30k_batches, read_checkpoint, train)

TEST_SPLITS = ("test2016", "test2017", "mscoco2017", "test2018")
SCORED = ("val",) + TEST_SPLITS
WU_REF_LEN = 12103  # test 2016 German references, lowercased and Moses-tokenised (Wu et al., 2021)
BEAM, ALPHA = 4, 0.6  # §6.1; the output limit, input length + 50, is aiayn.decoding's default


class ExperimentError(RuntimeError):
    """A bad option or a checkpoint folder that does not fit the request; the message says what to do."""


def moses_tokenize(lines, lang: str) -> list[str]:
    """The literature's preprocessing: lowercase, then Moses-tokenise (sacremoses defaults) for ``lang``."""
    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line.lower(), return_str=True) for line in lines]


def score(hypotheses: list[str], references: list[str], lang: str) -> dict:
    """Cased sacreBLEU (13a) with its signature, and lowercased Moses-tokenised BLEU (tokenize="none")."""
    out = {}
    for name, metric, hyps, refs in (
            ("sacrebleu", BLEU(), hypotheses, references),
            ("tok_lc", BLEU(tokenize="none", force=True), moses_tokenize(hypotheses, lang), moses_tokenize(references, lang))):
        s = metric.corpus_score(hyps, [refs])
        out[name] = {"score": s.score, "signature": str(metric.get_signature()), "precisions": s.precisions,
                     "bp": s.bp, "sys_len": s.sys_len, "ref_len": s.ref_len, "text": str(s)}
    out["sacrebleu"]["aiayn_bleu"] = bleu.corpus_bleu(hypotheses, references).score  # the chapter's own BLEU
    return out


def check_reference_length() -> dict:
    """Tokens of the lowercased Moses-tokenised test 2016 German references; Wu et al. report 12,103."""
    refs = [de for _, de in data.load("test2016", "en", "de")]
    n = sum(len(line.split()) for line in moses_tokenize(refs, "de"))
    return {"test2016_de_tokens": n, "expected": WU_REF_LEN, "ok": n == WU_REF_LEN}


@torch.no_grad()
def attention_maps(model, tokenizer, pairs, src_lang: str, tgt_lang: str) -> dict:
    """Encoder self, decoder self and cross attention (layers, h, rows, cols) of each pair's beam output, float16."""
    names = {}
    for i, layer in enumerate(model.encoder.layers):
        names[layer.self_attn] = ("enc_self", i)
    for i, layer in enumerate(model.decoder.layers):
        names[layer.self_attn], names[layer.src_attn] = ("dec_self", i), ("cross", i)
    seen = {}

    def want_weights(module, args, kwargs):
        return args, {**kwargs, "need_weights": True}

    def keep(module, args, output):
        seen[names[module]] = output[1][0].float().cpu()  # (h, len_q, len_k)

    hooks = [m.register_forward_pre_hook(want_weights, with_kwargs=True) for m in names]
    hooks += [m.register_forward_hook(keep) for m in names]
    device = next(model.parameters()).device
    out = {}
    model.eval()
    try:
        for k, (source, reference) in enumerate(pairs):
            hypothesis = translate(model, tokenizer, source, BEAM, ALPHA, lang=src_lang)
            src_ids = tokenizer.encode(source, src_lang) + [EOS]
            tgt_ids = [BOS] + tokenizer.encode(hypothesis, tgt_lang)  # decoder inputs: <s> y_1 ... y_n
            memory, src_mask = model.encode(torch.tensor([src_ids], device=device))
            model.decode(torch.tensor([tgt_ids], device=device), memory, src_mask)
            for kind in ("enc_self", "dec_self", "cross"):
                stacked = torch.stack([seen[(kind, i)] for i in range(model.config.N)])  # (N, h, rows, cols)
                out[f"s{k}_{kind}"] = stacked.numpy().astype(np.float16)
            out[f"s{k}_src_tokens"] = np.array([tokenizer.pieces[i] for i in src_ids])
            out[f"s{k}_tgt_tokens"] = np.array([tokenizer.pieces[i] for i in tgt_ids])
            for key, text in (("source", source), ("hypothesis", hypothesis), ("reference", reference)):
                out[f"s{k}_{key}"] = np.array(text)
    finally:
        for hook in hooks:
            hook.remove()
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m aiayn.experiment", description="Train on Multi30k, average the last "
                                "checkpoints, beam-search (K=4, α=0.6) and score val and the four test sets.")
    p.add_argument("--direction", choices=("en-de", "de-en"), required=True)
    p.add_argument("--out", required=True, help="results folder (metrics, hypotheses, curves, attention; no checkpoints)")
    p.add_argument("--ckpt-dir", default=None, help="scratch folder for checkpoints; default checkpoints/experiment/<out name>")
    p.add_argument("--preset", default="multi30k", help="model preset of aiayn.model: multi30k, base, big")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="TransformerConfig fields, e.g. N=6")
    p.add_argument("--bpe-size", type=int, default=8000, help="joint BPE vocabulary (sets vocab_size)")
    p.add_argument("--max-tokens", type=int, default=8000, help="token budget of one batch")
    p.add_argument("--epochs", type=int, default=MULTI30K_TRAIN["epochs"])
    p.add_argument("--max-updates", type=int, default=None)
    p.add_argument("--warmup", type=int, default=MULTI30K_TRAIN["warmup"])
    p.add_argument("--factor", type=float, default=MULTI30K_TRAIN["factor"], help="multiplies Equation (3)")
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--average-last", type=int, default=10, help="average this many of the last checkpoints")
    p.add_argument("--save-every", type=int, default=None, help="also save every this many updates (else per epoch)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds for the whole command; training stops when only --eval-reserve is left")
    p.add_argument("--eval-reserve", type=float, default=90.0, help="seconds kept for averaging, decoding, scoring")
    p.add_argument("--resume", action="store_true", help="continue training from the newest checkpoint")
    p.add_argument("--eval-only", action="store_true", help="skip training; evaluate the checkpoints there are")
    p.add_argument("--limit-train", type=int, default=None, help="use only N training batches per epoch (smoke tests)")
    p.add_argument("--decode-batch", type=int, default=128, help="sentences per beam-search batch")
    p.add_argument("--no-bf16", action="store_true")
    p.add_argument("--progress", action="store_true", help="show a progress bar per epoch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--splits", nargs="+", choices=SCORED, default=list(SCORED),
                   help="sets to decode and score (default all five; val alone for Table 3 variations, §6.2)")
    return p.parse_args(argv)


def model_overrides(pairs: list[str]) -> dict:
    """--set FIELD=VALUE pairs as TransformerConfig fields (vocab_size comes from --bpe-size)."""
    try:
        overrides = _overrides(pairs)
    except ValueError as err:
        raise ExperimentError(f"--set {' '.join(pairs)}: a value is not a number, True, False or None ({err})") from None
    except SystemExit as err:
        raise ExperimentError(str(err)) from None
    if "vocab_size" in overrides:
        raise ExperimentError("--set vocab_size: the vocabulary size is the tokenizer's; change it with --bpe-size")
    return overrides


def make_config(args: argparse.Namespace, vocab_size: int) -> TransformerConfig:
    """The model config of --preset with the --set changes and the tokenizer's vocabulary size, checked."""
    if args.preset not in PRESETS:
        raise ExperimentError(f"unknown --preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    try:
        return PRESETS[args.preset].replace(**model_overrides(args.set), vocab_size=vocab_size)
    except (TypeError, ValueError) as err:
        raise ExperimentError(f"--set {' '.join(args.set)}: {err}") from None


def run(args: argparse.Namespace, argv: list[str], started: float) -> dict:
    """Train (unless --eval-only), average, decode and score; write everything to args.out and return the metrics."""
    phases = {}
    tick = time.perf_counter()
    make_config(args, PRESETS.get(args.preset, PRESETS["multi30k"]).vocab_size)  # bad options fail before any work
    out = Path(args.out)
    ckpt_dir = Path(args.ckpt_dir or ROOT / "checkpoints" / "experiment" / out.resolve().name)
    if ckpt_dir.resolve().is_relative_to(out.resolve()):
        raise ExperimentError(f"--ckpt-dir {ckpt_dir} lies inside --out {out}; results hold no checkpoints")
    existing = checkpoints(ckpt_dir) if ckpt_dir.is_dir() else []
    if existing and not (args.resume or args.eval_only):
        raise ExperimentError(f"{ckpt_dir} already holds {len(existing)} checkpoints of an earlier run; pass --resume "
                              f"to continue it, --eval-only to evaluate it, or delete the folder or choose --ckpt-dir")
    if args.eval_only and not existing:
        raise ExperimentError(f"--eval-only: no checkpoints in {ckpt_dir}; train first (drop --eval-only)")
    if args.average_last < 1:
        raise ExperimentError(f"--average-last must be at least 1, got {args.average_last}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    src_lang, tgt_lang = args.direction.split("-")

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    tokenizer, train_data, val_data = multi30k_batches(args.direction, args.bpe_size, args.max_tokens,
                                                       ckpt_dir / "tokenizer.json", args.seed)
    if args.limit_train:
        full, n = train_data, args.limit_train
        train_data = lambda epoch: full(epoch)[:n]  # noqa: E731
    config = make_config(args, len(tokenizer))
    if existing:
        trained = TransformerConfig(**read_checkpoint(existing[-1])["model_config"])
        if trained != config:
            raise ExperimentError(f"{ckpt_dir} holds a model with {trained}, but --preset/--set ask for {config}; "
                                  f"give the same --preset and --set as the run being continued, or another --ckpt-dir")
    torch.manual_seed(args.seed)
    model = make_model(config).to(device)
    phases["setup"] = time.perf_counter() - tick

    tick = time.perf_counter()
    cfg = TrainConfig(warmup=args.warmup, factor=args.factor, accum=args.accum, epochs=args.epochs,
                      max_updates=args.max_updates, ckpt_dir=str(ckpt_dir),
                      keep_last=max(args.average_last, 2), save_every=args.save_every,
                      bf16=not args.no_bf16, seed=args.seed, progress=args.progress)
    if args.time_budget is not None:
        cfg.max_seconds = started + args.time_budget - args.eval_reserve - time.perf_counter()
        if cfg.max_seconds <= 0 and not args.eval_only:
            raise ExperimentError(f"--time-budget {args.time_budget:g} s leaves no time to train after "
                                  f"{time.perf_counter() - started:.0f} s of setup and --eval-reserve {args.eval_reserve:g} s")
    if args.eval_only:
        history = read_checkpoint(existing[-1])["progress"]["history"]
    else:
        history = train(model, train_data, val_data, cfg, resume=bool(existing))
    last = read_checkpoint(checkpoints(ckpt_dir)[-1])["progress"]
    if args.max_updates and last["step"] >= args.max_updates:
        stopped_by = "max_updates"
    elif last["early_stopped"]:
        stopped_by = "early stopping"
    elif last["epoch"] >= args.epochs:
        stopped_by = "epochs"
    else:
        stopped_by = "time budget"
    print(f"training: {last['step']} updates, {last['epoch']} epochs, stopped by {stopped_by}", flush=True)
    phases["train"] = time.perf_counter() - tick

    tick = time.perf_counter()
    paths = checkpoints(ckpt_dir)[-args.average_last:]
    model.load_state_dict(average_checkpoints(paths))
    torch.save({"model_config": dataclasses.asdict(config), "model": model.state_dict()}, ckpt_dir / "averaged.pt")
    loss_fn = LabelSmoothingLoss(config.eps_ls, config.pad_id)
    val = evaluate(model, val_data, loss_fn, device, not args.no_bf16)
    print(f"averaged {len(paths)} checkpoints: val loss {val['loss']:.3f}, val ppl {val['ppl']:.2f}", flush=True)
    phases["average"] = time.perf_counter() - tick

    out.mkdir(parents=True, exist_ok=True)
    scores, decode_s, reference_check = {}, {}, None
    if "test2016" in args.splits:
        reference_check = check_reference_length()
        print(f"test 2016 German references, lowercased and Moses-tokenised: {reference_check['test2016_de_tokens']} "
              f"tokens ({'equals' if reference_check['ok'] else 'DIFFERS FROM'} Wu et al.'s {WU_REF_LEN})", flush=True)
    tick = time.perf_counter()
    for split in (s for s in SCORED if s in args.splits):
        start = time.perf_counter()
        pairs = data.load(split, src_lang, tgt_lang)
        hyps = [h.replace("\n", " ") for h in translate(model, tokenizer, [s for s, _ in pairs], BEAM, ALPHA,
                                                          args.decode_batch, lang=src_lang)]
        decode_s[split] = time.perf_counter() - start
        (out / f"hyp.{split}.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        scores[split] = {"file": f"{data.SPLITS[split][0]}.{tgt_lang}", "sentences": len(pairs),
                         "decode_s": decode_s[split], **score(hyps, [t for _, t in pairs], tgt_lang)}
        print(f"{split}: {scores[split]['sacrebleu']['text']}\n    tokenised, lowercased: "
              f"{scores[split]['tok_lc']['score']:.2f}  ({decode_s[split]:.1f} s)", flush=True)
    phases["decode_and_score"] = time.perf_counter() - tick

    tick = time.perf_counter()
    test = data.load("test2016", src_lang, tgt_lang)
    examples = [p for p in test if 6 <= len(p[0].split()) <= 9][:3]  # three short sentences
    np.savez_compressed(out / "attention.npz", **attention_maps(model, tokenizer, examples, src_lang, tgt_lang))
    (out / "history.json").write_text(json.dumps(history, indent=1) + "\n", encoding="utf-8")
    phases["write"] = time.perf_counter() - tick
    phases["total"] = time.perf_counter() - started

    metrics = {
        "direction": args.direction, "src_lang": src_lang, "tgt_lang": tgt_lang,
        "bleu": scores, "val": val, "parameters": count_parameters(model), "updates": last["step"],
        "epochs": last["epoch"], "stopped_by": stopped_by,
        "averaged_checkpoints": [p.name for p in paths],
        "decoding": {"beam_size": BEAM, "alpha": ALPHA, "max_output": "input length + 50", "batch": args.decode_batch},
        "reference_check": reference_check,
        "model_config": dataclasses.asdict(config), "train_config": dataclasses.asdict(cfg),
        "data": {"bpe_size": args.bpe_size, "max_tokens": args.max_tokens, "limit_train_batches": args.limit_train,
                 "splits": args.splits},
        "provenance": {**provenance(" ".join(["python -m aiayn.experiment", *map(shlex.quote, argv)]), device),
                       "wall_s": phases, "time_budget_s": args.time_budget},
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {out}/metrics.json; {phases['total']:.0f} s in all", flush=True)
    return metrics


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    """The command line; ``started`` is when the time budget began (default: now)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        run(args, argv, time.perf_counter() if started is None else started)
    except (ExperimentError, CheckpointError, data.DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(started=T0))
