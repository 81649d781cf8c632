# Generated from book/11_decoding.ipynb by `python -m aiayn._export`. Edit the chapter, not this file.

# book/11_decoding.ipynb: Decoding is a search
"""§6.1: greedy and beam search (GNMT length penalty), batched, with an
incremental key/value cache; translate()."""
import contextlib
import math

import torch

# the tokenizer's special ids (§5.1): <pad> 0, <s> 1, </s> 2, <unk> 3
BOS, EOS = 1, 2


def output_limits(model, src, max_len: int | None = None) -> torch.Tensor:
    """Most output tokens per sentence (</s> included): input length + 50
    (§6.1), capped by the model's positions."""
    src_len = (src != model.config.pad_id).sum(1)  # (batch,)
    if max_len is None:
        limit = src_len + 50
    else:
        limit = torch.full_like(src_len, max_len)
    # T output tokens need the positions of <s> and T - 1 tokens
    return limit.clamp(1, model.config.max_len)


@contextlib.contextmanager
def eval_mode(model):
    """Decode without dropout and without gradients, then restore the
    model's training flag."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


# book/11_decoding.ipynb: Decoding is a search
def next_log_probs(model, tokens, memory, src_mask, cache=None):
    """log p(y_t | y_<t, x) for every prefix in ``tokens`` (rows, t), which
    start with <s>; -inf for <pad> and <s>.

    With a key/value cache only the newest token is fed (at position t - 1);
    without one the prefix is recomputed.
    """
    if cache is None:
        h = model.decode(tokens, memory, src_mask)[:, -1]  # (rows, d_model)
    else:
        h = model.decode(tokens[:, -1:], memory, src_mask, cache=cache,
                         start=tokens.size(1) - 1)[:, -1]
    logp = model.generator(h).float().log_softmax(-1)  # (rows, vocab)
    logp[:, [model.config.pad_id, BOS]] = -math.inf
    return logp


def strip_specials(ids, pad_id: int = 0) -> list[int]:
    """The token ids before the first </s>, without <s> and <pad>."""
    out = []
    for i in ids.tolist() if torch.is_tensor(ids) else ids:
        if i == EOS:
            break
        if i not in (pad_id, BOS):
            out.append(i)
    return out


# book/11_decoding.ipynb: Greedy decoding
def greedy_decode(model, src, max_len: int | None = None,
                  use_cache: bool = True):
    """Take the most probable token at every step. Returns token-id lists
    and their log-probabilities (batch,).

    ``src`` (batch, S) holds padded source ids; ``max_len`` replaces the
    limit of input length + 50.
    """
    with eval_mode(model):
        # (batch, S, d_model), (batch, 1, 1, S)
        memory, src_mask = model.encode(src)
        B, pad = src.size(0), model.config.pad_id
        limits = output_limits(model, src, max_len)  # (batch,)
        tokens = torch.full((B, 1), BOS, dtype=torch.long,
                            device=src.device)  # (batch, 1 + t)
        scores = torch.zeros(B, device=src.device)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)
        cache = model.new_cache() if use_cache else None
        for t in range(int(limits.max())):
            logp = next_log_probs(model, tokens, memory, src_mask, cache)
            best_logp, best = logp.max(-1)  # (batch,)
            best = best.masked_fill(done, pad)
            scores += best_logp.masked_fill(done, 0.0)
            tokens = torch.cat([tokens, best[:, None]], dim=1)
            done |= (best == EOS) | (t + 1 >= limits)
            if done.all():
                break
    return [strip_specials(row, pad) for row in tokens], scores


# book/11_decoding.ipynb: Beam search with a length penalty
def length_penalty(length, alpha: float):
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016), which §6.1 uses
    with α = 0.6."""
    return ((5.0 + length) / 6.0) ** alpha


# book/11_decoding.ipynb: Beam search with a length penalty
def reorder_cache(cache, rows) -> None:
    """Let every beam continue from its parent: gather the self-attention
    keys and values along dim 0.

    The cross-attention ("src") keys and values are equal for all beams of
    one sentence, so they stay as they are.
    """
    for layer in cache:
        for name, part in layer.items():
            if name != "src":
                for key, tensor in part.items():  # (batch * beam, h, len, d_k)
                    part[key] = tensor.index_select(0, rows)


