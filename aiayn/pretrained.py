"""Trained models for readers without a GPU: the book's averaged English→German and German→English models, by name.

    from aiayn import pretrained
    m = pretrained.load("en-de")              # the model, its tokenizer, its scores and where it was trained
    m.translate("Two dogs play in the snow.")

A shipped model is one file (fp16 weights, the tokenizer, the run's scores and provenance) listed with its SHA256 in
``aiayn/pretrained.json`` (or ``$AIAYN_PRETRAINED_REGISTRY``). It is looked for in the checkout's ``pretrained/``
folder, beside the registry, then in the user's cache
(``$AIAYN_PRETRAINED``, else ``~/.cache/aiayn/pretrained``), and downloaded from the repository into that cache when it
is in neither (as in Colab). Every file is checked against its SHA256 before it is used.

    python -m aiayn.pretrained list
    python -m aiayn.pretrained export --name en-de --ckpt-dir checkpoints/experiment/en-de --results results/en-de

Not about the model or decoding: those are aiayn.model (chapter 7) and aiayn.decoding (chapter 11). This module only
finds, checks and loads the shipped weights into them.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from aiayn import data
from aiayn.decoding import BOS, EOS
from aiayn.decoding import translate as _translate
from aiayn.floor import build
from aiayn.model import TransformerConfig
from aiayn.tokenization import Tokenizer

from aiayn import ROOT

REGISTRY = Path(os.environ.get("AIAYN_PRETRAINED_REGISTRY") or Path(__file__).with_name("pretrained.json"))
FOLDER = ROOT / "pretrained"  # where a checkout keeps the files
URLS = (
    "https://raw.githubusercontent.com/aiayn-book/aiayn/main/pretrained/{file}",
    "https://github.com/aiayn-book/aiayn/raw/main/pretrained/{file}",
)
FORMAT = "aiayn-pretrained-1"


class PretrainedError(RuntimeError):
    """A model that is not shipped, not reachable, or not intact; the message says what to do."""


def registry(path: Path = REGISTRY) -> dict:
    """The shipped models: name -> {"file", "sha256", "bytes", "direction", "bleu", ...}."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _download(file: str, sha256: str, dest: Path, urls, retries: int, timeout: float) -> Path:
    errors = data.download([template.format(file=file) for template in urls], sha256, dest, retries, timeout)
    if errors:
        raise PretrainedError(
            f"could not download the model file {file}:\n  " + "\n  ".join(errors) + "\n"
            f"Without network access: download it on another machine from "
            f"{urls[0].format(file=file)} and copy it to {dest} (or set AIAYN_PRETRAINED to the "
            f"folder that holds it)"
        )
    return dest


def locate(
    name: str,
    registry_path: Path = REGISTRY,
    folder: Path = FOLDER,
    cache: Path | None = None,
    urls=URLS,
    retries: int = 3,
    timeout: float = 60.0,
) -> Path:
    """The verified file of a shipped model: from the checkout, the cache, or downloaded into the cache."""
    known = registry(registry_path)
    if name not in known:
        if not known:
            raise PretrainedError(
                f"no trained model is shipped with this version of the book, so {name!r} cannot be "
                f"loaded. Train one with `python -m aiayn.experiment --recipe cpu --direction {name} --out "
                f"DIR` (about half an hour on 2 CPU cores) and load it with "
                f"pretrained.load_file(ckpt_dir / 'averaged.pt')"
            )
        raise PretrainedError(f"unknown model {name!r}; the shipped ones are {', '.join(sorted(known))}")
    entry = known[name]
    cache = Path(cache or data.pretrained_dir())
    for candidate in (Path(folder) / entry["file"], Path(registry_path).parent / entry["file"], cache / entry["file"]):
        if candidate.is_file():
            if data.sha256(candidate) == entry["sha256"]:
                return candidate
            print(
                f"{candidate} does not match its SHA256 (an interrupted download, or an older file); fetching it again",
                file=sys.stderr,
            )
    return _download(entry["file"], entry["sha256"], cache / entry["file"], urls, retries, timeout)


@dataclass
class Pretrained:
    """A trained model with its tokenizer, the direction it translates and the scores of the run that made it."""

    model: torch.nn.Module
    tokenizer: Tokenizer
    direction: str
    metrics: dict = field(default_factory=dict)
    path: Path | None = None

    def translate(self, sentences, beam_size: int = 4, alpha: float = 0.6):
        """Beam search as in §6.1 (K = 4, α = 0.6); a string gives a string, a list a list."""
        return _translate(self.model, self.tokenizer, sentences, beam_size, alpha, lang=self.direction.split("-")[0])

    def attention(self, sentence: str, beam_size: int = 4, alpha: float = 0.6) -> dict:
        """Translate ``sentence`` and return the weights of every layer and head (float16) while the model reads it
        and re-reads its own output: ``enc_self`` (N, h, S, S), ``dec_self`` (N, h, T, T), ``cross`` (N, h, T, S),
        with ``src_tokens`` (the source pieces, </s> last), ``tgt_tokens`` (<s>, then the output) and ``hypothesis``."""
        from aiayn.decoding import translate_ids

        if not isinstance(sentence, str) or not sentence.strip():
            raise ValueError("attention takes one non-empty sentence (a str)")
        src = self.tokenizer.encode(sentence, self.direction.split("-")[0])
        out = translate_ids(self.model, [src], beam_size, alpha)[0]
        maps = attention_maps(self.model, self.tokenizer, [(src, out, sentence, self.tokenizer.decode(out), "")])
        return {key.removeprefix("s0_"): value for key, value in maps.items()}


