"""The book's shipped translators in the reader's browser: ONNX graphs, what the page needs to tokenise, and parity.

The page "Try the model" (book/try_the_model.md; its scripts are in web/) runs the models with ONNX Runtime Web. This
module writes what it loads, from the shipped files (``aiayn.pretrained``), and checks that it translates as the
book's Python does:

    python -m aiayn.browser export --out book/_static/model      # graphs, tokenizer, runtime, scripts, manifest.json
    python -m aiayn.browser fixtures                             # what `node --test web/test/` compares against
    python -m aiayn.browser parity                               # writes results/browser_parity.json

Each direction is two graphs. The encoder maps source ids (1, S), </s> last, to the memory, the keys and values
that every decoder layer's cross-attention reads (projected once), and the encoder self-attention weights. The
decoder step feeds one new token per beam row with the self-attention keys and values of the earlier positions
(cached; the step gathers them by each row's parent, so the beam needs no tensor code) and returns
log p(y_t | y_<t, x), the keys and values with this position added, and this position's self- and
cross-attention weights. `parity` also exports a decoder that recomputes the whole prefix at every step, and measures
both. The attention maps of a translation are the step's weights, replayed over it with one row. The weights ship as
int8 (one scale per output unit), which ONNX Runtime turns back into fp32 when a session loads.

One sentence per run: no source padding, so no source mask (the page translates what the reader types).

Not about the paper: it exports the shipped models (aiayn.pretrained) as they are. The beam search that web/ rewrites in
JavaScript is §6.1's (aiayn.decoding, chapter 11), against which its parity is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import hashlib
import http.server
import json
import math
import re
import shlex
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from aiayn import ROOT
from aiayn.decoding import BOS, EOS

FORMAT = "aiayn-browser-1"
NAMES = ("en-de", "de-en")  # the CPU runs, which the book's pages use
DEFAULT_OUT = ROOT / "book" / "_static" / "model"
EXTRA_LEN = 50  # output limit: source tokens (</s> included) + 50, capped by max_len (aiayn.decoding.output_limits)


# ---------------------------------------------------------------------------------------------------------- graphs
def _attend(attn, query, k, v, mask=None):
    """Equation (1) with the weights, as aiayn.attention.attention computes it: (output, weights (B, h, q, k))."""
    q = attn.split_heads(attn.W_Q(query))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1)
    return attn.W_O((weights @ v).transpose(1, 2).flatten(-2)), weights


def _kv(attn, x):
    return attn.split_heads(attn.W_K(x)), attn.split_heads(attn.W_V(x))


class EncoderGraph(nn.Module):
    """src (1, S) -> memory (1, S, d), cross_k and cross_v (N, 1, h, S, d_k), enc_self (N, 1, h, S, S)."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, src):
        m = self.m
        x = m.src_embed(src) + m.src_pe.pe[: src.size(1)]
        weights = []
        for layer in m.encoder.layers:

            def self_attention(y, a=layer.self_attn):
                out, w = _attend(a, y, *_kv(a, y))
                weights.append(w)
                return out

            x = layer.sublayer[1](layer.sublayer[0](x, self_attention), layer.feed_forward)
        memory = m.encoder.norm(x)
        kv = [_kv(layer.src_attn, memory) for layer in m.decoder.layers]
        return memory, torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv]), torch.stack(weights)


def _log_probs(m, h):
    """log p over the vocabulary from the last decoder output (rows, d); <pad> and <s> impossible, as in decoding."""
    logp = m.generator(h).float().log_softmax(-1)
    banned = torch.zeros(logp.size(-1), dtype=torch.bool)
    banned[[m.config.pad_id, BOS]] = True
    return logp.masked_fill(banned, float("-inf"))


def _decoder_layer(layer, x, self_kv, cross_k, cross_v, self_mask, self_sink, cross_sink):
    """One decoder layer; ``self_kv(a, y)`` gives the self-attention keys and values for the layer's input y."""

    def self_attention(y, a=layer.self_attn):
        out, w = _attend(a, y, *self_kv(a, y), self_mask)
        self_sink.append(w)
        return out

    def cross_attention(y, a=layer.src_attn):
        out, w = _attend(a, y, cross_k, cross_v)
        cross_sink.append(w)
        return out

    x = layer.sublayer[0](x, self_attention)
    x = layer.sublayer[1](x, cross_attention)
    return layer.sublayer[2](x, layer.feed_forward)


class StepGraph(nn.Module):
    """One decoding step with cached keys and values, R beam rows.

    token (R,): each row's newest token; step (1,): its position (<s> is 0); parent (R,): the row of the previous
    step each row continues; past_k, past_v (N, R, h, t, d_k); cross_k, cross_v (N, R, h, S, d_k).
    -> logp (R, V), present_k, present_v (N, R, h, t + 1, d_k), dec_self (N, R, h, t + 1), cross (N, R, h, S)."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, token, step, parent, past_k, past_v, cross_k, cross_v):
        m = self.m
        x = m.tgt_embed(token[:, None]) + m.tgt_pe.pe[step]  # (R, 1, d)
        past_k, past_v = past_k.index_select(1, parent), past_v.index_select(1, parent)
        keys, values, self_w, cross_w = [], [], [], []
        for i, layer in enumerate(m.decoder.layers):

            def self_kv(a, y, i=i):
                k, v = _kv(a, y)
                keys.append(torch.cat([past_k[i], k], 2))
                values.append(torch.cat([past_v[i], v], 2))
                return keys[-1], values[-1]

            x = _decoder_layer(layer, x, self_kv, cross_k[i], cross_v[i], None, self_w, cross_w)
        x = m.decoder.norm(x)
        return (
            _log_probs(m, x[:, -1]),
            torch.stack(keys),
            torch.stack(values),
            torch.stack(self_w)[:, :, :, 0],
            torch.stack(cross_w)[:, :, :, 0],
        )


class PrefixGraph(nn.Module):
    """One decoding step that recomputes the prefix: tokens (R, T) -> logp (R, V), dec_self (N, R, h, T, T),
    cross (N, R, h, T, S). Measured against StepGraph; not shipped."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, tokens, cross_k, cross_v):
        m = self.m
        T = tokens.size(1)
        x = m.tgt_embed(tokens) + m.tgt_pe.pe[:T]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        self_w, cross_w = [], []
        for i, layer in enumerate(m.decoder.layers):
            x = _decoder_layer(layer, x, _kv, cross_k[i], cross_v[i], causal, self_w, cross_w)
        x = m.decoder.norm(x)
        return _log_probs(m, x[:, -1]), torch.stack(self_w), torch.stack(cross_w)