# book/11_decoding.ipynb: Beam search with a length penalty
def beam_search(model, src, beam_size: int = 4, alpha: float = 0.6,
                max_len: int | None = None, use_cache: bool = True,
                trace: list | None = None):
    """§6.1: beam search ranked by log p(y|x) / lp(y), batched over the
    sentences of ``src`` (batch, S).

    Returns the best hypothesis of each sentence (token ids without <s> and
    </s>) and its score (batch,). A ``trace`` list, if given, receives the
    2K best candidates of the first sentence at every step (for pictures).
    """
    K, V, pad = beam_size, model.config.vocab_size, model.config.pad_id
    if K < 1:
        raise ValueError(f"beam_size must be at least 1, got {K}")
    with eval_mode(model):
        B, dev = src.size(0), src.device
        memory, src_mask = model.encode(src)
        memory = memory.repeat_interleave(K, 0)  # (B*K, S, d_model)
        src_mask = src_mask.repeat_interleave(K, 0)  # (B*K, 1, 1, S)
        limits = output_limits(model, src, max_len)[:, None]  # (B, 1)
        tokens = torch.full((B * K, 1), BOS, dtype=torch.long,
                            device=dev)  # (B*K, 1 + t)
        # log p(prefix | x) in each slot; at the start only slot 0 holds one
        logp_sum = torch.zeros(B, K, device=dev)
        logp_sum[:, 1:] = -math.inf
        # |y| in each slot, </s> included
        lengths = torch.zeros(B, K, dtype=torch.long, device=dev)
        # (B, K): reached </s> or the length limit (empty slots count as ended)
        ended = logp_sum.isinf()
        first_row = torch.arange(B, device=dev)[:, None] * K  # (B, 1)
        cache = model.new_cache() if use_cache else None
        for t in range(int(limits.max())):
            logp = next_log_probs(model, tokens, memory, src_mask, cache)
            logp = logp.view(B, K, V)
            # candidates: every extension of a live hypothesis, and each
            # ended one as itself (marked by <pad>)
            cand = torch.where(ended[..., None], -math.inf,
                               logp_sum[..., None] + logp)  # (B, K, V)
            cand[..., pad] = torch.where(ended, logp_sum, -math.inf)
            cand_len = torch.where(ended, lengths, t + 1)[..., None]
            ranked = cand / length_penalty(cand_len, alpha)  # (B, K, V)
            ranked = ranked.view(B, K * V)
            # (B, K): the K best candidates fill the slots
            idx = ranked.topk(K, dim=1).indices
            parent, token = idx // V, idx % V
            if trace is not None:
                shown = ranked[0].topk(min(2 * K, K * V)).indices
                trace.append({"parent": (shown // V).tolist(),
                              "token": (shown % V).tolist(),
                              "score": ranked[0, shown].tolist()})
            was_ended = ended.gather(1, parent)
            logp_sum = cand.view(B, K * V).gather(1, idx)
            lengths = torch.where(was_ended, lengths.gather(1, parent), t + 1)
            ended = (was_ended | (token == EOS) | (t + 1 >= limits)
                     | logp_sum.isinf())
            # (B*K,): the row each new hypothesis continues
            rows = (first_row + parent).view(-1)
            tokens = torch.cat([tokens.index_select(0, rows),
                                token.view(-1, 1)], dim=1)
            if cache is not None:
                reorder_cache(cache, rows)
            if ended.all():  # early termination: every slot has ended
                break
        scores = logp_sum / length_penalty(lengths, alpha)  # (B, K)
        best = scores.argmax(1)  # (B,)
        # (B, 1 + t)
        hyps = tokens.view(B, K, -1)[torch.arange(B, device=dev), best]
    best_scores = scores.gather(1, best[:, None]).squeeze(1)
    return [strip_specials(row, pad) for row in hyps], best_scores


# book/11_decoding.ipynb: Translating strings
def translate_ids(model, ids, beam_size: int = 4, alpha: float = 0.6,
                  batch_size: int = 64,
                  max_len: int | None = None) -> list[list[int]]:
    """Beam-search source id lists (without </s>) in batches sorted by
    length; returns each output's ids.

    An empty source gives an empty output without running the model; a
    source longer than ``model.config.max_len`` tokens (</s> included) raises
    ValueError. ``max_len`` replaces the output limit of input length + 50.
    """
    ids = [list(x) for x in ids]
    limit = model.config.max_len
    for i, x in enumerate(ids):
        if len(x) + 1 > limit:
            raise ValueError(
                f"sentence {i} has {len(x)} tokens plus </s>, but the model "
                f"has only {limit} positions (max_len); split the sentence, "
                f"or use a model built with a larger max_len")
    out = [[] for _ in ids]
    todo = sorted((i for i, x in enumerate(ids) if x),
                  key=lambda i: len(ids[i]))
    device = next(model.parameters()).device
    for start in range(0, len(todo), batch_size):
        batch = todo[start:start + batch_size]
        src = torch.full((len(batch), len(ids[batch[-1]]) + 1),
                         model.config.pad_id, dtype=torch.long)
        for row, i in enumerate(batch):
            src[row, : len(ids[i]) + 1] = torch.tensor(ids[i] + [EOS])
        hyps, _ = beam_search(model, src.to(device), beam_size, alpha,
                              max_len)
        for i, hyp in zip(batch, hyps):
            out[i] = hyp
    return out


def translate(model, tokenizer, sentences, beam_size: int = 4,
              alpha: float = 0.6, batch_size: int = 64,
              lang: str | None = None):
    """Translate strings with beam search (§6.1: K = 4, α = 0.6); a single
    string gives a single string.

    ``lang`` is the source language, whose word rules split the text
    (default: the tokenizer's first language). An empty or blank sentence
    gives "". A sentence longer than ``model.config.max_len`` tokens (</s>
    included) raises ValueError. Unknown characters are the tokenizer's
    business: its byte tokens or <unk> stand for them.
    """
    single = isinstance(sentences, str)
    if not single and (not hasattr(sentences, "__iter__")
                       or isinstance(sentences, (bytes, bytearray))):
        raise TypeError(f"translate takes a sentence (str) or a list of "
                        f"sentences, got {type(sentences).__name__}")
    sentences = [sentences] if single else list(sentences)
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            kind = type(s).__name__
            article = "an" if kind[0] in "aeiouAEIOU" else "a"
            raise TypeError(
                f"sentence {i} is {article} {kind}, not a str; translate "
                f"takes text (decode token ids with tokenizer.decode first, "
                f"or call translate_ids)")
    # a blank sentence: nothing to translate
    ids = [tokenizer.encode(s, lang) if s.strip() else [] for s in sentences]
    hyps = translate_ids(model, ids, beam_size, alpha, batch_size)
    out = [tokenizer.decode(hyp) if hyp else "" for hyp in hyps]
    return out[0] if single else out


# book/11_decoding.ipynb: Checkpoint averaging
def _state_dict(checkpoint) -> dict:
    """A state dict from a dict or a file (torch.load runs pickled code: only
    load files you trust)."""
    if not isinstance(checkpoint, dict):
        checkpoint = torch.load(checkpoint, map_location="cpu",
                                weights_only=False)
    # a training checkpoint (§5) holds the weights under "model"
    if isinstance(checkpoint.get("model"), dict):
        checkpoint = checkpoint["model"]
    return checkpoint


def average_checkpoints(checkpoints) -> dict:
    """§6.1: the element-wise mean of several checkpoints (state dicts, or
    paths of files holding them).

    Floating-point tensors are averaged (in float64, then cast back); other
    entries come from the last checkpoint.
    """
    states = [_state_dict(c) for c in checkpoints]
    if not states:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    last = states[-1]
    for i, state in enumerate(states[:-1]):
        missing = sorted(set(last) - set(state))
        extra = sorted(set(state) - set(last))
        if missing or extra:
            raise ValueError(
                f"checkpoint {i} does not match the last one: missing "
                f"{missing[:5]}, unexpected {extra[:5]}; average only "
                f"checkpoints of the same model")
        for key, value in last.items():
            if torch.is_tensor(value) and state[key].shape != value.shape:
                raise ValueError(
                    f"checkpoint {i} has {key} of shape "
                    f"{tuple(state[key].shape)}, the last one "
                    f"{tuple(value.shape)}; average only checkpoints of the "
                    f"same model")
    averaged = {}
    for key, value in last.items():
        if torch.is_tensor(value) and value.is_floating_point():
            mean = sum(s[key].double() for s in states) / len(states)
            averaged[key] = mean.to(value.dtype)
        else:
            averaged[key] = value.clone() if torch.is_tensor(value) else value
    return averaged