@torch.no_grad()
def attention_maps(model, tokenizer, examples) -> dict:
    """Encoder self, decoder self and cross attention (layers, h, rows, cols) of each example, float16.

    ``examples`` holds (source ids, output ids, source, hypothesis, reference): the decoder re-reads its own output.
    """
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
        for k, (src, hyp, source, hypothesis, reference) in enumerate(examples):
            src_ids, tgt_ids = list(src) + [EOS], [BOS] + list(hyp)  # decoder inputs: <s> y_1 ... y_n
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


def load_file(path, device="cpu") -> Pretrained:
    """A model file written by `export`, or an experiment's averaged.pt (with tokenizer.json beside it)."""
    path = Path(path)
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise PretrainedError(f"no model file at {path}") from None
    except Exception as err:  # noqa: BLE001  a truncated or foreign file
        raise PretrainedError(
            f"{path} is not a readable model file ({type(err).__name__}); delete it and load or export it again"
        ) from None
    if content.get("format") == FORMAT:
        t = json.loads(content["tokenizer"])
        tokenizer = Tokenizer(t["vocab"], t["merges"], t["langs"])
        direction, metrics = content["direction"], content["metrics"]
    elif "model_config" in content and (path.parent / "tokenizer.json").is_file():  # an experiment's averaged.pt
        tokenizer, direction, metrics = Tokenizer.load(path.parent / "tokenizer.json"), content.get("direction"), {}
    else:
        raise PretrainedError(f"{path} is neither a model file of this book nor an averaged.pt with its tokenizer.json")
    model = build(TransformerConfig(**content["model_config"]), content.get("layers", "aiayn"))
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in content["model"].items()})
    return Pretrained(model.to(device).eval(), tokenizer, direction or "en-de", metrics, path)


def load(name: str, device="cpu", **where) -> Pretrained:
    """A shipped model by name ("en-de", "de-en"), verified by SHA256; see `locate` for where it is looked for."""
    return load_file(locate(name, **where), device)


def export(
    name: str, ckpt_dir, results, folder: Path = FOLDER, registry_path: Path = REGISTRY, allow_failed: bool = False
) -> dict:
    """Write a run's averaged model as folder/<name>.pt (fp16) and list it with its SHA256 in the registry.

    A run with warnings (aiayn.runs.health) is refused unless ``allow_failed`` (a rehearsal of the plumbing with tiny
    models, which never converge)."""
    ckpt_dir, results = Path(ckpt_dir), Path(results)
    averaged = torch.load(ckpt_dir / "averaged.pt", map_location="cpu", weights_only=True)
    metrics = json.loads((results / "metrics.json").read_text(encoding="utf-8"))
    if metrics.get("warnings") and not allow_failed:
        raise PretrainedError(f"{results} is a failed run, not shipped: " + "; ".join(metrics["warnings"]))
    tokenizer = Tokenizer.load(ckpt_dir / "tokenizer.json")
    summary = {
        "direction": metrics["direction"],
        "layers": metrics.get("layers", "aiayn"),
        "parameters": metrics["parameters"],
        "updates": metrics["updates"],
        "bleu": {
            split: {"sacrebleu": s["sacrebleu"]["score"], "tok_lc": s["tok_lc"]["score"]}
            for split, s in metrics["bleu"].items()
        },
        "provenance": metrics["provenance"],
    }
    buffer = io.BytesIO()
    torch.save(
        {
            "format": FORMAT,
            "model_config": averaged["model_config"],
            "layers": summary["layers"],
            "model": _half_shared(averaged["model"]),
            "tokenizer": json.dumps(
                {
                    "vocab": tokenizer.vocab,
                    "merges": [list(m) for m in tokenizer.merges],
                    "langs": list(tokenizer.langs),
                },
                ensure_ascii=False,
            ),
            "direction": summary["direction"],
            "metrics": summary,
        },
        buffer,
    )
    path = Path(folder) / f"{name}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    entry = {"file": path.name, "sha256": data.sha256(path), "bytes": path.stat().st_size, **summary}
    known = registry(registry_path)
    known[name] = entry
    Path(registry_path).write_text(json.dumps(known, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return entry


def _half_shared(state: dict) -> dict:
    """fp16 copies of the floating-point tensors, one per distinct value: the three tied uses of the shared table
    (§3.4) are averaged as three equal tensors, and are stored once again."""
    out, kept = {}, []
    for key, value in state.items():
        if not value.is_floating_point():
            out[key] = value
            continue
        half = next((h for v, h in kept if v.shape == value.shape and torch.equal(v, value)), None)
        if half is None:
            half = value.half()
            kept.append((value, half))
        out[key] = half
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m aiayn.pretrained", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the shipped models and their scores")
    e = sub.add_parser("export", help="ship a run's averaged model (fp16) under a name")
    e.add_argument("--name", required=True)
    e.add_argument("--ckpt-dir", required=True, help="the experiment's checkpoint folder (averaged.pt, tokenizer.json)")
    e.add_argument("--results", required=True, help="the experiment's --out folder (metrics.json)")
    args = p.parse_args(argv)
    if args.command == "export":
        entry = export(args.name, args.ckpt_dir, args.results)
        print(f"{args.name}: {FOLDER / entry['file']}, {entry['bytes'] / 1e6:.1f} MB, sha256 {entry['sha256']}")
        return 0
    known = registry()
    for name, entry in sorted(known.items()):
        test = entry["bleu"].get("test2016", {})
        print(
            f"{name}: {entry['file']} ({entry['bytes'] / 1e6:.1f} MB), {entry['parameters'] / 1e6:.1f}M parameters, "
            f"test 2016 sacreBLEU {test.get('sacrebleu', float('nan')):.2f}, on {entry['provenance']['device']}"
        )
    if not known:
        print("no trained model is shipped with this version of the book")
    return 0


if __name__ == "__main__":
    sys.exit(main())