GRAPHS = {
    # kind: (module, input names, output names)
    "encoder": (EncoderGraph, ["src"], ["memory", "cross_k", "cross_v", "enc_self"]),
    "decoder": (
        StepGraph,
        ["token", "step", "parent", "past_k", "past_v", "cross_k", "cross_v"],
        ["logp", "present_k", "present_v", "dec_self", "cross"],
    ),
    "prefix": (PrefixGraph, ["tokens", "cross_k", "cross_v"], ["logp", "dec_self", "cross"]),
}


def _examples(kind: str, c, R: int = 4, S: int = 7, t: int = 3):
    dk = c.d_k or c.d_model // c.h
    cross = torch.randn(c.N, R, c.h, S, dk)  # keys and values: distinct tensors (the exporter would alias one object)
    if kind == "encoder":
        return (torch.randint(4, c.vocab_size, (1, S)),)
    if kind == "decoder":
        past = torch.randn(c.N, R, c.h, t, dk)
        return (
            torch.randint(4, 100, (R,)),
            torch.tensor([t]),
            torch.arange(R),
            past,
            past.clone(),
            cross,
            cross.clone(),
        )
    return (torch.randint(4, 100, (R, t + 1)), cross, cross.clone())


def export_graph(model, kind: str, path: Path) -> Path:
    """Export one graph with PyTorch's ONNX exporter (torch.export), with dynamic lengths and beam rows."""
    module, inputs, outputs = GRAPHS[kind]
    S, R, t, T = (torch.export.Dim(n, min=1, max=model.config.max_len) for n in ("S", "R", "t", "T"))
    dynamic = {
        "encoder": {"src": {1: S}},
        "decoder": {
            "token": {0: R},
            "step": None,
            "parent": {0: R},
            "past_k": {1: R, 3: t},
            "past_v": {1: R, 3: t},
            "cross_k": {1: R, 3: S},
            "cross_v": {1: R, 3: S},
        },
        "prefix": {"tokens": {0: R, 1: T}, "cross_k": {1: R, 3: S}, "cross_v": {1: R, 3: S}},
    }[kind]
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        program = torch.onnx.export(
            module(model).eval(),
            _examples(kind, model.config),
            input_names=inputs,
            output_names=outputs,
            dynamic_shapes=dynamic,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    program.save(str(path), external_data=False)
    return path


# ----------------------------------------------------------------------------------------------------- beam search
def output_limit(n_src: int, max_len: int) -> int:
    """Most output tokens (</s> included) for a source of n_src tokens without </s>, as aiayn.decoding's."""
    return max(1, min(n_src + 1 + EXTRA_LEN, max_len))


def length_penalties(max_len: int, alpha: float) -> np.ndarray:
    """lp(|Y|) for |Y| = 0..max_len in float32, as aiayn.decoding.length_penalty computes it on a length tensor: the
    page divides by these very numbers (manifest.json), so that no float32 power is computed twice differently."""
    from aiayn.decoding import length_penalty

    return length_penalty(torch.arange(max_len + 1), alpha).float().numpy()


def beam_search(step, limit: int, lp: np.ndarray, vocab_size: int, beam_size: int = 4, pad: int = 0):
    """aiayn.decoding.beam_search for one sentence in numpy float32, as web/beam.js does it.

    ``step(t, last, parent)`` gives log p(y_t | y_<t, x) (K, V) for each slot's newest token ``last`` (K,), once the
    slot's cache is gathered from ``parent`` (K,), the slot of step t - 1 it continues. Returns every slot's hypothesis
    (ids without <s> and </s>) and its score log p / lp; ties go to the lower slot and token, as in the page."""
    K, V = beam_size, vocab_size
    logp_sum = np.full(K, -np.inf, dtype=np.float32)  # log p(prefix | x); at the start only slot 0 holds one
    logp_sum[0] = 0.0
    lengths = np.zeros(K, dtype=np.int64)  # |y| with </s>
    ended = np.isinf(logp_sum)
    tokens = [[BOS] for _ in range(K)]
    parent = np.arange(K, dtype=np.int64)
    for t in range(limit):
        logp = step(t, np.array([row[-1] for row in tokens], dtype=np.int64), parent)
        cand = np.where(ended[:, None], np.float32(-np.inf), logp_sum[:, None] + logp)  # (K, V)
        cand[:, pad] = np.where(ended, logp_sum, -np.inf)  # an ended hypothesis competes as itself
        ranked = (cand / lp[np.where(ended, lengths, t + 1)][:, None]).reshape(-1)
        idx = np.argsort(-ranked, kind="stable")[:K]
        parent, token = idx // V, idx % V
        was_ended = ended[parent]
        logp_sum = cand.reshape(-1)[idx]
        lengths = np.where(was_ended, lengths[parent], t + 1)
        ended = was_ended | (token == EOS) | (t + 1 >= limit) | np.isinf(logp_sum)
        tokens = [tokens[p] + [int(y)] for p, y in zip(parent, token)]
        if ended.all():
            break
    return [_strip(row, pad) for row in tokens], logp_sum / lp[lengths]


class Translator:
    """Beam search over the ONNX graphs with ONNX Runtime (CPU), one sentence at a time, as web/beam.js does."""

    def __init__(self, encoder: Path, decoder: Path, config: dict, threads: int = 1, alpha: float = 0.6):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        options.add_session_config_entry("session.disable_quant_qdq", "1")  # fold int8 weights into fp32 at load
        self.encoder = ort.InferenceSession(str(encoder), options, providers=["CPUExecutionProvider"])
        self.decoder = ort.InferenceSession(str(decoder), options, providers=["CPUExecutionProvider"])
        self.cached = "past_k" in {i.name for i in self.decoder.get_inputs()}
        self.config, self.alpha = config, alpha
        self.lp = length_penalties(config["max_len"], alpha)

    def encode(self, src: list[int]) -> dict:
        c = self.config
        if len(src) + 1 > c["max_len"]:
            raise ValueError(f"{len(src)} tokens plus </s> exceed the model's {c['max_len']} positions")
        names = [o.name for o in self.encoder.get_outputs()]
        return dict(zip(names, self.encoder.run(None, {"src": np.array([src + [EOS]], dtype=np.int64)})))

    def stepper(self, encoded: dict, rows: int, attention: list | None = None):
        """The ``step`` of beam_search for ``rows`` slots; ``attention``, if given, receives each step's
        (dec_self, cross) weights."""
        c = self.config
        cross = {k: np.repeat(encoded[k], rows, axis=1) for k in ("cross_k", "cross_v")}
        past = {k: np.zeros((c["N"], rows, c["h"], 0, c["d_k"]), np.float32) for k in ("past_k", "past_v")}
        tokens = [[BOS] for _ in range(rows)]

        def step(t, last, parent):
            nonlocal tokens
            tokens = [tokens[p] + [int(y)] for p, y in zip(parent, last)] if t else tokens
            if not self.cached:
                return self.decoder.run(["logp"], {"tokens": np.array(tokens, dtype=np.int64), **cross})[0]
            feeds = {"token": last, "step": np.array([t], dtype=np.int64), "parent": parent, **past, **cross}
            logp, past["past_k"], past["past_v"], dec_self, cross_w = self.decoder.run(None, feeds)
            if attention is not None:
                attention.append((dec_self, cross_w))
            return logp

        return step

    def beam_search(self, src: list[int], beam_size: int = 4) -> tuple[list[int], dict]:
        """The best hypothesis (ids without <s> and </s>) of aiayn.decoding.beam_search for one source (ids without
        </s>), and every slot's candidate {"ids", "score"} when the search ended."""
        if not src:
            return [], {"candidates": []}
        c = self.config
        step = self.stepper(self.encode(src), beam_size)
        hyps, scores = beam_search(step, output_limit(len(src), c["max_len"]), self.lp, c["vocab_size"], beam_size)
        best = int(np.argmax(scores))
        return hyps[best], {"candidates": [{"ids": h, "score": float(s)} for h, s in zip(hyps, scores)]}

    def translate_ids(self, ids, beam_size: int = 4) -> list[list[int]]:
        return [self.beam_search(list(x), beam_size)[0] for x in ids]

    def attention(self, src: list[int], hyp: list[int]) -> dict:
        """The weights while the model reads src and re-reads <s> hyp, as Pretrained.attention gives them:
        enc_self (N, h, S, S), dec_self (N, h, T, T) (zero above the diagonal), cross (N, h, T, S)."""
        encoded = self.encode(src)
        weights: list = []
        step = self.stepper(encoded, 1, weights)
        tokens = ([BOS] + list(hyp))[: self.config["max_len"]]  # an output that ran to the limit has no </s>
        for t, y in enumerate(tokens):
            step(t, np.array([y], dtype=np.int64), np.zeros(1, dtype=np.int64))
        T = len(tokens)
        dec_self = np.zeros((self.config["N"], self.config["h"], T, T), np.float32)
        for t, (w, _) in enumerate(weights):
            dec_self[:, :, t, : t + 1] = w[:, 0]
        cross = np.stack([w[:, 0] for _, w in weights], axis=2)
        return {"enc_self": encoded["enc_self"][:, 0], "dec_self": dec_self, "cross": cross}


def _strip(ids, pad: int) -> list[int]:
    """aiayn.decoding.strip_specials: the ids before the first </s>, without <s> and <pad>."""
    out = []
    for i in ids:
        if i == EOS:
            break
        if i not in (pad, BOS):
            out.append(int(i))
    return out


def model_config(model) -> dict:
    c = model.config
    return {
        "N": c.N,
        "h": c.h,
        "d_model": c.d_model,
        "d_k": c.d_k or c.d_model // c.h,
        "vocab_size": c.vocab_size,
        "max_len": c.max_len,
        "pad_id": c.pad_id,
    }


# ---------------------------------------------------------------------------------------------------- quantisation
def quantize_weights(src: Path, dst: Path, min_elements: int = 16384) -> Path:
    """Weight-only int8: every large 2-D weight stored as int8 with one fp32 scale per output unit (symmetric) and
    a DequantizeLinear node giving back the fp32 weight; activations stay fp32.

    The tied table (§3.4) is one tensor in the decoder (Gather and the pre-softmax Gemm read it), scaled per token.
    ONNX Runtime folds the DequantizeLinear nodes into fp32 weights when the session loads if its option
    session.disable_quant_qdq is "1" (both the Python and the page's sessions set it); otherwise it dequantizes
    at every run."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    matmul_b = {n.input[1] for n in graph.node if n.op_type == "MatMul"}
    kept, dequant = [], []
    for init in graph.initializer:
        w = numpy_helper.to_array(init)
        if w.dtype != np.float32 or w.ndim != 2 or w.size < min_elements:
            kept.append(init)
            continue
        axis = 1 if init.name in matmul_b else 0  # MatMul's B is (in, out); the table and Gemm's B are (out, in)
        scale = np.abs(w).max(axis=1 - axis) / 127.0
        scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
        shape = (1, -1) if axis == 1 else (-1, 1)
        q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8)
        kept += [numpy_helper.from_array(q, init.name + "_int8"), numpy_helper.from_array(scale, init.name + "_scale")]
        dequant.append(
            helper.make_node("DequantizeLinear", [init.name + "_int8", init.name + "_scale"], [init.name], axis=axis)
        )
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = dequant + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    return dst


def share_weights(models: dict, folder: Path, location: str) -> int:
    """Store the initializers that several graphs hold byte for byte (the tied table, the sinusoids) once, in
    folder/location, as external data of each graph (ONNX Runtime Web takes the file once for both sessions).
    ``models``: file name -> ModelProto, saved into folder. Returns the shared file's size."""
    import onnx
    from onnx import numpy_helper

    def key(t):
        return t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes()

    counts: dict = {}
    for model in models.values():
        for k in {key(t) for t in model.graph.initializer}:
            counts[k] = counts.get(k, 0) + 1
    blob, offsets = bytearray(), {}
    for k, n in counts.items():
        if n > 1 and len(k[2]) >= 4096:
            blob.extend(b"\0" * (-len(blob) % 4096))  # page-aligned, as ONNX Runtime maps large tensors
            offsets[k] = len(blob)
            blob.extend(k[2])
    for file, model in models.items():
        for t in model.graph.initializer:
            k = key(t)
            if k in offsets:
                t.ClearField("raw_data")
                for field in ("float_data", "int32_data", "int64_data", "double_data"):
                    t.ClearField(field)
                t.data_location = onnx.TensorProto.EXTERNAL
                del t.external_data[:]
                for name, value in (("location", location), ("offset", offsets[k]), ("length", len(k[2]))):
                    t.external_data.add(key=name, value=str(value))
        onnx.save(model, str(folder / file))
    (folder / location).write_bytes(bytes(blob))
    return len(blob)


def export_direction(name: str, out: Path, precision: str = "int8", prefix: bool = False) -> dict:
    """Write out/<name>.encoder.onnx, .decoder.onnx (and .prefix.onnx if ``prefix``) and the weights they share,
    <name>.shared.bin; returns the manifest entry of the direction."""
    import onnx

    from aiayn import pretrained

    shipped = pretrained.load(name)
    kinds = ["encoder", "decoder"] + (["prefix"] if prefix else [])
    with tempfile.TemporaryDirectory() as tmp:
        models = {}
        for kind in kinds:
            path = export_graph(shipped.model, kind, Path(tmp) / f"{kind}.onnx")
            if precision == "int8":
                path = quantize_weights(path, Path(tmp) / f"{kind}.int8.onnx")
            models[f"{name}.{kind}.onnx"] = onnx.load(str(path))
        out.mkdir(parents=True, exist_ok=True)
        share_weights(models, out, f"{name}.shared.bin")
    entry = pretrained.registry()[name]
    return {
        "direction": shipped.direction,
        "src_lang": shipped.direction.split("-")[0],
        "tgt_lang": shipped.direction.split("-")[1],
        "precision": precision,
        "files": {kind: f"{name}.{kind}.onnx" for kind in kinds} | {"shared": f"{name}.shared.bin"},
        "config": model_config(shipped.model),
        "source": {"file": entry["file"], "sha256": entry["sha256"], "bleu": entry["bleu"]},
        "tokenizer": _tokenizer_file(shipped.tokenizer),
        "_tokenizer": shipped.tokenizer,
    }


def _tokenizer_file(tokenizer) -> str:
    content = json.dumps({"pieces": tokenizer.pieces, "merges": [list(m) for m in tokenizer.merges]})
    return f"bpe-{hashlib.sha256(content.encode()).hexdigest()[:12]}.json"


# ------------------------------------------------------------------------------------------------- the word rules
_CLASSES: dict = {}


def _python_class(letter: str) -> str:
    """The code points Python's re gives \\d, \\w or \\s (str patterns), as JavaScript class ranges."""
    if letter not in _CLASSES:
        test = re.compile("\\" + letter)
        ranges, start = [], None
        for c in range(0x110001):
            inside = c < 0x110000 and test.match(chr(c)) is not None
            if inside and start is None:
                start = c
            elif not inside and start is not None:
                ranges.append(f"\\u{{{start:x}}}" + (f"-\\u{{{c - 1:x}}}" if c - 1 > start else ""))
                start = None
        _CLASSES[letter] = "".join(ranges)
    return _CLASSES[letter]


def js_regex(pattern: str) -> str:
    """A Python ``re`` pattern as JavaScript source for ``new RegExp(source, "u")`` that matches the same strings:
    Python's Unicode \\d, \\w and \\s spelt out, ``.`` without \\n only, ``$`` also before a final \\n, and escapes
    written as the "u" flag accepts them. Raises ValueError on what it does not translate."""
    out, i, in_class, class_start = [], 0, False, False
    if pattern.startswith("(?u)"):
        i = 4
    syntax = set("^$\\.*+?()[]{}|/")
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            e = pattern[i + 1]
            i += 2
            if e in "uUx":
                width = {"u": 4, "U": 8, "x": 2}[e]
                out.append(f"\\u{{{int(pattern[i : i + width], 16):x}}}")
                i += width
            elif e in "dws":
                out.append(_python_class(e) if in_class else f"[{_python_class(e)}]")
            elif e in "DWS":
                if in_class:
                    raise ValueError(f"\\{e} inside a class at {i}")
                out.append(f"[^{_python_class(e.lower())}]")
            elif e.isalnum():
                raise ValueError(f"unsupported escape \\{e} at {i}")
            else:
                out.append("\\" + e if e in syntax or e == "-" else e)
            class_start = False
            continue
        if in_class:
            if c == "]" and not class_start:
                in_class = False
                out.append("]")
            elif c == "[" or (c == "]" and class_start):
                out.append("\\" + c)
            elif c == "^" and class_start and out[-1] == "[":
                out.append("^")
                i += 1
                continue
            else:
                out.append(c)
            class_start = False
            i += 1
            continue
        if c == "[":
            in_class, class_start = True, True
            out.append("[")
        elif c == ".":
            out.append("[^\\n]")
        elif c == "$":
            out.append("(?=\\n?$)")
        elif c == "{":
            quantifier = re.match(r"\{\d+(,\d*)?\}", pattern[i:])
            if quantifier:
                out.append(quantifier.group())
                i += len(quantifier.group())
                continue
            out.append("\\{")
        elif c == "}":
            out.append("\\}")
        elif c == "(" and pattern.startswith("(?", i) and not re.match(r"\(\?(:|=|!|<=|<!)", pattern[i:]):
            raise ValueError(f"unsupported group at {i}: {pattern[i : i + 6]}")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def spacy_rules(lang: str) -> dict:
    """What web/tokenizer.js needs to split words as spacy.blank(lang).tokenizer does: the prefix, suffix and infix
    patterns, token_match and url_match (as JavaScript sources), the special cases, and for the special cases that
    hold affixes the pieces they are found as (spaCy's second pass; tokenised without special cases)."""
    import spacy
    from spacy.attrs import ORTH
    from spacy.tokenizer import Tokenizer as SpacyTokenizer

    t = spacy.blank(lang).tokenizer

    def source(f):
        return None if f is None else js_regex(f.__self__.pattern)

    rules = {text: [piece[ORTH] for piece in pieces] for text, pieces in t.rules.items()}
    plain = SpacyTokenizer(
        t.vocab,
        rules={},
        prefix_search=t.prefix_search,
        suffix_search=t.suffix_search,
        infix_finditer=t.infix_finditer,
        token_match=t.token_match,
        url_match=t.url_match,
    )

    def affixed(text):  # spaCy adds these to its special-case matcher (faster_heuristics)
        pre, suf = t.prefix_search(text), t.suffix_search(text)
        return (
            bool(pre and pre.end() > pre.start())
            or bool(suf and suf.end() > suf.start())
            or " " in text
            or bool(list(t.infix_finditer(text)))
        )

    if not t.faster_heuristics:
        raise ValueError("web/tokenizer.js follows spaCy's faster_heuristics=True")
    return {
        "spacy": spacy.__version__,
        "prefix": source(t.prefix_search),
        "suffix": source(t.suffix_search),
        "infix": source(t.infix_finditer),
        "token_match": source(t.token_match),
        "url_match": source(t.url_match),
        "rules": rules,
        "matched": {text: [tok.text for tok in plain(text)] for text in rules if affixed(text)},
    }


def word_rules() -> dict:
    """The word rules of both languages, and the characters Python's str.isspace() accepts (spaCy's split)."""
    return {
        "format": FORMAT,
        "isspace": [c for c in range(0x110000) if chr(c).isspace()],
        "langs": {lang: spacy_rules(lang) for lang in ("en", "de")},
    }


# ---------------------------------------------------------------------------------------------------------- export
WEB = ROOT / "web"
RUNTIME = ROOT / "node_modules" / "onnxruntime-web" / "dist"  # `npm ci` puts it there (package-lock.json pins it)
RUNTIME_FILES = ("ort.wasm.bundle.min.mjs", "ort-wasm-simd-threaded.wasm")  # WebAssembly only, one thread
EXAMPLES = {"en": "A black dog is running through the snow.", "de": "Ein schwarzer Hund rennt durch den Schnee."}


def stage_page(out: Path) -> None:
    """The page's scripts and style (web/) and ONNX Runtime Web's files, into out/web and out/ort."""
    if not all((RUNTIME / f).is_file() for f in RUNTIME_FILES):
        raise SystemExit(f"ONNX Runtime Web is not in {RUNTIME}: run `npm ci` in {ROOT} first")
    for folder, files in (
        ("ort", [RUNTIME / f for f in RUNTIME_FILES]),
        ("web", sorted([*WEB.glob("*.js"), *WEB.glob("*.css")])),
    ):
        (out / folder).mkdir(parents=True, exist_ok=True)
        for file in files:
            shutil.copyfile(file, out / folder / file.name)


def compress(out: Path, files) -> dict:
    """A gzip copy (file.gz) beside each file the page fetches, which the page unpacks with DecompressionStream where
    the browser has it, so that what crosses the wire is the gzip size on any static host.
    Returns {file: {"bytes", "gzip"}}."""
    sizes = {}
    for file in files:
        raw = (out / file).read_bytes()
        packed = gzip.compress(raw, compresslevel=9, mtime=0)
        (out / f"{file}.gz").write_bytes(packed)
        sizes[file] = {"bytes": len(raw), "gzip": len(packed)}
    return sizes


def stored_example(name: str, entry: dict, out: Path, tokenizer) -> dict:
    """One translation with its candidates and attention, made in Python over the exported graphs: what the page
    shows where WebAssembly is missing."""
    files, text = entry["files"], EXAMPLES[entry["src_lang"]]
    tr = Translator(out / files["encoder"], out / files["decoder"], entry["config"])
    src = tokenizer.encode(text, entry["src_lang"])
    hyp, extra = tr.beam_search(src)
    weights = tr.attention(src, hyp)
    T = len(hyp) + 1

    def rows(x, ragged=False):  # [layer][head][row] -> list, 3 decimals; dec_self without its zeros above the diagonal
        return [[[np.round(r[: i + 1 if ragged else None], 3).tolist() for i, r in enumerate(a)] for a in n] for n in x]

    return {
        "name": name,
        "text": text,
        "translation": tokenizer.decode(hyp),
        "candidates": [
            {"text": tokenizer.decode(c["ids"]), "score": c["score"], "best": c["ids"] == hyp}
            for c in extra["candidates"]
        ],
        "srcPieces": [tokenizer.pieces[i] for i in src + [EOS]],
        "tgtPieces": [tokenizer.pieces[i] for i in [BOS] + hyp],
        "encSelf": rows(weights["enc_self"]),
        "decSelf": rows(weights["dec_self"][:, :, :T, :T], ragged=True),
        "cross": rows(weights["cross"]),
    }


def figures(models: dict, sizes: dict) -> dict:
    """The numbers the page quotes, none typed by hand: the decoding settings, each model's BLEU
    (aiayn/pretrained.json), the megabytes a direction and the runtime take over the wire, the longest input, and what
    results/browser_parity.json and results/browser_speed.json hold, where they exist."""
    from aiayn import pretrained

    def megabytes(files):
        return sum(sizes[f]["gzip"] if f in sizes else (RUNTIME / Path(f).name).stat().st_size for f in files) / 1e6

    found = {
        "decoding": {"beam_size": 4, "alpha": 0.6},
        "bleu": {n: e["bleu"]["test2016"]["sacrebleu"] for n, e in pretrained.registry().items() if n in models},
        "wire": {name: megabytes(e["files"].values()) for name, e in models.items()},
        "max_pieces": min(e["config"]["max_len"] for e in models.values()) - 1,
    }
    found["wire"]["runtime"] = megabytes([f"ort/{f}" for f in RUNTIME_FILES])
    for key in ("browser_parity", "browser_speed"):
        path = ROOT / "results" / f"{key}.json"
        if path.is_file():
            report = json.loads(path.read_text(encoding="utf-8"))
            found[key] = _summary(report) | {"device": report["provenance"]["cpu"]}
    return found


def _summary(report):
    """A report without its long lists (the sentences that differ, every run, the files), for the manifest."""
    if isinstance(report, dict):
        return {k: _summary(v) for k, v in report.items() if k not in ("differ", "runs", "sizes", "provenance")}
    return report


def export(out: Path, names=NAMES, precision: str = "int8") -> dict:
    """Everything the page loads, into ``out``: per direction the graphs and their shared weights; the BPE, words.json
    (spaCy's rules), example.json (a stored translation), ONNX Runtime Web and the page's scripts; and manifest.json,
    which names them all with their sizes and the figures the page quotes."""
    out.mkdir(parents=True, exist_ok=True)
    stage_page(out)
    models, examples = {}, {}
    for name in names:
        entry = export_direction(name, out, precision)
        tokenizer = entry.pop("_tokenizer")
        bpe = {"pieces": tokenizer.pieces, "merges": [list(m) for m in tokenizer.merges]}
        (out / entry["tokenizer"]).write_text(json.dumps(bpe, ensure_ascii=False), encoding="utf-8")
        examples[name] = stored_example(name, entry, out, tokenizer)
        models[name] = entry
    (out / "words.json").write_text(json.dumps(word_rules(), ensure_ascii=False), encoding="utf-8")
    (out / "example.json").write_text(json.dumps(examples, ensure_ascii=False), encoding="utf-8")
    fetched = ["words.json", "example.json", *{e["tokenizer"] for e in models.values()}, f"ort/{RUNTIME_FILES[1]}"]
    fetched += [f for e in models.values() for f in e["files"].values()]
    max_len = max(e["config"]["max_len"] for e in models.values())
    manifest = {
        "format": FORMAT,
        "models": models,
        "words": "words.json",
        "example": "example.json",
        "examples": {name: EXAMPLES[entry["src_lang"]] for name, entry in models.items()},
        "runtime": {"module": f"ort/{RUNTIME_FILES[0]}", "wasm": f"ort/{RUNTIME_FILES[1]}", "version": _ort_web()},
        "special_ids": {"pad": 0, "bos": BOS, "eos": EOS, "unk": 3, "bytes": [4, 259]},
        "decoding": {
            "beam_size": 4,
            "alpha": 0.6,
            "extra_len": EXTRA_LEN,
            "length_penalty": length_penalties(max_len, 0.6).tolist(),
        },
        "session_options": {"session.disable_quant_qdq": "1"},
        "sizes": compress(out, sorted(fetched)),
    }
    manifest["figures"] = figures(models, manifest["sizes"])
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return manifest


def _ort_web() -> str:
    return json.loads((RUNTIME.parent / "package.json").read_text(encoding="utf-8"))["version"]


# ------------------------------------------------------------------------------------------------------ in Chromium
PAGE = (  # the page alone, at the root of an export folder (the book's page embeds the same element and script)
    '<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">'
    '<link rel="stylesheet" href="web/style.css"></head><body><div id="try-model" class="try-model"></div>'
    '<script type="module" src="web/page.js"></script></body></html>\n'
)
STATES = ("ready", "stored", "error", "missing")  # where the page stops after loading (div#try-model's data-state)


def chromium() -> str | None:
    """Debian's Chromium (or another on PATH), which Playwright drives: Playwright's own download is not needed."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".js": "text/javascript",
        ".mjs": "text/javascript",
        ".wasm": "application/wasm",
        ".json": "application/json",
    }

    def log_message(self, *args):  # quiet
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a page closed while a file was on its way: not an error
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serve(folder: Path):
    """``folder`` over HTTP on 127.0.0.1 from a thread, as a static host serves it; yields its URL."""
    server = _Server(("127.0.0.1", 0), functools.partial(_Handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def browser_page(width: int = 1000):
    """A page of headless Chromium through Playwright, which refuses every request beyond 127.0.0.1 and keeps the
    page's uncaught errors in ``page.errors``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.route(lambda url: not url.startswith("http://127.0.0.1"), lambda route: route.abort())
            page.errors = []
            page.on("pageerror", lambda err: page.errors.append(str(err)))
            yield page
        finally:
            browser.close()


def wait_loaded(page, timeout_s: float = 120) -> str:
    """The page's state once it stopped loading: "ready", or "stored", "error", "missing" (see STATES)."""
    page.wait_for_function(
        f"() => {json.dumps(list(STATES))}.includes(document.getElementById('try-model')?.dataset.state)",
        timeout=timeout_s * 1000,
    )
    return page.eval_on_selector("#try-model", "e => e.dataset.state")


def holds_export(site: Path, out: Path = DEFAULT_OUT) -> bool:
    """Whether a built site holds the export in ``out`` as it is now (a site built before the last export holds an
    older page)."""
    copy = site / "_static" / "model"
    files = [out / "manifest.json", *(out / "web").glob("*")] if (out / "manifest.json").is_file() else []
    return bool(files) and all(
        (copy / f.relative_to(out)).is_file() and (copy / f.relative_to(out)).read_bytes() == f.read_bytes()
        for f in files
    )


# each text through the page's translator (window.tryModel, web/page.js), without drawing; an error as {error}
TRANSLATE_ALL = """async ({name, texts}) => {
  const app = globalThis.tryModel;
  await app.model(name);
  const out = [];
  const start = performance.now();
  for (const text of texts) {
    try {
      const r = await app.translate(text, name);
      out.push({translation: r.translation, hyp: r.hyp});
    } catch (err) { out.push({error: String(err.message)}); }
  }
  return {out, seconds: (performance.now() - start) / 1000};
}"""
TOKENIZE_ALL = """({name, lang, texts}) => {
  const tokenizer = globalThis.tryModel.translator.models[name].tokenizer;
  return texts.map((text) => tokenizer.encode(text, lang));
}"""


def js_run(folder: Path, script: str, args: dict) -> dict:
    """Run ``script`` with ``args`` in the page over the export in folder (PAGE at its root), served locally."""
    (folder / "index.html").write_text(PAGE, encoding="utf-8")
    with serve(folder) as url, browser_page() as page:
        page.goto(url + "index.html")
        state = wait_loaded(page)
        if state != "ready":
            raise RuntimeError(f"the page did not load its model ({state}): {page.inner_text('#try-model')[:300]}")
        return page.evaluate(script, args)


# ---------------------------------------------------------------------------------------------------------- parity
def _step_time(translator: Translator, S: int = 16, t: int = 12, repeats: int = 200) -> float:
    """Median seconds of one decoder step with K = 4 rows at position t for a source of S tokens."""
    c = translator.config
    rng = np.random.default_rng(0)
    cross = rng.standard_normal((c["N"], 4, c["h"], S, c["d_k"])).astype(np.float32)
    if translator.cached:
        past = rng.standard_normal((c["N"], 4, c["h"], t, c["d_k"])).astype(np.float32)
        feeds = {"token": np.full(4, 9), "step": np.array([t]), "parent": np.arange(4), "past_k": past, "past_v": past}
    else:
        feeds = {"tokens": np.full((4, t + 1), 9)}
    feeds |= {"cross_k": cross, "cross_v": cross}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        translator.decoder.run(None, feeds)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def cached_or_recomputed(name: str, ids: list, folder: Path) -> dict:
    """Seconds of beam search with the decoder step that caches keys and values and with one that recomputes the
    prefix (fp32, one thread): why the export ships the first."""
    entry = export_direction(name, folder, "fp32", prefix=True)
    files, timing = entry["files"], {"sentences": len(ids), "threads": 1}
    for label, graph in (("cached", "decoder"), ("recomputed", "prefix")):
        tr = Translator(folder / files["encoder"], folder / files[graph], entry["config"], threads=1)
        start = time.perf_counter()
        tr.translate_ids(ids)
        timing[f"{label}_beam_seconds"] = time.perf_counter() - start
        timing[f"{label}_step_seconds_t12"] = _step_time(tr)
    timing["chosen"] = min(("cached", "recomputed"), key=lambda k: timing[f"{k}_beam_seconds"])
    return timing


def _compare(hyps: list, reference: list, refs: list, lang: str, seconds: float, label: str) -> dict:
    """How many of ``hyps`` equal pretrained.translate's ``reference``, the BLEU of hyps, and the first that differ."""
    from aiayn.runs.scoring import score

    same = sum(a == b for a, b in zip(hyps, reference))
    return {
        "identical": same / len(hyps),
        "identical_count": same,
        "bleu": _bleu(score(hyps, refs, lang)),
        "seconds": seconds,
        "differ": [{"i": i, "pytorch": a, label: b} for i, (a, b) in enumerate(zip(reference, hyps)) if a != b][:20],
    }


def parity_direction(name: str, folders: dict, limit: int | None, js: bool, timing_sentences: int) -> dict:
    """Test 2016 in one direction: pretrained.translate, then the exports in ``folders`` (precision -> folder) with
    ONNX Runtime in Python and, if ``js``, in the page in Chromium."""
    from aiayn import data, pretrained
    from aiayn.runs.scoring import score

    shipped = pretrained.load(name)
    src_lang, tgt_lang = shipped.direction.split("-")
    pairs = data.load("test2016", src_lang, tgt_lang)[:limit]
    sources, refs = [s for s, _ in pairs], [r for _, r in pairs]
    ids = [shipped.tokenizer.encode(s, src_lang) for s in sources]
    start = time.perf_counter()
    torch_hyps = shipped.translate(sources)
    r = {"sentences": len(pairs), "pytorch": {"bleu": _bleu(score(torch_hyps, refs, tgt_lang))}}
    r["pytorch"]["seconds"] = time.perf_counter() - start
    for precision, folder in folders.items():
        entry = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["models"][name]
        tr = Translator(folder / entry["files"]["encoder"], folder / entry["files"]["decoder"], entry["config"], 1)
        start = time.perf_counter()
        hyps = [shipped.tokenizer.decode(h) for h in tr.translate_ids(ids)]
        r[f"onnx_{precision}"] = _compare(hyps, torch_hyps, refs, tgt_lang, time.perf_counter() - start, "onnx")
        r[f"onnx_{precision}"]["threads"] = 1
        r[f"onnx_{precision}"]["files"] = {f: (folder / f).stat().st_size for f in entry["files"].values()}
        if js:
            out = js_run(folder, TRANSLATE_ALL, {"name": name, "texts": sources})
            page = [o.get("translation", "") for o in out["out"]]
            r[f"js_{precision}"] = _compare(page, torch_hyps, refs, tgt_lang, out["seconds"], "page")
            r[f"js_{precision}"]["same_as_onnx_python"] = sum(a == b for a, b in zip(page, hyps)) / len(hyps)
    r["bleu_cost_int8"] = r["onnx_fp32"]["bleu"]["sacrebleu"] - r["onnx_int8"]["bleu"]["sacrebleu"]
    with tempfile.TemporaryDirectory() as tmp:
        r["decoder_step"] = cached_or_recomputed(name, ids[:timing_sentences], Path(tmp))
    return r


def tokenizer_parity(folder: Path) -> dict:
    """The page's pieces against aiayn.tokenization's for every sentence of val and test 2016, both languages."""
    from aiayn import data, pretrained

    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    name = next(iter(manifest["models"]))
    tokenizer = pretrained.load(name).tokenizer
    report = {"splits": ["val", "test2016"], "sentences": 0, "identical_count": 0, "differ": []}
    for i, lang in enumerate(("en", "de")):
        texts = [pair[i] for split in report["splits"] for pair in data.load(split)]
        page = js_run(folder, TOKENIZE_ALL, {"name": name, "lang": lang, "texts": texts})
        python = [tokenizer.encode(t, lang) for t in texts]
        report["sentences"] += len(texts)
        report["identical_count"] += sum(a == b for a, b in zip(page, python))
        report["differ"] += [{"lang": lang, "text": t} for t, a, b in zip(texts, page, python) if a != b][:20]
    report["identical"] = report["identical_count"] / report["sentences"]
    return report


def parity(names=NAMES, limit: int | None = None, js: bool = True, timing_sentences: int = 100) -> dict:
    """Test 2016 through pretrained.translate (PyTorch), and through the exported graphs (fp32 and int8) with ONNX
    Runtime in Python and in the page (Chromium): the share of identical translations, BLEU, file sizes, the page's
    tokenizer on val and test 2016, and cached against recomputed decoding."""
    import onnxruntime

    report = {"split": "test2016", "beam_size": 4, "alpha": 0.6}
    with tempfile.TemporaryDirectory() as tmp:
        folders = {precision: Path(tmp) / precision for precision in ("fp32", "int8")}
        for precision, folder in folders.items():
            export(folder, names, precision)
        if js:
            report["tokenizer"] = tokenizer_parity(folders["int8"])
        report["directions"] = {name: parity_direction(name, folders, limit, js, timing_sentences) for name in names}
        report["sizes"] = json.loads((folders["int8"] / "manifest.json").read_text(encoding="utf-8"))["sizes"]
    report["versions"] = {"onnxruntime": onnxruntime.__version__, "onnxruntime_web": _ort_web(), **_versions()}
    return report


def _versions() -> dict:
    import onnx
    import onnxscript

    return {"onnx": onnx.__version__, "onnxscript": onnxscript.__version__, "torch": torch.__version__}


def _bleu(s: dict) -> dict:
    return {
        "sacrebleu": s["sacrebleu"]["score"],
        "tok_lc": s["tok_lc"]["score"],
        "signature": s["sacrebleu"]["signature"],
    }


def write(path: Path, report: dict, argv, wall_s: float) -> None:
    """benchmarks/_common.write's record: the report with its provenance (device, versions, commit, command) and
    the run's wall time."""
    from aiayn.runs.provenance import provenance

    report["provenance"] = provenance(
        " ".join(map(shlex.quote, ["python", "-m", "aiayn.browser", *argv])), torch.device("cpu")
    )
    report["provenance"]["wall_s"] = wall_s
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {path}")


# -------------------------------------------------------------------------------------------------------- fixtures
EDGE_CASES = (
    "  leading, trailing and  double spaces  ",
    "tabs\tand\nnewlines\r\nand\u00a0no-break\u2009thin spaces",
    "Don't stop: it's 5 o'clock, isn't it?!",
    "(Hello) [world] {x} <y>",
    "Mail someone@example.com or see https://example.org/a/b?q=1&r=2.",
    "U.S.A. at 10 a.m., Mr. Smith's dog; the dogs' bowls",
    "3.5km, 10$ and $10, €20 or 20€, 50% at 10:30",
    "rock'n'roll ...wow... well--known 5-year-old a/b C++ C#",
    "Hi :) ;-) <3 :-( xD",
    "naïve café – über Straße — „Zitat“ «guillemets» ‚so‘",
    "z.B. usw. d.h. Nr. 5 bzw. ca. 3 Std. am 3. Okt.",
    "emoji 😀🐕 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, ÄÖÜ äöü ß, 日本語",
    "'quoted' \"quoted\" ``double'' ''",
    "",
    "   ",
)


def tokenizer_cases(tokenizer) -> dict:
    """aiayn.tokenization's words and ids of every sentence of val and test 2016 (and EDGE_CASES), per language."""
    from aiayn import data
    from aiayn.tokenization import pretokenize

    cases = {}
    for i, lang in enumerate(("en", "de")):
        texts = [pair[i] for split in ("val", "test2016") for pair in data.load(split)] + list(EDGE_CASES)
        cases[lang] = [{"text": s, "words": pretokenize(s, lang), "ids": tokenizer.encode(s, lang)} for s in texts]
    return cases


def toy_beams(count: int = 40, V: int = 9, seed: int = 0) -> list[dict]:
    """Beam searches over made-up log-probabilities that depend on the newest token and the step (table[y][t], -inf
    as null), coarse enough to tie: web/beam.js must pick the same slots as beam_search, ties included."""
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(count):
        K, limit, alpha = int(rng.choice([1, 2, 4])), int(rng.integers(1, 9)), float(rng.choice([0.0, 0.6, 1.0]))
        logits = np.round(rng.normal(0, 2, (V, limit, V)), 0).astype(np.float32)
        logits[..., [0, BOS]] = -np.inf
        if i % 4 == 0:
            logits[..., EOS] = -np.inf  # never ends: the limit ends it
        table = torch.from_numpy(logits).log_softmax(-1).numpy()
        lp = length_penalties(limit, alpha)
        hyps, scores = beam_search(lambda t, last, parent: table[last, t], limit, lp, V, K)
        cases.append(
            {
                "K": K,
                "V": V,
                "limit": limit,
                "lp": lp.tolist(),
                "table": [[[None if np.isinf(x) else float(x) for x in row] for row in by_t] for by_t in table],
                "hyps": hyps,
                "scores": [None if np.isinf(s) else float(s) for s in scores],
            }
        )
    return cases


def beam_cases(name: str, entry: dict, model_dir: Path, sample: int) -> list[dict]:
    """The Python beam search over model_dir's graphs for a stored example and `sample` sentences of test 2016."""
    from aiayn import data, pretrained

    shipped = pretrained.load(name)
    tok, files, src_lang = shipped.tokenizer, entry["files"], entry["src_lang"]
    tr = Translator(model_dir / files["encoder"], model_dir / files["decoder"], entry["config"])
    texts = [EXAMPLES[src_lang]] + [s for s, _ in data.load("test2016", src_lang, entry["tgt_lang"])[:sample]]
    cases = []
    for text in texts:
        src = tok.encode(text, src_lang)
        hyp, extra = tr.beam_search(src)
        cases.append(
            {
                "text": text,
                "src": src,
                "hyp": hyp,
                "translation": tok.decode(hyp),
                "candidates": extra["candidates"],
            }
        )
    return cases


def fixtures(out: Path, model_dir: Path, sample: int = 25) -> None:
    """What web/test/ compares against (fixtures.json): tokenizer_cases, toy_beams, and beam_cases per direction of
    the export in model_dir (run `export` first)."""
    from aiayn import pretrained

    if not (model_dir / "manifest.json").is_file():
        raise SystemExit(f"no export in {model_dir}: run `python -m aiayn.browser export --out {model_dir}` first")
    manifest = json.loads((model_dir / "manifest.json").read_text(encoding="utf-8"))
    tokens = {}
    for name, entry in manifest["models"].items():
        if entry["tokenizer"] not in tokens:
            tokens[entry["tokenizer"]] = tokenizer_cases(pretrained.load(name).tokenizer)
    payload = {
        "format": FORMAT,
        "model_dir": str(model_dir.resolve()),
        "tokenizers": tokens,
        "toy_beams": toy_beams(),
        "beams": {name: beam_cases(name, entry, model_dir, sample) for name, entry in manifest["models"].items()},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "fixtures.json").write_text(json.dumps(payload, ensure_ascii=False), encoding="utf-8")
    print(f"wrote {out / 'fixtures.json'}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m aiayn.browser", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="the graphs, the word rules and the BPE, for the page")
    e.add_argument("--out", type=Path, default=DEFAULT_OUT)
    e.add_argument("--precision", choices=("int8", "fp32"), default="int8")
    e.add_argument("--names", nargs="+", default=list(NAMES))
    q = sub.add_parser("parity", help="ONNX Runtime against pretrained.translate on test 2016; sizes; timings")
    q.add_argument("--out", type=Path, default=ROOT / "results" / "browser_parity.json")
    q.add_argument("--names", nargs="+", default=list(NAMES))
    q.add_argument("--limit", type=int, default=None, help="the first LIMIT sentences only (a quick look)")
    q.add_argument("--no-js", action="store_true", help="Python's ONNX Runtime only, not the page in Chromium")
    f = sub.add_parser("fixtures", help="what `node --test web/test/` compares against")
    f.add_argument("--out", type=Path, default=ROOT / "web" / "test" / "fixtures")
    f.add_argument("--model-dir", type=Path, default=DEFAULT_OUT)
    f.add_argument("--sample", type=int, default=25)
    args = p.parse_args(argv)
    start = time.perf_counter()
    if args.command == "export":
        manifest = export(args.out, args.names, args.precision)
        for file, size in manifest["sizes"].items():
            print(f"{args.out / file}: {size['bytes'] / 1e6:.2f} MB, {size['gzip'] / 1e6:.2f} MB gzipped")
    elif args.command == "parity":
        report = parity(args.names, args.limit, not args.no_js)
        write(args.out, report, argv, time.perf_counter() - start)
    else:
        fixtures(args.out, args.model_dir, args.sample)
    return 0


if __name__ == "__main__":
    sys.exit(main())
